"""``segc generate`` and the generation engine: tokens identical to eager mlx-lm."""

from __future__ import annotations

import json

import mlx.core as mx
import pytest
from conftest import same_bits
from mlx.utils import tree_flatten

pytest.importorskip("mlx_lm", reason="the mlx-lm models need the lm extra (pip install segc[lm])")

from segc.cli import main
from segc.engine import FAST_OPTIONS, GenerationStats, generate_tokens, load_local_model
from segc.errors import SegcError
from segc.models.zoo import build, tiny_config


def test_engine_tokens_identical_and_few_traces() -> None:
    model = build("llama")
    eager = list(generate_tokens(model, [1, 2, 3, 4, 5], 64, use_segc=False))
    stats = GenerationStats()
    ours = list(generate_tokens(model, [1, 2, 3, 4, 5], 64, stats=stats))
    assert ours == eager
    # the prompt chunk, and one decode graph (prompt ids are uint32, like argmax's)
    assert stats.traces == 2, stats.jitted.cache_info().retraces


def test_engine_fast_options_tokens_identical() -> None:
    """``FAST_OPTIONS`` (one segment, concatenated, frozen, in place): eager's tokens,
    eager run first on the untouched module, one segment, a prompt and a decode trace."""
    model = build("llama", seed=5)
    eager = list(generate_tokens(model, [3, 1, 4, 1, 5], 40, use_segc=False))
    stats = GenerationStats()
    ours = list(generate_tokens(model, [3, 1, 4, 1, 5], 40, stats=stats, **FAST_OPTIONS))
    assert ours == eager
    assert stats.traces == 2, stats.jitted.cache_info().retraces
    assert len(stats.jitted.entries()[-1].segments) == 1


def test_generate_cli_fast(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["generate", "--arch", "llama", "--max-tokens", "12", "--fast", "--compare", "--quiet"]) == 0
    assert "eager mlx-lm tokens identical: True" in capsys.readouterr().out


def test_generate_cli_tiny(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["generate", "--arch", "qwen2", "--max-tokens", "12", "--compare"]) == 0
    out = capsys.readouterr().out
    assert "eager mlx-lm tokens identical: True" in out
    assert "traces" in out


def test_generate_cli_local_directory(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    model = build("llama", seed=3)
    (tmp_path / "config.json").write_text(json.dumps(tiny_config("llama")))
    mx.save_safetensors(str(tmp_path / "model.safetensors"), dict(tree_flatten(model.parameters())))
    loaded, tokenizer = load_local_model(tmp_path)
    assert tokenizer is None
    for (k, a), (_, b) in zip(tree_flatten(model.parameters()), tree_flatten(loaded.parameters())):
        assert same_bits(a, b), k
    rc = main(["generate", "--model", str(tmp_path), "--prompt-tokens", "5,6,7", "--max-tokens", "8", "--compare"])
    assert rc == 0
    assert "eager mlx-lm tokens identical: True" in capsys.readouterr().out


def test_generate_errors(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SegcError, match=r"config\.json"):
        load_local_model(tmp_path)
    assert main(["generate", "--model", str(tmp_path)]) == 2
    assert main(["generate", "--prompt", "hello"]) == 2
    assert "tokenizer" in capsys.readouterr().err
    with pytest.raises(SegcError, match="empty"):
        list(generate_tokens(build("llama"), [], 4))
