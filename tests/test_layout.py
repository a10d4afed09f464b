"""The package's shape: layers import only downwards, no import cycles, small files.

Imports are read from the source (``ast``), function-level imports and
``if TYPE_CHECKING:`` blocks included, so neither a lazy import nor a type-only one can
hide a loop.
"""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parent.parent / "segc"
# pipeline order: a module may import its own package and packages of lower rank only
LAYERS = {
    "segc.backend": -1,  # which backend MLX runs on: asked by segc.dtypes too
    "segc.errors": -1,  # the exception classes: raised by segc.settings too
    "segc.settings": 0,
    "segc.dtypes": 0,
    "segc.units": 0,
    "segc.hostints": 0,  # arrays whose value the host knows: recorded by segc.trace, read by segc.lower
    "segc.ir": 1,
    "segc.committer": 1,  # commits on a thread of their own (reads segc.settings): used by segc.lower
    "segc.lower": 2,
    "segc.trace": 2,
    "segc.passes": 3,
    "segc.runtime": 4,
    "segc.staging": 5,
    "segc.engine": 6,
    "segc.models": 6,
    "segc.research": 7,  # the experiment harness: above the models and the engine
    "segc": 7,  # the public API, segc/__init__.py
    "segc.cli": 8,
    "segc.__main__": 9,
}
MAX_LINES = 400


def _modules() -> dict[str, Path]:
    out = {}
    for p in ROOT.rglob("*.py"):
        parts = ["segc", *p.relative_to(ROOT).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The segc modules that module ``name`` imports."""
    pkg = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.split(".")[0] == "segc")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".")
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if mod.split(".")[0] != "segc":
                continue
            for a in node.names:
                sub = f"{mod}.{a.name}"
                out.add(sub if sub in known else mod)
    return out - {name}


def _rank(mod: str) -> tuple[str, int]:
    best = max((k for k in LAYERS if mod == k or mod.startswith(k + ".")), key=len)
    return best, LAYERS[best]


def graph() -> nx.DiGraph:
    mods = _modules()
    g = nx.DiGraph()
    for name, path in mods.items():
        g.add_node(name)
        for dep in imports(name, path, set(mods)):
            g.add_edge(name, dep)
    return g


def test_every_module_has_a_layer() -> None:
    for mod in _modules():
        _rank(mod)  # raises ValueError for a module outside every layer


def test_no_upward_or_sideways_import() -> None:
    bad = []
    for a, b in graph().edges:
        (pa, ra), (pb, rb) = _rank(a), _rank(b)
        if pa != pb and rb >= ra:
            bad.append(f"{a} (layer {ra}) imports {b} (layer {rb})")
    assert not bad, "\n".join(bad)


def test_no_import_cycle() -> None:
    try:
        cycle = nx.find_cycle(graph())
    except nx.NetworkXNoCycle:
        return
    pytest.fail("import cycle: " + " -> ".join(a for a, _ in cycle) + f" -> {cycle[-1][1]}")


def test_the_checker_sees_lazy_and_relative_imports(tmp_path: Path) -> None:
    """The checks above can fail: a function-level relative import is an edge, and so
    is a type-only one."""
    src = "def f():\n    from ..passes import analysis\n    from . import nodes\n"
    p = tmp_path / "printer.py"
    p.write_text(src)
    known = {"segc.passes.analysis", "segc.ir.nodes"}
    assert imports("segc.ir.printer", p, known) == {"segc.passes.analysis", "segc.ir.nodes"}
    p.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .graph import Graph\n")
    assert imports("segc.ir.printer", p, known | {"segc.ir.graph"}) == {"segc.ir.graph"}


def test_files_stay_small() -> None:
    big = {
        str(p.relative_to(ROOT)): n for p in ROOT.rglob("*.py") if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert not big, f"files over {MAX_LINES} lines: {big}"
