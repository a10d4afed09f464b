"""The experiment harness end to end (issue 15): a small sweep through the Python API
and through ``segc experiment`` / ``segc calibrate`` produces CSV, JSON (with the
environment), saved plans that re-run with eager MLX's bits, and plots; every plan is
bit-identical to eager MLX; predicted peak memory is close to ``mx.get_peak_memory``.

No timing is checked. The memory bound (20%) is looser than the issue's 15% for the
reference model: on a tiny model MLX's allocator rounds small buffers up, a larger
share of a few hundred KiB (docs/experiments.md gives the figures)."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import mlx.core as mx
import pytest
from conftest import same_bits
from mlx.utils import tree_flatten

import segc
from segc.errors import SegcError
from segc.passes import Plan
from segc.passes.costmodel import MachineModel, default_model
from segc.passes.plan import apply_plan
from segc.research import Experiment, load_model, make_workload, run_experiment
from segc.research.report import COLUMNS

ROOT = Path(__file__).resolve().parents[1]
MODEL = "llama:num_hidden_layers=2"
STRATEGIES = ["none", "markers", "balanced:2..3", "memory:1x", "optimal", "optimal:1x"]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, object]:
    out = tmp_path_factory.mktemp("sweep")
    exp = Experiment(
        models=[MODEL], workloads=["decode:16", "prefill:8"], strategies=STRATEGIES, repeats=2, warmup=1,
        out=out, plots=(), progress=False,
    )  # fmt: skip
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SEGC_KV_IN_PLACE", "0")  # recorded with the run (a setting a lowering reads)
        return out, run_experiment(exp)


def test_sweep_writes_csv_and_json(sweep: tuple[Path, object]) -> None:
    out, res = sweep
    with (out / "results.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert tuple(rows[0]) == COLUMNS
    want = ["none", "markers", "balanced:2", "balanced:3", "memory:1x", "optimal", "optimal:1x", "eager"]
    for w in ("decode:16", "prefill:8"):
        assert [r["strategy"] for r in rows if r["workload"] == w] == want
    assert all(r["bit_identical"] == "True" for r in rows), [
        r["strategy"] for r in rows if r["bit_identical"] != "True"
    ]
    assert all(float(r["measured_median_s"]) > 0 and int(r["repeats"]) == 2 for r in rows)
    d = json.loads((out / "results.json").read_text())
    assert d["segc_experiment"] == 1 and d["env"]["mlx"] == mx.__version__ and "commit" in d["env"]
    assert d["env"]["device"] == str(mx.default_device())
    assert {k: v for k, v in d["env"]["settings"].items() if k == "SEGC_KV_IN_PLACE"} == {"SEGC_KV_IN_PLACE": "0"}
    assert MachineModel(**d["machine"]) == res.machine  # type: ignore[attr-defined]
    assert [(s["workload"], s["plans"], s["bit_identical"]) for s in d["summary"]] == [
        ("decode:16", 7, True),
        ("prefill:8", 7, True),
    ]
    assert len(d["rows"]) == 16
    # optimal's plans carry their dynamic program's figure, which is the CPU model's prediction
    assert [r["strategy"] for r in d["rows"] if "plan_predicted_s" in r] == ["optimal", "optimal:1x"] * 2
    assert all(s["optimal_gap"] is not None and s["optimal_gap"] <= 1e-9 for s in d["summary"]), d["summary"]


def test_optimal_gap_is_the_largest_relative_difference() -> None:
    """``report.optimal_gap`` worked by hand: a plan whose strategy said 1.1 against the
    model's 1.0 (0.1), one calibrated since (its model's figure before: 2.0, its own
    2.0: 0), one with no figure of its own (left out)."""
    from segc.research.report import optimal_gap

    rows = [
        {"plan_predicted_s": 1.1, "predicted_s": 1.0},
        {"plan_predicted_s": 2.0, "prior_predicted_s": 2.0, "predicted_s": 3.0},
        {"predicted_s": 5.0},
    ]
    assert optimal_gap(rows) == pytest.approx(0.1)
    assert optimal_gap(rows[2:]) is None


def test_predicted_peak_memory_is_close_to_mlx(sweep: tuple[Path, object]) -> None:
    """The call's own allocations (``mx.get_peak_memory()`` less what was alive before
    it) against the predicted activations, relative to the predicted peak: in a test
    process other tests' arrays are alive too, which ``segc experiment`` (a process of
    its own) does not have."""
    if mx.default_device() != mx.cpu:
        why = (
            "a tiny model on a GPU: MLX's CUDA allocations beside the arrays (cuBLAS workspaces) dwarf a "
            "few-KiB prediction; the reference model's GPU figures are in docs/experiments.md"
        )
        pytest.skip(reason=why)
    _, res = sweep
    weights = sum(v.nbytes for _, v in tree_flatten(load_model(MODEL).parameters()))
    for r in res.rows:  # type: ignore[attr-defined]
        if "predicted_peak_bytes" in r:
            resident = r["predicted_peak_bytes"] - r["predicted_activations_bytes"]
            measured = resident + r["measured_activations_bytes"]
            err = abs(r["predicted_peak_bytes"] - measured) / measured
            assert err < 0.2, (r["workload"], r["strategy"], r["predicted_activations_bytes"], measured)
            assert r["predicted_weights_bytes"] == weights
            assert r["measured_resident_bytes"] >= resident  # the model and its inputs were alive


def test_calibrated_sweep_timed_in_processes(tmp_path: Path) -> None:
    """Two calibration plans (``markers`` added to the sweep), timed with the other plans
    in two fresh processes under a commit per segment: the fit uses them, ``every:1``
    (the same cuts as ``markers``) is not held out, ``balanced:2`` is."""
    exp = Experiment(
        models=[MODEL], workloads=["prefill:8"], strategies=["none", "every:1", "balanced:2"],
        calibration=["none", "markers"], processes=2, repeats=2, warmup=0, commit="segment", out=tmp_path,
        plots=(), progress=False,
    )  # fmt: skip
    res = run_experiment(exp)
    rows = {r["strategy"]: r for r in res.rows}
    assert list(rows) == ["none", "every:1", "balanced:2", "markers", "eager"]
    assert all(r["bit_identical"] for r in rows.values())
    for r in rows.values():
        assert r["processes"] == 2 and [len(c["times"]) for c in r["calls"]] == [2, 2] and r["repeats"] == 2
        # measured: the calls adjusted to the host's median speed (timing.adjust), each
        # by the workload's slope times its probe's distance from the median probe
        probes = sorted(x for q in rows.values() for c in q["calls"] for x in c["probe"])
        mid = (probes[len(probes) // 2 - 1] + probes[len(probes) // 2]) / 2  # an even count
        for t, c in zip(r["times_s"], r["calls"]):
            want = [y - r["host_slope"] * (x - mid) for x, y in zip(c["probe"], c["times"])]
            assert t == pytest.approx(want, rel=1e-12) and min(c["probe"]) > 0
        assert r["process_low_s"] <= r["measured_median_s"] <= r["process_high_s"]
    plans = ["none", "every:1", "balanced:2", "markers"]
    assert [rows[p]["calibration"] for p in plans] == [True, False, False, True]
    assert [rows[p]["held_out"] for p in plans] == [False, False, True, False]
    assert [rows[p]["commits"] for p in plans] == [rows[p]["segments"] for p in plans]  # a commit per segment
    fit = res.fitted[MODEL]
    assert fit["plans"] == ["markers", "none"] and fit["observations"] == 2 and "commit_s" not in fit["free"]
    # the calibrated model saved beside the results, as --machine takes it
    (saved,) = (tmp_path / "fitted").iterdir()
    assert saved.name == "llama-num-hidden-layers-2_prefill-8.json"
    m = MachineModel.load(saved)
    assert m.source == f"calibrated: {MODEL} prefill:8"
    assert {k: getattr(m, k) for k in fit["free"] if k != "scale"} == {
        k: v for k, v in fit["machines"]["prefill:8"].items() if k in fit["free"]
    }
    assert fit["host_weight"] == 1.0  # the measured host times are fitted too (Experiment.host_weight)
    # the host's saving on a repeated segment: fitted on a GPU (Experiment.fit_repeats)
    assert fit["repeats"] is (mx.default_device() == mx.gpu)
    # and the device's time per command buffer: fitted on a GPU (Experiment.fit_segment_device)
    assert fit["segment_device"] is (mx.default_device() == mx.gpu)
    assert all("prior_predicted_s" in rows[p] for p in plans)
    (s,) = res.summary()
    assert s["heldout_plans"] == 1 and s["spearman_heldout"] is None  # one plan ranks nothing
    d = json.loads((tmp_path / "results.json").read_text())
    assert d["fitted"][MODEL]["machines"]["prefill:8"]["device"] == ("gpu" if mx.default_device() == mx.gpu else "cpu")
    assert d["experiment"]["commit_policy"] == "segment"
    assert d["experiment"]["order"] == "rounds" and d["experiment"]["host_weight"] == 1.0


def test_the_fit_reads_calibration_plans_only() -> None:
    """``calibrate`` on rows written by hand: whatever the held-out rows measured, the
    fitted model is the same; change a calibration row's time and it changes."""
    from segc.ir import parse
    from segc.passes.costmodel import CPU
    from segc.passes.plan import plan_at
    from segc.research.calibrated import Prepared, calibrate
    from segc.research.models import Workload

    lines = [f"  %v{k}: f32[4,8] = Matmul(%v{k - 1}, %p0) #{k}" for k in range(1, 8)]
    g = parse(
        'graph f(%v0: f32[4,8] arg="0", %p0: f32[8,8] param="w") {\n' + "\n".join(lines) + "\n  return (%v7)\n}\n"
    )

    def prep(times: dict[str, float]) -> Prepared:
        p = Prepared(Workload("w", mx.array([[1]])), [], [], {}, {})
        for name, cuts in {"c1": [], "c2": [2, 4, 6], "c3": [3], "h1": [1, 2, 3, 4, 5, 6], "h2": [5]}.items():
            plan = plan_at(g, name, cuts)
            row = {"model": "m", "workload": "w", "strategy": name, "calibration": name[0] == "c"}
            row |= {"predicted_s": 0.0, "measured_median_s": times[name]}
            p.rows.append(row)
            p.cuts[id(row)], p.plans[id(row)] = apply_plan(g, plan), plan
        return p

    base = {"c1": 1e-4, "c2": 2e-4, "c3": 1.2e-4, "h1": 3e-4, "h2": 1e-4}
    a = calibrate(CPU, "segment", [prep(base)])
    b = calibrate(CPU, "segment", [prep(base | {"h1": 5.0, "h2": 1e-9})])
    c = calibrate(CPU, "segment", [prep(base | {"c2": 5e-4})])
    assert a == b and a["plans"] == ["c1", "c2", "c3"] and a["overheads"] == "group"
    assert a["machines"] != c["machines"]
    # one workload: its own overheads are the shared ones
    d = calibrate(CPU, "segment", [prep(base)], overheads="shared")
    assert d["machines"] == a["machines"] and d["overheads"] == "shared"


