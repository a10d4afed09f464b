"""Side-by-side timings of an mlx-lm llama: eager, ``mx.compile``, segc, segc with host drains.

One run times, interleaved round by round so that drift hits every variant alike:

* ``eager``    -- the mlx-lm model called directly;
* ``compile``  -- ``mx.compile`` of the whole forward (weights captured as constants);
* ``segc``     -- ``segc.jit(model, boundaries="layers.*")``: one compiled segment per
  layer, ``mx.async_eval`` after each (no host wait between segments);
* ``drain``    -- the same segments with a host ``mx.eval`` after each (``drain=True``):
  the host-draining baseline of the seed;
* ``whole``    -- (optional) ``segc.jit(model)`` with no boundaries: one segment, the
  stock path, to separate the cost of cutting from the cost of segc's call path;
* ``each`` / ``fences`` / ``geo`` -- (optional) ``segc`` with the commit policy fixed to
  ``"segment"`` (``mx.async_eval`` after every segment), ``"fences"`` (one commit, the
  caller's) or ``"geometric"`` (after segments 1, 2, 4, 8, ...); ``segc`` itself uses
  the backend's default (``"auto"``);
* ``fused`` / ``fusedfences`` -- (optional, CUDA only) ``segc`` and ``fences`` with
  ``attention="on"``: the dynamic cache's masked decode attention as segc's fused kernel
  (what ``"auto"`` picks on a CUDA GPU); ``unfused`` -- ``fences`` with
  ``attention="off"``: MLX's decomposition of that attention;
* ``concat`` / ``concatfences`` / ``wholeconcat`` -- (optional) ``segc``, ``fences``
  and ``whole`` with ``concat_projections=True``: each layer's q/k/v and gate/up
  products as one product over concatenated weights (the module's weights become views
  of them, so in one process every later variant runs on those views: the same values);
  ``wholefrozen`` -- ``wholeconcat`` with ``freeze_params=True`` (the parameters checked
  at the first call only); ``frozen`` / ``frozeneach`` / ``frozengeo`` -- the same with
  a segment per layer, the commit policy ``"auto"``, ``"segment"``, ``"geometric"``
  (MLX launches a step's work as the commits close it: they trade host time for an
  earlier start of the device); ``frozenhead`` -- ``frozen`` with no boundary after the
  last layer, whose segment then holds the final norm and the output head too (16
  segments, not 17: docs/experiments.md found a separate head segment costing 0.1-0.24
  ms of host time on the H200); ``frozen2`` / ``frozen4`` -- ``frozenhead`` with a
  segment per two (four) layers (9 and 5 segments in the experiment's ``every:2`` and
  ``every:4`` were faster than 17 on the H200: a segment costs host time);
  ``frozenc2`` / ``frozenc4`` -- ``frozen``'s segments committed every second (fourth)
  segment (``commit="every:2"``, ``"every:4"``): fewer CUDA graphs a step, each
  bigger, with the cuts and kernels of ``frozen``.

``--isolate`` runs every variant in a process of its own (MLX's kernel and CUDA-graph
caches are per process, so one variant's commits cannot slow another down); the
outputs are then compared byte for byte across the processes. With ``--rounds`` above
one, each round's median is printed with the host's speed in that process
(:func:`host_probe`), then each variant's median over the rounds at the host's fast
speed (:func:`fast_rounds`). There a variant may
carry a suffix that sets MLX's process-wide settings for its process alone:
``+nographs`` runs it with ``MLX_USE_CUDA_GRAPHS=0`` (MLX's CUDA build then launches
each kernel as it encodes it, where by default a commit builds and launches a CUDA
graph of the work since the last one), e.g. ``--variants eager,frozen,frozen+nographs``;
``+noremat`` with ``SEGC_REMAKE_VIEWS=0`` (no segment makes a view of constants again
instead of reading it: docs/runtime.md); ``+chain`` with ``SEGC_CHAIN_PRODUCTS=1`` (a
decode layer from its attention to the next layer's q, k and v product as one kernel:
docs/lowering.md), ``+chain4`` the same with ``SEGC_CHAIN_ATTENTION=0`` (the attention
a kernel of its own), ``+chain3`` also with ``SEGC_CHAIN_NEXT=0`` (the MLP's three
products alone); ``+chainocc`` and ``+chain4occ`` as ``+chain`` and ``+chain4`` with
``SEGC_CHAIN_OCCUPANCY=4`` (the kernels compiled to fit four blocks an SM); ``+sm1`` and
``+sm2`` set the chains' grid to one or two blocks an SM of an H100 or H200
(``SEGC_CHAIN_BLOCKS=132``, ``264``; the default is the largest separate kernel's grid);
``+inplace`` with ``SEGC_KV_IN_PLACE=1`` (what ``segc.jit(..., kv_in_place=True)`` does:
the KV write with its attention writes into the cache's buffers, docs/lowering.md);
``+qrope`` with ``SEGC_FUSED_QUERY_ROPE=mlx`` (that kernel takes its queries rotated by
MLX's ``rope``; ``+stage``, ``+nostage``: ``SEGC_ATTENTION_STAGE``); ``+nolive`` with
``SEGC_LIVE_ATTENTION=0`` (segc's write-with-attention kernel, not MLX's attention over
the live keys after segc's write: docs/lowering.md), ``+live`` with ``1`` (the default);
``+lc0``, ``+lc1``, ``+lc2``, ``+lc3``, ``+lc4`` with ``SEGC_LIVE_COMMITS`` 0, 1, 2 (the
default), 3, 4 (a segment run as stretches commits after every Kth live step inside it,
none for 0, e.g. ``wholefrozen+inplace+lc1``), ``+lc112`` with ``1,1,2`` (after the first
and second, then every second: the device started one layer sooner); ``+lc12``, ``+lc23``,
``+lc1123``: groups of 1 and 2 in turn, of 2 and 3, and 1, 1 then 2 and 3 in turn (no two
consecutive groups of one shape: ``benchmarks/graph_reuse.py``).

on two workloads: a decode step (one token; with a KV cache at ``--context`` when
``segc.jit`` accepts one, else a plain 1-token forward, and the output says which) and a
prefill (``--prefill`` tokens). Also: the first call of a ``--first-call-layers``-layer
model split into trace / passes / lower / segc replay / MLX compile, and the host
dispatch cost of a cached call per segment (a model of trivial segments; the slope over
the segment count is the per-segment cost, the intercept the per-call cost).

Every variant's output is compared with eager's: segc must be bit-identical.
On the CPU quote ratios only; absolute times are meaningful on the GPU.

    python benchmarks/bench_llama.py --preset reference --json out.json
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np

import segc
from segc.lower import checked
from segc.models import tiny_llama
from segc.runtime import Executor
from segc.staging.validate import VALIDATE_TOL
from segc.trace.params import ParamGatherer

PRESETS: dict[str, dict[str, Any]] = {
    # fast enough for a smoke test on a laptop CPU
    "tiny": dict(
        hidden_size=64,
        num_hidden_layers=4,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=128,
        dtype="float32",
    ),
    # a small llama for CPU ratios (MLX's CPU matmul here runs at a few GFLOP/s)
    "cpu": dict(
        hidden_size=128,
        num_hidden_layers=8,
        intermediate_size=256,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=1024,
        dtype="float32",
    ),
    # DESIGN.md's reference model: 1.10 B parameters, 2.21 GB in bf16
    "reference": dict(
        hidden_size=2048,
        num_hidden_layers=16,
        intermediate_size=8192,
        num_attention_heads=32,
        num_key_value_heads=8,
        vocab_size=32000,
        dtype="bfloat16",
    ),
}

VARIANTS = (
    "eager",
    "compile",
    "segc",
    "drain",
    "whole",
    "each",
    "fences",
    "geo",
    "fused",
    "fusedfences",
    "unfused",
    "concat",
    "concatfences",
    "wholeconcat",
    "wholefrozen",
    "frozen",
    "frozeneach",
    "frozengeo",
    "frozenhead",
    "frozen2",
    "frozen4",
    "frozenc2",
    "frozenc4",
)
COMMIT = {
    "each": "segment",
    "fences": "fences",
    "geo": "geometric",
    "fusedfences": "fences",
    "unfused": "fences",
    "concatfences": "fences",
    "frozeneach": "segment",
    "frozengeo": "geometric",
    "frozenc2": "every:2",
    "frozenc4": "every:4",
}
FROZEN = tuple(v for v in VARIANTS if "frozen" in v)  # freeze_params=True
CONCAT = ("concat", "concatfences", "wholeconcat", *FROZEN)  # concat_projections=True: sibling products as one
FUSED = ("fused", "fusedfences")  # attention="on": segc's fused decode attention (CUDA)
UNFUSED = ("unfused",)  # attention="off": MLX's decomposition of the masked attention
DEFAULT_VARIANTS = ("eager", "compile", "segc", "drain")
SETTINGS = {  # a variant's "+suffix" (--isolate only)
    "nographs": {"MLX_USE_CUDA_GRAPHS": "0"},
    "noremat": {"SEGC_REMAKE_VIEWS": "0"},  # every segment reads the views of constants it uses
    "chain": {"SEGC_CHAIN_PRODUCTS": "1"},  # a layer from its attention on as one kernel (layer_chain.py)
    "chain4": {"SEGC_CHAIN_PRODUCTS": "1", "SEGC_CHAIN_ATTENTION": "0"},  # the MLP and the next product
    "chain3": {"SEGC_CHAIN_PRODUCTS": "1", "SEGC_CHAIN_NEXT": "0", "SEGC_CHAIN_ATTENTION": "0"},  # the MLP alone
    # the same compiled to fit 4 blocks an SM (NVRTC's launch bounds: cuda_chain.occupancy)
    "chainocc": {"SEGC_CHAIN_PRODUCTS": "1", "SEGC_CHAIN_OCCUPANCY": "4"},
    "chain4occ": {"SEGC_CHAIN_PRODUCTS": "1", "SEGC_CHAIN_ATTENTION": "0", "SEGC_CHAIN_OCCUPANCY": "4"},
    # the chains' grids: one and two blocks an SM of the H100 and H200 (132 SMs each)
    "sm1": {"SEGC_CHAIN_BLOCKS": "132"},
    "sm2": {"SEGC_CHAIN_BLOCKS": "264"},
    # the KV write with its attention writing into the old buffers (segc.jit's kv_in_place)
    "inplace": {"SEGC_KV_IN_PLACE": "1"},
    # the decode attention's chunks read into shared memory first (SEGC_ATTENTION_STAGE)
    "stage": {"SEGC_ATTENTION_STAGE": "1"},
    "nostage": {"SEGC_ATTENTION_STAGE": "0"},  # not even in place (staged there by default)
    # the write with its attention taking its queries rotated by MLX's rope (SEGC_FUSED_QUERY_ROPE)
    "qrope": {"SEGC_FUSED_QUERY_ROPE": "mlx"},
    # the decode attention's chunks of 64 and 128 keys, not 32 (SEGC_ATTENTION_CHUNK)
    "c64": {"SEGC_ATTENTION_CHUNK": "64"},
    "c128": {"SEGC_ATTENTION_CHUNK": "128"},
    # the KV caches' offset made on the device, not in MLX's managed scalar pool (SEGC_DEVICE_POSITION)
    "devpos": {"SEGC_DEVICE_POSITION": "1"},
    # the decode attention by MLX's own kernel over the live keys, eager's call (SEGC_LIVE_ATTENTION,
    # on by default), or segc's write-with-attention kernel
    "live": {"SEGC_LIVE_ATTENTION": "1"},
    "nolive": {"SEGC_LIVE_ATTENTION": "0"},
    # a segment run as stretches committed after every 1st, 2nd (the default), 4th live step inside it, or
    # only where the commit policy commits after segments (SEGC_LIVE_COMMITS)
    "lc0": {"SEGC_LIVE_COMMITS": "0"},
    "lc1": {"SEGC_LIVE_COMMITS": "1"},
    "lc2": {"SEGC_LIVE_COMMITS": "2"},
    "lc4": {"SEGC_LIVE_COMMITS": "4"},
    "lc3": {"SEGC_LIVE_COMMITS": "3"},
    "lc112": {"SEGC_LIVE_COMMITS": "1,1,2"},  # the device started after the first attention
    "lc3553": {"SEGC_LIVE_COMMITS": "3,5,5,3"},  # four commits, small end groups (16 layers)
    # chosen by the segment over its first 75 calls (segc.lower.live_tune): time it after --warmup 80
    "lctune": {"SEGC_LIVE_COMMITS": "tune"},
    # no two consecutive groups of one shape (MLX caches one executable CUDA graph per shape: benchmarks/graph_reuse.py),
    # spelled out for 32 layers: groups of 1 and 2, of 2 and 3, and 1, 1 then 2 and 3, in turn
    "lc12": {"SEGC_LIVE_COMMITS": ",".join(["1,2"] * 11)},
    "lc23": {"SEGC_LIVE_COMMITS": ",".join(["2,3"] * 7)},
    "lc1123": {"SEGC_LIVE_COMMITS": "1,1," + ",".join(["2,3"] * 6)},
    # commits on a thread of their own while the host builds the next part (segc.committer)
    "ct": {"SEGC_COMMIT_THREAD": "1"},
    "ct112": {"SEGC_COMMIT_THREAD": "1", "SEGC_LIVE_COMMITS": "1,1,2"},
    "ct1": {"SEGC_COMMIT_THREAD": "1", "SEGC_LIVE_COMMITS": "1"},
    # CUDA's default memory pool keeping what it reserves (benchmarks/mempool.py), in any variant
    "poolkeep": {"SEGC_BENCH_POOL_KEEP": "1"},
}


def base_of(variant: str) -> str:
    """``frozen+nographs`` -> ``frozen``: the variant a suffixed name runs."""
    return variant.split("+", 1)[0]


def settings_of(variant: str) -> dict[str, str]:
    """The environment a suffixed variant's process runs with (``SETTINGS``)."""
    env: dict[str, str] = {}
    for suffix in variant.split("+")[1:]:
        env.update(SETTINGS[suffix])
    return env


