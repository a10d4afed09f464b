"""State: objects a traced function mutates (mlx-lm KV caches), functionalized.

A *state object* is found among the call's arguments (any mlx-lm cache: an object
with ``update_and_fetch``, or a class given to :func:`register`) or named explicitly
with ``segc.jit(fn, state=[...])`` when ``fn`` captures it. For the trace its arrays
become graph inputs of kind ``"state"``; its final arrays become extra graph outputs;
its Python attributes (``offset``) are advanced on the host. Nothing is written into
the caller's objects until the call has run: a call that fails leaves them untouched.

Two modes per object (:class:`Slot`):

``dynamic``
    for mlx-lm's ``KVCache`` (any token count) and ``RotatingKVCache`` (one token at a
    time). The cache keeps mlx-lm's own buffer layout (capacity grown in steps of 256
    exactly as mlx-lm grows it, on the host, before the call), but the write position
    is an ``int32`` array input: the write is a ``DynamicSliceUpdate`` and attention
    runs over the whole buffer with an array mask that hides the unwritten tail. The
    signature holds the buffer's shape, not the offset, so a decode loop traces once
    per buffer capacity, not once per token.
``exact``
    for every other cache (and for a ``RotatingKVCache`` prefill): the object is
    shallow-copied with its arrays replaced by graph inputs and the model's own code
    runs on the copy; its non-array attributes are part of the signature (so a new
    offset traces again) and their values after the trace are copied back.

During the trace, each object is swapped in place (``__class__`` and ``__dict__``)
for its traced stand-in and restored afterwards, so functions that capture the
object see the stand-in too.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from . import dtypes
from .errors import StateError

_MARK = "\x00segc.state#"


class _Grow(Exception):
    """Raised during a trace: the dynamic cache must grow (on the host) first."""

    def __init__(self, slot: int, n: int, k: mx.array, v: mx.array):
        self.slot, self.n, self.k, self.v = slot, n, k, v


class _Exact(Exception):
    """Raised during a trace: this slot cannot be traced dynamically; use exact mode."""

    def __init__(self, slot: int, why: str):
        self.slot, self.why = slot, why


def _aval(x: mx.array) -> tuple[tuple[int, ...], str]:
    return tuple(x.shape), dtypes.short(x.dtype)


def _cache_types() -> tuple[type, ...]:
    try:
        from mlx_lm.models.cache import _BaseCache
    except ImportError:  # pragma: no cover - mlx-lm is an extra
        return ()
    return (_BaseCache,)


_REGISTERED: list[type] = []


def register(cls: type) -> type:
    """Treat instances of ``cls`` found in a call's arguments as state (exact mode)."""
    _REGISTERED.append(cls)
    return cls


def is_state(x: Any) -> bool:
    if isinstance(x, mx.array | type):
        return False
    if isinstance(x, (*_cache_types(), *_REGISTERED)):
        return True
    if not hasattr(x, "__dict__") or isinstance(x, nn.Module):
        return False
    # an mlx-lm-style cache: update_and_fetch, or a `state` property
    return callable(getattr(x, "update_and_fetch", None)) or isinstance(getattr(type(x), "state", None), property)


def children(obj: Any) -> list[Any]:
    """State objects held by a container state object (mlx-lm's ``CacheList``)."""
    out: list[Any] = []
    for v in vars(obj).values():
        if isinstance(v, tuple | list) and v and all(is_state(c) for c in v):
            out.extend(v)
    return out


def extract(tree: Any, found: list[Any]) -> Any:
    """``tree`` with every state object replaced by a static marker string."""
    if isinstance(tree, tuple | list):
        out = [extract(v, found) for v in tree]
        return tuple(out) if isinstance(tree, tuple) else out
    if isinstance(tree, dict):
        return {k: extract(v, found) for k, v in tree.items()}
    if is_state(tree):
        for i, o in enumerate(found):
            if o is tree:
                return f"{_MARK}{i}"
        found.append(tree)
        mark = f"{_MARK}{len(found) - 1}"
        extract(children(tree), found)
        return mark
    return tree


def restore(tree: Any, objs: list[Any]) -> Any:
    """Put the state objects back where :func:`extract` left markers."""
    if isinstance(tree, tuple | list):
        out = [restore(v, objs) for v in tree]
        return tuple(out) if isinstance(tree, tuple) else out
    if isinstance(tree, dict):
        return {k: restore(v, objs) for k, v in tree.items()}
    if isinstance(tree, str) and tree.startswith(_MARK):
        return objs[int(tree[len(_MARK) :])]
    return tree


