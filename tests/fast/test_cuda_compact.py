"""segc hands its CUDA kernels' text to MLX compacted (``segc.lower.cuda_kernel.compact``:
MLX hashes the whole text at every evaluation). Compaction must not change a token of
what NVRTC compiles, nor join a preprocessor directive to another line. Checked here
against an independent tokenizer (comments dropped by it, not by ``compact``) over every
kernel text segc has and over generated texts; ``tests/test_cuda_emulated.py`` runs the
compacted kernels on the CPU against eager MLX's bytes."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from segc.lower import cuda_attention, cuda_kvattention, cuda_kvwrite, cuda_products
from segc.lower.cuda_kernel import compact

pytestmark = pytest.mark.timeout(60)

# a C tokenizer just fine enough for kernel text: strings, comments, numbers, names, punctuation
_TOKEN = re.compile(r'"[^"\n]*"|//[^\n]*|/\*.*?\*/|\d[\w.]*|\w+|\S', re.S)


def tokens(text: str) -> list[str]:
    return [t for t in _TOKEN.findall(text) if not t.startswith(("//", "/*"))]


def directives(text: str) -> list[str]:
    """Each preprocessor line's tokens: a directive ends at its line's end."""
    return [" ".join(tokens(line)) for line in text.splitlines() if line.strip().startswith("#")]


def kernel_texts() -> list[str]:
    mods = (cuda_attention, cuda_kvattention, cuda_kvwrite, cuda_products)
    texts = [v for m in mods for k, v in vars(m).items() if k.isupper() or (k.startswith("_") and k[1:].isupper())]
    return [t for t in texts if isinstance(t, str) and len(t) > 200]


def test_every_kernel_text_keeps_its_tokens_and_directives() -> None:
    texts = kernel_texts()
    assert len(texts) >= 8  # the headers and bodies of the four kernel modules
    for text in texts:
        small = compact(text)
        assert tokens(small) == tokens(text)
        assert directives(small) == directives(text)
        assert "//" not in small or '"' in small  # comments go unless a line holds a string
        assert len(small) < len(text)


def test_a_worked_example() -> None:
    text = '#include "a/b.cuh"  // keep the path\n\n    int x =  1;   // one\n  #pragma unroll 8\n\tfor (;;) {}\n'
    assert compact(text) == '#include "a/b.cuh"  // keep the path\nint x = 1;\n#pragma unroll 8\nfor (;;) {}\n'
    assert compact("  // only a comment\n\n") == ""


_WORDS = st.sampled_from(["int", "x", "y1", "0.5f", "+=", "(", ")", "{", "}", ";", "<<", "static_cast<float>", "a[i]"])
_LINE = st.one_of(
    st.lists(_WORDS, max_size=6).map(" ".join),
    st.builds(lambda w, c: f"{w} // {c}", st.lists(_WORDS, max_size=4).map(" ".join), st.text("ab c'd", max_size=8)),
    st.builds(lambda n, v: f"#define {n} {v}", st.sampled_from(["N", "K2"]), st.sampled_from(["4", "(a + b)"])),
    st.just(""),
)


@settings(max_examples=200, deadline=None)
@given(lines=st.lists(st.tuples(st.sampled_from(["", "  ", "\t", "    "]), _LINE), max_size=12))
def test_generated_texts_keep_their_tokens(lines: list[tuple[str, str]]) -> None:
    text = "\n".join(indent + line for indent, line in lines)
    small = compact(text)
    assert tokens(small) == tokens(text)
    assert directives(small) == directives(text)
    assert all(line == line.strip() and line for line in small.splitlines())
