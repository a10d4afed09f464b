"""The ``segc`` command. Each subcommand is a module of this package with
``add_arguments(parser)`` and ``run(args)``; :data:`COMMANDS` maps subcommand names to
modules. Building the parser imports no MLX model code (``segc --help`` is fast): the
subcommand modules import what they need inside ``run``.

Every user mistake ends as one line, ``segc <command>: <what was wrong>``, on stderr
and exit status 2 (``--debug`` shows the traceback instead); an internal error is one
line and exit status 1.
"""

from __future__ import annotations

import argparse
import importlib
import re
import sys
from typing import NoReturn

# subcommand name -> module of segc.cli
COMMANDS = {
    "trace": "trace",
    "passes": "passes",
    "segments": "segments",
    "graph": "graph",
    "verify": "verify",
    "run": "timeline",
    "bench": "bench",
    "ir": "ir",
    "demo": "demo",
    "generate": "generate",
    "experiment": "experiment",
    "calibrate": "calibrate",
}

VERSION = "0.1.0"  # pyproject.toml's; segc.__version__ reads it


class Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line: ``segc <command>: <message>``."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message}\n")


def plain(doc: str) -> str:
    """A module docstring as help text: reStructuredText's markup (````code````, a
    literal block's ``::``) as plain text."""
    return re.sub(r"``(.+?)``", r"\1", doc.replace("::\n", ":\n"))


def build_parser() -> tuple[Parser, dict[str, object]]:
    parser = Parser(prog="segc", description="segc: segmented execution of MLX models, and the tools to debug it")
    parser.add_argument("--version", action="version", version=f"segc {VERSION}")
    parser.add_argument("--debug", action="store_true", help="show a traceback instead of a one-line error")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=Parser)
    mods: dict[str, object] = {}
    for name, modname in COMMANDS.items():
        mod = importlib.import_module(f"segc.cli.{modname}")
        doc = plain((mod.__doc__ or "").strip())
        p = sub.add_parser(
            name,
            help=doc.split("\n\n")[0].replace("\n", " ").split(". ")[0].rstrip(".:") if doc else None,
            description=doc or None,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
        mod.add_arguments(p)  # type: ignore[attr-defined]
        mods[name] = mod
    return parser, mods


def main(argv: list[str] | None = None) -> int:
    parser, mods = build_parser()
    args = parser.parse_args(argv)
    from .common import report

    return report(args, lambda: int(mods[args.command].run(args) or 0))  # type: ignore[attr-defined]


if __name__ == "__main__":
    sys.exit(main())
