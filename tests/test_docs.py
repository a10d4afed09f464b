"""The documentation runs: its examples cannot rot.

- Every ```python block of README.md and docs/*.md runs, in order, in one fresh
  namespace per file, and must not raise.
- A fenced block right after a ``<!-- output -->`` line is printer output: it must equal,
  exactly, what the python block before it printed. The doc's code regenerates it here,
  so a change to the IR printer (or to the header annotations) fails this test until the
  docs are regenerated. Every fenced block that looks like printer output (a ``graph``
  line, a segment header, a pseudo-equation) must carry the marker.
- In the docs segc's layout is described by (README.md, concepts, api, cli, models,
  passes and every package README): relative links, repository paths and dotted
  ``segc.`` names exist; the layout table of docs/concepts.md is tests/test_layout.py's;
  every package has a README whose file table names each of its modules; docs/cli.md
  lists exactly the subcommands of ``segc.cli.COMMANDS``.

Regenerate an output block by running the python blocks before it and pasting what they
print (``print(g.as_text(), end="")``).
"""

from __future__ import annotations

import contextlib
import importlib
import io
import re
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
import pytest

ROOT = Path(__file__).resolve().parent.parent
OUTPUT_MARK = "<!-- output -->"
# Left out of the runs: they hold no python blocks today, and their examples are, by
# nature, shell commands for the device machine (MLX's CUDA build, an H200) or
# benchmark runs of minutes; a python block there would need a GPU or a long run.
SKIP_RUN = {
    "docs/gpu.md": "needs MLX's CUDA build on the device machine",
    "docs/performance.md": "benchmark runs take minutes",
    "docs/performance-log.md": "benchmark runs take minutes",
}
# docs whose file paths and segc names are checked (those describing the layout)
CHECKED = [
    "README.md",
    "docs/api.md",
    "docs/cli.md",
    "docs/concepts.md",
    "docs/gpu.md",
    "docs/lowering.md",
    "docs/models.md",
    "docs/passes.md",
    "docs/performance.md",
    "docs/performance-log.md",
    "docs/reliability.md",
    "docs/runtime.md",
    *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "segc").glob("*/README.md")),
]
# files whose examples take more than ~2 s (none: every example uses a tiny model and
# runs in well under a second once MLX is imported); add a file here to mark it slow
SLOW: set[str] = set()


@dataclass(frozen=True)
class Block:
    info: str  # the fence's info string ("python", "" ...)
    body: str  # the lines between the fences, each ending in a newline
    line: int  # 1-based line of the opening fence
    output: bool  # the previous non-blank line is OUTPUT_MARK


def blocks(text: str) -> list[Block]:
    """The fenced blocks of a markdown text (fences may be indented, as in lists)."""
    out: list[Block] = []
    lines = text.splitlines(keepends=True)
    prev = ""
    k = 0
    while k < len(lines):
        m = re.match(r"^( *)```(\S*)\s*$", lines[k])
        if not m:
            if lines[k].strip():
                prev = lines[k].strip()
            k += 1
            continue
        indent, info, start = len(m.group(1)), m.group(2), k
        body = []
        k += 1
        while k < len(lines) and not re.match(r"^ *```\s*$", lines[k]):
            body.append(lines[k][indent:] if lines[k][:indent].strip() == "" else lines[k])
            k += 1
        out.append(Block(info, "".join(body), start + 1, prev == OUTPUT_MARK))
        prev = "```"
        k += 1
    return out


def _docs() -> list[str]:
    return ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))]


def _run_params() -> list:
    return [pytest.param(d, marks=[pytest.mark.slow] if d in SLOW else [], id=d) for d in _docs() if d not in SKIP_RUN]


@pytest.mark.parametrize("doc", _run_params())
def test_examples_run_and_outputs_match(doc: str) -> None:
    """Run the file's python blocks in order; compare each output block exactly."""
    ns: dict = {"__name__": "__docs__"}
    printed: str | None = None
    for b in blocks((ROOT / doc).read_text()):
        if b.info == "python":
            buf = io.StringIO()
            with contextlib.redirect_stdout(buf):
                try:
                    exec(compile(b.body, f"{doc}:{b.line}", "exec"), ns)
                except Exception as exc:
                    raise AssertionError(f"{doc}, the python block at line {b.line} raised {exc!r}") from exc
            printed = buf.getvalue()
        elif b.output:
            assert printed is not None, f"{doc}:{b.line}: an output block with no python block before it"
            if mx.default_device() != mx.cpu and "-- segment" in b.body:
                continue  # printed IR: a GPU's graph keeps RMSNorm and RoPE whole, the docs show the CPU's
            assert b.body == printed, (
                f"{doc}:{b.line}: the output block is not what the python block before it prints now;\n"
                f"paste this instead:\n{printed}"
            )


_PRINTED = re.compile(
    r"^(graph \S+\(.*\) \{|\s*-- segment \d+ '|\s*segc\.(cut|signal|wait|window|host_event)\(\))", re.M
)


@pytest.mark.parametrize("doc", _docs())
def test_printer_output_is_marked(doc: str) -> None:
    """A block that shows printer output is checked against the printer, so it says so."""
    for b in blocks((ROOT / doc).read_text()):
        if b.info != "python" and _PRINTED.search(b.body):
            assert b.output, f"{doc}:{b.line}: IR text without {OUTPUT_MARK!r} before it (see tests/test_docs.py)"


