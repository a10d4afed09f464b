"""What keys a trace besides the arguments: each submodule's train/eval mode is part of
the signature (a model switched to train() traces again); a plain Python attribute is
not (taken as the trace found it, as ``mx.compile`` does, until ``clear_cache``)."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
from conftest import assert_same_bits, seeded

import segc


class Dropped(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.drop = nn.Dropout(0.5)
        self.scale = 1.0

    def __call__(self, x: mx.array) -> mx.array:
        return self.drop(self.lin(x)) * self.scale


def _run(f: object, x: mx.array, seed: int = 5) -> mx.array:
    mx.random.seed(seed)
    out = f(x)  # type: ignore[operator]
    mx.eval(out)
    return out


def test_train_and_eval_each_get_their_own_trace_with_eagers_bits() -> None:
    m = seeded(Dropped, 0)
    m.eval()
    step = segc.jit(m)
    x = mx.ones((4, 8))
    for mode in ("eval", "train", "eval", "train"):
        getattr(m, mode)()
        got, want = _run(step, x), _run(m, x)
        assert_same_bits([got], [want], mode)
    assert int((want == 0).sum()) > 0  # dropout did act in train mode
    info = step.cache_info()
    assert info.retraces == ["first call", "the module's train/eval mode changed: eval -> train"]
    assert info.hits == 2


def test_one_submodule_switched_is_seen() -> None:
    m = seeded(Dropped, 1)
    m.eval()
    step = segc.jit(m)
    x = mx.ones((2, 8))
    _run(step, x)
    m.drop.train()
    assert_same_bits([_run(step, x)], [_run(m, x)], "dropout alone in train mode")
    assert "submodules in train" in step.cache_info().retraces[-1]


def test_freeze_params_takes_the_mode_of_its_first_call() -> None:
    m = seeded(Dropped, 2)
    m.eval()
    step = segc.jit(m, freeze_params=True)
    x = mx.ones((2, 8))
    want_eval = _run(m, x)
    _run(step, x)
    m.train()
    assert_same_bits([_run(step, x)], [want_eval], "frozen: the first call's mode")
    step.clear_cache()
    assert_same_bits([_run(step, x)], [_run(m, x)], "after clear_cache: train mode")


def test_a_python_attribute_is_read_at_trace_time_until_clear_cache() -> None:
    m = seeded(Dropped, 3)
    m.eval()
    step = segc.jit(m)
    x = mx.ones((2, 8))
    before = _run(m, x)
    _run(step, x)
    m.scale = 3.0
    assert_same_bits([_run(step, x)], [before], "the attribute as traced")
    step.clear_cache()
    after = _run(m, x)
    assert_same_bits([_run(step, x)], [after], "traced again after clear_cache")
    assert not mx.array_equal(after, before).item()
