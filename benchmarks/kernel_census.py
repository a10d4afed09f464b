"""Which kernels one decode step launches, per variant, counted from MLX's own CUDA graphs
(issue 13: a decode step on the GPU costs what its kernels cost the host, so the next
kernel to remove is the one this lists most).

Each variant runs in a process of its own with ``MLX_SAVE_CUDA_GRAPHS_DOT_FILE`` set:
MLX then writes every CUDA graph it commits as a Graphviz file (``cudaGraphDebugDotPrint``).
The step is warmed up (traced, lowered, its kernels built), then run once more; the
graphs written by that run are parsed and their kernel nodes counted by kernel name
(template arguments and launch dimensions dropped, so that every layer's instance of a
kernel counts under one name; a node that is not a kernel counts under its kind). On a machine without CUDA MLX writes no graph: each
variant reports none.

    python benchmarks/kernel_census.py [--steps eager,compile,segc] [--layers 16] [--bits 4] [--top 25] [--keep DIR]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent

# a node of cudaGraphDebugDotPrint's output: "graph_0_node_3"[style=... shape=... label="..."];
# a kernel is an octagon labelled with its number and its (mangled) symbol, a child graph
# (MLX adds some: cuBLAS's, cuDNN's) a rectangle labelled "graph_<n>", whose own nodes
# follow as a cluster of their own; a label may hold escaped quotes and newlines
_NODE = re.compile(r'^\s*"?(\w+_node_\d+)"?\s*\[([^\n]*?)label="((?:[^"\\]|\\.)*)"', re.M)
_CHILD = re.compile(r"graph_\d+")


def kernel_name(label: str) -> str:
    """What a node's label names (its first line that is not the node's number), without
    template arguments, launch dimensions or parameters: a kernel's name, or a node
    kind (a memset, an event) as the label gives it."""
    lines = [ln.strip() for ln in label.replace("\\n", "\n").splitlines() if ln.strip()]
    words = [ln for ln in lines if not ln.isdigit()] or lines or ["?"]
    name = words[0].removeprefix("void ")
    for cut in ("\\<", "<", "("):  # template arguments, a launch configuration, parameters
        name = name.split(cut, 1)[0]
    return name.strip() or words[0]


def census(dot_texts: list[str]) -> collections.Counter[str]:
    """Nodes by name over the graphs' texts (a child graph's node under one name: its
    kernels are counted in its own cluster)."""
    counts: collections.Counter[str] = collections.Counter()
    for text in dot_texts:
        for m in _NODE.finditer(text):
            name = kernel_name(m.group(3))
            child = 'shape="rectangle"' in m.group(2) and _CHILD.fullmatch(name)
            counts["(a child graph's frame)" if child else name] += 1
    return counts


def readable(counts: collections.Counter[str]) -> collections.Counter[str]:
    """``counts`` with mangled symbols demangled by ``c++filt`` where the machine has it
    (then without their template arguments and parameters, as ``kernel_name`` drops
    them), merged by the names that result."""
    mangled = [k for k in counts if k.startswith("_Z")]
    tool = shutil.which("c++filt")
    if not mangled or tool is None:
        return counts
    p = subprocess.run([tool], input="\n".join(mangled), capture_output=True, text=True)
    names = p.stdout.splitlines() if p.returncode == 0 else []
    if len(names) != len(mangled):
        return counts
    out: collections.Counter[str] = collections.Counter()
    plain = dict(zip(mangled, names))
    for k, n in counts.items():
        out[kernel_name(plain[k]) if k in plain else k] += n
    return out


def child(args: argparse.Namespace) -> None:
    """Run in the variant's process: warm the step up, run it once, count its graphs."""
    import mlx.core as mx

    sys.path.insert(0, str(HERE))
    from device_time import step_body

    prefix = os.environ.get("MLX_SAVE_CUDA_GRAPHS_DOT_FILE", "")
    folder = Path(prefix).parent if prefix else None
    body = step_body(args.child, args.layers, args.bits)
    x = mx.array([[1]])
    for _ in range(3):
        mx.eval(body(x))
    mx.synchronize()
    # MLX numbers the files after the prefix; their suffix is its business, so every file
    # the prefix starts is one
    pattern = Path(prefix).name + "*"
    before = set(folder.glob(pattern)) if folder else set()
    mx.eval(body(x))
    mx.synchronize()
    new = sorted(set(folder.glob(pattern)) - before) if folder else []
    if args.keep and new:
        keep = Path(args.keep) / args.child
        keep.mkdir(parents=True, exist_ok=True)
        for p in new:
            shutil.copy(p, keep / p.name)
    counts = census([p.read_text(errors="replace") for p in new])
    print(json.dumps({"graphs": len(new), "kernels": dict(counts)}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", default="eager,compile,segc", help="variants (device_time.py's --steps names)")
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--bits", type=int, default=None)
    ap.add_argument("--top", type=int, default=25, help="kernel names listed per variant")
    ap.add_argument("--keep", default=None, help="a folder to copy each variant's graphs into (a folder each)")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args)
        return
    results = {}
    for name in args.steps.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            env = dict(os.environ, MLX_SAVE_CUDA_GRAPHS_DOT_FILE=str(Path(tmp) / "g"))
            cmd = [sys.executable, __file__, "--child", name, "--layers", str(args.layers)]
            cmd += ["--bits", str(args.bits)] if args.bits else []
            cmd += ["--keep", args.keep] if args.keep else []
            p = subprocess.run(cmd, capture_output=True, text=True, env=env)
            if p.returncode != 0:
                raise SystemExit(f"{name}: {p.stderr.strip() or p.stdout.strip()}")
            results[name] = json.loads(p.stdout.strip().splitlines()[-1])
    for name, r in results.items():
        counts = readable(collections.Counter(r["kernels"]))
        total = sum(counts.values())
        print(f"\n{name}: {r['graphs']} CUDA graphs, {total} nodes in one decode step")
        if not r["graphs"]:
            print("  (no CUDA graphs: MLX writes them only on its CUDA build)")
        for k, n in counts.most_common(args.top):
            print(f"  {n:5d}  {k}")


if __name__ == "__main__":
    main()
