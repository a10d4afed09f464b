"""Targets: what a subcommand traces. One of

- ``module:function`` or ``path/to/file.py:function``, called with example inputs
  (``--input x=1x128:float32``, one per positional argument, in order); the function may
  also be an ``nn.Module`` instance;
- a built-in mlx-lm architecture with a tiny random configuration, optionally sized:
  ``llama``, ``llama:layers=4,hidden=256`` (called on ``--tokens`` token ids);
- a local mlx-lm model directory (``config.json`` and ``*.safetensors``);
- an IR file (``*.segc``, or any text file starting with ``graph``), run on random
  inputs of its input types; eager MLX there is the IR replayed op by op.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import UsageError
from .common import choice_error, positive_int, read_text, user_code

TARGET_HELP = (
    "module:function, file.py:function, an mlx-lm architecture (llama, llama:layers=4,hidden=256,bits=4), "
    "a local mlx-lm model directory, or an IR file (.segc)"
)

DTYPES = ("float32", "float16", "bfloat16", "int32", "int64", "uint32", "bool")


def add_target_arguments(p: argparse.ArgumentParser, *, optional: bool = False) -> None:
    if optional:
        p.add_argument("target", metavar="TARGET", nargs="?", default=None, help=TARGET_HELP)
    else:
        p.add_argument("target", metavar="TARGET", help=TARGET_HELP)
    g = p.add_argument_group("target options")
    g.add_argument(
        "--input",
        action="append",
        default=[],
        metavar="NAME=SHAPE[:DTYPE]",
        help="an example input of a function target, e.g. x=1x128:float32 (repeat per argument)",
    )
    g.add_argument("--tokens", type=positive_int(), help="prompt length of a model target (default 8)")
    g.add_argument(
        "--boundaries", default="auto", help="'auto' (after each layer of a model), 'none', or globs (layers.*)"
    )
    g.add_argument("--dtype", choices=("float32", "float16", "bfloat16"), help="cast a model target's weights")
    g.add_argument("--seed", type=int, default=0, help="random weights and inputs (default 0)")


def architectures() -> list[str]:
    """mlx-lm's architecture modules, listed without importing mlx-lm."""
    from ..research.modelspec import architectures as archs

    return archs()


def check_arch(name: str) -> str:
    from ..research.modelspec import check_arch as check

    return check(name)


@dataclass
class Target:
    """A loaded target: the callable (None for an IR file), its example arguments, and
    its traced graph (``lowered(strategy)`` places cuts)."""

    spec: str
    kind: str  # "function" | "arch" | "model" | "ir"
    label: str
    fn: Any = None
    args: list[Any] = field(default_factory=list)
    boundaries: Any = None
    graph: Any = None  # the IR file's graph
    _jitted: Any = None

    def jitted(self, **options: Any) -> Any:
        import segc

        if options or self._jitted is None:
            step = segc.jit(self.fn, boundaries=self.boundaries, **options)
            if options:
                return step
            self._jitted = step
        return self._jitted

    def traced_graph(self) -> Any:
        """The graph as traced (cuts at the boundaries, before any strategy)."""
        if self.kind == "ir":
            return self.graph
        return self.jitted().trace(*self.args).graph

    def flat_inputs(self) -> list[Any]:
        """The traced graph's inputs, in order."""
        if self.kind == "ir":
            return random_inputs(self.graph)
        return self.jitted().lower(*self.args).compile().flat_inputs(*self.args)

    def eager(self) -> list[Any]:
        """Eager MLX's outputs, flat (for an IR file: its graph replayed op by op)."""
        import mlx.core as mx

        if self.kind == "ir":
            from ..passes import run_pass
            from ..runtime import Executor

            outs = Executor(run_pass("strip_cuts", self.graph), compile=False)(self.flat_inputs())
        else:
            from ..trace.pytree import flatten

            outs, _, _ = flatten(self.fn(*self.args), what="output")
        mx.eval(outs)
        return list(outs)


