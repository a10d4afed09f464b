"""The `segc demo` and `segc ir` subcommands, run in-process."""

from __future__ import annotations

import pytest

pytest.importorskip("mlx_lm")

import segc
from segc.cli import main


@pytest.mark.slow
def test_demo_reports_bit_identical_prefill_and_decode(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["demo", "--layers", "2", "--hidden", "64", "--tokens", "8", "--repeats", "1", "--decode", "3"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "3 segments (boundary after every layers.*)" in out
    assert "segmented output bit-identical to eager mlx-lm: True" in out
    assert "logits and KV caches bit-identical to eager mlx-lm: True" in out


def test_ir_prints_text_that_parses_back(capsys: pytest.CaptureFixture[str], tmp_path) -> None:  # type: ignore[no-untyped-def]
    assert main(["ir", "--layers", "2", "--tokens", "4"]) == 0
    text = capsys.readouterr().out
    g = segc.parse(text)
    assert [s.name for s in segc.segments(g)] == ["model.layers.0", "model.layers.1", "tail"]
    path = tmp_path / "g.segc"
    path.write_text(text)
    assert main(["ir", "--check", str(path)]) == 0
    assert segc.parse(capsys.readouterr().out) == g
