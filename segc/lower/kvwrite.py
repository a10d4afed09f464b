"""A decode step's rotary embedding and KV-cache writes as one kernel: the setting, the
finder, and MLX's ops for the same thing.

On CUDA a dynamic KV cache's one-token write (``segc/trace/kvcache.py``) is a select over
the buffer (``shapes.py``), and a llama layer spends five kernels on what surrounds its
attention: ``RoPE`` of the keys and of the queries (MLX's ``rope_single``), the
comparison of the positions with the offset, and a select per buffer. A decode step on
the H200 is bound by the host's cost per kernel (docs/performance.md), so
:func:`find_kv_writes` finds, per layer, the keys' ``RoPE`` whose only reader is the
keys' ``DynamicSliceUpdate``, the values' ``DynamicSliceUpdate`` at the same position,
and the queries' ``RoPE`` at the same offset with the same rotation (when there is
one); ``cuda_kvwrite.py`` computes them in one kernel: the new key and value buffers
(the row at the offset rotated or copied in, every other row copied) and the rotated
queries. The rotation is MLX 0.32's ``rope_single`` line for line (float arithmetic,
one rounding to the dtype), the rest copies bytes: the same bits as eager's kernels
(``tests/test_kvwrite_cuda.py``). :func:`reference_kv_write` runs the matched
equations' own rules: the tests' stand-in on the CPU.

Taken only where the select would be (one position along axis 2 of a ``(1, H, C, D)``
buffer of at most ``shapes.SELECT_WRITE_BYTES``: the kernel copies the buffer as the
select does), for one batch row, a floating dtype, an ``int32`` offset shared by the
rotation and the writes, and intermediate values nothing else reads.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass

import mlx.core as mx

from ..ir import Eqn
from ..settings import env_choice
from .live import live_wanted
from .pattern import SegmentGraph, only_reader
from .prim import lookup

DTYPES = ("bf16", "f16", "f32")


@dataclass(frozen=True)
class KVWriteMatch:
    """The keys' rotation and write, the values' write and (optionally) the queries'
    rotation of one attention. ``ins`` are the kernel's inputs (key buffer, new keys,
    value buffer, new values, offset, then the queries and the frequencies where
    present), ``outs`` what it defines (new key buffer, new value buffer, rotated
    queries). ``eqns`` are the equations it replaces, in the segment's order: the kernel
    runs where the last of them was."""

    ins: tuple[str, ...]
    outs: tuple[str, ...]
    dims: int
    traditional: bool
    base: float | None
    scale: float
    queries: bool
    freqs: bool
    eqns: tuple[Eqn, ...]
    alone: bool = False  # the write is the only reader of either old buffer in the program

    @property
    def skip(self) -> frozenset[int]:
        return frozenset(e.id for e in self.eqns)


def _rows(shape: tuple[int, ...] | None) -> bool:
    """A ``(1, H, 1, D)`` row of one token per head."""
    return shape is not None and len(shape) == 4 and shape[0] == 1 and shape[2] == 1


def _one_row_write(e: Eqn, g: SegmentGraph, avals: Mapping[str, tuple], max_bytes: int) -> bool:
    """``e`` writes one token's row of every head into a ``(1, H, C, D)`` buffer along
    axis 2 at an ``int32`` scalar, a buffer of at most ``max_bytes``."""
    if e.prim != "DynamicSliceUpdate" or len(e.ins) != 3:
        return False
    buf, upd, start = (avals.get(v) for v in e.ins)
    if buf is None or upd is None or start is None:
        return False
    (bs, bt), (us, ut), (ss, st) = buf, upd, start
    axes = tuple(a % 4 for a in e.args[0]) if len(bs) == 4 else ()
    if axes != (2,) or bs[0] != 1 or not _rows(us) or us[1] != bs[1] or us[3] != bs[3]:
        return False
    size = 1
    for n in bs:
        size *= n
    itemsize = {"bf16": 2, "f16": 2, "f32": 4}.get(bt, 0)
    return bt == ut and bt in DTYPES and st == "i32" and len(ss) <= 1 and size * itemsize <= max_bytes


def _same_rotation(a: Eqn, b: Eqn) -> bool:
    return a.args == b.args and a.ins[1:] == b.ins[1:]


def _reads(v: str, names: set[str], g: SegmentGraph) -> bool:
    """Whether ``v`` is made (in this segment) from any of ``names``. A value made before
    the first of ``names`` cannot be, so the walk stops there (it stays within a layer)."""
    made = [g.pos[g.prod[n].id] for n in names if n in g.prod]
    if not made:
        return False
    floor = min(made)
    seen: set[str] = set()
    todo = [v]
    while todo:
        x = todo.pop()
        if x in names:
            return True
        e = g.prod.get(x)
        if e is None or x in seen or g.pos[e.id] < floor:
            continue
        seen.add(x)
        todo.extend(e.ins)
    return False


def find_kv_writes(
    eqns: Sequence[Eqn],
    keep: Sequence[str],
    avals: Mapping[str, tuple],
    context: Sequence[Eqn] = (),
    taken: frozenset[int] = frozenset(),
    max_bytes: int | None = None,
    program_outputs: Collection[str] = (),
) -> list[KVWriteMatch]:
    """Every rotated key write with its value write (and query rotation) in ``eqns`` (a
    segment's equations, in order; ``keep`` its outputs; ``avals`` every var's shape and
    dtype), none of whose equations are in ``taken`` (another kernel's). ``context`` (the
    whole program's equations) and ``program_outputs`` tell whether the old buffers have
    another reader (``KVWriteMatch.alone``)."""
    if max_bytes is None:
        from .shapes import SELECT_WRITE_BYTES

        max_bytes = SELECT_WRITE_BYTES
    g = SegmentGraph(eqns, keep, context)
    used = set(taken)
    found: list[KVWriteMatch] = []
    writes = [e for e in eqns if _one_row_write(e, g, avals, max_bytes)]
    reads = Counter(v for e in (context or eqns) for v in e.ins) if writes else Counter()
    ropes = [e for e in eqns if e.prim == "RoPE"]
    for dk in writes:
        if dk.id in used:
            continue
        kbuf, kr, off = dk.ins
        rk = g.eqn(kr, "RoPE")
        if rk is None or rk.id in used or only_reader(kr, g) is not dk or len(rk.ins) not in (2, 3):
            continue
        dims, traditional, base, scale, forward = rk.args
        if not forward or rk.ins[1] != off or not _rows(avals[rk.ins[0]][0]) or avals[rk.ins[0]][1] != avals[kr][1]:
            continue
        if len(rk.ins) == 3 and avals[rk.ins[2]][1] != "f32":
            continue
        kdt = avals[kbuf][1]
        dv = next(
            (
                e
                for e in writes
                if e.id not in used
                and e is not dk
                and e.ins[2] == off
                and avals[e.ins[0]][0][1:3] == avals[kbuf][0][1:3]
                and avals[e.ins[0]][1] == kdt
                and g.eqn(e.ins[1], "RoPE") is None
                and not _reads(e.ins[1], {dk.outs[0].name}, g)
            ),
            None,
        )
        if dv is None:
            continue
        rq = next(
            (
                e
                for e in ropes
                if e.id not in used
                and e is not rk
                and _same_rotation(e, rk)
                and _rows(avals[e.ins[0]][0])
                and avals[e.ins[0]][0][3] == avals[kr][0][3]
                and avals[e.ins[0]][1] == kdt
                and not _reads(e.ins[0], {dk.outs[0].name, dv.outs[0].name}, g)
            ),
            None,
        )
        ins = [kbuf, rk.ins[0], dv.ins[0], dv.ins[1], off]
        outs = [dk.outs[0].name, dv.outs[0].name]
        if rq is not None:
            ins.append(rq.ins[0])
            outs.append(rq.outs[0].name)
        if len(rk.ins) == 3:
            ins.append(rk.ins[2])
        if any(_reads(v, set(outs), g) for v in ins):  # the kernel would wait for itself
            continue
        group = [e for e in (rk, dk, dv, rq) if e is not None]
        used.update(e.id for e in group)
        found.append(
            KVWriteMatch(
                tuple(ins),
                tuple(outs),
                int(dims),
                bool(traditional),
                None if base is None else float(base),
                float(scale),
                rq is not None,
                len(rk.ins) == 3,
                tuple(sorted(group, key=lambda e: g.pos[e.id])),
                all(reads[b] == 1 and b not in keep and b not in program_outputs for b in (kbuf, dv.ins[0])),
            )
        )
    return found


def reference_kv_write(m: KVWriteMatch, ins: Sequence[mx.array]) -> list[mx.array]:
    """What the kernel computes, by the matched equations' own rules (MLX's ops, the
    primitives eager records): the tests' stand-in for the kernel without CUDA."""
    env = dict(zip(m.ins, ins))
    for e in m.eqns:
        rule = lookup(e.prim).rule
        assert rule is not None
        res = rule([env[v] for v in e.ins], e.args, e)
        env[e.outs[0].name] = res if isinstance(res, mx.array) else res[0]
    return [env[v] for v in m.outs]


