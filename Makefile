# The single task runner: newcomers, developers and CI all go through these targets.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
EXTRAS := embedded,dev,spark
JAVA_PACKAGE := openjdk-17-jre-headless

.PHONY: help install run quickstart bench bench-quick test test-unit test-spark lint format clean java

help:
	@echo "make run    set up and run the follow-service demo: embedded broker, processor with"
	@echo "           compaction and retries, Spark batch repair, repair processor"
	@echo "make quickstart  a short demo: produce tasks and process them"
	@echo "make test   set up and run the whole test suite"
	@echo "make lint   ruff (lint + format check) and mypy strict"
	@echo "make bench  every benchmark scenario against the peers (~5 min); bench/results/"
	@echo "make bench-quick  the reduced benchmark set (under 2 minutes)"
	@echo "make format apply ruff formatting and fixes"

$(BIN)/python:
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "decaton-aio needs Python 3.11 or newer: set PYTHON=/path/to/python3.11")'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/python -m pip install --quiet -e ".[$(EXTRAS)]"
	@touch $(STAMP)

# Spark needs a JVM (Java 17). Installs it with apt-get when missing and allowed (root, or
# password-less sudo); otherwise says how, and the Spark tests skip with that reason.
java:
	@if command -v java >/dev/null 2>&1 || [ -x "$${JAVA_HOME:-/nonexistent}/bin/java" ]; then \
	  :; \
	elif ! command -v apt-get >/dev/null 2>&1; then \
	  echo "make: Spark needs Java 17 and there is no apt-get here: install a JDK/JRE 17 and set JAVA_HOME"; \
	else \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; elif sudo -n true 2>/dev/null; then SUDO="sudo -n"; else SUDO=none; fi; \
	  if [ "$$SUDO" = none ]; then \
	    echo "make: Spark needs Java 17: run as root: apt-get update && apt-get install -y $(JAVA_PACKAGE)"; \
	  else \
	    echo "make: installing $(JAVA_PACKAGE) for Spark"; \
	    $$SUDO mkdir -p /usr/share/man/man1 && \
	    $$SUDO apt-get update -qq && \
	    $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $(JAVA_PACKAGE); \
	  fi; \
	fi

install: java $(STAMP)

run: java $(STAMP)
	$(BIN)/python examples/follow/demo.py

quickstart: $(STAMP)
	$(BIN)/python examples/quickstart.py

test: java $(STAMP)
	$(BIN)/python -m pytest

test-unit: $(STAMP)
	$(BIN)/python -m pytest tests/unit

test-spark: java $(STAMP)
	$(BIN)/python -m pytest -m spark

BENCH_STAMP := $(VENV)/.bench-installed

$(BENCH_STAMP): $(STAMP) pyproject.toml
	$(BIN)/python -m pip install --quiet -e ".[$(EXTRAS),bench]"
	@touch $(BENCH_STAMP)

bench: $(BENCH_STAMP)
	$(BIN)/python -m bench

bench-quick: $(BENCH_STAMP)
	$(BIN)/python -m bench --quick

lint: $(STAMP)
	$(BIN)/ruff check decaton_aio tests bench spark_jobs examples
	$(BIN)/ruff format --check decaton_aio tests bench spark_jobs examples
	$(BIN)/mypy

format: $(STAMP)
	$(BIN)/ruff format decaton_aio tests bench spark_jobs examples
	$(BIN)/ruff check --fix decaton_aio tests bench spark_jobs examples

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
