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
        return dtypes.to_bytes(a) == dtypes.to_bytes(b)
    return bool(mx.allclose(a, b, rtol=VALIDATE_TOL, atol=VALIDATE_TOL, equal_nan=True).item())


def disagreement(out: Any, ref: Any, state: Sequence[list], eager_state: Sequence[list]) -> str | None:
    """Why segc's outputs and caches differ from eager's, or None."""
    got, _, _ = flatten(out, what="output")
    want, _, _ = flatten(ref, what="output")
    if len(got) != len(want) or not all(_close(a, b) for a, b in zip(got, want)):
        return "outputs differ"
    for k, (a, b) in enumerate(zip(state, eager_state)):
        if len(a) != len(b) or not all(_close(x, y) for x, y in zip(a, b)):
            return f"state[{k}] differs"
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
