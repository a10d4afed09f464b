"""Which backend MLX runs on: the one question several layers ask.

Below every other module (``tests/test_layout.py`` ranks it under layer 0) because the
layer-0 byte conversions in ``segc.dtypes`` ask it too: on MLX's CUDA build a host read
moves a buffer into managed memory, so reads there take another path.
"""

from __future__ import annotations

import mlx.core as mx


def on_cuda() -> bool:
    """Whether the default device is a GPU of MLX's CUDA build (not Metal, not the CPU).

    ``False`` on an MLX without the ``mx.cuda`` module rather than an ``AttributeError``.
    """
    cuda = getattr(mx, "cuda", None)
    return mx.default_device().type == mx.DeviceType.gpu and cuda is not None and bool(cuda.is_available())
