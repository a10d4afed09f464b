"""A cost model that predicts a segmented run's time from the graph (its memory: ``memory.py``).

**Time.** The executor dispatches segments from the host one after another
(``mx.async_eval``) while the device runs the ones already dispatched, so a run is a
two-stage pipeline. Segment ``k`` costs the host ``h_k = p_k + encode * kernels_k``, of
which ``p_k = dispatch + host_op * kernels_k`` (the compiled call, replaying its tape)
comes before the device can start the segment, and the rest (encoding and launching
each kernel, on a GPU) runs while the device works on its first kernels; and the
device
``d_k = sum of fused roofline costs + launch * kernels_k + in_k / B + loss_k
+ segment_sq * kernels_k ** 2 + segment_device``:

- *fused roofline*: each equation's ``max(flops / F, bytes / B)``, with the bytes
  inside a fused chain (``legalize.fusion_groups``) not counted: a value made and read
  inside one chain never reaches memory;
- *launch*: a kernel per computing equation that is not a view, a fused chain one (with
  ``fused_products``, segc's CUDA product kernels are chains too: ``product_groups.py``),
  an integer range the lowering makes from host data none (``shapes.host_range``);
- *boundary traffic*: ``in_k``, the bytes of activations the segment reads from earlier
  segments (each segment reads its inputs afresh);
- *fusion loss*: a cut inside a fused chain (an unlegalised plan) splits it; the values
  crossing it are written and read back (``2 * bytes / B``) and the chain costs a
  second launch;
- *size*: ``segment_sq`` per kernel squared, for a segment whose cost grows faster than
  its kernels. One H200 process measured one compiled segment of a whole decode step at
  2.1x the host time of the same kernels cut per layer (``benchmarks/decode_ablation.py``);
  three processes of the experiment harness did not reproduce it (docs/experiments.md).
  So the term is 0 in the built-in models and left to calibration (``fit.py`` fits it),
  charged to the segment's span so that ``optimal`` stays an exact dynamic program;
- *per segment*: ``segment_device`` (``segment_device_s``), the device's time to start and
  drain a command buffer beyond its kernels' launches, paid by each command buffer (a
  segment's parts each). 0 in the built-in models; the experiment's calibration fits it
  on a GPU (``fit.py``): fitted at 37-41 us on three of four fresh GPU runs, where it
  ranked decode's plans better (0.50-0.62 to 0.81-0.88), and at 0 on the fourth; on
  two CPU runs at 46-52 us, where it ranked them worse (docs/experiments-log.md, the
  twenty-third and twenty-fourth runs).

*Repeats*: a segment whose equations (primitive, output shapes and types, in order) an
earlier segment of the call already had costs the host ``repeat_s`` less, and
``repeat_op_s`` per equation of it, before the device may start it. On the H200,
prefill plans whose segments repeat a layer's ran faster than the model without the
term predicted, plans cut inside layers slower (docs/experiments-log.md, "The
eighteenth run"), and the saving grows with the repeated segment: fitted per equation,
it ranks the stored runs' prefill plans better than per segment ("Offline: the repeat
saving per equation"). Both 0 in the built-in models; calibration fits
``repeat_op_s`` (``fit.py``). Whether a span repeats depends on the plan's other
segments, which the dynamic program's span costs cannot see: with the saving,
``optimal`` searches whole plans from the program's (``repeat_search.py``).

The device starts segment ``k`` when the host is ``p_k`` into it and segment ``k - 1``
is done: ``H_k = H_{k-1} + h_k``, ``D_k = max(max(D_{k-1}, H_{k-1} + p_k) + d_k, H_k)``
(``encode = 0``: ``max(D_{k-1}, H_k) + d_k``); the prediction is ``D_last``.

*Queue*: MLX's CPU build lets the host run only a bounded number of kernels ahead of
the device: its eval loop waits while more than 10 scheduler tasks are outstanding,
and the CPU encoder makes a task of every 10th dispatch, a primitive dispatching its
kernel and a closure holding its buffers (``mlx/transforms.cpp``,
``mlx/backend/cpu/encoder.h``): some 50 primitives (``benchmarks/cpu_queue.py``
measures 42-65). With ``queue_kernels = Q > 0`` (0: unbounded, the GPU default) the
host, throttled, is done with segment ``k - 1`` no earlier than the device's last ``Q``
kernels before the cut (in program order, whichever segments they lie in) are left:
``q_k``, their device time (``queue_lead``: their fused roofline and launches, the
plan's boundary traffic left out), so it starts preparing segment ``k`` no earlier than
``D_{k-1} - q_k`` and the device starts it at
``max(D_{k-1}, H_{k-1} + p_k, D_{k-1} - q_k + p_k)``: a segment whose preparation
``p_k`` exceeds the queue before it stalls the device by ``p_k - q_k``, wherever it
lies in the plan; a cut after a run of cheap kernels (a short queue) stalls more than
one after matrix products. So a plan pays for its largest segments, not only its
first. (The host's end, ``max(H_k, D_k - q_{k+1})``, is carried as ``H_k`` and the
bound applied at the next segment: the same when ``encode = 0``, the CPU's.) More segments start the device earlier (less of the host's work is ahead of
it) and cost ``dispatch + launch`` each: the trade-off a plan makes.

That is the pipeline when every segment is committed (the commit policy ``"segment"``,
the CPU's). Under another policy (``commits.py``) a segment's work waits on the host
until the next commit, and each commit costs the host ``commit`` more (on MLX's CUDA
build, building and launching a CUDA graph): for a segment ``c`` that commits,
``R = H_{c-1} + p_c + commit`` is when the device may start every segment since the
last commit, ``H_c = H_{c-1} + h_c + commit``, and
``D_c = max(max(D_prev, R) + (d of those segments), H_c)``; the call's ``mx.eval``
commits the last segment. ``predict_time(g, m, commit=...)`` takes the policy; a plan
of more segments then pays for the commits the policy makes after them.

**Memory**: ``memory.py`` (``predict_memory``).

Machine models (:class:`MachineModel`) are JSON; ``segc calibrate`` measures one
(``segc.research.calibrate``). The defaults are rough: ``CPU`` for MLX's CPU build on a
small machine, ``H200`` for the GPU in bf16.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from ..ir import Eqn, Graph
from ..lower.live import live_commits
from ..lower.prim import lookup
from ..lower.shapes import host_range
from .analysis import Liveness, eqn_bytes, eqn_flops, is_view, liveness, ops
from .buffers import command_buffers as command_buffers
from .buffers import live_closes, op_spans, span_buffers
from .commits import commit_count, commit_flags
from .legalize import fusion_groups
from .machine import CPU as CPU
from .machine import H200 as H200
from .machine import MachineModel as MachineModel
from .machine import default_model as default_model
from .machine import with_source as with_source
from .overlap import pipeline_time, queue_lead
from .product_groups import with_products

# --------------------------------------------------------------------------- per-op figures


@dataclass(frozen=True, slots=True)
class OpCosts:
    """Per computing equation (``analysis.ops`` order): fused device seconds (launches
    left out), kernels started (0 for a view and inside a chain but its first), the
    fusion group it belongs to (-1 for none), and the graph's liveness."""

    device: tuple[float, ...]
    kernels: tuple[int, ...]
    group: tuple[int, ...]
    lv: Liveness
    internal: dict[str, int]  # value -> group, for values made and read only inside one chain
    light: tuple[bool, ...] = ()  # per equation: the kernel it starts is elementwise only (a fused chain of them)
    live: tuple[int, ...] = ()  # the positions ending a live attention (the runtime may commit after one)


