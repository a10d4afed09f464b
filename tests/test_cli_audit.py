"""The problems an audit of the ``segc`` command found, each pinned: one model spec
parser for every subcommand and the experiment; strategies refused up front; no
verdict without timings enough, and a calibrated run judged on held-out plans only; the
host's queue kept by calibration; the user's mistakes as one line and exit status 2;
options that would be ignored refused; no output file left by a failed run; raw numbers
in csv and json. Expected values are worked out here (by hand, or from another path
than the one under test), never read from the code under test."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

import mlx.core as mx
import pytest
from mlx.utils import tree_flatten

from segc.cli import build_parser, main
from segc.errors import ScheduleError, SegcError
from segc.passes.machine import CPU
from segc.passes.strategies import Every, Memory, resolve
from segc.research import Experiment, load_model
from segc.research.report import COLUMNS, Results

ROOT = Path(__file__).resolve().parent.parent
NET = str(ROOT / "tests" / "golden" / "cli" / "net.segc")


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def mistake(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """The one stderr line of a refused command (exit status 2)."""
    rc, _, err = cli(capsys, *argv)
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and lines[0].startswith(f"segc {argv[0]}: "), (rc, err)
    assert "internal error" not in err and "Traceback" not in err
    return lines[0]


# --------------------------------------------------------------------------- 1: model specs


def _params(model: Any) -> dict[str, tuple[tuple[int, ...], bytes]]:
    return {k: (tuple(v.shape), bytes(memoryview(v.astype(mx.float32)))) for k, v in tree_flatten(model.parameters())}


def test_experiment_models_take_the_short_names_and_build_the_cli_model() -> None:
    from segc.cli.target import load

    model = load_model("llama:layers=3,hidden=32")
    assert len(model.model.layers) == 3
    assert model.model.embed_tokens.weight.shape[1] == 32
    # a resized hidden size without an intermediate one: 4 x 32
    assert model.model.layers[0].mlp.up_proj.weight.shape == (128, 32)
    args = build_parser()[0].parse_args(["trace", "llama:layers=3,hidden=32"])
    target = load(args)
    assert _params(target.fn) == _params(model)  # the same weights, shape for shape, bit for bit


def test_an_unknown_configuration_key_is_refused_naming_it() -> None:
    with pytest.raises(SegcError, match=r"'nosuchfield'.*layers, hidden"):
        load_model("llama:nosuchfield=5")
    with pytest.raises(SegcError, match="layers=x"):
        load_model("llama:layers=x")


def test_an_experiments_plan_re_runs_with_passes_plan_in(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "x"
    rc, _, err = cli(
        capsys, "experiment", "--model", "llama:layers=2,hidden=32", "--workload", "prefill:4",
        "--strategy", "balanced:2", "--repeats", "1", "--warmup", "0", "--plots", "", "--quiet", "--no-eager",
        "--out", str(out),
    )  # fmt: skip
    assert rc == 0, err
    (plan,) = (out / "plans").glob("*.json")
    rc, text, err = cli(capsys, "passes", "llama:layers=2,hidden=32", "--tokens", "4", "--plan-in", str(plan))
    assert rc == 0, err
    assert text.count("-- segment") == 2  # balanced:2's two segments


def test_experiment_refuses_a_bad_model_spec_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    line = mistake(
        capsys, "experiment", "--model", "llama:layerz=2", "--workload", "prefill:4", "--out", str(tmp_path / "o")
    )
    assert "'layerz'" in line and "layers" in line
    assert not (tmp_path / "o").exists()


# --------------------------------------------------------------------------- 2, 7: strategies


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ("nosuch", ["'nosuch'", "balanced:N"]),
        ("balanced:0", ["n >= 1"]),
        ("balanced:5..2", ["LO <= HI"]),
        ("memory:1x..0.5x", ["LO <= HI"]),
        ("memory:-1x", ["above 0"]),
    ],
)
def test_experiment_refuses_a_bad_strategy_up_front(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], spec: str, words: list[str]
) -> None:
    out = tmp_path / "o"
    line = mistake(capsys, "experiment", "--model", "llama:layers=1", "--strategy", spec, "--out", str(out))
    assert all(w in line for w in words), line
    assert not out.exists()


def test_experiment_refuses_a_bad_calibration_spec() -> None:
    with pytest.raises(ScheduleError, match="calibration 'nosuch': no strategy 'nosuch'"):
        Experiment(models=["small"], strategies=["none"], calibration=["nosuch"]).check()


@pytest.mark.parametrize(
    "spec", ["every:", "every:0", "markers:foo", "none:3", "balanced", "memory:1.5", "memory:-1x", "optimal:-1x",
             "optimal:0x", "memory:infx", "min_boundary_bytes:a,"],
)  # fmt: skip
def test_malformed_strategy_specs_are_refused(spec: str) -> None:
    with pytest.raises(ScheduleError):
        resolve(spec)


def test_well_formed_specs_still_read() -> None:
    assert resolve("every") == Every(1)
    assert resolve("every:3") == Every(3)
    assert resolve("memory:1536") == Memory(1536)
    assert resolve("memory:1.5KiB") == Memory(1536)
    assert resolve("memory:1.5x") == Memory(relative=1.5)


def test_labels_name_their_arguments() -> None:
    import segc
    from segc.models import tiny_llama
    from segc.passes import make_plan
    from segc.passes.plan import marker_points

    model = tiny_llama(num_hidden_layers=3)
    g = segc.jit(model, boundaries="layers.*").trace(mx.array([[1, 2, 3, 4]], dtype=mx.int32)).graph
    budget = make_plan(g, "memory:2x").info["budget"]
    assert make_plan(g, "optimal:2x").strategy == f"optimal(2x={budget})"
    assert make_plan(g, "memory:2x").strategy == f"memory(2x={budget})"
    a, b = (name for _, name, _ in marker_points(g)[:2])
    assert make_plan(g, f"min_boundary_bytes:{a},{b}").strategy == f"min_boundary_bytes({a},{b})"


# --------------------------------------------------------------------------- 3: verdict


def _row(i: int, meas: float, calls: int, calib: bool | None = None) -> dict[str, Any]:
    r: dict[str, Any] = {"model": "m", "workload": "w", "strategy": f"p{i}", "predicted_s": meas}
    r |= {"measured_median_s": meas, "times_s": [[meas * (1 + 0.001 * k) for k in range(calls)]]}
    if calib is not None:
        r |= {"calibration": calib, "held_out": not calib}
    return r


def test_no_verdict_without_timings_enough() -> None:
    # predicted in the measured order (Spearman 1), but two calls a plan, one process
    (s,) = Results(machine=CPU, rows=[_row(i, 1.0 + i, calls=2) for i in range(4)], env={}).summary()
    assert s["spearman_time"] == pytest.approx(1.0)
    assert s["verdict"].startswith("not enough timings")


def test_a_calibrated_run_is_judged_on_held_out_plans_only() -> None:
    # four calibration plans and two held-out ones, every one predicted in order, ten calls each
    rows = [_row(i, 1.0 + i, calls=10, calib=i < 4) for i in range(6)]
    (s,) = Results(machine=CPU, rows=rows, env={}).summary()
    assert s["heldout_plans"] == 2
    assert s["verdict"].startswith("too few held-out plans")
    # with three held out and enough calls there is a verdict, on them
    rows = [_row(i, 1.0 + i, calls=10, calib=i < 3) for i in range(6)]
    (s,) = Results(machine=CPU, rows=rows, env={}).summary()
    assert s["verdict"] == "meets 0.8"


# --------------------------------------------------------------------------- 4: calibration


def test_calibration_keeps_the_hosts_queue() -> None:
    from segc.research.calibrate import calibrate

    m = calibrate(repeats=1)
    # MLX's CPU build throttles the host at about 50 kernels (docs/experiments.md); a GPU's: none
    assert m.queue_kernels == (0 if mx.default_device() == mx.gpu else 50)


# --------------------------------------------------------------------------- 5: the user's mistakes


@pytest.mark.parametrize(("spec", "word"), [("llama:layers=x", "layers=x"), ("llama:layers=0", "at least 1"),
                                            ("llama:layers=-1", "at least 1")])  # fmt: skip
def test_bad_architecture_values_are_one_line(capsys: pytest.CaptureFixture[str], spec: str, word: str) -> None:
    assert word in mistake(capsys, "segments", spec)


USER = """\
def raises(x):
    raise RuntimeError("boom inside model")


