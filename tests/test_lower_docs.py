"""docs/lowering.md's tables are generated from segc.lower (RULES, REBUILT, REFUSED,
UNSUPPORTED) and the property tests' COMPILE_MAY_DIFFER; this test fails when they
drift. Regenerate with ``python tests/test_lower_docs.py``."""

from __future__ import annotations

import ast
import inspect
import sys
import textwrap
from pathlib import Path

DOC = Path(__file__).resolve().parent.parent / "docs" / "lowering.md"
BEGIN, END = "<!-- generated: begin -->", "<!-- generated: end -->"
# calls that only reshape what a rule's main op returns
_HELPERS = {"mx.reshape", "mx.transpose", "mx.broadcast_to", "mx.arange", "mx.zeros", "mx.array", "mx.isnan"}


def _dotted(node: ast.AST) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name) and node.id == "mx":
        return ".".join(["mx", *reversed(parts)])
    return None


# rules that pick their op from a table, or call it through a helper
_OVERRIDE = {
    "ArgReduce": ["mx.argmin", "mx.argmax"],
    "BitwiseBinary": ["mx.bitwise_and", "mx.bitwise_or", "mx.bitwise_xor", "mx.left_shift", "mx.right_shift"],
    "Copy": ["none: its input"],
    "Log": ["mx.log2", "mx.log10", "mx.log"],
    "NumberOfElements": ["a constant"],
    "Pad": ["mx.pad"],
    "Reduce": ["mx.all", "mx.any", "mx.sum", "mx.prod", "mx.min", "mx.max"],
    "Scan": ["mx.cummax", "mx.cummin", "mx.cumsum", "mx.cumprod", "mx.logcumsumexp"],
    "Scatter": ["x.at[...].add/multiply/maximum/minimum", "x[...] = u"],
    "Slice": ["x[slices]"],
    "SliceUpdate": ["x.at[slices].add/multiply/maximum/minimum", "x[slices] = u"],
}


def _ops(name: str, fn: object) -> list[str]:
    """The MLX ops a rule calls: its closure's op, or the calls in its body."""
    if name in _OVERRIDE:
        return _OVERRIDE[name]
    for c in getattr(fn, "__closure__", None) or ():
        v = c.cell_contents
        if callable(v) and not inspect.isfunction(v) and getattr(v, "__name__", ""):
            return [f"mx.{v.__name__}"]
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))  # type: ignore[arg-type]
    found: list[str] = []
    for node in ast.walk(tree):
        name = None
        if isinstance(node, ast.Call):
            name = _dotted(node.func)
            if name is None and isinstance(node.func, ast.Attribute) and node.func.attr in ("view", "astype"):
                name = f"x.{node.func.attr}"
            if name is None and isinstance(node.func, ast.Name) and node.func.id == "getattr":
                name = "x.at[...].<reduce>"
        elif (
            isinstance(node, ast.Subscript)
            and isinstance(node.ctx, ast.Load)
            and not isinstance(node.value, ast.Attribute)
        ):
            if isinstance(node.slice, ast.Call | ast.Name) and isinstance(node.value, ast.Subscript | ast.Name):
                name = "x[...]" if isinstance(node.value, ast.Name) and node.value.id in ("x", "ins") else None
        elif isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Subscript):
            name = "x[...] = u"
        if name and name not in found:
            found.append(name)
    main = [n for n in found if n not in _HELPERS]
    return main or found


def generate() -> str:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from test_lower_props import COMPILE_MAY_DIFFER

    from segc.lower import REBUILT, REFUSED, RULES, UNSUPPORTED

    lines = [BEGIN, "", f"### Supported primitives ({len(RULES)})", ""]
    lines += [
        "| primitive | MLX op | not the same primitive (same bits) when | refused before running when |",
        "| --- | --- | --- | --- |",
    ]
    for name in sorted(RULES):
        ops = ", ".join(f"`{o}`" for o in _ops(name, RULES[name]))
        exact = REBUILT.get(name, "").replace("|", "\\|")
        refused = REFUSED.get(name, "")
        lines.append(f"| {name} | {ops} | {exact} | {refused} |")
    lines += ["", f"### Unsupported primitives ({len(UNSUPPORTED)})", ""]
    lines += ["| primitive | why |", "| --- | --- |"]
    lines += [f"| {k} | {v} |" for k, v in sorted(UNSUPPORTED.items())]
    lines += ["", "### Cases whose promise is mx.compile's bits (declared for the CPU)", ""]
    lines += [f"- {c}" for c in sorted(COMPILE_MAY_DIFFER)]
    lines += ["", END]
    return "\n".join(lines)


def _current() -> str:
    text = DOC.read_text()
    return text[text.index(BEGIN) : text.index(END) + len(END)]


def test_lowering_doc_is_current() -> None:
    assert _current() == generate(), "docs/lowering.md is stale: run `python tests/test_lower_docs.py`"


def test_every_rule_and_unsupported_is_named() -> None:
    from segc.lower import RULES, UNSUPPORTED

    assert not set(RULES) & set(UNSUPPORTED), "a primitive is both supported and unsupported"


if __name__ == "__main__":
    text = DOC.read_text()
    new = text[: text.index(BEGIN)] + generate() + text[text.index(END) + len(END) :]
    DOC.write_text(new)
    print(f"wrote {DOC}")
