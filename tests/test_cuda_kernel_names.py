"""segc's CUDA kernels are named after their text (``segc/lower/cuda_kernel.py``): MLX
0.32 keeps compiled kernels on disk under their names alone, so a kernel whose text
changed under an old name would run the old binary in a later process. Checked without
a GPU: the kernel makers are called with ``mx.fast.cuda_kernel`` replaced by a recorder."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from cuda_emu import kernel_makers

from segc.lower import cuda_attention, cuda_kernel, cuda_kvattention, cuda_kvwrite, cuda_products
from segc.lower.cuda_kernel import expand, kernel_name

pytestmark = pytest.mark.timeout(60)
ROOT = Path(__file__).resolve().parent.parent


def test_the_name_follows_every_part_of_the_text() -> None:
    base = ("k", "o[0] = a[0];", "#define X 1\n", ["a"], ["o"])
    name = kernel_name(*base)
    assert re.fullmatch(r"k_[0-9a-f]{10}", name)
    assert kernel_name(*base) == name  # the same text: the same name, in any process
    for i, other in ((1, "o[0] = a[0] + 1;"), (2, "#define X 2\n"), (3, ["b"]), (4, ["p"])):
        changed = list(base)
        changed[i] = other
        assert kernel_name(*changed) != name, f"part {i} of the text is not in the name"


def test_mx_fast_cuda_kernel_is_called_in_one_place() -> None:
    callers = [
        p.relative_to(ROOT).as_posix() for p in (ROOT / "segc").rglob("*.py") if "mx.fast.cuda_kernel(" in p.read_text()
    ]
    assert callers == ["segc/lower/cuda_kernel.py"]


def test_every_kernel_maker_names_its_kernel_by_its_text(monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[dict[str, Any]] = []

    def record(**kw: Any) -> object:
        made.append(kw)
        return object()

    monkeypatch.setattr(cuda_kernel.mx.fast, "cuda_kernel", record)
    makers = [
        lambda: cuda_attention._kernels(0x3E000000),
        lambda: cuda_attention._one_kernel(0x3E000000),
        lambda: cuda_kvwrite._kernel(True, False, 0x41549A78, 0x3F800000),
        lambda: cuda_products._kernel("glu", 0x3727C5AC),
        lambda: cuda_products._kernel("add", None, quant=True),
        lambda: cuda_kvattention._kernel(True, 0x41549A78, 0x3F800000, 0x3E000000),
    ]
    for f in kernel_makers():  # the makers are functools.cache'd: make them again
        f.cache_clear()
    try:
        for make in makers:
            make()
    finally:
        for f in kernel_makers():
            f.cache_clear()  # no recorder's objects left in the caches
    assert len(made) == 7  # the attention's two kernels and its one, a write, two products, both
    # every module that makes kernels (calls cuda_kernel) has its maker here (and in the
    # emulator's list); one that takes only a text helper from cuda_kernel.py makes none
    making = {
        f"segc.lower.{p.stem}"
        for p in (ROOT / "segc" / "lower").glob("*.py")
        if "from .cuda_kernel import" in (text := p.read_text()) and "cuda_kernel(" in text
    }
    assert {m.__module__ for m in kernel_makers()} == making
    for kw in made:
        want = kernel_name(
            kw["name"].rsplit("_", 1)[0],
            expand(kw["source"]),
            expand(kw["header"]),
            kw["input_names"],
            kw["output_names"],
        )
        assert kw["name"] == want
    assert len({kw["name"] for kw in made}) == len(made)
