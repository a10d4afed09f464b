"""Draw a target's segmented graph: segments as clusters, boundary values and fences
visible. ``--format dot`` (Graphviz source), ``svg`` (through Graphviz's ``dot``) or
``html`` (one self-contained page; with the SVG drawing when ``dot`` is installed).

Examples::

    segc graph llama:layers=2 --format html -o llama.html
    segc graph graph.segc --format svg -o g.svg --strategy balanced:3
"""

from __future__ import annotations

import argparse
import shutil
import sys

from .target import add_strategy_argument, add_target_arguments, cut, load


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_target_arguments(p)
    add_strategy_argument(p)
    p.add_argument("--format", choices=("dot", "svg", "html"), default="dot", help="dot, svg or html (default dot)")
    p.add_argument("-o", "--output", metavar="FILE", help="write here instead of stdout")
    p.add_argument("--no-drawing", action="store_true", help="html: leave out the Graphviz drawing")
    p.add_argument("--screenshot", metavar="PNG", help="html: also render the page in headless Chromium and save a PNG")


def run(args: argparse.Namespace) -> int:
    from .render import to_dot, to_html, to_svg

    if args.format == "svg" and shutil.which("dot") is None:
        to_svg("")  # the clear error, before tracing anything
    if args.screenshot and (args.format != "html" or not args.output):
        from ..errors import UsageError

        raise UsageError("--screenshot goes with --format html -o FILE")
    if args.output:
        open(args.output, "a").close()
    target = load(args)
    g, _ = cut(target.traced_graph(), args.strategy, legalize=not args.no_legalize)
    if args.format == "dot":
        text = to_dot(g)
    elif args.format == "svg":
        text = to_svg(to_dot(g))
    else:
        svg = None
        if not args.no_drawing:
            if shutil.which("dot") is not None:
                svg = to_svg(to_dot(g))
            else:
                print("segc graph: Graphviz's dot is not installed: the page has no drawing", file=sys.stderr)
        text = to_html(g, svg, title=target.label)
    if args.output:
        with open(args.output, "w") as f:
            f.write(text)
        print(f"{args.format}: {target.label} -> {args.output}", file=sys.stderr)
        if args.screenshot:
            from .browser import screenshot

            n = screenshot(args.output, args.screenshot)
            print(f"screenshot: {n} segments rendered -> {args.screenshot}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0
