"""A decode step's rotations and KV writes as one kernel (``segc.lower.kvwrite``).

On CUDA segc computes the keys' ``RoPE``, both cache writes and the queries' ``RoPE`` of
a layer with one kernel that keeps MLX's bits (``tests/test_kvwrite_cuda.py``). MLX's CPU
build records ``mx.fast.rope`` as its decomposition, so a model traced here holds no
``RoPE`` to match: these tests build the equations by hand, replay them with the kernel
replaced by :func:`reference_kv_write` and check every output against MLX's own ops
(``mx.fast.rope``, ``mx.slice_update``), byte for byte; a kernel computing something
else, or a match that reads the wrong operand, must be seen to break that.
"""

from __future__ import annotations

from collections.abc import Sequence

import mlx.core as mx
import pytest
from conftest import assert_env_setting, examples, same_bits
from hypothesis import given, settings
from hypothesis import strategies as hst

from segc.errors import UsageError
from segc.ir import Eqn, Var
from segc.lower import kvwrite, replay_fn
from segc.lower.kvwrite import KVWriteMatch, find_kv_writes, kv_write_kernel, reference_kv_write

DT = {"bf16": mx.bfloat16, "f16": mx.float16, "f32": mx.float32}


class Counted:
    """The reference kernel, recording its matches; ``broken``: one output changed."""

    def __init__(self, broken: int | None = None):
        self.matches: list[KVWriteMatch] = []
        self.broken = broken

    def __call__(self, m: KVWriteMatch, ins: Sequence[mx.array]) -> list[mx.array]:
        self.matches.append(m)
        out = reference_kv_write(m, ins)
        if self.broken is not None:
            out[self.broken] = out[self.broken] + 1
        return out


