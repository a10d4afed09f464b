"""Exact cut placement by dynamic programming over the legal cut points.

- :func:`fewest_segments` (``memory:B``): the fewest segments whose working sets
  (``analysis.span_peak``) each stay within ``B``, ties broken by the smallest largest
  working set. A span's peak grows as its end moves later but not as its start moves
  earlier (an earlier start turns inputs read from outside into values made inside),
  so a greedy that extends each segment as far as it fits is not optimal; the DP over
  (start point, end point) pairs is. For a fixed start the peaks are computed in one
  sweep, stopped at the first end over budget (monotone in the end).
- :class:`Optimal` (``optimal[:B]``): the plan of least predicted time
  (``costmodel.predict_time``, a commit after every segment: the policy ``"segment"``)
  under an optional working-set budget. The pipeline's
  end ``D_k = max(max(D_{k-1}, H_{k-1} + p_k, D_{k-1} - q_k + p_k) + d_k, H_k)`` depends
  on the host's time ``H_k``, which depends only on the number of segments so far and
  the point reached, and grows with ``D_{k-1}``; the queue ``q_k`` depends only on the
  point segment ``k`` starts at (``overlap.queue_lead``); so the DP runs over (segments so far,
  point), with numpy over the previous point. At most
  ``max_segments`` segments (64 unless told). A segment past the machine's command-buffer
  size (``buffer_kernels``) is costed whole here, where ``predict_time`` costs the parts
  MLX commits it in: the two agree for every segment within that size.
  ``optimal:markers`` (``Optimal(markers=True)``) cuts only where the traced markers
  are (``segc.boundary``, ``boundaries=``), each legalised as ``make_plan`` would: the
  least predicted time over layer-aligned plans: where the model errs on cuts inside a
  layer, its optimum over every legal point is where the error is most in its favour
  (docs/experiments-log.md, "Offline: what `optimal` cut").
  On a model that saves host time on a repeated segment (``repeat_s``, ``repeat_op_s``)
  the DP's plan is a start, not the optimum: ``repeat_search.py``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from itertools import pairwise

from ..errors import ScheduleError
from ..ir import Eqn, Graph
from .analysis import Liveness, liveness, ops
from .costmodel import MachineModel, default_model, op_costs
from .legalize import legal_points, legalize_plan
from .overlap import queue_lead
from .plan import Plan, plan_at, plan_of
from .repeat_search import saves_on_repeats, search


def span_peaks(lv: Liveness, os_: Sequence[Eqn], a: int, ends: Sequence[int], budget: float) -> dict[int, int]:
    """``{b: span_peak(a, b)}`` for the ``ends`` after ``a`` (ascending), up to the first
    over ``budget``; one sweep over ``os_[a:]``."""
    want = sorted(b for b in ends if b > a)
    out: dict[int, int] = {}
    if not want:
        return out
    seen: set[str] = set()
    outside = cur = peak = 0
    wi = 0
    frees: dict[int, int] = {}
    for k in range(a, want[-1]):
        for v in os_[k].ins:
            r = lv.root[v]
            if r not in seen and lv.defined.get(r, -1) < a:
                seen.add(r)
                outside += lv.nbytes[r]
        for o in os_[k].outs:
            if lv.defined.get(o.name) == k:
                cur += lv.nbytes[o.name]
                frees[lv.last_use[o.name]] = frees.get(lv.last_use[o.name], 0) + lv.nbytes[o.name]
        peak = max(peak, cur)
        cur -= frees.pop(k, 0)
        if k + 1 == want[wi]:
            if outside + peak > budget:
                break
            out[k + 1] = outside + peak
            wi += 1
    return out


def fewest_segments(g: Graph, budget: int) -> list[int]:
    """Cut points of the fewest segments each within ``budget`` bytes of working set."""
    os_ = ops(g)
    n = len(os_)
    lv = liveness(g)
    pts = [0, *legal_points(g), n]
    best: dict[int, tuple[int, int]] = {0: (0, 0)}
    back: dict[int, int] = {}
    for a in pts[:-1]:
        if a not in best:
            continue
        cnt, worst = best[a]
        for b, peak in span_peaks(lv, os_, a, pts, budget).items():
            cand = (cnt + 1, max(worst, peak))
            if b not in best or cand < best[b]:
                best[b], back[b] = cand, a
    if n not in best:
        first = next((b for b in pts[1:] if b not in best), n)
        prev = max(p for p in best if p < first)
        need = span_peaks(lv, os_, prev, [first], float("inf")).get(first, 0)
        raise ScheduleError(
            f"memory({budget}): no plan keeps every segment within {budget} B; equations "
            f"#{os_[prev].id}..#{os_[first - 1].id} cannot be cut (a fused chain or one equation) and need {need} B"
        )
    cuts, b = [], n
    while b > 0:
        b = back[b]
        if b > 0:
            cuts.append(b)
    return sorted(cuts)


@dataclass(frozen=True)
class Optimal:
    """The least predicted time (``costmodel``) under a working-set budget (or none)."""

    budget: int | None = None
    model: MachineModel | None = None
    max_segments: int = 64
    info: dict = field(default_factory=dict, compare=False)
    markers: bool = False  # cut only at the markers (legalised), not at every legal point

    def __call__(self, g: Graph) -> Plan:
        import numpy as np

        m = self.model or default_model()
        os_ = ops(g)
        n = len(os_)
        if n == 0:
            return plan_at(g, "optimal", [])
        oc = op_costs(g, m)
        lv = oc.lv
        pts = np.array([0, *(self._markers(g, os_) if self.markers else legal_points(g)), n])
        q = len(pts)
        idx = {int(p): i for i, p in enumerate(pts)}
        dev = np.concatenate([[0.0], np.cumsum(np.array(oc.device) + m.launch_s * np.array(oc.kernels))])
        # in_bytes[i, j]: activations made before pts[i] and read in [pts[i], pts[j])
        rect = np.zeros((q + 1, q + 1))
        readers: dict[str, list[int]] = {}
        for k, e in enumerate(os_):
            for v in dict.fromkeys(lv.root[x] for x in e.ins):
                if v in lv.defined:
                    readers.setdefault(v, []).append(k)
        for v, rs in readers.items():
            lo = lv.defined[v]
            for t in rs:  # starts a in (lo, t] read v first at t; counted for ends b > t
                i0 = int(np.searchsorted(pts, lo, side="right"))
                i1 = int(np.searchsorted(pts, t, side="right"))
                j0 = int(np.searchsorted(pts, t, side="right"))
                if i0 < i1:
                    rect[i0, j0] += lv.nbytes[v]
                    rect[i1, j0] -= lv.nbytes[v]
                lo = t
        in_b = np.cumsum(np.cumsum(rect, axis=0), axis=1)[:q, :q]
        kp = np.concatenate([[0.0], np.cumsum(np.array(oc.kernels, dtype=float))])[pts]  # kernels before each point
        # the same as the host pays for them (an elementwise kernel: m.elementwise_host of one)
        weight = [n * (m.elementwise_host if f else 1.0) for n, f in zip(oc.kernels, oc.light)]
        kh = np.concatenate([[0.0], np.cumsum(np.array(weight, dtype=float))])[pts]
        # a segment's device span, with the size term (costmodel: per kernel squared of the segment)
        d = dev[pts][None, :] - dev[pts][:, None] + in_b / m.bytes_per_s
        d = d + m.segment_sq_s * (kp[None, :] - kp[:, None]) ** 2 + m.segment_device_s
        ok = pts[None, :] > pts[:, None]
        if self.budget is not None:
            feas = np.zeros((q, q), dtype=bool)
            for i, a in enumerate(pts[:-1]):
                for b in span_peaks(lv, os_, int(a), [int(p) for p in pts], self.budget):
                    feas[i, idx[b]] = True
            ok &= feas
        d = np.where(ok, d, np.inf)
        pre_at = m.encode_s * kp[:, None] + m.host_op_s * kh[None, :]  # host work before segment (i, j) starts
        end_at = m.host_op_s * kh + m.encode_s * kp
        inf = np.full(q, np.inf)
        seg_s = m.dispatch_s + m.commit_s  # per segment: a commit after each (the policy "segment")
        D = [np.where(pts == 0, 0.0, np.inf)]
        arg: list[np.ndarray] = [np.zeros(q, dtype=int)]
        best_s, best_t = -1, np.inf
        # the host prepares segment (i, j) (dispatch, commit, its kernels) no earlier than the
        # queue before point i (the device time of its last queue_kernels kernels) before the
        # device is done with the segments before it (overlap.pipeline_time); none for i = 0
        qw, qn = (np.array(x) for x in queue_lead(oc.device, oc.kernels, m.queue_kernels))
        lead = np.where(pts == 0, 1e30, qw[pts] + m.launch_s * qn[pts])  # finite: inf - inf is nan
        own = seg_s + m.host_op_s * (kh[None, :] - kh[:, None]) - lead[:, None]
        for s in range(1, max(1, self.max_segments) + 1):
            start = np.maximum(D[-1][:, None], s * seg_s + pre_at)
            if m.queue_kernels > 0:  # 0: unbounded
                start = np.maximum(start, D[-1][:, None] + own)
            cand = np.maximum(start + d, (s * seg_s + end_at)[None, :])
            a = np.argmin(cand, axis=0)
            row = cand[a, np.arange(q)]
            D.append(np.where(np.isfinite(row), row, inf))
            arg.append(a)
            if D[-1][-1] < best_t:
                best_s, best_t = s, float(D[-1][-1])
            if not np.isfinite(D[-1]).any():
                break
        if best_s < 0:
            raise ScheduleError(
                f"optimal({self.budget}): no plan of at most {self.max_segments} segments keeps every segment "
                f"within {self.budget} B"
            )
        cuts, j = [], q - 1
        for s in range(best_s, 0, -1):
            j = int(arg[s][j])
            if j > 0:
                cuts.append(int(pts[j]))
        name = "optimal" + "".join(f"({x})" for x in ("markers" if self.markers else None, self.budget) if x)
        info: dict = {"predicted_s": best_t, "machine": m.name}
        if saves_on_repeats(m):  # the DP cannot see which segments repeat: repeat_search.py
            inner = [int(p) for p in pts[1:-1]]
            marks = inner if self.markers else self._markers_if_any(g, os_)

            def feasible(points: Sequence[int]) -> bool:
                ends = [0, *points, n]
                return self.budget is None or all(
                    b in span_peaks(lv, os_, a, [b], self.budget) for a, b in pairwise(ends)
                )

            extra = []
            if marks and not self.markers:  # never above optimal:markers: its plan one more start
                at = {e.id: k + 1 for k, e in enumerate(os_)}
                with contextlib.suppress(ScheduleError):  # none where no plan at the markers keeps the budget
                    extra = [("optimal:markers", [at[c.after] for c in replace(self, markers=True)(g).cuts])]
            cuts, found_s, how = search(g, m, sorted(cuts), marks, inner, feasible, extra, oc)
            info = {"predicted_s": found_s, "machine": m.name, "dp_s": best_t, "found_by": how}
        return plan_at(g, name, sorted(cuts), info=info)

    @classmethod
    def _markers_if_any(cls, g: Graph, os_: Sequence[Eqn]) -> list[int]:
        try:
            return cls._markers(g, os_)
        except ScheduleError:  # no markers, or none legal: the search moves the DP's cuts alone
            return []

    @staticmethod
    def _markers(g: Graph, os_: Sequence[Eqn]) -> list[int]:
        """The points (op indices) of ``g``'s markers, legalised as ``make_plan`` does."""
        asked = plan_of(g, "markers")
        plan = legalize_plan(g, asked)
        if not plan.cuts and asked.cuts:
            why = "; ".join(f"#{m.requested}: {m.reason}" for m in plan.moved)
            raise ScheduleError(
                f"optimal:markers: {g.name} has {len(asked.cuts)} marker(s), but legalisation dropped every one "
                f"({why}): none is a legal cut point"
            )
        if not plan.cuts:
            raise ScheduleError(f"optimal:markers: {g.name} has no markers (segc.boundary or boundaries=) to cut at")
        pos = {e.id: k for k, e in enumerate(os_)}
        return sorted(pos[c.after] + 1 for c in plan.cuts)
