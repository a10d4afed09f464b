"""Gather a module's parameters on every call without walking the module tree.

``dict(tree_flatten(module.parameters()))`` rebuilds nested dicts for the whole module
on every call: about 20 us per llama layer, more than segc's whole per-segment budget.
:class:`ParamGatherer` walks the module once and keeps a *plan*: for every parameter the
container (module, dict or list) that holds it and its key. A call then

1. checks that the module tree still has the shape the plan was made from: every
   container still sits at its key in its parent, and still has as many entries (so a
   replaced submodule, as ``nn.quantize`` does, or an added or removed array is seen);
2. reads each parameter from its container (one lookup each);
3. reuses the previous abstract signature when every array is the same object as last
   time (arrays with the same identity have the same shape and dtype).

Any mismatch rebuilds the plan from ``module.parameters()``, so the result is always
what ``dict(tree_flatten(module.parameters()))`` would give, in the same order. When the
walker cannot reproduce ``parameters()`` exactly (an exotic container), the gatherer
falls back to ``parameters()`` on every call.

A *frozen* gatherer (``segc.jit(..., freeze_params=True)``) checks once and then returns
what it found until :meth:`ParamGatherer.forget`, as ``mx.compile`` captures the arrays a
function closes over: the check touches every container of the module, and in a decode
loop, where the device's work between calls leaves them out of the host's caches, that
costs about 0.06 ms a call for 16 layers on the H200 host (docs/performance.md).
"""

from __future__ import annotations

import operator
from typing import Any, cast

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from .. import dtypes
from ..errors import TraceError

ParamEntry = tuple[str, tuple[int, ...], str]


class ParamSig(tuple[ParamEntry, ...]):
    """The abstract signature of a module's parameters: ``((name, shape, dtype), ...)``.

    A tuple whose hash is computed once: the trace cache hashes it on every call.
    """

    _hash: int

    def __hash__(self) -> int:
        try:
            return self._hash
        except AttributeError:
            self._hash = tuple.__hash__(self)
            return self._hash


def _valid(key: Any, value: Any) -> bool:
    # nn.Module.valid_parameter_filter, for a key inside a module
    return isinstance(value, dict | list | mx.array) and not (isinstance(key, str) and key.startswith("_"))


class _Plan:
    """Where each parameter lives, and what to check that this is still so.

    Kept as parallel lists so that each check is one ``map`` over them, a loop in C.
    """

    def __init__(self, module: nn.Module):
        self.names: list[str] = []
        self.leaf_in: list[Any] = []  # the container holding each parameter
        self.leaf_key: list[Any] = []  # and its key there
        self.parents: list[Any] = []  # for every container below the root: its parent,
        self.keys: list[Any] = []  # its key in the parent,
        self.children: list[Any] = []  # and the container itself
        self.containers: list[Any] = []  # every container, the root first,
        self.sizes: list[int] = []  # and its number of entries
        self._walk(module, "")
        self.modules = [c for c in self.containers if isinstance(c, nn.Module)]  # their train/eval flags
        # a module whose __init__ skipped nn.Module's (mlx-lm's recurrent_gemma) has no flag: True, as made
        self._get = _TRAINING if all("_training" in vars(m) for m in self.modules) else _training_or_true

    def _walk(self, c: Any, prefix: str) -> None:
        self.containers.append(c)
        self.sizes.append(len(c))
        if isinstance(c, nn.Module):
            items = [(k, v) for k, v in c.items() if _valid(k, v)]
        elif isinstance(c, dict):
            items = [(k, v) for k, v in c.items() if isinstance(v, dict | list | mx.array)]
        else:  # list
            items = [(i, v) for i, v in enumerate(c) if isinstance(v, dict | list | mx.array)]
        for k, v in items:
            path = f"{prefix}.{k}" if prefix else str(k)
            if isinstance(v, mx.array):
                self.names.append(path)
                self.leaf_in.append(c)
                self.leaf_key.append(k)
            else:
                self.parents.append(c)
                self.keys.append(k)
                self.children.append(v)
                self._walk(v, path)

    def valid(self) -> bool:
        if list(map(len, self.containers)) != self.sizes:
            return False
        try:
            return all(map(operator.is_, map(operator.getitem, self.parents, self.keys), self.children))
        except (KeyError, IndexError):  # pragma: no cover - a size change is seen first
            return False

    def read(self) -> list[Any]:
        return list(map(operator.getitem, self.leaf_in, self.leaf_key))

    def modes(self) -> tuple[bool, ...]:
        return tuple(map(self._get, self.modules))


def _training_or_true(m: nn.Module) -> bool:
    return bool(getattr(m, "_training", True))


_TRAINING = operator.attrgetter("_training")  # nn.Module.training's field: no property call


