"""Views of constants that a segment makes again instead of reading them.

A traced model shares some values between its layers that are only views of a constant
(a broadcast of a scale, of RoPE's frequencies, of a mask's fill value): cut a segment
per layer and the first layer's segment makes each such value, and every later segment
reads it, as one more input of its compiled call. An input costs host time at every
call (MLX's compiled call takes about 1.7 us an input on the H200's host,
docs/performance-log.md, "argcost"; segc's dispatch loop gathers it). A view computes
nothing, so a segment can make the value itself from the constant, which its compiled
function captures as it captures its other constants: the same bytes, one input fewer.

Only chains of views (``analysis.is_view``: broadcasts, reshapes, transposes, slices)
of constants that ``mx.compile`` keeps (``lower.compile_loses``) are made again, and no
empty value (a compiled function over an empty array is what
``executor._touches_empty`` keeps out). ``SEGC_REMAKE_VIEWS=0`` turns this off.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..ir import Eqn, Graph, Segment
from ..lower import compile_loses
from ..passes.analysis import is_view
from ..settings import env_choice

REMAKE_VIEWS = env_choice("SEGC_REMAKE_VIEWS", ("1", "0"), "1") == "1"


def view_chains(g: Graph) -> dict[str, tuple[Eqn, ...]]:
    """Each value that views of constants alone make: the equations that make it, in
    graph order."""
    consts = {c.var.name for c in g.consts if c.value is not None and not compile_loses(c)}
    chains: dict[str, tuple[Eqn, ...]] = {}
    for e in g.eqns:
        if e.is_pseudo or len(e.outs) != 1 or not e.ins or not is_view(e):
            continue
        if 0 in e.outs[0].shape or not all(v in consts or v in chains for v in e.ins):
            continue
        before = dict.fromkeys(x for v in e.ins if v in chains for x in chains[v])
        chains[e.outs[0].name] = (*before, e)
    return chains


def remade(s: Segment, chains: dict[str, tuple[Eqn, ...]]) -> tuple[tuple[str, ...], tuple[Eqn, ...]]:
    """The inputs segment ``s`` still reads, and the equations (in graph order) that
    make the others inside it."""
    again = [v for v in s.inputs if v in chains]
    if not again:
        return s.inputs, ()
    eqns = dict.fromkeys(x for v in again for x in chains[v])
    return tuple(v for v in s.inputs if v not in chains), tuple(sorted(eqns, key=lambda e: e.id))


def plan(g: Graph, segs: Sequence[Segment]) -> list[tuple[tuple[str, ...], tuple[Eqn, ...]]]:
    """Per segment, :func:`remade`'s inputs and equations (with ``REMAKE_VIEWS`` off,
    every segment reads all its inputs)."""
    if not REMAKE_VIEWS:
        return [(s.inputs, ()) for s in segs]
    chains = view_chains(g)
    return [remade(s, chains) for s in segs]
