"""``segc/engine/paging/runs.py``: the prefetch depth counts runs of one page's tickets
that read their page. Checked against a direct search over ``reclaim`` values on
random ticket sequences, and ``ahead`` against a walk written out here."""

from __future__ import annotations

from conftest import examples
from hypothesis import given, settings
from hypothesis import strategies as hs

from segc.engine.paging.runs import Runs


def _runs(pages: list[int]) -> list[list[int]]:
    """The tickets of each run: consecutive tickets of one page."""
    out: list[list[int]] = []
    for t, p in enumerate(pages):
        if out and pages[out[-1][-1]] == p:
            out[-1].append(t)
        else:
            out.append([t])
    return out


def _built(pages: list[int]) -> tuple[Runs, list[list[int]]]:
    """``Runs`` given the tickets of ``pages`` in order, and the runs written out here."""
    runs = Runs()
    for t, p in enumerate(pages):
        runs.add(t, p)
    return runs, _runs(pages)


@settings(max_examples=examples(200), deadline=None)
@given(
    pages=hs.lists(hs.integers(0, 4), min_size=1, max_size=30),
    reads=hs.lists(hs.booleans(), min_size=30, max_size=30),
    depth=hs.integers(0, 3),
    data=hs.data(),
)
def test_needs_is_the_smallest_reclaim_that_leaves_depth_read_runs_ahead(
    pages: list[int], reads: list[bool], depth: int, data: hs.DataObject
) -> None:
    runs, groups = _built(pages)
    for r, g in enumerate(groups):
        runs.reached(g[0], reads[r])
    t = data.draw(hs.integers(0, len(pages) - 1))
    done = data.draw(hs.integers(0, t))
    r = next(i for i, g in enumerate(groups) if t in g)

    def ahead_of(v: int) -> int:  # read runs before ``t``'s not complete once reclaim is v
        return sum(1 for q in range(r) if reads[q] and groups[q][-1] >= v)

    want = next(v for v in range(done, len(pages) + 1) if ahead_of(v) <= depth)
    got = runs.needs(t, depth, done)
    assert max(got, done) == want, (groups, reads[: len(groups)], t, depth, done, got)


@settings(max_examples=examples(200), deadline=None)
@given(
    pages=hs.lists(hs.integers(0, 4), min_size=1, max_size=30),
    held=hs.sets(hs.integers(0, 4)),
    depth=hs.integers(0, 3),
    data=hs.data(),
)
def test_ahead_reaches_the_depth_th_run_that_reads(
    pages: list[int], held: set[int], depth: int, data: hs.DataObject
) -> None:
    runs, groups = _built(pages)
    t = data.draw(hs.integers(0, len(pages) - 1))
    r = next(i for i, g in enumerate(groups) if t in g)
    reading = [q for q in range(r + 1, len(groups)) if pages[groups[q][0]] not in held]
    want = groups[reading[depth - 1]][-1] if depth and len(reading) >= depth else groups[-1][-1]
    if depth == 0:
        want = groups[r][-1]
    assert runs.ahead(t, depth, held.__contains__) == want
    assert runs.ahead(len(pages) + 5, depth, held.__contains__) == len(pages) + 5 + depth  # not requested
