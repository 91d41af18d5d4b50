# The single task runner: newcomers, developers and CI all go through these targets.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
EXTRAS := embedded,dev,spark,tracing,docs
JAVA_PACKAGE := openjdk-17-jdk-headless

.PHONY: help install run quickstart bench bench-quick bench-hotpath bench-rebalance bench-test chaos soak fuzz test test-classic test-unit test-unit-pure \
	test-spark spark-cluster spark-dist test-tansu lint format clean java install-java maven install-maven kafka compiler install-compiler \
	docs docs-serve docs-test chromium install-chromium \
	prometheus install-prometheus test-deploy go install-go toxiproxy faults

help:
	@echo "make run    set up and run the follow-service demo: embedded broker, processor with"
	@echo "           compaction and retries, Spark batch repair, repair processor"
	@echo "make quickstart  a short demo: produce tasks and process them"
	@echo "make test   set up and run the whole test suite on the embedded Apache Kafka"
	@echo "make test-classic  the integration, short chaos, fault and migration suites on the classic"
	@echo "           group protocol (DECATON_AIO_GROUP_PROTOCOL=classic)"
	@echo "make test-tansu  the integration suite on the embedded Tansu broker"
	@echo "make test-deploy  the deployment kit's checks: manifests, alert rules, dashboard"
	@echo "make test-unit-pure  the unit tests on the pure-Python sources (no compiled module)"
	@echo "make spark-cluster  a Spark standalone master and 2 workers on loopback, until Ctrl-C"
	@echo "make spark-dist  the wheel, and the --py-files zip and main file spark-submit needs, in dist/"
	@echo "make chaos  every chaos scenario three times in a row, and make faults (~1.5 h)"
	@echo "make faults every network fault on every path through Toxiproxy, 30 s each (~1 h)"
	@echo "make soak   three instances for 30 minutes at half capacity through restarts (~40 min);"
	@echo "           bench/results/soak.json and soak.png"
	@echo "make fuzz   coverage-guided fuzzing of every decode path (FUZZ_SECONDS per target)"
	@echo "make lint   ruff (lint + format check) and mypy strict"
	@echo "make docs   build the documentation site into site/ (mkdocs --strict)"
	@echo "make docs-serve  serve the documentation at http://127.0.0.1:8000, rebuilt on edits"
	@echo "make docs-test   open the built site in headless Chromium (installs chromium)"
	@echo "make bench  every benchmark scenario against the peers (~3 h 15 min); bench/results/"
	@echo "make bench-quick  the reduced benchmark set (~30 min)"
	@echo "make bench-test   the benchmark harness's own checks"
	@echo "make bench-rebalance  what joins, leaves, crashes and rolling restarts cost, on both"
	@echo "           group protocols (~20 min); bench/results/rebalance-<tree>.md"
	@echo "make bench-hotpath  instructions per task of the hot path (valgrind, ~5 min)"
	@echo "make format apply ruff formatting and fixes"

$(BIN)/python:
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "decaton-aio needs Python 3.11 or newer: set PYTHON=/path/to/python3.11")'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# setup.py compiles the hot modules with mypyc into extension modules beside their sources
# (DECATON_AIO_PURE=1 make install: none, pure Python). An edit to one of them builds them
# again, from scratch: extensions and build files of an earlier build are removed first.
COMPILED_SOURCES := $(shell sed -n 's/^ *"\(decaton_aio\/[^"]*\.py\)",$$/\1/p' setup.py)

$(STAMP): $(BIN)/python pyproject.toml setup.py $(COMPILED_SOURCES) | compiler
	rm -rf build && find decaton_aio -name '*.so' -delete
	$(BIN)/python -m pip install --quiet -e ".[$(EXTRAS)]"
	@touch $(STAMP)

# A C compiler and Python's headers, for the compiled modules.
compiler:
	@if [ -n "$$DECATON_AIO_PURE" ] && [ "$$DECATON_AIO_PURE" != 0 ]; then exit 0; fi; \
	if command -v gcc >/dev/null 2>&1 && $(PYTHON) -c 'import os, sys, sysconfig; \
	  sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))'; then \
	  :; \
	else \
	  $(MAKE) --no-print-directory install-compiler; \
	fi