def _layer(h=2, hq=4, c=16, d=8, dv=8, dims=8, trad=False, freqs=False, dt="bf16", q_first=True, batch=1):
    """The equations of one attention's rotations and writes (the queries' rotation and
    a reader of it first, as mlx-lm's attention records them), their vars' avals, and
    which vars are the graph's inputs and outputs."""
    rot = (dims, trad, None if freqs else 10000.0, 1.0, True)
    extra = ("fr",) if freqs else ()
    qeqns = [
        Eqn(0, "RoPE", ("q", "off", *extra), (Var("qr", (batch, hq, 1, d), dt),), rot),
        Eqn(1, "Multiply", ("qr", "qr"), (Var("qq", (batch, hq, 1, d), dt),)),
    ]
    kv = [
        Eqn(2, "RoPE", ("k", "off", *extra), (Var("kr", (batch, h, 1, d), dt),), rot),
        Eqn(3, "DynamicSliceUpdate", ("kb", "kr", "off"), (Var("ko", (batch, h, c, d), dt),), ((2,),)),
        Eqn(4, "DynamicSliceUpdate", ("vb", "v", "off"), (Var("vo", (batch, h, c, dv), dt),), ((2,),)),
    ]
    eqns = qeqns + kv if q_first else kv + qeqns
    avals = {
        "q": ((batch, hq, 1, d), dt),
        "k": ((batch, h, 1, d), dt),
        "v": ((batch, h, 1, dv), dt),
        "kb": ((batch, h, c, d), dt),
        "vb": ((batch, h, c, dv), dt),
        "off": ((), "i32"),
        "fr": ((dims // 2,), "f32"),
    }
    avals.update({o.name: (o.shape, o.dtype) for e in eqns for o in e.outs})
    ins = ["q", "k", "v", "kb", "vb", "off", *extra]
    return eqns, avals, ins, ["qq", "ko", "vo"]


def _values(avals, ins, offset: int, seed: int = 0) -> list[mx.array]:
    key = mx.random.key(seed)
    out = []
    for i, n in enumerate(ins):
        shape, dt = avals[n]
        if n == "off":
            out.append(mx.array(offset, dtype=mx.int32))
        elif n == "fr":
            out.append(mx.random.uniform(1.0, 1000.0, shape, key=mx.random.split(key, 20)[i]))
        else:
            out.append((mx.random.normal(shape, key=mx.random.split(key, 20)[i]) * 4).astype(DT[dt]))
    return out


def _eager(vals: dict[str, mx.array], dims: int, trad: bool, freqs: bool) -> list[mx.array]:
    """MLX's own ops for the layer of :func:`_layer`."""

    def rope(x):
        f = vals["fr"] if freqs else None
        return mx.fast.rope(
            x, dims, traditional=trad, base=None if freqs else 10000.0, scale=1.0, offset=vals["off"], freqs=f
        )

    qr = rope(vals["q"])
    ko = mx.slice_update(vals["kb"], rope(vals["k"]), vals["off"], [2])
    vo = mx.slice_update(vals["vb"], vals["v"], vals["off"], [2])
    return [qr * qr, ko, vo]


def _replay(eqns, avals, ins, outs, vals, kernel) -> list[mx.array]:
    return replay_fn(eqns, ins, outs, {}, None, None, eqns, None, avals, kernel)(*vals)


@pytest.mark.parametrize("q_first", [True, False])
def test_a_layer_is_one_match_and_keeps_eagers_bits(q_first) -> None:
    eqns, avals, ins, outs = _layer(q_first=q_first)
    vals = _values(avals, ins, offset=5)
    kernel = Counted()
    got = _replay(eqns, avals, ins, outs, vals, kernel)
    want = _eager(dict(zip(ins, vals)), 8, False, False)
    assert [same_bits(a, b) for a, b in zip(got, want, strict=True)] == [True, True, True]
    (m,) = kernel.matches
    assert m.queries and not m.freqs and m.skip == {0, 2, 3, 4}
    assert m.ins == ("kb", "k", "vb", "v", "off", "q") and m.outs == ("ko", "vo", "qr")


@pytest.mark.parametrize("broken", [0, 1, 2])
def test_a_kernel_that_computes_something_else_is_seen(broken) -> None:
    eqns, avals, ins, outs = _layer()
    vals = _values(avals, ins, offset=3)
    got = _replay(eqns, avals, ins, outs, vals, Counted(broken))
    want = _eager(dict(zip(ins, vals)), 8, False, False)
    # output 0 of the kernel (the keys) is graph output 1, its queries (2) feed output 0
    changed = {0: 1, 1: 2, 2: 0}[broken]
    assert not same_bits(got[changed], want[changed])


@settings(max_examples=examples(25), deadline=None)
@given(
    h=hst.sampled_from([1, 2, 4]),
    rep=hst.sampled_from([1, 2, 4]),
    c=hst.integers(2, 40),
    d=hst.sampled_from([4, 8, 16, 12]),
    dv=hst.sampled_from([4, 8, 16]),
    partial=hst.booleans(),
    trad=hst.booleans(),
    freqs=hst.booleans(),
    dt=hst.sampled_from(list(DT)),
    data=hst.data(),
)
def test_any_rotation_and_buffer_keeps_eagers_bits(h, rep, c, d, dv, partial, trad, freqs, dt, data) -> None:
    dims = d // 2 if partial and (d // 2) % 2 == 0 else d
    eqns, avals, ins, outs = _layer(h=h, hq=h * rep, c=c, d=d, dv=dv, dims=dims, trad=trad, freqs=freqs, dt=dt)
    vals = _values(avals, ins, offset=data.draw(hst.integers(0, c - 1)), seed=data.draw(hst.integers(0, 99)))
    kernel = Counted()
    got = _replay(eqns, avals, ins, outs, vals, kernel)
    want = _eager(dict(zip(ins, vals)), dims, trad, freqs)
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        assert same_bits(a, b), f"output {outs[i]}"
    (m,) = kernel.matches
    assert (m.dims, m.traditional, m.freqs) == (dims, trad, freqs)


def _no_match(eqns, avals, outs=("qq", "ko", "vo"), max_bytes=None) -> None:
    assert find_kv_writes(eqns, list(outs), avals, max_bytes=max_bytes) == []


def test_what_is_not_taken() -> None:
    eqns, avals, _, outs = _layer()
    # the rotated keys read by something else too
    _no_match(eqns, avals, outs=(*outs, "kr"))
    # the writes at another position than the rotation's offset
    other = [e.replace(ins=("vb", "v", "off2")) if e.id == 4 else e for e in eqns]
    _no_match(other, {**avals, "off2": ((), "i32")})
    other = [e.replace(ins=("kb", "kr", "off2")) if e.id == 3 else e for e in eqns]
    _no_match(other, {**avals, "off2": ((), "i32")})
    # a buffer over the select's limit, an offset that is not int32, two batch rows
    _no_match(eqns, avals, max_bytes=2 * 16 * 8 * 2 - 1)
    _no_match(eqns, {**avals, "off": ((), "i64")})
    eqns2, avals2, _, _ = _layer(batch=2)
    _no_match(eqns2, avals2)
    # a write along another axis
    other = [e.replace(args=((1,),)) if e.prim == "DynamicSliceUpdate" else e for e in eqns]
    _no_match(other, avals)
    # values of another head count, and values made from the new keys (one kernel cannot
    # make both)
    eqns3, avals3, _, _ = _layer(dv=8)
    _no_match(eqns3, {**avals3, "vb": ((1, 4, 16, 8), "bf16"), "vo": ((1, 4, 16, 8), "bf16")})
    from_keys = Eqn(5, "Slice", ("ko",), (Var("vk", (1, 2, 1, 8), "bf16"),), ((0, 0, 0, 0), (1, 2, 1, 8), (1, 1, 1, 1)))
    late = [e for e in eqns if e.id != 4] + [from_keys, eqns[4].replace(id=6, ins=("vb", "vk", "off"))]
    _no_match(late, {**avals, "vk": ((1, 2, 1, 8), "bf16")})


def test_the_queries_rotation_is_left_alone_when_it_differs() -> None:
    eqns, avals, ins, outs = _layer()
    # the queries rotated with another scale: the keys' kernel without them
    eqns = [e.replace(args=(8, False, 10000.0, 0.5, True)) if e.id == 0 else e for e in eqns]
    (m,) = find_kv_writes(eqns, outs, avals)
    assert not m.queries and m.skip == {2, 3, 4}
    vals = _values(avals, ins, offset=1)
    got = _replay(eqns, avals, ins, outs, vals, Counted())
    plain = replay_fn(eqns, ins, outs, {})(*vals)
    assert all(same_bits(a, b) for a, b in zip(got, plain, strict=True))


def test_a_write_is_alone_only_where_nothing_else_reads_its_buffers() -> None:
    """``KVWriteMatch.alone``, which lets the write with its attention write in place
    (``SEGC_KV_IN_PLACE=1``): false where the old key or value buffer has another reader,
    in the segment or elsewhere in the program, or leaves the segment or the program."""
    eqns, avals, _, outs = _layer()
    ((m,),) = [find_kv_writes(eqns, outs, avals)]
    assert m.alone
    for buf in ("kb", "vb"):
        reader = Eqn(9, "Multiply", (buf, buf), (Var("rd", (1, 2, 16, 8), "bf16"),))
        (m,) = find_kv_writes([*eqns, reader], [*outs, "rd"], {**avals, "rd": ((1, 2, 16, 8), "bf16")})
        assert not m.alone, f"{buf} read in the segment"
        (m,) = find_kv_writes(eqns, outs, avals, context=[*eqns, reader])
        assert not m.alone, f"{buf} read in another segment"
        (m,) = find_kv_writes(eqns, [*outs, buf], avals)
        assert not m.alone, f"{buf} an output of the segment"
        (m,) = find_kv_writes(eqns, outs, avals, program_outputs={buf})
        assert not m.alone, f"{buf} an output of the program (a function handing back the old buffer)"


@pytest.mark.parametrize(("value", "want"), [(None, False), ("0", False), ("1", True), ("yes", None)])
def test_the_in_place_setting_is_read_and_checked(monkeypatch: pytest.MonkeyPatch, value, want) -> None:
    """Off unless the environment asks (an array sharing a cache's buffer would see the
    row written); anything but 0 or 1 refused by name."""
    assert_env_setting(monkeypatch, "SEGC_KV_IN_PLACE", value, kvwrite.kv_in_place_wanted, want)


def test_the_setting() -> None:
    assert kv_write_kernel("never") is None
    assert kv_write_kernel(reference_kv_write) is reference_kv_write
    with pytest.raises(UsageError, match="FUSED_KV_WRITE"):
        kv_write_kernel("sometimes")
    if mx.default_device() == mx.cpu:
        assert kv_write_kernel("auto") is None  # never on the CPU: MLX's ops are eager's there
    assert kvwrite.FUSED_KV_WRITE == "auto"


@settings(max_examples=examples(60), deadline=None)
@given(data=hst.data())
def test_replay_order_follows_the_data(data) -> None:
    """``replay._in_order`` over a random program with one step moved later (as a fused
    kernel runs where its last equation was): every step runs after the steps making its
    inputs, each step once, and the steps that do not read the moved one keep their order."""
    from segc.lower.replay import _in_order

    n = data.draw(hst.integers(2, 12))
    reads = [data.draw(hst.sets(hst.integers(0, k - 1), max_size=3)) if k else set() for k in range(n)]
    k = data.draw(hst.integers(0, n - 2))
    to = data.draw(hst.integers(k + 1, n - 1))
    # the moved step may only read what comes before its new place, as the finder ensures
    reads[k] = {r for r in reads[k] if r < k}
    steps = [(None, Eqn(i, "Step", (), ()), tuple(f"v{r}" for r in reads[i]), (f"v{i}",)) for i in range(n)]
    plan = steps[:k] + steps[k + 1 : to + 1] + [steps[k]] + steps[to + 1 :]
    got = [s[1].id for s in _in_order(plan, set())]
    assert sorted(got) == list(range(n))
    place = {i: p for p, i in enumerate(got)}
    assert all(place[r] < place[i] for i in range(n) for r in reads[i])

    def needs_k(i: int) -> bool:
        return i == k or any(needs_k(r) for r in reads[i])

    free = [s[1].id for s in plan if not needs_k(s[1].id)]
    assert [i for i in got if not needs_k(i)] == free


@pytest.mark.parametrize(
    ("option", "env", "alone", "want"),
    [
        (True, "0", True, True),
        (False, "1", True, False),
        (None, "1", True, True),
        (None, None, True, False),
        (True, "1", False, False),  # a buffer something else reads is never written in place
    ],
)
def test_the_jit_option_decides_over_the_environment(monkeypatch: pytest.MonkeyPatch, option, env, alone, want) -> None:
    """``segc.jit(..., kv_in_place=)``: the kernel ``kv_write_kernel`` hands the executor
    asks ``kv_attention`` for the write in place as the option says, whatever
    ``SEGC_KV_IN_PLACE`` is; None leaves it to the environment. The CUDA side is
    stood in for (the kernel itself: ``tests/test_cuda_emulated.py`` and the GPU tests)."""
    from types import SimpleNamespace

    from segc.lower import cuda_kvattention, products

    if env is None:
        monkeypatch.delenv("SEGC_KV_IN_PLACE", raising=False)
    else:
        monkeypatch.setenv("SEGC_KV_IN_PLACE", env)
    monkeypatch.delenv("SEGC_FUSED_KV_ATTENTION", raising=False)
    monkeypatch.setattr(products, "cuda_wanted", lambda setting, name: True)
    asked: list[bool] = []

    def kv_attention(*args: object) -> list[str]:
        asked.append(bool(args[-1]))
        return ["new keys", "new values", "out"]

    monkeypatch.setattr(cuda_kvattention, "kv_attention", kv_attention)
    kernel = kv_write_kernel("auto", in_place=option)
    assert kernel is not None and hasattr(kernel, "with_attention")
    m = SimpleNamespace(alone=alone, dims=8, traditional=False, base=10000.0, scale=1.0, freqs=None)
    assert kernel.with_attention(m, 0.125, ["kb", "k", "vb", "v", "off", "q", "mask"]) == [  # type: ignore[attr-defined]
        "new keys",
        "new values",
        "out",
    ]
    assert asked == [want]


def test_the_jit_hands_its_option_to_every_executor(monkeypatch: pytest.MonkeyPatch) -> None:
    """The option reaches the executor of a first call's compile and of a relowering
    (``record_timeline``); a value that is not True, False or None is refused by name
    before anything is traced."""
    import segc
    from segc.runtime import executor

    seen: list[object] = []
    own = executor.kv_write_kernel

    def recorded(*args: object, **kw: object) -> object:
        seen.append(kw.get("in_place", "missing"))
        return own(*args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(executor, "kv_write_kernel", recorded)
    for option in (True, False, None):
        seen.clear()
        f = segc.jit(lambda x: x * 2 + 1, kv_in_place=option)
        x = mx.arange(4, dtype=mx.float32)
        assert same_bits(f(x), x * 2 + 1)
        f.record_timeline([])
        assert seen == [option, option], (option, seen)
    for bad in ("yes", 1, 0.0):
        with pytest.raises(UsageError, match="kv_in_place"):
            segc.jit(lambda x: x, kv_in_place=bad)
