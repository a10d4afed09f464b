"""What a consuming executor call reports when an exception interrupts it."""

from __future__ import annotations

import mlx.core as mx


class Aborted(BaseException):
    """An exception that interrupted a consuming executor call (see ``Executor.__call__``),
    with what a caller needs to leave its state whole: ``outputs``, the graph's outputs when
    the executor could finish the call after the exception; otherwise ``inputs``
    (input index -> the inputs still unread) and ``partial`` (output index -> the outputs
    already computed)."""

    def __init__(
        self,
        cause: BaseException,
        *,
        outputs: list[mx.array] | None = None,
        inputs: dict[int, mx.array] | None = None,
        partial: dict[int, mx.array] | None = None,
    ):
        super().__init__(cause)
        self.cause = cause
        self.outputs = outputs
        self.inputs = inputs or {}
        self.partial = partial or {}
