"""The async worker's loop watch in the core (issue 28): when a step's stall is judged,
when ``loop_blocked`` is told and what it and ``loop_unblocked`` say, from the shell's
clock readings (no clock, no thread, no loop)."""

from __future__ import annotations

import pytest
from core_harness import local_lease

from sqs_lease._core.loopwatch import (
    WATCH_PERIOD_FLOOR,
    LoopStep,
    loop_blocked_event,
    watch_period,
)
from sqs_lease._core.timing import judge_stall

TOLERATED = 1.0


@pytest.mark.parametrize(
    ("tolerated", "period"), [(1.0, 0.5), (0.25, 0.125), (0.08, WATCH_PERIOD_FLOOR)]
)
def test_the_watch_looks_twice_per_tolerated_lag_never_more_often_than_its_floor(
    tolerated: float, period: float
) -> None:
    assert watch_period(tolerated) == period


def test_a_step_within_the_tolerated_lag_is_neither_told_nor_judged() -> None:
    step = LoopStep("a", 100.0, TOLERATED)
    assert step.watched(100.5) is None
    assert step.watched(101.0) is None  # exactly the tolerated lag: tolerated
    assert not step.overran(101.0)
    assert not step.judged and not step.reported


def test_a_step_past_the_tolerated_lag_is_judged_once() -> None:
    step = LoopStep("a", 100.0, TOLERATED)
    assert step.overran(101.5)
    assert step.judged
    assert not step.overran(102.0)  # its end after a check within it: judged already


def test_the_watch_tells_a_step_still_holding_the_loop_once() -> None:
    step = LoopStep("a", 100.0, TOLERATED)
    assert step.watched(101.25) == 1.25
    assert step.watched(103.0) is None  # told already
    ev = loop_blocked_event("a", 7, 1.25049, TOLERATED, 3)
    assert (ev.event, ev.fields) == (
        "loop_blocked",
        {"job_id": "a", "token": 7, "blocked_for": 1.25, "tolerated": 1.0, "held": 3},
    )


def test_a_stall_too_short_for_the_watch_is_told_blocked_then_unblocked_at_its_judgement() -> None:
    step = LoopStep("a", 1000.0, TOLERATED)
    assert step.overran(1001.2)
    stall = judge_stall(
        [lease := local_lease("a", token=7)],
        blocker=lease,
        blocker_job="a",
        began=1000.0,
        ended=1001.2,
        tolerated=TOLERATED,
    )
    told = step.unblocked(stall, held=2)
    assert [e.event for e in told] == ["loop_blocked", "loop_unblocked"]
    assert told[0].fields == {
        "job_id": "a",
        "token": 7,
        "blocked_for": 1.2,
        "tolerated": 1.0,
        "held": 2,
    }
    assert told[1].fields == stall.event
    assert step.watched(1005.0) is None  # the watch thread says nothing more


def test_a_stall_the_watch_told_while_it_lasted_is_only_told_unblocked() -> None:
    step = LoopStep("a", 1000.0, TOLERATED)
    assert step.watched(1001.5) == 1.5
    assert step.overran(1003.0)
    lease = local_lease("a", token=7)
    stall = judge_stall(
        [lease], blocker=lease, blocker_job="a", began=1000.0, ended=1003.0, tolerated=TOLERATED
    )
    told = step.unblocked(stall, held=1)
    assert [e.event for e in told] == ["loop_unblocked"]
    assert told[0].fields["blocked_for"] == 3.0 and told[0].fields["blocker_dropped"] is True


def test_a_stall_by_no_job_names_no_token() -> None:
    step = LoopStep(None, 1000.0, TOLERATED)
    assert step.overran(1002.0)
    stall = judge_stall(
        [], blocker=None, blocker_job=None, began=1000.0, ended=1002.0, tolerated=TOLERATED
    )
    blocked, _ = step.unblocked(stall, held=0)
    assert blocked.fields["job_id"] is None and blocked.fields["token"] is None


def test_a_stall_the_book_judged_within_tolerance_tells_nothing() -> None:
    step = LoopStep("a", 1000.0, TOLERATED)
    stall = judge_stall(
        [], blocker=None, blocker_job="a", began=1000.0, ended=1000.5, tolerated=TOLERATED
    )
    assert step.unblocked(stall, held=0) == []
    assert not step.reported