def random_inputs(g: Any, seed: int = 0) -> list[Any]:
    """Deterministic inputs of ``g``'s input types: normal floats, small integers."""
    import mlx.core as mx

    keys = mx.random.split(mx.random.key(seed), max(len(g.inputs), 1))
    out = [_random(i.var.shape, i.var.dtype, keys[k]) for k, i in enumerate(g.inputs)]
    mx.eval(out)
    return out


def _random(shape: tuple[int, ...], dtype: str, key: Any) -> Any:
    import mlx.core as mx

    from .. import dtypes

    dt = dtypes.to_mx(dtype) if dtypes.is_dtype_name(dtype) else getattr(mx, dtype)
    if dt == mx.bool_:
        return mx.random.bernoulli(0.5, shape, key=key)
    if mx.issubdtype(dt, mx.integer):
        return mx.random.randint(0, 16, shape, key=key).astype(dt)
    return mx.random.normal(shape, key=key).astype(dt)


def parse_input(text: str) -> tuple[str, tuple[int, ...], str]:
    m = re.fullmatch(r"\s*(\w+)\s*=\s*([0-9x]*)\s*(?::\s*(\w+))?\s*", text)
    if not m or (m.group(2) and not re.fullmatch(r"\d+(x\d+)*", m.group(2))):
        raise UsageError(f"--input {text!r}: expected NAME=SHAPE[:DTYPE], e.g. x=1x128:float32")
    dtype = m.group(3) or "float32"
    if dtype not in DTYPES:
        raise choice_error("dtype", dtype, DTYPES)
    shape = tuple(int(d) for d in m.group(2).split("x")) if m.group(2) else ()
    return m.group(1), shape, dtype


def load(args: argparse.Namespace, spec: str | None = None) -> Target:
    """The target of ``args.target`` (or ``spec``), with the target options applied."""
    spec = spec if spec is not None else args.target
    if spec is None:
        raise UsageError(f"give a TARGET: {TARGET_HELP}")
    boundaries = None if args.boundaries in ("none", "") else args.boundaries
    path = Path(spec)
    if path.is_dir():
        return _model_dir(spec, args, boundaries)
    if spec.endswith(".segc") or (path.is_file() and _looks_like_ir(path)):
        import segc

        return Target(spec, "ir", f"IR file {spec}", graph=segc.parse(read_text(spec)))
    head, sep, tail = spec.partition(":")
    arch_like = re.fullmatch(r"\w+", head) and (not sep or "=" in tail or not tail)
    if arch_like and (head in architectures() or not sep):
        return _arch(head, tail, args, boundaries)
    if not sep or not tail:
        raise UsageError(f"cannot read target {spec!r}: expected {TARGET_HELP}")
    return _function(head, tail, args, boundaries)


def _looks_like_ir(path: Path) -> bool:
    try:
        with open(path) as f:
            return f.read(64).lstrip().startswith("graph ")
    except (OSError, UnicodeDecodeError):
        return False


def _arch(name: str, config: str, args: argparse.Namespace, boundaries: Any) -> Target:
    """An architecture target: the spec parsed and built by ``segc.research.modelspec``,
    as ``segc experiment --model`` builds it."""
    from ..research.modelspec import build_arch, parse_arch

    spec = parse_arch(name, config, dtype=args.dtype)
    return _model_target(spec.label, "arch", build_arch(spec, seed=args.seed), args, boundaries)


def _model_dir(spec: str, args: argparse.Namespace, boundaries: Any) -> Target:
    import mlx.core as mx

    from ..engine import load_local_model

    model, _ = load_local_model(spec)
    if args.dtype:
        model.set_dtype(getattr(mx, args.dtype))
    return _model_target(f"model {spec}", "model", model, args, boundaries)


def _model_target(label: str, kind: str, model: Any, args: argparse.Namespace, boundaries: Any) -> Target:
    import mlx.core as mx

    if args.input:
        raise UsageError("--input is for function targets; a model target takes --tokens")
    vocab = getattr(getattr(model, "args", None), "vocab_size", None) or 128
    n = args.tokens or 8
    x = mx.array([[(7 * i + 3) % vocab for i in range(n)]], dtype=mx.int32)
    return Target(label, kind, f"{label}, {n} tokens", fn=model, args=[x], boundaries=boundaries)


