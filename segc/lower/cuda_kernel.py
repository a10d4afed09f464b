"""``mx.fast.cuda_kernel`` with the kernel's text in its name.

MLX 0.32's CUDA build keeps every compiled kernel on disk, in
``$TMPDIR/mlx/<version>/ptx/`` (or ``MLX_PTX_CACHE_DIR``), under the kernel's name and
template arguments only (``mlx/backend/cuda/jit_module.cpp``), and loads it from there in
any later process. A segc kernel whose source changed (a new segc on the same machine,
or a test re-run after an edit) but whose name did not would silently run the old
binary. So every segc kernel is made here, its name followed by a hash of what MLX
compiles from: the header, the source, the input and output names.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import mlx.core as mx


def kernel_name(name: str, source: str, header: str, inputs: Sequence[str], outputs: Sequence[str]) -> str:
    """``name`` and a hash of the kernel's text (module docstring)."""
    text = "\0".join([header, source, ",".join(inputs), ",".join(outputs)])
    return f"{name}_{hashlib.sha1(text.encode()).hexdigest()[:10]}"


def cuda_kernel(name: str, input_names: Sequence[str], output_names: Sequence[str], source: str, header: str) -> Any:
    """``mx.fast.cuda_kernel`` named by :func:`kernel_name`."""
    return mx.fast.cuda_kernel(
        name=kernel_name(name, source, header, input_names, output_names),
        input_names=list(input_names),
        output_names=list(output_names),
        source=source,
        header=header,
    )
