"""Failing schedules the first soak of issue 26's merged worlds found (seeds 1,040,000
on, a004ff9), kept as strict xfails until each is judged and fixed (docs/simulation.md,
"Issue 26's worlds together"). Each is a replay of the whole world: ``python -m
simtools replay --seed N``."""

from __future__ import annotations

import pytest

from simtools import run_seed

FOUND = {
    1041056: (
        "I25_charged_before_budget",
        "the backlog and clocks worlds: an attempt charged for its stage budget before "
        "the budget ran on its worker's clock (a budget cut by a wall clock compared with "
        "SQS's first-receive timestamp is to be handed back uncharged)",
    ),
    1042203: ("I25_charged_before_budget", "as 1041056"),
    1043592: ("I25_charged_before_budget", "as 1041056, a message 4.6 days in a backlog"),
    1044867: ("I25_charged_before_budget", "as 1041056"),
    1040258: (
        "I24_live_owner_taken_over",
        "the plans world: a duplicate of a job its own worker holds taken over without "
        "the book's answer (or the checker's view of a live owner wrong): to judge",
    ),
}


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