def op_costs(g: Graph, m: MachineModel) -> OpCosts:
    os_ = ops(g)
    vs = g.vars()
    lv = liveness(g)
    ends: list[int] = []
    groups = with_products(g, os_, fusion_groups(g), lv, ends) if m.fused_products else fusion_groups(g)
    group = [-1] * len(os_)
    for gi, grp in enumerate(groups):
        for k in grp:
            group[k] = gi
    readers: dict[str, set[int]] = {}
    for k, e in enumerate(os_):
        for v in e.ins:
            readers.setdefault(lv.root[v], set()).add(k)
    outs = {lv.root[v] for v in g.outputs}
    internal: dict[str, int] = {}
    for k, e in enumerate(os_):
        if group[k] < 0:
            continue
        for o in e.outs:
            rs = readers.get(o.name, set())
            if rs and o.name not in outs and all(group[r] == group[k] for r in rs):
                internal[o.name] = group[k]
    device, kernels = [], []
    plain = [True] * len(groups)  # per group: elementwise equations only
    for k, e in enumerate(os_):
        if group[k] >= 0 and not lookup(e.prim).fusible:
            plain[group[k]] = False
    light = [plain[group[k]] if group[k] >= 0 else lookup(e.prim).fusible for k, e in enumerate(os_)]
    seen: set[int] = set()
    read_in: dict[int, set[str]] = {}  # per chain: the buffers it has read already

    def cost(v: str) -> int:
        r = lv.root[v]
        return min(vs[v].nbytes, lv.nbytes[r] if r in lv.defined or r not in lv.consts else vs[r].nbytes)

    for k, e in enumerate(os_):
        r, w = eqn_bytes(e, vs, lv)
        if group[k] >= 0:  # bytes that stay inside the chain are not moved; a chain reads each input once
            done = read_in.setdefault(group[k], set())
            ins = list(dict.fromkeys(e.ins))
            r -= sum(cost(v) for v in ins if v in internal or lv.root[v] in done)
            done.update(lv.root[v] for v in ins)
            w -= sum(lv.nbytes[o.name] for o in e.outs if o.name in internal)
        host = host_range(e) is not None  # an integer range the lowering makes from host data
        device.append(0.0 if host else max(eqn_flops(e, vs) / m.flops_per_s, max(r + w, 0) / m.bytes_per_s))
        first = group[k] < 0 or group[k] not in seen
        seen.add(group[k])
        aliased = bool(e.outs) and is_view(e) and lv.root[e.outs[0].name] != e.outs[0].name
        kernels.append(0 if aliased or not first or host else 1)
    return OpCosts(tuple(device), tuple(kernels), tuple(group), lv, internal, tuple(light), tuple(ends))


