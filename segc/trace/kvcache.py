"""mlx-lm's ``KVCache`` and ``RotatingKVCache`` as dynamic state (``state.StateKind``).

``KVCache`` (any token count) and ``RotatingKVCache`` (one token at a time) keep
mlx-lm's own buffer layout (capacity grown in steps of 256 exactly as mlx-lm grows it,
on the host, before the call), but the write position is an ``int32`` array input: the
write is a ``DynamicSliceUpdate`` and attention runs over the whole buffer with an array
mask that hides the unwritten tail. The signature holds the buffer's shape, not the
offset, so a decode loop traces once per buffer capacity, not once per token.

A ``RotatingKVCache`` prefill (more than one token), a model that reads a host integer
(``cache.size()``) or writes twice in one call raises ``NeedsExact``: that object is
then traced in exact mode. Every other mlx-lm cache is recognised as state and traced
in exact mode.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import mlx.core as mx

from .. import dtypes, hostints
from ..backend import on_cuda
from ..errors import StateError
from ..settings import env_choice
from .state import (
    Commit,
    NeedsExact,
    NeedsGrowth,
    Record,
    Slot,
    StateKind,
    aval,
    recognize,
    register_kind,
    run_eagerly,
)


@functools.cache
def _mlx_lm_cache_types() -> dict[str, type]:
    """mlx-lm's cache classes by name, looked up once (none without mlx-lm): these
    checks run for every state object of every call."""
    try:
        from mlx_lm.models import cache
    except ImportError:  # pragma: no cover - mlx-lm is an extra
        return {}
    names = ("_BaseCache", "KVCache", "RotatingKVCache", "QuantizedKVCache")
    return {n: getattr(cache, n) for n in names if hasattr(cache, n)}


def _is_mlx_lm_cache(x: Any) -> bool:
    base = _mlx_lm_cache_types().get("_BaseCache")
    return base is not None and isinstance(x, base)


def _is_exactly(obj: Any, cls: type) -> bool:
    return type(obj) is cls  # a subclass may write its cache differently: exact mode


def _kv_classes() -> tuple[type | None, type | None]:
    types = _mlx_lm_cache_types()
    return types.get("KVCache"), types.get("RotatingKVCache")


_POSITIONS: dict[int, mx.array] = {}


def position(n: int) -> mx.array:
    """``n`` as an ``int32`` array, one object for every cache of a call: a decode step's
    caches share their offset, so a model of many layers makes one array per call
    instead of one per cache (each is a host allocation and, on a GPU, a transfer).
    Arrays are immutable, so sharing them changes nothing; a few are kept.

    With ``SEGC_DEVICE_POSITION=1`` on CUDA the array is the last element of a 16-byte
    array a kernel makes on the device (``arange``), not a host-made scalar: MLX's CUDA build keeps arrays of 8 bytes
    or fewer in a managed-memory pool the host writes, and every decode layer's kernel
    reads the offset (``docs/gpu.md``, "Host reads and managed memory")."""
    a = _POSITIONS.get(n)
    if a is None:  # the setting read here, once an offset: not for every cache of a call
        if len(_POSITIONS) >= 8:
            for old in _POSITIONS.values():
                hostints.forget(old)
            _POSITIONS.clear()
        # on the device: the last of 16 bytes a kernel writes, not MLX's scalar pool (mx.full
        # would broadcast a host scalar, whose buffer is the pool's: measured so, 2026-12-07)
        dev = _device_position()
        a = _POSITIONS[n] = mx.arange(n - 3, n + 1, dtype=mx.int32)[3] if dev else mx.array(n, dtype=mx.int32)
        hostints.remember(a, n)  # the live attention reads n here, not from the device
    return a


def _device_position() -> bool:
    return env_choice("SEGC_DEVICE_POSITION", ("0", "1"), "0") == "1" and on_cuda()


def _kv_slot(index: int, obj: Any, grown: dict[str, Any] | None) -> Slot | None:
    # (this runs for every cache of every call, sixteen or more a decode step, so it
    # builds the slot in one constructor call and reads each attribute once)
    if type(obj) is not _kv_type():
        return None
    keys, values = (grown["keys"], grown["values"]) if grown else (obj.keys, obj.values)
    off = int(obj.offset)
    if keys is None:
        host = {"offset": off, "step": obj.step, "capacity": None}
        return Slot(index, obj, "dynamic", "kv", [position(off)], ["offset"], ("KVCache", None), host)
    ka, va = aval(keys), aval(values)
    ks, vs = ka[0], va[0]
    if len(ks) != 4 or len(vs) != 4:
        raise StateError(f"state[{index}]: KVCache buffers must be 4-d, got {ks} and {vs}")
    return _full_slot(index, obj, keys, values, off, ("KVCache", ka, va))


def _full_slot(index: int, obj: Any, keys: mx.array, values: mx.array, off: int, key: tuple) -> Slot:
    """The slot of a KV cache holding 4-d buffers (``key``: their avals), at offset ``off``."""
    cap = key[1][0][2]
    if off > cap:
        raise StateError(f"state[{index}]: KVCache offset {off} exceeds its buffer ({cap} positions)")
    host = {"offset": off, "step": obj.step, "capacity": cap}
    return Slot(index, obj, "dynamic", "kv", [keys, values, position(off)], ["keys", "values", "offset"], key, host)


def _kv_rebind(start: int, objs: Sequence[Any], keys: Sequence[tuple]) -> list[Slot] | None:
    """The slots ``_kv_slot`` would make for a repeated call's KV caches ``objs`` (indices
    from ``start``) whose last slots had ``keys``; None where a key would differ now.

    A decode step has a cache a layer, so this is the part of a cached call's path that
    grows with the model's depth: the buffers' shapes and dtypes are compared with the
    key's instead of a new key built and compared (``fastpath.match``)."""
    KV, short = _kv_type(), dtypes.short
    out: list[Slot] = []
    for i, (obj, key) in enumerate(zip(objs, keys), start):
        if type(obj) is not KV:
            return None
        if len(key) != 3:  # an empty cache's key (a prefill's first chunk): the general slot
            s = _kv_slot(i, obj, None)
            if s is None or s.key != key:
                return None
            out.append(s)
            continue
        keys_, values = obj.keys, obj.values
        ka, va = key[1], key[2]
        if keys_ is None or keys_.shape != ka[0] or values.shape != va[0]:
            return None
        if short(keys_.dtype) != ka[1] or short(values.dtype) != va[1]:
            return None
        out.append(_full_slot(i, obj, keys_, values, int(obj.offset), key))
    return out


