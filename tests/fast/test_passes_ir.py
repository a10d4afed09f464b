"""Each pass against short inline IR text; the verifier's fence and window rules;
printing and parsing back; the pipeline's checks and dumps. No MLX execution."""

from __future__ import annotations

import textwrap

import pytest

from segc import IRError, ScheduleError
from segc.ir import parse, segments, to_text
from segc.passes import PASSES, register, run, run_pass
from segc.passes.analysis import header_annotator
from segc.passes.fences import CutNode, Schedule, WaitNode
from segc.passes.pipeline import Step

SRC = """\
graph f(%a0: f32[4,4] arg="0", %a1: f32[4,4] arg="1") {
  %v0: f32[4,4] = Matmul(%a0, %a1) #0
  %v1: f32[4,4] = Exp(%v0) #1
  %v2: f32[4,4] = Multiply(%v1, %a1) #2
  %v3: f32[4,4] = Matmul(%v2, %a0) #3
  %v4: f32[4,4] = Add(%v3, %v0) #4
  return (%v4)
}
"""
HEAD = 'graph f(%a0: f32[4,4] arg="0", %a1: f32[4,4] arg="1") {\n'
EQ = {
    0: "  %v0: f32[4,4] = Matmul(%a0, %a1) #0",
    1: "  %v1: f32[4,4] = Exp(%v0) #1",
    2: "  %v2: f32[4,4] = Multiply(%v1, %a1) #2",
    3: "  %v3: f32[4,4] = Matmul(%v2, %a0) #3",
    4: "  %v4: f32[4,4] = Add(%v3, %v0) #4",
}


def body(*lines: str | int) -> str:
    """Expected text: ints are the equations above, strings other lines."""
    out = [EQ[x] if isinstance(x, int) else f"  {x}" for x in lines]
    return HEAD + "\n".join(out) + "\n  return (%v4)\n}\n"


def text(g) -> str:
    return to_text(g, headers=False)


@pytest.fixture
def g():
    return parse(SRC)


def test_strip_cuts(g):
    cut = run_pass("cut", g, strategy=lambda g: [0, 3])
    assert text(run_pass("strip_cuts", cut)) == SRC


def test_cut_user_callable_and_legalisation(g):
    # Exp -> Multiply is a chain mx.compile fuses: a cut after #1 moves to after #0
    out = run_pass("cut", g, strategy=lambda g: [(1, "mid"), 3])
    assert text(out) == body(0, 'segc.cut() ["mid"] #5', 1, 2, 3, 'segc.cut() ["cut1"] #6', 4)


def test_cut_without_legalisation_keeps_the_split(g):
    out = run_pass("cut", g, strategy=lambda g: [1], legalize=False)
    assert text(out) == body(0, 1, 'segc.cut() ["cut0"] #5', 2, 3, 4)


def test_legalize_pass_moves_and_is_idempotent(g):
    bad = run_pass("cut", g, strategy=lambda g: [(1, "x")], legalize=False)
    good = run_pass("legalize", bad)
    assert text(good) == body(0, 'segc.cut() ["x"] #5', 1, 2, 3, 4)
    assert run_pass("legalize", good) == good


def test_cut_every_without_markers(g):
    # every 2 equations: after #1 (moved to #0: #1 -> #2 is a fused chain) and after #3
    out = run_pass("cut", g, strategy="every:2")
    assert text(out) == body(0, 'segc.cut() ["cut0"] #5', 1, 2, 3, 'segc.cut() ["cut1"] #6', 4)


SCHED = Schedule(
    cuts=(CutNode(2, ("kv", 1), "attn"),),
    waits=(WaitNode(4, "kv", 1), WaitNode(0, "pager", 3)),
    host_events=("pager",),
)


def test_fences(g):
    out = run_pass("fences", g, schedule=SCHED)
    assert text(out) == body(
        'segc.host_event() ["pager"] #5',
        'segc.wait() ["pager", 3] #9',
        0,
        1,
        2,
        'segc.signal() ["kv", 1] #6',
        'segc.cut() ["attn"] #7',
        'segc.wait() ["kv", 1] #8',
        3,
        4,
    )
    assert run_pass("fences", out, schedule=SCHED) == out  # idempotent
    assert parse(to_text(out)) == out


