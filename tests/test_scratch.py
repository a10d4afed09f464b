"""``segc.lower.scratch``: the counting kernels' zeroed memory is fresh at every call of a
compiled function (a constant made at trace time is one buffer for every call, which
calls evaluated together shared on the GPU: ``tests/test_attention_cuda.py``), and a
call's requests are disjoint slices of its bank, each on a 128-byte line of its own. The
kernels themselves need CUDA; what they are handed is checked here on any device."""

from __future__ import annotations

import itertools

import mlx.core as mx
import numpy as np
import pytest
from conftest import examples
from hypothesis import given, settings
from hypothesis import strategies as hst

from segc.lower import scratch

pytestmark = pytest.mark.timeout(120)


def _ptr(x: mx.array) -> int:
    mx.eval(x)
    return int(np.asarray(memoryview(x)).__array_interface__["data"][0])


def _check_zeros(x: mx.array, words: int) -> None:
    assert x.shape == (words,) and x.dtype == mx.uint32
    assert not np.array(x).any()


def test_a_constant_is_one_buffer_for_every_call() -> None:
    """The check can fail: what the kernels were handed before, a constant, is."""
    k = mx.array(np.zeros(5, dtype=np.uint32))
    f = mx.compile(lambda x: [k])
    a, b = f(mx.array(1)), f(mx.array(2))
    assert _ptr(a[0]) == _ptr(b[0])


def test_outside_a_call_each_request_is_fresh_at_each_call() -> None:
    f = mx.compile(lambda x: [scratch.zeros(5), scratch.zeros(5)])
    a, b = f(mx.array(1)), f(mx.array(2))
    for x in (*a, *b):
        _check_zeros(x, 5)
    ptrs = {_ptr(x) for x in (*a, *b)}
    assert len(ptrs) == 4, "two requests of one call, or two calls, share memory"


@settings(max_examples=examples(25), deadline=None)
@given(sizes=hst.lists(hst.integers(1, 3000), min_size=1, max_size=8))
def test_a_calls_requests_are_disjoint_and_fresh_at_each_call(sizes) -> None:
    def body(x: mx.array) -> list[mx.array]:
        with scratch.per_call():
            return [scratch.zeros(n) for n in sizes]

    f = mx.compile(body)
    calls = [f(mx.array(1)), f(mx.array(2))]
    spans = []
    for outs in calls:
        for x, n in zip(outs, sizes, strict=True):
            _check_zeros(x, n)
            p = _ptr(x)
            spans.append((p, p + 4 * n))
    spans.sort()
    for (_, end), (start, _) in itertools.pairwise(spans):
        assert end <= start, "two requests overlap (within a call or across the calls)"


def test_requests_of_one_bank_start_lines_of_their_own() -> None:
    sizes = [1, 31, 32, 33, 5, 64]  # 7 lines of 32 words: one bank
    with scratch.per_call():
        ptrs = [_ptr(scratch.zeros(n)) for n in sizes]
    lines = [-(-n // scratch.ALIGN) for n in sizes]
    assert [p - ptrs[0] for p in ptrs] == [4 * scratch.ALIGN * sum(lines[:i]) for i in range(len(sizes))]


def test_per_call_scopes_nest_and_end() -> None:
    """Each scope hands out its own banks; outside any, requests are fresh arrays."""
    with scratch.per_call():
        a = scratch.zeros(4)
        with scratch.per_call():
            b = scratch.zeros(4)
        c = scratch.zeros(4)
    d = scratch.zeros(4)
    pa, pb, pc, pd = (_ptr(x) for x in (a, b, c, d))
    assert len({pa, pb, pc, pd}) == 4
    assert pc - pa == 4 * scratch.ALIGN, "the outer scope's bank was not resumed"
