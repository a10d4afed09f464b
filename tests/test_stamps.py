"""The write with its attention's stamped text (``segc.lower.cuda_stamps``): a diagnostic
that must change nothing but add its stamps. The stamps themselves need the GPU's clock
(``benchmarks/kvattn_stamps.py``); here, that the text is the kernel's with eleven stamps and two reads
at their places, each once, and nothing else, and that the setting is off by default."""

from __future__ import annotations

import pytest

from segc.errors import UsageError
from segc.lower import cuda_stamps
from segc.lower.cuda_attention import _PARTIAL, PACKED
from segc.lower.cuda_merge import FAST_TAIL

SOURCE = PACKED + _PARTIAL + FAST_TAIL


def test_the_stamps_are_the_only_change() -> None:
    text = cuda_stamps.stamped(SOURCE)
    lines = text.splitlines(keepends=True)
    stamps = [line for line in lines if "SEGC_STAMP(" in line]
    assert sorted(s.strip() for s in stamps) == sorted(f"SEGC_STAMP({i});" for i in range(11))
    # the SM's cycles counted from just before the first stamp (the stamp at the count
    # writes their difference)
    (clock,) = [i for i, line in enumerate(lines) if "segc_c0" in line]
    assert lines[clock].strip() == "const long long segc_c0 = clock64();" and "SEGC_STAMP(0);" in lines[clock + 1]
    added = ("SEGC_STAMP(", "SEGC_READ_", "segc_c0")
    rest = "".join(line for line in lines if not any(a in line for a in added))
    assert rest == SOURCE + "    __syncthreads();\n"  # the merge's end waits for its block


def test_each_point_follows_the_part_it_ends() -> None:
    """In the text's order: start, offset, query, mask, queries, staged, keys, softmax,
    values, count, merge; the offset's and the query element's reads between their
    stamps, the mask's loop before its own and the queries' after it."""
    text = cuda_stamps.stamped(SOURCE)
    at = [text.index(f"SEGC_STAMP({i});") for i in range(11)]
    assert at == sorted(at)
    assert len(cuda_stamps.POINTS) == 11 and cuda_stamps.POINTS[3] == "masked"
    assert at[0] < text.index("SEGC_READ_OFFSET") < at[1] < text.index("SEGC_READ_QUERY") < at[2]
    assert at[2] < text.index("mk[mr][j] =") < at[3] < text.index("qs[r][d] =") < at[4]
    assert at[4] < text.index("SEGC_VALUES") < at[5]
    assert at[5] < text.index("float acc[R];") < at[6]
    assert text.index("pl[row * S + s] = sum;") < at[7] < text.index("po[(row * S + s) * D + d] = acc;") < at[8]
    assert text.index("atomicAdd") < at[9] < text.index("if (!last) return;") < at[10]


def test_the_words_are_the_points_then_the_sm_then_its_cycles() -> None:
    """The header's indices are the names': the SM's word after the points, the cycles'
    after it, the cycles written at the count's stamp."""
    n = len(cuda_stamps.POINTS)
    got = {"sm": cuda_stamps.SM, "cycles": cuda_stamps.CYCLES, "words": cuda_stamps.WORDS}
    assert got == {"sm": n, "cycles": n + 1, "words": n + 2}
    h = cuda_stamps.HEADER
    assert "@" not in h and f"blk * {n + 2} + {n}] = segc_sm" in h
    assert f"if ((i) == {cuda_stamps.POINTS.index('counted')}) " in h and f"blk * {n + 2} + {n + 1}] = clock64()" in h


def test_a_changed_kernel_text_is_an_error() -> None:
    with pytest.raises(AssertionError, match="no longer has one"):
        cuda_stamps.stamped(SOURCE.replace("    const int n = min(CHUNK, C - start);\n", ""))


def test_off_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SEGC_KERNEL_STAMPS", raising=False)
    assert cuda_stamps.wanted() is False
    monkeypatch.setenv("SEGC_KERNEL_STAMPS", "1")
    assert cuda_stamps.wanted() is True
    assert cuda_stamps.reads_alone() is False
    monkeypatch.setenv("SEGC_KERNEL_STAMPS", "reads")
    assert cuda_stamps.wanted() is True and cuda_stamps.reads_alone() is True
    monkeypatch.setenv("SEGC_KERNEL_STAMPS", "yes")
    with pytest.raises(UsageError, match="SEGC_KERNEL_STAMPS must be 0 or 1 or reads, not 'yes'"):
        cuda_stamps.wanted()


def test_the_reads_alone_only_where_asked() -> None:
    """The lone reads distort the kernel (forty-sixth session): without ``reads`` their
    macros are empty, so the offset's and the query element's stamps follow the start's
    with nothing between; with it, each is a volatile read by the first thread."""
    quiet, loud = cuda_stamps.header(False), cuda_stamps.header(True)
    assert "#define SEGC_READ_OFFSET\n" in quiet and "#define SEGC_READ_QUERY\n" in quiet
    assert "volatile" not in quiet.split("#define SEGC_READ_OFFSET")[1]
    assert quiet.split("#define SEGC_READ_OFFSET")[0] == loud.split("#define SEGC_READ_OFFSET")[0]
    assert loud.count("const volatile") == 2