def test_concepts_shows_the_printer() -> None:
    """docs/concepts.md holds the full IR of a traced function, the annotated headers of
    ``Lowered.as_text()`` and a graph with effects, all checked above."""
    outs = [b.body for b in blocks((ROOT / "docs/concepts.md").read_text()) if b.output]
    assert any(o.startswith("graph ") and "segc.cut()" in o for o in outs)
    assert any(", cost " in o and ", peak " in o and ", cross " in o for o in outs)
    assert any("segc.signal()" in o and "segc.window()" in o and "waits " in o for o in outs)
    assert any("KiB" in o for o in outs)


def test_block_parser() -> None:
    text = "a\n<!-- output -->\n\n```\nx\n```\n  ```python\n  y = 1\n  ```\n"
    assert blocks(text) == [Block("", "x\n", 4, True), Block("python", "y = 1\n", 7, False)]


# --------------------------------------------------------------------------- references

_LINK = re.compile(r"\]\(([^)\s]+)\)")
_PATH = re.compile(r"(?<![\w./-])((?:segc|docs|tests|benchmarks)/[\w./-]*[\w/])")
_NAME = re.compile(r"(?<![\w./-])segc(?:\.[A-Za-z_]\w*)+")


def resolve(name: str) -> object:
    """``segc.a.b.c`` as an import path: the longest importable module, then attributes."""
    parts = name.split(".")
    for k in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:k]))
        except ModuleNotFoundError:
            continue
        for attr in parts[k:]:
            obj = getattr(obj, attr)
        return obj
    raise ModuleNotFoundError(name)


def _slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it: lower case, punctuation but ``-`` and
    ``_`` dropped, each space a ``-``."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    return {_slug(h) for h in re.findall(r"^#+\s+(.*)$", path.read_text(), re.M)}


ALL_DOCS = sorted({"README.md", *CHECKED, *(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))})


def test_slug_is_githubs() -> None:
    assert _slug("GPU decode: the device's own time (2026-12-02, twelfth session)") == (
        "gpu-decode-the-devices-own-time-2026-12-02-twelfth-session"
    )
    assert _slug("`segc.jit(fn, *, boundaries=None)`") == "segcjitfn--boundariesnone"


@pytest.mark.parametrize("doc", ALL_DOCS)
def test_link_anchors_exist(doc: str) -> None:
    """Every ``file.md#anchor`` (or ``#anchor``) link names a heading of its target."""
    path = ROOT / doc
    bad = []
    for target in _LINK.findall(path.read_text()):
        file, _, anchor = target.partition("#")
        if not anchor or re.match(r"^[a-z]+:", target) or not (file == "" or file.endswith(".md")):
            continue
        dest = path if not file else (path.parent / file)
        if dest.exists() and anchor not in _anchors(dest):
            bad.append(target)
    assert not bad, f"{doc}: links to headings that do not exist: {bad}"


@pytest.mark.parametrize("doc", CHECKED)
def test_references_exist(doc: str) -> None:
    from segc.ir import PSEUDO

    path = ROOT / doc
    text = path.read_text()
    bad = []
    for target in _LINK.findall(text):
        if re.match(r"^[a-z]+:", target):  # a URL
            continue
        file = target.split("#")[0]
        if file and not (path.parent / file).exists():
            bad.append(f"link {target}")
        if not (path.parent / file).resolve().is_relative_to(ROOT):
            bad.append(f"link {target} points outside the repository")
    for p in _PATH.findall(text):
        if not (ROOT / p).exists():
            bad.append(f"path {p}")
    for name in sorted(set(_NAME.findall(text)) - PSEUDO):
        try:
            resolve(name)
        except (ImportError, AttributeError) as exc:
            bad.append(f"name {name} ({exc})")
    assert not bad, f"{doc}: " + "; ".join(bad)


def test_layout_table_is_the_enforced_one() -> None:
    """docs/concepts.md's layout table gives each module tests/test_layout.py's layer."""
    from test_layout import LAYERS

    text = (ROOT / "docs/concepts.md").read_text().split("## Layout", 1)[1]
    table: dict[str, int] = {}
    for row in re.findall(r"^\| *(-?\d+) *\|([^|]*)\|", text, re.M):
        for p in re.findall(r"`(segc/[\w/.]*)`", row[1]):
            mod = p.removesuffix("/").removesuffix(".py").removesuffix("/__init__").replace("/", ".")
            table[mod] = int(row[0])
    assert table == LAYERS


def test_every_package_has_a_readme_naming_its_files() -> None:
    missing = []
    for pkg in sorted(p.parent for p in (ROOT / "segc").glob("*/__init__.py")):
        readme = pkg / "README.md"
        if not readme.exists():
            missing.append(f"{pkg.name}/README.md")
            continue
        text = readme.read_text()
        missing += [
            f"{pkg.name}/{f.name}"
            for f in sorted(pkg.glob("*.py"))
            if f.name != "__init__.py" and f"`{f.name}`" not in text
        ]
    assert not missing, f"not in the package READMEs: {missing}"


def test_cli_doc_lists_every_subcommand() -> None:
    from segc.cli import COMMANDS

    text = (ROOT / "docs/cli.md").read_text()
    assert set(re.findall(r"^\| `segc (\w+)`", text, re.M)) == set(COMMANDS)
