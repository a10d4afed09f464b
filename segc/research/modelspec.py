"""An mlx-lm architecture named by a spec, ``llama:layers=4,hidden=256,bits=4``: the one
parser and builder that every ``segc`` subcommand's targets (``segc.cli.target``) and the
experiment harness's models (``models.load_model``) share, so one spec builds one model
everywhere, and a plan saved by ``segc experiment`` re-applies with ``segc passes
--plan-in`` on the same spec.

A spec is an architecture of mlx-lm's (a module of ``mlx_lm.models``) with a tiny random
configuration (``segc.models.zoo``), optionally resized by ``KEY=VALUE`` items: the short
names of :data:`ALIASES` (``layers``, ``hidden``, ...) or any field of the architecture's
``ModelArgs``; ``dtype``; ``bits`` and ``group`` (quantized as mlx-lm does). A resized
hidden size without an intermediate size gets four times the hidden size. Unknown keys,
values of the wrong type and sizes below 1 are refused with a
:class:`~segc.errors.UsageError` naming the key. Nothing here imports mlx or mlx-lm at
import time.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import typing
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import UsageError

# quantized as mlx-lm quantizes (affine): bits, and the group size (zoo.build's 32 by default)
QUANT_KEYS = {"bits": (2, 3, 4, 5, 6, 8), "group": (32, 64, 128)}
# short names for configuration fields
ALIASES = {
    "layers": "num_hidden_layers",
    "hidden": "hidden_size",
    "intermediate": "intermediate_size",
    "heads": "num_attention_heads",
    "kv_heads": "num_key_value_heads",
    "vocab": "vocab_size",
    "head_dim": "head_dim",
}
FLOAT_DTYPES = ("float32", "float16", "bfloat16")


def choice_error(what: str, got: str, choices: Iterable[str]) -> UsageError:
    return UsageError(f"no {what} {got!r}; choose from: {', '.join(choices)}")


def architectures() -> list[str]:
    """mlx-lm's architecture modules, listed without importing mlx-lm."""
    spec = importlib.util.find_spec("mlx_lm")
    if spec is None or not spec.submodule_search_locations:
        return []
    models = Path(next(iter(spec.submodule_search_locations))) / "models"
    return sorted(p.stem for p in models.glob("*.py") if "class ModelArgs" in p.read_text(errors="replace"))


def check_arch(name: str) -> str:
    archs = architectures()
    if not archs:
        raise UsageError("architecture targets need mlx-lm, which is not installed: pip install 'segc[lm]'")
    if name not in archs:
        raise choice_error("mlx-lm architecture", name, archs)
    return name


@dataclass(frozen=True)
class ArchSpec:
    """A parsed spec: the architecture, its ``ModelArgs`` fields, quantization
    (``bits``, ``group_size``) and dtype (None: float32, or the caller's)."""

    name: str
    fields: dict[str, Any] = field(default_factory=dict)
    quant: dict[str, int] = field(default_factory=dict)
    dtype: str | None = None
    label: str = ""


def parse_arch(name: str, config: str = "", *, dtype: str | None = None) -> ArchSpec:
    """``name`` with the ``KEY=VALUE`` items of ``config`` (comma separated); ``dtype``
    is the default a ``dtype=`` item overrides."""
    from ..models.zoo import model_classes, tiny_config

    check_arch(name)
    defaults = tiny_config(name)
    _, args_cls = model_classes(name)
    declared = {f.name: f for f in dataclasses.fields(args_cls)} if dataclasses.is_dataclass(args_cls) else {}
    known = set(declared) | set(defaults)
    extra: dict[str, Any] = {}
    quant: dict[str, int] = {}
    items = [x.strip() for x in config.split(",") if x.strip()]
    for item in items:
        key, eq, text = (s.strip() for s in item.partition("="))
        if not eq or not key:
            raise UsageError(f"{name}: {item!r} is not field=value (KEY=VALUE, e.g. layers=2)")
        if not text:
            raise UsageError(f"{name}: configuration key {key!r} has no value")
        if key == "dtype":
            if text not in FLOAT_DTYPES:
                raise choice_error("dtype", text, FLOAT_DTYPES)
            dtype = text
        elif key in QUANT_KEYS:  # nn.quantize after building: bits=4[,group=64]
            choices = QUANT_KEYS[key]
            if text not in map(str, choices):
                raise choice_error(f"{name} {key}", text, [str(c) for c in choices])
            quant["bits" if key == "bits" else "group_size"] = int(text)
        else:
            fname = ALIASES.get(key, key)
            if fname not in known:
                raise choice_error(
                    f"{name} configuration key", key, [*ALIASES, "dtype", *QUANT_KEYS, "(any ModelArgs field)"]
                )
            extra[fname] = _typed(name, key, text, declared.get(fname))
    if "group_size" in quant and "bits" not in quant:
        raise UsageError(f"{name}: group= quantizes with bits=; give bits=2, 3, 4, 5, 6 or 8 too")
    if "hidden_size" in extra and "intermediate_size" not in extra and "intermediate_size" in defaults:
        extra["intermediate_size"] = 4 * extra["hidden_size"]
    label = f"{name}:{','.join(items)}" if items else name
    return ArchSpec(name, extra, quant, dtype, label)


def _typed(name: str, key: str, text: str, f: Any) -> Any:
    """``text`` as the value of field ``f`` (its declared type where it has a plain one);
    the sizes of :data:`ALIASES` at least 1."""
    value = _value(text)
    kinds = _kinds(f.type) if f is not None else set()
    if kinds and not any(_fits(value, k) for k in kinds):
        want = " or ".join(sorted(k.__name__ for k in kinds))
        raise UsageError(f"{name} {key}={text}: expected {_article(want)}{want}")
    if float in kinds and int not in kinds and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if str in kinds and not isinstance(value, str):
        value = text
    size = ALIASES.get(key, key) in ALIASES.values()
    if size and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
        raise UsageError(f"{name} {key}={text}: a size must be a whole number of at least 1")
    return value


def _kinds(t: Any) -> set[type]:
    """The plain types (int, float, bool, str) a declared type allows; empty: unchecked."""
    args = typing.get_args(t) if typing.get_origin(t) is typing.Union else (t,)
    kinds = {a for a in args if a is not type(None)}
    return kinds if kinds and kinds <= {int, float, bool, str} else set()


def _fits(value: Any, kind: type) -> bool:
    if kind is bool:
        return isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    return True  # str: any text


def _article(word: str) -> str:
    return "an " if word[0] in "aeiou" else "a "


def _value(text: str) -> Any:
    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            pass
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    return text


def build_arch(spec: ArchSpec, *, seed: int = 0) -> Any:
    """The model of ``spec``, random weights from ``seed``, evaluated. A configuration
    mlx-lm refuses is the user's mistake: a :class:`UsageError` naming the spec."""
    import mlx.core as mx

    from ..models.zoo import build

    dtype = getattr(mx, spec.dtype or "float32")
    try:
        return build(spec.name, seed=seed, dtype=dtype, **spec.quant, **spec.fields)
    except (TypeError, ValueError, KeyError, IndexError, ZeroDivisionError, AssertionError) as exc:
        if not spec.fields:
            raise
        raise UsageError(f"cannot build {spec.label}: {type(exc).__name__}: {exc}") from None
