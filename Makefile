# The two commands: `make run` and `make test`. Both set everything up first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: setup setup-test run test bench lint clean

setup:
	@$(PYTHON) -m edgespec.bootstrap

# The package's set-up, then what only the tests need (lab/setup_tests.py: a browser,
# llama.cpp's sources), which is not the package's.
setup-test:
	@$(PYTHON) -m edgespec.bootstrap
	@$(BIN)/python -m lab.setup_tests

# Starts the chat app on http://127.0.0.1:7860 (ARGS="--port 8000" to change).
run: setup
	@$(BIN)/python app.py $(ARGS)

test: setup-test
	@$(BIN)/ruff check edgespec lab tests tools app.py
	@$(BIN)/python -m pytest -n auto --dist loadgroup $(ARGS)

bench: setup
	@$(BIN)/edgespec bench $(ARGS)

lint: setup
	@$(BIN)/ruff check edgespec lab tests tools app.py
	@$(BIN)/ruff format --check edgespec lab tests tools app.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache test-output