def boundaries_of(variant: str, model: Any) -> str | list[str] | None:
    """``boundaries=`` of a segc variant: none for the one-segment variants, every
    layer's but the last's for ``frozenhead``, every second (fourth) layer's but the
    last's for ``frozen2`` (``frozen4``), else every layer's."""
    if variant in ("whole", "wholeconcat", "wholefrozen"):
        return None
    n = len(model.layers)
    if variant == "frozenhead":
        return [f"layers.{i}" for i in range(n - 1)]
    if variant in ("frozen2", "frozen4"):  # after every 2nd (4th) layer but the last
        k = int(variant[-1])
        return [f"layers.{i}" for i in range(k - 1, n - 1, k)]
    return "layers.*"


# H200 figures used for the floors printed beside GPU timings (DESIGN.md)
HBM_BYTES_PER_S = 4.8e12
BF16_FLOP_PER_S = 790e12


# --------------------------------------------------------------------------- models


def make_model(
    preset: str, layers: int | None = None, seed: int = 0, arch: str = "llama", bits: int | None = None
) -> nn.Module:
    """The preset's sizes for mlx-lm's ``arch`` (``mixtral``: 8 experts, 2 per token),
    random weights, quantized to ``bits`` (group size 64, as mlx-lm) if given."""
    cfg = dict(PRESETS[preset])
    dtype = getattr(mx, cfg.pop("dtype"))
    if layers is not None:
        cfg["num_hidden_layers"] = layers
    if arch == "llama":
        model = tiny_llama(dtype=dtype, seed=seed, **cfg)
        if bits:
            nn.quantize(model, group_size=64, bits=bits)
            mx.eval(model.parameters())
        return model
    from segc.models.zoo import build

    if arch in ("mixtral", "qwen3_moe"):
        cfg.update(num_local_experts=8, num_experts=8, num_experts_per_tok=2)
    return build(arch, seed=seed, dtype=dtype, bits=bits, group_size=64, **cfg)


