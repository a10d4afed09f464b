"""``freeze_params=True``: the parameters captured by the compiled segments.

``mx.compile`` takes what a function closes over as constants and what it is passed as
inputs, and it checks every input on every call. A frozen jitted function's parameters
do not change between calls (until ``clear_cache``), so once its first call has read
them, each ``Compiled`` builds its executor on the graph with the parameter inputs
turned into constants: the segments then close over the weights, and a call passes
only its arguments, state arrays and random key (docs/api.md, ``freeze_params``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import mlx.core as mx

from ..errors import IRError
from ..ir import Const, Graph


def params_as_consts(g: Graph, values: Sequence[mx.array]) -> Graph:
    """``g`` with its parameter inputs (``kind == "param"``, in order, after every other
    input) made constants holding ``values``."""
    params = [i for i in g.inputs if i.kind == "param"]
    if len(params) != len(values):
        raise IRError(f"{g.name}: {len(params)} parameter inputs, {len(values)} values")
    if g.inputs[len(g.inputs) - len(params) :] != tuple(params):
        raise IRError(f"{g.name}: the parameter inputs are not the last inputs")
    consts = g.consts + tuple(Const(i.var, v) for i, v in zip(params, values))
    # dataclasses.replace, not Graph.replace: that compares the constants' bytes
    return dataclasses.replace(g, inputs=g.inputs[: len(g.inputs) - len(params)], consts=consts)
