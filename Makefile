# Sandpit: `make run` serves the product on embedded defaults; `make test` runs the whole suite.
.PHONY: run test lint bench setup

run:
	./scripts/run.sh

test:
	./scripts/test.sh

lint:
	.venv/bin/ruff check . && .venv/bin/ruff format --check .

setup:
	./scripts/setup.sh
