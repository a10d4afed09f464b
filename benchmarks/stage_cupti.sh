#!/usr/bin/env bash
# On the device machine: installs the CUPTI wheels `make gpu-prepare` packs into
# .gpu/cupti (cupti-python, nvidia-cuda-cupti, cuda-bindings, cuda-pathfinder) into
# /tmp/cupti once, for benchmarks/kernel_timeline.py (gpu_decode.sh timeline; carry
# [".gpu/cupti"]). Prints the directory of CUPTI's library.
set -e
here="$(cd "$(dirname "$0")/.." && pwd)/.gpu/cupti"
if [ ! -d /tmp/cupti/cupti ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/cupti "$here"/*.whl
fi
dirname "$(find /tmp/cupti -name 'libcupti.so*' | head -1)"
