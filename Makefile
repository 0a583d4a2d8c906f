# The two commands: `make run` and `make test`. Both set everything up first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: setup setup-test run test bench lint clean

setup:
	@$(PYTHON) -m edgespec.bootstrap

setup-test:
	@$(PYTHON) -m edgespec.bootstrap --browser

# Starts the chat app on http://127.0.0.1:7860 (ARGS="--port 8000" to change).
run: setup
	@$(BIN)/python app.py $(ARGS)

test: setup-test
	@$(BIN)/ruff check edgespec tests app.py
	@$(BIN)/python -m pytest -n auto --dist loadgroup $(ARGS)

bench: setup
	@$(BIN)/edgespec bench $(ARGS)

lint: setup
	@$(BIN)/ruff check edgespec tests app.py
	@$(BIN)/ruff format --check edgespec tests app.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache test-output
