"""Known primitives that segc does not lower, each with the reason
:class:`segc.UnsupportedPrimitive` gives."""

from __future__ import annotations

from typing import Any

from .prim import Prim, define, matmul_flops, no_flops

_NO_STATE = "MLX cannot export it (no state)"

_REASONS: dict[str, tuple[str, dict[str, Any]]] = {
    "BlockMaskedMM": (
        "its state (block size) does not say which of its optional mask inputs are present",
        {"flops": matmul_flops},
    ),
    "Contiguous": (_NO_STATE, {"memory": "move", "flops": no_flops}),
    "BitwiseInvert": (_NO_STATE, {"fusible": True}),
    "CumLogAddExp": ("MLX cannot export it (mx.logcumsumexp)", {}),
    "CustomTransforms": ("MLX cannot export it", {}),
    "Load": ("an unevaluated lazy array from mx.load: evaluate the weights before tracing", {}),
    "QQMatmul": ("MLX cannot export it", {"flops": matmul_flops}),
    "GatherQQMM": ("MLX cannot export it", {"flops": matmul_flops}),
    "SegmentedMM": ("MLX cannot export it", {"flops": matmul_flops}),
    "LUF": ("MLX cannot export it", {}),
    "BroadcastAxes": (
        "no Python op builds it; it appears only inside MLX's own shapeless compile",
        {"memory": "view", "flops": no_flops},
    ),
}

for _name, (_why, _facts) in _REASONS.items():
    define(Prim(_name, unsupported=_why, **_facts))