def test_fences_skip_nodes_of_other_graphs(g):
    out = run_pass("fences", g, schedule=Schedule((CutNode(99, ("kv", 1)),), (WaitNode(77, "kv", 1),)))
    assert out == g


def test_cut_keeps_fences_in_place(g):
    fenced = run_pass("fences", g, schedule=SCHED)
    recut = run_pass("cut", fenced, strategy=lambda g: [0])
    assert text(recut) == body(
        'segc.host_event() ["pager"] #5',
        'segc.wait() ["pager", 3] #9',
        0,
        'segc.cut() ["cut0"] #10',
        1,
        2,
        'segc.signal() ["kv", 1] #6',
        'segc.wait() ["kv", 1] #8',
        3,
        4,
    )


def test_window(g):
    cut = run_pass("cut", g, strategy=lambda g: [0, 2])
    out = run_pass("window", cut, first=3, last=4, name="band")
    assert text(out) == body(
        0,
        'segc.cut() ["cut0"] #5',
        1,
        2,
        'segc.cut() ["cut1"] #6',
        'segc.window() ["band", 3, 4, "range", ["v2", "v0"], ["v4"]] #7',
        3,
        4,
    )
    assert run_pass("window", out, first=3, last=4, name="band") == out
    assert parse(to_text(out)) == out
    # a window over #1..#3 selects the two segments holding them
    w2 = run_pass("window", cut, first=1, last=3)
    assert 'segc.window() ["window", 1, 3, "range", ["v0"], ["v4"]] #7' in text(w2)


def test_window_neither_endpoint_selects_everything(g):
    out = run_pass("window", g, first=100, last=200)
    assert text(out) == body('segc.window() ["window", 100, 200, "all", [], []] #5', 0, 1, 2, 3, 4)


@pytest.mark.parametrize(("first", "last", "missing"), [(1, 99, "last endpoint #99"), (99, 1, "first endpoint #99")])
def test_window_one_endpoint_is_an_error(g, first, last, missing):
    with pytest.raises(ScheduleError, match=missing):
        run_pass("window", g, first=first, last=last)


def test_window_backwards_is_an_error(g):
    with pytest.raises(ScheduleError, match="comes after"):
        run_pass("window", g, first=3, last=1)


# --------------------------------------------------------------------------- verifier


def with_lines(*extra: tuple[int, str]) -> str:
    """SRC with lines inserted before the given equation ids."""
    lines = SRC.splitlines()
    for before, line in sorted(extra, reverse=True):
        k = next(i for i, ln in enumerate(lines) if ln.endswith(f"#{before}"))
        lines.insert(k, f"  {line}")
    return "\n".join(lines) + "\n"


def test_verifier_rejects_unsatisfiable_wait():
    with pytest.raises(IRError, match="no signal of 'kv' reaches 2"):
        parse(
            with_lines(
                (1, 'segc.signal() ["kv", 1] #10'), (1, 'segc.cut() ["a"] #11'), (3, 'segc.wait() ["kv", 2] #12')
            )
        )


def test_verifier_accepts_declared_host_event():
    g = parse(with_lines((0, 'segc.host_event() ["kv"] #10'), (3, 'segc.wait() ["kv", 2] #12')))
    assert [e.prim for e in g.eqns][:1] == ["segc.host_event"]


def test_verifier_rejects_deadlock_in_same_or_later_segment():
    with pytest.raises(IRError, match="deadlock"):
        parse(with_lines((1, 'segc.wait() ["kv", 1] #12'), (2, 'segc.signal() ["kv", 1] #10')))
    with pytest.raises(IRError, match="deadlock: segment 0"):
        parse(
            with_lines(
                (1, 'segc.wait() ["kv", 1] #12'), (2, 'segc.cut() ["a"] #11'), (3, 'segc.signal() ["kv", 1] #10')
            )
        )


def test_verifier_rejects_non_increasing_signals():
    with pytest.raises(IRError, match="signal values must increase"):
        parse(with_lines((1, 'segc.signal() ["kv", 2] #10'), (3, 'segc.signal() ["kv", 2] #11')))


def test_verifier_rejects_bad_fence_arguments():
    with pytest.raises(IRError, match="int value >= 1"):
        parse(with_lines((1, 'segc.signal() ["kv", 0] #10')))


