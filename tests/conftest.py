"""Shared helpers: trace a function, cut its graph at every point, run it through the
segmented executor, and compare bits with eager MLX (raw bytes, shape and dtype:
:func:`same_bits`, :func:`assert_same_bits`; the one bit comparison of the suite);
the small test networks; brute-force reference analyses for the pass tests.

Import them as ``from conftest import ...`` (pytest puts ``tests/`` on ``sys.path``,
for ``tests/fast/`` too). Everything here runs on MLX's default device, so the same
tests run on the CPU build and on the CUDA build.

``tests/fast/`` holds the tests that run no MLX (IR text, passes, analyses, plans);
tests of more than about 2 s on a fresh machine (MLX compiles each new fused CPU kernel
once, into ``$TMPDIR/mlx``: about 0.25 s each with the precompiled preamble that ``make
install`` makes, ``tests/mlx_pch.py``) are marked ``slow``: ``make test-fast`` leaves them out.
"""

from __future__ import annotations

import contextlib
import os
import zlib

# the pass pipeline verifies the graph after every pass (segc/passes/pipeline.py)
os.environ.setdefault("SEGC_CHECKS", "1")
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

import hypothesis
import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

import segc
from segc import dtypes
from segc.ir import CUT, Eqn, Graph, segments
from segc.lower import PRIMS, REBUILT, replay_fn
from segc.runtime import Executor
from segc.staging.validate import VALIDATE_TOL

# Under pytest-xdist (`make test` runs two workers) each worker compiles MLX's fused CPU
# kernels into a temporary folder of its own: MLX writes `$TMPDIR/mlx/.../<name>.so` with
# no lock between processes, so a worker could load one another is still writing. (The
# CUDA build's device scripts run workers too and keep the shared folder, as before.)
_WORKER = os.environ.get("PYTEST_XDIST_WORKER")
if _WORKER and mx.default_device() == mx.cpu:
    import tempfile

    _TMP = os.path.join(tempfile.gettempdir(), "segc-xdist", _WORKER)
    os.makedirs(_TMP, exist_ok=True)
    os.environ["TMPDIR"] = _TMP
    tempfile.tempdir = _TMP

# Hypothesis profiles: HYPOTHESIS_PROFILE=ci (the default, what CI runs), deep (ten
# times the examples of every property test, for a thorough run before a release) or
# device (ci's examples, a failure reported as found, not shrunk: on a lent GPU a
# failing test's shrinking took 421 s of a 1,800 s budget; benchmarks/gpu_decode.sh).
PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "ci")
if PROFILE not in ("ci", "deep", "device"):
    raise pytest.UsageError(f"HYPOTHESIS_PROFILE must be ci, deep or device, got {PROFILE!r}")
hypothesis.settings.register_profile("ci", deadline=None)
hypothesis.settings.register_profile("deep", deadline=None, max_examples=1000)
hypothesis.settings.register_profile(
    "device", deadline=None, phases=[hypothesis.Phase.explicit, hypothesis.Phase.reuse, hypothesis.Phase.generate]
)
hypothesis.settings.load_profile(PROFILE)


def examples(n: int) -> int:
    """A property test's number of examples under the current profile."""
    return n * (10 if PROFILE == "deep" else 1)


FLOATS = (mx.float32, mx.float16, mx.bfloat16)
INTS = (mx.int32, mx.int16, mx.uint8, mx.uint32, mx.int8)


def bits(a: mx.array) -> tuple[tuple[int, ...], str, bytes]:
    """Shape, dtype and raw bytes: two arrays are bit-identical iff these are equal
    (NaN payloads and the sign of zero included)."""
    mx.eval(a)
    return tuple(a.shape), dtypes.short(a.dtype), dtypes.to_bytes(a)


def same_bits(a: mx.array, b: mx.array) -> bool:
    return bits(a) == bits(b)


