"""What the subcommands share: the one error path, option value types, tables in
three formats (``table`` through rich, ``csv``, ``json``) and progress on stderr."""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import sys
import traceback
import warnings
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from ..errors import SegcError, SegcWarning, UsageError

FORMATS = ("table", "csv", "json")


def report(args: argparse.Namespace, body: Callable[[], int]) -> int:
    """Run ``body``; a mistake is one line ``segc <command>: ...`` (status 2), anything
    else one line too (status 1), unless ``--debug``."""
    where = f"segc {args.command}"
    try:
        with warnings.catch_warnings():
            shown = warnings.showwarning

            def show(message: Any, category: type[Warning], *rest: Any, **kw: Any) -> None:
                if issubclass(category, SegcWarning):  # segc's own: one line, as its errors
                    print(f"{where}: warning: {' '.join(str(message).split())}", file=sys.stderr)
                else:
                    shown(message, category, *rest, **kw)

            warnings.showwarning = show
            warnings.filterwarnings("always", category=SegcWarning)  # each one shown, never raised
            return body()
    except KeyboardInterrupt:
        print(f"{where}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `segc trace ... | head`
        sys.stderr.close()
        return 0
    except Exception as exc:
        if getattr(args, "debug", False):
            raise
        user = isinstance(exc, SegcError | OSError | ImportError)
        text = _message(exc)
        raised = None if user else user_raised(exc)
        if raised is not None:
            user, text = True, raised
        elif not user:
            text = f"internal error: {type(exc).__name__}: {text} (run with --debug for the traceback)"
        print(f"{where}: {text}", file=sys.stderr)
        return 2 if user else 1


def _message(exc: BaseException) -> str:
    if isinstance(exc, FileNotFoundError | IsADirectoryError | PermissionError) and exc.filename:
        return f"{exc.filename}: {exc.strerror.lower() if exc.strerror else exc}"
    if isinstance(exc, ImportError):
        missing = exc.name or ""
        if missing.split(".")[0] in ("mlx_lm", "transformers"):
            return f"this needs mlx-lm, which is not installed: pip install 'segc[lm]' ({exc})"
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 600 else text[:600] + " ..."


# the user's code (a ``file.py:function`` or ``module:function`` target's file) and the
# name to report it by: an exception raised there is the user's mistake, not segc's
USER_CODE: dict[str, str] = {}
_SEGC = os.path.dirname(os.path.dirname(os.path.realpath(__file__))) + os.sep


def user_code(path: str, name: str) -> None:
    USER_CODE[os.path.realpath(path)] = name


def user_raised(exc: BaseException) -> str | None:
    """``<name> raised <type>: <message> (at file:line)`` when ``exc`` came out of the
    user's code (a frame in a file of :data:`USER_CODE`, and no segc frame after it);
    else None."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = [i for i, fr in enumerate(frames) if os.path.realpath(fr.filename) in USER_CODE]
    if not where or any(os.path.realpath(fr.filename).startswith(_SEGC) for fr in frames[where[-1] + 1 :]):
        return None
    fr = frames[where[-1]]
    name = USER_CODE[os.path.realpath(fr.filename)]
    return f"{name} raised {type(exc).__name__}: {_message(exc)} (at {os.path.basename(fr.filename)}:{fr.lineno})"


def debug_trace() -> str:
    return traceback.format_exc()


# --------------------------------------------------------------------------- option types


def positive_int(minimum: int = 1) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if v < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {v}")
        return v

    parse.__name__ = "int"
    return parse


def window(text: str) -> tuple[int, int]:
    first, sep, last = text.partition(":")
    try:
        if not sep:
            raise ValueError
        return int(first), int(last)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected FIRST:LAST (two equation ids, e.g. 30:60), got {text!r}") from None


def choice_error(what: str, got: str, choices: Iterable[str]) -> UsageError:
    return UsageError(f"no {what} {got!r}; choose from: {', '.join(choices)}")


def read_text(path: str) -> str:
    if path == "-":
        return sys.stdin.read()
    try:
        with open(path) as f:
            return f.read()
    except UnicodeDecodeError:
        raise UsageError(f"{path}: not a text file") from None


def add_format(p: argparse.ArgumentParser, default: str = "table") -> None:
    p.add_argument("--format", choices=FORMATS, default=default, help=f"table, csv or json (default {default})")


# --------------------------------------------------------------------------- tables


def emit(
    rows: Sequence[dict[str, Any]],
    columns: Sequence[tuple[str, str]],
    fmt: str,
    *,
    title: str | None = None,
    caption: str | None = None,
    meta: dict[str, Any] | None = None,
    out: Any = None,
) -> None:
    """Print ``rows`` (dicts of raw values) as ``fmt``. ``columns``: (key, heading);
    a heading ending in ``>`` is right-aligned in the table. The table shows values
    through :func:`cell`; csv and json keep them raw (bytes as integers, seconds as
    floats), with ``meta`` (what the figures assume) as the json's other keys."""
    out = out or sys.stdout
    if fmt == "json":
        json.dump({**(meta or {}), "rows": list(rows)}, out, indent=1, default=str)
        out.write("\n")
        return
    if fmt == "csv":
        w = csv.writer(out, lineterminator="\n")
        w.writerow([k for k, _ in columns])
        for r in rows:
            w.writerow([r.get(k, "") for k, _ in columns])
        return
    from rich import box
    from rich.console import Console
    from rich.table import Table

    t = Table(box=box.SIMPLE_HEAD)
    for _, head in columns:
        t.add_column(head.rstrip(">"), justify="right" if head.endswith(">") else "left", no_wrap=True)
    for r in rows:
        t.add_row(*(cell(k, r.get(k)) for k, _ in columns))
    buf = io.StringIO()  # never narrower than the table: a cut column would lose figures
    Console(file=buf, width=1000, no_color=True, highlight=False, soft_wrap=False, emoji=False).print(t)
    lines = [line.rstrip() for line in buf.getvalue().splitlines()]
    out.write("\n".join(([title] if title else []) + lines + ([caption] if caption else [])) + "\n")


def cell(key: str, v: Any) -> str:
    from ..units import fmt_bytes, fmt_seconds

    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int) and (key.endswith("bytes") or key.startswith("bytes") or key.endswith("peak")):
        return fmt_bytes(v)
    if isinstance(v, float) and (key.endswith("_s") or key.endswith("cost")):
        return fmt_seconds(v)
    if isinstance(v, float) and key == "ratio":
        return f"{v:.2f}"
    if isinstance(v, int) and key.endswith("flops"):
        return f"{v:,}"
    return str(v)


def progress(total: int, what: str) -> Any:
    """A rich progress bar on stderr (silent when stderr is not a terminal, unless
    ``SEGC_PROGRESS=1``); use as a context manager, ``advance()`` per step."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(file=sys.stderr)
    show = sys.stderr.isatty() or os.environ.get("SEGC_PROGRESS") == "1"
    bar = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        disable=not show,
        transient=True,
    )

    class _Bar:
        def __enter__(self) -> _Bar:
            bar.__enter__()
            self.task = bar.add_task(what, total=total)
            return self

        def __exit__(self, *exc: object) -> None:
            bar.__exit__(*exc)  # type: ignore[arg-type]

        def advance(self, n: int = 1, what: str | None = None) -> None:
            bar.update(self.task, advance=n, description=what or bar.tasks[0].description)

    return _Bar()


def warn(command: str, text: str) -> None:
    print(f"segc {command}: {text}", file=sys.stderr)