# --------------------------------------------------------------------------- slots


@dataclass
class Slot:
    """One state object in one call: its mode, the arrays it feeds the graph, its key."""

    index: int
    obj: Any
    mode: str  # "dynamic" | "exact"
    kind: str  # "kv" | "rotating" | "exact"
    inputs: list[mx.array] = field(default_factory=list)
    names: list[str] = field(default_factory=list)
    key: tuple = ()
    host: dict[str, Any] = field(default_factory=dict)  # host values for the trace and commit


def _kv_classes() -> tuple[type | None, type | None]:
    try:
        from mlx_lm.models.cache import KVCache, RotatingKVCache
    except ImportError:  # pragma: no cover
        return None, None
    return KVCache, RotatingKVCache


def make_slot(index: int, obj: Any, *, exact: bool, grown: dict[str, Any] | None = None) -> Slot:
    """Decide the slot's mode and collect its graph inputs (``grown`` replaces buffers)."""
    KV, Rot = _kv_classes()
    t = type(obj)
    kids = children(obj)
    if kids:  # a container: its children are slots of their own; it has no arrays
        s = Slot(index, obj, "exact", "container")
        s.key = (t.__qualname__, len(kids))
        return s
    if not exact and KV is not None and t is KV:
        return _kv_slot(index, obj, grown)
    if not exact and Rot is not None and t is Rot and obj.keys is not None:
        return _rot_slot(index, obj, grown)
    return _exact_slot(index, obj)


def _kv_slot(index: int, obj: Any, grown: dict[str, Any] | None) -> Slot:
    keys, values = (grown["keys"], grown["values"]) if grown else (obj.keys, obj.values)
    off = int(obj.offset)
    s = Slot(index, obj, "dynamic", "kv")
    s.host = {"offset": off, "step": obj.step}
    if keys is None:
        s.key = ("KVCache", None)
    else:
        if keys.ndim != 4 or values.ndim != 4:
            raise StateError(f"state[{index}]: KVCache buffers must be 4-d, got {keys.shape} and {values.shape}")
        if off > keys.shape[2]:
            raise StateError(f"state[{index}]: KVCache offset {off} exceeds its buffer ({keys.shape[2]} positions)")
        s.key = ("KVCache", _aval(keys), _aval(values))
        s.inputs += [keys, values]
        s.names += ["keys", "values"]
    s.inputs.append(mx.array(off, dtype=mx.int32))
    s.names.append("offset")
    return s


def _rot_slot(index: int, obj: Any, grown: dict[str, Any] | None) -> Slot:
    """A one-token RotatingKVCache write, mirroring ``_update_in_place`` on the host."""
    keys, values = obj.keys, obj.values
    prev, idx = int(obj.offset), int(obj._idx)
    max_size, keep, step = int(obj.max_size), int(obj.keep), int(obj.step)
    if prev >= keys.shape[2] and keys.shape[2] < max_size:
        new_size = min(step, max_size - prev)
        b, h, _, dk = keys.shape
        keys = mx.concatenate([keys, mx.zeros((b, h, new_size, dk), keys.dtype)], axis=2)
        values = mx.concatenate([values, mx.zeros((b, h, new_size, values.shape[3]), values.dtype)], axis=2)
        idx = prev
    trim = keys.shape[2] - max_size
    if trim > 0:
        keys = obj._trim(trim, keys)
        values = obj._trim(trim, values)
        idx = max_size
    if idx == max_size:
        idx = keep
    s = Slot(index, obj, "dynamic", "rotating")
    s.host = {"offset": prev, "idx": idx, "max_size": max_size}
    s.key = ("RotatingKVCache", _aval(keys), _aval(values), keep, max_size)
    s.inputs = [keys, values, mx.array(prev, dtype=mx.int32), mx.array(idx, dtype=mx.int32)]
    s.names = ["keys", "values", "offset", "idx"]
    return s


def _static(v: Any, where: str) -> Any:
    if v is None or isinstance(v, bool | int | float | str):
        return v
    if isinstance(v, tuple | list) and all(x is None or isinstance(x, bool | int | float | str) for x in v):
        return tuple(v)
    raise StateError(
        f"{where} is a {type(v).__name__}; segc functionalizes state attributes that are "
        "mx.arrays, lists of mx.arrays, or hashable scalars"
    )


