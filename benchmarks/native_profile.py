"""A cached decode step in a loop, for a native sampling profiler (issue 13): the
reference llama at ``--context``, one ``--variant`` (``eager`` mlx-lm, ``compile``
(``mx.compile`` with the caches as inputs), segc's defaults ``segc``, ``frozen``: a
segment per layer, ``concat_projections``, ``freeze_params``, or ``frozenhead``: the
same with the output head in the last layer's segment, ``frozen2`` / ``frozen4``: that
with a segment per two / four layers, ``wholefrozen``: one segment, concatenated and
frozen; ``SEGC_KV_IN_PLACE=1`` in the environment writes the caches in place), built and
warmed up, then
called back to back for ``--seconds``, each call waited for as a decode loop does.

With ``--ctl``/``--ack`` (the FIFOs of ``perf record --control fifo:CTL,ACK -D -1``)
only the timed loop is sampled: the model's set-up, tracing and MLX's kernel
compilation are not. Prints the calls made and their median wall and host time (until
the call returns). ``gpu_decode.sh perf`` runs it under ``perf`` for each variant.

    python benchmarks/native_profile.py --variant frozen [--seconds 5] [--ctl F --ack G]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import mlx.core as mx

import segc

VARIANTS = ("eager", "compile", "segc", "frozen", "frozenhead", "frozen2", "frozen4", "wholefrozen")


def step_of(variant: str, model: Any, fc: Any, x: mx.array) -> Callable[[], Any]:
    from bench_llama import compiled_with_cache  # this directory is on sys.path when run as a script

    if variant == "eager":
        return lambda: model(x, cache=fc.reset())
    if variant == "compile":
        call = compiled_with_cache(model, fc)
        return lambda: call(x)
    from bench_llama import boundaries_of

    frozen = variant.startswith(("frozen", "wholefrozen"))
    step = segc.jit(
        model, boundaries=boundaries_of(variant, model), validate=False, concat_projections=frozen, freeze_params=frozen
    )
    return lambda: step(x, cache=fc.reset())


def perf_control(ctl: str | None, ack: str | None, what: str) -> None:
    """Tell ``perf record`` to ``enable`` or ``disable`` its events, and wait for its ack."""
    if not ctl:
        return
    with open(ctl, "w") as f:
        f.write(what + "\n")
    if ack:
        with open(ack) as f:
            f.readline()


def main() -> None:
    from bench_llama import FixedContext, make_model

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variant", choices=VARIANTS, default="frozen")
    ap.add_argument("--preset", default="reference", help="bench_llama.py's model preset")
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--ctl", default=None, help="perf's control FIFO")
    ap.add_argument("--ack", default=None, help="perf's acknowledgement FIFO")
    a = ap.parse_args()
    print(f"pid {os.getpid()}", flush=True)  # the main thread's id: the profile's report reads it
    model = make_model(a.preset)
    fc = FixedContext(model, a.context)
    x = mx.array([[7]])
    f = step_of(a.variant, model, fc, x)
    for _ in range(a.warmup):
        mx.eval(f(), fc.arrays())
    host, wall = [], []
    perf_control(a.ctl, a.ack, "enable")
    end = time.perf_counter() + a.seconds
    while time.perf_counter() < end:
        t0 = time.perf_counter()
        y = f()
        t1 = time.perf_counter()
        mx.eval(y, fc.arrays())
        wall.append(time.perf_counter() - t0)
        host.append(t1 - t0)
    perf_control(a.ctl, a.ack, "disable")
    print(
        f"{a.variant}: {len(wall)} calls in {a.seconds:.1f} s, median wall "
        f"{statistics.median(wall) * 1e3:.3f} ms, host until return {statistics.median(host) * 1e3:.3f} ms"
    )


if __name__ == "__main__":
    main()
