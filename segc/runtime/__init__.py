"""segc's runtime: the segmented executor (and, later, events, windows and the stash)."""

from .executor import Executor

__all__ = ["Executor"]
