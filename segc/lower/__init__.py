"""Lowering: rebuild each traced primitive with the MLX op that creates it.

One table, :data:`PRIMS` (``prim.py``), holds a :class:`Prim` record per primitive:
its rule, the arguments it refuses, whether it is rebuilt another way, its fusion class,
its memory behaviour and its FLOPs. The family modules (``elementwise``, ``shapes``,
``reductions``, ``indexing``, ``matmul``, ``fast``, ``refused``) fill it; a new
primitive is one record in one of them. ``replay.py`` checks a graph against the table
and replays segments.

The mappings below are read-only views of the table, for documentation and tests.
"""

from types import MappingProxyType

# importing the family modules fills PRIMS
from . import elementwise, fast, indexing, linalg, matmul, reductions, refused, shapes  # noqa: F401
from .attention import ATTENTION as ATTENTION
from .attention import attention_kernel as attention_kernel
from .dequantized import wanted as dequantized_wanted
from .experts import wanted as experts_wanted
from .kvwrite import kv_write_kernel as kv_write_kernel
from .live import compile_segment as compile_segment
from .live import live_commits as live_commits
from .prim import PRIMS as PRIMS
from .prim import Prim as Prim
from .prim import describe as describe
from .prim import lookup as lookup
from .products import product_kernel as product_kernel
from .replay import check_supported as check_supported
from .replay import compile_loses as compile_loses
from .replay import replay_fn as replay_fn
from .replay import segment_fn as segment_fn
from .typecheck import check_types as check_types

RULES = MappingProxyType({n: p.rule for n, p in PRIMS.items() if p.rule is not None})
REBUILT = MappingProxyType({n: p.rebuilt for n, p in PRIMS.items() if p.rebuilt is not None})
REFUSED = MappingProxyType({n: p.refused for n, p in PRIMS.items() if p.refused is not None})
UNSUPPORTED = MappingProxyType({n: p.unsupported for n, p in PRIMS.items() if p.unsupported is not None})

__all__ = [
    "ATTENTION",
    "PRIMS",
    "REBUILT",
    "REFUSED",
    "RULES",
    "UNSUPPORTED",
    "Prim",
    "attention_kernel",
    "check_supported",
    "check_types",
    "compile_loses",
    "dequantized_wanted",
    "describe",
    "experts_wanted",
    "kv_write_kernel",
    "lookup",
    "product_kernel",
    "replay_fn",
    "segment_fn",
]
