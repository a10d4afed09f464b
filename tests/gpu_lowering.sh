#!/usr/bin/env bash
# The lowering tests on the GPU machine (MLX's CUDA build), unchanged from the CPU run:
# property tests of every rule, hand-built fast primitives (RMSNorm, LayerNorm, RoPE,
# ScaledDotProductAttention stay whole on the GPU), the mlx-lm zoo and the mlx.nn layers.
#
# From the repository root on the device, after ../shared/gpu/prepare and both stages:
#   bash .gpu/two/stage && bash tests/gpu_lowering.sh
# Environment: PY (default python3), PYTHONPATH (default /tmp/site:$PWD), WORKERS (pytest-xdist
# processes when xdist is importable, default 12: each hypothesis example builds new CUDA
# kernels, which is CPU work on the host, so the cases run in parallel), and any extra
# pytest arguments as script arguments (e.g. -x, -k fast).
#
# The end of the log lists, under "mx.compile differs from eager on ...", each case whose
# promise on this device is mx.compile's bits: copy that list into the GPU section of
# docs/lowering.md together with the pass/fail line.
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH="${PYTHONPATH:-/tmp/site:$PWD}"
export PYTHONUNBUFFERED=1
export HYPOTHESIS_PROFILE="${HYPOTHESIS_PROFILE:-device}"  # a GPU test's failure reported as found, not shrunk (tests/conftest.py)
PY="${PY:-python3}"
$PY -c "import mlx.core as mx; print('mlx', mx.__version__, mx.default_device())"
files=(tests/test_lower_*.py tests/test_nn_layers.py)
par=()
if $PY -c "import xdist" 2>/dev/null && [ "${WORKERS:-12}" -gt 1 ]; then
  par=(-n "${WORKERS:-12}")
fi
if $PY -c "import pytest_timeout" 2>/dev/null; then par+=(--timeout "${TEST_TIMEOUT:-240}"); fi
log="$(mktemp)"
export SEGC_COMPILE_DIFFERS_LOG="$log"
$PY -m pytest -o addopts= -q -rfEs -p no:cacheprovider -p no:benchmark --durations=10 "${par[@]}" "${files[@]}" "$@"
rc=$?
echo "== mx.compile differs from eager on $($PY -c 'import mlx.core as mx; print(mx.default_device())')"
sort -u "$log"
rm -f "$log"
exit $rc