def same_caches(got: Any, want: Any) -> bool:
    """KV caches (mlx-lm's, one a layer) with the same offsets and, up to them, the same
    keys' bits."""
    return len(got) == len(want) and all(
        c.offset == e.offset and same_bits(c.keys[..., : c.offset, :], e.keys[..., : e.offset, :])
        for c, e in zip(got, want, strict=True)
    )


def leaves(x: Any) -> list[mx.array]:
    if isinstance(x, mx.array):
        return [x]
    if isinstance(x, list | tuple):
        return [y for v in x for y in leaves(v)]
    raise TypeError(f"not an array or a list of arrays: {type(x).__name__}")


def assert_same_bits(got: Sequence[mx.array], want: Sequence[mx.array], what: str = "") -> None:
    assert len(got) == len(want), f"{what}: {len(got)} outputs, expected {len(want)}"
    for k, (g, w) in enumerate(zip(got, want)):
        bg, bw = bits(g), bits(w)
        if bg != bw:
            raise AssertionError(
                f"{what}: output {k} differs: got {bg[1]}{list(bg[0])}, want {bw[1]}{list(bw[0])}\n"
                f"got  {np.array(g.astype(mx.float32) if g.dtype == mx.bfloat16 else g)!r}\n"
                f"want {np.array(w.astype(mx.float32) if w.dtype == mx.bfloat16 else w)!r}"
            )


class Block(nn.Module):
    """A pre-norm residual block: the layer of the small test networks."""

    def __init__(self, d: int):
        super().__init__()
        self.lin = nn.Linear(d, d)
        self.norm = nn.RMSNorm(d)

    def __call__(self, x: mx.array) -> mx.array:
        return x + self.lin(self.norm(x))


class Net(nn.Module):
    """``n`` :class:`Block` layers (``boundaries="layers.*"`` cuts after each), then a
    linear head: the small test network."""

    def __init__(self, d: int = 16, n: int = 3, out: int = 5):
        super().__init__()
        self.layers = [Block(d) for _ in range(n)]
        self.head = nn.Linear(d, out)

    def __call__(self, x: mx.array) -> mx.array:
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


M = TypeVar("M", bound=nn.Module)


def seeded(make: Callable[[], M], seed: int) -> M:
    """``make()`` under MLX's random ``seed``, its parameters evaluated."""
    mx.random.seed(seed)
    m = make()
    mx.eval(m.parameters())
    return m


# the prompt of the tiny mlx-lm models' single-call tests
PROMPT8 = mx.array([[3, 1, 4, 1, 5, 9, 2, 6]], dtype=mx.int32)


def trace_graph(fn: Callable[..., Any], *args: mx.array) -> Graph:
    """The IR of ``fn(*args)`` (array arguments only)."""
    return segc.jit(fn).trace(*args).graph


def traced_with_inputs(fn: Callable[..., Any], *args: Any, **options: Any) -> tuple[Graph, list[mx.array]]:
    """The graph ``segc.jit(fn, **options)`` traces for ``fn(*args)`` (its markers as
    cuts, no strategy) and that call's flat graph inputs (arguments, state, parameters):
    what ``Executor(graph)`` takes."""
    compiled = segc.jit(fn, **options).trace(*args).lower().compile()
    return compiled.graph, compiled.flat_inputs(*args)


@pytest.fixture(autouse=True)
def _random_values_per_test(request: pytest.FixtureRequest) -> None:
    """MLX's random state seeded from the test's id: a test's unkeyed ``mx.random`` values
    are the same whatever ran before it, so that a failure reproduces when run alone."""
    mx.random.seed(zlib.crc32(request.node.nodeid.encode()))


@pytest.fixture(autouse=True)
def _device_errors_stay_with_their_test() -> Iterator[None]:
    """On the GPU a kernel's error (a misaligned address, say) surfaces at the next
    synchronisation, which may be in the next test: synchronise after each test so that
    it fails the test that launched the kernel."""
    yield
    if mx.default_device() != mx.cpu:
        mx.synchronize()


