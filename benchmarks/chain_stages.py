"""Where a chain kernel's device time goes, stage by stage (``segc.lower.cuda_chain``,
``cuda_layer``): each block's lead thread stamps the GPU's ``%globaltimer`` at the
ticket loop's points (``cuda_tickets.tickets``' ``mark``) into an extra output, and this
script reads, per stage, its span (first ticket started to last ticket done, over
blocks), the time blocks waited for the stage before, the time their ``once`` work took
(the norm, the copies into shared memory) and the work per ticket; then the blocks'
start spread and the tail after the last stage.

The stamps change the kernel (a few shared words, a store a point), so its total is
close to, not the same as, the unstamped kernel's (``chain_device.py`` times that one).
Each case runs in batches of ``--batch`` launches in one evaluation, each reading the one
before's output (so that they run one after another, the device busy between them), its
figures the medians over the launches (a batch's first left out), the weights rotating
over ``--sets`` copies so that L2 serves none of them; the kernels' states are made once
by the GPU (``chain_device.resident``). CUDA only.

    python benchmarks/chain_stages.py [--blocks 1024,528,264,132] [--repeats 15]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np

sys.path.insert(0, str(Path(__file__).parent))

from chain_device import HQ, D, _match, keep_states_resident, layer_inputs, mlp_inputs

from segc.lower import cuda_chain, cuda_tickets

CUDA = mx.default_device() == mx.gpu and mx.cuda.is_available()
SLOTS = 32  # a block's stamps: see _MARKS
# slots: 0 start, 1 exit, 2+k waited, 7+k once, 12+k work, 17+k first ticket, 22+k last
# done, 27 tickets, 28 the SM
_NOW = (
    "__device__ __forceinline__ unsigned long long segc_now() {\n"
    '  unsigned long long t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); return t;\n}\n'
)
_MARKS = {
    "begin": """    __shared__ unsigned long long segc_st[32], segc_w, segc_t;
    __shared__ int segc_k;
    if (segc_lead()) {
        for (int j = 0; j < 32; ++j) segc_st[j] = 0;
        unsigned s; asm volatile("mov.u32 %0, %%smid;" : "=r"(s));
        segc_st[28] = s; segc_st[0] = segc_now();
    }
