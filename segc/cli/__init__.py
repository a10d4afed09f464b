"""The ``segc`` command. Each subcommand is a module of this package with
``add_arguments(parser)`` and ``run(args)``."""

from __future__ import annotations

import argparse
import importlib
import sys

# subcommand name -> module of segc.cli
COMMANDS = {
    "demo": "demo",
    "ir": "ir",
    "passes": "passes",
    "generate": "generate",
    "experiment": "experiment",
    "calibrate": "calibrate",
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="segc", description="segc: segmented execution of MLX models")
    sub = parser.add_subparsers(dest="command", required=True)
    mods = {}
    for name, modname in COMMANDS.items():
        mod = importlib.import_module(f"segc.cli.{modname}")
        p = sub.add_parser(name, help=mod.__doc__.strip().splitlines()[0] if mod.__doc__ else None)
        mod.add_arguments(p)
        mods[name] = mod
    args = parser.parse_args(argv)
    return int(mods[args.command].run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
