"""How long the GPU itself spends on a decode step's products, read from its own clock
(issue 13: past the host's cost, a decode step is device time).

Each case runs ``R`` launches of one product pattern of the reference llama (over ``R``
distinct weights, so that the L2 cache does not serve them) between two stamp kernels
that read the GPU's ``%globaltimer``. MLX closes a CUDA graph every
``MLX_MAX_OPS_PER_BUFFER`` operations (100 on the H200) and launches it whole, so the
``R`` launches run back to back whatever the host's speed: the stamps' difference over
``R`` is the pattern's device time, its share of the gaps between a graph's kernels
included. Each pattern twice: as eager MLX runs it (its own kernels) and as segc's CUDA
lowering runs it (``segc.lower.products``: one kernel). Then the whole decode step of
eager mlx-lm, ``mx.compile`` and segc (one segment, ``concat_projections``,
``freeze_params``), stamped around: the device's span for a step, waits for the host
included.

Against the weights' bytes each figure gives a bandwidth, and against the HBM's peak
(``--peak``, 4.8 TB/s) how far the kernels are from it. On a machine without CUDA the
stamps are wall-clock times around a synchronous evaluation: the script runs, but its
figures are host and device together, not device time.

    python benchmarks/device_time.py [--bits 4] [--repeats 10] [--reps 12] [--layers 16] [--skip-products]
        [--spans] [--cache-limit BYTES]

Each segc kernel's output is compared with MLX's, byte for byte (the last column). With
``MLX_MAX_OPS_PER_BUFFER`` and ``MLX_MAX_MB_PER_BUFFER`` set past a step's size, MLX
launches a step as one CUDA graph after the host has encoded all of it: the span is
then the device's own time for the step, no wait for the host in it. With
``MLX_USE_CUDA_GRAPHS=0`` MLX launches each kernel as it encodes it.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mlx.core as mx

sys.path.insert(0, str(Path(__file__).parent))

CUDA = mx.default_device() == mx.gpu and mx.cuda.is_available()
_CLOCK = 'unsigned long long g; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(g)); t[0] = g;'


@functools.cache
def _stamp_in() -> Any:
    return mx.fast.cuda_kernel(
        name="segc_stamp_in",
        input_names=["a"],
        output_names=["y", "t"],
        source="const uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;\n"
        f"if (i == 0) {{ {_CLOCK} }}\nif (i < SIZE) {{ y[i] = a[i]; }}\n",
    )


@functools.cache
def _stamp_out(n: int) -> Any:
    return mx.fast.cuda_kernel(
        name=f"segc_stamp_out_{n}",
        input_names=[f"o{i}" for i in range(n)],
        output_names=["t"],
        source=f"if (blockIdx.x == 0 && threadIdx.x == 0) {{ {_CLOCK} }}\n",
    )


def stamped(a: mx.array, body: Callable[[mx.array], list[mx.array]]) -> float:
    """Seconds the device spends from a copy of ``a`` to the end of ``body``'s outputs
    (on the CPU: the wall-clock time of evaluating them)."""
    mx.synchronize()
    if not CUDA:
        t = time.perf_counter()
        mx.eval(body(a))
        return time.perf_counter() - t
    size = a.size
    y, t0 = _stamp_in()(
        inputs=[a],
        template=[("SIZE", size)],
        grid=(-(-size // 256) * 256, 1, 1),
        threadgroup=(256, 1, 1),
        output_shapes=[a.shape, (1,)],
        output_dtypes=[a.dtype, mx.uint64],
    )
    outs = body(y)
    (t1,) = _stamp_out(len(outs))(
        inputs=outs, grid=(32, 1, 1), threadgroup=(32, 1, 1), output_shapes=[(1,)], output_dtypes=[mx.uint64]
    )
    mx.eval(t0, t1, outs)
    return (int(t1.item()) - int(t0.item())) * 1e-9


def _weights(rows: int, k: int, reps: int, dtype: mx.Dtype, bits: int | None) -> list[list[mx.array]]:
    ws = []
    for i in range(reps):
        w = (mx.random.normal((rows, k), key=mx.random.key(i)) * 0.02).astype(dtype)
        ws.append(list(mx.quantize(w, group_size=64, bits=bits)) if bits else [w])
    mx.eval(ws)
    return ws


def product_cases(h: int, inter: int, qkv: int, vocab: int) -> list[tuple[str, int, int, str, bool]]:
    """(name, weight rows, row length, kind, with the norm) of a llama layer's products
    and the logits, as segc's CUDA lowering takes them with ``concat_projections``."""
    return [
        ("q/k/v + norm", qkv, h, "gemv", True),
        ("o + residual", h, h, "add", False),
        ("gate/up + norm + silu", 2 * inter, h, "glu", True),
        ("down + residual", h, inter, "add", False),
        ("logits + norm", vocab, h, "gemv", True),
    ]


