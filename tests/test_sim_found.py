"""Failing schedules the soaks of issue 26's merged worlds found (seeds 1,040,000 on,
a004ff9; the fresh range 1,100,000 on, acb3cec), kept as strict xfails until each is
judged and fixed (docs/simulation.md,
"Issue 26's worlds together"). Each is a replay of the whole world: ``python -m
simtools replay --seed N``."""

from __future__ import annotations

import json

import pytest

from simtools import run_seed

FOUND: dict[int, tuple[str, str]] = {}
"""Seed: (the invariant it breaks, the diagnosis so far)."""

SLOW: set[int] = set()  # seeds whose drain takes minutes of run time (make test-long)


@pytest.mark.parametrize(
    "seed",
    [
        pytest.param(
            seed,
            marks=[
                pytest.mark.xfail(strict=True, reason=f"{violation}: {why}"),
                *([pytest.mark.long, pytest.mark.timeout(3600)] if seed in SLOW else []),
            ],
        )
        for seed, (violation, why) in sorted(FOUND.items())
    ],
)
def test_found_by_the_merged_worlds_soak(seed: int) -> None:
    # Fails today with FOUND[seed]'s violation; once fixed it passes, and the strict
    # xfail turns red: move the seed to a regression test with its verdict.
    result = run_seed(seed)
    assert result.ok, result.violations[0].message


# Soak seeds whose regression tests are strict xfails while their schedules moved
# (tests/sim_repin.py), or whose case a directed world now draws instead (1040258,
# 1045173, 1105530: tests/test_sim_directed.py), and 1582660 (the simulator's own
# error, its worker sweep without the DLQ receive: fixed, and its schedule moved with
# the fix): the case is no longer drawn there, but the real protocol must still pass
# each, in the soak's world.
REPINNED_SOAK_SEEDS = (1040258, 1041578, 1045173, 1105530, 1113879, 1469822, 1582660)


@pytest.mark.parametrize("seed", REPINNED_SOAK_SEEDS)
def test_the_soak_seeds_being_re_pinned_still_pass_the_protocol(seed: int) -> None:
    result = run_seed(seed)
    assert result.ok, result.violations[0].message


FIXED: dict[int, tuple[str, str, str, str]] = {
    1808311: (
        "intent_confirmed",
        '"late": "ambiguous"',
        "late_outcome_dropped",
        "fresh range 1,735,000 on 209c99a, I2: fn1's call for an unkeyed capture, "
        "paused 137 s after its intent start, applied after w2 had parked the job "
        "ambiguous and after the operator judged 'not applied'; its confirm was refused "
        "and the outcome dropped, so the operator's retry paid again. Fixed: a late "
        "answer confirms an intent parked ambiguous or reopened by a retry at its own "
        "attempt (`late`), and the resolve run again resumes the job, which replays it "
        "(directed worlds in tests/test_sim_uncaught.py)",
    ),
    1862836: (
        "job_waiting_for_slot",
        "moved on while it took its slots",
        "slot_claim_unconfirmed",
        "fresh range 1,835,000 on f6160bc, P1: job-009's claim (token 11) took 16 s to "
        "take its slots (throttled and unanswered reads); meanwhile a duplicate of its "
        "slot-wait message (a SendMessage retried after a lost answer) was claimed by "
        "w2 (token 12), because the first claim's job was in no lease book yet, so no "
        "liveness listed it. The first claim then took a tenant slot, stale at once "
        "(rule 1), and started its handler: a third job of a tenant limited to two. "
        "Fixed: rule 7, a claim is confirmed after its slots are taken",
    ),
}
"""Soak seeds found failing and fixed: (the event that shows their case is still
drawn, a text its data must hold, the mutation that breaks the seed again, the
verdict). Should a schedule move so the case is no longer drawn, the test says so:
the seed then joins REPINNED_SOAK_SEEDS, and its directed world or mutation stays."""


@pytest.mark.parametrize("seed", sorted(FIXED))
def test_the_fixed_soak_seeds_pass_and_still_draw_their_case(seed: int) -> None:
    event, marker, _, _ = FIXED[seed]
    result = run_seed(seed, trace=True)
    assert result.ok, result.violations[0].message
    drawn = [d for _, _, kind, d in result.log if kind == event and marker in json.dumps(d)]
    assert drawn, f"seed {seed} no longer draws its case ({event}: {marker}): re-pin it"


@pytest.mark.parametrize("seed", sorted(FIXED))
def test_the_fixed_soak_seeds_fail_again_with_the_rule_broken(seed: int) -> None:
    _, _, mutation, _ = FIXED[seed]
    result = run_seed(seed, mutation=mutation)
    assert not result.ok, f"seed {seed} passes under {mutation}: it no longer checks the rule"