def raises_build():
    raise ValueError("cannot build")


def segc_fails(x):
    from segc.units import fmt_bytes
    return fmt_bytes("not a number")
"""


def test_a_raising_user_function_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "user_model.py"
    src.write_text(USER)
    line = mistake(capsys, "segments", f"{src}:raises", "--input", "x=2x2")
    assert f"{src}:raises raised RuntimeError: boom inside model (at user_model.py:2)" in line
    line = mistake(capsys, "experiment", "--model", f"{src}:raises_build", "--workload", "prefill:4")
    assert "raises_build() raised ValueError: cannot build" in line


def test_an_error_inside_segc_called_by_user_code_is_not_the_users(tmp_path: Path) -> None:
    from segc.cli.common import user_code, user_raised

    src = tmp_path / "user_model2.py"
    src.write_text(USER)
    user_code(str(src), "user_model2.py:f")
    ns: dict[str, Any] = {}
    exec(compile(src.read_text(), str(src), "exec"), ns)
    with pytest.raises(RuntimeError) as own:
        ns["raises"](None)
    assert user_raised(own.value) == "user_model2.py:f raised RuntimeError: boom inside model (at user_model2.py:2)"
    with pytest.raises(Exception) as inside:
        ns["segc_fails"](None)
    assert user_raised(inside.value) is None  # the last frame is segc's: an internal error


# --------------------------------------------------------------------------- 6: ignored options


@pytest.mark.parametrize(
    "extra",
    [["--plan-out", "{tmp}/p.json"], ["--plan-in", "{tmp}/p.json"], ["--schedule", "{tmp}/s.json"],
     ["--window", "1:2"], ["--print-after", "cut"], ["--dump-dir", "{tmp}/d"], ["--concat-projections"]],
)  # fmt: skip
def test_compare_refuses_pipeline_options(tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str]) -> None:
    extra = [e.replace("{tmp}", str(tmp_path)) for e in extra]
    assert "--compare" in mistake(capsys, "passes", NET, "--compare", *extra)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("extra", [["--measure"], ["--format", "csv"], ["--format", "table"]])
def test_compare_only_options_need_compare(capsys: pytest.CaptureFixture[str], extra: list[str]) -> None:
    line = mistake(capsys, "passes", NET, *extra)
    assert f"{extra[0]} goes with --compare" in line, line


def test_other_refused_combinations(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan = tmp_path / "p.json"
    assert "--plan-in" in mistake(capsys, "passes", NET, "--plan-in", str(plan), "--strategy", "none")
    assert "'legalize'" in mistake(capsys, "passes", NET, "--print-after", "legalize")
    m = tmp_path / "m.json"
    assert "--machine" in mistake(capsys, "experiment", "--machine", str(m), "--calibrate")
    afile = tmp_path / "file"
    afile.write_text("x")
    assert "not a directory" in mistake(capsys, "experiment", "--model", "llama:layers=1", "--out", str(afile))


# --------------------------------------------------------------------------- 8, 9: files


@pytest.mark.parametrize("text", ["[]", '"cuts"', "3"])
def test_a_schedule_that_is_not_an_object(tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str) -> None:
    path = tmp_path / "s.json"
    path.write_text(text)
    for command in ("passes", "run"):
        assert "a schedule is a JSON object" in mistake(capsys, command, NET, "--schedule", str(path))


def test_a_failed_run_leaves_no_timeline(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    t = tmp_path / "t.json"
    assert "'nosuch'" in mistake(capsys, "run", NET, "--strategy", "nosuch", "--timeline", str(t))
    assert not t.exists()
    rc, _, err = cli(capsys, "run", NET, "--timeline", str(t))
    assert rc == 0, err
    assert json.loads(t.read_text())["traceEvents"]


def test_a_failed_passes_run_saves_no_plan(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan = tmp_path / "p.json"
    # the plan is made, then the window pass refuses an endpoint that is not in the graph
    assert "#99999" in mistake(capsys, "passes", NET, "--plan-out", str(plan), "--window", "0:99999")
    assert not plan.exists()


# --------------------------------------------------------------------------- 10 and polish


def test_bench_ratio_is_a_number(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = cli(capsys, "bench", NET, "--repeats", "1", "--warmup", "0", "--format", "json")
    assert rc == 0, err
    rows = json.loads(out)["rows"]
    assert [type(r["ratio"]) for r in rows] == [float] * 3 and rows[0]["ratio"] == 1.0
    rc, out, err = cli(capsys, "bench", NET, "--repeats", "1", "--warmup", "0", "--format", "csv")
    assert float(next(csv.DictReader(io.StringIO(out)))["ratio"]) == 1.0
    rc, out, err = cli(capsys, "bench", NET, "--repeats", "1", "--warmup", "0")
    (eager,) = [ln for ln in out.splitlines() if ln.split()[:1] == ["eager"]]
    assert " 1.00 " in eager and "1.0 " not in eager.replace("1.00", "")  # two decimals


SPLIT = """\
graph f(%a0: f32[4,4] arg="0") {
  %v0: f32[4,4] = Exp(%a0) #0
  %v1: f32[4,4] = Multiply(%v0, %v0) #1
  %v2: f32[4,4] = Matmul(%v1, %a0) #2
  %v3: f32[4,4] = Add(%v2, %a0) #3
  return (%v3)
}
"""


def test_a_schedule_warning_is_one_segc_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    g, s = tmp_path / "w.segc", tmp_path / "s.json"
    g.write_text(SPLIT)
    s.write_text('{"cuts": [{"after": 0}]}')  # inside the chain Exp, Multiply: moved after #1
    rc, _, err = cli(capsys, "passes", str(g), "--schedule", str(s))
    assert rc == 0
    (line,) = err.strip().splitlines()
    assert line.startswith("segc passes: warning: cut node after #0") and "moved after #1" in line


def test_help_texts_are_plain(capsys: pytest.CaptureFixture[str]) -> None:
    for command in ("experiment", "passes", "calibrate", "ir"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        text = capsys.readouterr().out
        assert "``" not in text, command
        if command == "experiment":
            assert "default 20" in text and "default 2)" in text
        if command == "ir":
            assert "decoder layers" in text and "prompt length" in text


def test_the_csv_carries_the_optimal_plans_own_figure() -> None:
    assert "plan_predicted_s" in COLUMNS
