"""The ``segc`` command run as a user runs it: a subprocess per command, on small
targets of every kind (a function in a file, a module's ``nn.Module``, an mlx-lm
architecture, a local mlx-lm model directory, an IR file), checked against golden
output where the output is deterministic (tests/golden/cli/; ``SEGC_GOLDEN=update``
rewrites them)."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TARGETS = ROOT / "tests" / "cli_targets"
GOLDEN = ROOT / "tests" / "golden" / "cli"
SMALL = str(TARGETS / "small.py")
NET = str(GOLDEN / "net.segc")  # small:net traced, three blocks


def segc(*argv: str, rc: int = 0, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    path = os.pathsep.join([str(ROOT), str(TARGETS), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYTHONPATH": path, "COLUMNS": "200"}
    res = subprocess.run(
        [sys.executable, "-m", "segc", *argv], capture_output=True, text=True, timeout=240, env=env, cwd=cwd or ROOT
    )
    assert res.returncode == rc, f"segc {' '.join(argv)}: rc {res.returncode}\n{res.stdout}\n{res.stderr}"
    return res


def golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("SEGC_GOLDEN") == "update":
        path.write_text(text)
    assert text == path.read_text(), f"{name} differs from its golden file (SEGC_GOLDEN=update rewrites it)"


def test_help_imports_no_model_code_and_version() -> None:
    code = "import sys; from segc.cli import build_parser; build_parser(); print(sorted({'mlx_lm', 'transformers'} & set(sys.modules)))"
    res = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])},
    )
    assert res.stdout.strip() == "[]", res.stdout + res.stderr
    out = segc("--help").stdout
    for cmd in ("trace", "passes", "segments", "graph", "verify", "run", "bench", "ir", "demo", "generate"):
        assert f"    {cmd} " in out
    assert segc("--version").stdout.strip() == "segc 0.1.0"


def test_trace_a_function_in_a_file_golden() -> None:
    args = ("trace", f"{SMALL}:mlp", "--input", "x=2x4", "--input", "w=4x3")
    golden("mlp.segc", segc(*args).stdout)
    data = json.loads(segc(*args, "--json").stdout)
    assert [e["prim"] for e in data["eqns"]] == ["Matmul", "Broadcast", "Maximum", "Exp", "Reduce", "Squeeze"]
    assert data["inputs"][1] == {"name": "a1", "dtype": "f32", "shape": [4, 3], "kind": "arg", "path": "args[1]"}


def test_trace_a_module_attribute_matches_the_ir_file() -> None:
    assert segc("trace", "small:net", "--input", "x=2x4").stdout == Path(NET).read_text()


def test_segments_of_an_ir_file_golden() -> None:
    out = segc("segments", NET, "--strategy", "markers", "--format", "csv").stdout
    golden("net-segments.csv", out)
    rows = list(csv.DictReader(io.StringIO(out)))
    assert [r["name"] for r in rows] == ["layers.0", "layers.1", "tail"]
    table = segc("segments", NET).stdout
    assert "h200 roofline" in table and "peak live" in table
    js = json.loads(segc("segments", NET, "--format", "json").stdout)
    assert js["cost_model"].startswith("h200 roofline") and len(js["rows"]) == 3


def test_segments_count_the_products_a_cuda_lowering_fuses() -> None:
    """A decode step of a 3-layer llama cut in two: a layer has two residual additions
    after a product (attention out, MLP down) and one gated activation; the logits'
    product has nothing after it (and the CPU trace no whole norm). A prefill has none."""
    out = segc("segments", "llama:layers=3,hidden=64", "--tokens", "1", "--strategy", "every:2", "--format", "csv")
    rows = list(csv.DictReader(io.StringIO(out.stdout)))
    assert [r["products"] for r in rows] == ["add:4 glu:2", "add:2 glu:1"], rows
    out = segc("segments", "llama:layers=3,hidden=64", "--tokens", "4", "--format", "csv")
    assert {r["products"] for r in csv.DictReader(io.StringIO(out.stdout))} == {""}


def test_segments_count_the_rotated_kv_writes_a_cuda_lowering_fuses(tmp_path: Path) -> None:
    """A decode step's rotations and cache writes as a GPU trace records them (built by
    hand: MLX's CPU build decomposes ``RoPE``), saved as an IR file: one ``kv_write``
    with its queries' rotation."""
    from test_kvwrite import _layer

    from segc.ir import Graph, Input, Var

    eqns, avals, ins, outs = _layer()
    g = Graph("kv", tuple(Input(Var(n, *avals[n]), "arg", n) for n in ins), (), tuple(eqns), tuple(outs))
    path = tmp_path / "kv.segc"
    path.write_text(g.as_text())
    rows = list(csv.DictReader(io.StringIO(segc("segments", str(path), "--format", "csv").stdout)))
    assert [r["products"] for r in rows] == ["kv_write+q:1"], rows


