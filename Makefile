# The README's two commands: `make demo` and `make test`. Each sets everything up on a
# fresh machine that has only Python 3.11 and pip: a virtual environment in .venv,
# segc installed into it (editable) with its test and mlx-lm extras, then the job.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install demo test test-fast lint typecheck pytest bench gpu-prepare clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test,lm,research]'
	@# MLX's CPU kernels compile about 4x faster with their preamble precompiled, made
	@# with MLX's own g++ flags (tests/mlx_pch.py; the same code; skipped without g++)
	-$(BIN)/python tests/mlx_pch.py
	@# a browser for tests/test_cli_browser.py: Playwright's Chromium, else (where its
	@# download is not reachable) Debian's, installed as root; else a system Chromium on
	@# PATH is used, or the test is skipped with the reason
	-$(BIN)/python -m playwright install chromium || command -v chromium || \
	  { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	    (apt-get install -y -q chromium >/dev/null 2>&1 || (apt-get update -q >/dev/null 2>&1 && apt-get install -y -q chromium >/dev/null 2>&1)); } || \
	  echo "no Chromium: tests/test_cli_browser.py will be skipped, with the reason"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/segc demo

lint: $(STAMP)
	$(BIN)/ruff format --check segc tests benchmarks
	$(BIN)/ruff check segc tests benchmarks

typecheck: $(STAMP)
	$(BIN)/mypy

# the suite in WORKERS processes (pytest-xdist; CI's machine has two cores)
WORKERS ?= 2

pytest: $(STAMP)
	$(BIN)/python -m pytest -n $(WORKERS)

test: lint typecheck pytest

# the quick loop: every test not marked slow (tests/fast holds those that run no MLX)
test-fast: $(STAMP)
	$(BIN)/python -m pytest -n $(WORKERS) -m "not slow"

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_llama.py

# the GPU machine's packages (docs/gpu.md): MLX's CUDA build split under .gpu/, plus the
# pytest plugins that let the device run the tests in parallel and with time limits
gpu-prepare:
	../shared/gpu/prepare
	$(PYTHON) -m pip download -q --no-deps -d .gpu/two pytest-xdist execnet pytest-timeout
	@# CUPTI for benchmarks/kernel_timeline.py, for the device's python 3.12 and MLX's CUDA 13
	$(PYTHON) -m pip download -q --no-deps -d .gpu/cupti --python-version 3.12 --only-binary=:all: \
	  cupti-python==13.0.1 'nvidia-cuda-cupti==13.0.*' 'cuda-bindings==13.0.*' cuda-pathfinder
	if command -v perf >/dev/null; then bash benchmarks/pack_perf.sh .gpu/perfx; fi

clean:
	rm -rf $(VENV) build *.egg-info
