# Two commands run everything: `make up` (the platform, embedded) and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

# The tests run on PostgreSQL and Redis, as production does; these defaults are this
# machine's local servers.
DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/test
REDIS_URL ?= redis://127.0.0.1:6379/0

.PHONY: up test lint bench install clean

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	# The Slurm commands start as fast as the interpreter does only with their bytecode
	# cached: where PYTHONDONTWRITEBYTECODE is set, nothing would ever write it.
	$(BIN)/python -m compileall -q -j 0 scheduler agents spurcloud
	touch $@

install: $(BIN)/.installed

# Every job runs in a bubblewrap sandbox: without bwrap the platform cannot run any.
up: $(BIN)/.installed
	@command -v bwrap >/dev/null 2>&1 || { echo "make up: bubblewrap (bwrap) is missing: apt-get install bubblewrap (or dnf install bubblewrap)" >&2; exit 1; }
	$(BIN)/spurcloud up

test: $(BIN)/.installed
	DATABASE_URL=$(DATABASE_URL) REDIS_URL=$(REDIS_URL) $(BIN)/python -m pytest

# mypy's Django plugin imports the settings, which need no secrets with DEBUG on.
lint: $(BIN)/.installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	DEBUG=true $(BIN)/mypy scheduler agents spurcloud

bench: $(BIN)/.installed
	$(BIN)/python bench/e2e.py

clean:
	rm -rf .spur