def _params(model: nn.Module) -> dict[str, mx.array]:
    return ParamGatherer(model).gather()[0]


def weight_bytes(model: nn.Module) -> int:
    return sum(v.nbytes for v in _params(model).values())


def linear_flops(model: nn.Module, tokens: int) -> int:
    """2 * tokens * (parameters of every matmul weight, the embedding's gather excluded)."""
    n = sum(v.size for k, v in _params(model).items() if v.ndim == 2 and "embed_tokens" not in k)
    return 2 * tokens * n


# --------------------------------------------------------------------------- KV cache


def segc_takes_cache() -> bool:
    """Whether this segc's ``jit`` threads mlx-lm KV caches through a call (issue 3)."""
    try:
        model = make_model("tiny", layers=1)
        from mlx_lm.models.cache import make_prompt_cache

        cache = make_prompt_cache(model)
        step = segc.jit(model, boundaries="layers.*")
        prompt = mx.array([[1, 2, 3]])
        ref_cache = make_prompt_cache(model)
        ref = model(prompt, cache=ref_cache)
        out = step(prompt, cache=cache)
        mx.eval(out, ref)
        return bool(mx.array_equal(out, ref).item()) and cache[0].offset == 3
    except Exception:
        return False


class FixedContext:
    """mlx-lm KV caches held at one context length: every decode call writes position
    ``context`` again, so every timed call does the same work."""

    def __init__(self, model: nn.Module, context: int):
        from mlx_lm.models.cache import make_prompt_cache

        self.model = model
        self.context = context
        self.cache = make_prompt_cache(model)
        emb = model.parameters()["model"]["embed_tokens"]
        # a quantized embedding's weight is packed uint32: the model computes in its scales' dtype
        dtype = emb["scales"].dtype if "scales" in emb else emb["weight"].dtype
        args = model.args
        kvh = args.num_key_value_heads
        hd = getattr(args, "head_dim", None) or args.hidden_size // args.num_attention_heads
        mx.random.seed(1)
        for c in self.cache:
            # one position more than the context, so the buffers already have room for
            # the decoded token (no variant grows them inside a timed call)
            k = mx.random.normal((1, kvh, context + 1, hd)).astype(dtype)
            v = mx.random.normal((1, kvh, context + 1, hd)).astype(dtype)
            c.update_and_fetch(k, v)
            c.offset = context
        mx.eval([(c.keys, c.values) for c in self.cache])

    def reset(self) -> list[Any]:
        for c in self.cache:
            c.offset = self.context
        return self.cache

    def arrays(self) -> list[mx.array]:
        return [a for c in self.cache for a in (c.keys, c.values)]


def first_call_with(
    call: Callable[[], Any],
    select: str = "auto",
    fused: str = "auto",
    kv: str = "auto",
    env: dict[str, str] | None = None,
) -> Any:
    """``call()`` (a segc step's first call: where the jit lowers) with segc's CUDA
    lowering settings ``select`` (``segc.lower.shapes.SELECT_WRITE``), ``fused``
    (``segc.lower.products.FUSED_PRODUCTS``) and ``kv``
    (``segc.lower.kvwrite.FUSED_KV_WRITE``), all back to ``"auto"`` after it, and the
    environment's settings ``env`` (read as the segments are lowered), back as they were."""
    from segc.lower import kvwrite, products, shapes

    before = {k: os.environ.get(k) for k in env or {}}
    os.environ.update(env or {})
    shapes.SELECT_WRITE, products.FUSED_PRODUCTS, kvwrite.FUSED_KV_WRITE = select, fused, kv
    try:
        return call()
    finally:
        shapes.SELECT_WRITE = products.FUSED_PRODUCTS = kvwrite.FUSED_KV_WRITE = "auto"
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def compiled_with_cache(model: nn.Module, fc: FixedContext) -> Callable[[mx.array], mx.array]:
    """``mx.compile`` of a decode step whose cache buffers are explicit inputs and outputs."""

    def pure(x: mx.array, *kv: mx.array) -> list[mx.array]:
        for i, c in enumerate(fc.cache):
            c.keys, c.values, c.offset = kv[2 * i], kv[2 * i + 1], fc.context
        y = model(x, cache=fc.cache)
        return [y, *fc.arrays()]

    cpure = mx.compile(pure)

    def call(x: mx.array) -> mx.array:
        keep = fc.arrays()
        y, *kv = cpure(x, *keep)
        for i, c in enumerate(fc.cache):
            c.keys, c.values, c.offset = kv[2 * i], kv[2 * i + 1], fc.context
        return y

    return call


