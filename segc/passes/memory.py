"""MLX's peak memory for one call of a graph, as MLX allocates it. The weights and other
graph inputs stay resident (the model holds them) and are reported apart from the
activations. Activations are simulated in program order: a buffer is allocated when its
equation runs and freed after its last reader (MLX frees an array when its last
reference goes); values inside a fused chain are never allocated; an elementwise output
takes over an input buffer of the same size that dies at that equation (MLX's
donation), and a KV-cache update writes into the cache buffer it consumes.

On a GPU (``buffer_kernels``) a buffer lives longer: MLX's CUDA build keeps the inputs
of every kernel it encodes until the command buffer holding the kernel has run
(``gpu::eval`` adds them to the encoder's temporaries), and a command buffer ends at a
commit: the runtime's (``commits``: after every segment under the default policy), or
MLX's own once a buffer holds more than ``buffer_kernels`` kernels (100 on an H200), or
the call's end. A buffer read earlier in the same command buffer is held there, so MLX
donates it to no output. So on a GPU the cuts change the peak: a large segment keeps
more of its values alive (the reference llama's prefill of 512 tokens: 66 MB of
activations with a segment per layer, 346 MB in one segment, as ``mx.get_peak_memory``
measures; docs/experiments.md).

On the CPU (``lag_kernels``) a buffer lives longer too: MLX's CPU build allocates a
kernel's output on the host when it encodes the kernel, and the kernel's task holds its
inputs until the worker thread has run it; the host runs ahead of the worker by up to
about 50 kernels (``MAX_ACTIVE_TASKS`` of 10 tasks of ``DISPATCHES_PER_TASK`` 10
dispatches, two a kernel: ``mlx/transforms.cpp``, ``mlx/backend/cpu/encoder.h``). A chain
of dependent 1 MiB matrix products peaks at 3, 6, 12 and 56 MiB for 3, 6, 12 and 60
products (``mx.get_peak_memory``, eager as compiled), not at 2. So, with the host that
far ahead (the bound the prediction gives), a buffer is freed ``lag_kernels`` kernels
after its last reader, and an input an earlier kernel within that distance still holds
is donated to no output.

A call that owns its state buffers (``consumed_state``: segc's jit from a signature's
second call hands them to the executor) frees each after its last reader. On a machine
whose lowering computes a decode step's rotated KV writes with segc's CUDA kernel
(``segc.lower.kvwrite``: ``copied_writes``), those writes allocate their new buffers
(MLX's custom kernels cannot write into an input), and the consumed cache buffers die
at the kernel: the same simulation without the in-place case for them. With
``SEGC_KV_IN_PLACE=1`` a write paired with its attention writes into the buffer it
consumes, as the simulation's in-place case has it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from ..ir import Eqn, Graph, segments
from ..lower.fused import cuda_defaults, find_all
from ..lower.kvwrite import kv_attention_wanted, written_in_place
from ..lower.prim import lookup
from .analysis import ops
from .costmodel import CPU, command_buffers, op_costs
from .legalize import fusion_groups

# kernels counted as a machine running segc's CUDA product kernels counts them
_PRODUCTS = replace(CPU, fused_products=True)


@dataclass(frozen=True, slots=True)
class MemoryPrediction:
    weights: int  # parameters (graph inputs of kind "param")
    inputs: int  # other graph inputs (arguments, KV-cache buffers)
    activations: int  # the most bytes of computed buffers alive at once
    constants: int  # captured constants

    @property
    def peak(self) -> int:
        return self.weights + self.inputs + self.activations + self.constants


def predict_memory(
    g: Graph,
    copied_writes: bool = False,
    *,
    buffer_kernels: int = 0,
    commits: Sequence[bool] | None = None,
    consumed_state: bool = False,
    lag_kernels: int = 0,
) -> MemoryPrediction:
    """MLX's peak allocation for one call of ``g`` (module docstring). ``copied_writes``:
    the rotated KV writes of ``g``'s segments are segc's CUDA kernel's (a fresh buffer
    each). ``buffer_kernels`` > 0: a GPU whose command buffers hold up to that many
    kernels (MLX's CUDA build commits one past it, and at every commit: ``commits``, per
    segment, default all), a buffer read by a kernel living until that kernel's command
    buffer ends. ``consumed_state``: the call owns its state buffers (a jit's call from
    its second on), which die after their last reader. ``lag_kernels`` > 0: a CPU whose
    host runs that many kernels ahead of its worker (module docstring)."""
    os_ = ops(g)
    copied = _copied(g) if copied_writes else frozenset()
    oc = op_costs(g, _PRODUCTS if copied_writes else CPU)
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
    buf, closes = command_buffers(g, oc.kernels, buffer_kernels, commits) if buffer_kernels > 0 else ([], [])
    if lag_kernels > 0 and not closes:
        cum, closes = _lagged(oc.kernels, lag_kernels)
    else:
        cum = []
    reads: dict[str, list[int]] = {}  # per buffer: the ops reading it, in order
    for k, e in enumerate(os_):
        for r in dict.fromkeys(lv.root[v] for v in e.ins):
            reads.setdefault(r, []).append(end.get(k, k))
    frees: dict[int, list[str]] = {}
    dies = [*lv.defined, *(state if consumed_state else ())]
    for v in dies:
        u = lv.n if lv.last_use.get(v, -1) >= lv.n else last.get(v, lv.defined.get(v, lv.n))
        if u < lv.n:
            frees.setdefault(u, []).append(v)
    live: dict[str, int] = {v: lv.nbytes.get(v, 0) for v in state} if consumed_state else {}
    held = cur = peak = sum(live.values())
    later: dict[int, list[str]] = {}
    for k, e in enumerate(os_):
        dying = {v for v in frees.get(k, []) if v in live}
        for o in e.outs:
            if lv.defined.get(o.name) != k or o.name in oc.internal:
                continue
            size = lv.nbytes[o.name]
            in_place = e.prim in _IN_PLACE and e.id not in copied and e.ins
            root = lv.root[e.ins[0]] if e.ins else ""
            if in_place and last.get(root) == k and root in state:
                if root in live:  # the consumed state buffer is now the update's
                    live[o.name] = live.pop(root)
                continue  # a KV-cache update into the consumed state buffer: no new memory
            ok = [
                v
                for v in sorted(dying)
                if live[v] == size and not (closes and _held(reads[v], k, buf, cum, lag_kernels))
            ]
            donor = next(iter(ok), None) if _donates(e) else None
            if donor is not None:  # MLX writes the output into the dying input's buffer
                dying.discard(donor)
                cur -= live.pop(donor)
            live[o.name] = size
            cur += size
        peak = max(peak, cur)
        for v in later.pop(k, []):  # held by a command buffer (or the CPU's queue) until now
            if v in live:
                cur -= live.pop(v)
        for v in frees.get(k, []):
            if v in live:
                if not closes or closes[k] == k:
                    cur -= live.pop(v)
                elif closes[k] < len(os_):  # kept by the command buffer (the CPU's queue) until then
                    later.setdefault(closes[k], []).append(v)
    weights = sum(i.var.nbytes for i in g.inputs if i.kind == "param")
    other = sum(i.var.nbytes for i in g.inputs if i.kind != "param")
    consts = sum(c.var.nbytes for c in g.consts)
    return MemoryPrediction(weights, other, peak - held, consts)


# updates MLX makes in place when their first input is donated (segc hands a call's
# KV-cache buffers to the executor once the signature has run: docs/performance.md)
_IN_PLACE = frozenset({"SliceUpdate", "DynamicSliceUpdate", "Scatter", "ScatterAxis"})


def _donates(e: Eqn) -> bool:
    """Elementwise equations (and the fused chains made of them) may write into an input
    buffer that dies with them; matrix products, reductions and the rest allocate."""
    p = lookup(e.prim)
    return p.fusible and p.memory in ("compute", "move")


def _copied(g: Graph) -> frozenset[int]:
    """The writes segc's CUDA lowering computes with its rotated-write kernel (or a
    layer's), segment by segment (``fused.find_all``, as the replay finds them); not
    those its write-with-attention kernel makes in place (``SEGC_KV_IN_PLACE=1``, where
    nothing else reads the old buffers: ``KVWriteMatch.alone``)."""
    avals = {n: (v.shape, v.dtype) for n, v in g.vars().items()}
    consts = {c.var.name: c.value for c in g.consts}
    paired = kv_attention_wanted()  # find_all pairs whatever the setting; the lowering pairs only with it
    out: set[int] = set()
    for s in segments(g):
        found = find_all(s.eqns(g), s.outputs, consts, avals, g.eqns, g.outputs, **cuda_defaults())
        layers = [p.pair[0] for p in found.products if p.pair is not None]  # a layer's kernel writes them too
        kept = {id(w) for w, _ in found.pairs if written_in_place(w)} if paired else set()
        for w in [*found.writes, *layers]:
            if id(w) not in kept:
                out.update(e.id for e in w.eqns if e.prim == "DynamicSliceUpdate")
    return frozenset(out)


def _lagged(kernels: Sequence[int], lag: int) -> tuple[list[int], list[int]]:
    """Per op: the kernels encoded up to it (a count), and the op at which a buffer it
    reads last is freed, the worker ``lag`` kernels behind (``len(kernels)``: at the
    call's end, after the peak)."""
    cum: list[int] = []
    n = 0
    for c in kernels:
        n += c
        cum.append(n)
    ends = []
    j = 0
    for k in range(len(cum)):
        j = max(j, k)
        while j < len(cum) and cum[j] - cum[k] < lag:
            j += 1
        ends.append(j)
    return cum, ends


def _held(readers: list[int], k: int, buf: list[int], cum: list[int], lag: int) -> bool:
    """Whether something still holds a buffer op ``k`` reads last: its GPU command buffer
    (``buf``) or the CPU's queue (``cum``)."""
    return _pending(readers, k, cum, lag) if cum else _kept(readers, k, buf)


def _pending(readers: list[int], k: int, cum: list[int], lag: int) -> bool:
    """Whether an earlier reader than op ``k``, fewer than ``lag`` kernels back, still
    holds the buffer in the CPU's queue (MLX then donates it to no output)."""
    return any(r < k and cum[k] - cum[r] < lag for r in readers)


def _kept(readers: list[int], k: int, buf: list[int]) -> bool:
    """Whether an earlier reader than op ``k`` in ``k``'s command buffer keeps the buffer
    (the encoder's reference: MLX then donates it to no output)."""
    return any(r < k and buf[r] == buf[k] for r in readers)
