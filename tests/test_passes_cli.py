"""``segc passes``: compare strategies, print the IR after passes, save/diff/apply plans."""

from __future__ import annotations

import json

import pytest

from segc.cli import main

SMALL = ["--layers", "2", "--hidden", "64", "--intermediate", "128", "--heads", "4", "--kv-heads", "2"]
SMALL += ["--vocab", "128", "--tokens", "8"]


@pytest.mark.slow
def test_compare_prints_a_table_of_every_strategy(capsys):
    assert main(["passes", "--compare", "--check-bits", "--format", "markdown", *SMALL]) == 0
    out = capsys.readouterr().out
    rows = [ln for ln in out.splitlines() if ln.startswith("| `")]
    names = [r.split("`")[1] for r in rows]
    assert names[:3] == ["none", "markers", "every(2)"]
    assert any(n.startswith("balanced(") for n in names) and any(n.startswith("memory(") for n in names)
    assert "min_boundary_bytes" in names and "after_each_softmax" in names
    assert all(r.endswith("| yes |") for r in rows)
    head = next(ln for ln in out.splitlines() if ln.startswith("| strategy"))
    assert "largest segment cost (h200 model)" in head and head.endswith(
        "| moved cuts | bit-identical to unsegmented |"
    )


@pytest.mark.slow
def test_compare_with_measured_costs(capsys):
    assert main(["passes", "--compare", "--measure", "--format", "markdown", *SMALL]) == 0
    assert "| `balanced(3, measured)` | " in capsys.readouterr().out


def _schedule_ids() -> tuple[int, int]:
    """A cut node's equation (a cut after it splits no fused chain, or the fences pass
    would move it) and a wait's later equation, on the graph `segc passes` builds (the
    GPU trace keeps mx.fast ops whole: about 100 equations against 300 on the CPU)."""
    import mlx.core as mx

    import segc
    from segc.models import tiny_llama
    from segc.passes.legalize import legal_points

    model = tiny_llama(
        hidden_size=64, num_hidden_layers=2, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=128, dtype=mx.bfloat16,
    )  # fmt: skip
    g = segc.jit(model, boundaries="layers.*").trace(mx.array([[(7 * i) % 128 for i in range(8)]])).graph
    ops = [e for e in g.eqns if not e.is_pseudo]
    pts = legal_points(g)
    return ops[pts[len(pts) // 5] - 1].id, ops[pts[3 * len(pts) // 4]].id


def test_print_after_every_pass(capsys, tmp_path):
    after, at = _schedule_ids()
    sched = tmp_path / "s.json"
    sched.write_text(
        json.dumps({"cuts": [{"after": after, "signal": ["kv", 1]}], "waits": [{"at": at, "event": "kv", "value": 1}]})
    )
    argv = ["passes", *SMALL, "--strategy", "balanced:3", "--schedule", str(sched), "--window", "30:60"]
    assert main([*argv, "--print-after", "all"]) == 0
    out = capsys.readouterr().out
    assert [ln for ln in out.splitlines() if ln.startswith("// IR after")] == [
        "// IR after input",
        "// IR after cut",
        "// IR after fences",
        "// IR after window",
    ]
    assert 'segc.signal() ["kv", 1]' in out and 'segc.window() ["window", 30, 60, "range"' in out


def test_plans_save_diff_and_apply(capsys, tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    assert main(["passes", *SMALL, "--strategy", "balanced:2", "--plan-out", str(a)]) == 0
    assert main(["passes", *SMALL, "--strategy", "markers", "--plan-out", str(b)]) == 0
    capsys.readouterr()
    assert main(["passes", "--plan-diff", str(a), str(b)]) == 0
    assert "+ cut after #" in capsys.readouterr().out
    assert main(["passes", *SMALL, "--plan-in", str(a)]) == 0
    text = capsys.readouterr().out
    assert text.count("-- segment") == 2
    # the plan belongs to this graph only
    assert main(["passes", *SMALL, "--layers", "3", "--plan-in", str(a)]) == 2
    assert "was made for graph" in capsys.readouterr().err


@pytest.mark.parametrize("spec", ["bogus", "memory:1"])
def test_bad_strategy_is_a_clean_error(capsys, spec):
    assert main(["passes", *SMALL, "--strategy", spec]) == 2
    assert capsys.readouterr().err.startswith("segc passes: ")


def test_docs_example_runs(capsys):
    from pathlib import Path

    text = (Path(__file__).parent.parent / "docs" / "passes.md").read_text()
    code = text.split("```python\n", 1)[1].split("```", 1)[0]
    exec(compile(code, "docs/passes.md", "exec"), {})
    out = capsys.readouterr().out
    assert "fences" in out and "segc.window()" in out and "segc.signal()" in out
