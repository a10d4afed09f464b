"""segc's runtime: the segmented executor, its commit policy, timeline events, and the
fenced loop (schedules, windows and the activation stash). It imports the IR and the lowering, never
the front end, ``jit`` or the engines."""

from ..passes.commits import COMMITS as COMMITS
from .events import Event as Event
from .events import WaitTimeout as WaitTimeout
from .executor import DISPATCH_LOCK as DISPATCH_LOCK
from .executor import Aborted as Aborted
from .executor import DispatchTimes as DispatchTimes
from .executor import Executor as Executor
from .executor import SegmentStep as SegmentStep
from .executor import resolve_commit as resolve_commit
from .timing import measure_segments as measure_segments

__all__ = [
    "DISPATCH_LOCK",
    "Aborted",
    "DispatchTimes",
    "Event",
    "Executor",
    "SegmentStep",
    "WaitTimeout",
    "measure_segments",
    "resolve_commit",
]
