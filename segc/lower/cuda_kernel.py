"""``mx.fast.cuda_kernel`` with the kernel's text in its name, and kept out of MLX's hash.

MLX 0.32's CUDA build keeps every compiled kernel on disk, in
``$TMPDIR/mlx/<version>/ptx/`` (or ``MLX_PTX_CACHE_DIR``), under the kernel's name and
template arguments only (``mlx/backend/cuda/jit_module.cpp``), and loads it from there in
any later process. A segc kernel whose source changed (a new segc on the same machine,
or a test re-run after an edit) but whose name did not would silently run the old
binary. So every segc kernel is made here, its name followed by a hash of what MLX
compiles from: the header, the source, the input and output names.

MLX also hashes a custom kernel's whole text (header and source) at *every* evaluation
(``CustomKernel::eval_gpu``, its module's name): with segc's 4.5-6 KB kernels, 83 of
them a decode step, a profile on an H200 put ``std::_Hash_bytes`` at 4-5% of the step's
host time, about 0.11 ms a call (docs/performance-log.md, the twentieth session). So the
text is handed to MLX compacted (:func:`compact`: no comments, no indentation, no blank
lines), which changes no token of what NVRTC compiles, and, by default, written to
files that the kernel's header and body ``#include`` by their absolute paths
(:func:`included`): MLX then hashes a few hundred bytes a kernel. The preprocessor
pastes a file where its ``#include`` stands, inside the kernel's body too, so NVRTC
compiles the same tokens. ``SEGC_CUDA_INCLUDE=0`` hands MLX the text itself.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import mlx.core as mx

from ..settings import env_choice

_SPACES = re.compile(r"[ \t]+")
_INCLUDED = re.compile(r'(?m)^#include "(/[^"]*/[0-9a-f]{20}\.cuh)"\n(// uses [^\n]*\n)?')  # an included()'s lines


def compact(text: str) -> str:
    """``text`` with its ``//`` comments, indentation, runs of blanks and empty lines
    removed; a line stays a line (preprocessor directives need theirs). A line whose code
    holds a quote (segc's only strings are ``#include`` paths) is only stripped."""
    lines = []
    for line in text.splitlines():
        code = line.split("//", 1)[0]
        if '"' not in code and "'" not in code:
            line = _SPACES.sub(" ", code)
        line = line.strip()
        if line:
            lines.append(line)
    return "\n".join(lines) + "\n" if lines else ""


def kernel_name(name: str, source: str, header: str, inputs: Sequence[str], outputs: Sequence[str]) -> str:
    """``name`` and a hash of the kernel's text (module docstring)."""
    text = "\0".join([header, source, ",".join(inputs), ",".join(outputs)])
    return f"{name}_{hashlib.sha1(text.encode()).hexdigest()[:10]}"


def include_dir() -> Path:
    """Where :func:`included` writes: ``SEGC_CUDA_INCLUDE_DIR``, else a directory of the
    user's own under the system's temporary directory."""
    given = os.environ.get("SEGC_CUDA_INCLUDE_DIR", "").strip()
    if given:
        return Path(given).absolute()
    uid = os.getuid() if hasattr(os, "getuid") else 0
    return Path(tempfile.gettempdir()).absolute() / f"segc-{uid}" / "cuda"


@functools.cache
def _written(text: str, where: Path) -> Path | None:
    """``text`` in a file of ``where`` named by its hash (written once, atomically, so
    that processes sharing the directory never read half a file); None where the
    directory cannot be written, is not the user's own (:func:`_private`) or its path
    cannot stand in an ``#include``."""
    path = where / f"{hashlib.sha1(text.encode()).hexdigest()[:20]}.cuh"
    if not str(path).isascii() or any(c in str(path) for c in '"\n\\'):
        return None
    try:
        where.mkdir(mode=0o700, parents=True, exist_ok=True)
        if not _private(where):
            return None
        if not path.is_file() or path.read_text() != text:
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(text)
            os.replace(tmp, path)
    except OSError:
        return None
    return path


def _private(where: Path) -> bool:
    """Whether ``where`` and the directory holding it (below the system's temporary
    directory) are the user's own and writable by no one else: NVRTC compiles what the
    files say, so no other user may be able to replace them."""
    top = Path(tempfile.gettempdir()).absolute()
    for d in (where, where.parent):
        if d == top:
            break
        st = d.stat()
        if (hasattr(os, "getuid") and st.st_uid != os.getuid()) or st.st_mode & 0o022:
            return False
    return True


def included(text: str, keep: Sequence[str] = ()) -> str:
    """``text`` as an ``#include`` of a file holding it (``text`` itself where no file
    could be written), followed by a comment naming each of ``keep`` that ``text``
    mentions: MLX passes an input's shape or strides only to a kernel whose source
    mentions ``<input>_shape`` or ``<input>_strides``, and it reads the source it is
    given, not the file."""
    if not text or env_choice("SEGC_CUDA_INCLUDE", ("0", "1"), "1") == "0":
        return text
    path = _written(text, include_dir())
    if path is None:
        return text
    named = [k for k in keep if k in text]
    return f'#include "{path}"\n' + (f"// uses {' '.join(named)}\n" if named else "")


def expand(text: str) -> str:
    """``text`` with each of :func:`included`'s lines replaced by its file's text: what
    the preprocessor makes of it (for a compiler that is not NVRTC: the tests' ``g++``)."""
    return _INCLUDED.sub(lambda m: Path(m.group(1)).read_text(), text)


def replace_once(text: str, old: str, new: str) -> str:
    """``text`` with its one ``old`` replaced: for a kernel made by adapting another's
    text, an error where that text changed so that the place is gone or ambiguous."""
    if text.count(old) != 1:
        raise AssertionError(f"the kernel's text no longer has one {old!r}")
    return text.replace(old, new)


def launch_bounds(threads: int, blocks: int) -> str:
    """Header text (last in a kernel's header) that makes NVRTC fit the kernel MLX
    declares next to ``blocks`` blocks of ``threads`` an SM (``__launch_bounds__``:
    fewer registers a thread, spilling if it must); none where ``blocks`` is 0. MLX
    writes the ``__global__`` declaration itself, right after the header, so the text
    redefines ``__global__`` (NVRTC's own definition, then the bounds) for it; other
    compilers (the tests' ``g++``) skip it."""
    if not blocks:
        return ""
    return (
        "#ifdef __CUDACC_RTC__\n#undef __global__\n"
        f"#define __global__ __location__(global) __launch_bounds__({threads}, {blocks})\n#endif\n"
    )


def cuda_kernel(name: str, input_names: Sequence[str], output_names: Sequence[str], source: str, header: str) -> Any:
    """``mx.fast.cuda_kernel`` of the :func:`compact` text, named by :func:`kernel_name`,
    its header and body :func:`included` from files."""
    source, header = compact(source), compact(header)
    keep = [f"{n}_{w}" for n in input_names for w in ("shape", "strides", "ndim")]
    return mx.fast.cuda_kernel(
        name=kernel_name(name, source, header, input_names, output_names),
        input_names=list(input_names),
        output_names=list(output_names),
        source=included(source, keep),
        header=included(header),
    )
