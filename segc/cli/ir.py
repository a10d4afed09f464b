"""Print the segmented IR of the built-in tiny llama (or parse-check an IR file)."""

from __future__ import annotations

import argparse

from .common import positive_int, read_text


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--layers", type=positive_int(), default=2, help="decoder layers of the tiny llama (default 2)")
    p.add_argument("--tokens", type=positive_int(), default=8, help="prompt length traced (default 8)")
    p.add_argument("--boundaries", default="layers.*", help="glob over submodule paths ('' for none)")
    p.add_argument("--check", metavar="FILE", help="parse FILE ('-' for stdin), verify it, print it back")


def run(args: argparse.Namespace) -> int:
    import mlx.core as mx

    import segc
    from segc.errors import SegcError, UsageError
    from segc.models import tiny_llama

    if args.check:
        text = read_text(args.check)
        try:
            print(segc.parse(text).as_text(), end="")
        except SegcError as exc:
            raise UsageError(f"{args.check}: {exc}") from None
        return 0
    model = tiny_llama(num_hidden_layers=args.layers)
    step = segc.jit(model, boundaries=args.boundaries or None)
    print(step.lower(mx.zeros((1, args.tokens), dtype=mx.int32)).as_text(), end="")
    return 0
