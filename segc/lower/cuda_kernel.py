"""``mx.fast.cuda_kernel`` with the kernel's text in its name.

MLX 0.32's CUDA build keeps every compiled kernel on disk, in
``$TMPDIR/mlx/<version>/ptx/`` (or ``MLX_PTX_CACHE_DIR``), under the kernel's name and
template arguments only (``mlx/backend/cuda/jit_module.cpp``), and loads it from there in
any later process. A segc kernel whose source changed (a new segc on the same machine,
or a test re-run after an edit) but whose name did not would silently run the old
binary. So every segc kernel is made here, its name followed by a hash of what MLX
compiles from: the header, the source, the input and output names.

MLX also hashes a custom kernel's whole text (header and source) at *every* evaluation
(``CustomKernel::eval_gpu``, its module's name): with segc's 4.5-11 KB kernels, 83 of
them a decode step, a profile on an H200 put ``std::_Hash_bytes`` at 4-5% of the step's
host time, about 0.11 ms a call (docs/performance.md, the twentieth session). So the
text is handed to MLX compacted (:func:`compact`: no comments, no indentation, no blank
lines), which changes no token of what NVRTC compiles.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from typing import Any

import mlx.core as mx

_SPACES = re.compile(r"[ \t]+")


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


def cuda_kernel(name: str, input_names: Sequence[str], output_names: Sequence[str], source: str, header: str) -> Any:
    """``mx.fast.cuda_kernel`` of the :func:`compact` text, named by :func:`kernel_name`."""
    source, header = compact(source), compact(header)
    return mx.fast.cuda_kernel(
        name=kernel_name(name, source, header, input_names, output_names),
        input_names=list(input_names),
        output_names=list(output_names),
        source=source,
        header=header,
    )
