"""Mutation tables whose soak-found pins are being searched again: one list, one reason.

A mutation caught only at a seed a soak found is a strict xfail here while its schedule
moved and a wider search looks for its next catch (then its pin changes and it leaves
``REPINNING``)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pytest

REPIN = (
    "its soak-found schedule moved with the sweep's look at entries stamped ahead "
    "(soak seed 1469822); a wider search for its next catch is running"
)
REPINNING = frozenset({"retention_on_wall", "resume_under_count"})


def pinned(names: Iterable[str]) -> list[Any]:
    """``names`` as pytest parameters, the ones being re-pinned as strict xfails."""
    mark = pytest.mark.xfail(strict=True, reason=REPIN)
    return [pytest.param(n, marks=mark) if n in REPINNING else n for n in sorted(names)]
