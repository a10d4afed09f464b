"""Sibling products under ``concat_projections`` against eager MLX, byte for byte (issue 13).

A sweep of small programs: one first product, then 2-4 sibling products of its output
(with or without biases), read back three ways (the first alone, all concatenated, the
sum of their sums); inner dimensions 8-96, float32/float16/bfloat16, one row (which the
pass concatenates) and 2 x 5 rows (which it leaves apart), several seeds. For each,
segc's outputs with ``concat_projections=True`` and without are compared with eager's
bytes. Prints each program that differs and the totals: how many programs, how many
the pass concatenated (the device check let them through), how many differ.

On a CUDA GPU the device check (``segc.lower.concat.same_bits``) refuses some small
float32/float16 shapes; a program that differs here is a shape the check let through
that it should not have.

    python benchmarks/concat_bits.py
"""

from __future__ import annotations

import argparse
import itertools

import mlx.core as mx

import segc
from segc.dtypes import to_bytes
from segc.models import sibling_products
from segc.passes.concat import members


def main() -> None:
    argparse.ArgumentParser(description=__doc__).parse_args()  # --help; no options
    grid = itertools.product(
        [8, 32, 64, 96],
        [[1, 8], [8, 16], [16, 24, 64], [64, 64], [24, 1, 8, 16]],
        [mx.float32, mx.float16, mx.bfloat16],
        [False, True],
        [False, True],
        [((1,), 7), ((1,), 8), ((1,), 9), ((1,), 10), ((2, 5), 7)],
    )
    n = concatenated = differ = 0
    print(f"concat_projections against eager on {mx.default_device()}")
    for dim, outs, dtype, bias, bias_heads, (rows, seed) in grid:
        model = sibling_products(dim, outs, dtype=dtype, bias_first=bias, bias_heads=bias_heads, seed=seed)
        x = mx.random.normal((*rows, dim), key=mx.random.key(seed + 1)).astype(dtype)
        want = model(x)
        mx.eval(want)
        plain = segc.jit(sibling_products(dim, outs, dtype=dtype, bias_first=bias, bias_heads=bias_heads, seed=seed))(x)
        step = segc.jit(model, concat_projections=True)
        got = step(x)
        cats = [i for i in step.entries()[0].graph.inputs if members(i.path) is not None]
        n += 1
        concatenated += bool(cats)
        bad = [i for i, (a, b) in enumerate(zip(got, want)) if to_bytes(a) != to_bytes(b)]
        bad_plain = [i for i, (a, b) in enumerate(zip(plain, want)) if to_bytes(a) != to_bytes(b)]
        if bad or bad_plain:
            differ += 1
            print(
                f"  differs: dim={dim} outs={outs} {dtype} bias={bias} bias_heads={bias_heads} rows={rows} "
                f"seed={seed} concatenated={bool(cats)} outputs {bad} (without the pass: {bad_plain})"
            )
    print(f"{n} programs, {concatenated} concatenated, {differ} differ from eager")


if __name__ == "__main__":
    main()