def test_verifier_rejects_stale_window(g):
    out = run_pass("window", run_pass("cut", g, strategy=lambda g: [0, 2]), first=3, last=4)
    stale = out.replace(eqns=tuple(e for e in out.eqns if e.id != 6))  # drop a cut under it
    with pytest.raises(IRError, match="stale"):
        parse(to_text(stale))


# --------------------------------------------------------------------------- printing


def test_headers_show_cost_live_and_boundary_bytes_and_effects(g):
    out = run_pass("fences", run_pass("cut", g, strategy=lambda g: [0]), schedule=SCHED)
    heads = [ln.strip() for ln in to_text(out).splitlines() if ln.strip().startswith("--")]
    assert heads[0] == "-- segment 0 'cut0': 1 eqns, in 2 (128 B), out 1 (64 B); host signals pager; waits pager >= 3"
    annotated = to_text(out, annotate=header_annotator(out))
    heads = [ln.strip() for ln in annotated.splitlines() if ln.strip().startswith("--")]
    assert heads[0].startswith("-- segment 0 'cut0': 1 eqns, in 2 (128 B), out 1 (64 B), cost ")
    assert "peak 192 B, cross 64 B; host signals pager; waits pager >= 3" in heads[0]
    assert heads[1].endswith("signals kv = 1 when done")
    assert "waits kv >= 1" in heads[2]
    assert parse(to_text(out)) == out
    assert parse(annotated) == out


# --------------------------------------------------------------------------- pipeline


def test_pipeline_reads_top_to_bottom_and_dumps(g, tmp_path):
    seen: list[str] = []
    out = run(
        g,
        [
            Step("cut", {"strategy": lambda g: [0, 2]}),
            ("fences", {"schedule": SCHED}),
            Step("window", {"first": 3, "last": 4}),
        ],
        checks=True,
        dump=lambda name, gg: seen.append(name),
    )
    assert seen == ["input", "cut", "fences", "window"]
    assert len(segments(out)) == 3
    run(g, ["strip_cuts", ("cut", {"strategy": "every:2"})], dump=str(tmp_path / "ir"))
    pre = f"{g.name}-{g.fingerprint()[:8]}-"
    names = sorted(p.name for p in (tmp_path / "ir").iterdir())
    assert names == [f"{pre}00-input.segc", f"{pre}01-strip_cuts.segc", f"{pre}02-cut.segc"]
    assert parse((tmp_path / "ir" / f"{pre}02-cut.segc").read_text()) == run_pass("cut", g, strategy="every:2")


def test_pipeline_dump_env_by_pass_name(g, monkeypatch, capsys):
    monkeypatch.setenv("SEGC_DUMP_IR", "cut")
    run(g, ["strip_cuts", ("cut", {"strategy": "every:2"})])
    err = capsys.readouterr().err
    assert "// IR after cut" in err and "after strip_cuts" not in err


def test_pipeline_catches_a_pass_that_drops_a_fence(g):
    @register("test_drop_fences")
    def drop(gg):
        return gg.replace(eqns=tuple(e for e in gg.eqns if e.prim != "segc.wait"))

    try:
        fenced = run_pass("fences", g, schedule=SCHED)
        with pytest.raises(IRError, match="test_drop_fences"):
            run(fenced, ["test_drop_fences"], checks=True)
        assert run(fenced, ["test_drop_fences"], checks=False) is not None
    finally:
        del PASSES["test_drop_fences"]


def test_unknown_pass_is_a_schedule_error(g):
    with pytest.raises(ScheduleError, match="no pass named 'nope'"):
        run(g, ["nope"])


def test_expected_text_helper_matches_source():
    assert body(0, 1, 2, 3, 4) == textwrap.dedent(SRC)


def test_jit_hook_dumps_from_the_environment(monkeypatch, tmp_path):
    from segc.passes.pipeline import place

    g = parse(SRC)
    monkeypatch.setenv("SEGC_DUMP_IR", str(tmp_path / "d"))
    assert place(g, None) == g  # no strategy: unchanged, dumped as the input
    assert place(g, "every:2") == run_pass("cut", g, strategy="every:2")
    pre = f"{g.name}-{g.fingerprint()[:8]}-"
    # one file per graph, signature and pass: the first place() dumped its input too
    assert sorted(p.name for p in (tmp_path / "d").iterdir()) == [f"{pre}00-input.segc", f"{pre}01-cut.segc"]