@pytest.mark.parametrize(("d", "want"), [(64, "kv_write+attention:1"), (8, "kv_write+q:1")])
def test_segments_count_a_write_with_its_attention_as_one(tmp_path: Path, d: int, want: str) -> None:
    """The same write with the masked attention that reads what it wrote: one kernel where
    eager's attention would be fused (heads of 64), the write alone where eager keeps
    MLX's decomposition (heads of 8)."""
    from test_kvattention import _graph

    from segc.ir import Const, Graph, Input, Var

    eqns, avals, ins, outs, consts = _graph(False, d=d)
    inputs = tuple(Input(Var(n, *avals[n]), "arg", n) for n in ins)
    g = Graph("kv", inputs, tuple(Const(Var(n, *avals[n]), v) for n, v in consts.items()), tuple(eqns), tuple(outs))
    path = tmp_path / "kv.segc"
    path.write_text(g.as_text())
    rows = list(csv.DictReader(io.StringIO(segc("segments", str(path), "--format", "csv").stdout)))
    assert [r["products"] for r in rows] == [want], rows


def test_segments_name_a_decode_step_s_pair_for_the_live_attention(tmp_path: Path) -> None:
    """A decode step's pair (the mask one query's causal row at the offset) runs as the
    write, then MLX's attention over the live keys (``SEGC_LIVE_ATTENTION``'s default)."""
    from test_live import _graph

    from segc.ir import Const, Graph, Input, Var

    eqns, avals, ins, outs, consts = _graph(d=64)
    inputs = tuple(Input(Var(n, *avals[n]), "arg", n) for n in ins)
    g = Graph("kv", inputs, tuple(Const(Var(n, *avals[n]), v) for n, v in consts.items()), tuple(eqns), tuple(outs))
    path = tmp_path / "kv.segc"
    path.write_text(g.as_text())
    rows = list(csv.DictReader(io.StringIO(segc("segments", str(path), "--format", "csv").stdout)))
    assert [r["products"] for r in rows] == ["kv_write+live_attention:1"], rows


def test_a_quantized_architecture_target_counts_its_quantized_products() -> None:
    """``bits=4,group=64`` quantizes the built-in llama as mlx-lm does: its decode
    products are quantized ones (``/q4``), found as the plain ones are."""
    out = segc("segments", "llama:layers=2,hidden=128,bits=4,group=64", "--tokens", "1", "--format", "csv")
    rows = list(csv.DictReader(io.StringIO(out.stdout)))
    assert [r["products"] for r in rows if r["products"]] == ["add/q4:2 glu/q4:1"] * 2, rows


def test_graph_dot_golden_and_svg() -> None:
    dot = segc("graph", NET, "--format", "dot").stdout
    golden("net.dot", dot)
    assert dot.count("subgraph cluster_") == 4  # the inputs and three segments
    assert "from segment 0" in dot and "penwidth=2.2" in dot  # a boundary value, and its edge
    svg = segc("graph", NET, "--format", "svg").stdout if _has_dot() else None
    if svg is not None:
        assert svg.lstrip().startswith("<?xml") and "cluster_2" in svg


def _has_dot() -> bool:
    import shutil

    return shutil.which("dot") is not None


def test_svg_without_graphviz_is_one_clear_line(tmp_path: Path) -> None:
    env_path = tmp_path / "bin"
    env_path.mkdir()
    res = subprocess.run(
        [sys.executable, "-m", "segc", "graph", NET, "--format", "svg"],
        capture_output=True,
        text=True,
        timeout=60,
        env={
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
            "PATH": str(env_path),
        },
    )
    assert res.returncode == 2
    assert res.stderr.count("\n") == 1 and "needs Graphviz's `dot`" in res.stderr


def test_passes_print_after_with_diff_golden() -> None:
    out = segc("passes", NET, "--strategy", "every:5", "--print-after", "all", "--diff").stdout
    golden("net-passes-diff.txt", out)
    out = segc("passes", NET, "--print-after", "cut", "--changed-only").stdout
    assert out.startswith("// IR after cut")  # markers on a graph cut at its markers: one print, no change noted


def test_passes_dump_dir_one_file_per_pass(tmp_path: Path) -> None:
    segc("passes", NET, "--strategy", "every:5", "--window", "3:9", "--dump-dir", str(tmp_path / "d"))
    names = sorted(p.name.split("-", 2)[2] for p in (tmp_path / "d").iterdir())
    assert names == ["00-input.segc", "01-cut.segc", "02-window.segc"]


def test_verify_function_module_and_ir_targets() -> None:
    out = segc("verify", f"{SMALL}:mlp", "--input", "x=2x4", "--input", "w=4x3").stdout
    assert "verify: bit-identical to eager MLX (1 outputs, every run)" in out
    out = segc("verify", "small:net", "--input", "x=3x4", "--strategy", "every:3", "--format", "json").stdout
    data = json.loads(out)
    assert data["bit_identical"] and {r["run"] for r in data["rows"]} >= {"segc.jit", "segment by segment"}
    assert "bit-identical" in segc("verify", NET, "--strategy", "balanced:3").stdout


