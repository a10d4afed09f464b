"""Smoke tests of benchmarks/bench_llama.py (it runs, and reports segc bit-identical) and of
benchmarks/fewer_kernels.py (its hand-written step is eager mlx-lm's). Also: no benchmark script reaches
a private name of segc or imports the tests.

No timing is checked here: timings are for the benchmark's reader, never for tests.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def bench_llama(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], dict]:
    """Run ``benchmarks/bench_llama.py --preset=tiny --warmup=0 --prefill=16 --context=32``
    with ``args`` as a user would; its exit must be 0. Returns the process and its JSON."""
    out = tmp_path / "bench.json"
    cmd = [
        sys.executable,
        str(ROOT / "benchmarks" / "bench_llama.py"),
        "--preset=tiny",
        "--warmup=0",
        "--prefill=16",
        "--context=32",
        *args,
        f"--json={out}",
    ]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=280, cwd=ROOT)
    assert p.returncode == 0, p.stdout + p.stderr
    return p, json.loads(out.read_text())


def test_bench_llama_tiny_reports_bit_identical_outputs(tmp_path: Path) -> None:
    p, r = bench_llama(tmp_path, "--repeats=1", "--first-call-layers=2", "--dispatch-calls=3")
    assert r["segc_bit_identical"] is True
    assert set(r["workloads"]) == {"decode", "prefill"}
    for name, w in r["workloads"].items():
        assert not w["errors"], (name, w["errors"])
        assert set(w["timings"]) == {"eager", "compile", "segc", "drain"}
        assert w["bit_identical_to_eager"]["segc"] is True, name
        assert w["bit_identical_to_eager"]["drain"] is True, name
        assert w["segments"]["segc"] >= 4  # one per layer, and the tail
        # the host split comes from Executor.timed() on every compiled entry
        h = w["segc_host"]
        assert h["segments"] == w["segments"]["segc"], name
        assert 0 < h["executor_s"] <= h["call_s"], (name, h)
    assert r["workloads"]["prefill"]["tokens"] == 16
    fc = r["first_call"]["seconds"]
    assert {"trace", "passes", "lower", "replay", "mlx_compile"} <= set(fc)
    assert len(r["dispatch"]["rows"]) == 3
    assert "bit-identical" in p.stdout and "first call" in p.stdout


def test_frozenhead_is_frozen_with_the_head_in_the_last_layers_segment(tmp_path: Path) -> None:
    """``frozenhead``: ``frozen`` without the boundary after the last layer, so one
    segment fewer (the tiny preset's layers plus the tail, against its layers), and eager
    MLX's bytes as ``frozen`` has them; ``frozen2``: a segment per two layers, the head in
    the last."""
    p, r = bench_llama(
        tmp_path, "--repeats=1", "--first-call-layers=0", "--no-dispatch", "--variants=eager,frozen,frozenhead,frozen2"
    )
    assert "frozenhead" in p.stdout
    layers = r["config"]["num_hidden_layers"]
    for name, w in r["workloads"].items():
        assert not w["errors"], (name, w["errors"])
        assert w["segments"]["frozen"] == layers + 1 and w["segments"]["frozenhead"] == layers, (name, w["segments"])
        assert w["bit_identical_to_eager"]["frozenhead"] is True, name
        assert w["segments"]["frozen2"] == (layers + 1) // 2, (name, w["segments"])
        assert w["bit_identical_to_eager"]["frozen2"] is True, name


@pytest.mark.slow
def test_bench_llama_isolates_variants_and_compares_their_bytes(tmp_path: Path) -> None:
    """``--isolate``: a process per variant and round; the outputs compared byte for byte
    with eager's across processes; a quantized model (``--bits 4``) too."""
    p, r = bench_llama(
        tmp_path,
        "--repeats=2",
        "--first-call-layers=0",
        "--no-dispatch",
        "--variants=eager,segc,fences+nographs",  # a suffix: MLX_USE_CUDA_GRAPHS=0 in its process
        "--bits=4",
        "--isolate",
        "--rounds=2",
    )
    assert p.stdout.count("MLX_USE_CUDA_GRAPHS=0") == 2  # its two processes, and no other
    assert r["rounds"] == 2 and r["segc_bit_identical"] is True and not r["errors"]
    assert p.stdout.count("[isolate] round") == 6  # 3 variants x 2 rounds, each a process
    # a child compares nothing (no eager beside it): it must not claim bit-identity
    assert p.stdout.count("compared with eager's after the merge") == 6
    assert p.stdout.count("in every workload: True") == 1
    for name, w in r["workloads"].items():
        assert list(w["timings"]) == ["eager", "segc", "fences+nographs"], name
        assert w["bit_identical_to_eager"] == {"eager": True, "segc": True, "fences+nographs": True}, name
        assert w["segments"] == {"segc": 5, "fences+nographs": 5}, name  # tiny: 4 layers and the head
        assert all(len(t["round_medians"]) == 2 for t in w["timings"].values()), name
        assert all(len(t["round_probes"]) == 2 and min(t["round_probes"]) > 0 for t in w["timings"].values()), name
    assert "host at its fast speed" in p.stdout


def test_fast_rounds_keep_the_rounds_whose_host_probe_was_near_the_fastest() -> None:
    """``bench_llama.fast_rounds``: the rounds whose host probe is within the factor of the
    fastest probe over every variant, each variant's own; a variant without probes (an
    older child) is left out rather than judged."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import bench_llama
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    t = {
        "eager": {"round_medians": [3.0, 4.4, 2.9], "round_probes": [100.0, 180.0, 112.0]},
        "segc": {"round_medians": [1.7, 3.0, 1.6], "round_probes": [104.0, 175.0, 116.0]},
        "old": {"round_medians": [1.0, 2.0]},
    }
    assert bench_llama.fast_rounds(t) == {"eager": [3.0, 2.9], "segc": [1.7]}  # 116 > 1.15 x 100
    assert bench_llama.fast_rounds(t, within=2.0) == {"eager": [3.0, 4.4, 2.9], "segc": [1.7, 3.0, 1.6]}


def _private_uses(path: Path) -> list[str]:
    """Attribute reads and imports of ``_names`` (dunders aside), and imports of the
    tests' modules, in one script. The scripts keep no private attributes of their own,
    so any ``._name`` read would be segc's."""
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.endswith("__"):
            found.append(f"{path.name}:{node.lineno}: .{node.attr}")
        elif isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            names = [a.name for a in node.names]
            if mod.split(".")[0] in ("tests", "conftest") or mod.startswith("test_"):
                found.append(f"{path.name}:{node.lineno}: from {mod}")
            elif mod.split(".")[0] == "segc" and any(n.startswith("_") for n in [*mod.split("."), *names]):
                found.append(f"{path.name}:{node.lineno}: from {mod} import {', '.join(names)}")
        elif isinstance(node, ast.Import):
            for a in node.names:
                parts = a.name.split(".")
                if parts[0] in ("tests", "conftest") or (parts[0] == "segc" and any(p.startswith("_") for p in parts)):
                    found.append(f"{path.name}:{node.lineno}: import {a.name}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value == "tests":
            found.append(f"{path.name}:{node.lineno}: the tests directory")
    return found


def test_benchmarks_use_only_public_names() -> None:
    scripts = sorted((ROOT / "benchmarks").glob("*.py"))
    assert scripts
    found = [f for p in scripts for f in _private_uses(p)]
    assert not found, "benchmarks reach private names or the tests:\n" + "\n".join(found)


def test_fewer_kernels_hand_written_step_is_eager_mlx_lm() -> None:
    """``benchmarks/fewer_kernels.py``'s hand-written decode step is the model: its logits
    are eager mlx-lm's byte for byte, and so are the variants that change no arithmetic
    (one RoPE for q and k, weights as inputs, the dynamic write and RoPE offset, segc
    with and without the select write) on this CPU."""
    cmd = [sys.executable, str(ROOT / "benchmarks" / "fewer_kernels.py"), "--preset=cpu", "--layers=2"]
    cmd += ["--rounds=1", "--context=40", "--variants=base,ropeqk,inputs,dynwrite,dynrope,segc,segcdsu"]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=280, cwd=ROOT)
    assert p.returncode == 0, p.stdout + p.stderr
    lines = p.stdout.splitlines()
    assert "base == eager mlx-lm, bytes: True" in lines, p.stdout
    for v in ("ropeqk", "inputs", "dynwrite", "dynrope", "segc", "segcdsu"):
        assert any(line.startswith(f"{v} == base, bytes: True") for line in lines), (v, p.stdout)


@pytest.mark.parametrize("bits", [None, 4])
def test_device_time_runs_every_pattern_and_step(bits) -> None:
    """``benchmarks/device_time.py`` at small sizes: every product pattern is timed as
    eager MLX runs it (segc's kernels only on CUDA), and the three decode steps; off CUDA
    it says its figures are wall-clock times."""
    cmd = [sys.executable, str(ROOT / "benchmarks" / "device_time.py"), "--hidden=128", "--intermediate=256"]
    cmd += ["--heads=4", "--kv-heads=2", "--vocab=256", "--layers=1", "--repeats=1", "--reps=2"]
    cmd += [f"--bits={bits}"] if bits else []
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=280, cwd=ROOT)
    assert p.returncode == 0, p.stdout + p.stderr
    rows = [line.split() for line in p.stdout.splitlines()]
    for case in ("q/k/v", "o", "gate/up", "down", "logits"):
        assert any(r[:1] == [case] and "mlx" in r for r in rows), (case, p.stdout)
    assert [r[0] for r in rows if r[:1] in (["eager"], ["compile"], ["segc"])] == ["eager", "compile", "segc"]
    # every kernel timed gave MLX's bytes (the last column), and the attention was timed
    timed = [r for r in rows if len(r) > 6 and r[-6] in ("mlx", "segc")]
    assert len(timed) >= 5 and all(r[-1] == "yes" for r in timed), p.stdout
    assert any(r[:3] == ["MLX,", "live", "keys"] for r in rows), p.stdout
    import mlx.core as mx

    cuda = mx.default_device() == mx.gpu and mx.cuda.is_available()
    assert p.stdout.splitlines()[0].startswith("device time" if cuda else "wall-clock"), p.stdout


