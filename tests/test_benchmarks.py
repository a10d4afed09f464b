"""Smoke test of benchmarks/bench_llama.py: it runs, and reports segc bit-identical.

No timing is checked here: timings are for the benchmark's reader, never for tests.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_bench_llama_tiny_reports_bit_identical_outputs(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    cmd = [
        sys.executable,
        str(ROOT / "benchmarks" / "bench_llama.py"),
        "--preset=tiny",
        "--repeats=1",
        "--warmup=0",
        "--prefill=16",
        "--context=32",
        "--first-call-layers=2",
        "--dispatch-calls=3",
        f"--json={out}",
    ]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=240, cwd=ROOT)
    assert p.returncode == 0, p.stdout + p.stderr
    r = json.loads(out.read_text())
    assert r["segc_bit_identical"] is True
    assert set(r["workloads"]) == {"decode", "prefill"}
    for name, w in r["workloads"].items():
        assert not w["errors"], (name, w["errors"])
        assert set(w["timings"]) == {"eager", "compile", "segc", "drain"}
        assert w["bit_identical_to_eager"]["segc"] is True, name
        assert w["bit_identical_to_eager"]["drain"] is True, name
        assert w["segments"]["segc"] >= 4  # one per layer, and the tail
    assert r["workloads"]["prefill"]["tokens"] == 16
    fc = r["first_call"]["seconds"]
    assert {"trace", "passes", "lower", "replay", "mlx_compile"} <= set(fc)
    assert len(r["dispatch"]["rows"]) == 3
    assert "bit-identical" in p.stdout and "first call" in p.stdout
