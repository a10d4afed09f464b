"""``strip_cuts``: remove every ``segc.cut`` (one segment: the stock path).

Fences and windows stay where they are; a graph without cuts runs as one segment.
"""

from __future__ import annotations

from ..ir import CUT, Graph
from .registry import register


@register("strip_cuts")
def strip_cuts(g: Graph) -> Graph:
    """Drop the cuts; keep every other equation in order."""
    return g.replace(eqns=tuple(e for e in g.eqns if e.prim != CUT))