def test_device_time_ablates_segcs_step() -> None:
    """``--steps`` with every segc variant (MLX's writes, no rotated-write kernel, no
    product kernels, MLX's attention, a step with ``bench_llama.py``'s suffixes) and
    ``--skip-products``: the steps in the order asked, no product rows, and with
    ``--spans`` each step's calls (two) and the cache's change; an unknown variant or
    suffix is refused by name."""
    cmd = [sys.executable, str(ROOT / "benchmarks" / "device_time.py"), "--hidden=128", "--intermediate=256"]
    cmd += ["--heads=4", "--kv-heads=2", "--vocab=256", "--layers=1", "--repeats=2", "--skip-products"]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    want = ["segcmlxattn", "eager", "segcdsu", "segcnokv", "segcplain", "segc+chain4+sm1", "segcchain4"]
    steps = ["--spans", "--steps=" + ",".join(want)]
    p = subprocess.run([*cmd, *steps], capture_output=True, text=True, env=env, timeout=280)
    assert p.returncode == 0, p.stdout + p.stderr
    rows = [line.split() for line in p.stdout.splitlines()]
    assert [r[0] for r in rows if len(r) == 2 and r[0] in want] == want, p.stdout
    spans = [r for r in rows if len(r) > 2 and r[1:3] == ["spans,", "ms:"]]
    assert [r[0] for r in spans] == want, p.stdout
    for r in spans:  # two calls' spans, then "cache +0.0 MiB"
        assert len(r) == 8 and all(float(x.rstrip(";")) > 0 for x in r[3:5]) and r[5] == "cache", r
    assert "MLX's bytes" not in p.stdout and "live keys" not in p.stdout, p.stdout
    bad = subprocess.run([*cmd, "--steps=eager,segcx"], capture_output=True, text=True, env=env, timeout=280)
    assert bad.returncode != 0 and "unknown step variant 'segcx'" in bad.stderr, bad.stderr
    bad = subprocess.run([*cmd, "--steps=segc+nope"], capture_output=True, text=True, env=env, timeout=280)
    assert bad.returncode != 0 and "unknown suffix in 'segc+nope'" in bad.stderr, bad.stderr


