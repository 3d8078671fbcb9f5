"""Failing schedules the soaks of issue 26's merged worlds found (seeds 1,040,000 on,
a004ff9; the fresh range 1,100,000 on, acb3cec), kept as strict xfails until each is
judged and fixed (docs/simulation.md,
"Issue 26's worlds together"). Each is a replay of the whole world: ``python -m
simtools replay --seed N``."""

from __future__ import annotations

import pytest

from simtools import run_seed

FOUND: dict[int, tuple[str, str]] = {
    1469822: (
        "I10_stranded_record",
        "fresh-range soak on 7640942 (clocks world): worker w5, its wall clock 3.9 h "
        "ahead (offset +13,910 s), wrote job-000's slot wait (send id slotwait.2.3, "
        "unsent_since on its own wall) and died before the send (stage death). The "
        "stranded sweep asks the unsent index for entries older than the grace on the "
        "sweeper's wall: an entry stamped 3.9 h in the future is not returned until "
        "the sweepers' clocks pass it, so the job waits hours for its resend and the "
        "drain (3.6 h) ends first. Safety holds (a premature take is a conditional "
        "write; the loser sends nothing); the promise that no decision compares two "
        "machines' clocks does not. To fix in the core sweep: also take an entry a "
        "sweeper has itself seen unchanged for the grace on its own lease clock "
        "(as the duplicate rule watches a liveness counter), the wall rule kept for "
        "a sweeper with no memory (a Lambda sweep's new environment)",
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