""",
    "wait": "if (segc_lead()) segc_w = segc_now();\n",
    "waited": "if (segc_lead()) { unsigned long long e = segc_now(); segc_st[2 + K] += e - segc_w; segc_w = e; }\n",
    "once": "if (segc_lead()) segc_st[7 + K] += segc_now() - segc_w;\n",
    "ticket": "if (segc_lead()) { segc_t = segc_now(); segc_k = K; if (!segc_st[17 + K]) segc_st[17 + K] = segc_t; }\n",
    "end": """if (segc_lead()) {
    unsigned long long e = segc_now();
    segc_st[12 + segc_k] += e - segc_t; segc_st[22 + segc_k] = e; segc_st[27] += 1;
}
""",
    "exit": """if (segc_lead()) {
    segc_st[1] = segc_now();
    for (int j = 0; j < 32; ++j) stamps[blockIdx.x * 32 + j] = segc_st[j];
}
""",
}


def mark(point: str, k: int) -> str:
    return _MARKS[point].replace("K", str(k))  # (the points of no stage have no K)


LAST: list[mx.array] = []


def _stamping(real: Callable[..., Any]) -> Callable[..., Any]:
    """``cuda_kernel`` with a ``stamps`` output (a block's ``SLOTS`` words), kept aside."""

    def make(**kw: Any) -> Any:
        kw["output_names"] = [*kw["output_names"], "stamps"]
        kw["header"] = kw["header"] + _NOW
        kernel = real(**kw)

        def call(**c: Any) -> Any:
            blocks = c["grid"][0] // 32
            c["output_shapes"] = [*c["output_shapes"], (blocks * SLOTS,)]
            c["output_dtypes"] = [*c["output_dtypes"], mx.uint64]
            outs = kernel(**c)
            LAST.append(outs[-1])
            return outs[:-1]

        return call

    return make


# the ticket machinery's variants to try (``--variant``): (text of CHAIN_HEADER, its
# replacement)
VARIANTS = {
    "base": [],
    "poll64": [("pause < 512 ? 2 * pause : pause", "pause < 64 ? 2 * pause : pause")],
    "spin": [("      __nanosleep(pause);\n", "")],
    "leadfence": [
        (
            "  __threadfence();\n  __syncthreads();\n  if (segc_lead()) {\n    atomicAdd(cnt, 1u);",
            "  __syncthreads();\n  if (segc_lead()) {\n    __threadfence();\n    atomicAdd(cnt, 1u);",
        )
    ],
}


def install(variant: str = "base") -> None:
    """Every chain and layer kernel made from here on stamps (nothing unstamped runs in
    this process), its ticket machinery as ``variant`` has it."""
    from segc.lower import cuda_layer

    header = cuda_tickets.CHAIN_HEADER
    for old, new in VARIANTS[variant]:
        if header.count(old) != 1:
            raise SystemExit(f"variant {variant}: the chain's header no longer has {old!r}")
        header = header.replace(old, new)
    real_tickets = cuda_tickets.tickets
    for mod in (cuda_chain, cuda_layer):
        mod.CHAIN_HEADER = header  # type: ignore[attr-defined]
        mod.tickets = lambda stages, _t=real_tickets: _t(stages, mark)  # type: ignore[attr-defined]
        mod.cuda_kernel = _stamping(mod.cuda_kernel)  # type: ignore[attr-defined]


def summary(st: np.ndarray, stages: int) -> dict[str, float]:
    """One launch's figures in microseconds from its blocks' stamps."""
    st = st.reshape(-1, SLOTS).astype(np.int64)
    t0 = st[:, 0].min()
    out: dict[str, float] = {
        "total": (st[:, 1].max() - t0) / 1e3,
        "start spread": (st[:, 0].max() - t0) / 1e3,
        "SMs": float(len(set(st[:, 28].tolist()))),
        "working blocks": float((st[:, 27] > 0).sum()),
    }
    last = 0
    for k in range(stages):
        got = st[:, 17 + k] > 0
        if not got.any():
            continue
        first, done = st[got, 17 + k].min(), st[got, 22 + k].max()
        waited = st[:, 2 + k] > 0
        out[f"s{k} starts"] = (first - t0) / 1e3
        out[f"s{k} span"] = (done - first) / 1e3
        out[f"s{k} wait (mean)"] = float(st[waited, 2 + k].mean()) / 1e3 if waited.any() else 0.0
        out[f"s{k} once (mean)"] = float(st[waited, 7 + k].mean()) / 1e3 if waited.any() else 0.0
        out[f"s{k} work/block"] = float(st[got, 12 + k].mean()) / 1e3
        out[f"s{k} blocks"] = float(got.sum())
        per_sm = np.bincount(st[got, 28])  # the stage's blocks an SM ran: the most, against the mean
        out[f"s{k} most/SM"] = float(per_sm.max())
        out[f"s{k} mean/SM"] = float(got.sum()) / out["SMs"]
        last = max(last, done)
    out["tail"] = (st[:, 1].max() - last) / 1e3
    return out


def cases(
    h: int, n: int, nq: int, context: int, sets: int
) -> tuple[dict[str, tuple[int, Callable[[int, int | None, mx.array], mx.array]]], mx.array]:
    """Each case: its stages, and ``f(set, blocks, x)`` launching it once over the row
    ``x`` (the last launch's output, or the returned first row), its output row."""
    from segc.lower import cuda_layer

    o, r, ws = mlp_inputs(h, n, nq, sets)
    layer, (kb, k, vb, v, off, mask) = layer_inputs(h, n, nq, context)
    m, m4 = _match(h, n), replace(layer, kind="chain", pair=None)

    def mlp(i: int, g: int | None, x: mx.array) -> mx.array:
        wo, wgu, nw, wd, _, _ = ws[i]
        return cuda_chain.chain(m, [x, wo, r, wgu, nw, wd], blocks=g)

    def mlp4(i: int, g: int | None, x: mx.array) -> mx.array:
        wo, wgu, nw, wd, wq, nw2 = ws[i]
        return cuda_chain.chain(m4, [x, wo, r, wgu, nw, wd, wq, nw2], blocks=g)[0]

    def one(i: int, g: int | None, x: mx.array) -> mx.array:
        wo, wgu, nw, wd, wq, nw2 = ws[i]
        q = x.reshape(1, HQ, 1, D)
        return cuda_layer.layer(layer, [kb, k, vb, v, off, q, mask, wo, r, wgu, nw, wd, wq, nw2], blocks=g)[2]

    return {"MLP chain": (3, mlp), "MLP chain + next": (4, mlp4), "layer kernel": (5, one)}, o


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--intermediate", type=int, default=8192)
    ap.add_argument("--next", type=int, default=3072)
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--blocks", default="1024,528,264,132", help="grids (0: the kernel's default)")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--sets", type=int, default=4, help="weight copies rotated over")
    ap.add_argument("--batch", type=int, default=6, help="launches an evaluation, one after another")
    ap.add_argument("--cases", default="MLP chain,MLP chain + next,layer kernel")
    ap.add_argument("--variant", default="base", choices=sorted(VARIANTS))
    args = ap.parse_args()
    if not CUDA:
        print("chain_stages: CUDA only (the stamps are the GPU's clock)")
        return
    install(args.variant)
    keep_states_resident()
    every, x0 = cases(args.hidden, args.intermediate, args.next, args.context, args.sets)
    print(
        f"segc chain_stages ({args.variant}): hidden {args.hidden}, intermediate {args.intermediate},"
        f" next {args.next}, us (medians)"
    )
    for name in args.cases.split(","):
        stages, f = every[name]
        for g in (int(b) for b in args.blocks.split(",")):
            runs = []
            for i in range(args.repeats + 1):
                # a batch of launches, each reading the one before's output (so that none
                # overlaps another), in one evaluation: the device busy throughout, as in
                # a step; the batch's first launch, after the host's gap, is left out
                LAST.clear()
                y = x0
                for j in range(args.batch):
                    y = f((i * args.batch + j) % args.sets, g or None, y).reshape(1, -1)
                mx.eval(y, LAST)
                if i >= 1:
                    runs += [summary(np.array(st), stages) for st in LAST[1:]]
            keys = list(dict.fromkeys(k for r in runs for k in r))
            med = {k: statistics.median(r.get(k, 0.0) for r in runs) for k in keys}
            print(f"\n{name}, grid {g or 'default'}: total {med['total']:.1f}")
            print(
                "  " + ", ".join(f"{k} {v:.1f}" for k, v in med.items() if not k.startswith("s") or k == "start spread")
            )
            for s in range(stages):
                row = [f"{k[3:]} {med[k]:.1f}" for k in keys if k.startswith(f"s{s} ")]
                if row:
                    print(f"  stage {s}: " + ", ".join(row))


if __name__ == "__main__":
    main()