def test_kernel_census_counts_nodes_by_kernel_name() -> None:
    """``benchmarks/kernel_census.py``'s parser over two graphs in the form
    ``cudaGraphDebugDotPrint`` writes (a kernel: an octagon labelled with its number and
    symbol; a child graph: a rectangle labelled ``graph_<n>``, its kernels in a cluster
    of their own): every instance of a kernel counts under one name, its template
    arguments, parameters and launch dropped; counted here by hand."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from kernel_census import census

    g1 = (
        'digraph dot {\nsubgraph cluster_1 {\nlabel="graph_1" graph[style="dashed"];\n'
        '"graph_1_node_0"[style="bold" shape="octagon" label="0\n'
        'void mlx::core::cu::gemv_single<__nv_bfloat16, 4>(const __nv_bfloat16*, int)\n"];\n'
        '"graph_1_node_1"[style="bold" shape="octagon" label="1\n'
        'void mlx::core::cu::gemv_single<__nv_bfloat16, 2>(const __nv_bfloat16*, int)\n"];\n'
        '"graph_1_node_2"[style="solid" shape="rectangle" label="2\ngraph_2\n"];\n'
        '"graph_1_node_0" -> "graph_1_node_1";\n}\n'
        'subgraph cluster_2 {\nlabel="graph_2" graph[style="dashed"];\n'
        '"graph_2_node_0"[style="bold" shape="octagon" label="0\n_Z5saxpyifPfS_\n"];\n}\n}\n'
    )
    g2 = (
        'digraph dot {\n"graph_3_node_0"[style="bold" shape="octagon" label="0\n'
        'custom_kernel_segc_gemv_add_bfloat16 \\<\\<\\<(256,1,1),(32,8,1),0\\>\\>\\>\n"];\n}\n'
    )
    counts = census([g1, g2])
    assert counts == {
        "mlx::core::cu::gemv_single": 2,
        "_Z5saxpyifPfS_": 1,
        "(a child graph's frame)": 1,
        "custom_kernel_segc_gemv_add_bfloat16": 1,
    }


def test_kernel_census_runs_each_variant_in_its_own_process() -> None:
    """The script at small sizes: a line per variant; off CUDA MLX writes no graph, and
    the script says so (on CUDA: at least one node per step)."""
    cmd = [sys.executable, str(ROOT / "benchmarks" / "kernel_census.py"), "--steps=eager,segc", "--layers=1"]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=280, cwd=ROOT)
    assert p.returncode == 0, p.stdout + p.stderr
    heads = [ln for ln in p.stdout.splitlines() if "CUDA graphs," in ln]
    assert [h.split(":")[0] for h in heads] == ["eager", "segc"], p.stdout
    import mlx.core as mx

    if mx.default_device() == mx.gpu and mx.cuda.is_available():
        assert all(int(h.split(",")[1].split()[0]) > 0 for h in heads), p.stdout
    else:
        assert all(h.endswith(": 0 CUDA graphs, 0 nodes in one decode step") for h in heads), p.stdout
        assert p.stdout.count("no CUDA graphs") == 2, p.stdout


@pytest.mark.skipif(shutil.which("c++filt") is None, reason="needs binutils' c++filt to demangle")
def test_kernel_census_demangles_symbols() -> None:
    """Two instantiations of one template kernel (mangled symbols, demangled by hand:
    ``void ns::k<int>(int)`` and ``void ns::k<float>(int)``) count under one name."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from collections import Counter

    from kernel_census import readable

    got = readable(Counter({"_ZN2ns1kIiEEvi": 2, "_ZN2ns1kIfEEvi": 3, "custom_kernel_x": 1}))
    assert got == {"ns::k": 5, "custom_kernel_x": 1}


def test_bench_generate_runs_mlx_lms_loop_with_every_variant() -> None:
    """``benchmarks/bench_generate.py`` at tiny sizes: mlx-lm's ``generate_step`` with
    eager and each segc variant (the frozen one included); on the CPU every variant's
    greedy tokens are eager's (the last column). An unknown variant is refused."""
    cmd = [sys.executable, str(ROOT / "benchmarks" / "bench_generate.py"), "--layers=2", "--hidden=64"]
    cmd += ["--intermediate=128", "--heads=4", "--kv-heads=2", "--vocab=256", "--prompt=12", "--tokens=6"]
    cmd += ["--rounds=1"]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    variants = ["eager", "segc", "segc-1seg-concat", "segc-frozen"]
    p = subprocess.run([*cmd, "--variants=" + ",".join(variants)], capture_output=True, text=True, env=env, timeout=280)
    assert p.returncode == 0, p.stdout + p.stderr
    rows = {r[0]: r for r in (ln.split() for ln in p.stdout.splitlines()) if r and r[0] in variants}
    assert list(rows) == variants, p.stdout
    import mlx.core as mx

    if mx.default_device() == mx.cpu:
        assert all(r[-1] == "True" for r in rows.values()), p.stdout
    bad = subprocess.run([*cmd, "--variants=eager,segc-x"], capture_output=True, text=True, env=env, timeout=280)
    assert bad.returncode != 0 and "segc-x" in bad.stderr, bad.stderr