# --------------------------------------------------------------------------- time


@dataclass(frozen=True, slots=True)
class SegmentTime:
    name: str
    ops: int
    host: float
    device: float
    boundary: float  # of device: reading activations from earlier segments
    fusion_loss: float  # of device: chains split by a cut
    kernels: int = 0  # kernels launched (a split chain's second launch included)
    work: float = 0.0  # of device: all but the launches
    pre: float = 0.0  # of host: before the device may start the segment
    commit: bool = True  # the dispatch loop commits right after it (the last segment: the caller's mx.eval)
    queue: float = 0.0  # device seconds of the queue before it (queue_lead): work plus launches
    queue_work: float = 0.0  # of queue: all but the launches
    queue_n: float = 0.0  # of queue: the kernels in it
    light: int = 0  # of kernels: those of elementwise equations only (elementwise_host of host_op_s each)
    part: int = 0  # a segment past a GPU's command-buffer size comes in parts (``_buffers``): which one
    repeat: bool = False  # an earlier segment of the call had the same equations (``repeat_s``, ``repeat_op_s``)

    def retimed(self, m: MachineModel) -> SegmentTime:
        """The same segment with ``m``'s per-kernel and per-segment figures (its
        bandwidth and FLOP rate kept): what calibration fits."""
        pre = (m.dispatch_s if self.part == 0 else 0.0) + m.host_op_s * host_kernels(self, m.elementwise_host)
        if self.repeat and self.part == 0:
            pre = max(pre - m.repeat_s - m.repeat_op_s * self.ops, 0.0)
        host = pre + m.encode_s * self.kernels
        dev = self.work + m.launch_s * self.kernels + m.segment_sq_s * self.kernels**2 + m.segment_device_s
        return replace(self, host=host, device=dev, pre=pre, queue=self.queue_work + m.launch_s * self.queue_n)


@dataclass(frozen=True, slots=True)
class TimePrediction:
    total: float  # seconds: the pipeline's end
    host: float  # seconds: all the host's dispatch, commits included
    device: float  # seconds: all the device's work
    segments: tuple[SegmentTime, ...]
    commits: int = 0  # commits in one call (commits.commit_count)


def span_in_bytes(lv: Liveness, os_: Sequence[Eqn], a: int, b: int) -> int:
    """Bytes of activations made before op ``a`` that ops ``[a, b)`` read."""
    seen = {lv.root[v] for e in os_[a:b] for v in e.ins}
    return sum(lv.nbytes[r] for r in seen if lv.defined.get(r, a) < a)


def predict_time(g: Graph, m: MachineModel | None = None, commit: str = "segment") -> TimePrediction:
    """The predicted wall time of one call of ``g`` cut as it is, its segments
    committed as the runtime's ``commit`` policy does (``commits.py``; ``"auto"`` is
    ``"segment"`` on either device, and on a GPU also a commit after the live attentions
    ``lower.live_commits`` names inside a segment: ``buffers.live_closes``). The default, a commit per
    segment, is the pipeline that the ``optimal`` strategy minimises."""
    m = m or default_model()
    os_ = ops(g)
    oc = op_costs(g, m)
    groups = live_commits() if commit == "auto" and m.device == "gpu" else ()  # as the executor does
    return timed(segment_times(os_, oc, op_spans(g), commit_flags(g, commit, m.device), m, live_groups=groups), m)