install-compiler:
	$(call apt_install,gcc python3-dev,a C compiler and Python's headers (the mypyc-compiled modules))

# The embedded Apache Kafka and Spark need a JVM (Java 17), and Kafka's jars are resolved
# by Maven; the interop tests compile bench/java, hence a JDK (javac), not only a JRE.
# Each is installed with apt-get when missing and allowed (root, or password-less sudo);
# otherwise the target says how.
define apt_install
	@if [ "$$(id -u)" = 0 ]; then SUDO=; elif sudo -n true 2>/dev/null; then SUDO="sudo -n"; else SUDO=none; fi; \
	if ! command -v apt-get >/dev/null 2>&1; then \
	  echo "make: $(2) is missing and there is no apt-get here: install it yourself"; exit 1; \
	elif [ "$$SUDO" = none ]; then \
	  echo "make: $(2) is missing: run as root: apt-get update && apt-get install -y $(1)"; exit 1; \
	else \
	  echo "make: installing $(1) for $(2)"; \
	  $$SUDO mkdir -p /usr/share/man/man1 && \
	  $$SUDO apt-get update -qq && \
	  $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $(1); \
	fi
endef

java:
	@if command -v javac >/dev/null 2>&1 || [ -x "$${JAVA_HOME:-/nonexistent}/bin/javac" ]; then \
	  :; \
	else \
	  $(MAKE) --no-print-directory install-java; \
	fi

install-java:
	$(call apt_install,$(JAVA_PACKAGE),Java 17 (Apache Kafka, Spark, bench/java))

maven: java
	@command -v mvn >/dev/null 2>&1 || $(MAKE) --no-print-directory install-maven

install-maven:
	$(call apt_install,maven,Maven (resolves Apache Kafka from Maven Central))

# The documentation's browser test opens the built site in Debian's headless Chromium.
chromium:
	@command -v chromium >/dev/null 2>&1 || $(MAKE) --no-print-directory install-chromium

install-chromium:
	$(call apt_install,chromium,Chromium (the documentation's browser test))

# The deployment kit's tests run Debian's Prometheus: promtool for the rules' unit cases,
# the server for the alert test against a running processor.
prometheus:
	@command -v promtool >/dev/null 2>&1 && command -v prometheus >/dev/null 2>&1 || \
	  $(MAKE) --no-print-directory install-prometheus

install-prometheus:
	$(call apt_install,prometheus,Prometheus and promtool (the deployment kit's alert tests))

# Go builds Toxiproxy, the fault proxy of the network fault tests (Debian's golang-go is
# new enough for the pinned release).
go:
	@command -v go >/dev/null 2>&1 || [ -x /usr/local/go/bin/go ] || $(MAKE) --no-print-directory install-go

install-go:
	$(call apt_install,golang-go,Go (builds Toxiproxy for the network fault tests))

# Toxiproxy, built once by go install into the user's cache directory.
toxiproxy: go $(STAMP)
	$(BIN)/python -c 'from decaton_aio.embedded import resolve_toxiproxy_binary as r; print(r())'

# Apache Kafka's jars, resolved once into the user's cache directory.
kafka: maven $(STAMP)
	$(BIN)/python -m decaton_aio broker --resolve-only

install: kafka $(STAMP)

run: kafka
	$(BIN)/python examples/follow/demo.py

quickstart: kafka
	$(BIN)/python examples/quickstart.py

# The whole suite on the embedded Apache Kafka.
test: kafka prometheus toxiproxy
	$(BIN)/python -m pytest

# The integration suite, the short chaos and fault scenarios and the migration suite again
# with every subscription on the classic group protocol (make test runs them on the
# default: the consumer protocol where the broker offers it; the fault scenarios' state
# store runs here).
test-classic: kafka prometheus toxiproxy
	DECATON_AIO_GROUP_PROTOCOL=classic $(BIN)/python -m pytest -m "not chaos_long and not spark" \
	  tests/chaos tests/faults tests/interop/test_migration.py tests/integration

# The deployment kit alone: manifests, rules, dashboard and the live alert test.
test-deploy: kafka prometheus
	$(BIN)/python -m pytest tests/deploy

# The integration suite again on Tansu, the Java-free broker.
# The Spark jobs read and write through Spark's Kafka connector, whose Java client sends
# requests Tansu cannot parse: they run on Apache Kafka only.
test-tansu: $(STAMP) prometheus
	DECATON_AIO_BROKER=tansu $(BIN)/python -m pytest -m "integration and not chaos_long and not spark"

# Instances killed and restarted while tasks flow, every scenario, three times in a row
# (make test runs the short scenario once).
chaos: kafka faults
	for run in 1 2 3; do $(BIN)/python -m pytest -s -m chaos tests/chaos tests/interop/test_migration.py || exit 1; done

# Network faults through Toxiproxy: each fault on each path for 30 s (make test runs one
# short scenario per fault); the figures of every scenario as a table at the end (the
# operations page's), their files in .faults/. On the default group protocol (consumer,
# the application without its state store); DECATON_AIO_GROUP_PROTOCOL=classic runs it on
# the classic protocol with the state store.
faults: kafka toxiproxy
	$(BIN)/python -m pytest -s -m faults tests/faults --basetemp=.faults; status=$$?; \
	$(BIN)/python -m tests.faults.table .faults; exit $$status

# Coverage-guided fuzzing (atheris) of the dt_meta header and every serializer; the
# corpus grows in .fuzz/ across runs, a finding is written as crash-* and fails the run.
FUZZ_SECONDS ?= 120
FUZZ_STAMP := $(VENV)/.fuzz-installed

$(FUZZ_STAMP): $(STAMP) pyproject.toml
	$(BIN)/python -m pip install --quiet -e ".[$(EXTRAS),fuzz]"
	@touch $(FUZZ_STAMP)

fuzz: $(FUZZ_STAMP)
	for target in metadata bodies; do \
	  mkdir -p .fuzz/$$target && \
	  $(BIN)/python tests/fuzz/fuzz_decode.py $$target -max_total_time=$(FUZZ_SECONDS) \
	    -artifact_prefix=.fuzz/ .fuzz/$$target || exit 1; \
	done

test-unit: $(STAMP)
	$(BIN)/python -m pytest tests/unit

# The unit tests on the pure-Python sources, as DECATON_AIO_PURE=1 installs them: a copy of
# the tree without the compiled modules, imported from its own directory before the
# installed package.
PURE_TREE := .pure

test-unit-pure: $(STAMP)
	rm -rf $(PURE_TREE) && mkdir -p $(PURE_TREE)
	tar -c --exclude="*.so" --exclude=__pycache__ decaton_aio tests bench examples spark_jobs docs \
	  README.md pyproject.toml | tar -x -C $(PURE_TREE)
	cd $(PURE_TREE) && $(abspath $(BIN))/python -c 'import decaton_aio.consumer._partition as m; \
	  assert m.__file__.endswith(".py"), m.__file__'
	cd $(PURE_TREE) && $(abspath $(BIN))/python -m pytest -p no:cacheprovider tests/unit

test-spark: kafka
	$(BIN)/python -m pytest -m spark

# A Spark standalone master and 2 workers on loopback, from PySpark's own launch classes,
# until Ctrl-C; run a job on it with --master and the URL it prints.
spark-cluster: $(STAMP)
	$(BIN)/python -m spark_jobs.standalone --workers 2

# What a user's cluster needs: the wheel (decaton_aio and the jobs as decaton_aio_spark),
# and for spark-submit the --py-files zip and the main file, in dist/.
spark-dist: $(STAMP)
	rm -rf dist && $(BIN)/python -m pip wheel --quiet --no-deps -w dist .
	$(BIN)/python -m spark_jobs._bundle dist/spark

BENCH_STAMP := $(VENV)/.bench-installed

$(BENCH_STAMP): $(STAMP) pyproject.toml
	$(BIN)/python -m pip install --quiet -e ".[$(EXTRAS),bench]"
	@touch $(BENCH_STAMP)

bench: kafka $(BENCH_STAMP)
	$(BIN)/python -m bench

bench-quick: kafka $(BENCH_STAMP)
	$(BIN)/python -m bench --quick

# Three instances at half of their measured capacity for SOAK_MINUTES, through rolling
# restarts and a broker restart (make test runs 3 minutes of it); the series and figures
# go to bench/results/soak.json, drawn into soak.png.
SOAK_MINUTES ?= 30

soak: kafka $(BENCH_STAMP)
	SOAK_MINUTES=$(SOAK_MINUTES) SOAK_OUT=bench/results/soak.json \
	  $(BIN)/python -m pytest -p no:cacheprovider -s -m soak tests/soak; status=$$?; \
	  $(BIN)/python -m bench.soak_plot bench/results/soak.json bench/results/soak.png; \
	  exit $$status

# Joins, leaves, crashes and static members' rolling restarts on both group protocols:
# what they cost the partitions that keep their owner and those that move.
bench-rebalance: kafka $(STAMP)
	$(BIN)/python -m bench.rebalance

# Instructions per task of the runtime's hot path without a broker (callgrind: the same
# figure on a loaded machine).
bench-hotpath: $(STAMP)
	$(BIN)/python -m bench.hotpath --measure --tasks 50000

# The benchmark harness's own checks (they time code, so they stay out of make test).
bench-test: $(BENCH_STAMP)
	$(BIN)/python -m pytest -p no:cacheprovider bench/test_*.py

lint: $(STAMP)
	$(BIN)/ruff check decaton_aio tests bench spark_jobs examples docs
	$(BIN)/ruff format --check decaton_aio tests bench spark_jobs examples docs
	$(BIN)/mypy

format: $(STAMP)
	$(BIN)/ruff format decaton_aio tests bench spark_jobs examples docs
	$(BIN)/ruff check --fix decaton_aio tests bench spark_jobs examples docs

# The documentation site (mkdocs.yml): the reference pages generated from the code
# (python -m docs.gen; make test fails when the committed ones are stale), then the site,
# strictly: a broken link, a missing page or an API reference that cannot be found fails.
DOCS_ENV := NO_MKDOCS_2_WARNING=1

docs: $(STAMP)
	$(BIN)/python -m docs.gen
	$(DOCS_ENV) $(BIN)/mkdocs build --strict --quiet

docs-serve: $(STAMP)
	$(BIN)/python -m docs.gen
	$(DOCS_ENV) $(BIN)/mkdocs serve

# The built site in headless Chromium: the home page, a guide and an API page render with
# their titles, and search finds "watermark".
docs-test: docs chromium
	$(BIN)/python -m pytest -p no:cacheprovider -m browser tests/docs

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis build decaton_aio.egg-info \
	  $(PURE_TREE) site dist
	find decaton_aio -name '*.so' -delete