def test_host_cost_runs_and_every_variant_keeps_the_eager_chains_bytes() -> None:
    """``benchmarks/host_cost.py`` (MLX's host time per kernel; the custom kernel needs
    CUDA, so the CPU runs the builtin one): it compares each variant's result with the
    eager chain's bytes (and the in-place wrapping's buffers with what went in) and exits
    non-zero when one differs."""
    cmd = [sys.executable, str(ROOT / "benchmarks" / "host_cost.py"), "--kernels", "5", "--segments", "2"]
    p = subprocess.run([*cmd, "--repeats", "2", "--size", "64"], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert p.returncode == 0, p.stdout + p.stderr
    rows = [line.split() for line in p.stdout.splitlines() if line.startswith("builtin")]
    # and the in-place write's wrapping, whose buffers must come back unchanged
    assert [r[1] for r in rows] == ["eager", "compiled", "segments", "inplace"], p.stdout
    assert all(r[-1] == "True" for r in rows), p.stdout


def test_segment_host_counts_each_segments_primitives_and_keeps_the_executors_bytes() -> None:
    """``benchmarks/segment_host.py`` (issue 13: a segment's call, commit and primitives,
    through ``Executor.timed()`` and its ``inspect`` hook): a timed call must give an
    untimed call's logits (it exits 1 otherwise), every segment of the tiny llama's
    decode step has primitives, and each step's call is part of the step's time."""
    cmd = [sys.executable, str(ROOT / "benchmarks" / "segment_host.py"), "--preset", "tiny", "--context", "32"]
    p = subprocess.run([*cmd, "--calls", "3"], capture_output=True, text=True, timeout=120, cwd=ROOT / "benchmarks")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "a timed call gave an untimed call's bytes: True" in p.stdout
    rows = [line.split() for line in p.stdout.splitlines() if line.strip() and line.split()[0].isdigit()]
    assert len(rows) >= 2 and all(int(r[3]) > 0 and float(r[1]) > 0 and float(r[2]) > 0 for r in rows), p.stdout


@pytest.mark.parametrize("workload", ["prefill:8", "decode:16"])
def test_plan_device_times_every_plan_and_keeps_eagers_bytes(workload: str) -> None:
    """``benchmarks/plan_device.py`` (issue 15: each plan's device span) on a small llama's
    prefill and decode: every plan's output is eager's (it exits 1 otherwise; a decode
    call whose caches were not reset to the context would not be), and each plan has a
    row with a positive span, its spans in the host's fast and slow halves and its host
    time until the call returns."""
    cmd = [sys.executable, str(ROOT / "benchmarks" / "plan_device.py"), "--model", "small", "--workload", workload]
    args = ["--strategies", "none,every:2,balanced:3", "--repeats", "2", "--rounds", "1"]
    p = subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=200, cwd=ROOT)
    assert p.returncode == 0, p.stdout + p.stderr
    rows = [[c.strip() for c in line.split("|")[1:-1]] for line in p.stdout.splitlines() if line.startswith("| `")]
    assert [r[0] for r in rows] == ["`none`", "`every:2`", "`balanced:3`"], p.stdout
    assert all(float(r[2]) > 0 and r[7] == "yes" for r in rows), p.stdout
    assert rows[0][1] == "1" and int(rows[1][1]) > 1, p.stdout
    # the spans split at the median probe: a plan's two calls fall in either half (n/a where none did)
    assert all(float(r[6]) > 0 and all(x == "n/a" or float(x) > 0 for x in r[4:6]) for r in rows), p.stdout
    assert any(r[4] != "n/a" for r in rows) and any(r[5] != "n/a" for r in rows), p.stdout


def test_arg_cost_keeps_eagers_bytes_for_every_number_of_inputs() -> None:
    """``benchmarks/arg_cost.py`` (what one more argument costs a compiled segment): it
    compares each variant with the same functions run eagerly and exits 1 on a
    difference; a row per number of inputs, and the slope."""
    cmd = [sys.executable, str(ROOT / "benchmarks" / "arg_cost.py"), "--inputs", "0,2,4", "--segments", "3"]
    p = subprocess.run(
        [*cmd, "--kernels", "1", "--repeats", "2", "--size", "64"], capture_output=True, text=True, timeout=120
    )
    assert p.returncode == 0, p.stdout + p.stderr
    rows = [line.split() for line in p.stdout.splitlines() if line.strip() and line.split()[0].isdigit()]
    assert [r[0] for r in rows] == ["0", "2", "4"] and all(r[-1] == "True" for r in rows), p.stdout
    assert "host time per extra input, per segment:" in p.stdout


def test_host_kinds_keeps_eagers_bytes_for_every_variant() -> None:
    """``benchmarks/host_kinds.py`` (the host per segment, product and elementwise
    kernel): every (segments, products, elementwise) variant against the same functions
    run eagerly, exit 1 on a difference; a row per variant, and the three figures."""
    cmd = [sys.executable, str(ROOT / "benchmarks" / "host_kinds.py"), "--segments", "2,3", "--products", "1,2"]
    p = subprocess.run([*cmd, "--repeats", "2", "--size", "64"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    rows = [line.split() for line in p.stdout.splitlines() if line.strip() and line.split()[0].isdigit()]
    assert [(r[0], r[1], r[2]) for r in rows] == [
        ("2", "1", "0"),
        ("2", "1", "1"),
        ("2", "2", "0"),
        ("2", "2", "2"),
        ("3", "1", "0"),
        ("3", "1", "1"),
        ("3", "2", "0"),
        ("3", "2", "2"),
    ], p.stdout
    assert all(r[-1] == "True" for r in rows) and "per elementwise kernel" in p.stdout, p.stdout


def test_native_profile_samples_only_its_timed_loop(tmp_path: Path) -> None:
    """``benchmarks/native_profile.py`` (issue 13: the decode loop ``perf`` samples): it
    asks ``perf`` (here a thread standing in for it, on the FIFOs ``perf record
    --control`` reads) to enable its events after the set-up and to disable them after
    the timed calls, waiting for each acknowledgement, and reports the calls made."""
    import threading

    ctl, ack = tmp_path / "ctl", tmp_path / "ack"
    os.mkfifo(ctl)
    os.mkfifo(ack)
    got: list[str] = []

    def perf() -> None:
        for _ in range(2):
            with open(ctl) as f:
                got.append(f.readline().strip())
            with open(ack, "w") as f:
                f.write("ack\n")

    t = threading.Thread(target=perf, daemon=True)
    t.start()
    cmd = [sys.executable, str(ROOT / "benchmarks" / "native_profile.py"), "--preset", "tiny", "--variant", "frozen"]
    args = ["--context", "16", "--seconds", "0.3", "--warmup", "2", "--ctl", str(ctl), "--ack", str(ack)]
    p = subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=120, cwd=ROOT / "benchmarks")
    t.join(timeout=10)
    assert p.returncode == 0, p.stdout + p.stderr
    assert got == ["enable", "disable"]
    line = next(x for x in p.stdout.splitlines() if " calls in " in x)
    assert line.startswith("frozen: ") and int(line.split()[1]) >= 1, p.stdout


def report_script(name: str, *args: Path | str) -> subprocess.CompletedProcess[str]:
    """Run ``benchmarks/<name>`` (a script that reads a run's saved output) on ``args``;
    its exit must be 0."""
    p = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / name), *map(str, args)], capture_output=True, text=True, timeout=60
    )
    assert p.returncode == 0, p.stdout + p.stderr
    return p


