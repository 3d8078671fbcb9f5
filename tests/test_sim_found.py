"""Failing schedules the soaks of issue 26's merged worlds found (seeds 1,040,000 on,
a004ff9; the fresh range 1,100,000 on, acb3cec), kept as strict xfails until each is
judged and fixed (docs/simulation.md,
"Issue 26's worlds together"). Each is a replay of the whole world: ``python -m
simtools replay --seed N``."""

from __future__ import annotations

import pytest

from simtools import run_seed

FOUND: dict[int, tuple[str, str]] = {}
"""Seed: (the invariant it breaks, the diagnosis so far). Empty: every seed the soaks
found is judged and fixed, and pinned by a regression test where its fix lives."""


@pytest.mark.parametrize(
    "seed",
    [
        pytest.param(seed, marks=pytest.mark.xfail(strict=True, reason=f"{violation}: {why}"))
        for seed, (violation, why) in sorted(FOUND.items())
    ],
)
def test_found_by_the_merged_worlds_soak(seed: int) -> None:
    # Fails today with FOUND[seed]'s violation; once fixed it passes, and the strict
    # xfail turns red: move the seed to a regression test with its verdict.
    result = run_seed(seed)
    assert result.ok, result.violations[0].message
