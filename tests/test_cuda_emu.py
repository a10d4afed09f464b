"""The CPU emulator of segc's CUDA kernels (``tests/cuda_emu.py``) itself: a missing
barrier shows in a run, in the resumption order of either pass, and a barrier no thread
can pass ends the run with a message instead of a hang."""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import numpy as np
import pytest
from cuda_emu import GXX, run

pytestmark = [
    pytest.mark.skipif(GXX is None, reason="needs a C++ compiler (g++) to run the kernels on the CPU"),
    pytest.mark.timeout(120),
]

N = 64


def _reverse(sync: bool, leading: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    """A block of N threads that writes its input to shared memory and reads it back
    reversed: with ``sync`` a barrier between the write and the read; with ``leading`` a
    barrier before both (the write and the read then run in the scheduler's second pass)."""
    source = f"""
  __shared__ float s[{N}];
  unsigned t = threadIdx.x;
  {"__syncthreads();" if leading else ""}
  s[t] = x[t];
  {"__syncthreads();" if sync else ""}
  out[t] = s[{N - 1} - t];
"""
    made = {"name": "reverse", "input_names": ["x"], "output_names": ["out"], "source": source, "header": ""}
    x = mx.arange(1, N + 1, dtype=mx.float32)
    call = {
        "inputs": [x],
        "output_shapes": [(N,)],
        "output_dtypes": [mx.float32],
        "grid": (N, 1, 1),
        "threadgroup": (N, 1, 1),
        "template": [],
    }
    return made, call


@pytest.mark.parametrize("leading", [False, True])
def test_a_missing_barrier_shows_in_either_pass(leading: bool) -> None:
    want = np.arange(N, 0, -1, dtype=np.float32)
    ((synced,),) = run(*_reverse(sync=True, leading=leading))
    assert synced.tobytes() == want.tobytes()
    ((racy,),) = run(*_reverse(sync=False, leading=leading))
    # the half that reads before its writer ran sees shared memory's old zeros: the first
    # pass resumes the threads forward (threads 0..N/2-1 read first), the second backward
    stale = np.flatnonzero(racy != want)
    first = np.arange(N // 2) if not leading else np.arange(N // 2, N)
    assert stale.tolist() == first.tolist() and (racy[stale] == 0).all(), racy


def test_a_barrier_no_thread_can_pass_ends_the_run() -> None:
    source = """
  unsigned t = threadIdx.x;
  float v = 0.f;
  if (t == 0) __syncthreads();  // thread 0 at the block's barrier, its warp in a shuffle
  else v = __shfl_xor_sync(0xffffffffu, 1.f, 1);
  out[t] = v;
"""
    made = {"name": "stuck", "input_names": ["x"], "output_names": ["out"], "source": source, "header": ""}
    call = {
        "inputs": [mx.zeros((32,))],
        "output_shapes": [(32,)],
        "output_dtypes": [mx.float32],
        "grid": (32, 1, 1),
        "threadgroup": (32, 1, 1),
        "template": [],
    }
    with pytest.raises(AssertionError, match="block 0: its threads wait at barriers none of them can pass"):
        run(made, call)