def segment_times(
    os_: Sequence[Eqn],
    oc: OpCosts,
    spans: Sequence[tuple[str, int, int]],
    flags: Sequence[bool],
    m: MachineModel,
    in_bytes: Callable[[int, int], int] | None = None,
    live_groups: Sequence[int] = (),
) -> list[SegmentTime]:
    """Each segment, ``(name, a, b)``: ops ``[a, b)`` of ``os_`` (``analysis.ops``),
    costed as ``predict_time`` does, split into MLX's command buffers and, with the
    schedule ``live_groups`` (``lower.live_commits``), after the live attentions inside it
    that it names (``OpCosts.live``: the runtime's commits there); ``flags`` its commits; ``in_bytes(a, b)``, the
    activations it reads from before ``a`` (default: counted here; ``repeat_search``
    passes a cache)."""
    in_bytes = in_bytes or (lambda a, b: span_in_bytes(oc.lv, os_, a, b))
    qw, qn = queue_lead(oc.device, oc.kernels, m.queue_kernels)
    closes = live_closes(oc.live, spans, live_groups)
    most = m.buffer_kernels if m.buffer_kernels > 0 else math.inf  # (0: no size limit, commits alone)
    ends = span_buffers(oc.kernels, most, spans, flags, closes)[1] if m.buffer_kernels > 0 or closes else []
    segs: list[SegmentTime] = []
    seen: set[tuple] = set()
    for (name, a, b), flag in zip(spans, flags):
        sig = tuple(eqn_signature(e) for e in os_[a:b])
        repeat = sig in seen
        seen.add(sig)
        in_b = in_bytes(a, b)
        loss, split = 0.0, 0
        if a > 0 and 0 <= oc.group[a] == oc.group[a - 1]:  # a cut inside a fused chain
            split = sum(
                oc.lv.nbytes.get(v, 0) for v, gi in oc.internal.items() if gi == oc.group[a] and oc.lv.defined[v] < a
            )
            loss = 2 * split / m.bytes_per_s + m.launch_s
        kern = sum(oc.kernels[a:b]) + (loss > 0)
        work = sum(oc.device[a:b]) + in_b / m.bytes_per_s + (2 * split / m.bytes_per_s if loss else 0.0)
        seg = SegmentTime(
            name,
            b - a,
            0.0,
            0.0,
            in_b / m.bytes_per_s,
            loss,
            kern,
            work,
            commit=flag,
            queue_work=qw[a],
            queue_n=qn[a],
            light=_light(oc, a, b),
            repeat=repeat,
        )
        segs += _buffers(seg, oc, a, b, ends, m)
    return segs


def eqn_signature(e: Eqn) -> tuple:
    """One equation as a repeat compares it: its primitive, output shapes and types (a
    segment repeats an earlier one with the same equations' signatures, in order)."""
    return (e.prim, tuple((o.shape, o.dtype) for o in e.outs))


def host_kernels(s: SegmentTime, elementwise: float) -> float:
    """The segment's kernels as the host pays for them: an elementwise kernel counts
    ``elementwise`` (``MachineModel.elementwise_host``)."""
    return s.kernels - (1.0 - elementwise) * s.light


def _light(oc: OpCosts, a: int, b: int) -> int:
    """Of ops ``[a, b)``'s kernels, those of elementwise equations only."""
    return sum(n for n, f in zip(oc.kernels[a:b], oc.light[a:b]) if f)


def _buffers(seg: SegmentTime, oc: OpCosts, a: int, b: int, ends: Sequence[int], m: MachineModel) -> list[SegmentTime]:
    """The segment (ops ``[a, b)``) as the command buffers MLX's CUDA build commits it
    in (``ends``: ``command_buffers``' per op; none: one part), each a committed part of
    the pipeline; the segment's own extra work (boundary reads, a split chain) goes with
    the first part."""
    cuts = [k + 1 for k in range(a, b - 1) if ends and ends[k] == k]
    if not cuts:
        return [seg.retimed(m)]
    parts = list(zip([a, *cuts], [*cuts, b]))
    out = []
    for j, (x, y) in enumerate(parts):
        kern = sum(oc.kernels[x:y])
        work = sum(oc.device[x:y])
        if j == 0:
            kern += seg.kernels - sum(oc.kernels[a:b])
            work += seg.work - sum(oc.device[a:b])
        last = j == len(parts) - 1
        out.append(
            replace(
                seg,
                name=seg.name if j == 0 else f"{seg.name}/{j}",
                ops=y - x,
                kernels=kern,
                light=_light(oc, x, y),
                work=work,
                commit=seg.commit if last else True,
                part=j,
            ).retimed(m)
        )
    return out


def timed(segs: Sequence[SegmentTime], m: MachineModel) -> TimePrediction:
    """The prediction for segments already costed (``SegmentTime``), their commits as
    flagged, with ``m``'s per-commit cost."""
    flags = [s.commit for s in segs]
    total = pipeline_time(
        [s.host for s in segs],
        [s.device for s in segs],
        [s.pre for s in segs],
        flags,
        m.commit_s,
        max,
        [s.queue for s in segs] if m.queue_kernels > 0 else None,
    )
    n = commit_count(tuple(flags))
    host = sum(s.host for s in segs) + n * m.commit_s
    return TimePrediction(total, host, sum(s.device for s in segs), tuple(segs), n)
