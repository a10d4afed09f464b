"""The ``segc`` command. Each subcommand lives in its own module under segc/commands/."""

from __future__ import annotations

import argparse
import importlib
import sys

# subcommand name -> module under segc.commands; each module has add_arguments(p) and run(args)
COMMANDS = {
    "demo": "demo",
    "ir": "ir",
    "passes": "passes",
    "generate": "generate",
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="segc", description="segc: segmented execution of MLX models")
    sub = parser.add_subparsers(dest="command", required=True)
    mods = {}
    for name, modname in COMMANDS.items():
        mod = importlib.import_module(f"segc.commands.{modname}")
        p = sub.add_parser(name, help=mod.__doc__.strip().splitlines()[0] if mod.__doc__ else None)
        mod.add_arguments(p)
        mods[name] = mod
    args = parser.parse_args(argv)
    return int(mods[args.command].run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
