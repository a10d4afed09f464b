"""The precompiled preamble ``make install`` puts beside MLX's CPU kernel header
(``tests/mlx_pch.py``): GCC takes a ``.gch`` without checking it against the header, so
one older than any header it was made from would compile kernels from old text."""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import pytest

INCLUDE = Path(mx.__file__).parent / "include"
GCH = INCLUDE / "mlx" / "backend" / "cpu" / "compiled_preamble.h.gch"


@pytest.mark.skipif(not GCH.exists(), reason="no precompiled preamble (tests/mlx_pch.py made none: no g++ here)")
def test_the_precompiled_preamble_is_newer_than_mlxs_headers() -> None:
    headers = list(INCLUDE.rglob("*.h"))  # the preamble includes more than backend/ (mlx/types/...)
    assert len(headers) > 10
    newer = [str(p) for p in headers if p.stat().st_mtime > GCH.stat().st_mtime]
    assert not newer, f"headers changed after {GCH} was made (run `python tests/mlx_pch.py`): {newer[:5]}"
