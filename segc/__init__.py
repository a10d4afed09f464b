"""segc: a tracing compiler that runs MLX models as boundary segments, bit-identically."""

from .errors import IRError as IRError
from .errors import MemoryLimitError as MemoryLimitError
from .errors import PagingError as PagingError
from .errors import ScheduleError as ScheduleError
from .errors import ScheduleWarning as ScheduleWarning
from .errors import SegcError as SegcError
from .errors import SegcWarning as SegcWarning
from .errors import SignatureError as SignatureError
from .errors import StateError as StateError
from .errors import TraceError as TraceError
from .errors import UnsupportedPrimitive as UnsupportedPrimitive
from .errors import UsageError as UsageError
from .errors import WaitTimeout as WaitTimeout
from .ir import Graph as Graph
from .ir import parse as parse
from .ir import segments as segments
from .ir import verify as verify
from .runtime.events import Event as Event
from .staging import Compiled as Compiled
from .staging import Jitted as Jitted
from .staging import Lowered as Lowered
from .staging import Traced as Traced
from .staging import jit as jit
from .trace.markers import boundary as boundary

__version__ = "0.1.0"

__all__ = [
    "Compiled",
    "Event",
    "Graph",
    "IRError",
    "Jitted",
    "Lowered",
    "MemoryLimitError",
    "PagingError",
    "ScheduleError",
    "ScheduleWarning",
    "SegcError",
    "SegcWarning",
    "SignatureError",
    "StateError",
    "TraceError",
    "Traced",
    "UnsupportedPrimitive",
    "UsageError",
    "WaitTimeout",
    "boundary",
    "jit",
    "parse",
    "segments",
    "verify",
]
