"""Runs of tickets: consecutive tickets of one page (a banded prefill's chunks of one
band; a decode's runs are single tickets). The prefetch depth counts the runs that
*read* their page, not tickets (the pager, ``pager.py``):

- with ``depth=1`` the next band's page is read while every chunk of the running band
  computes, not only its last;
- runs of pages already held read nothing and hold no extra room, so they do not count:
  a decode whose budget keeps half the layers resident reads the first page after them
  while the resident ones compute, not once the band before it has completed.

At most ``depth + 1`` read runs are incomplete at once (the running one and ``depth``
read ahead), as when every run reads.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence


class Runs:
    def __init__(self) -> None:
        self.of: dict[int, int] = {}  # ticket -> its run
        self.last: list[int] = []  # per run, its last ticket
        self.page: list[int] = []  # per run, its page
        self.reads: dict[int, bool] = {}  # per run the pager has reached: whether it read its page

    def add(self, ticket: int, page: int) -> None:
        """Ticket ``ticket`` (the next one) of page ``page``."""
        if not self.page or page != self.page[-1]:
            self.last.append(ticket)
            self.page.append(page)
        self.of[ticket] = len(self.last) - 1
        self.last[-1] = ticket

    def reached(self, ticket: int, reads: bool) -> None:
        """The pager has reached ``ticket``: whether it reads the page (its run's first)."""
        self.reads.setdefault(self.of[ticket], reads)

    def needs(self, ticket: int, depth: int, done: int) -> int:
        """The ``reclaim`` value before which ``ticket``'s page may not be read (0: none):
        the ``depth + 1``-th read run before its run must be complete first. ``done``:
        ``reclaim`` now (the runs it covers are complete: the walk stops there)."""
        count = 0
        q = self.of[ticket] - 1
        while q >= 0 and self.last[q] >= done:
            if self.reads.get(q, True):
                count += 1
                if count == depth + 1:
                    return self.last[q] + 1
            q -= 1
        return 0

    def ahead(self, ticket: int, depth: int, held: Callable[[int], bool]) -> int:
        """The last ticket of the ``depth``-th run after ``ticket``'s whose page is not
        ``held`` (among those requested; ``ticket + depth`` past them): the tickets whose
        pages are read ahead, and given room or buffers now."""
        r = self.of.get(ticket)
        if r is None:
            return ticket + depth
        q, count = r, 0
        while count < depth and q + 1 < len(self.last):
            q += 1
            count += self.reads.get(q, not held(self.page[q]))  # reached: whether it read
        return self.last[q]


def spread_ranks(pages: Sequence[int]) -> dict[int, int]:
    """Each page's rank for ``evict="spread"`` (0 kept first): the call's pages in the
    order of their first tickets, ranked by the bit-reversed place (0, 8, 4, 12, 2, ... of
    16), so the pages a cyclic decode keeps, however many, are the first one and others
    spread evenly over the call: while a kept band computes, the medium reads the next
    page (kept in a block, the medium read two pages and then idled until the block had
    computed; ``benchmarks/paging_timeline.py``)."""
    first: dict[int, int] = {}
    for p in pages:
        first.setdefault(p, len(first))
    bits = max(1, (len(first) - 1).bit_length())
    order = sorted(first.values(), key=lambda j: int(format(j, f"0{bits}b")[::-1], 2))
    rank = {j: r for r, j in enumerate(order)}
    return {p: rank[j] for p, j in first.items()}