@functools.cache
def _kv_type() -> Any:  # (Any: mypy would narrow obj to this type's "object" after the test)
    return _kv_classes()[0]


def _rot_slot(index: int, obj: Any, grown: dict[str, Any] | None) -> Slot | None:
    """A one-token RotatingKVCache write, mirroring ``_update_in_place`` on the host."""
    _, Rot = _kv_classes()
    if Rot is None or not _is_exactly(obj, Rot) or obj.keys is None:
        return None
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
    s.key = ("RotatingKVCache", aval(keys), aval(values), keep, max_size)
    s.inputs = [keys, values, position(prev), position(idx)]
    s.names = ["keys", "values", "offset", "idx"]
    return s


def _zeros_like_step(x: mx.array, n: int, step: int) -> mx.array:
    b, h, _, d = x.shape
    return mx.zeros((b, h, ((step + n - 1) // step) * step, d), x.dtype)


def _kv_standin(slot: Slot, arrays: list[mx.array], rec: Record) -> tuple[type, dict]:
    KV, _ = _kv_classes()
    assert KV is not None
    it = iter(arrays)
    d: dict[str, Any] = {}
    if slot.host["capacity"] is None:
        d["keys"] = d["values"] = None
    else:
        d["keys"], d["values"] = next(it), next(it)
    d["offset"] = next(it)
    d["_segc"] = (slot, rec)
    return _make_dyn_kv(), d


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
        raise NeedsExact(self._segc[0].index, "the model reads cache.size() (a host integer)")

    def is_trimmable(self) -> bool:
        return False


@functools.cache  # made on first use: importing segc does not import mlx-lm
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
                raise NeedsExact(slot.index, "update_and_fetch called twice in one call")
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
                raise NeedsGrowth(slot.index, n)
            return self._write(keys, values, self.offset, n)

        def make_mask(self, n: int, return_array: bool = False, window_size: int | None = None) -> Any:
            if self.keys is None:  # empty: mlx-lm's own mask ("causal", None or an array)
                from mlx_lm.models.cache import create_attention_mask

                return create_attention_mask(n, 0, return_array, window_size)
            return _dyn_mask(self.offset, n, self._cap(n), window_size)

    return DynKV


@functools.cache
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
                raise NeedsExact(slot.index, "a RotatingKVCache write of more than one token")
            return self._write(keys, values, self._segc_idx, 1)

        def make_mask(self, n: int, window_size: int | None = None, return_array: bool = False) -> mx.array:
            slot, _ = self._segc
            if n != 1:
                raise NeedsExact(slot.index, "a RotatingKVCache mask for more than one token")
            if window_size is not None and window_size < slot.host["max_size"]:
                raise NeedsExact(slot.index, "a sliding window smaller than the RotatingKVCache")
            cap = int(self.keys.shape[2])
            # valid positions after this call's write: min(offset + 1, cap) of them
            k = mx.arange(cap, dtype=mx.int32)[None]
            return k < mx.minimum(self.offset + 1, cap)

    return DynRot


def _rot_standin(slot: Slot, arrays: list[mx.array], rec: Record) -> tuple[type, dict]:
    d = dict(vars(slot.obj))
    d["keys"], d["values"], d["offset"], d["_segc_idx"] = arrays
    d["_segc"] = (slot, rec)
    return _make_dyn_rot(), d


def _needs_growth(slot: Slot, plan: Commit) -> bool:
    cap = slot.host["capacity"]
    return bool(plan.n) and cap is not None and slot.host["offset"] + plan.n > cap


def _grow_slot(slot: Slot, n: int) -> dict[str, Any] | None:
    cap = slot.host["capacity"]
    if cap is None or slot.host["offset"] + n <= cap:
        return None
    return grow(slot.obj, n)


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


def _commit(slot: Slot, plan: Commit, outs: list[mx.array]) -> None:
    """Write the call's new buffers and offset into the caller's cache."""
    obj = slot.obj
    if not plan.n:
        if slot.kind == "kv" and slot.host["capacity"] is not None and slot.inputs[0] is not obj.keys:
            obj.keys, obj.values = slot.inputs[0], slot.inputs[1]
        return
    obj.keys, obj.values = outs
    obj.offset = slot.host["offset"] + plan.n
    if plan.kind == "rotating":
        obj._idx = slot.host["idx"] + plan.n


def _donate(slot: Slot, plan: Commit) -> bool:
    if not plan.n or len(slot.inputs) < 2:
        return False
    slot.inputs.clear()
    slot.obj.keys = slot.obj.values = None
    slot.host["donated"] = ("keys", "values")
    return True


def _quantized(obj: Any) -> str | None:
    if type(obj) is not _mlx_lm_cache_types().get("QuantizedKVCache"):
        return None
    return "a QuantizedKVCache has no dynamic stand-in yet, and exact mode keys on its offset (a trace per token)"


recognize(_is_mlx_lm_cache)
run_eagerly(_quantized)
register_kind(StateKind("kv", _kv_slot, _kv_standin, _commit, _needs_growth, _grow_slot, _donate, _kv_rebind))
register_kind(StateKind("rotating", _rot_slot, _rot_standin, _commit, donate=_donate))
