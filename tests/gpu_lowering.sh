#!/usr/bin/env bash
# The lowering tests on the GPU machine (MLX's CUDA build), unchanged from the CPU run:
# property tests of every rule, hand-built fast primitives (RMSNorm, LayerNorm, RoPE,
# ScaledDotProductAttention stay whole on the GPU), the mlx-lm zoo and the mlx.nn layers.
#
# From the repository root on the device, after ../shared/gpu/prepare and both stages:
#   bash .gpu/two/stage && bash tests/gpu_lowering.sh
# Environment: PY (default python3), PYTHONPATH (default /tmp/site:$PWD), and any
# extra pytest arguments as script arguments (e.g. -x, -k fast).
#
# The end of the log lists, under "mx.compile differs from eager on Device(gpu, 0)",
# each case whose promise on this device is mx.compile's bits: copy that list into the
# GPU section of docs/lowering.md together with the pass/fail line.
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH="${PYTHONPATH:-/tmp/site:$PWD}"
export PYTHONUNBUFFERED=1
PY="${PY:-python3}"
$PY -c "import mlx.core as mx; print('mlx', mx.__version__, mx.default_device())"
files=(tests/test_lower_*.py tests/test_nn_layers.py)
exec $PY -m pytest -o addopts= -q -rfEs -p no:cacheprovider --durations=10 "${files[@]}" "$@"