def _function(where: str, name: str, args: argparse.Namespace, boundaries: Any) -> Target:
    import mlx.core as mx
    import mlx.nn as nn

    if where.endswith(".py"):
        if not os.path.isfile(where):
            raise UsageError(f"{where}: no such file")
        modname = f"_segc_target_{Path(where).stem}"
        spec = importlib.util.spec_from_file_location(modname, where)
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        sys.modules[modname] = mod
        try:
            spec.loader.exec_module(mod)
        except Exception as exc:  # the user's file: their mistake, named
            raise UsageError(f"{where}: importing it raised {type(exc).__name__}: {_first_line(exc)}") from exc
    else:
        try:
            mod = importlib.import_module(where)
        except ModuleNotFoundError as exc:
            if exc.name and where.startswith(exc.name):
                raise UsageError(f"no module {where!r} (is it on PYTHONPATH?)") from None
            raise
    fn: Any = mod
    for part in name.split("."):
        if not hasattr(fn, part):
            public = sorted(k for k, v in vars(mod).items() if callable(v) and not k.startswith("_"))
            raise choice_error(f"function in {where}:", name, public)
        fn = getattr(fn, part)
    if not callable(fn):
        raise UsageError(f"{where}:{name} is a {type(fn).__name__}, not a function or an nn.Module")
    source = getattr(mod, "__file__", None)
    if source:  # what it raises is the user's mistake (common.report)
        user_code(source, f"{where}:{name}")
    if not isinstance(fn, nn.Module) and boundaries == "auto":
        boundaries = None
    inputs = [parse_input(t) for t in args.input]
    if not inputs:
        raise UsageError(f"{where}:{name} needs example inputs: --input NAME=SHAPE[:DTYPE] per argument")
    key = mx.random.key(args.seed)
    xs = [_random(shape, dt, mx.random.split(key, len(inputs) + 1)[k]) for k, (_, shape, dt) in enumerate(inputs)]
    mx.eval(xs)
    sig = ", ".join(f"{n}={'x'.join(map(str, s)) or 'scalar'}:{d}" for n, s, d in inputs)
    return Target(f"{where}:{name}", "function", f"{where}:{name}({sig})", fn=fn, args=xs, boundaries=boundaries)


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [""])[0]


def add_strategy_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--strategy",
        default="markers",
        help="cut placement: markers (the boundaries; default), none, every:K, balanced:N, memory:BYTES, "
        "optimal[:BYTES, Fx or markers], min_boundary_bytes, or py:module:function",
    )
    p.add_argument("--no-legalize", action="store_true", help="keep cuts that split a fused chain")


def strategy_spec(text: str) -> Any:
    if text.startswith("py:"):
        mod, _, fn = text[3:].rpartition(":")
        if not mod or not fn:
            raise UsageError(f"--strategy {text!r}: expected py:module:function")
        try:
            return getattr(importlib.import_module(mod), fn)
        except (ImportError, AttributeError) as exc:
            raise UsageError(f"--strategy {text!r}: {exc}") from None
    return text


def read_schedule(path: str) -> Any:
    """The fence schedule (``segc.passes.Schedule``) in the JSON file ``path``: an
    object with ``cuts``, ``waits`` and ``host_events``."""
    import json

    from ..passes import Schedule

    text = read_text(path)
    try:
        d = json.loads(text)
    except ValueError:
        d = {}  # Schedule.from_json says what is wrong with it
    if not isinstance(d, dict):
        raise UsageError(
            f"{path}: a schedule is a JSON object with cuts, waits and host_events, not a {type(d).__name__}"
        )
    return Schedule.from_json(text)


def cut(g: Any, strategy: str, *, legalize: bool = True) -> tuple[Any, Any]:
    """``g`` cut by ``strategy`` (a spec text): (the graph, its plan)."""
    from ..passes import make_plan
    from ..passes.plan import apply_plan

    plan = make_plan(g, strategy_spec(strategy), legalize=legalize)
    return apply_plan(g, plan), plan
