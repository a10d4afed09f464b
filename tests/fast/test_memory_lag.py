"""The memory prediction on MLX's CPU build (``predict_memory(..., lag_kernels=N)``):
the host allocates each kernel's output when it encodes the kernel and runs up to about
50 kernels ahead of the worker thread, which frees a kernel's inputs once it has run
it. A chain of ``n`` dependent products, each output read once by the next, then holds
``min(n, N + 2)`` outputs at once (worked out in docs/passes.md), and MLX measures the
same peak for short chains."""

from __future__ import annotations

import gc

import mlx.core as mx
import pytest

import segc
from segc.passes.memory import predict_memory

MIB = 2**20


def _chain(n: int):
    def f(x: mx.array, w: mx.array) -> mx.array:
        for _ in range(n):
            x = x @ w
        return x

    return f


@pytest.mark.parametrize(("n", "lag", "buffers"), [(6, 0, 2), (3, 2, 3), (6, 2, 4), (9, 4, 6), (4, 50, 4)])
def test_a_chain_of_products_holds_min_n_lag_plus_two_outputs(n: int, lag: int, buffers: int) -> None:
    x = w = mx.ones((4, 4))  # 64 bytes an output
    g = segc.jit(_chain(n)).trace(x, w).graph
    assert predict_memory(g, lag_kernels=lag).activations == buffers * 64


@pytest.mark.skipif(mx.default_device() != mx.cpu, reason="MLX's CPU queue; a GPU holds buffers by command buffer")
@pytest.mark.parametrize("n", [3, 6, 12])
def test_short_chains_peak_as_mlx_measures(n: int) -> None:
    x, w = mx.ones((512, 512)), mx.ones((512, 512))  # 1 MiB an output; a product takes ms, the host us
    mx.eval(x, w)
    step = segc.jit(_chain(n))
    mx.eval(step(x, w))  # compiled, warm
    gc.collect()
    mx.synchronize()
    mx.clear_cache()
    mx.reset_peak_memory()
    base = mx.get_active_memory()
    mx.eval(step(x, w))
    measured = mx.get_peak_memory() - base
    g = step.trace(x, w).graph
    assert measured == n * MIB  # every output alive at once: the host is ahead of the worker
    assert predict_memory(g, lag_kernels=50).activations == measured
    assert predict_memory(g).activations == 2 * MIB  # without the lag: the old, wrong figure
