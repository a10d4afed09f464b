"""segc's self-contained CUDA kernels (the decode attention, the rotated KV write) are
compiled here as C++ by the host's ``g++``, as MLX 0.32 would generate them
(``mlx/backend/cuda/custom_kernel.cpp``'s ``build_kernel``: its signature, its template
constants, then segc's header and source), after ``cuda_emu.py``'s definitions of
CUDA's built-ins: a syntax and type check of every variant before a GPU runs it (a GPU is
scarce; a typo in a kernel would otherwise cost a device call). The Python side is
exercised too: each kernel is called through segc's own wrapper on CPU arrays, with
``mx.fast.cuda_kernel`` replaced by a recorder that keeps the call and returns zeros.
What this cannot see: anything about the kernels' results (the CUDA tests,
``tests/test_attention_cuda.py`` and ``tests/test_kvwrite_cuda.py``, compare bytes on a
GPU; ``tests/test_cuda_emulated.py`` runs the kernels on the CPU, the product kernels
too, whose headers from MLX's CUDA build it stands in for)."""

from __future__ import annotations

import re
import subprocess

import mlx.core as mx
import pytest
from cuda_emu import GXX, generated, recording

from segc.lower import cuda_attention, cuda_kvwrite
from segc.lower.cuda_kernel import expand

pytestmark = [
    pytest.mark.skipif(GXX is None, reason="needs a C++ compiler (g++) to check the kernels' sources"),
    pytest.mark.timeout(120),
]


recorded = pytest.fixture(name="recorded")(recording)


def _compile(text: str) -> None:
    assert GXX is not None
    res = subprocess.run(
        [GXX, "-std=c++20", "-fsyntax-only", "-Wall", "-Wno-unknown-pragmas", "-Wno-unused", "-x", "c++", "-"],
        input=text,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr[-3000:]


@pytest.mark.parametrize("kernels", [1, 2])
@pytest.mark.parametrize("dt", [mx.bfloat16, mx.float16, mx.float32])
@pytest.mark.parametrize(("hq", "hkv", "lq", "rows"), [(32, 8, 1, 1), (8, 8, 3, 3), (6, 3, 2, 1)])
def test_the_attention_kernels_compile(recorded, kernels, dt, hq, hkv, lq, rows) -> None:
    q = mx.zeros((1, hq, lq, 64), dtype=dt)
    k = v = mx.zeros((1, hkv, 300, 64), dtype=dt)
    mask = mx.zeros((rows, 300), dtype=mx.bool_)
    out = cuda_attention.cuda_attention(q, k, v, mask, 0.125, kernels=kernels)
    assert out.shape == q.shape and out.dtype == dt
    assert len(recorded) == kernels
    for made, call in recorded:
        _compile(generated(made, call))


@pytest.mark.parametrize("queries", [True, False])
@pytest.mark.parametrize("freqs", [True, False])
@pytest.mark.parametrize(
    ("dt", "d", "trad"), [(mx.bfloat16, 64, False), (mx.float16, 80, True), (mx.float32, 12, False)]
)
def test_the_rotated_write_kernel_compiles(recorded, queries, freqs, dt, d, trad) -> None:
    kb, vb = mx.zeros((1, 2, 16, d), dtype=dt), mx.zeros((1, 2, 16, d), dtype=dt)
    k, v = mx.zeros((1, 2, 1, d), dtype=dt), mx.zeros((1, 2, 1, d), dtype=dt)
    ins = [kb, k, vb, v, mx.array(3, dtype=mx.int32)]
    if queries:
        ins.append(mx.zeros((1, 8, 1, d), dtype=dt))
    if freqs:
        ins.append(mx.ones((d // 2,), dtype=mx.float32))
    outs = cuda_kvwrite.kv_write(ins, d, trad, None if freqs else 10000.0, 1.0, queries, freqs)
    assert [o.shape for o in outs] == [kb.shape, vb.shape, *([(1, 8, 1, d)] if queries else [])]
    (made, call), *more = recorded
    assert not more
    _compile(generated(made, call))


@pytest.mark.parametrize("setting", ["1", "reads"])
@pytest.mark.parametrize("in_place", [False, True])
def test_the_stamped_write_with_its_attention_compiles(recorded, monkeypatch, setting, in_place) -> None:
    """The clock's stamps (``SEGC_KERNEL_STAMPS``, a diagnostic run only on a GPU) with
    the inputs' addresses after the blocks' words: the kernel still compiles, takes its
    stamps' buffer last, sized for its blocks and addresses."""
    from segc.lower import cuda_kvattention, cuda_stamps

    monkeypatch.setenv("SEGC_KERNEL_STAMPS", setting)
    kb = vb = mx.zeros((1, 8, 300, 64), dtype=mx.bfloat16)
    k = v = mx.zeros((1, 8, 1, 64), dtype=mx.bfloat16)
    q = mx.zeros((1, 32, 1, 64), dtype=mx.bfloat16)
    ins = [kb, k, vb, v, mx.array(5, dtype=mx.int32), q]
    cuda_kvattention.kv_attention(ins, mx.zeros((1, 300), mx.bool_), 64, False, 10000.0, 1.0, False, 0.125, in_place)
    ((made, call),) = recorded
    assert made["input_names"][-1] == "stamp"
    assert set(cuda_stamps.ADDRESSES) <= set(made["input_names"])
    blocks = call["grid"][0] // call["threadgroup"][0]
    assert call["inputs"][-1].shape == (blocks * cuda_stamps.WORDS + len(cuda_stamps.ADDRESSES),)
    _compile(generated(made, call))


def test_a_broken_kernel_does_not_compile(recorded) -> None:
    """The check can fail: a kernel with an undeclared name is refused."""
    cuda_attention.cuda_attention(
        mx.zeros((1, 8, 1, 64)), mx.zeros((1, 2, 30, 64)), mx.zeros((1, 2, 30, 64)), mx.zeros((1, 30), mx.bool_), 0.1
    )
    made, call = recorded[0]
    source = expand(made["source"])
    broken = dict(made, source=source.replace("__threadfence();", "__threadfence_typo();", 1))
    assert broken["source"] != source
    with pytest.raises(AssertionError, match="threadfence_typo"):
        _compile(generated(broken, call))


def test_the_rotation_spells_out_the_products_mlx_fuses() -> None:
    """MLX's ``rope_single`` as its CUDA build compiled it (the wheel's SASS, every dtype,
    both layouts, with and without frequencies) computes ``fma(x1, cos, -(x2 * sin))`` and
    ``fma(x1, sin, x2 * cos)``. Written ``x1 * sin + x2 * cos``, which product is fused is
    the compiler's choice, and NVRTC's changed with the code around it (float32 rows one
    ulp from MLX's on an H100). ``tests/test_cuda_emulated.py`` checks that the bytes
    do not depend on contraction; here, that the products fused are MLX's."""
    text = cuda_kvwrite._HEADER
    assert "__fmaf_rn(x1, costheta, -__fmul_rn(x2, sintheta))" in text
    assert "__fmaf_rn(x1, sintheta, __fmul_rn(x2, costheta))" in text
    assert not re.search(r"x[12] \* (cos|sin)theta", text)
