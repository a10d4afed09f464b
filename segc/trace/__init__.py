"""The front end: from a Python call to a graph.

- ``capture.py``: MLX's own graph capture (``mx.export_function``) into segc's IR;
- ``markers.py``: ``segc.boundary``; ``boundaries.py``: boundaries after submodules;
- ``pytree.py``: argument and output structure, static values;
- ``params.py``: a module's parameters, gathered fast on every call;
- ``state.py``: functionalisation of objects the call mutates, behind a small registry
  of dynamic kinds; ``kvcache.py``: mlx-lm's KV caches as such kinds;
  ``snapshots.py``: copies for validating a call and rolling it back.

It imports only ``segc.ir`` and the floor (errors, dtypes).
"""

from . import kvcache as kvcache  # registers mlx-lm's caches as dynamic state
from .boundaries import auto_boundaries as auto_boundaries
from .boundaries import matching_modules as matching_modules
from .boundaries import module_boundaries as module_boundaries
from .capture import Capture as Capture
from .capture import trace as trace
from .capture import tracing as tracing
from .markers import boundary as boundary

__all__ = [
    "Capture",
    "auto_boundaries",
    "boundary",
    "kvcache",
    "matching_modules",
    "module_boundaries",
    "trace",
    "tracing",
]