# --------------------------------------------------------------------------- timing


def stats(xs: list[float]) -> dict[str, float]:
    s = sorted(xs)
    q = statistics.quantiles(s, n=4) if len(s) >= 2 else [s[0], s[0], s[0]]
    return {"median": statistics.median(s), "min": s[0], "max": s[-1], "p25": q[0], "p75": q[2], "n": len(s)}


def host_probe() -> float:
    """A fixed pure-Python loop's time: the host CPU's speed at the moment. A cloud
    machine's host switches between two speeds (about 1.8x apart) for seconds at a time
    (docs/experiments-log.md, run AX; docs/performance-log.md, fifty-ninth session), and
    a decode step is host-bound, so each isolated round reports it beside its time."""
    t = time.perf_counter()
    sum(i * i for i in range(5000))
    return time.perf_counter() - t


def time_interleaved(
    fns: dict[str, Callable[[], Any]], sync: dict[str, Callable[[], Any]], warmup: int, repeats: int
) -> dict[str, dict[str, Any]]:
    """Round-robin over the variants; per call: host time (until the call returns),
    submit time (until ``mx.async_eval`` of its outputs and cache state returns: every
    kernel of the call handed to the device, the host's whole share of a call; eager
    mlx-lm's call only builds the graph, its encoding happens in the evaluation) and
    wall time (until its outputs, and any cache state, are evaluated); and the host's
    speed (:func:`host_probe`) once a round, the same for every variant."""
    for _ in range(warmup):
        for name, f in fns.items():
            mx.eval(f(), sync[name]())
    wall: dict[str, list[float]] = {k: [] for k in fns}
    host: dict[str, list[float]] = {k: [] for k in fns}
    submit: dict[str, list[float]] = {k: [] for k in fns}
    probes = []
    for _ in range(repeats):
        probes.append(host_probe())
        for name, f in fns.items():
            mx.synchronize()
            t0 = time.perf_counter()
            y = f()
            t1 = time.perf_counter()
            mx.async_eval(y, sync[name]())
            t2 = time.perf_counter()
            mx.eval(y, sync[name]())
            t3 = time.perf_counter()
            host[name].append(t1 - t0)
            submit[name].append(t2 - t0)
            wall[name].append(t3 - t0)
    probe = stats(probes)
    return {
        k: {"wall": stats(wall[k]), "host": stats(host[k]), "submit": stats(submit[k]), "probe": probe} for k in fns
    }


