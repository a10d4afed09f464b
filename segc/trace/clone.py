"""A private copy of a module tree for one trace.

A trace installs placeholders for the parameters and wraps submodules for
``boundaries=``; done on the user's module, both would be visible to anyone calling it
meanwhile (another thread, a second ``segc.jit`` on the same model). The trace works on
:func:`clone_modules` instead: every ``nn.Module`` in the tree is copied, with every list,
tuple and dict among its items (where parameters and submodules live); arrays and every
other attribute are shared.
"""

from __future__ import annotations

import copy
from typing import Any

import mlx.nn as nn


def clone_modules(module: nn.Module) -> nn.Module:
    """A copy of ``module``'s tree of submodules (see the module); a submodule reachable
    twice (tied weights) is copied once."""
    return _clone(module, {})


def _clone(x: Any, memo: dict[int, Any]) -> Any:
    """``clone_modules``' recursion, a module function: a closure that calls itself is
    a reference cycle, and would keep the memo alive until Python's cyclic collector."""
    if id(x) in memo:
        return memo[id(x)]
    if isinstance(x, nn.Module):
        new = copy.copy(x)
        memo[id(x)] = new
        for k, v in x.items():
            dict.__setitem__(new, k, _clone(v, memo))
        return new
    if isinstance(x, list | tuple):
        items = [_clone(v, memo) for v in x]
        out: Any = items if isinstance(x, list) else tuple(items)
    elif isinstance(x, dict):
        out = {k: _clone(v, memo) for k, v in x.items()}
    else:
        return x
    memo[id(x)] = out
    return out