def test_bench_three_ways(tmp_path: Path) -> None:
    out = segc("bench", NET, "--repeats", "3", "--warmup", "1", "--format", "json").stdout
    data = json.loads(out)
    assert [r["mode"] for r in data["rows"]] == ["eager (op by op)", "mx.compile", "segc"]
    assert all(r["calls"] == 3 and r["min_s"] <= r["median_s"] <= r["max_s"] for r in data["rows"])


def check_chrome_trace(path: Path, calls: int, segments: int) -> list[dict]:
    """A valid Chrome trace: every event well formed, each segment of each call with a
    dispatch and a completion, completions after dispatches, async slices paired."""
    data = json.loads(path.read_text())
    events = data["traceEvents"]
    for e in events:
        assert e["ph"] in ("M", "X", "i", "b", "e") and isinstance(e["pid"], int) and isinstance(e["tid"], int)
        if e["ph"] != "M":
            assert isinstance(e["ts"], float | int) and e["ts"] >= 0 and isinstance(e["name"], str)
        if e["ph"] == "X":
            assert e["dur"] >= 0
    disp = {
        (e["args"]["call"], e["args"]["segment"]): e["ts"]
        for e in events
        if e["name"].startswith("dispatch ") and e["ph"] == "i"
    }
    done = {(e["args"]["call"], e["args"]["segment"]): e["ts"] for e in events if e["name"].startswith("complete ")}
    want = {(c, k) for c in range(calls) for k in range(segments)}
    assert set(disp) == want and set(done) == want
    assert all(done[k] >= disp[k] for k in want)
    begins = sorted(e["id"] for e in events if e["ph"] == "b")
    assert begins == sorted(e["id"] for e in events if e["ph"] == "e") and len(begins) == len(want)
    return events


def test_run_timeline_model_target(tmp_path: Path) -> None:
    out = segc("run", "llama:layers=2,hidden=32", "--calls", "2", "--timeline", str(tmp_path / "t.json")).stdout
    assert "2 calls, 3 segments, 6 dispatches recorded" in out
    check_chrome_trace(tmp_path / "t.json", calls=2, segments=3)


def test_run_timeline_with_a_schedule_shows_signals_and_waits(tmp_path: Path) -> None:
    sched = tmp_path / "s.json"
    sched.write_text(
        json.dumps({"cuts": [{"after": 3, "signal": ["kv", 1]}], "waits": [{"at": 10, "event": "kv", "value": 1}]})
    )
    segc("run", NET, "--schedule", str(sched), "--calls", "3", "--timeline", str(tmp_path / "t.json"))
    events = check_chrome_trace(tmp_path / "t.json", calls=3, segments=4)
    assert sum(e["name"] == "signal kv = 1" for e in events) == 3
    assert sum(e["name"] == "wait kv >= 1" and e["ph"] == "X" for e in events) == 3


@pytest.mark.slow
def test_model_directory_target(tmp_path: Path) -> None:
    import mlx.core as mx
    from mlx.utils import tree_flatten

    from segc.models.zoo import build, tiny_config

    model = build("llama", seed=3)
    (tmp_path / "config.json").write_text(json.dumps(tiny_config("llama")))
    mx.save_safetensors(str(tmp_path / "model.safetensors"), dict(tree_flatten(model.parameters())))
    rows = json.loads(segc("segments", str(tmp_path), "--tokens", "4", "--format", "json").stdout)["rows"]
    assert [r["name"] for r in rows] == ["model.layers.0", "model.layers.1", "tail"]
    assert "bit-identical to eager MLX" in segc("verify", str(tmp_path), "--tokens", "4").stdout


def test_arch_targets_sized() -> None:
    text = segc("trace", "qwen3:layers=1,hidden=32,heads=2,kv_heads=1", "--tokens", "3").stdout
    assert text.count("-- segment") == 2 and 'param="model.layers.0.' in text and "model.layers.1" not in text


def test_ir_subcommand_prints_text_that_parses_back(tmp_path: Path) -> None:
    import segc as segc_pkg

    text = segc("ir", "--layers", "2", "--tokens", "4").stdout
    g = segc_pkg.parse(text)
    assert [s.name for s in segc_pkg.segments(g)] == ["model.layers.0", "model.layers.1", "tail"]
    path = tmp_path / "g.segc"
    path.write_text(text)
    assert segc_pkg.parse(segc("ir", "--check", str(path)).stdout) == g


@pytest.mark.slow
def test_demo_reports_bit_identical_prefill_and_decode() -> None:
    out = segc("demo", "--layers", "2", "--hidden", "64", "--tokens", "8", "--repeats", "1", "--decode", "3").stdout
    assert "3 segments (boundary after every layers.*)" in out
    assert "segmented output bit-identical to eager mlx-lm: True" in out
    assert "logits and KV caches bit-identical to eager mlx-lm: True" in out


def test_version_matches_the_package_and_pyproject() -> None:
    import tomllib

    import segc as segc_pkg
    from segc.cli import VERSION

    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert VERSION == segc_pkg.__version__ == meta["version"]
    assert meta["license"] == "MIT" and "MIT License" in (ROOT / "LICENSE").read_text()
    assert (ROOT / "segc" / "py.typed").is_file()
