"""segc's IR: a flat list of equations over single-assignment values.

A :class:`Graph` holds its inputs (call arguments, module parameters and state arrays),
captured constants with their bytes, an ordered tuple of :class:`Eqn` and its outputs.
Segmentation lives in the equation list itself: a ``segc.cut`` pseudo-equation ends the
segment before it; segments, their boundary values and their effects are derived from
the cuts (:func:`segments`, :func:`segment_effects`), never stored beside them.
Equation ids are stable: the tracer numbers primitives in MLX's (deterministic) export
order, so the same function and signature give the same ids.

This package is the floor of segc: it imports nothing above ``segc.errors``,
``segc.dtypes`` and ``segc.units``.
"""

from .graph import Graph as Graph
from .nodes import CUT as CUT
from .nodes import EFFECTS as EFFECTS
from .nodes import HOST_EVENT as HOST_EVENT
from .nodes import INPUT_KINDS as INPUT_KINDS
from .nodes import PSEUDO as PSEUDO
from .nodes import SIGNAL as SIGNAL
from .nodes import WAIT as WAIT
from .nodes import WINDOW as WINDOW
from .nodes import Const as Const
from .nodes import DTypeArg as DTypeArg
from .nodes import Eqn as Eqn
from .nodes import Input as Input
from .nodes import Var as Var
from .parser import parse as parse
from .printer import ELIDE_BYTES as ELIDE_BYTES
from .printer import args_from_json as args_from_json
from .printer import args_to_json as args_to_json
from .printer import segment_header as segment_header
from .printer import to_text as to_text
from .segments import Segment as Segment
from .segments import SegmentEffects as SegmentEffects
from .segments import host_events as host_events
from .segments import segment_effects as segment_effects
from .segments import segment_of as segment_of
from .segments import segments as segments
from .segments import window_args as window_args
from .segments import window_segments as window_segments
from .verify import verify as verify
from .views import to_networkx as to_networkx

__all__ = [
    "CUT",
    "EFFECTS",
    "ELIDE_BYTES",
    "HOST_EVENT",
    "INPUT_KINDS",
    "PSEUDO",
    "SIGNAL",
    "WAIT",
    "WINDOW",
    "Const",
    "DTypeArg",
    "Eqn",
    "Graph",
    "Input",
    "Segment",
    "SegmentEffects",
    "Var",
    "args_from_json",
    "args_to_json",
    "host_events",
    "parse",
    "segment_effects",
    "segment_header",
    "segment_of",
    "segments",
    "to_networkx",
    "to_text",
    "verify",
    "window_args",
    "window_segments",
]