def cut_ids(g: Graph) -> tuple[list[int], list[int]]:
    """(the last computing equation before each cut, the first computing equation after
    each cut): the ids a boundary schedule's cut and wait nodes name."""
    ends: list[int] = []
    starts: list[int] = []
    last, after = -1, False
    for e in g.eqns:
        if e.prim == CUT:
            ends.append(last)
            after = True
        elif not e.is_pseudo:
            last = e.id
            if after:
                starts.append(e.id)
                after = False
    return ends, starts


def with_cuts(g: Graph, positions: Sequence[int]) -> Graph:
    """``g`` with a ``segc.cut`` before each equation index in ``positions``."""
    eqns: list[Eqn] = []
    next_id = max((e.id for e in g.eqns), default=-1) + 1
    cut_at = set(positions)
    for k, e in enumerate(g.eqns):
        if k in cut_at:
            eqns.append(Eqn(next_id, CUT, (), (), (f"cut{k}",)))
            next_id += 1
        eqns.append(e)
    return g.replace(eqns=tuple(eqns))


def cut_variants(g: Graph, singles: Sequence[int] | None = None) -> Iterator[tuple[str, Graph]]:
    """The graph uncut, cut at each single point (or at those in ``singles``), and cut
    at every point at once."""
    n = len(g.eqns)
    yield "uncut", g
    if n < 2:
        return
    for k in range(1, n) if singles is None else singles:
        yield f"cut before eqn {k}", with_cuts(g, [k])
    yield "cut everywhere", with_cuts(g, range(1, n))


def run_graph(g: Graph, inputs: Sequence[mx.array], *, compile: bool = True) -> list[mx.array]:
    out = Executor(g, compile=compile)(list(inputs))
    mx.eval(out)
    return out


def graph_inputs(g: Graph, args: Sequence[mx.array]) -> list[mx.array]:
    assert all(i.kind == "arg" for i in g.inputs), "plain functions only"
    return list(args)


def prims(g: Graph) -> set[str]:
    return {e.prim for e in g.eqns if not e.is_pseudo}


def retrace(g: Graph, e: Eqn) -> Graph:
    """The trace of ``e``'s lowering rule, run on placeholder inputs of the same types."""
    vs = g.vars()
    consts = {c.var.name: c.value for c in g.consts}
    names = [v for v in dict.fromkeys(e.ins) if v not in consts]
    fn = replay_fn([e], names, [o.name for o in e.outs], consts)
    return trace_graph(lambda *xs: fn(*xs), *[mx.zeros(vs[v].shape, dtypes.to_mx(vs[v].dtype)) for v in names])


def assert_rules_exact(g: Graph) -> None:
    """Each equation's rule builds the very primitive it replaces, with the same state
    (except the rules of ``segc.lower.REBUILT``, which rebuild the values another way)."""
    for e in g.eqns:
        if e.is_pseudo or e.prim in REBUILT:
            continue
        again = [(x.prim, x.args) for x in retrace(g, e).eqns]
        vs = g.vars()
        if not again and len(e.outs) == 1 and any(vs[v].shape == e.outs[0].shape for v in e.ins):
            continue  # an identity (a whole slice, say): MLX's Python op returns its input
        assert (e.prim, e.args) in again, f"the rule for {e.prim}{list(e.args)} built {again}"


# case name -> primitives of its graph, for every case where mx.compile gave other bits
# than eager in this session (printed at the end of the run: docs/lowering.md lists them)
COMPILE_DIFFERS: dict[str, list[str]] = {}


def record_differs(name: str, g: Graph) -> None:
    """Record a case whose mx.compile (or op-by-op) bits differ from eager's, here and in
    ``$SEGC_COMPILE_DIFFERS_LOG``: with pytest-xdist each worker has its own
    COMPILE_DIFFERS, so tests/gpu_lowering.sh collects them from that file."""
    ps = sorted(prims(g))
    COMPILE_DIFFERS[name] = ps
    path = os.environ.get("SEGC_COMPILE_DIFFERS_LOG")
    if path:
        with open(path, "a") as f:
            f.write(f"{name}: {', '.join(ps)}\n")


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if COMPILE_DIFFERS:
        terminalreporter.section(f"mx.compile differs from eager on {mx.default_device()}")
        for name, ps in sorted(COMPILE_DIFFERS.items()):
            terminalreporter.write_line(f"{name}: {', '.join(ps)}")


