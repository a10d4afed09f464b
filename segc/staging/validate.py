"""Checking a call against eager MLX: the first call of every graph with dynamic KV
caches is also run eagerly on copies of the caches, and the two compared.

A dynamic cache hands the model its whole buffer, masked; model code that derives
positions from the fetched keys' length (phi3small's block-sparse attention) then
computes something else. Outputs and caches are compared bit for bit on the CPU and
within :data:`VALIDATE_TOL` elsewhere (where a masked attention kernel rounds
differently, docs/models.md).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import mlx.core as mx

from .. import dtypes
from ..trace import snapshots
from ..trace.pytree import flatten

# off the CPU: |segc - eager| <= tol * (1 + |eager|), as the GPU zoo test allows. Not scaled up
# for bfloat16: a bound that accepts the GPU's rounding there accepts a wrong position too
# (benchmarks/validate_bound.py, docs/models.md)
VALIDATE_TOL = 1e-2


def _close(a: Any, b: Any) -> bool:
    if not isinstance(a, mx.array) or not isinstance(b, mx.array):
        return bool(a == b)
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if mx.default_device() == mx.cpu:  # raw bytes: -0.0 and NaN payloads count
        return dtypes.same_bytes(a, b)
    return bool(mx.allclose(a, b, rtol=VALIDATE_TOL, atol=VALIDATE_TOL, equal_nan=True).item())


def _by_how_much(a: Any, b: Any) -> str:
    """How far ``a`` is from ``b`` where both are floating arrays of one shape (so that a
    reader can tell a rounding from a wrong result), else nothing."""
    ok = isinstance(a, mx.array) and isinstance(b, mx.array) and a.shape == b.shape and a.size > 0
    if not ok or not (mx.issubdtype(a.dtype, mx.floating) and mx.issubdtype(b.dtype, mx.floating)):
        return ""
    d = mx.abs(a.astype(mx.float32) - b.astype(mx.float32)).max().item()
    top = mx.abs(b.astype(mx.float32)).max().item()
    return f": max |segc - eager| {d:.3g}, eager's largest |value| {top:.3g}"


def disagreement(out: Any, ref: Any, state: Sequence[list], eager_state: Sequence[list]) -> str | None:
    """Why segc's outputs and caches differ from eager's, or None."""
    got, _, _ = flatten(out, what="output")
    want, _, _ = flatten(ref, what="output")
    if len(got) != len(want):
        return "outputs differ"
    for i, (a, b) in enumerate(zip(got, want)):
        if not _close(a, b):
            return f"outputs differ (output {i}{_by_how_much(a, b)})"
    for k, (mine, theirs) in enumerate(zip(state, eager_state)):
        if len(mine) != len(theirs):
            return f"state[{k}] differs"
        for x, y in zip(mine, theirs):
            if not _close(x, y):
                return f"state[{k}] differs{_by_how_much(x, y)}"
    return None


def check_against_eager(
    eager: Callable[[], Any], segmented: Callable[[], Any], objs: list[Any]
) -> tuple[Any, str | None]:
    """Run ``eager()`` on fresh copies of the state objects ``objs`` (rolled back after),
    then ``segmented()`` on the objects themselves. Returns the segmented result and why
    it disagrees with eager (None if it agrees); on a disagreement ``objs`` are rolled
    back to what they were before."""
    saved = [snapshots.snapshot(o) for o in objs]
    for o in objs:  # the eager reference mutates fresh arrays, also of captured caches
        snapshots.roll_back(o, snapshots.fresh_attrs(o))
    try:
        ref = eager()
        eager_state = [snapshots.observable(o) for o in objs]
    finally:
        for o, snap in zip(objs, saved):
            snapshots.roll_back(o, snap)
    out = segmented()
    why = disagreement(out, ref, [snapshots.observable(o) for o in objs], eager_state)
    if why is not None:
        for o, snap in zip(objs, saved):
            snapshots.roll_back(o, snap)
    return out, why