def workload(
    model: nn.Module,
    tokens: int,
    *,
    context: int | None,
    warmup: int,
    repeats: int,
    variants: tuple[str, ...],
    outputs: Path | None = None,
    alias: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Time every variant on one input; check each against eager for bit-identity.
    ``outputs``: also write each variant's output bytes there (``--isolate``), under its
    name in ``alias`` where it has one."""
    mx.random.seed(2)
    x = mx.random.randint(0, model.args.vocab_size, (1, tokens))
    fc = FixedContext(model, context) if context else None
    fns: dict[str, Callable[[], Any]] = {}
    sync: dict[str, Callable[[], Any]] = {}
    nothing: Callable[[], Any] = lambda: []  # noqa: E731
    jitted: dict[str, Any] = {}
    errors: dict[str, str] = {}
    for v in variants:
        try:
            if v == "eager":
                fns[v] = (lambda: model(x, cache=fc.reset())) if fc else (lambda: model(x))
            elif v == "compile":
                fns[v] = _compile_cached(model, fc, x) if fc else _compile_plain(model, x)
            else:
                # validate=False: off the CPU the dynamic KV cache's logits differ from
                # eager's in the last bits (docs/models.md), and validation would switch to
                # exact mode, which at this fixed context never retraces: the benchmark
                # would time a graph that a real decode loop (a trace per token) cannot use
                step = segc.jit(
                    model,
                    boundaries=boundaries_of(v, model),
                    drain=(v == "drain"),
                    commit=COMMIT.get(v, "auto"),
                    attention="on" if v in FUSED else "off" if v in UNFUSED else "auto",
                    validate=False,
                    concat_projections=v in CONCAT,
                    freeze_params=v in FROZEN,
                )
                jitted[v] = step
                fns[v] = _bind_segc(step, x, fc)
            sync[v] = fc.arrays if fc else nothing
            mx.eval(fns[v](), sync[v]())  # trace, compile, first run
        except Exception as exc:  # a variant that cannot run is reported, not fatal
            errors[v] = f"{type(exc).__name__}: {exc}"
            fns.pop(v, None)
    # bit-identity against eager (same input, same cache state)
    outs = {k: f() for k, f in fns.items()}
    mx.eval(outs)
    if outputs is not None:
        for k, y in outs.items():
            name = (alias or {}).get(k, k)
            (outputs / f"{tokens}_{name}.bin").write_bytes(raw_bytes(y))
            np.save(outputs / f"{tokens}_{name}.npy", np.array(y.astype(mx.float32)))
    identical: dict[str, bool | None] = {}
    for k, y in outs.items():
        identical[k] = None if "eager" not in outs else raw_bytes(y) == raw_bytes(outs["eager"])
    # segc's promise where its KV cache is not bit-identical to eager mlx-lm (the GPU):
    # segmented == unsegmented
    to_whole = {
        k: bool(mx.array_equal(outs[k], outs["whole"]).item())
        for k in ("segc", "drain")
        if k in outs and "whole" in outs
    }
    t = time_interleaved(fns, sync, warmup, repeats)
    res: dict[str, Any] = {
        "tokens": tokens,
        "context": context,
        "timings": t,
        "bit_identical_to_eager": identical,
        "within_tol_of_eager": {
            k: within_tol(np.array(y.astype(mx.float32)), np.array(outs["eager"].astype(mx.float32)))
            for k, y in outs.items()
        }
        if "eager" in outs
        else {},
        "rel_diff_to_eager": {
            k: rel_diff(np.array(y.astype(mx.float32)), np.array(outs["eager"].astype(mx.float32)))
            for k, y in outs.items()
        }
        if "eager" in outs
        else {},
        "bit_identical_to_whole": to_whole,
        "errors": errors,
    }
    for k, step in jitted.items():
        info = step.cache_info()
        res.setdefault("segments", {})[k] = len(step.entries()[0].segments)
        res.setdefault("retraces", {})[k] = list(info.retraces)
    if "segc" in jitted and "segc" in fns:
        res["segc_host"] = host_split(jitted["segc"], fns["segc"], sync["segc"], max(repeats, 10))
    return res


def within_tol(y: np.ndarray, ref: np.ndarray) -> bool:
    """segc's bound for a dynamic KV cache off the CPU (docs/models.md):
    |y - ref| <= VALIDATE_TOL * (1 + |ref|) everywhere."""
    return bool(y.shape == ref.shape and np.all(np.abs(y - ref) <= VALIDATE_TOL * (1 + np.abs(ref))))


def rel_diff(y: np.ndarray, ref: np.ndarray) -> float:
    """max |y - ref| / (1 + |ref|): what :func:`within_tol` compares with
    ``VALIDATE_TOL``, reported where outputs differ (docs/models.md measures the GPU's
    bf16 decode rounding at 0.028-0.032 of it at the reference sizes)."""
    if y.shape != ref.shape:
        return math.inf
    return float(np.max(np.abs(y - ref) / (1 + np.abs(ref)))) if y.size else 0.0


def passes(w: dict[str, Any], v: str, gpu: bool) -> bool:
    """A segc variant keeps its promise: eager's bits, or, with a KV cache off the CPU,
    within the documented bound of eager."""
    if w["bit_identical_to_eager"].get(v) is not False:
        return True
    return gpu and bool(w.get("context")) and w.get("within_tol_of_eager", {}).get(v) is True


def raw_bytes(y: mx.array) -> bytes:
    """The bytes of ``y`` as stored (-0.0 and NaN payloads included)."""
    return bytes(np.array(mx.contiguous(y).reshape(-1).view(mx.uint8)))


def isolated(argv: list[str], variants: tuple[str, ...], out_json: str | None, rounds: int = 1) -> int:
    """Run each variant in a process of its own (the same arguments, ``--variants v``),
    ``rounds`` times round-robin (one process's timings drift with the GPU's state, so
    each figure is the median over rounds), then merge the results and compare the
    outputs byte for byte with eager's."""
    r: dict[str, Any] = {}
    per_round: dict[tuple[str, str], list[dict[str, Any]]] = {}  # (workload, variant) -> timings
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        for rnd in range(rounds):
            for i, v in enumerate(variants):
                rest = [a for a in argv if a != "--isolate"]
                out = d / f"{v}.{rnd}.json"
                cmd = [sys.executable, __file__, *rest, "--variants", base_of(v), "--outputs-dir", tmp]
                cmd += ["--json", str(out), "--as", v]
                if i or rnd:  # the first-call and dispatch parts run once, in the first process
                    cmd += ["--first-call-layers", "0", "--no-dispatch"]
                env = settings_of(v)
                shown = " ".join(f"{k}={x}" for k, x in env.items())
                print(f"[isolate] round {rnd + 1}/{rounds} {v}: {shown} {' '.join(cmd[1:])}", flush=True)
                subprocess.run(cmd, check=False, env={**os.environ, **env})
                child = json.loads(out.read_text()) if out.exists() else None
                if child is None:
                    r.setdefault("errors", {})[v] = "the process wrote no results"
                    continue
                for part, e in child.get("errors", {}).items():
                    r.setdefault("errors", {})[f"{v}: {part}"] = e
                for name, w in child["workloads"].items():
                    for vv, tv in w["timings"].items():
                        per_round.setdefault((name, vv), []).append(tv)
                if "workloads" not in r:
                    child["errors"] = r.get("errors", {})
                    r = child
                    continue
                for name, w in child["workloads"].items():
                    mine = r["workloads"].setdefault(name, w)
                    if mine is not w:
                        for key in ("errors", "segments", "retraces"):
                            mine.setdefault(key, {}).update(w.get(key, {}))
                        if "segc_host" in w:
                            mine["segc_host"] = w["segc_host"]
        for (name, v), ts in per_round.items():
            merged = {
                part: {k: statistics.median(t[part][k] for t in ts) for k in ts[0][part]}
                for part in ("wall", "host", "submit")
                if part in ts[0]
            }
            merged["round_medians"] = [t["wall"]["median"] for t in ts]
            merged["round_probes"] = [t["probe"]["median"] for t in ts]
            r["workloads"][name].setdefault("timings", {})[v] = merged
        for w in r.get("workloads", {}).values():
            w["timings"] = {v: w["timings"][v] for v in variants if v in w["timings"]}
            base = d / f"{w['tokens']}_eager.bin"
            w["bit_identical_to_eager"] = {
                v: (d / f"{w['tokens']}_{v}.bin").read_bytes() == base.read_bytes()
                for v in variants
                if (d / f"{w['tokens']}_{v}.bin").exists() and base.exists()
            }
            w["within_tol_of_eager"] = {
                v: within_tol(np.load(d / f"{w['tokens']}_{v}.npy"), np.load(d / f"{w['tokens']}_eager.npy"))
                for v in w["bit_identical_to_eager"]
            }
            w["rel_diff_to_eager"] = {
                v: rel_diff(np.load(d / f"{w['tokens']}_{v}.npy"), np.load(d / f"{w['tokens']}_eager.npy"))
                for v in w["bit_identical_to_eager"]
            }
    r["rounds"] = rounds
    r["isolated"] = True
    print(f"\n=== isolated: each variant in its own process, median over {rounds} round(s) ===")
    for name, w in r.get("workloads", {}).items():
        print_workload(r, name, w)
        if rounds > 1:
            for v, tv in w["timings"].items():
                shown = [
                    f"{fmt_t(x).strip()} (host probe {p * 1e6:.0f} us)"
                    for x, p in zip(tv["round_medians"], tv["round_probes"], strict=True)
                ]
                print(f"  {v:<8} per round: " + ", ".join(shown))
            print_fast_host(w["timings"])
    for k, e in r.get("errors", {}).items():
        print(f"{k} FAILED: {e}")
    ok = (
        bool(r.get("workloads"))
        and not r.get("errors")
        and not any(w.get("errors") for w in r["workloads"].values())  # a variant that failed in its process
        and all(
            passes(w, v, r["device_kind"] == "gpu")
            for w in r["workloads"].values()
            for v in variants
            if base_of(v) in ("segc", "drain", "whole", "each", "fences", "geo", *FUSED, *UNFUSED, *CONCAT)
        )
    )
    r["segc_bit_identical"] = ok
    if out_json:
        Path(out_json).write_text(json.dumps(r, indent=1))
    print(f"\nsegc outputs bit-identical to eager mlx-lm (GPU decode: within the bound) in every workload: {ok}")
    return 0 if ok else 1


def fast_rounds(t: dict[str, dict[str, Any]], within: float = 1.15) -> dict[str, list[float]]:
    """Each variant's round medians whose host probe was within ``within`` of the fastest
    probe of the run (the host at its fast speed; variants without probes left out)."""
    probes = [p for tv in t.values() for p in tv.get("round_probes", ())]
    bar = min(probes, default=0.0) * within
    return {
        v: [m for m, p in zip(tv["round_medians"], tv["round_probes"], strict=True) if p <= bar]
        for v, tv in t.items()
        if tv.get("round_probes") and len(tv["round_probes"]) == len(tv["round_medians"])
    }


def print_fast_host(t: dict[str, dict[str, Any]], within: float = 1.15) -> None:
    """Each variant's median over its rounds at the host's fast speed (:func:`fast_rounds`)
    and its ratio to eager's: the comparison a switch of the host's speed between
    processes does not decide."""
    fast = fast_rounds(t, within)
    if not fast:
        return
    base = statistics.median(fast["eager"]) if fast.get("eager") else math.nan
    print(f"  rounds with the host at its fast speed (probe within {within:.2f}x of the fastest):")
    for v, ms in fast.items():
        if ms:
            med = statistics.median(ms)
            print(f"  {v:<28} {fmt_t(med)}  {len(ms)} round(s)  x eager {med / base:.3f}")
        else:
            print(f"  {v:<28} no round")


def rename(w: dict[str, Any], old: str, new: str) -> None:
    """An --isolate child's workload under the name its parent gave the variant
    (``frozen+nographs`` ran as ``frozen``): every per-variant key."""
    for d in w.values():
        if isinstance(d, dict) and old in d and old != new:
            d[new] = d.pop(old)


def host_split(step: Any, f: Callable[[], Any], sync: Callable[[], Any], calls: int) -> dict[str, float]:
    """Where the host time of a cached segc call goes: segc's call path (signature,
    parameters, state, commit) against the executor's dispatch loop (the compiled
    segment calls and their ``mx.async_eval``), per call and per segment, timed by
    ``Executor.timed()`` on every compiled entry of the jitted function."""
    compiled = step.entries()
    total = []
    with contextlib.ExitStack() as stack:
        recs = [stack.enter_context(c.executor.timed()) for c in compiled]
        for _ in range(calls):
            mx.synchronize()
            t0 = time.perf_counter()
            y = f()
            total.append(time.perf_counter() - t0)
            mx.eval(y, sync())
    times = [t for r in recs for t in r.calls]
    n_seg = len(compiled[0].segments)
    call, ex = statistics.median(total), statistics.median(times)
    return {
        "call_s": call,
        "executor_s": ex,
        "call_path_s": call - ex,
        "segments": n_seg,
        "executor_per_segment_s": ex / n_seg,
    }


def _compile_plain(model: nn.Module, x: mx.array) -> Callable[[], Any]:
    f = mx.compile(lambda t: model(t))
    return lambda: f(x)


def _compile_cached(model: nn.Module, fc: FixedContext, x: mx.array) -> Callable[[], Any]:
    f = compiled_with_cache(model, fc)
    return lambda: f(x)


def _bind_segc(step: Any, x: mx.array, fc: FixedContext | None) -> Callable[[], Any]:
    if fc is None:
        return lambda: step(x)
    return lambda: step(x, cache=fc.reset())


# --------------------------------------------------------------------------- first call


def first_call(preset: str, layers: int, tokens: int, arch: str = "llama", bits: int | None = None) -> dict[str, Any]:
    """Trace, passes (verify + segmentation), lower (executor build), segc replay (the
    lowering rules rebuilding the MLX graph, uncompiled), MLX compile + first run."""
    model = make_model(preset, layers=layers, arch=arch, bits=bits)
    x = mx.random.randint(0, model.args.vocab_size, (1, tokens))
    step = segc.jit(model, boundaries="layers.*")
    t: dict[str, float] = {}
    t0 = time.perf_counter()
    traced = step.trace(x)
    t1 = time.perf_counter()
    lowered = traced.lower()
    segs = lowered.segments
    t2 = time.perf_counter()
    spent = checked.SPENT
    compiled = lowered.compile()
    t3 = time.perf_counter()
    # the dequantized products' and expert products' device checks (CUDA, 64 rows or
    # more): MLX compiles and runs kernels there, so they are reported apart from segc's
    # own lowering
    t["checks"] = checked.SPENT - spent
    t["trace"], t["passes"], t["lower"] = t1 - t0, t2 - t1, t3 - t2 - t["checks"]
    inputs = compiled.flat_inputs(x)
    # segc replay: the same lowering rules, uncompiled and not evaluated
    plain = Executor(lowered.graph, compile=False, commit="fences")  # built, not committed
    t4 = time.perf_counter()
    lazy = plain(inputs)
    t["replay"] = time.perf_counter() - t4
    del lazy
    # the first compiled call: MLX traces each segment function (the replay again),
    # compiles it, and (on the GPU) builds its kernels; then a cached call for reference
    t5 = time.perf_counter()
    mx.eval(compiled.execute(inputs))
    t["first_run"] = time.perf_counter() - t5
    t6 = time.perf_counter()
    mx.eval(compiled.execute(inputs))
    t["cached_run"] = time.perf_counter() - t6
    t["mlx_compile"] = max(0.0, t["first_run"] - t["replay"] - t["cached_run"])
    t["segc_total"] = t["trace"] + t["passes"] + t["lower"] + t["replay"]
    return {
        "layers": layers,
        "tokens": tokens,
        "equations": len(lowered.graph.eqns),
        "segments": len(segs),
        "seconds": t,
    }


# --------------------------------------------------------------------------- dispatch


class _Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = mx.ones((8,))

    def __call__(self, x: mx.array) -> mx.array:
        return x * self.w + 1.0


class _Stack(nn.Module):
    def __init__(self, n: int) -> None:
        super().__init__()
        self.layers = [_Tiny() for _ in range(n)]

    def __call__(self, x: mx.array) -> mx.array:
        for layer in self.layers:
            x = layer(x)
        return x


def _host_per_call(f: Callable[[], Any], calls: int) -> float:
    """Median host time of one call (until it returns), each call's outputs evaluated after."""
    ts = []
    for _ in range(calls):
        mx.synchronize()
        t0 = time.perf_counter()
        y = f()
        ts.append(time.perf_counter() - t0)
        mx.eval(y)
    return statistics.median(ts)


def dispatch(counts: tuple[int, ...] = (1, 8, 32), calls: int = 300) -> dict[str, Any]:
    """Host cost of a cached segc call of ``n`` trivial segments, against the least an
    MLX program can do for the same work: ``n`` ``mx.compile``d functions each followed
    by ``mx.async_eval``, in a plain Python loop. Slopes over ``n`` are per segment."""
    rows = []
    for n in counts:
        model = _Stack(n)
        mx.eval(model.parameters())
        x = mx.ones((8,))
        step = segc.jit(model, boundaries="layers.*")
        f = mx.compile(lambda t, w: t * w + 1.0)
        ws = [layer.w for layer in model.layers]

        def loop(ws: list[mx.array] = ws, f: Any = f, x: mx.array = x) -> mx.array:
            h = x
            for w in ws:
                h = f(h, w)
                mx.async_eval(h)
            return h

        mx.eval(step(x), loop())
        assert mx.array_equal(step(x), loop()).item()
        segs = len(step.entries()[0].segments)
        rows.append(
            {
                "layers": n,
                "segments": segs,
                "segc_s": _host_per_call(functools.partial(step, x), calls),
                "mlx_loop_s": _host_per_call(loop, calls),
            }
        )

    def slope(key: str) -> tuple[float, float]:
        xs = [r["segments"] for r in rows]
        ys = [r[key] for r in rows]
        mxs, mys = statistics.fmean(xs), statistics.fmean(ys)
        b = sum((a - mxs) * (c - mys) for a, c in zip(xs, ys)) / sum((a - mxs) ** 2 for a in xs)
        return b, mys - b * mxs

    s_segc, i_segc = slope("segc_s")
    s_loop, i_loop = slope("mlx_loop_s")
    return {
        "rows": rows,
        "per_segment_s": {"segc": s_segc, "mlx_loop": s_loop, "segc_overhead": s_segc - s_loop},
        "per_call_s": {"segc": i_segc, "mlx_loop": i_loop, "segc_overhead": i_segc - i_loop},
    }


# --------------------------------------------------------------------------- report


def fmt_t(s: float) -> str:
    if s >= 1:
        return f"{s:8.3f} s "
    if s >= 1e-3:
        return f"{s * 1e3:8.3f} ms"
    return f"{s * 1e6:8.1f} us"


def print_header(r: dict[str, Any], out: Any = sys.stdout) -> None:
    p = print
    p(f"segc benchmark: mlx-lm llama, preset {r['preset']} ({r['config']}), device {r['device']}", file=out)
    p(f"mlx {r['mlx']}, segc {r['segc']}, {r['repeats']} timed calls each, {r['warmup']} warm-up", file=out)
    if r["device_kind"] == "cpu":
        p("CPU run: quote the ratios (x eager), not the absolute times.", file=out)


def print_workload(r: dict[str, Any], name: str, w: dict[str, Any], out: Any = sys.stdout) -> None:
    p = print
    p("", file=out)
    what = f"{name}: {w['tokens']} token(s)"
    what += f" at context {w['context']} (KV cache)" if w["context"] else " (no KV cache)"
    if w.get("note"):
        what += f" -- {w['note']}"
    p(what, file=out)
    t = w["timings"]
    base = t["eager"]["wall"]["median"] if "eager" in t else math.nan
    wid = max([12, *map(len, t)])
    p(
        f"  {'variant':<{wid}} {'median':>11} {'p25':>11} {'p75':>11} {'host':>11} {'submit':>11} {'x eager':>8}  bit-identical",
        file=out,
    )
    for v, tv in t.items():
        m = tv["wall"]
        same: Any = w["bit_identical_to_eager"].get(v)
        if same is False and w.get("within_tol_of_eager", {}).get(v):
            same = "False (within the bound)"
        elif same is False and v in w.get("rel_diff_to_eager", {}):
            same = f"False (max |d|/(1+|eager|) {w['rel_diff_to_eager'][v]:.3g})"
        elif same is None:
            same = "(no eager here)"
        p(
            f"  {v:<{wid}} {fmt_t(m['median'])} {fmt_t(m['p25'])} {fmt_t(m['p75'])} "
            f"{fmt_t(tv['host']['median'])} {fmt_t(tv.get('submit', {}).get('median', math.nan))} "
            f"{m['median'] / base:8.3f}  {same}",
            file=out,
        )
    for v, e in w["errors"].items():
        p(f"  {v:<8} FAILED: {e}", file=out)
    if w.get("bit_identical_to_whole"):
        same = ", ".join(f"{k} {v}" for k, v in w["bit_identical_to_whole"].items())
        p(f"  bit-identical to segc unsegmented (whole): {same}", file=out)
    med = {v: tv["wall"]["median"] for v, tv in t.items()}
    ratios = [
        f"{a} / {b} = {med[a] / med[b]:.2f}x"
        for a, b in (("drain", "segc"), ("segc", "compile"), ("segc", "eager"))
        if a in med and b in med
    ]
    if ratios:
        p("  " + "   ".join(ratios), file=out)
    h = w.get("segc_host")
    if h:
        p(
            f"  segc host time per call {fmt_t(h['call_s'])}: call path {fmt_t(h['call_path_s'])}, "
            f"executor {fmt_t(h['executor_s'])} = {fmt_t(h['executor_per_segment_s'])} x {h['segments']} segments",
            file=out,
        )
    if w.get("floor_s") and r["device_kind"] == "gpu":
        p(f"  floor ({w['floor_what']}): {fmt_t(w['floor_s'])}", file=out)


def print_first_call(fc: dict[str, Any], out: Any = sys.stdout) -> None:
    s = fc["seconds"]
    print("", file=out)
    print(
        f"first call, {fc['layers']} layers, {fc['tokens']} token(s), {fc['equations']} equations, "
        f"{fc['segments']} segments:",
        file=out,
    )
    for k in ("trace", "passes", "lower", "replay", "segc_total", "checks", "mlx_compile", "first_run", "cached_run"):
        print(f"  {k:<12} {fmt_t(s.get(k, 0.0))}", file=out)


def print_dispatch(d: dict[str, Any], out: Any = sys.stdout) -> None:
    p = print
    p("", file=out)
    p("cached-call host dispatch (trivial segments, median host time per call):", file=out)
    for row in d["rows"]:
        p(
            f"  {row['segments']:>3} segments: segc {fmt_t(row['segc_s'])}  plain MLX loop {fmt_t(row['mlx_loop_s'])}",
            file=out,
        )
    ps, pc = d["per_segment_s"], d["per_call_s"]
    p(
        f"  per segment: segc {fmt_t(ps['segc'])}, plain loop {fmt_t(ps['mlx_loop'])}, "
        f"segc's own {fmt_t(ps['segc_overhead'])}",
        file=out,
    )
    p(
        f"  per call:    segc {fmt_t(pc['segc'])}, plain loop {fmt_t(pc['mlx_loop'])}, "
        f"segc's own {fmt_t(pc['segc_overhead'])}",
        file=out,
    )


def print_report(r: dict[str, Any], out: Any = sys.stdout) -> None:
    """The whole report, e.g. from a saved JSON file."""
    print_header(r, out)
    if r.get("first_call"):
        print_first_call(r["first_call"], out)
    for name, w in r["workloads"].items():
        print_workload(r, name, w, out)
    if r.get("dispatch"):
        print_dispatch(r["dispatch"], out)
    for part, e in r.get("errors", {}).items():
        print(f"\n{part} FAILED: {e}", file=out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", choices=sorted(PRESETS), default="cpu")
    ap.add_argument("--layers", type=int, default=None, help="override the preset's layer count")
    ap.add_argument("--arch", default="llama", help="an mlx-lm architecture with the preset's sizes (e.g. mixtral)")
    ap.add_argument("--bits", type=int, default=None, help="quantize the weights (e.g. 4)")
    ap.add_argument("--repeats", type=int, default=20, help="timed calls of each variant per workload")
    ap.add_argument("--warmup", type=int, default=3, help="untimed calls of each variant first")
    ap.add_argument("--prefill", type=int, default=512, help="prefill tokens (0: skip)")
    ap.add_argument("--context", type=int, default=1024, help="KV-cache context of the decode step")
    ap.add_argument("--no-decode", action="store_true", help="skip the decode workload")
    ap.add_argument("--first-call-layers", type=int, default=32, help="layers of the first-call model (0: skip)")
    ap.add_argument("--no-dispatch", action="store_true", help="skip the dispatch-overhead measurement")
    ap.add_argument("--dispatch-calls", type=int, default=300, help="timed calls per size in the dispatch measurement")
    ap.add_argument(
        "--variants",
        default=",".join(DEFAULT_VARIANTS),
        help="comma-separated subset of " + ",".join(VARIANTS) + " (whole: segc with no boundaries, one segment)",
    )
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON, after every part")
    ap.add_argument("--isolate", action="store_true", help="each variant in a process of its own")
    ap.add_argument("--rounds", type=int, default=1, help="with --isolate: processes per variant, round-robin")
    ap.add_argument("--outputs-dir", type=Path, help=argparse.SUPPRESS)  # --isolate's children
    ap.add_argument("--as", dest="alias", help=argparse.SUPPRESS)  # a child's variant as the parent names it
    a = ap.parse_args(argv)
    variants = tuple(v for v in a.variants.split(",") if v)
    bad = [v for v in variants if base_of(v) not in VARIANTS or any(x not in SETTINGS for x in v.split("+")[1:])]
    if bad:
        ap.error(f"unknown variants {bad} (a suffix is one of {['+' + x for x in SETTINGS]})")
    if any("+" in v for v in variants) and not a.isolate:
        ap.error("a variant with a +suffix changes a process-wide setting: it needs --isolate")
    if any(v in FUSED for v in variants) and not mx.cuda.is_available():
        ap.error(f"variants {list(FUSED)} need MLX's CUDA backend (segc's fused attention kernel)")
    if a.isolate:
        args = list(sys.argv[1:] if argv is None else argv)
        for i, x in enumerate(args):  # the children get one variant each
            if x == "--variants":
                del args[i : i + 2]
                break
            if x.startswith("--variants="):
                del args[i]
                break
        args = [x for i, x in enumerate(args) if x != "--rounds" and (i == 0 or args[i - 1] != "--rounds")]
        return isolated(args, variants, a.json, a.rounds)

    model = make_model(a.preset, layers=a.layers, arch=a.arch, bits=a.bits)
    if os.environ.get("SEGC_BENCH_POOL_KEEP") == "1":  # the +poolkeep suffix (SETTINGS): before any timed call
        import mempool

        mempool.keep()
    cfg = dict(PRESETS[a.preset])
    if a.layers:
        cfg["num_hidden_layers"] = a.layers
    dev = mx.default_device()
    r: dict[str, Any] = {
        "preset": a.preset,
        "arch": a.arch,
        "bits": a.bits,
        "config": cfg,
        "device": str(dev),
        "device_kind": "gpu" if dev.type == mx.DeviceType.gpu else "cpu",
        "mlx": getattr(mx, "__version__", "?"),
        "segc": getattr(segc, "__version__", "?"),
        "python": platform.python_version(),
        "repeats": a.repeats,
        "warmup": a.warmup,
        "weight_bytes": weight_bytes(model),
        "workloads": {},
        "errors": {},
    }

    def save() -> None:
        sys.stdout.flush()
        if a.json:
            with open(a.json, "w") as f:
                json.dump(r, f, indent=1)

    def part(name: str, fn: Callable[[], None]) -> None:
        # one failing part is reported and the others still run
        try:
            fn()
        except Exception as exc:
            r["errors"][name] = f"{type(exc).__name__}: {exc}"
            print(f"\n{name} FAILED: {r['errors'][name]}")
        save()

    def do_first_call() -> None:
        r["first_call"] = first_call(a.preset, a.first_call_layers, 1, arch=a.arch, bits=a.bits)
        print_first_call(r["first_call"])

    def do_decode() -> None:
        cached = segc_takes_cache()
        w = workload(
            model,
            1,
            context=a.context if cached else None,
            warmup=a.warmup,
            repeats=a.repeats,
            variants=variants,
            outputs=a.outputs_dir,
            alias={variants[0]: a.alias} if a.alias else None,
        )
        if not cached:
            w["note"] = "segc.jit does not take a KV cache yet: a plain 1-token forward"
        w["floor_s"] = r["weight_bytes"] / HBM_BYTES_PER_S
        w["floor_what"] = "weight bytes / 4.8 TB/s"
        r["workloads"]["decode"] = w
        if a.alias:
            rename(w, variants[0], a.alias)
        print_workload(r, "decode", w)

    def do_prefill() -> None:
        w = workload(
            model,
            a.prefill,
            context=None,
            warmup=a.warmup,
            repeats=a.repeats,
            variants=variants,
            outputs=a.outputs_dir,
            alias={variants[0]: a.alias} if a.alias else None,
        )
        w["floor_s"] = linear_flops(model, a.prefill) / BF16_FLOP_PER_S
        w["floor_what"] = "linear FLOPs / 790 TFLOP/s"
        r["workloads"]["prefill"] = w
        if a.alias:
            rename(w, variants[0], a.alias)
        print_workload(r, "prefill", w)

    def do_dispatch() -> None:
        r["dispatch"] = dispatch(calls=a.dispatch_calls)
        print_dispatch(r["dispatch"])

    print_header(r)
    if a.first_call_layers:  # first, before any kernel of these shapes is built
        part("first_call", do_first_call)
    if not a.no_decode:
        part("decode", do_decode)
    if a.prefill:
        part("prefill", do_prefill)
    if not a.no_dispatch:
        part("dispatch", do_dispatch)
    ok = not r["errors"] and all(
        passes(w, v, r["device_kind"] == "gpu") and v not in w["errors"]
        for w in r["workloads"].values()
        for v in ("segc", "drain", "whole", "each", "fences", "geo", *FUSED, *UNFUSED, *CONCAT)
        if v in variants
    )
    r["segc_bit_identical"] = ok
    save()
    if a.outputs_dir is not None:  # an --isolate child: one variant, no eager beside it
        print("\nsegc outputs: compared with eager's after the merge (--isolate)")
        return 0 if not r["errors"] else 1
    print(f"\nsegc outputs bit-identical to eager mlx-lm (GPU decode: within the bound) in every workload: {ok}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
