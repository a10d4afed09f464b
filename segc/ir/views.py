"""Views of a graph for other tools."""

from __future__ import annotations

from typing import Any

from .graph import Graph


def to_networkx(g: Graph) -> Any:
    """A ``networkx.DiGraph``: one node per equation id (plus ``in:``/``const:`` nodes);
    an edge per value use, with the value's name and byte size."""
    import networkx as nx

    dg = nx.DiGraph(name=g.name)
    producer: dict[str, Any] = {}
    for i in g.inputs:
        node = f"in:{i.var.name}"
        dg.add_node(node, kind="input", var=i.var)
        producer[i.var.name] = node
    for c in g.consts:
        node = f"const:{c.var.name}"
        dg.add_node(node, kind="const", var=c.var)
        producer[c.var.name] = node
    vs = g.vars()
    for pos, e in enumerate(g.eqns):
        dg.add_node(e.id, kind="eqn", prim=e.prim, pos=pos, eqn=e)
        for v in e.ins:
            dg.add_edge(producer[v], e.id, var=v, nbytes=vs[v].nbytes)
        for o in e.outs:
            producer[o.name] = e.id
    return dg
