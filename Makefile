# `make demo` and `make test` each set up .venv when missing, then run.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast lint bench clean

$(STAMP): pyproject.toml constraints-dev.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q -c constraints-dev.txt -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/groklens demo

# one worker per core; a file stays on one worker, so its module fixtures (trained runs) are built once
test: $(STAMP)
	$(BIN)/python -m pytest -q -n auto --dist loadfile

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -n auto --dist loadfile -m "not slow"

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m tests.test_imports

bench: $(STAMP)
	$(BIN)/python benchmarks/checkpoint_cost.py

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache
