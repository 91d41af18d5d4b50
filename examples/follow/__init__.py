"""A follow service built on decaton-aio: the product's main example.

Follow and unfollow events, keyed by the followee, keep follower and following counts in
SQLite (:mod:`examples.follow.store`) through a processor with per-pair compaction and
retries for a busy database (:mod:`examples.follow.processor`). The counts are derived
data; the Spark batch repair job compares them with the follow edges and emits repair
tasks that the repair processor applies. ``python examples/follow/demo.py`` shows it all.
"""
