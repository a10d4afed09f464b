"""Print the segmented IR of the built-in tiny llama (or parse-check an IR file)."""

from __future__ import annotations

import argparse
import sys

import mlx.core as mx


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--tokens", type=int, default=8)
    p.add_argument("--boundaries", default="layers.*", help="glob over submodule paths ('' for none)")
    p.add_argument("--check", metavar="FILE", help="parse FILE ('-' for stdin), verify it, print it back")


def run(args: argparse.Namespace) -> int:
    import segc
    from segc.models import tiny_llama

    if args.check:
        try:
            if args.check == "-":
                text = sys.stdin.read()
            else:
                with open(args.check) as f:
                    text = f.read()
            print(segc.parse(text).as_text(), end="")
        except (OSError, UnicodeDecodeError, segc.SegcError) as exc:
            print(f"segc ir: {args.check}: {exc}", file=sys.stderr)
            return 2
        return 0
    model = tiny_llama(num_hidden_layers=args.layers)
    step = segc.jit(model, boundaries=args.boundaries or None)
    print(step.lower(mx.zeros((1, args.tokens), dtype=mx.int32)).as_text(), end="")
    return 0