class ParamGatherer:
    """``gather()`` returns ``(params, signature)``: the module's parameters by path, as
    ``dict(tree_flatten(module.parameters()))`` would, and their :class:`ParamSig`.

    The returned dict is shared between calls while the parameters do not change: read
    it, do not modify it (``rebind`` updates it in place).
    """

    def __init__(self, module: nn.Module, name: str = "module", frozen: bool = False):
        self.module = module
        self.name = name
        self.frozen = frozen
        self._checked = False  # frozen: the last result stands
        self._rebound = False  # rebind changed the dict last handed out, in place
        self._plan: _Plan | None = None
        self._exact = True  # the walker reproduces parameters(); else always fall back
        self._arrays: list[Any] = []
        self._params: dict[str, mx.array] = {}
        self._sig = ParamSig()
        self._modes: tuple[bool, ...] = ()

    def modes(self) -> tuple[bool, ...]:
        """Every submodule's ``training`` flag (``model.train()`` / ``model.eval()``),
        in a fixed order: part of the trace cache's key, since a module's forward reads
        it (dropout) and a trace keeps what it read. The same tuple object while nothing
        changed; a frozen gatherer gives what it found when it checked. Called after
        :meth:`gather`, whose plan it reads (about 4 us for 200 submodules)."""
        if self._checked and self._modes:
            return self._modes
        plan = self._plan
        found = (
            plan.modes() if plan is not None else tuple(_training_or_true(m) for _, m in self.module.named_modules())
        )
        if found != self._modes:
            self._modes = found
        return self._modes

    def gather(self) -> tuple[dict[str, mx.array], ParamSig]:
        if self._checked:
            return self._params, self._sig
        params, sig = self._gather()
        if self._rebound and params is self._params:
            # a dict ``rebind`` changed in place: a memo keyed on its identity
            # (Compiled._memo) must miss, so the next call gets a new one
            self._params = params = dict(params)
        self._rebound = False
        self._checked = self.frozen
        return params, sig

    def forget(self) -> None:
        """A frozen gatherer checks the module again at its next call."""
        self._checked = False

    def _gather(self) -> tuple[dict[str, mx.array], ParamSig]:
        plan = self._plan
        if plan is None or not plan.valid():
            return self._rebuild()
        arrays = plan.read()
        if len(arrays) == len(self._arrays):
            same = list(map(operator.is_, arrays, self._arrays))
            if all(same):
                return self._params, self._sig
            if len(self._sig) == len(arrays):
                changed = [i for i, s in enumerate(same) if not s]
                if len(changed) * 4 <= len(arrays) and (hit := self._swap(arrays, changed)) is not None:
                    return hit
        return self._update(plan.names, arrays)

    def rebind(self, arrays: dict[str, mx.array]) -> None:
        """Write ``arrays`` into the module where the parameters of those names live
        (``segc.staging.concat``: weights rebound to views of their concatenation)."""
        if self._plan is None or not self._plan.valid():
            self._rebuild()
        plan = self._plan
        if plan is None:  # an exotic container: the module's own update
            from mlx.utils import tree_unflatten

            self.module.update(tree_unflatten(list(arrays.items())), strict=False)
            return
        where = {n: i for i, n in enumerate(plan.names)}
        for name, a in arrays.items():
            i = where[name]
            old = plan.leaf_in[i][plan.leaf_key[i]]
            plan.leaf_in[i][plan.leaf_key[i]] = a
            # what the last gather handed out follows, so that an array rebound away from
            # is freed now (a concatenation's members, one group at a time), not when the
            # next gather replaces the dict: else the first call holds every member twice
            if i < len(self._arrays) and self._arrays[i] is old and self._params.get(name) is old:
                self._arrays[i] = a
                self._params[name] = a
        self._rebound = True  # the next gather hands out a new dict (see gather)
        self._checked = False  # the arrays a frozen gatherer holds are no longer the module's

    def _swap(self, arrays: list[Any], changed: list[int]) -> tuple[dict[str, mx.array], ParamSig] | None:
        """A few parameters replaced by arrays of the same shape and dtype (an engine
        binding a page of weights into its model): a new dict, the same signature; None
        when any of them differs in shape or dtype (then ``_update`` rebuilds)."""
        params = dict(self._params)
        for i in changed:
            v, (name, shape, dtype) = arrays[i], self._sig[i]
            if not isinstance(v, mx.array) or tuple(v.shape) != shape or dtypes.short(v.dtype) != dtype:
                return None
            params[name] = v
        self._arrays, self._params = arrays, params
        return params, self._sig

    def _rebuild(self) -> tuple[dict[str, mx.array], ParamSig]:
        flat = cast(list[tuple[str, Any]], tree_flatten(self.module.parameters()))
        names = [k for k, _ in flat]
        arrays = [v for _, v in flat]
        if self._exact:
            plan = _Plan(self.module)
            if plan.names == names and all(map(operator.is_, plan.read(), arrays)):
                self._plan = plan
            else:
                self._plan, self._exact = None, False
        return self._update(names, arrays)

    def _update(self, names: list[str], arrays: list[Any]) -> tuple[dict[str, mx.array], ParamSig]:
        old = dict(zip(self._params, self._arrays))
        sig_old = {e[0]: e for e in self._sig}
        entries: list[ParamEntry] = []
        for k, v in zip(names, arrays):
            if old.get(k) is v and k in sig_old:
                entries.append(sig_old[k])
                continue
            if not isinstance(v, mx.array):
                raise TraceError(f"parameter {k!r} of {self.name} is a {type(v).__name__}, not an mx.array")
            entries.append((k, tuple(v.shape), dtypes.short(v.dtype)))
        sig = ParamSig(entries)
        if sig == self._sig:
            sig = self._sig  # keep the object whose hash is cached
        self._arrays = arrays
        self._params = dict(zip(names, arrays))
        self._sig = sig
        return self._params, sig