def test_saved_plans_rerun_bit_identical(sweep: tuple[Path, object]) -> None:
    out, res = sweep
    model = load_model(MODEL)
    wl = make_workload("prefill:8", model)
    want = wl.reference(model)
    for r in res.rows:  # type: ignore[attr-defined]
        if r["workload"] == "prefill:8" and "plan_file" in r:
            plan = Plan.load(out / r["plan_file"])
            a, k = wl.args()
            assert same_bits(segc.jit(model, boundaries="layers.*", strategy=plan)(*a, **k), want), r["strategy"]


def test_sweep_plots(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib", reason="plots need matplotlib: pip install 'segc[research]'")
    exp = Experiment(
        models=[MODEL], workloads=["prefill:8"], strategies=["none", "balanced:2..3"], repeats=1, warmup=0,
        out=tmp_path, plots=("png", "svg"), progress=False, eager=False,
    )  # fmt: skip
    run_experiment(exp)
    for fmt in ("png", "svg"):
        p = tmp_path / f"plot_llama-num-hidden-layers-2_prefill-8.{fmt}"
        assert p.stat().st_size > 1000
    assert (tmp_path / "plot_llama-num-hidden-layers-2_prefill-8.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _segc(*args: str, timeout: int = 240) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run(
        [sys.executable, "-m", "segc", *args], capture_output=True, text=True, env=env, timeout=timeout, cwd=ROOT
    )


@pytest.mark.slow
def test_cli_experiment_and_calibrate(tmp_path: Path) -> None:
    p = _segc("calibrate", "--fit", "none", "--repeats", "2", "--out", str(tmp_path / "m.json"))
    assert p.returncode == 0, p.stderr
    m = MachineModel.load(tmp_path / "m.json")
    assert m.flops_per_s > 0 and m.source.startswith("calibrated on")
    p = _segc(
        "experiment", "--model", MODEL, "--workload", "prefill:8", "--strategy", "balanced:1..2", "--repeats", "1",
        "--machine", str(tmp_path / "m.json"), "--plots", "", "--quiet", "--out", str(tmp_path / "x"),
        "--calibration", "balanced:1", "--overheads", "device",
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    assert "| `balanced:2` | 2 |" in p.stdout and '"bit_identical": true' in p.stdout
    assert (tmp_path / "x" / "results.csv").is_file() and (tmp_path / "x" / "plans").is_dir()
    # overheads "device": the calibration kept the machine model's host figures
    fitted = json.loads((tmp_path / "x" / "results.json").read_text())["fitted"]
    (fit,) = fitted.values()
    assert fit["overheads"] == "device"
    for mm in fit["machines"].values():
        assert mm["dispatch_s"] == m.dispatch_s and mm["host_op_s"] == m.host_op_s


@pytest.mark.parametrize(
    ("args", "msg"),
    [
        (["--workload", "bogus:1"], "workload 'bogus:1'"),
        (["--model", "nosuchmodel"], "model 'nosuchmodel'"),
        (["--strategy", "balanced:9..2"], "needs LO <= HI"),
        (["--repeats", "0"], "repeats must be >= 1"),
        (["--processes", "0"], "processes must be >= 1"),
        (["--commit", "every"], "commit must be one of"),
        (["--overheads", "hostly"], "invalid choice: 'hostly'"),
        (["--order", "shuffled"], "invalid choice: 'shuffled'"),
        (["--time-limit", "0"], "time_limit must be > 0"),
        (["--fit-first"], "fit_first needs calibration plans"),
    ],
)
def test_cli_experiment_bad_input(args: list[str], msg: str) -> None:
    p = _segc("experiment", "--model", MODEL, "--quiet", "--plots", "", *args)
    assert p.returncode == 2 and msg in p.stderr, p.stderr


def test_models_from_a_file_and_bad_specs(tmp_path: Path) -> None:
    src = tmp_path / "mine.py"
    src.write_text(
        "import mlx.nn as nn\n\n\nclass Two(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
        "        self.embed = nn.Embedding(16, 8)\n        self.out = nn.Linear(8, 16)\n\n"
        "    def __call__(self, x):\n        return self.out(self.embed(x))\n\n\ndef make():\n    return Two()\n\n\n"
        "def not_a_module():\n    return 3\n"
    )
    model = load_model(f"{src}:make")
    wl = make_workload("prefill:4", model)
    a, k = wl.args()
    # token ids within the embedding's 16 rows (no mlx-lm args): one past them reads outside the table
    assert wl.tokens.tolist() == [[3, 10, 1, 8]]
    assert same_bits(segc.jit(model, strategy="optimal")(*a, **k), wl.reference(model))
    with pytest.raises(SegcError, match=r"returned a int, not an mlx\.nn\.Module"):
        load_model(f"{src}:not_a_module")
    with pytest.raises(SegcError, match="no function 'nope'"):
        load_model(f"{src}:nope")
    with pytest.raises(SegcError, match="does not exist"):
        load_model(f"{tmp_path / 'missing.py'}:make")
    with pytest.raises(SegcError, match="is not field=value"):
        load_model("llama:hidden_size")
    with pytest.raises(SegcError, match="the model takes no mlx-lm KV caches"):
        make_workload("decode:4", model)


def test_saved_graphs_are_the_trace_and_predict_the_plans_again(sweep: tuple[Path, object]) -> None:
    """The run's traced graph, saved beside its plans, is the trace (compared with a trace
    made here) and gives each plan the prediction the run recorded: what lets a GPU run's
    plans be predicted again on another machine (``benchmarks/repredict.py``)."""
    from segc.ir import parse, to_text
    from segc.passes.costmodel import predict_time

    out, res = sweep
    model = load_model(MODEL)
    rows = [r for r in res.rows if r.get("plan_file")]  # type: ignore[attr-defined]
    assert rows and all(r.get("graph_file") for r in rows)
    for wspec in {r["workload"] for r in rows}:
        wl = make_workload(wspec, model)
        a, k = wl.args()
        here = segc.jit(model, boundaries="layers.*").trace(*a, **k).graph
        (gfile,) = {r["graph_file"] for r in rows if r["workload"] == wspec}
        saved = parse((out / gfile).read_text())
        assert to_text(saved) == to_text(here)
        machine = res.machine  # type: ignore[attr-defined]
        for r in rows:
            if r["workload"] == wspec and "prior_predicted_s" not in r:
                got = predict_time(apply_plan(saved, Plan.load(out / r["plan_file"])), machine, "segment").total
                assert got == r["predicted_s"], r["strategy"]


def test_repredict_calibrates_on_the_plans_it_is_given(sweep: tuple[Path, object], tmp_path: Path) -> None:
    """``benchmarks/repredict.py --calibration none,markers``: the run (which had no
    calibration plans) is fitted to those two, and every other plan whose cuts differ
    from theirs is held out (counted here from the saved plans' cuts)."""
    out, res = sweep
    summary = tmp_path / "summary.json"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "repredict.py"), str(out), "--calibration", "none,markers"]
    p = subprocess.run([*cmd, "--json", str(summary)], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert p.returncode == 0, p.stdout + p.stderr
    d = json.loads(summary.read_text())
    rows = [r for r in res.rows if r.get("plan_file")]  # type: ignore[attr-defined]
    for s in d["summary"]:
        mine = [r for r in rows if r["workload"] == s["workload"]]
        cuts = {r["strategy"]: tuple(c.after for c in Plan.load(out / r["plan_file"]).cuts) for r in mine}
        fitted_to = {cuts["none"], cuts["markers"]}
        assert s["heldout_plans"] == sum(c not in fitted_to for c in cuts.values()), (s["workload"], cuts)
    assert set(d["fitted"]["llama:num_hidden_layers=2"]["machines"]) == {"decode:16", "prefill:8"}
    # the per-buffer device term as the run had it (fitted on a GPU only), unless asked
    assert d["fitted"]["llama:num_hidden_layers=2"]["segment_device"] is (mx.default_device() == mx.gpu)


def test_repredict_sets_a_figure_and_refuses_an_unknown_one(sweep: tuple[Path, object], tmp_path: Path) -> None:
    """``repredict.py --set NAME=VALUE``: a figure the calibration does not fit
    (``commit_s``) reaches every fitted machine as given; a name that is no figure of
    the machine model is refused, naming it."""
    out, _ = sweep
    summary = tmp_path / "summary.json"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "repredict.py"), str(out), "--calibration", "none,markers"]
    p = subprocess.run(
        [*cmd, "--set", "commit_s=0.00125", "--segment-device", "--json", str(summary)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    fit = json.loads(summary.read_text())["fitted"]["llama:num_hidden_layers=2"]
    assert fit["segment_device"] is True and "segment_device_s" in fit["free"]  # --segment-device
    fitted = fit["machines"]
    assert {w: m["commit_s"] for w, m in fitted.items()} == {"decode:16": 0.00125, "prefill:8": 0.00125}
    bad = subprocess.run([*cmd, "--set", "nonsense=1"], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert bad.returncode == 2 and "nonsense=1" in bad.stderr, bad.stderr
    nan = subprocess.run([*cmd, "--set", "commit_s=soon"], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert nan.returncode == 2 and "'soon' is not a number" in nan.stderr, nan.stderr


def test_repredict_counts_repeated_segments_and_fits_their_term(sweep: tuple[Path, object]) -> None:
    """``repredict.py --repeats``: four identical blocks cut apart are one segment and
    three repeats of it (a different last segment repeats nothing), and the run prints
    one repeat line per workload, its term a saving or nothing."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from repredict import repeated

    ws = [mx.full((4,), float(i + 1)) for i in range(4)]

    def blocks(x: mx.array) -> mx.array:
        for i, w in enumerate(ws):
            x = segc.boundary(mx.sin(x * w) + 1.0, f"b{i}")
        return x.sum()

    assert repeated(segc.jit(blocks).trace(mx.ones((4,))).graph) == 3
    out, _ = sweep
    cmd = [sys.executable, str(ROOT / "benchmarks" / "repredict.py"), str(out), "--calibration", "none,markers"]
    p = subprocess.run([*cmd, "--repeats"], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert p.returncode == 0, p.stdout + p.stderr
    lines = [ln for ln in p.stdout.splitlines() if "repeat term" in ln or "no repeat term" in ln]
    assert [ln.split(":")[0] for ln in lines] == ["decode", "prefill"], p.stdout
    for ln in lines:
        if "repeat term" in ln and "no repeat" not in ln:
            assert float(ln.split("repeat term ")[1].split(" us")[0]) <= 0.0, ln


def test_repredict_regimes_post_stratify_each_plan_by_hand() -> None:
    """``repredict.py --regimes``' split (``split_halves``), worked by hand: eight calls'
    probes, median 2.15 s, so four calls a half; plan A's calls 10, 11, 12 (fast) and 20
    (slow) measure 0.5 * 11 + 0.5 * 20 = 15.5 where their median is 11.5; B's 13 and 21,
    23, 25 measure 18; the halves' host speeds are the pooled ratios of each call's host
    share to its plan's median (fast 5/5.5, 5/5.5, 6/5.5, 6/10: 0.909; slow 0.9, 1.1,
    1.2, 9/5.5: 1.15). A is the one-segment plan (``none``): its time after the host, 6
    fast and 11 slow, over their weighted mean 8.5 is each half's device speed. Plans
    whose calls all fall in one half are left as measured, the device speeds then 1."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from repredict import split_halves

    def row(calls: list[tuple[list[float], list[float], list[float]]]) -> dict:
        return {"measured_median_s": -1.0, "calls": [{"times": t, "host": h, "probe": p} for t, h, p in calls]}

    a = row([([10, 11, 12, 20], [5, 5, 6, 9], [1.0, 1.1, 1.2, 3.0])]) | {"strategy": "none"}
    b = row([([13, 21, 23], [6, 9, 11], [1.3, 3.1, 3.2]), ([25], [12], [3.3])])
    hv = split_halves([a, b])
    assert hv.threshold == pytest.approx(2.15) and hv.weights == (0.5, 0.5)
    assert hv.factors == pytest.approx((10 / 11, 1.15)) and hv.device == pytest.approx((6 / 8.5, 11 / 8.5))
    assert a["measured_median_s"] == pytest.approx(15.5) and a["host_median_s"] == pytest.approx(7.0)
    assert b["measured_median_s"] == pytest.approx(18.0) and b["host_median_s"] == pytest.approx(8.5)
    assert hv.per_plan[id(a)] == [(5, 6, 11), (9, 11, 20)] and hv.per_plan[id(b)] == [(6, 7, 13), (11, 12, 23)]
    d, e = row([([1, 2], [1, 1], [1.0, 2.0])]) | {"strategy": "none"}, row([([3, 4], [1, 1], [3.0, 4.0])])
    hv = split_halves([d, e])
    assert not hv.per_plan and d["measured_median_s"] == e["measured_median_s"] == -1.0 and hv.device == (1.0, 1.0)


def test_repredict_regimes_report_each_workloads_halves(sweep: tuple[Path, object]) -> None:
    """``repredict.py --regimes`` on a run with host probes: a line of halves and a
    post-stratified Spearman per workload."""
    out, _ = sweep
    cmd = [sys.executable, str(ROOT / "benchmarks" / "repredict.py"), str(out), "--calibration", "none,markers"]
    p = subprocess.run([*cmd, "--regimes"], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert p.returncode == 0, p.stdout + p.stderr
    heads = [
        ln.split(":")[0] + ":" + ln.split(":")[1] for ln in p.stdout.splitlines() if ": halves at a probe of" in ln
    ]
    assert heads == ["decode:16", "prefill:8"], p.stdout
    assert sum("post-stratified, Spearman" in ln for ln in p.stdout.splitlines()) == 2, p.stdout


def test_plans_made_with_a_runs_fitted_models(tmp_path: Path) -> None:
    """``segc experiment --machine DIR`` (``read_fitted``, ``Experiment.planners``): the
    workload with a calibrated model in the folder has its plans made with it, the
    other with the built-in model; each ``optimal`` is the plan that model's own
    dynamic program makes, computed here apart. A folder with no model for the sweep is
    refused, naming the files it looked for."""
    from segc.errors import ScheduleError
    from segc.passes import make_plan
    from segc.research import read_fitted

    base = default_model()
    dear = replace(base, dispatch_s=1.0, source="calibrated: dear")  # a second a segment: one segment wins
    (tmp_path / "fitted").mkdir()
    dear.save(tmp_path / "fitted" / "llama-num-hidden-layers-2_prefill-8.json")
    with pytest.raises(ScheduleError, match=r"llama-num-hidden-layers-2_decode-16\.json"):
        read_fitted(tmp_path / "fitted", [MODEL], ["decode:16"])
    planners = read_fitted(tmp_path / "fitted", [MODEL], ["decode:16", "prefill:8"])
    assert list(planners) == [(MODEL, "prefill:8")] and planners[MODEL, "prefill:8"] == dear
    exp = Experiment(
        models=[MODEL], workloads=["decode:16", "prefill:8"], strategies=["optimal"], repeats=1, warmup=0,
        planners=planners, out=tmp_path / "x", plots=(), progress=False, eager=False,
    )  # fmt: skip
    res = run_experiment(exp)
    rows = {r["workload"]: r for r in res.rows}
    model = load_model(MODEL)
    for w, m in (("decode:16", base), ("prefill:8", dear)):
        a, kw = make_workload(w, model).args()
        want = make_plan(segc.jit(model, boundaries="layers.*").trace(*a, **kw).graph, "optimal", model=m)
        saved = Plan.load(tmp_path / "x" / rows[w]["plan_file"])
        assert saved.cuts == want.cuts and rows[w]["plan_predicted_s"] == want.info["predicted_s"], w
        assert rows[w]["bit_identical"]
    assert rows["prefill:8"]["segments"] == 1 and rows["decode:16"]["segments"] > 1  # the two models differ
    d = json.loads((tmp_path / "x" / "results.json").read_text())
    assert d["experiment"]["planned_with"] == {f"{MODEL} prefill:8": "calibrated: dear"}


def test_cli_experiment_takes_a_fitted_folder(tmp_path: Path) -> None:
    """``--machine DIR``: the folder's model plans its workload (recorded in the results);
    a folder with none for the sweep is a clear error, exit status 2."""
    (tmp_path / "fitted").mkdir()
    replace(default_model(), dispatch_s=1.0, source="calibrated: dear").save(
        tmp_path / "fitted" / "llama-num-hidden-layers-2_prefill-8.json"
    )
    common = ["experiment", "--model", MODEL, "--strategy", "optimal", "--repeats", "1", "--warmup", "0"]
    p = _segc(*common, "--workload", "decode:16", "--machine", str(tmp_path / "fitted"), "--quiet", "--plots", "")
    assert p.returncode == 2 and "no calibrated machine model" in p.stderr, p.stderr
    p = _segc(
        *common, "--workload", "prefill:8", "--machine", str(tmp_path / "fitted"), "--quiet", "--plots", "",
        "--no-eager", "--out", str(tmp_path / "x"),
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    d = json.loads((tmp_path / "x" / "results.json").read_text())
    assert d["experiment"]["planned_with"] == {f"{MODEL} prefill:8": "calibrated: dear"}
    assert [r["segments"] for r in d["rows"]] == [1]  # a second a segment: optimal keeps one


def test_fit_first_plans_with_the_model_this_run_fits(tmp_path: Path) -> None:
    """``Experiment.fit_first``: the calibration plans are timed and fitted first (their
    own results and ``fitted/`` in ``fit-first/``), then every plan is made with that fit:
    ``optimal`` is the plan the saved fitted model's own search makes, computed here apart
    (its predicted figure too, which the built-in model would not give). Without
    calibration plans it is refused before anything runs."""
    from segc.passes import make_plan

    with pytest.raises(SegcError, match="fit_first needs calibration plans"):
        run_experiment(Experiment(models=[MODEL], workloads=["decode:16"], fit_first=True, out=tmp_path / "no"))
    assert not (tmp_path / "no").exists()
    exp = Experiment(
        models=[MODEL], workloads=["decode:16"], strategies=["optimal", "every:2"], repeats=2, warmup=1,
        calibration=["none", "markers", "balanced:2"], fit_first=True, out=tmp_path / "x", plots=(),
        progress=False,
    )  # fmt: skip
    res = run_experiment(exp)
    saved = tmp_path / "x" / "fit-first" / "fitted" / "llama-num-hidden-layers-2_decode-16.json"
    fitted = MachineModel.load(saved)
    first = json.loads((tmp_path / "x" / "fit-first" / "results.json").read_text())
    assert sorted(r["strategy"] for r in first["rows"]) == ["balanced:2", "markers", "none"]  # no eager, no others
    rows = {r["strategy"]: r for r in res.rows}
    assert sorted(rows) == ["balanced:2", "eager", "every:2", "markers", "none", "optimal"]
    model = load_model(MODEL)
    a, kw = make_workload("decode:16", model).args()
    g = segc.jit(model, boundaries="layers.*").trace(*a, **kw).graph
    want = make_plan(g, "optimal", model=replace(fitted, device="gpu" if mx.default_device() == mx.gpu else "cpu"))
    got = Plan.load(tmp_path / "x" / rows["optimal"]["plan_file"])
    assert got.cuts == want.cuts and rows["optimal"]["plan_predicted_s"] == want.info["predicted_s"]
    builtin = make_plan(g, "optimal", model=default_model())
    assert rows["optimal"]["plan_predicted_s"] != builtin.info["predicted_s"]  # the fit, not the built-in model
    assert all(r["bit_identical"] for r in res.rows)
    d = json.loads((tmp_path / "x" / "results.json").read_text())
    assert d["experiment"]["fit_first"] is True and d["experiment"]["planned_with"] == {
        f"{MODEL} decode:16": f"fitted first: {MODEL} decode:16"
    }
    assert d["experiment"]["fit_first_fitted"] == first["fitted"] and d["fitted"][MODEL]  # the second phase's own fit