# how MLX says that this device has no kernel for an op (e.g. CUDA's quantized_matmul
# with transpose=False for some shapes: "No implementation for problem shape")
_CANNOT = ("not supported", "not implemented", "no implementation", "nyi", "only supports", "not yet")


def eager_and_compiled(
    fn: Callable[..., Any], args: Sequence[mx.array]
) -> tuple[list[mx.array], list[mx.array] | None]:
    """``fn(*args)`` run eagerly, and run under ``mx.compile`` where that gives other
    bits than eager (else None): the promise is then mx.compile's bits for an uncut run,
    either's for a cut one (:func:`assert_matches`, :func:`check_segmented`)."""
    eager = eager_or_skip(fn, args)
    compiled = leaves(mx.compile(fn)(*args))
    mx.eval(compiled)
    differs = len(compiled) != len(eager) or any(not same_bits(a, b) for a, b in zip(eager, compiled))
    return eager, compiled if differs else None


def eager_or_skip(fn: Callable[..., Any], args: Sequence[mx.array]) -> list[mx.array]:
    """``fn(*args)`` evaluated; an op this device's MLX does not implement skips."""
    try:
        out = leaves(fn(*args))
        mx.eval(out)
    except (RuntimeError, ValueError) as exc:
        msg = str(exc).lower()
        if any(w in msg for w in _CANNOT):
            pytest.skip(reason=f"MLX on {mx.default_device()} cannot run it eagerly: {exc}")
        raise
    return out


# On the CPU segc's dynamic KV cache is bit-identical to eager mlx-lm. Off it, CUDA's
# attention over the masked whole buffer rounds differently from attention over the exact
# keys (docs/models.md): there decode logits and caches are promised within
# segc.staging.validate.VALIDATE_TOL of eager's (absolute), and greedy tokens identical
# (tests/test_state.py, tests/test_zoo.py).
STATE_BIT_IDENTICAL = mx.default_device() == mx.cpu


