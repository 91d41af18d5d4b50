"""decaton-aio's Spark jobs: retry backfill and batch repair, on Spark's Kafka connector.

Installed with decaton-aio as the package ``decaton_aio_spark``; run a job with
``decaton-aio-spark JOB [ARGS]`` (or ``python -m decaton_aio_spark JOB [ARGS]``), or submit
it to a cluster (see the documentation's Spark page).
"""