def test_perf_buckets_sums_a_report_by_hand(tmp_path: Path) -> None:
    """``benchmarks/perf_buckets.py`` on a report made up here: the main thread (pid 7)
    holds 80% of 1e9 ns of samples over 100 calls, 8000 us a call; its symbols' shares
    go to their kinds (a ``_Hash_bytes`` 10% is 800 us a call, ``malloc`` 30% 2400 us)."""
    report = """pid 7
frozen: 100 calls in 6.0 s, median wall 2.000 ms, host until return 1.500 ms
# Event count (approx.): 1000000000
# Overhead  Pid:Command  Shared Object
  60.00%  7:python3  libmlx.so
  20.00%  7:python3  libc.so.6
  20.00%  9:cuda-EvtHandlr  [kernel.kallsyms]
# Overhead  Shared Object  Symbol
  10.00%  libstdc++.so.6.0.33  [.] std::_Hash_bytes
  30.00%  libc.so.6  [.] malloc
  20.00%  python3.12  [.] _PyEval_EvalFrameDefault
  25.00%  libcuda.so.580.159.04  [.] 0x00000000004585b1
  15.00%  libmlx.so  [.] mlx::core::eval_impl
"""
    path = tmp_path / "perf_frozen.txt"
    path.write_text(report)
    p = report_script("perf_buckets.py", path)
    rows = {line[:40].strip(): line[40:].split() for line in p.stdout.splitlines()}
    assert rows["main thread, us a call"] == ["8000"]
    assert rows["listed"] == ["100.0"]
    tail = p.stdout.split("in us a call")[1]
    us = {line[:40].strip(): float(line[40:]) for line in tail.splitlines()[1:] if line.strip()}
    want = {
        "hashing a custom kernel's text": 800,
        "allocation": 2400,
        "Python (segc, mlx-lm, bindings)": 1600,
        "CUDA driver and runtime": 2000,
        "evaluation and encoding (MLX)": 1200,
        "locks": 0,
        "libc, unnamed": 0,
        "other": 0,
    }
    assert {k: us[k] for k in want} == want, p.stdout


def test_host_by_plan_reads_a_run_by_hand(tmp_path: Path) -> None:
    """``benchmarks/host_by_plan.py`` on a ``results.json`` made up here: plans of 2, 5
    and 9 segments at 2.0, 2.3 and 2.7 ms of host time: 100 µs a segment from 2 to 5
    ((2.3 - 2.0) / 3), 100 from 5 to 9 ((2.7 - 2.3) / 4); a plan missing is a dash."""
    rows = [
        {"workload": "decode:8", "strategy": s, "host_median_s": h, "segments": n}
        for s, h, n in (("balanced:2", 2.0e-3, 2), ("every:4", 2.3e-3, 5), ("every:2", 2.7e-3, 9))
    ]
    rows.append({"workload": "decode:8", "strategy": "eager", "host_median_s": 1e-3, "segments": 0})
    (tmp_path / "results.json").write_text(json.dumps({"rows": rows}))
    p = report_script("host_by_plan.py", tmp_path)
    assert "eager" not in p.stdout
    assert re.search(r"every:4\s+5 seg\s+2\.300", p.stdout), p.stdout
    line = next(x for x in p.stdout.splitlines() if "a segment more" in x)
    assert "balanced:2->every:4 100, every:4->every:2 100, every:2->min_boundary_bytes -," in line, line


def test_host_jitter_pins_each_mode_and_keeps_eagers_bytes() -> None:
    """``benchmarks/host_jitter.py`` (issue 15: what makes an H200 prefill switch speeds)
    on the CPU: every mode a process of its own, ``core`` pinned to one CPU, segc's
    output eager's bytes in every process."""
    cmd = [sys.executable, str(ROOT / "benchmarks" / "host_jitter.py"), "--model", "small", "--workload", "prefill:8"]
    args = ["--probe-size", "64", "--calls", "3", "--modes", "free,core"]
    p = subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=200, cwd=ROOT)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "core round 0: " in p.stdout and "affinity [" in p.stdout
    core = re.search(r"core round 0: \d+ s, affinity \[(\d+)\]", p.stdout)
    assert core is not None, p.stdout  # one CPU
    rows = {
        tuple(c.strip() for c in line.split("|")[1:3]): line for line in p.stdout.splitlines() if line.startswith("| ")
    }
    assert {("free", "segc"), ("core", "segc"), ("free", "eager"), ("core", "eager")} <= set(rows), p.stdout
    assert rows[("core", "segc")].rstrip(" |").endswith("| 1"), rows[("core", "segc")]  # it ran on one CPU
    assert "segc's output has eager's bytes in every process: True" in p.stdout


