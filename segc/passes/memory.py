"""MLX's peak memory for one call of a graph, as MLX allocates it. The weights and other graph inputs stay resident (the
model holds them) and are reported apart from the activations. Activations are
simulated in program order: a buffer is allocated when its equation runs and freed
after its last reader (MLX frees an array when its last reference goes); values inside
a fused chain are never allocated; an elementwise output takes over an input buffer of
the same size that dies at that equation (MLX's donation), and a KV-cache update writes
into the cache buffer it consumes. The cuts change neither, so
the prediction is the same for every legal plan (the executor releases a boundary
value after its last reading segment, which is when its last reader has run).

On a machine whose lowering computes a decode step's rotated KV writes with segc's CUDA
kernel (``segc.lower.kvwrite``: ``copied_writes``), those writes allocate their new
buffers (MLX's custom kernels cannot write into an input), and the consumed cache
buffers die at the kernel: the same simulation without the in-place case for them.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..ir import Eqn, Graph, segments
from ..lower.fused import CUDA_DEFAULTS, find_all
from ..lower.prim import lookup
from .analysis import ops
from .costmodel import CPU, op_costs
from .legalize import fusion_groups


@dataclass(frozen=True, slots=True)
class MemoryPrediction:
    weights: int  # parameters (graph inputs of kind "param")
    inputs: int  # other graph inputs (arguments, KV-cache buffers)
    activations: int  # the most bytes of computed buffers alive at once
    constants: int  # captured constants

    @property
    def peak(self) -> int:
        return self.weights + self.inputs + self.activations + self.constants


def predict_memory(g: Graph, copied_writes: bool = False) -> MemoryPrediction:
    """MLX's peak allocation for one call of ``g`` (module docstring); ``copied_writes``:
    the rotated KV writes of ``g``'s segments are segc's CUDA kernel's (a fresh buffer
    each)."""
    os_ = ops(g)
    copied = _copied(g) if copied_writes else frozenset()
    oc = op_costs(g, CPU)
    lv = oc.lv
    state = {i.var.name for i in g.inputs if i.kind == "state"}
    end = {}  # a fused chain runs as one kernel at its last equation: its inputs live to there
    for grp in fusion_groups(g):
        for k in grp:
            end[k] = grp[-1]
    last: dict[str, int] = {}
    for k, e in enumerate(os_):
        for v in e.ins:
            r = lv.root[v]
            last[r] = max(last.get(r, -1), end.get(k, k))
    frees: dict[int, list[str]] = {}
    for v in lv.defined:
        u = lv.n if lv.last_use[v] >= lv.n else last.get(v, lv.defined[v])
        if u < lv.n:
            frees.setdefault(u, []).append(v)
    live: dict[str, int] = {}
    cur = peak = 0
    for k, e in enumerate(os_):
        dying = {v for v in frees.get(k, []) if v in live}
        for o in e.outs:
            if lv.defined.get(o.name) != k or o.name in oc.internal:
                continue
            size = lv.nbytes[o.name]
            in_place = e.prim in _IN_PLACE and e.id not in copied and e.ins
            if in_place and last.get(lv.root[e.ins[0]]) == k and lv.root[e.ins[0]] in state:
                continue  # a KV-cache update into the consumed state buffer: no new memory
            donor = next((v for v in sorted(dying) if live[v] == size), None) if _donates(e) else None
            if donor is not None:  # MLX writes the output into the dying input's buffer
                dying.discard(donor)
                cur -= live.pop(donor)
            live[o.name] = size
            cur += size
        peak = max(peak, cur)
        for v in frees.get(k, []):
            if v in live:
                cur -= live.pop(v)
    weights = sum(i.var.nbytes for i in g.inputs if i.kind == "param")
    other = sum(i.var.nbytes for i in g.inputs if i.kind != "param")
    consts = sum(c.var.nbytes for c in g.consts)
    return MemoryPrediction(weights, other, peak, consts)


# updates MLX makes in place when their first input is donated (segc hands a call's
# KV-cache buffers to the executor once the signature has run: docs/performance.md)
_IN_PLACE = frozenset({"SliceUpdate", "DynamicSliceUpdate", "Scatter", "ScatterAxis"})


def _donates(e: Eqn) -> bool:
    """Elementwise equations (and the fused chains made of them) may write into an input
    buffer that dies with them; matrix products, reductions and the rest allocate."""
    p = lookup(e.prim)
    return p.fusible and p.memory in ("compute", "move")


def _copied(g: Graph) -> frozenset[int]:
    """The writes segc's CUDA lowering computes with its rotated-write kernel, segment by
    segment (``fused.find_all``, as the replay finds them)."""
    avals = {n: (v.shape, v.dtype) for n, v in g.vars().items()}
    consts = {c.var.name: c.value for c in g.consts}
    out: set[int] = set()
    for s in segments(g):
        for w in find_all(s.eqns(g), s.outputs, consts, avals, g.eqns, **CUDA_DEFAULTS).writes:
            out.update(e.id for e in w.eqns if e.prim == "DynamicSliceUpdate")
    return frozenset(out)