def _exact_slot(index: int, obj: Any) -> Slot:
    s = Slot(index, obj, "exact", "exact")
    key: list[Any] = [type(obj).__qualname__]
    for name, v in sorted(vars(obj).items()):
        where = f"state[{index}] ({type(obj).__name__}).{name}"
        if isinstance(v, mx.array):
            key.append((name, "array", _aval(v)))
            s.inputs.append(v)
            s.names.append(name)
        elif isinstance(v, list | tuple) and v and any(isinstance(x, mx.array) for x in v):
            shape: list[Any] = []
            for i, x in enumerate(v):
                if isinstance(x, mx.array):
                    shape.append(_aval(x))
                    s.inputs.append(x)
                    s.names.append(f"{name}[{i}]")
                else:
                    shape.append(("static", _static(x, f"{where}[{i}]")))
            key.append((name, type(v).__name__, tuple(shape)))
        else:
            key.append((name, "static", _static(v, where)))
    s.key = tuple(key)
    return s


# --------------------------------------------------------------------------- stand-ins


def _zeros_like_step(x: mx.array, n: int, step: int) -> mx.array:
    b, h, _, d = x.shape
    return mx.zeros((b, h, ((step + n - 1) // step) * step, d), x.dtype)


class _Record:
    """What a stand-in did during the trace (filled in by the stand-in)."""

    def __init__(self) -> None:
        self.n = 0  # tokens written
        self.outputs: list[str] = []  # attribute names of the state's arrays after the call
        self.statics: dict[str, Any] = {}  # exact mode: non-array attributes after the call


def _kv_standin(slot: Slot, arrays: list[mx.array], rec: _Record) -> tuple[type, dict]:
    KV, _ = _kv_classes()
    assert KV is not None
    it = iter(arrays)
    d: dict[str, Any] = {}
    if slot.key[1] is None:
        d["keys"] = d["values"] = None
    else:
        d["keys"], d["values"] = next(it), next(it)
    d["offset"] = next(it)
    d["_segc"] = (slot, rec)
    return _DynKV, d


def _dyn_mask(offset: mx.array, n: int, cap: int, window_size: int | None) -> mx.array:
    q = offset + mx.arange(n, dtype=mx.int32)[:, None]
    k = mx.arange(cap, dtype=mx.int32)[None]
    mask = q >= k
    if window_size is not None:
        mask = mask & (q < k + window_size)
    return mask


class _StandIn:
    """What the KVCache and RotatingKVCache stand-ins share: the array-offset write, the
    whole-buffer fetch, and refusing what would read a host integer."""

    keys: Any
    values: Any
    _segc: Any

    def _write(self, keys: mx.array, values: mx.array, at: Any, n: int) -> tuple[mx.array, mx.array]:
        _, rec = self._segc
        self.keys = mx.slice_update(self.keys, keys, at, axes=(2,))
        self.values = mx.slice_update(self.values, values, at, axes=(2,))
        rec.n = n
        rec.outputs = ["keys", "values"]
        return self.keys, self.values

    def keys_and_values(self) -> tuple[mx.array, mx.array]:
        return self.keys, self.values

    def size(self) -> int:
        raise _Exact(self._segc[0].index, "the model reads cache.size() (a host integer)")

    def is_trimmable(self) -> bool:
        return False


def _make_dyn_kv() -> type:
    KV, _ = _kv_classes()
    base: type = KV if KV is not None else object

    class DynKV(_StandIn, base):  # type: ignore[valid-type, misc]
        """KVCache stand-in: array offset, DynamicSliceUpdate write, whole-buffer fetch."""

        offset: Any

        def _cap(self, n: int) -> int:
            slot, _ = self._segc
            if self.keys is None:
                return ((slot.host["step"] + n - 1) // slot.host["step"]) * slot.host["step"]
            return int(self.keys.shape[2])

        def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
            slot, rec = self._segc
            n = keys.shape[2]
            if rec.n:
                raise _Exact(slot.index, "update_and_fetch called twice in one call")
            if self.keys is None:
                # an empty cache: the prefill graph is traced per prompt length anyway, so
                # do exactly what mlx-lm does (static write, fetch of the first n positions)
                k = _zeros_like_step(keys, n, slot.host["step"])
                v = _zeros_like_step(values, n, slot.host["step"])
                k[..., :n, :] = keys
                v[..., :n, :] = values
                self.keys, self.values = k, v
                rec.n = n
                rec.outputs = ["keys", "values"]
                if n < k.shape[2]:
                    return k[..., :n, :], v[..., :n, :]
                return k, v
            if slot.host["offset"] + n > self.keys.shape[2]:
                raise _Grow(slot.index, n, keys, values)
            return self._write(keys, values, self.offset, n)

        def make_mask(self, n: int, return_array: bool = False, window_size: int | None = None) -> Any:
            if self.keys is None:  # empty: mlx-lm's own mask ("causal", None or an array)
                from mlx_lm.models.cache import create_attention_mask

                return create_attention_mask(n, 0, return_array, window_size)
            return _dyn_mask(self.offset, n, self._cap(n), window_size)

    return DynKV


def _make_dyn_rot() -> type:
    _, Rot = _kv_classes()
    base: type = Rot if Rot is not None else object

    class DynRot(_StandIn, base):  # type: ignore[valid-type, misc]
        """RotatingKVCache stand-in for one-token writes at an array slot index."""

        offset: Any
        _segc_idx: Any

        def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
            slot, rec = self._segc
            if keys.shape[2] != 1 or rec.n:
                raise _Exact(slot.index, "a RotatingKVCache write of more than one token")
            return self._write(keys, values, self._segc_idx, 1)

        def make_mask(self, n: int, window_size: int | None = None, return_array: bool = False) -> mx.array:
            slot, _ = self._segc
            if n != 1:
                raise _Exact(slot.index, "a RotatingKVCache mask for more than one token")
            if window_size is not None and window_size < slot.host["max_size"]:
                raise _Exact(slot.index, "a sliding window smaller than the RotatingKVCache")
            cap = int(self.keys.shape[2])
            # valid positions after this call's write: min(offset + 1, cap) of them
            k = mx.arange(cap, dtype=mx.int32)[None]
            return k < mx.minimum(self.offset + 1, cap)

    return DynRot


_DynKV = _make_dyn_kv()
_DynRot = _make_dyn_rot()


def _rot_standin(slot: Slot, arrays: list[mx.array], rec: _Record) -> tuple[type, dict]:
    d = dict(vars(slot.obj))
    d["keys"], d["values"], d["offset"], d["_segc_idx"] = arrays
    d["_segc"] = (slot, rec)
    return _DynRot, d


def _exact_standin(slot: Slot, arrays: list[mx.array], rec: _Record) -> tuple[type, dict]:
    d = snapshot(slot.obj)
    for name, a in zip(slot.names, arrays):
        if "[" in name:
            base, i = name[:-1].split("[")
            seq = d[base]
            if isinstance(seq, tuple):
                seq = list(seq)
            seq[int(i)] = a
            d[base] = seq if isinstance(vars(slot.obj)[base], list) else tuple(seq)
        else:
            d[name] = a
    return type(slot.obj), d


_STANDINS: dict[str, Callable[[Slot, list[mx.array], _Record], tuple[type, dict]]] = {
    "kv": _kv_standin,
    "rotating": _rot_standin,
    "exact": _exact_standin,
}


@contextmanager
def swapped(slots: list[Slot], arrays: list[list[mx.array]]) -> Iterator[list[_Record]]:
    """Swap each state object for its traced stand-in (in place); restore on exit."""
    saved = []
    recs = []
    try:
        for s, arrs in zip(slots, arrays):
            rec = _Record()
            recs.append(rec)
            if s.kind == "container":
                continue
            cls, d = _STANDINS[s.kind](s, arrs, rec)
            saved.append((s.obj, s.obj.__class__, s.obj.__dict__))
            s.obj.__dict__ = d
            if cls is not s.obj.__class__:
                s.obj.__class__ = cls
        yield recs
    finally:
        for obj, cls, d in reversed(saved):
            if obj.__class__ is not cls:
                obj.__class__ = cls
            obj.__dict__ = d


def outputs_after(slot: Slot, rec: _Record) -> list[mx.array]:
    """The stand-in's arrays after the traced call (read before :func:`swapped` exits)."""
    d = vars(slot.obj)
    if slot.kind == "container":
        return []
    if slot.kind != "exact":
        if not rec.n:
            rec.outputs = []
        return [d[k] for k in rec.outputs]
    outs: list[mx.array] = []
    rec.outputs, rec.statics = [], {}
    for name, v in d.items():
        where = f"state[{slot.index}] ({type(slot.obj).__name__}).{name} after the call"
        if isinstance(v, mx.array):
            rec.outputs.append(name)
            outs.append(v)
        elif isinstance(v, list | tuple) and any(isinstance(x, mx.array) for x in v):
            rec.statics[name] = copy.copy(v)
            for i, x in enumerate(v):
                if isinstance(x, mx.array):
                    rec.outputs.append(f"{name}[{i}]")
                    outs.append(x)
        else:
            _static(v, where)
            rec.statics[name] = v
    return outs


@dataclass(frozen=True)
class Commit:
    """How to write one slot's graph outputs back into the caller's object."""

    kind: str
    outputs: tuple[str, ...]
    n: int
    statics: tuple[tuple[str, Any], ...] = ()


def commit_plan(slot: Slot, rec: _Record) -> Commit:
    return Commit(slot.kind, tuple(rec.outputs), rec.n, tuple(rec.statics.items()))


def needs_growth(slot: Slot, plan: Commit) -> bool:
    if slot.kind != "kv" or not plan.n or slot.key[1] is None:
        return False
    return bool(slot.host["offset"] + plan.n > slot.key[1][0][2])


def grow(obj: Any, n: int, keys: mx.array | None = None, values: mx.array | None = None) -> dict[str, Any]:
    """The buffers an mlx-lm KVCache would hold after growing for ``n`` more tokens."""
    prev, step = int(obj.offset), int(obj.step)
    k_old, v_old = obj.keys, obj.values
    ref_k = keys if keys is not None else k_old
    ref_v = values if values is not None else v_old
    new_k = _zeros_like_step(ref_k, n, step)
    new_v = _zeros_like_step(ref_v, n, step)
    if k_old is None:
        return {"keys": new_k, "values": new_v}
    if prev % step != 0:
        k_old, v_old = k_old[..., :prev, :], v_old[..., :prev, :]
    return {"keys": mx.concatenate([k_old, new_k], axis=2), "values": mx.concatenate([v_old, new_v], axis=2)}


def commit(slot: Slot, plan: Commit, outs: list[mx.array]) -> None:
    """Write the call's results into the caller's state object."""
    obj = slot.obj
    if plan.kind == "container":
        return
    if plan.kind == "exact":
        d = dict(plan.statics)
        for name, a in zip(plan.outputs, outs):
            if "[" in name:
                base, i = name[:-1].split("[")
                seq = d[base]
                if isinstance(seq, tuple):
                    seq = list(seq)
                    seq[int(i)] = a
                    d[base] = tuple(seq)
                else:
                    seq[int(i)] = a
            else:
                d[name] = a
        for k in list(vars(obj)):
            if k not in d:
                delattr(obj, k)
        obj.__dict__.update(d)
        return
    if not plan.n:
        if slot.kind == "kv" and slot.key[1] is not None and slot.inputs[0] is not obj.keys:
            obj.keys, obj.values = slot.inputs[0], slot.inputs[1]
        return
    obj.keys, obj.values = outs
    obj.offset = slot.host["offset"] + plan.n
    if plan.kind == "rotating":
        obj._idx = slot.host["idx"] + plan.n


# --------------------------------------------------------------------------- validation


def _fresh(v: Any) -> Any:
    if isinstance(v, mx.array):
        return mx.array(v)
    if isinstance(v, list | tuple):
        out = [_fresh(x) for x in v]
        return out if isinstance(v, list) else tuple(out)
    return v


def fresh_attrs(obj: Any) -> dict[str, Any]:
    """A state object's attributes with every array a new ``mx.array`` object (eager
    ``a[...] = b`` rebinds the object it is called on) and lists copied, so code can
    mutate the object without touching the arrays the caller holds. Nested state
    objects are kept: they are state objects of the call themselves."""
    return {k: _fresh(v) for k, v in vars(obj).items()}


def snapshot(obj: Any) -> dict[str, Any]:
    """The attributes of a state object, lists copied, for :func:`roll_back`."""
    return {k: list(v) if isinstance(v, list) else v for k, v in vars(obj).items()}


def roll_back(obj: Any, snap: dict[str, Any]) -> None:
    obj.__dict__.clear()
    obj.__dict__.update(snap)


def observable(obj: Any) -> list[Any]:
    """What a caller can read of a cache: its offset and its ``state`` arrays."""
    out: list[Any] = [getattr(obj, "offset", None)]
    try:
        st = obj.state
    except Exception:  # a cache without a readable state: the offset must do
        return out
    stack = [st]
    while stack:
        x = stack.pop()
        if isinstance(x, list | tuple):
            stack.extend(reversed(x))
        else:
            out.append(x)
    return out
