"""What the ``segc`` command needs from the layers below it, in-process: a ``Jitted``
standing in for its model in mlx-lm's own loop, the timeline's completion of every
segment and its Chrome-trace export, and ``segc verify``'s bisection to the equation
that diverges."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import mlx.core as mx
import pytest

import segc
from segc.cli import main
from segc.errors import SegcError
from segc.runtime import Executor
from segc.runtime import fenced as fenced_mod
from segc.runtime.completion import Completer
from segc.runtime.perfetto import to_chrome_trace, wait_complete

NET = Path(__file__).resolve().parent / "golden" / "cli" / "net.segc"


def test_jitted_stands_in_for_its_model_in_mlx_lm_generate_step() -> None:
    pytest.importorskip("mlx_lm", reason="mlx-lm is an extra (pip install 'segc[lm]')")
    from mlx_lm.generate import generate_step

    from segc.models import tiny_llama

    model = tiny_llama(num_hidden_layers=2)
    step = segc.jit(model, boundaries="layers.*")
    assert step.layers is model.layers and step.args is model.args  # forwarded
    prompt = mx.array([1, 2, 3, 4, 5])

    def tokens(m: object) -> list[int]:
        return [int(t) for t, _ in generate_step(prompt, m, max_tokens=5)]  # type: ignore[arg-type]

    assert tokens(step) == tokens(model)
    assert step.cache_info().misses >= 2  # the prefill and the decode graph ran through segc
    with pytest.raises(AttributeError, match="'Jitted' object has no attribute 'nosuch'"):
        _ = step.nosuch
    with pytest.raises(AttributeError):  # a function has no module to forward to
        _ = segc.jit(lambda x: x).layers


def _run_recorded(monkeypatch: pytest.MonkeyPatch, threaded: bool, calls: int = 2) -> tuple[list, int]:
    g = segc.parse(NET.read_text())
    completer = Completer(threaded=threaded)
    monkeypatch.setattr(fenced_mod, "timeline_completer", lambda: completer)
    ex = Executor(g)
    inputs = [mx.ones(i.var.shape) for i in g.inputs]
    timeline: list = []
    want = ex(list(inputs))
    for _ in range(calls):
        got = ex(list(inputs), timeline=timeline)
        mx.eval(got)
        assert all(segc.dtypes.to_bytes(a) == segc.dtypes.to_bytes(b) for a, b in zip(got, want))
    wait_complete(timeline, timeout=10.0)
    completer.close()
    return timeline, len(ex.segments)


@pytest.mark.parametrize("threaded", [True, False], ids=["completer thread", "synchronize at the end"])
def test_timeline_completes_every_segment(monkeypatch: pytest.MonkeyPatch, threaded: bool) -> None:
    if threaded and mx.default_device() != mx.cpu:
        why = "MLX's CUDA build cannot evaluate arrays from a helper thread (docs/runtime.md): no completer thread"
        pytest.skip(reason=why)
    timeline, n = _run_recorded(monkeypatch, threaded)
    done = [(k, d) for _, what, k, d in timeline if what == "complete"]
    assert sorted(k for k, _ in done) == sorted(list(range(n)) * 2)
    if not threaded:  # off the CPU: one synchronize at the call's end notes them all
        assert {d for _, d in done} == {"synchronized at the end of the call"}
    trace = to_chrome_trace(timeline, process="test")
    ends = [e for e in trace["traceEvents"] if e["ph"] == "e"]
    assert len(ends) == 2 * n
    by_id = {e["id"]: e["ts"] for e in trace["traceEvents"] if e["ph"] == "b"}
    assert all(e["ts"] >= by_id[e["id"]] for e in ends)


def test_chrome_trace_refuses_a_timeline_without_completions() -> None:
    timeline = [(1.0, "call", -1, "g"), (1.1, "dispatch", 0, "a"), (1.2, "dispatch", 1, "b"), (1.3, "complete", 0, "")]
    with pytest.raises(SegcError, match=r"no completion for \(call, segment\) \[\(0, 1\)\]"):
        to_chrome_trace(timeline)
    with pytest.raises(SegcError, match="1 of 2 segments never noted completion"):
        wait_complete(timeline, timeout=0.01)
    assert to_chrome_trace([]) == {"traceEvents": [], "displayTimeUnit": "ms"}


def test_verify_bisects_to_the_equation_that_diverges(monkeypatch: pytest.MonkeyPatch, capsys) -> None:  # type: ignore[no-untyped-def]
    import segc.cli.verify as verify
    from segc.lower import replay_fn

    def faulty(eqns, ins, outs, consts):  # type: ignore[no-untyped-def]
        # equation #11 (layers.1's first AddMM) computed with beta 2 instead of 1
        eqns = [dataclasses.replace(e, args=(1.0, 2.0)) if e.id == 11 else e for e in eqns]
        return replay_fn(eqns, ins, outs, consts)

    monkeypatch.setattr(verify, "_segment_replay", faulty)
    assert main(["verify", str(NET), "--strategy", "markers"]) == 1
    out = capsys.readouterr().out
    assert "first diverging segment: 1 'layers.1'" in out
    assert "first diverging equation: #11 AddMM in segment 1:" in out
    assert "%v10: f32[2,4] = AddMM(%v7, %v8, %v9) [1.0, 1.0] #11" in out
    monkeypatch.undo()
    assert main(["verify", str(NET), "--strategy", "markers"]) == 0