def _eager(kind: str, n: int, norm: bool, bits: int | None) -> Callable[..., mx.array]:
    """The pattern in MLX's ops, as eager runs it."""

    def mm(x: mx.array, w: list[mx.array]) -> mx.array:
        if bits:
            return mx.quantized_matmul(x, *w, transpose=True, group_size=64, bits=bits)
        return x @ w[0].T

    def run(x: mx.array, w: list[mx.array], r: mx.array, nw: mx.array) -> mx.array:
        if norm:
            x = mx.fast.rms_norm(x, nw, 1e-5)
        y = mm(x, w)
        if kind == "add":
            return r + y
        if kind == "glu":
            g, u = y[..., :n], y[..., n:]
            return (g * mx.sigmoid(g)) * u
        return y

    return run


def _segc(kind: str, n: int, norm: bool, bits: int | None, shape: tuple[int, ...]) -> Callable[..., mx.array] | None:
    """The pattern as segc's CUDA lowering runs it (one kernel), or None off CUDA or
    where it is not taken."""
    from segc.lower.product_match import QMV_MAX
    from segc.lower.products import ProductMatch, product_kernel

    kernel = product_kernel("auto")
    if kernel is None or (bits and n * (2 if kind == "glu" else 1) > QMV_MAX):
        return None
    rows = (0, n) if kind == "glu" else (0,)
    order = (True, True) if kind == "glu" else (False,) if kind == "add" else ()

    def run(x: mx.array, w: list[mx.array], r: mx.array, nw: mx.array) -> mx.array:
        ins = [x, *w, *([r] if kind == "add" else []), *([nw] if norm else [])]
        names = tuple(f"i{i}" for i in range(len(ins)))
        m = ProductMatch(
            kind,
            names,
            rows,
            n,
            order,
            "o",
            shape,
            0,
            frozenset(),
            1e-5 if norm else None,
            (64, bits) if bits else None,
        )
        return kernel(m, ins)

    return run