Kernel = Callable[[KVWriteMatch, Sequence[mx.array]], list[mx.array]]

# "auto": the CUDA kernel where the default device is a CUDA GPU of MLX 0.32 (unless the
# environment sets SEGC_FUSED_KV_WRITE=0, or shapes.SELECT_WRITE is "never": MLX's own
# write asked for), none on the CPU; "never"; or a kernel (tests, research). Read when a
# graph is lowered.
FUSED_KV_WRITE: str | Kernel = "auto"


def kv_write_kernel(
    setting: str | Kernel | None = None, *, own_attention: bool = True, in_place: bool | None = None
) -> Kernel | None:
    """The kernel segments lower their rotated KV writes to, or None (MLX's own
    kernels). ``setting`` defaults to :data:`FUSED_KV_WRITE`. ``own_attention=False``
    (the jit was given an attention kernel of its own, ``attention=callable``): segc's
    write never takes the attention into its kernel, so the caller's kernel computes it.
    ``in_place`` (``segc.jit(..., kv_in_place=)``): whether the write with its attention
    writes into the old buffers; None leaves it to :func:`kv_in_place_wanted`."""
    setting = FUSED_KV_WRITE if setting is None else setting
    if callable(setting):
        return setting
    from . import shapes
    from .products import cuda_wanted

    wanted = cuda_wanted(setting, "FUSED_KV_WRITE")
    if not wanted or shapes.SELECT_WRITE == "never":
        return None
    if not (own_attention and kv_attention_wanted()):
        return cuda_kv_write
    paired = cuda_kv_write_with_attention if in_place is None else _paired(in_place)
    return _live(paired, in_place) if live_wanted() else paired