def test_rel_diff_is_the_bound_s_measure() -> None:
    """The figure printed where outputs differ: max |y - ref| / (1 + |ref|), by hand."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import numpy as np
        from bench_llama import rel_diff
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    ref = np.array([0.0, 3.0, -1.0], dtype=np.float32)
    y = np.array([0.5, 3.0, -3.0], dtype=np.float32)
    assert rel_diff(y, ref) == 1.0  # max(0.5 / 1, 0 / 4, 2 / 2), exact in float32
    assert rel_diff(ref, ref) == 0.0
    assert rel_diff(y[:2], ref) == float("inf")


def test_a_first_calls_environment_is_set_for_it_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """``bench_llama.first_call_with(..., env=...)``: the call sees the settings; after it
    (returned or raised) a variable it added is gone and one it replaced is back."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from bench_llama import first_call_with
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    monkeypatch.setenv("SEGC_CHAIN_BLOCKS", "7")
    monkeypatch.delenv("SEGC_CHAIN_OCCUPANCY", raising=False)
    env = {"SEGC_CHAIN_BLOCKS": "132", "SEGC_CHAIN_OCCUPANCY": "4"}
    seen = first_call_with(lambda: (os.environ["SEGC_CHAIN_BLOCKS"], os.environ["SEGC_CHAIN_OCCUPANCY"]), env=env)
    assert seen == ("132", "4")
    assert os.environ["SEGC_CHAIN_BLOCKS"] == "7" and "SEGC_CHAIN_OCCUPANCY" not in os.environ

    def fails() -> None:
        raise RuntimeError("lowering failed")

    with pytest.raises(RuntimeError, match="lowering failed"):
        first_call_with(fails, env=env)
    assert os.environ["SEGC_CHAIN_BLOCKS"] == "7" and "SEGC_CHAIN_OCCUPANCY" not in os.environ


def test_a_variants_suffixes_set_its_processs_environment() -> None:
    """``frozen+chain4+sm1`` runs ``frozen`` with the chain of four on one block an SM of
    an H100 or H200 (132 SMs): the settings the docstring names, merged in order."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from bench_llama import base_of, settings_of
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    assert base_of("frozen+chain4+sm1") == "frozen"
    assert settings_of("frozen+chain4+sm1") == {
        "SEGC_CHAIN_PRODUCTS": "1",
        "SEGC_CHAIN_ATTENTION": "0",
        "SEGC_CHAIN_BLOCKS": "132",
    }
    assert settings_of("frozenhead+chain+sm2") == {"SEGC_CHAIN_PRODUCTS": "1", "SEGC_CHAIN_BLOCKS": "264"}
    assert settings_of("frozen") == {}


def test_chain_stages_reads_a_launchs_figures_from_hand_made_stamps() -> None:
    """``benchmarks/chain_stages.py``'s figures from two blocks' stamps written by hand
    (nanoseconds; slots: 0 start, 1 exit, 2+k waited, 7+k once, 12+k work, 17+k first
    ticket, 22+k last done, 28 the SM), against the microseconds worked out here."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import numpy as np
        from chain_stages import SLOTS, summary
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    st = np.zeros((2, SLOTS), dtype=np.uint64)
    st[:, 0], st[:, 1], st[:, 28] = (100, 400), (7000, 6500), (3, 5)
    st[:, 17], st[:, 22], st[:, 12] = (1000, 1500), (3000, 2500), (1800, 1000)  # stage 0
    st[1, 2 + 1], st[1, 7 + 1], st[1, 17 + 1], st[1, 22 + 1], st[1, 12 + 1] = 700, 300, 3500, 6000, 2500  # stage 1
    got = summary(st, 3)
    assert got["total"] == 6.9 and got["start spread"] == 0.3 and got["SMs"] == 2.0
    assert got["s0 starts"] == 0.9 and got["s0 span"] == 2.0 and got["s0 work/block"] == 1.4
    assert got["s0 wait (mean)"] == 0.0 and got["s0 blocks"] == 2.0
    assert got["s1 starts"] == 3.4 and got["s1 span"] == 2.5 and got["s1 blocks"] == 1.0
    assert got["s0 most/SM"] == 1.0 and got["s0 mean/SM"] == 1.0
    assert got["s1 wait (mean)"] == 0.7 and got["s1 once (mean)"] == 0.3 and got["s1 work/block"] == 2.5
    assert "s2 span" not in got and got["tail"] == 1.0  # no ticket of stage 2; the last exit 1 us after


def test_a_chains_marks_land_at_its_loops_points_and_change_nothing_else() -> None:
    """``cuda_tickets.tickets``' ``mark``: each point's text where the stamps need it (a
    wait and its once only for the stages after the first), and no mark is the kernel's
    own text."""
    from segc.lower import cuda_tickets

    stages = [("4", "", "/*body0*/"), ("8", "/*work1*/", "/*body1*/"), ("4", "/*work2*/", "/*body2*/")]
    plain = cuda_tickets.tickets(stages)
    assert cuda_tickets.tickets(stages, lambda point, k: "") == plain
    marked = cuda_tickets.tickets(stages, lambda point, k: f"/*{point}{k}*/\n")
    for point in ("begin-1", "ticket0", "ticket1", "ticket2", "wait1", "waited1", "once1", "wait2", "once2", "end-1"):
        assert marked.count(f"/*{point}*/") == 1, point
    assert "/*wait0*/" not in marked and marked.rstrip().endswith("/*exit-1*/")
    # in order: the wait, then the stage's once work, then its rows
    for k in (1, 2):
        i = [marked.index(s) for s in (f"/*wait{k}*/", f"/*waited{k}*/", f"/*once{k}*/", f"/*ticket{k}*/")]
        assert i == sorted(i) and i[1] < marked.index(f"/*work{k}*/") < i[2], k
    # with the marks' lines taken out, the kernel's own text
    kept = [line for line in marked.splitlines() if not line.startswith("/*") or line.startswith(("/*work", "/*body"))]
    assert "\n".join(kept) == plain.rstrip("\n")


