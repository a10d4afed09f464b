"""Boundaries after submodules: ``boundaries=`` globs over a module's submodule paths.

During a trace each matching submodule is replaced, in its container, by a wrapper that
calls it and then marks a boundary (``markers.boundary``); every replacement is undone
on exit, whatever ends the trace.
"""

from __future__ import annotations

import fnmatch
import warnings
from collections.abc import Sequence
from typing import Any

import mlx.nn as nn

from ..errors import SegcWarning, TraceError
from .markers import boundary


class _After:
    """Stands in for a submodule during a trace: calls it, then marks a boundary."""

    def __init__(self, module: nn.Module, path: str):
        self._segc_module = module
        self._segc_path = path

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        out = self._segc_module(*args, **kwargs)
        return boundary(out, self._segc_path)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._segc_module, name)


def _match(path: str, patterns: Sequence[str]) -> bool:
    """Dotted globs: ``*`` matches within one path component; a pattern may match any
    suffix of the path (``"layers.*"`` matches ``"model.layers.3"``, not
    ``"model.layers.3.mlp"``)."""
    parts = path.split(".")
    for p in patterns:
        pp = p.split(".")
        if len(pp) <= len(parts) and all(fnmatch.fnmatchcase(a, b) for a, b in zip(parts[-len(pp) :], pp)):
            return True
    return False


def submodules(module: nn.Module, prefix: str = "") -> list[tuple[Any, Any, str, nn.Module]]:
    """(container, key, path, submodule) for every submodule held in a module, list or dict."""
    out = []

    def visit(container: Any, key: Any, path: str, value: Any) -> None:
        if isinstance(value, nn.Module):
            out.append((container, key, path, value))
            for k, v in value.items():
                visit(value, k, f"{path}.{k}" if path else str(k), v)
        elif isinstance(value, list | tuple):
            for i, v in enumerate(value):
                visit(value, i, f"{path}.{i}", v)
        elif isinstance(value, dict):
            for k, v in value.items():
                visit(value, k, f"{path}.{k}", v)

    for k, v in module.items():
        visit(module, k, f"{prefix}{k}", v)
    return out


class module_boundaries:
    """Context manager: boundaries after every submodule whose path matches a glob."""

    def __init__(self, module: nn.Module | None, patterns: Sequence[str]):
        self.module = module
        self.patterns = list(patterns)
        self.swapped: list[tuple[Any, Any, nn.Module]] = []

    def __enter__(self) -> module_boundaries:
        if self.module is None or not self.patterns:
            return self
        try:
            for container, key, path, sub in submodules(self.module):
                if _match(path, self.patterns) and not isinstance(container, tuple):
                    self.swapped.append((container, key, sub))
                    if isinstance(container, nn.Module):
                        dict.__setitem__(container, key, _After(sub, path))
                    else:
                        container[key] = _After(sub, path)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        for container, key, sub in reversed(self.swapped):
            if isinstance(container, nn.Module):
                dict.__setitem__(container, key, sub)
            else:
                container[key] = sub
        self.swapped.clear()


def matching_modules(module: nn.Module, patterns: Sequence[str]) -> list[str]:
    return [p for _, _, p, _ in submodules(module) if _match(p, patterns)]


def auto_boundaries(module: nn.Module) -> str | None:
    """The glob for "one segment per block": the longest list of submodules named
    ``layers`` (or ``h``, ``blocks``) in the module, e.g. ``"model.layers.*"``."""
    best: tuple[int, str] | None = None
    lists: dict[str, int] = {}
    for _, _, path, _ in submodules(module):
        head, _, last = path.rpartition(".")
        if last.isdigit() and head.rpartition(".")[2] in ("layers", "h", "blocks"):
            lists[head] = lists.get(head, 0) + 1
    for head, n in lists.items():
        if best is None or n > best[0]:
            best = (n, head)
    return None if best is None else f"{best[1]}.*"


def resolve_boundaries(module: nn.Module | None, boundaries: Any) -> list[str]:
    """``segc.jit``'s ``boundaries=`` as a list of globs (``"auto"``: the model's layers
    list), checked: globs are strings, name submodules of a module, and match one."""
    if boundaries == "auto":
        boundaries = auto_boundaries(module) if module is not None else None
        if boundaries is None:
            what = type(module).__name__ if module is not None else "a function (not an nn.Module)"
            warnings.warn(
                f"boundaries='auto' found no list of blocks (layers, h, blocks) in {what}: one segment",
                SegcWarning,
                stacklevel=4,
            )
    if boundaries is not None and not isinstance(boundaries, str | list | tuple):
        raise TraceError(f"boundaries= takes a glob or a list of globs, got {type(boundaries).__name__}")
    out = [boundaries] if isinstance(boundaries, str) else list(boundaries or [])
    if not all(isinstance(b, str) for b in out):
        raise TraceError(f"boundaries= takes a glob or a list of globs (strings), got {boundaries!r}")
    if out and module is None:
        raise TraceError("boundaries= globs name submodules: pass an nn.Module to segc.jit")
    if module is not None and out:
        unmatched = [b for b in out if not matching_modules(module, [b])]
        if unmatched:
            raise TraceError(
                f"boundaries {unmatched} match no submodule of {type(module).__name__}"
                + (f" (of the globs {out})" if len(out) > 1 else "")
            )
    return out
