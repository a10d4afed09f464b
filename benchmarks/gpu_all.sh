#!/usr/bin/env bash
# Everything segc measures and checks on the GPU machine, in one call (device time is
# scarce: a machine start costs minutes). Run from the repository root on the device,
# after MLX's CUDA build is staged (`make gpu-prepare`, then .gpu/one/stage and
# .gpu/two/stage):
#
#   bash .gpu/two/stage && PYTHONPATH=/tmp/site:$PWD bash benchmarks/gpu_all.sh [PARTS]
#
# PARTS: any of  env bench tests lowering prefill2048 sweep  (default: all, in that
# order). env also prints which primitives a decode layer becomes here
# (benchmarks/decode_ir.py). The MLX CUDA bugs that the earlier probe scripts isolated
# are recorded in docs/gpu.md and docs/lowering.md ("GPU").
# Logs go to $OUT (at most 8 files come back from the device): env.txt,
# bench_reference.{txt,json}, tests.log, lowering.log, bench_prefill2048.txt, sweep.txt,
# summary.txt. BENCH_PRESET=tiny tries it out on a CPU. Each part has its own time limit,
# so that one hang cannot eat the call; TESTS_LIMIT and LOWERING_LIMIT (seconds, default
# 90 and 120) set those of the two test parts; TESTS_MARK (default "not slow") picks the
# core tests ("" for all of them); WORKERS the pytest-xdist processes (default 12).
set -u
OUT="${OUT:-/tmp/segc-gpu-out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
export HYPOTHESIS_PROFILE="${HYPOTHESIS_PROFILE:-device}"  # a GPU test's failure reported as found, not shrunk (tests/conftest.py)
export PYTHONPATH="${PYTHONPATH:-/tmp/site:$PWD}"
PY="${PY:-python3}"
parts="${*:-env bench tests lowering prefill2048 sweep}"
# (-p no:benchmark: the device image has pytest-benchmark, whose warning under xdist is an
# error with our filterwarnings)
# pytest-xdist, where the device has it (`make gpu-prepare`'s stage installs the wheels
# found in .gpu/two): each new kernel is an NVRTC compile on the host, so run in parallel
xdist=()
if $PY -c "import xdist" 2>/dev/null; then xdist=(-n "${WORKERS:-12}"); fi
# a per-test limit where pytest-timeout is there (the stage installs it too)
if $PY -c "import pytest_timeout" 2>/dev/null; then xdist+=(--timeout "${TEST_TIMEOUT:-120}"); fi
summary="$OUT/summary.txt"
note() { echo "$(date -u +%H:%M:%S) $*" | tee -a "$summary"; }
has() { case " $parts " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
# pytest's last line ("N passed, M failed in Xs")
tally() { grep -E '(passed|failed|error|no tests ran)' "$1" | tail -1; }

note "segc gpu_all: parts [$parts] in $PWD"
for p in $parts; do
  case "$p" in env | bench | tests | lowering | prefill2048 | sweep) ;; *) note "unknown part '$p' (skipped)" ;; esac
done

if has env; then
  {
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv
    $PY -c "import sys, mlx.core as mx; print(sys.version); print('mlx', mx.__version__, mx.default_device())"
    $PY -c "import mlx_lm, pytest, hypothesis, networkx, numpy; print('mlx_lm', mlx_lm.__version__, 'pytest', pytest.__version__, 'hypothesis', hypothesis.__version__)"
    git log --oneline -1 2>/dev/null || true
    timeout 60 $PY benchmarks/decode_ir.py
  } >"$OUT/env.txt" 2>&1
  note "env: $(grep -m1 '^mlx ' "$OUT/env.txt")"
fi

if has bench; then
  timeout 200 $PY benchmarks/bench_llama.py --preset "${BENCH_PRESET:-reference}" --repeats 50 --warmup 5 --variants eager,compile,segc,drain,whole \
    --json "$OUT/bench_reference.json" >"$OUT/bench_reference.txt" 2>&1
  note "bench reference (decode at context 1024, prefill 512): rc=$?"
fi

if has tests; then
  # the core suite on the GPU; the lowering files run in their own part below
  # the slow zoo file first, so that xdist hands its long tests out before the short ones
  files=(tests/test_zoo.py)
  for f in tests/test_*.py tests/fast/test_*.py; do
    case "$f" in tests/test_zoo.py | tests/test_lower_*.py | tests/test_nn_layers.py) ;; *) files+=("$f") ;; esac
  done
  # SIGINT first: pytest then still prints its summary of failures
  timeout -s INT -k 20 "${TESTS_LIMIT:-90}" $PY -m pytest -o addopts= -q -rfE -p no:cacheprovider -p no:benchmark "${xdist[@]}" -m "${TESTS_MARK-not slow}" "${files[@]}" >"$OUT/tests.log" 2>&1
  note "tests (-m '${TESTS_MARK-not slow}', lowering files apart): rc=$? -- $(tally "$OUT/tests.log")"
fi

if has lowering; then
  if [ -f tests/gpu_lowering.sh ]; then
    timeout -s INT -k 20 "${LOWERING_LIMIT:-120}" bash tests/gpu_lowering.sh >"$OUT/lowering.log" 2>&1
  else
    files=$(ls tests/test_lower_*.py tests/test_nn_layers.py 2>/dev/null)
    if [ -n "$files" ]; then
      # shellcheck disable=SC2086
      timeout "${LOWERING_LIMIT:-120}" $PY -m pytest -o addopts= -q -rfE -p no:cacheprovider -p no:benchmark $files >"$OUT/lowering.log" 2>&1
    else
      echo "no lowering tests in this checkout" >"$OUT/lowering.log"
    fi
  fi
  note "lowering tests: rc=$? -- $(tally "$OUT/lowering.log")"
fi

if has prefill2048; then
  # DESIGN.md's prefill figures are for 2048 tokens: the same comparison at that size
  timeout 60 $PY benchmarks/bench_llama.py --preset "${BENCH_PRESET:-reference}" --repeats 30 --warmup 3 --no-decode \
    --prefill 2048 --first-call-layers 0 --no-dispatch >"$OUT/bench_prefill2048.txt" 2>&1
  note "bench reference prefill 2048: rc=$?"
fi

if has sweep; then
  # MLX's CUDA backend commits a CUDA graph every MLX_MAX_OPS_PER_BUFFER operations (its
  # default depends on the device: 100 on an H200, 20 where MLX has no entry) and at
  # every (async_)eval: decode again with other sizes
  for n in 10 100; do
    echo "== MLX_MAX_OPS_PER_BUFFER=$n" >>"$OUT/sweep.txt"
    MLX_MAX_OPS_PER_BUFFER=$n timeout 50 $PY benchmarks/bench_llama.py --preset "${BENCH_PRESET:-reference}" \
      --repeats 20 --warmup 3 --prefill 0 --first-call-layers 0 --no-dispatch >>"$OUT/sweep.txt" 2>&1
    note "sweep MLX_MAX_OPS_PER_BUFFER=$n: rc=$?"
  done
fi

for f in bench_reference.txt bench_prefill2048.txt sweep.txt; do
  [ -f "$OUT/$f" ] && { echo "== $f"; cat "$OUT/$f"; }
done
echo "== summary"
cat "$summary"