def test_kernel_timeline_sums_hand_made_records() -> None:
    """``benchmarks/kernel_timeline.py``'s figures from CUPTI-like records written by
    hand (ns): a call's span, the kernels' running time (overlaps counted once), its
    gaps and copies, and the kernels by their names without template arguments."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from kernel_timeline import demangled, short, summarize
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    assert (
        short("void mlx::core::cu::gemv<__nv_bfloat16, 8, (int)1>(const __nv_bfloat16*, int)") == "mlx::core::cu::gemv"
    )
    # CUPTI's names are mangled: read by c++filt where it is installed, else kept
    mangled = "_ZN3mlx4core2cu11gemv_singleI13__nv_bfloat16Li8ELi4EEEvPKT_S6_PS4_ii"
    want = "mlx::core::cu::gemv_single" if shutil.which("c++filt") else mangled[-70:]
    assert short(demangled(mangled)) == want and demangled("segc_x") == "segc_x"
    a = "void k<float>(float*)"
    calls = [
        [("kernel", 100, 200, a), ("kernel", 150, 260, "segc_x"), ("kernel", 300, 350, a), ("memset", 90, 95, "m")],
        [("memcpy", 0, 10, "c")],  # no kernel: not a call
        [("kernel", 1000, 1100, a), ("uvm", 1000, 1001, "GPU_PAGE_FAULT 4"), ("uvm", 1002, 1009, "GPU_PAGE_FAULT 3")],
    ]
    s = summarize(calls)
    assert s["spans"] == [250, 100] and s["running"] == [210, 100] and s["gaps"] == [40, 0]
    assert s["kernels"] == [3, 1] and s["copies"] == [5, 0]  # a counter's record is no copy
    assert s["by_name"] == {"k": [3, 250], "segc_x": [1, 110], "memset": [1, 5], "uvm GPU_PAGE_FAULT": [2, 7]}


def test_kernel_timeline_times_each_layers_kernel(capsys: pytest.CaptureFixture[str]) -> None:
    """``--by-layer``: the matching kernels in launch order, each occurrence's duration and
    the gap before it (medians over calls, µs), each call's sum; calls that match a
    different number of times are not lined up."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from kernel_timeline import by_layer
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    # records out of launch order, as CUPTI may hand them back; 'attn' twice a call
    call = [("kernel", 25_000, 30_000, "b"), ("kernel", 12_000, 20_000, "attn_x"), ("kernel", 0, 10_000, "a")]
    calls = [[*call, ("kernel", 31_000, 31_000 + d, "attn_y")] for d in (14_000, 16_000, 30_000)]
    by_layer(calls, "attn")
    out = capsys.readouterr().out
    assert "2 a call: durations 8.0 16.0" in out and "gaps before 2.0 1.0" in out
    assert "each call's sum 22 24 38" in out
    by_layer([*calls, call], "attn")
    assert "[1, 2] matches a call, not one count: not shown" in capsys.readouterr().out


def test_kvattn_stamps_reads_hand_made_stamps() -> None:
    """``benchmarks/kvattn_stamps.py``'s parts from stamps written by hand (ns): a
    kernel's span and start spread, each part's median over the blocks, the merge's over
    the blocks that merged, the SM clock (cycles over ns from start to count, the
    blocks' median); calls split at the midpoint of their spans."""
    import numpy as np

    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from kvattn_stamps import call_row, phases, split
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    # three blocks: starts 1000, 1500, 3000 ns; parts of 0.5, 0.25, 0.75, 1, 1.5, 2, 3, 4, 5 µs
    # from each start (the third's keys 20 µs); the second block merges, 6 µs after its count,
    # the first keeps an earlier call's merge stamp (older than its count); SMs 4, 9, 4;
    # their SMs at 2, 1.5 and 2 GHz (cycles from start to count)
    rows = []
    for j, t0 in enumerate((1000, 1500, 3000)):
        keys = 20_000 if j == 2 else 2000
        pts = np.cumsum([t0, 500, 250, 750, 1000, 1500, keys, 3000, 4000, 5000])
        merged = pts[-1] + 6000 if j == 1 else (500 if j == 0 else 0)
        cycles = int((pts[-1] - t0) * (2, 1.5, 2)[j])
        rows.append([*pts, merged, (4, 9, 4)[j], cycles])
    k = np.array(rows, dtype=np.uint64)
    p = phases(k)
    assert p["starts"] == 2.0 and p["offset"] == 0.5 and p["query"] == 0.25 and p["masked"] == 0.75
    assert p["queries"] == 1.0
    assert p["staged"] == 1.5
    assert p["keys"] == 2.0 and p["softmax"] == 3.0 and p["values"] == 4.0 and p["counted"] == 5.0
    assert p["merge"] == 6.0 and p["mhz"] == 2000.0
    assert (
        p["span"] == (3000 + 500 + 250 + 750 + 1000 + 1500 + 20_000 + 3000 + 4000 + 5000 - 1000) / 1e3
    )  # the last count
    assert call_row([k, k])["keys"] == 2.0
    assert split([{"span": 10.0}, {"span": 30.0}, {"span": 19.0}, {"span": 21.0}]) == ([0, 2], [1, 3])


def test_kvattn_stamps_where_counts_what_is_not_device_memory(capsys) -> None:
    """``kvattn_stamps.py --where``'s lines from addresses and kinds written by hand: per
    input, the layers whose buffer is not device memory; layer 0's addresses by 4-KB page;
    per mode, the distinct addresses over the layers."""
    import numpy as np

    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from kvattn_stamps import where_report, where_row
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    names = ("q", "knew", "k", "vnew", "v", "off", "mask", "count")
    a = np.array([[0x1000 * (j + 1) for j in range(8)], [0x1000 * (j + 1) for j in range(8)]], dtype=np.uint64)
    kinds = [["device"] * 8, ["device"] * 5 + ["managed", "device", "host"]]
    line = where_row(a, kinds)
    assert line.split("  | ")[0] == " ".join(f"{n}:{int(n in ('off', 'count'))}" for n in names)
    assert line.split("  | ")[1] == "1 2 3 4 5 6 7 8"
    b = a.copy()
    b[1, 0] = 0x9000  # another q in layer 1
    where_report([{"span": 10.0}, {"span": 30.0}], [(a, kinds), (b, [["device"] * 8] * 2)])
    out = capsys.readouterr().out
    assert "     0  fast  q:0 knew:0 k:0 vnew:0 v:0 off:1 mask:0 count:1" in out
    assert "     1  slow  q:0 knew:0 k:0 vnew:0 v:0 off:0 mask:0 count:0" in out
    assert "kinds seen: device, host, managed" in out
    assert "fast: distinct addresses over the layers: q:1 knew:1" in out
    assert "slow: distinct addresses over the layers: q:2 knew:1" in out