def time_products(args: argparse.Namespace) -> list[dict[str, Any]]:
    dtype = mx.bfloat16
    h, inter, vocab = args.hidden, args.intermediate, args.vocab
    qkv = h + 2 * args.kv_heads * (h // args.heads)
    x = (mx.random.normal((1, 1, h)) * 0.5).astype(dtype)
    rows = []
    for name, nrows, k, kind, norm in product_cases(h, inter, qkv, vocab):
        n = nrows // 2 if kind == "glu" else nrows
        xin = x if k == h else (mx.random.normal((1, 1, k)) * 0.5).astype(dtype)
        r = mx.zeros((1, 1, n), dtype=dtype)
        nw = mx.ones((k,), dtype=dtype)
        ws = _weights(nrows, k, args.reps, dtype, args.bits)
        nbytes = sum(a.nbytes for a in ws[0])
        impls = {"mlx": _eager(kind, n, norm, args.bits), "segc": _segc(kind, n, norm, args.bits, (1, 1, n))}
        ref = None
        for impl, f in impls.items():
            if f is not None:
                got = bytes(memoryview(f(xin, ws[0], r, nw)))
                ref = got if ref is None else ref
                secs = _measure(f, xin, ws, r, nw, args.repeats)
                rows.append(
                    {
                        "case": name,
                        "impl": impl,
                        "us": secs * 1e6,
                        "mb": nbytes / 1e6,
                        "tbps": nbytes / secs / 1e12,
                        "same": got == ref,
                    }
                )
    return rows


def _measure(
    f: Callable[..., mx.array], xin: mx.array, ws: list[list[mx.array]], r: mx.array, nw: mx.array, repeats: int
) -> float:
    """Seconds of one launch of ``f``: the median over ``repeats`` stamped runs of one
    launch per weight."""

    def body(y: mx.array) -> list[mx.array]:
        return [f(y, w, r, nw) for w in ws]

    for _ in range(2):
        stamped(xin, body)  # kernels built, graphs cached
    return statistics.median(stamped(xin, body) for _ in range(repeats)) / len(ws)


def time_attention(args: argparse.Namespace) -> dict[str, float]:
    """Microseconds of one layer's decode attention at context 1024 (32 query heads over
    8 KV heads of 64, bf16): MLX's fused kernel over the live keys, as eager runs it, and
    segc's kernel over a 1280-position buffer with a mask, as segc's dynamic cache runs
    it (each over ``--reps`` distinct buffers, as the layers' are): one kernel and two,
    each compiled as segc's segments run it (the one kernel's counter a constant), and
    the one kernel called plainly, which makes its counter at each call (an upload the
    GPU waits for: not a segment's cost)."""
    hq, hkv, d, cap, live = args.heads, args.kv_heads, args.hidden // args.heads, 1280, 1025
    dt = mx.bfloat16
    q = mx.random.normal((1, hq, 1, d)).astype(dt)
    kv = [
        (
            mx.random.normal((1, hkv, cap, d), key=mx.random.key(2 * i)).astype(dt),
            mx.random.normal((1, hkv, cap, d), key=mx.random.key(2 * i + 1)).astype(dt),
        )
        for i in range(args.reps)
    ]
    mask = (mx.arange(cap) < live)[None]
    mx.eval(q, kv, mask)
    scale = d**-0.5
    impls: dict[str, Callable[[mx.array, tuple[mx.array, mx.array]], mx.array]] = {
        "MLX, live keys": lambda y, b: mx.fast.scaled_dot_product_attention(
            y, b[0][:, :, :live], b[1][:, :, :live], scale=scale
        ),
    }
    if CUDA:
        from segc.lower.cuda_attention import cuda_attention

        one = mx.compile(lambda y, k, v: cuda_attention(y, k, v, mask, scale, kernels=1))
        two = mx.compile(lambda y, k, v: cuda_attention(y, k, v, mask, scale, kernels=2))
        impls["segc, one kernel"] = lambda y, b: one(y, b[0], b[1])
        impls["segc, two kernels"] = lambda y, b: two(y, b[0], b[1])
        impls["segc, one, uncompiled"] = lambda y, b: cuda_attention(y, b[0], b[1], mask, scale, kernels=1)
    out = {}
    for name, f in impls.items():

        def body(y: mx.array, f: Callable[..., mx.array] = f) -> list[mx.array]:
            return [f(y, b) for b in kv]

        for _ in range(2):
            stamped(q, body)
        out[name] = 1e6 * statistics.median(stamped(q, body) for _ in range(args.repeats)) / len(kv)
    return out


# segc's step variants: (jit settings, SELECT_WRITE, FUSED_PRODUCTS, FUSED_KV_WRITE) as the lowering reads them
SEGC_STEPS: dict[str, tuple[dict[str, Any], str, str, str]] = {
    "segc": ({}, "auto", "auto", "auto"),  # one segment, concat_projections, freeze_params
    "segcdsu": ({}, "never", "auto", "auto"),  # MLX's own one-position KV writes (and rotations)
    "segcplain": ({}, "auto", "never", "auto"),  # without the product kernels
    "segcnokv": ({}, "auto", "auto", "never"),  # the rotations and writes without segc's kernel
    "segcmlxattn": ({"attention": "off"}, "auto", "auto", "auto"),  # MLX's masked attention, not segc's kernel
}
# segc's step with an environment setting (read when its segments are built): the rotated
# write and its attention as two kernels (SEGC_FUSED_KV_ATTENTION=0; one is the default)
ENV_STEPS: dict[str, tuple[str, dict[str, str]]] = {
    "segckvapart": ("segc", {"SEGC_FUSED_KV_ATTENTION": "0"}),
    "segcinplace": ("segc", {"SEGC_KV_IN_PLACE": "1"}),  # the write with its attention in place
    # its queries rotated first by MLX's rope (SEGC_FUSED_QUERY_ROPE=mlx), copying and in place
    "segcqrope": ("segc", {"SEGC_FUSED_QUERY_ROPE": "mlx"}),
    "segcinplaceqrope": ("segc", {"SEGC_KV_IN_PLACE": "1", "SEGC_FUSED_QUERY_ROPE": "mlx"}),
    # the attention's chunks read into shared memory first (SEGC_ATTENTION_STAGE), copying and in place
    "segcstage": ("segc", {"SEGC_ATTENTION_STAGE": "1"}),
    "segcinplacestage": ("segc", {"SEGC_KV_IN_PLACE": "1", "SEGC_ATTENTION_STAGE": "1"}),
    # not staged, in place (where SEGC_ATTENTION_STAGE=auto stages)
    "segcinplacenostage": ("segc", {"SEGC_KV_IN_PLACE": "1", "SEGC_ATTENTION_STAGE": "0"}),
    # segcnokv's attention as its two kernels (the chunks, then their merge: each one's time
    # in the step), and staged
    "segcnokv2k": ("segcnokv", {"SEGC_ATTENTION_KERNELS": "2"}),
    "segcnokvstage": ("segcnokv", {"SEGC_ATTENTION_STAGE": "1"}),
    # the write in place with its attention over chunks of 64 and 128 keys (SEGC_ATTENTION_CHUNK)
    "segcinplacec64": ("segc", {"SEGC_KV_IN_PLACE": "1", "SEGC_ATTENTION_CHUNK": "64"}),
    "segcinplacec128": ("segc", {"SEGC_KV_IN_PLACE": "1", "SEGC_ATTENTION_CHUNK": "128"}),
}
# short names for segc's step with bench_llama.py's suffixes (its SETTINGS): chains
# (segc.lower.cuda_chain, cuda_layer; off by default), a layer as one kernel or the MLP
# with the next product as one, and the same compiled to fit four blocks an SM
SUFFIXED = {f"segc{s}": f"segc+{s}" for s in ("chain", "chain4", "chainocc", "chain4occ")}


def step_body(name: str, layers: int, bits: int | None, moving: bool = False) -> Callable[[mx.array], list[mx.array]]:
    """One decode step at context 1024 of variant ``name`` (``eager``, ``compile`` or a
    ``SEGC_STEPS`` name) on a model of its own: a function of the token (a ``(1, 1)``
    array) returning the step's logits and KV buffers, warmed up (traced, lowered).
    ``moving``: each call decodes the next position, as a generation does (a new offset
    every call, from 1,024 up: at most 256 calls), not position 1,024 again
    (``compile`` needs the fixed position)."""
    from bench_llama import FixedContext, compiled_with_cache, first_call_with, make_model

    import segc

    model = make_model("reference" if CUDA else "cpu", layers=layers, bits=bits)
    fc = FixedContext(model, 1024)
    caches = (lambda: fc.cache) if moving else fc.reset
    x = mx.array([[1]])
    if name == "eager":
        return lambda y: [model(y, cache=caches()), *fc.arrays()]
    if name == "compile":
        if moving:
            raise SystemExit("compile decodes one fixed position: not with moving positions")
        comp = compiled_with_cache(model, fc)
        return lambda y: [comp(y), *fc.arrays()]
    env: dict[str, str] = {}
    name = SUFFIXED.get(name, name)
    if name in ENV_STEPS:
        name, env = ENV_STEPS[name]
    elif "+" in name:  # segc+chain4+sm1: bench_llama's suffixes (SETTINGS)
        from bench_llama import SETTINGS, base_of, settings_of

        if any(s not in SETTINGS for s in name.split("+")[1:]):
            raise SystemExit(f"unknown suffix in {name!r}: {', '.join(SETTINGS)}")
        name, env = base_of(name), settings_of(name)
    if name not in SEGC_STEPS:
        raise SystemExit(
            f"unknown step variant {name!r}: eager, compile, {', '.join([*SEGC_STEPS, *ENV_STEPS, *SUFFIXED])}"
        )
    kw, select, fused, kv = SEGC_STEPS[name]
    step = segc.jit(model, validate=False, concat_projections=True, freeze_params=True, **kw)
    # lowered now, with env for this step alone
    first_call_with(lambda: mx.eval(step(x, cache=fc.reset()), fc.arrays()), select, fused, kv, env)
    return lambda y: [step(y, cache=caches()), *fc.arrays()]


def time_steps(args: argparse.Namespace) -> dict[str, float]:
    """The device's span of one decode step at context 1024, per variant, ms."""
    x = mx.array([[1]])
    variants = {name: step_body(name, args.layers, args.bits) for name in args.steps.split(",")}
    out = {}
    for name, body in variants.items():
        for _ in range(3):
            stamped(x, body)
        cache = mx.get_cache_memory()
        spans = [1e3 * stamped(x, body) for _ in range(args.repeats)]
        out[name] = statistics.median(spans)
        if args.spans:  # every call's span in order, and whether the allocator's cache moved meanwhile
            moved = (mx.get_cache_memory() - cache) / 2**20
            print(f"  {name} spans, ms: {' '.join(f'{s:.3f}' for s in spans)}; cache {moved:+.1f} MiB", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--intermediate", type=int, default=8192)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--layers", type=int, default=16, help="layers of the decode step's model (0: no step)")
    ap.add_argument("--bits", type=int, default=None, help="quantize the weights (groups of 64)")
    ap.add_argument("--reps", type=int, default=12, help="launches between the stamps (one CUDA graph: keep it small)")
    ap.add_argument("--repeats", type=int, default=10, help="stamped measurements per figure (the median)")
    ap.add_argument("--peak", type=float, default=4.8, help="the HBM's peak, TB/s")
    ap.add_argument(
        "--steps",
        default="eager,compile,segc",
        help=f"whole steps: eager, compile, {', '.join([*SEGC_STEPS, *ENV_STEPS, *SUFFIXED])}, or a segc step with "
        "bench_llama.py's suffixes (segc+chain4+sm1)",
    )
    ap.add_argument("--skip-products", action="store_true", help="time the whole steps only")
    ap.add_argument(
        "--spans", action="store_true", help="print every step's span in call order (its modes) and the cache's change"
    )
    ap.add_argument(
        "--cache-limit", type=int, default=None,
        help="MLX's buffer cache limit in bytes for the run (0: every freed buffer goes back to CUDA; the step's "
        "modes against buffer reuse)"
    )  # fmt: skip
    args = ap.parse_args()
    if args.cache_limit is not None:
        mx.set_cache_limit(args.cache_limit)
    what = "device time (the GPU's clock)" if CUDA else "wall-clock time (no CUDA: host and device together)"
    print(f"{what} on {mx.default_device()}, bf16{f', {args.bits}-bit' if args.bits else ''}, mlx {mx.__version__}")
    rows = [] if args.skip_products else time_products(args)
    if rows:
        print(f"\n{'pattern':<24}{'impl':>6}{'us':>10}{'MB':>9}{'TB/s':>8}{'of peak':>9}  MLX's bytes")
    for r in rows:
        print(
            f"{r['case']:<24}{r['impl']:>6}{r['us']:>10.1f}{r['mb']:>9.1f}{r['tbps']:>8.2f}{r['tbps'] / args.peak:>9.0%}"
            f"  {'yes' if r['same'] else 'NO'}"
        )
    per = {(r["case"], r["impl"]): r["us"] for r in rows}
    layer = ("q/k/v + norm", "o + residual", "gate/up + norm + silu", "down + residual")
    for impl in ("mlx", "segc"):
        if all((c, impl) in per for c in layer):
            # a pattern segc does not take (4-bit logits past 16384 rows) runs MLX's kernels
            logits = per.get(("logits + norm", impl), per.get(("logits + norm", "mlx"), 0.0))
            total = args.layers * sum(per[(c, impl)] for c in layer) + logits
            print(f"a step's products ({args.layers} layers and the logits), {impl}: {total / 1e3:.3f} ms")
    if not args.skip_products:
        print("\none layer's decode attention at context 1024, us:")
        for name, us in time_attention(args).items():
            print(f"  {name:<22}{us:8.1f}")
    if args.layers:
        steps = time_steps(args)
        print("\na decode step at context 1024, the device's span (waits for the host included), ms:")
        for name, ms in steps.items():
            print(f"  {name:<12}{ms:8.3f}")


if __name__ == "__main__":
    main()
