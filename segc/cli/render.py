"""A segmented graph as Graphviz DOT, as SVG (through Graphviz's ``dot``) and as one
self-contained HTML page: segments as clusters (boxes), boundary values as thick blue
edges (labelled with their type and bytes), fences as red hexagons."""

from __future__ import annotations

import html
import itertools
import json
import shutil
import subprocess
from typing import Any

from ..errors import UsageError

BOUNDARY_STYLE = 'shape=box, style=filled, fillcolor="#dbe7ff", color="#1f5fd6", penwidth=1.6, fontcolor="#1f5fd6"'
COLORS = ("#eef4ff", "#fff4e6", "#effaf0", "#fbeefa", "#f4f4f4", "#fffbe0")


def _q(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def to_dot(g: Any) -> str:
    from ..ir import segments
    from ..ir.printer import effect_text
    from ..units import fmt_bytes

    vs = g.vars()
    segs = segments(g)
    producer: dict[str, str] = {}
    lines = [
        f"digraph {_q(g.name)} {{",
        "  rankdir=TB; compound=true; newrank=true;",
        '  node [shape=box, style="rounded,filled", fillcolor=white, fontname="monospace", fontsize=9];',
        '  edge [color="#888888", arrowsize=0.5];',
    ]
    lines.append('  subgraph cluster_inputs { label="inputs"; style=dashed; fontname="sans-serif";')
    for i in g.inputs:
        if i.kind == "param":
            continue
        node = f"in_{i.var.name}"
        producer[i.var.name] = node
        lines.append(f"    {node} [shape=ellipse, label={_q(f'%{i.var.name} {i.kind} {i.path}: {i.var.type_str()}')}];")
    lines.append("  }")
    seg_of: dict[str, int] = {}  # value -> the segment that computes it
    for s in segs:
        for e in s.eqns(g):
            for o in e.outs:
                seg_of[o.name] = s.index
    edges: list[str] = []
    for s in segs:
        color = COLORS[s.index % len(COLORS)]
        n = sum(1 for e in g.eqns[s.start : s.stop] if not e.is_pseudo)
        title = f"segment {s.index} '{s.name}': {n} eqns, in {fmt_bytes(sum(vs[v].nbytes for v in s.inputs))}, "
        title += f"out {fmt_bytes(sum(vs[v].nbytes for v in s.outputs))}"
        lines.append(f"  subgraph cluster_{s.index} {{")
        lines.append(f'    label={_q(title)}; style=filled; fillcolor="{color}"; fontname="sans-serif"; fontsize=11;')
        local: dict[str, str] = {}
        for v in s.inputs:  # a boundary value: a blue node at the top of the segment that reads it
            if v not in seg_of:
                continue
            node = f"b{s.index}_{v}"
            local[v] = node
            text = f"%{v} {vs[v].type_str()} {fmt_bytes(vs[v].nbytes)}  from segment {seg_of[v]}"
            lines.append(f"    {node} [{BOUNDARY_STYLE}, label={_q(text)}];")
            if seg_of[v] == s.index - 1:  # from the segment just before: drawn, thick and blue
                edges.append(f'  {producer[v]} -> {node} [color="#1f5fd6", penwidth=2.2];')
        for e in g.eqns[s.start : s.stop]:
            node = f"e{e.id}"
            if e.is_pseudo:
                text = effect_text(e) or e.prim
                if text and e.prim != "segc.cut":
                    lines.append(f"    {node} [shape=hexagon, color=red, fontcolor=red, label={_q(text)}];")
                continue
            outs = ", ".join(o.type_str() for o in e.outs)
            lines.append(f"    {node} [label={_q(f'#{e.id} {e.prim}  {outs}')}];")
            for v in dict.fromkeys(e.ins):
                src = local.get(v) or producer.get(v)
                if src is not None:  # not a parameter or a constant
                    edges.append(f"  {src} -> {node};")
            for o in e.outs:
                producer[o.name] = node
        lines.append("  }")
    lines += edges
    ends = [[f"e{e.id}" for e in s.eqns(g)] for s in segs]
    for a, b in itertools.pairwise(ends):  # segment k above segment k + 1
        if a and b:
            lines.append(f"  {a[-1]} -> {b[0]} [style=invis, weight=10];")
    lines.append('  out [shape=ellipse, label="return"];')
    for v in g.outputs:
        if v in producer:
            lines.append(f"  {producer[v]} -> out;")
    lines.append("}")
    return "\n".join(lines) + "\n"


def to_svg(dot: str) -> str:
    exe = shutil.which("dot")
    if exe is None:
        raise UsageError(
            "--format svg needs Graphviz's `dot`, which is not on PATH "
            "(apt-get install graphviz / brew install graphviz), or use --format dot or html"
        )
    try:
        res = subprocess.run([exe, "-Tsvg"], input=dot, capture_output=True, text=True, timeout=120, check=False)
    except subprocess.TimeoutExpired:
        raise UsageError("Graphviz's dot took over 120 s; try --format html or a smaller target") from None
    if res.returncode != 0:
        raise UsageError(f"Graphviz's dot failed: {res.stderr.strip()[:300]}")
    return res.stdout


def to_html(g: Any, svg: str | None = None, title: str | None = None) -> str:
    """One page, no external resources: a card per segment (its equations, its boundary
    values in and out with their bytes, its fences), and the Graphviz drawing if given."""
    from ..ir import segment_effects, segments
    from ..ir.printer import args_to_json, effect_text
    from ..units import fmt_bytes

    vs = g.vars()
    esc = html.escape
    cards = []
    for s, eff in zip(segments(g), segment_effects(g)):
        rows = []
        fences = []
        for e in g.eqns[s.start : s.stop]:
            if e.is_pseudo:
                t = effect_text(e)
                if t:
                    fences.append(f'<li class="fence">{esc(t)}</li>')
                continue
            outs = ", ".join(f'<span class="v" data-v="{o.name}">%{o.name}</span>: {o.type_str()}' for o in e.outs)
            ins = ", ".join(f'<span class="v" data-v="{v}">%{v}</span>' for v in e.ins)
            args = esc(args_to_json(e.args)) if e.args else ""
            rows.append(
                f'<tr><td class="id">#{e.id}</td><td>{outs}</td><td><b>{esc(e.prim)}</b>({ins}) {args}</td></tr>'
            )

        def vals(names: tuple[str, ...]) -> str:
            return (
                " ".join(
                    f'<span class="v bnd" data-v="{v}" title="{vs[v].type_str()}">%{v} '
                    f"<small>{vs[v].type_str()} {fmt_bytes(vs[v].nbytes)}</small></span>"
                    for v in names
                )
                or "-"
            )

        params = {i.var.name for i in g.inputs if i.kind == "param"}
        acts = tuple(v for v in s.inputs if v not in params)
        pbytes = sum(vs[v].nbytes for v in s.inputs if v in params)
        np_ = len(s.inputs) - len(acts)
        pnote = f" <small>+ {np_} parameters ({fmt_bytes(pbytes)})</small>" if np_ else ""
        n = len(rows)
        win = f" · windows {esc(', '.join(eff.windows))}" if eff.windows else ""
        cards.append(
            f'<section class="segment" data-index="{s.index}" style="background:{COLORS[s.index % len(COLORS)]}">'
            f"<h2>segment {s.index} <code>{esc(s.name)}</code> <small>{n} eqns{win}</small></h2>"
            f'<div class="io">in ({fmt_bytes(sum(vs[v].nbytes for v in acts))}): {vals(acts)}{pnote}</div>'
            f'<div class="io">out ({fmt_bytes(sum(vs[v].nbytes for v in s.outputs))}): {vals(s.outputs)}</div>'
            + (f'<ul class="fences">{"".join(fences)}</ul>' if fences else "")
            + f"<details><summary>equations</summary><table>{''.join(rows)}</table></details></section>"
        )
    drawing = f'<h2>graph</h2><div class="svg">{svg[svg.find("<svg") :]}</div>' if svg else ""
    meta = json.dumps({"graph": g.name, "segments": len(cards)})
    return _PAGE.format(
        title=esc(title or g.name), n=len(cards), cards="\n".join(cards), drawing=drawing, meta=esc(meta)
    )


_PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>segc: {title}</title>
<style>
body {{ font: 14px system-ui, sans-serif; margin: 1.5em; color: #222; }}
.segments {{ display: flex; flex-wrap: wrap; gap: 12px; align-items: flex-start; }}
.segment {{ border: 1px solid #99a; border-radius: 8px; padding: 8px 12px; min-width: 260px; max-width: 560px; }}
.segment h2 {{ font-size: 15px; margin: 2px 0 6px; }}
.io {{ font-size: 12px; margin: 3px 0; }}
.v {{ font-family: monospace; cursor: pointer; }}
.bnd {{ color: #1f5fd6; border: 1px solid #1f5fd6; border-radius: 4px; padding: 0 3px; margin-right: 3px; }}
.hl {{ background: #ffe066; }}
.fences {{ color: #c00; margin: 4px 0; padding-left: 18px; font-size: 12px; }}
table {{ font: 11px monospace; border-collapse: collapse; }}
td {{ padding: 0 6px; vertical-align: top; }} td.id {{ color: #888; }}
.svg svg {{ max-width: 100%; height: auto; }}
</style></head>
<body data-segc="{meta}">
<h1>{title}</h1>
<p>{n} segments. Blue: values crossing a boundary (type, bytes). Red: fences. Click a value to highlight its uses.</p>
<div class="segments">
{cards}
</div>
{drawing}
<script>
document.querySelectorAll('.v').forEach(function (el) {{
  el.addEventListener('click', function () {{
    var v = el.dataset.v;
    document.querySelectorAll('.hl').forEach(function (x) {{ x.classList.remove('hl'); }});
    document.querySelectorAll('.v[data-v="' + v + '"]').forEach(function (x) {{ x.classList.add('hl'); }});
  }});
}});
</script>
</body></html>
"""