def state_close(a: mx.array, b: mx.array) -> bool:
    """Same shape and dtype; bit for bit on the CPU (and for non-float arrays), within
    VALIDATE_TOL elsewhere."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if STATE_BIT_IDENTICAL or not mx.issubdtype(a.dtype, mx.floating):
        return same_bits(a, b)
    return bool(mx.all(mx.abs(a.astype(mx.float32) - b.astype(mx.float32)) <= VALIDATE_TOL).item())


# Convolutions on MLX 0.32.4's CUDA build (mlx/backend/cuda/conv.cpp): its cuDNN plan
# cache key holds the shapes, strides, paddings, kernel dilation, groups, flip and buffer
# alignments, but not the input dilation: two convolutions that differ only there (a
# conv_transpose with stride 1 and one with stride 2 over the same shapes) share one plan,
# and whichever runs second gets wrong values, in eager MLX and in mx.compile alike. The
# property cases therefore give each input dilation its own input shape off the CPU
# (test_lower_props.py, ``spatial``). Convolutions are otherwise compared bit for bit on
# every device: 126 runs of the convolution cases with as many hypothesis seeds on the
# H200 found no bits that depend on buffer alignment (docs/gpu.md).


def with_setting(
    monkeypatch: pytest.MonkeyPatch, module: Any, name: str, value: Any, f: Callable[..., Any]
) -> Callable[..., Any]:
    """``f`` called with ``module.name`` set to ``value`` (a lowering setting read when a
    jitted function lowers: ``products.FUSED_PRODUCTS``, ``kvwrite.FUSED_KV_WRITE``)."""

    def call(*a: Any, **kw: Any) -> Any:
        monkeypatch.setattr(module, name, value)
        return f(*a, **kw)

    return call


def products_in_agreeing_decodes(monkeypatch: pytest.MonkeyPatch, model: nn.Module, **jit: Any) -> list[Any]:
    """``model`` decoded by two ``segc.jit(model, validate=False, **jit)``, one with segc's
    product kernels (``FUSED_PRODUCTS = "auto"``, on a CUDA GPU) and one with MLX's
    (``"never"``), byte for byte (:func:`assert_decodes_agree`, the prompt not compared:
    its quantized products may be MLX's ``qmm_sm90``, whose results vary); the matches the
    kernels computed, in order."""
    from segc.lower import products

    kernel = products.product_kernel("auto")
    assert kernel is not None
    seen: list[Any] = []

    def counted(m: Any, ins: Any) -> Any:
        seen.append(m)
        return kernel(m, ins)

    fused = with_setting(monkeypatch, products, "FUSED_PRODUCTS", counted, segc.jit(model, validate=False, **jit))
    plain = with_setting(monkeypatch, products, "FUSED_PRODUCTS", "never", segc.jit(model, validate=False, **jit))
    assert_decodes_agree(model, fused, plain, prompt_too=False)
    return seen


def assert_env_setting(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str | None, read: Callable[[], Any], want: Any
) -> None:
    """``read()`` with the environment's ``variable`` set to ``value`` (None: unset) gives
    ``want``, or, where ``want`` is None, raises a ``UsageError`` naming the variable."""
    from segc.errors import UsageError

    if value is None:
        monkeypatch.delenv(variable, raising=False)
    else:
        monkeypatch.setenv(variable, value)
    if want is None:
        with pytest.raises(UsageError, match=f"{variable} must be"):
            read()
    else:
        assert read() == want and type(read()) is type(want)


def assert_decodes_agree(
    model: nn.Module,
    fused: Callable[..., mx.array],
    plain: Callable[..., mx.array],
    steps: int = 10,
    prompt_too: bool = True,
) -> None:
    """``fused`` and ``plain`` (two ways of running ``model``, each called as
    ``f(tokens, cache=...)`` on a prompt cache of its own) over a 12-token prompt and
    ``steps`` greedy decode steps: logits, every cache's offset and every cache buffer
    byte for byte after each step, and the prompt's logits with ``prompt_too``."""
    from mlx_lm.models.cache import make_prompt_cache

    cf, cp = make_prompt_cache(model), make_prompt_cache(model)
    prompt = mx.array([[(5 * i + 1) % 100 for i in range(12)]])
    lf, lp = fused(prompt, cache=cf), plain(prompt, cache=cp)
    assert not prompt_too or same_bits(lf, lp), "prompt: logits"
    for k in range(steps):
        t = mx.argmax(lp[:, -1:], -1)
        lf, lp = fused(t, cache=cf), plain(t, cache=cp)
        assert same_bits(lf, lp), f"decode step {k}: logits"
        for a, b in zip(cf, cp, strict=True):
            assert a.offset == b.offset == len(prompt[0]) + k + 1, f"decode step {k}: offsets"
            assert same_bits(a.keys, b.keys) and same_bits(a.values, b.values), f"decode step {k}: caches"


def assert_matches(
    got: Sequence[mx.array],
    eager: Sequence[mx.array],
    compiled: Sequence[mx.array] | None,
    label: str,
) -> None:
    """Eager's bits; where ``compiled`` is given (mx.compile differs from eager), each
    output may have either's bits."""
    assert len(got) == len(eager), label
    for k, o in enumerate(got):
        if compiled is None:
            assert_same_bits([o], [eager[k]], f"{label}, output {k}")
        else:
            assert same_bits(o, eager[k]) or same_bits(o, compiled[k]), (
                f"{label}: output {k} matches neither eager nor mx.compile"
            )


def check_segmented(
    fn: Callable[..., Any],
    args: Sequence[mx.array],
    *,
    name: str = "",
    choose_cuts: Callable[[int], Sequence[int]] | None = None,
    compile_may_differ: bool = False,
) -> tuple[Graph, bool]:
    """Trace ``fn``, run it uncut and cut at every point; every run must give eager's
    bits, and each rule must rebuild its very primitive (:func:`assert_rules_exact`).
    ``choose_cuts(n)`` may pick which single cut points of the ``n`` equations to try
    (all by default); the graph cut at every point at once always runs.

    Where ``mx.compile(fn)`` itself differs from eager (returned as the second value),
    the promise is mx.compile's bits: the uncut run must match them, and each cut run
    must match eager or mx.compile, output by output. The case is recorded in
    :data:`COMPILE_DIFFERS`; on the CPU it must also be declared (``compile_may_differ``),
    so that docs/lowering.md stays true; on other devices it is reported at the end."""
    args = list(args)
    mx.eval(args)
    eager = eager_or_skip(fn, args)
    g = trace_graph(fn, *args)
    if mx.default_device() != mx.cpu and any(0 in v.shape for v in g.vars().values()):
        compiled = eager  # MLX's CUDA mx.compile dies (SIGFPE) over empty arrays; segc runs them op by op
    else:
        compiled = leaves(mx.compile(fn)(*args))
        mx.eval(compiled)
    differs = any(not same_bits(a, b) for a, b in zip(eager, compiled))
    if differs:
        record_differs(name or fn.__qualname__, g)
        if not compile_may_differ and mx.default_device() == mx.cpu:
            raise AssertionError(
                f"mx.compile differs from eager for {name} {sorted(prims(g))}: list the case in "
                "COMPILE_MAY_DIFFER and in docs/lowering.md"
            )
    inputs = graph_inputs(g, args)
    assert_rules_exact(g)
    singles = None if choose_cuts is None else choose_cuts(len(g.eqns))
    for label, gv in cut_variants(g, singles):
        got = run_graph(gv, inputs)
        if differs and label == "uncut":
            assert_same_bits(got, compiled, "uncut (mx.compile's bits)")
        assert_matches(got, eager, compiled if differs else None, label)
    return g, differs


# --------------------------------------------------------------------------- reference analyses
# Brute-force restatements of the definitions in segc/passes/analysis.py's docstring,
# written for reading rather than speed: the expected values for the analyses and for
# the strategies built on them. Which primitives are views comes from the primitive
# table (``Prim.memory``), the definition the analyses follow too.


def ref_buffers(g: Graph) -> tuple[dict[str, str], dict[str, int]]:
    """``(holder, size)``: the buffer holding each value (a view owns no memory: it is
    held by its source's buffer; a reshape is a view only of a contiguous value) and
    the bytes of each buffer (graph inputs and parameters their size, constants 0). An
    elementwise output whose only input with more than one element of data is a
    broadcast (the data behind it fewer elements than its shape) is allocated at that
    data's size, as MLX keeps the broadcast layout."""
    holder: dict[str, str] = {}
    size: dict[str, int] = {}
    contiguous: dict[str, bool] = {}
    elems: dict[str, int] = {}  # elements of data behind each value
    for v in [i.var for i in g.inputs] + [c.var for c in g.consts]:
        holder[v.name], contiguous[v.name], elems[v.name] = v.name, True, v.size
        size[v.name] = v.nbytes if any(i.var is v for i in g.inputs) else 0
    shapes = g.vars()
    for e in g.eqns:
        if e.is_pseudo:
            continue
        p = PRIMS.get(e.prim)  # None: unknown, elementwise
        kind = p.memory if p else "compute"
        src = e.ins[0] if e.ins else None
        view = src is not None and (kind in ("view", "view_keep") or (kind == "reshape" and contiguous[src]))
        many = [v for v in e.ins if elems[v] > 1]
        bcast = p is not None and p.fusible and kind in ("compute", "move") and len(many) == 1
        bcast = bcast and elems[many[0]] < shapes[many[0]].size
        for o in e.outs:
            if view:
                assert src is not None
                holder[o.name] = holder[src]
                contiguous[o.name] = contiguous[src] and kind != "view"
                elems[o.name] = elems[src] if e.prim == "Broadcast" else min(o.size, elems[src])
            else:
                holder[o.name], contiguous[o.name] = o.name, True
                elems[o.name] = elems[many[0]] if bcast and o.size == shapes[many[0]].size else o.size
                size[o.name] = elems[o.name] * (o.nbytes // max(o.size, 1))
    return holder, size


def _op_spans(g: Graph) -> tuple[list[Eqn], list[range]]:
    """The computing equations, and the op indices of each segment."""
    opos: dict[int, int] = {}
    os_: list[Eqn] = []
    for p, e in enumerate(g.eqns):
        if not e.is_pseudo:
            opos[p] = len(os_)
            os_.append(e)
    spans = []
    for s in segments(g):
        idx = [opos[p] for p in range(s.start, s.stop) if p in opos]
        spans.append(range(idx[0], idx[-1] + 1))
    return os_, spans


def _lifetimes(g: Graph, os_: list[Eqn], holder: dict[str, str]) -> dict[str, tuple[int, int]]:
    """For each buffer the graph computes: (op index that makes it, last op index that
    reads it through any view; ``len(os_)`` if it holds a graph output)."""
    life: dict[str, tuple[int, int]] = {}
    for k, e in enumerate(os_):
        for o in e.outs:
            if holder[o.name] == o.name:
                life[o.name] = (k, k)
        for v in e.ins:
            b = holder[v]
            if b in life:
                life[b] = (life[b][0], k)
    for v in g.outputs:
        b = holder[v]
        if b in life:
            life[b] = (life[b][0], len(os_))
    return life


def ref_segment_peaks(g: Graph) -> list[int]:
    """Each segment's peak live bytes, simulated op by op: the buffers it reads from
    outside itself (graph inputs and parameters included, constants free) plus the most
    bytes of its own buffers alive at any one op (a buffer lives from the op that makes
    it to its last reader, or to the segment's end)."""
    holder, size = ref_buffers(g)
    os_, spans = _op_spans(g)
    life = _lifetimes(g, os_, holder)
    peaks = []
    for span in spans:
        own = {b for b, (made, _) in life.items() if made in span}
        outside = {holder[v] for k in span for v in os_[k].ins} - own
        worst = max(sum(size[b] for b in own if life[b][0] <= t <= life[b][1]) for t in span)
        peaks.append(sum(size[b] for b in outside) + worst)
    return peaks


def ref_boundary_bytes(g: Graph) -> int:
    """Bytes of computed buffers (not graph inputs, parameters or constants) carried
    across a cut between two segments: a buffer crosses a cut when it is made before it
    and read after it (through any view) or returned; one crossing several cuts is
    counted once."""
    holder, size = ref_buffers(g)
    os_, spans = _op_spans(g)
    life = _lifetimes(g, os_, holder)
    return sum(size[b] for b, (made, last) in life.items() if any(made < s.start <= last for s in spans[1:]))


@contextlib.contextmanager
def expert_rewrites(force: bool = False) -> Iterator[list[str]]:
    """The kinds (``"leaf"``, ``"down"``) of ``segc.lower.experts`` rewrites replayed in
    the block, in order; with ``force``, lowering looks for them on any device (each
    still taken only where its check agrees)."""
    from segc.lower import experts
    from segc.runtime import executor

    taken: list[str] = []
    leaf, down = experts.leaf, experts.down
    with pytest.MonkeyPatch.context() as m:
        if force:
            m.setattr(executor, "experts_wanted", lambda: True)
        m.setattr(experts, "leaf", lambda *a: (taken.append("leaf"), leaf(*a))[1])
        m.setattr(experts, "down", lambda *a: (taken.append("down"), down(*a))[1])
        yield taken
