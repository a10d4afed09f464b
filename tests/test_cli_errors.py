"""Every user mistake is one line, ``segc <command>: ...``, on stderr and a non-zero
exit status (tracebacks only with ``--debug``): the mistakes of issue 14, each run as a
subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TARGETS = ROOT / "tests" / "cli_targets"
NET = str(ROOT / "tests" / "golden" / "cli" / "net.segc")
SMALL = str(TARGETS / "small.py")


def run(argv: list[str], cwd: Path, extra_path: str = "") -> subprocess.CompletedProcess[str]:
    path = os.pathsep.join(p for p in [extra_path, str(ROOT), str(TARGETS), os.environ.get("PYTHONPATH", "")] if p)
    return subprocess.run(
        [sys.executable, "-m", "segc", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": path},
    )


def one_line(res: subprocess.CompletedProcess[str], command: str) -> str:
    assert res.returncode != 0, res.stdout
    lines = res.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"segc {command}: "), res.stderr
    assert "Traceback" not in res.stderr
    return lines[0]


# (argv, the command, words the line must hold)
MISTAKES = [
    (["passes", "--plan-in", "/nonexistent.json"], "passes", ["/nonexistent.json", "no such file"]),
    (["passes", "--window", "5"], "passes", ["--window", "FIRST:LAST", "'5'"]),
    (["ir", "--check", "{truncated}"], "ir", ["truncated.segc"]),
    (["ir", "--boundaries", "nosuch.*"], "ir", ["nosuch.*", "match no submodule"]),
    (["generate", "--arch", "nosuch"], "generate", ["'nosuch'", "choose from", "llama", "qwen3"]),
    (["passes", NET, "--print-after", "nosuchpass"], "passes", ["'nosuchpass'", "cut", "fences", "window"]),
    (["demo", "--decode", "1"], "demo", ["--decode", "at least 2"]),
    (["segments", NET, "--strategy", "bogus"], "segments", ["'bogus'", "balanced:N", "memory:BYTES"]),
    (["trace", "llama:layerz=2"], "trace", ["'layerz'", "layers", "hidden", "bits"]),
    (["trace", "llama:bits=7"], "trace", ["bits '7'", "2, 3, 4, 5, 6, 8"]),
    (["trace", "llama:bits=4,group=48"], "trace", ["group '48'", "32, 64, 128"]),
    (["trace", "llama:group=64"], "trace", ["group=", "bits="]),
    (["trace", "nosuch_module_x:f"], "trace", ["no module 'nosuch_module_x'"]),
    (["trace", f"{SMALL}:nosuch", "--input", "x=2"], "trace", ["'nosuch'", "mlp"]),
    (["trace", f"{SMALL}:mlp"], "trace", ["--input NAME=SHAPE"]),
    (["trace", f"{SMALL}:mlp", "--input", "x=2y3"], "trace", ["NAME=SHAPE[:DTYPE]"]),
    (["trace", f"{SMALL}:mlp", "--input", "x=2:float99", "--input", "w=2"], "trace", ["'float99'", "bfloat16"]),
    (["trace", f"{SMALL}:item_inside", "--input", "x=3"], "trace", ["small.py:", "x.sum().item()", "static_argnames"]),
    (["trace", f"{SMALL}:branch_inside", "--input", "x=3"], "trace", ["small.py:", "if x.sum() > 0", "mx.where"]),
    (["graph", NET, "--format", "png"], "graph", ["--format", "'png'", "html"]),
    (["run", NET, "--timeline", "/nonexistent-dir/t.json"], "run", ["/nonexistent-dir/t.json"]),
    (["bench", NET, "--repeats", "0"], "bench", ["--repeats", "at least 1"]),
    (["passes", NET, "--diff"], "passes", ["--print-after"]),
    (["trace"], "trace", ["TARGET"]),
]


@pytest.mark.parametrize("argv,command,words", MISTAKES, ids=[" ".join(m[0][:2]) for m in MISTAKES])
def test_a_mistake_is_one_line(tmp_path: Path, argv: list[str], command: str, words: list[str]) -> None:
    truncated = tmp_path / "truncated.segc"
    truncated.write_text(Path(NET).read_text()[:400])
    argv = [a.replace("{truncated}", str(truncated)) for a in argv]
    line = one_line(run(argv, tmp_path), command)
    for w in words:
        assert w in line, line


def test_debug_shows_the_traceback(tmp_path: Path) -> None:
    res = run(["--debug", "passes", "--plan-in", "/nonexistent.json"], tmp_path)
    assert res.returncode != 0 and "Traceback" in res.stderr


def test_demo_without_mlx_lm_is_one_line(tmp_path: Path) -> None:
    fake = tmp_path / "fake"
    (fake / "mlx_lm").mkdir(parents=True)
    (fake / "mlx_lm" / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'mlx_lm'\", name='mlx_lm')\n"
    )
    line = one_line(run(["demo"], tmp_path, extra_path=str(fake)), "demo")
    assert "pip install 'segc[lm]'" in line
