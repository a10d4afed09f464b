"""Where the host time of a cached segc decode call goes, function by function
(``cProfile``; issue 13): the reference llama's layer sizes, ``--layers`` layers, KV
caches at ``--context``; the time until each call returns (the device's work is waited
for outside the profile). Prints the functions by their own time, then by cumulative time.

    python benchmarks/profile_call.py --layers 16 --context 1024 --calls 200
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time

import mlx.core as mx

import segc
from segc.models import tiny_llama


def main() -> None:
    from mlx_lm.models.cache import make_prompt_cache

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--top", type=int, default=25)
    a = ap.parse_args()
    model = tiny_llama(
        num_hidden_layers=a.layers,
        hidden_size=a.hidden,
        intermediate_size=4 * a.hidden,
        num_attention_heads=max(1, a.hidden // 64),
        num_key_value_heads=max(1, a.hidden // 256),
        vocab_size=32000,
        dtype=mx.bfloat16,
    )
    step = segc.jit(model, boundaries="layers.*", validate=False)
    cache = make_prompt_cache(model)
    prompt = mx.array([[(7 * i + 3) % 32000 for i in range(a.context)]])
    mx.eval(step(prompt, cache=cache))
    x = mx.array([[5]])

    def call() -> mx.array:
        y = step(x, cache=cache)
        return y

    def settle(y: mx.array) -> None:
        mx.eval(y, [c.state for c in cache])
        for c in cache:
            c.offset -= 1  # every call writes the same position

    for _ in range(10):
        settle(call())
    prof = cProfile.Profile()
    host = 0.0
    for _ in range(a.calls):
        t0 = time.perf_counter()
        prof.enable()
        y = call()
        prof.disable()
        host += time.perf_counter() - t0
        settle(y)
    print(f"{mx.default_device()}: {a.layers} layers, context {a.context}, {a.calls} calls")
    print(f"host time per call (profiled, so inflated): {host / a.calls * 1e6:.1f} us")
    st = pstats.Stats(prof)
    st.sort_stats("tottime").print_stats(a.top)
    st.sort_stats("cumulative").print_stats(a.top)


if __name__ == "__main__":
    main()