def test_kvattn_device_runs_eagers_form_on_the_cpu() -> None:
    """``benchmarks/kvattn_device.py`` on the CPU: segc's forms need CUDA, eager's runs
    (on the wall clock) and prints a positive time a layer."""
    cmd = [sys.executable, str(ROOT / "benchmarks" / "kvattn_device.py"), "--layers", "2", "--repeats", "2"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert p.returncode == 0, p.stdout + p.stderr
    row = next(line.split() for line in p.stdout.splitlines() if line.startswith("eager"))
    assert float(row[1]) > 0 and float(row[2]) > 0, p.stdout


@pytest.mark.timeout(300)
def test_the_pool_suffix_reaches_the_variants_process(tmp_path: Path) -> None:
    """``+poolkeep`` (``benchmarks/mempool.py``) sets CUDA's pool in the variant's own
    process, before its timed calls: it reports True where MLX runs on CUDA and False
    where there is no CUDA driver (this CPU), and the variant still runs with eager's
    bytes."""
    p, data = bench_llama(
        tmp_path,
        "--repeats=2",
        "--prefill=0",
        "--variants=eager,frozen+poolkeep",
        "--isolate",
        "--no-dispatch",
        "--first-call-layers=0",
    )
    import mlx.core as mx

    said = f"CUDA's default pool keeps what it reserves: {mx.cuda.is_available()}"
    assert p.stdout.count(said) == 1, p.stdout
    assert data["segc_bit_identical"] is True


def test_host_modes_interleaves_schedules_with_eagers_bytes() -> None:
    """``benchmarks/host_modes.py`` on the tiny preset: eager and three schedules (one
    chosen at run time; on the CPU no segment runs as stretches, so nothing to tune) in one
    process, each a row; every segc row reports its logits as eager's bytes (the check is
    the script's own byte comparison, which a wrong schedule's output would fail)."""
    cmd = [sys.executable, str(ROOT / "benchmarks" / "host_modes.py"), "--processes=1", "--calls=2"]
    cmd += ["--preset=tiny", "--variants", "eager", "default", "1,2", "tune"]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=280, cwd=ROOT)
    assert p.returncode == 0, p.stdout + p.stderr
    rows = {r[3]: r for r in (line.split() for line in p.stdout.splitlines()) if len(r) == 13 and r[0] == "0"}
    assert set(rows) == {"eager", "default", "1,2", "tune"}, p.stdout
    assert rows["default"][-1] == rows["1,2"][-1] == rows["tune"][-1] == "True", p.stdout


def test_host_modes_verdict_compares_the_tuners_choice_with_the_fastest_fixed_schedule() -> None:
    """``host_modes.verdict``: the fixed schedule with the smallest step among the variants
    (eager, tune and a committing thread's left out; ``default`` named by its groups) is
    the one the tuner had to choose; tune's step is divided by that one's; no verdict
    without a settled tuner or two fixed schedules."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import host_modes
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    from segc.lower.live import LIVE_COMMIT_SCHEDULE

    default = ",".join(map(str, LIVE_COMMIT_SCHEDULE))
    variants = ["eager", "default", "2", "3,5,5,3", "2@t", "tune"]

    def run(steps: dict[str, float], chosen: str | None) -> dict:
        d: dict = {v: {"step": t} for v, t in steps.items()}
        d["tune"]["tuned"] = [{"chosen": chosen}]
        return d

    steps = {"eager": 1.0, "default": 3.0, "2": 2.0, "3,5,5,3": 2.5, "2@t": 1.5, "tune": 2.2}
    said = host_modes.verdict(run(steps, "2"), variants)
    assert said is not None and said[1] is True and said[2] == 2.2 / 2.0, said
    said = host_modes.verdict(run(steps, "3,5,5,3"), variants)
    assert said is not None and said[1] is False, said
    steps["default"] = 1.9  # the default fastest: its groups are the name to choose
    said = host_modes.verdict(run(steps, default), variants)
    assert said is not None and said[1] is True and said[2] == 2.2 / 1.9, said
    assert host_modes.verdict(run(steps, None), variants) is None  # still tuning
    assert host_modes.verdict(run(steps, "2"), ["eager", "2", "tune"]) is None  # nothing to rank


def test_graph_reuse_times_every_form() -> None:
    """``benchmarks/graph_reuse.py`` at a small size: a row for each form, host and wall
    times positive, the host's no longer than the wall's."""
    cmd = [sys.executable, str(ROOT / "benchmarks" / "graph_reuse.py"), "--size", "1024", "--repeats=2"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=280, cwd=ROOT)
    assert p.returncode == 0, p.stdout + p.stderr
    rows = {
        r[1]: [float(x) for x in r[2:6]] for r in (line.split() for line in p.stdout.splitlines()) if r[:1] == ["1024"]
    }
    assert set(rows) == {"one", "same", "distinct", "pairs"}, p.stdout
    for host, longest, wall, _ in rows.values():
        assert 0 < longest <= host <= wall, p.stdout


def test_commit_thread_compares_every_form_with_the_serial_bytes() -> None:
    """``benchmarks/commit_thread.py`` with two layers and two rounds: it checks every
    form's bytes against the building thread's (exit 1 on a difference) and prints a
    row a form, the host's time no longer than the step's."""
    env = {**os.environ, "L": "2", "R": "2"}
    cmd = [sys.executable, str(ROOT / "benchmarks" / "commit_thread.py")]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=280, cwd=ROOT, env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "every variant serial2's bytes" in p.stdout, p.stdout
    rows = {
        r[0]: (float(r[2]), float(r[5])) for r in (line.split() for line in p.stdout.splitlines()) if r[1:2] == ["host"]
    }
    assert {"serial2", "serial0", "thread2", "thread2_si20"} <= set(rows), p.stdout
    for host, step in rows.values():
        assert 0 < host <= step, p.stdout
