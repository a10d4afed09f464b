"""Smoke test of benchmarks/bench_paging.py: it runs on a tiny model, every paged run is
bit-identical to the resident one, and it writes its JSON and its plot. No timing is
checked (timings are for the benchmark's reader, never for tests)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_bench_paging_tiny(tmp_path: Path) -> None:
    out, plot = tmp_path / "paging.json", tmp_path / "paging.svg"
    cmd = [
        sys.executable,
        str(ROOT / "benchmarks" / "bench_paging.py"),
        *("--layers", "2", "--hidden", "64", "--intermediate", "128", "--heads", "4", "--kv-heads", "2"),
        *("--vocab", "128", "--tokens", "2", "--rounds", "1", "--prompts", "16", "--chunk", "8"),
        *("--weights", "0.01,0.6,1.0", "--out", str(out), "--plot", str(plot)),
        *("--kv-context", "300", "--kv-chunk", "64"),
    ]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=240, cwd=ROOT)
    assert p.returncode == 0, p.stdout + p.stderr
    r = json.loads(out.read_text())
    assert [(x["mode"], x["weights"]) for x in r["paged"]] == [
        ("drain", 0.6),
        ("fenced", 0.6),
        ("drain", 1.0),
        ("fenced", 1.0),
    ]
    assert all(x["bit_identical"] for x in r["paged"]), r["paged"]
    assert list(r["refused"]) == ["drain f=0.01", "fenced f=0.01"]  # less than one page
    assert plot.read_text().startswith("<svg") and "fenced" in plot.read_text()
    assert "transfer bound" in p.stdout and "fenced / drain" in p.stdout
    kv = r["kv"]  # the KV paging case: resident against the caches paged, at a context of 300
    assert [x["variant"] for x in kv["paged"]] == ["kv paged", "kv+weights paged"]
    assert all(x["bit_identical"] and x["kv_bytes_per_token"] > 0 for x in kv["paged"]), kv["paged"]
    assert "KV paging at context 300" in p.stdout
