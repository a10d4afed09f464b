"""Every primitive the mlx-lm architectures produce has a lowering rule, and the tiny
models run bit-identically through segc (uncut, and cut at every point).

Architectures: llama, qwen2, qwen3, gemma3_text, mixtral, phi3, olmo2, starcoder2,
deepseek_v3; each plain and quantized (``nn.quantize``), without and with a KV cache.
On the CPU the ``mx.fast`` ops decompose; on the GPU the same test sees them whole.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import mlx.nn as nn
import pytest
from conftest import (
    assert_same_bits,
    cut_variants,
    eager_or_skip,
    prims,
    record_differs,
    run_graph,
    same_bits,
)

import segc
from segc.lower import RULES, check_supported
from segc.models.zoo import build

mlx_lm = pytest.importorskip("mlx_lm", reason="the mlx-lm models need the lm extra (pip install segc[lm])")
from mlx_lm.models.cache import make_prompt_cache  # noqa: E402

# on top of segc.models.zoo's tiny configurations: what widens the lowered graphs
ARCHS: dict[str, dict[str, Any]] = {
    "llama": {},
    "qwen2": {},
    "qwen3": dict(tie_word_embeddings=True),
    "gemma3_text": dict(sliding_window=4),  # shorter than the prompt: the sliding layer masks
    "mixtral": {},
    "phi3": {},
    "olmo2": {},
    "starcoder2": {},
    "deepseek_v3": dict(  # grouped expert routing, wider latent attention
        n_group=2,
        topk_group=1,
        num_key_value_heads=4,
        kv_lora_rank=32,
        qk_nope_head_dim=32,
        v_head_dim=32,
        scoring_func="sigmoid",
        norm_topk_prob=True,
    ),
}


def tiny(arch: str, quantized: bool) -> nn.Module:
    return build(arch, bits=4 if quantized else None, **ARCHS[arch])


VARIANTS = [
    pytest.param(arch, q, c, t, id=f"{arch}-{'q4' if q else 'fp'}-{'cache' if c else 'nocache'}-{t}")
    for arch in ARCHS
    for q in (False, True)
    for c in (False, True)
    for t in ((9, 40) if arch in ("mixtral", "deepseek_v3") and not c else (9,))
]


# a model test: 30 s on a fresh machine, the first variant of each architecture compiling
# its kernels (up to 6.5 s); marking only those would move the cost to the next variant
@pytest.mark.slow
@pytest.mark.parametrize(("arch", "quantized", "use_cache", "tokens"), VARIANTS)
def test_arch_lowers_bit_identical(arch: str, quantized: bool, use_cache: bool, tokens: int) -> None:
    model = tiny(arch, quantized)
    prompt = mx.array([[(7 * i + 3) % 100 for i in range(tokens)]], dtype=mx.int32)

    def run(x: mx.array) -> mx.array:
        return model(x, cache=make_prompt_cache(model) if use_cache else None)

    (want,) = eager_or_skip(run, [prompt])
    compiled = mx.compile(run)(prompt)
    mx.eval(compiled)
    g = segc.jit(run).trace(prompt).graph
    missing = sorted(prims(g) - set(RULES))
    assert not missing, f"{arch}: no rule for {missing}"
    check_supported(g)
    allowed = [want]
    if not same_bits(want, compiled):  # the promise is then mx.compile's bits
        record_differs(f"mlx-lm {arch}", g)
        assert mx.default_device() != mx.cpu, f"{arch}: mx.compile differs from eager on the CPU"
        allowed.append(compiled)
    (replay,) = run_graph(g, [prompt], compile=False)  # the graph's ops one by one, no fusion
    if not same_bits(replay, want):
        # the model calls mx.compile itself (gemma3's gelu_approx), so eager fuses there; on
        # the GPU fused code rounds differently, and a graph cut inside such a region runs
        # it unfused: as this replay does (docs/lowering.md)
        assert mx.default_device() != mx.cpu, f"{arch}: the op-by-op replay differs from eager on the CPU"
        record_differs(f"mlx-lm {arch} (op by op)", g)
        allowed.append(replay)
    for label, gv in cut_variants(g, singles=[len(g.eqns) // 2]):
        (got,) = run_graph(gv, [prompt])
        if label == "uncut":  # mx.compile's bits, which are eager's unless listed above
            assert_same_bits([got], [compiled], f"{arch} uncut")
        assert any(same_bits(got, a) for a in allowed), (
            f"{arch} {label}: matches neither eager, mx.compile nor the op-by-op replay"
        )
