"""docs/settings.md lists exactly the environment variables segc reads, and a bad value
of a kernel's on/off variable is refused by name on any device.

The variables read are found in segc's source: a string ``"SEGC_..."`` handed to
``os.environ.get``, ``os.getenv``, ``env_choice``, ``env_count`` or ``env_counts``, and the names handed to
``products.cuda_wanted`` (which reads ``SEGC_<name>``)."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import assert_env_setting

ROOT = Path(__file__).resolve().parents[1]
READ = re.compile(r'(?:environ\.get|getenv|env_choice|env_counts?)\(\s*"(SEGC_[A-Z0-9_]+)"')
WANTED = re.compile(r'cuda_wanted\([^()]*(?:\([^()]*\))?[^()]*"([A-Z0-9_]+)"\)')
LISTED = re.compile(r"^\| `(SEGC_[A-Z0-9_]+)` \|", re.M)


def _read_by_segc() -> set[str]:
    names: set[str] = set()
    for path in (ROOT / "segc").rglob("*.py"):
        text = path.read_text()
        names.update(READ.findall(text))
        names.update(f"SEGC_{n}" for n in WANTED.findall(text))
    return names


def test_the_page_lists_every_variable_segc_reads_and_no_other() -> None:
    read = _read_by_segc()
    listed = set(LISTED.findall((ROOT / "docs" / "settings.md").read_text()))
    # the finder itself must see the variables it is meant to see (one of each way in)
    assert {
        "SEGC_KV_IN_PLACE",
        "SEGC_DUMP_IR",
        "SEGC_FUSED_PRODUCTS",
        "SEGC_DENSE_EXPERTS",
        "SEGC_LIVE_COMMITS",
    } <= read, read
    assert read - listed == set(), f"read by segc, missing from docs/settings.md: {sorted(read - listed)}"
    assert listed - read == set(), f"in docs/settings.md, read nowhere in segc: {sorted(listed - read)}"


def _fused_products() -> Any:
    from segc.lower import products

    return products.cuda_wanted("auto", "FUSED_PRODUCTS")


def _fused_attention() -> Any:
    from segc.lower.attention import attention_kernel

    return attention_kernel("auto")


@pytest.mark.parametrize(
    ("variable", "read"),
    [("SEGC_FUSED_PRODUCTS", _fused_products), ("SEGC_FUSED_ATTENTION", _fused_attention)],
)
def test_a_kernels_variable_refuses_a_value_it_does_not_know(
    monkeypatch: pytest.MonkeyPatch, variable: str, read: Callable[[], Any]
) -> None:
    """Before, any value but ``0`` silently meant on; now ``yes`` is a ``UsageError``
    naming the variable, here on the CPU too (where ``0`` and ``1`` both give none)."""
    assert_env_setting(monkeypatch, variable, "yes", read, None)
    monkeypatch.setenv(variable, "0")
    assert not read()