def kv_attention_wanted() -> bool:
    """Whether a rotated write whose attention reads it becomes one kernel with that
    attention (``cuda_kvattention.py``): the environment's ``SEGC_FUSED_KV_ATTENTION``,
    ``1`` (the default: measured on the H200, docs/performance.md) or ``0`` (two kernels)."""
    return env_choice("SEGC_FUSED_KV_ATTENTION", ("0", "1"), "1") == "1"


def kv_in_place_wanted(setting: bool | None = None) -> bool:
    """Whether the write with its attention writes the new row into the old buffers
    instead of copying them (``cuda_kvattention.py``), where nothing else reads them
    (``KVWriteMatch.alone``): ``setting`` (``segc.jit``'s ``kv_in_place``) where it is
    given, else the environment's ``SEGC_KV_IN_PLACE``, ``0`` (the default) or ``1``.
    In place, an array that shares a cache's buffer and outlives the call (a view of it
    kept by the caller) sees the new row, where MLX would have copied (docs/lowering.md)."""
    if setting is not None:
        return setting
    return env_choice("SEGC_KV_IN_PLACE", ("0", "1"), "0") == "1"


def written_in_place(m: KVWriteMatch, setting: bool | None = None) -> bool:
    """Whether ``m``, taken with its attention into one kernel, writes its row into the
    old buffers (:func:`kv_in_place_wanted`, where ``m.alone``): what the lowering does
    and the memory model predicts."""
    return m.alone and kv_in_place_wanted(setting)


def cuda_kv_write(m: KVWriteMatch, ins: Sequence[mx.array]) -> list[mx.array]:
    """``m`` computed by one CUDA kernel (``cuda_kvwrite.py``, imported on first use)."""
    from .cuda_kvwrite import kv_write

    return kv_write(ins, m.dims, m.traditional, m.base, m.scale, m.queries, m.freqs)


def cuda_kv_write_with_attention(m: KVWriteMatch, ins: Sequence[mx.array]) -> list[mx.array]:
    """:func:`cuda_kv_write`, whose ``with_attention`` the replay also uses for a write
    whose buffers and rotated queries an attention reads (and nothing else reads the
    queries): the write and the attention as one kernel (``cuda_kvattention.py``;
    :func:`kv_attention_wanted`)."""
    return cuda_kv_write(m, ins)


def _with_attention(
    m: KVWriteMatch, scale: float, ins: Sequence[mx.array], setting: bool | None = None
) -> list[mx.array]:
    """``m``'s inputs then the attention's mask: the new buffers and the attention's output."""
    from .cuda_kvattention import kv_attention

    in_place = written_in_place(m, setting)
    return kv_attention(ins[:-1], ins[-1], m.dims, m.traditional, m.base, m.scale, m.freqs, scale, in_place)


cuda_kv_write_with_attention.with_attention = _with_attention  # type: ignore[attr-defined]


def _paired(in_place: bool) -> Kernel:
    """:func:`cuda_kv_write_with_attention` with the write in place, or not, as a jit
    asked (``kv_in_place``), whatever the environment says."""

    def kernel(m: KVWriteMatch, ins: Sequence[mx.array]) -> list[mx.array]:
        return cuda_kv_write(m, ins)

    kernel.with_attention = functools.partial(_with_attention, setting=in_place)  # type: ignore[attr-defined]
    return kernel


def _live(paired: Kernel, in_place: bool | None) -> Kernel:
    """``paired`` with a ``live`` write (``SEGC_LIVE_ATTENTION``, the default; ``live.py``): the new
    buffers and rotated queries (in place where :func:`written_in_place`), after which the
    replay runs MLX's attention over the live keys, where the mask is one query's causal
    row; ``with_attention`` elsewhere."""

    def kernel(m: KVWriteMatch, ins: Sequence[mx.array]) -> list[mx.array]:
        return cuda_kv_write(m, ins)

    def write(m: KVWriteMatch, ins: Sequence[mx.array]) -> list[mx.array]:
        if written_in_place(m, in_place):
            from .cuda_kvwrite import kv_write_rows

            return kv_write_rows(ins, m.dims, m.traditional, m.base, m.scale, m.freqs)
        return cuda_kv_write(m, ins)

    kernel.with_attention = paired.with_attention  # type: ignore[attr-defined]
    kernel.live = write  # type: ignore[attr-defined]
    return kernel


WithAttention = Callable[[KVWriteMatch, float, Sequence[mx.array]], list[mx.array]]
