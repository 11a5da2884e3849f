# The two commands a newcomer needs: `make demo` and `make test`.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-all soak bench clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

## Set up, start the simulated endpoint, run the demo campaign in-process, analyse, print the table.
demo: $(STAMP)
	$(BIN)/irbench demo --workdir irbench-demo
	@echo
	@echo "irbench is installed in $(VENV)/: run 'source $(VENV)/bin/activate' to put it on PATH"
	@echo "(or call $(BIN)/irbench directly), then try the README's everyday commands."

## Run the whole test suite (what CI runs).
test: $(STAMP)
	$(BIN)/python -m pytest -m "not soak" -q

soak: $(STAMP)
	$(BIN)/python -m pytest -m soak -q

bench: $(STAMP)
	$(BIN)/python bench/local_throughput.py

clean:
	rm -rf $(VENV) irbench-demo
