"""Lease arithmetic: timing rules, backoff, the local lease and the watchdog's plan."""

from __future__ import annotations

import itertools

import pytest
from core_harness import local_lease, put

from sqs_lease._core.lease import Drop, LeaseEvent, LeaseStatus, LocalLease, Stop
from sqs_lease._core.timing import (
    CAP_MARGIN,
    EFFECT_MARGIN,
    SQS_MAX_VISIBILITY,
    backoff_delay,
    check_timing,
    judge_stall,
    loop_lag_limit,
    plan_heartbeat,
    tolerated_loop_lag,
)
from sqs_lease._errors import (
    AttemptTimedOut,
    ConfigError,
    JobCancelled,
    JobClassError,
    LeaseLost,
    OwnershipUnknown,
    WorkerShuttingDown,
)

# =========================================================================== check_timing


def test_check_timing_accepts_a_valid_class() -> None:
    check_timing("ocr", lease=120, heartbeat=30, jitter=5, missed=3, stage_budget=3600)
    # the boundaries themselves are allowed
    check_timing("edge", lease=61, heartbeat=20, jitter=0, missed=3, stage_budget=61)
    check_timing("reserve", lease=61, heartbeat=30, jitter=0.5, missed=1, stage_budget=61)
    # the longest lease that fits: a stage must hold one lease and stay under the cap
    longest = int(SQS_MAX_VISIBILITY - CAP_MARGIN)
    check_timing("max", lease=longest, heartbeat=600, jitter=30, missed=3, stage_budget=longest)


def test_check_timing_refuses_lease_not_above_missed_beats_plus_jitter() -> None:
    # L = 60 <= R x H + J = 3 x 20 + 0: one more missing beat and the lease lapses.
    with pytest.raises(JobClassError) as caught:
        check_timing("ocr", lease=60, heartbeat=20, jitter=0, missed=3, stage_budget=3600)
    text = str(caught.value)
    assert "'ocr'" in text
    assert "lease_seconds=60" in text
    assert "3 x 20 + 0 = 60" in text
    with pytest.raises(JobClassError, match=r"2 x 25 \+ 15 = 65"):
        check_timing("ocr", lease=60, heartbeat=25, jitter=15, missed=2, stage_budget=3600)


def test_a_class_whose_regular_beat_leaves_less_than_a_beat_plus_jitter_is_refused() -> None:
    # The example: L > R x H + J holds (3 > 1 x 1.5 + 0.4), yet every beat
    # extends with 1.5 s left, less than H + J = 1.9: one missed beat and it lapses.
    with pytest.raises(JobClassError) as caught:
        check_timing("ocr", lease=3, heartbeat=1.5, jitter=0.4, missed=1, stage_budget=3600)
    text = str(caught.value)
    assert "'ocr'" in text
    assert "3 - 1.5 = 1.5 s left" in text
    assert "1.5 + 0.4 = 1.9 s" in text
    assert "raise lease_seconds to at least 4 or lower heartbeat_seconds below 1.3" in text
    # beating at exactly half the lease leaves nothing for one missed beat either
    with pytest.raises(JobClassError, match=r"60 - 30 = 30 s left"):
        check_timing("half", lease=60, heartbeat=30, jitter=0, missed=1, stage_budget=60)


def test_the_beat_reserve_rule_has_its_edge_at_one_beat_plus_jitter_left() -> None:
    # L - H = 2.5 against H + J: just above passes, equal is refused (the watchdog
    # lets go at deadline - J, exactly when the beat after a missed one would come)
    check_timing("edge", lease=4, heartbeat=1.5, jitter=0.9, missed=1, stage_budget=3600)
    with pytest.raises(JobClassError, match=r"1\.5 \+ 1 = 2\.5 s"):
        check_timing("edge", lease=4, heartbeat=1.5, jitter=1.0, missed=1, stage_budget=3600)
    # the rule holds with no misses tolerated too: every extension needs the reserve
    check_timing("r0", lease=5, heartbeat=2, jitter=0.5, missed=0, stage_budget=3600)
    with pytest.raises(JobClassError, match=r"at least 5 or lower heartbeat_seconds below 1\.75"):
        check_timing("r0", lease=4, heartbeat=2, jitter=0.5, missed=0, stage_budget=3600)


def test_check_timing_refuses_heartbeat_over_half_thelocal_lease() -> None:
    with pytest.raises(JobClassError, match=r"heartbeat_seconds=31 > lease_seconds/2=30"):
        check_timing("ocr", lease=60, heartbeat=31, jitter=0, missed=1, stage_budget=3600)


def test_check_timing_refuses_lease_over_the_sqs_cap() -> None:
    with pytest.raises(JobClassError, match=r"lease_seconds=43201 exceeds .*43200"):
        check_timing("ocr", lease=43_201, heartbeat=60, jitter=5, missed=3, stage_budget=40_000)


@pytest.mark.parametrize("lease", [60.5, 0, 0.5, -10])
def test_check_timing_refuses_non_wholelocal_lease(lease: float) -> None:
    with pytest.raises(JobClassError, match=r"must be a whole number >= 1"):
        check_timing("ocr", lease=lease, heartbeat=0.1, jitter=0, missed=0, stage_budget=3600)


@pytest.mark.parametrize(("heartbeat", "jitter", "missed"), [(0, 0, 1), (-1, 0, 1), (10, -1, 1)])
def test_check_timing_refuses_negative_parameters(
    heartbeat: float, jitter: float, missed: int
) -> None:
    with pytest.raises(JobClassError, match=r"must be > 0"):
        check_timing(
            "ocr", lease=60, heartbeat=heartbeat, jitter=jitter, missed=missed, stage_budget=3600
        )


def test_check_timing_refuses_stage_budget_past_the_12h_cap_less_margin() -> None:
    limit = SQS_MAX_VISIBILITY - CAP_MARGIN
    check_timing("ocr", lease=120, heartbeat=30, jitter=5, missed=3, stage_budget=limit)
    with pytest.raises(JobClassError) as caught:
        check_timing("ocr", lease=120, heartbeat=30, jitter=5, missed=3, stage_budget=limit + 1)
    assert f"stage_budget_seconds={limit + 1:g}" in str(caught.value)
    assert f"{limit:g}" in str(caught.value)


def test_check_timing_refuses_stage_budget_below_onelocal_lease() -> None:
    with pytest.raises(JobClassError, match=r"stage_budget_seconds=119 is below lease_seconds=120"):
        check_timing("ocr", lease=120, heartbeat=30, jitter=5, missed=3, stage_budget=119)


# ------------------------------------------------------------- the three timeouts


def _timeouts(
    stage_budget: float = 3600.0,
    effect: float | None = 60.0,
    progress: float | None = None,
    lease: float = 120,
) -> None:
    check_timing(
        "ocr",
        lease=lease,
        heartbeat=30,
        jitter=5,
        missed=3,
        stage_budget=stage_budget,
        effect_timeout=effect,
        progress_timeout=progress,
    )


def test_the_three_timeouts_are_accepted_at_their_boundaries() -> None:
    _timeouts(stage_budget=3600, effect=3600 - EFFECT_MARGIN, progress=3600)
    _timeouts(stage_budget=120, effect=0.001, progress=0.001)  # the smallest stage: one lease
    _timeouts(progress=None)  # no no-progress limit: the stage budget bounds the attempt
    _timeouts(effect=None)  # check_timing alone: the effect timeout is not asked about


def test_an_effect_timeout_that_does_not_fit_the_stage_budget_is_refused() -> None:
    with pytest.raises(JobClassError) as caught:
        _timeouts(stage_budget=600, effect=596)
    text = str(caught.value)
    assert "'ocr'" in text
    assert "effect_timeout_seconds=596" in text
    assert f"margin {EFFECT_MARGIN:g} = 601" in text
    assert "stage_budget_seconds=600" in text
    assert f"at most {600 - EFFECT_MARGIN:g}" in text  # the fix, with its number


def test_a_progress_timeout_above_the_stage_budget_is_refused() -> None:
    with pytest.raises(JobClassError) as caught:
        _timeouts(stage_budget=600, progress=600.5)
    text = str(caught.value)
    assert "progress_timeout_seconds=600.5 exceeds stage_budget_seconds=600" in text
    assert "lower it" in text


@pytest.mark.parametrize("effect", [0, -1])
def test_a_non_positive_effect_timeout_is_refused(effect: float) -> None:
    with pytest.raises(JobClassError, match=r"effect_timeout_seconds=-?[01] must be > 0"):
        _timeouts(effect=effect)


@pytest.mark.parametrize("progress", [0, -5])
def test_a_non_positive_progress_timeout_is_refused(progress: float) -> None:
    with pytest.raises(JobClassError, match=r"progress_timeout_seconds=-?\d+ must be > 0"):
        _timeouts(progress=progress)


@pytest.mark.parametrize(
    ("kw", "name"),
    [
        ({"effect": float("nan")}, "effect_timeout_seconds"),
        ({"effect": float("inf")}, "effect_timeout_seconds"),
        ({"progress": float("nan")}, "progress_timeout_seconds"),
        ({"progress": float("inf")}, "progress_timeout_seconds"),
        ({"stage_budget": float("nan")}, "stage_budget_seconds"),
        ({"stage_budget": float("inf")}, "stage_budget_seconds"),
        ({"lease": float("inf")}, "lease_seconds"),
    ],
)
def test_a_timeout_that_is_not_a_finite_number_is_refused(kw: dict[str, float], name: str) -> None:
    # NaN compares false with everything: without this rule it passed every check.
    with pytest.raises(JobClassError, match=rf"{name}=(nan|inf) must be a finite number"):
        _timeouts(**kw)


def test_a_stage_budget_at_the_cap_less_margin_fits_any_effect_timeout_below_it() -> None:
    limit = SQS_MAX_VISIBILITY - CAP_MARGIN
    _timeouts(stage_budget=limit, effect=limit - EFFECT_MARGIN, progress=limit)
    with pytest.raises(JobClassError, match="stage_budget_seconds"):
        _timeouts(stage_budget=limit + 1, effect=60)


# =========================================================================== backoff


@pytest.mark.parametrize("rand", [0.0, 0.25, 0.5, 0.75, 0.999999])
@pytest.mark.parametrize("attempt", [0, 1, 2, 5, 10, 30])
def test_backoff_delay_stays_within_zero_and_cap(attempt: int, rand: float) -> None:
    d = backoff_delay(attempt, base=2.0, cap=300.0, rand=rand)
    assert isinstance(d, int)
    assert 0 <= d <= 300


def test_backoff_delay_grows_with_attempt_until_the_cap() -> None:
    delays = [backoff_delay(a, base=2.0, cap=300.0, rand=0.5) for a in range(1, 12)]
    assert delays[:5] == [1, 2, 4, 8, 16]  # base x 2^(attempt-1) x rand, rounded
    assert all(b >= a for a, b in itertools.pairwise(delays))
    assert delays[-1] == 150  # cap x rand
    assert backoff_delay(1, base=2.0, cap=300.0, rand=0.0) == 0


def test_backoff_delay_never_exceeds_the_sqs_cap() -> None:
    assert backoff_delay(40, base=60.0, cap=1e9, rand=0.999) == int(SQS_MAX_VISIBILITY * 0.999)


def test_backoff_delay_respects_a_fractional_cap() -> None:
    assert backoff_delay(5, base=100.0, cap=9.7, rand=0.99) <= 9.7


def test_backoff_delay_survives_a_huge_attempt_count() -> None:
    assert backoff_delay(2000, base=1.0, cap=300.0, rand=0.5) == 150


# =========================================================================== LocalLease.check


def _held(status: LeaseStatus = LeaseStatus.OK) -> LocalLease:
    lease = local_lease("job-1", token=4, deadline=1060.0, jitter_seconds=5.0)
    put(lease, status, "why")
    return lease


def test_lease_check_passes_before_the_conservative_deadline() -> None:
    lease = _held()
    assert lease.conservative_deadline == 1055.0
    lease.check(1000.0)
    lease.check(1054.999)


@pytest.mark.parametrize("now", [1055.0, 1059.0, 1060.0, 2000.0])
def test_lease_check_refuses_from_deadline_minus_jitter(now: float) -> None:
    with pytest.raises(OwnershipUnknown, match="lease reserve spent"):
        _held().check(now)


def test_lease_check_lost_raises_lease_lost() -> None:
    with pytest.raises(LeaseLost, match=r"job-1 token 4: lease lost \(why\)") as caught:
        _held(LeaseStatus.LOST).check(1000.0)
    assert not isinstance(caught.value, JobCancelled)


def test_lease_check_cancelled_raises_job_cancelled() -> None:
    with pytest.raises(JobCancelled, match="job-1 was cancelled: why"):
        _held(LeaseStatus.CANCELLED).check(1000.0)


@pytest.mark.parametrize(
    ("status", "text"),
    [
        (LeaseStatus.UNKNOWN, "ownership unconfirmed"),
        (LeaseStatus.EXPIRED, "lease no longer held"),
        (LeaseStatus.DONE, "lease no longer held"),
    ],
)
def test_lease_check_unconfirmed_states_raise_ownership_unknown(
    status: LeaseStatus, text: str
) -> None:
    with pytest.raises(OwnershipUnknown, match=text):
        _held(status).check(1000.0)  # well inside the deadline: the status alone decides


# ------------------------------------------------------------- stops


def test_a_held_lease_has_no_stop_and_no_stop_error() -> None:
    lease = _held()
    assert (lease.stop, lease.stop_error()) == (None, None)
    unknown = _held(LeaseStatus.UNKNOWN)  # not told to stop: the heartbeat still tries
    assert (unknown.stop, unknown.stop_error()) == (None, None)


def test_shutdown_tells_an_open_attempt_to_stop_with_worker_shutting_down() -> None:
    lease = _held()
    lease.process(LeaseEvent.STOP_ASKED)
    assert lease.stop is Stop.SHUTDOWN
    with pytest.raises(WorkerShuttingDown, match="job-1 token 4: the worker is shutting down"):
        lease.check(1000.0)
    assert lease.status is LeaseStatus.OK  # still held: the heartbeat keeps extending it


def test_a_lost_or_cancelled_lease_outranks_a_shutdown() -> None:
    lost = _held(LeaseStatus.LOST)
    lost.process(LeaseEvent.STOP_ASKED)
    assert lost.stop is Stop.LEASE_LOST
    assert type(lost.stop_error()) is LeaseLost
    cancelled = _held(LeaseStatus.CANCELLED)
    cancelled.process(LeaseEvent.STOP_ASKED)
    assert cancelled.stop is Stop.CANCELLED
    assert type(cancelled.stop_error()) is JobCancelled


@pytest.mark.parametrize(
    ("why", "error"),
    [
        (Drop.EFFECT_TIMEOUT, AttemptTimedOut),
        (Drop.NO_PROGRESS, AttemptTimedOut),
        (Drop.STAGE_BUDGET, AttemptTimedOut),
        (Drop.RESERVE_SPENT, OwnershipUnknown),
        (Drop.SHUTDOWN, WorkerShuttingDown),
    ],
)
def test_a_dropped_lease_is_let_go_and_raises_what_dropped_it(
    why: Drop, error: type[Exception]
) -> None:
    lease = _held()
    lease.drop(why)
    assert (lease.status, lease.dropped, lease.reason) == (LeaseStatus.EXPIRED, why, why.value)
    assert lease.stop is Stop.LET_GO
    with pytest.raises(error, match=r"job-1 token 4"):
        lease.check(1000.0)
    assert type(lease.stop_error()) is error


def test_a_finished_attempt_is_not_a_stop() -> None:
    lease = _held(LeaseStatus.DONE)
    assert lease.stop is None
    with pytest.raises(OwnershipUnknown, match="lease no longer held"):
        lease.check(1000.0)


# =========================================================================== plan_heartbeat


def test_plan_extends_only_leases_that_are_due() -> None:
    due = local_lease("due", next_beat=1010.0)
    later = local_lease("later", next_beat=1020.0)
    plan = plan_heartbeat([due, later], now=1010.0)
    assert [lease.job_id for lease in plan.extend] == ["due"]
    assert plan.drop == ()
    assert [lease.job_id for lease in plan_heartbeat([later], now=1019.9).extend] == []
    assert [lease.job_id for lease in plan_heartbeat([later], now=1020.0).extend] == ["later"]


def test_plan_extends_unknown_leases_while_reserve_remains() -> None:
    lease = local_lease("u")
    put(lease, LeaseStatus.UNKNOWN)
    assert plan_heartbeat([lease], now=1050.0).extend == (lease,)


@pytest.mark.parametrize(
    "status", [LeaseStatus.DONE, LeaseStatus.LOST, LeaseStatus.CANCELLED, LeaseStatus.EXPIRED]
)
def test_plan_never_extends_finished_leases(status: LeaseStatus) -> None:
    lease = local_lease("x", next_beat=0.0)
    put(lease, status)
    plan = plan_heartbeat([lease], now=1010.0)
    assert plan.extend == ()
    assert plan.drop == ()  # nor re-drops them
    # not even once the reserve is spent
    assert plan_heartbeat([lease], now=5000.0) == plan


def test_plan_drops_when_reserve_spent() -> None:
    lease = local_lease("r")
    put(lease, LeaseStatus.UNKNOWN)  # the last round could not confirm ownership
    plan = plan_heartbeat([lease], now=1055.0)  # deadline 1060 - jitter 5
    assert plan.extend == ()
    assert plan.drop == ((lease, Drop.RESERVE_SPENT),)
    assert plan_heartbeat([lease], now=1054.9).extend == (lease,)


def test_a_confirmed_lease_that_runs_out_is_dropped_as_the_workers_own_lateness() -> None:
    # Ownership was confirmed and no call failed: only this worker's heartbeat came
    # too late, so the drop is not the job's failure (it is handed back uncharged).
    lease = local_lease("late")
    assert lease.status is LeaseStatus.OK
    assert plan_heartbeat([lease], now=1055.0).drop == ((lease, Drop.WORKER_LATE),)
    lease.drop(Drop.WORKER_LATE)
    error = lease.stop_error()
    assert isinstance(error, OwnershipUnknown) and "not spent" in str(error)


def test_plan_drops_an_attempt_whose_effect_call_ran_past_its_timeout_and_margin() -> None:
    lease = local_lease("t", deadline=10_000.0)
    lease.begin_call(1000.0, 30.0)
    limit = 1030.0 + EFFECT_MARGIN
    assert plan_heartbeat([lease], now=limit).extend == (lease,)  # exactly at the limit
    assert plan_heartbeat([lease], now=limit + 0.5).drop == ((lease, Drop.EFFECT_TIMEOUT),)


def test_the_effect_timeout_limits_one_call_not_the_whole_attempt() -> None:
    # The old tool timeout counted from the attempt's start: a handler that had run
    # longer than it was dropped even between calls. Calls now carry their own limit.
    lease = local_lease("a", deadline=100_000.0, next_beat=0.0)
    first = lease.begin_call(1000.0, 30.0)
    lease.end_call(first, 1020.0)
    lease.begin_call(5000.0, 30.0)  # 4000 s into the attempt, a fresh 30 s call
    assert plan_heartbeat([lease], now=5020.0).extend == (lease,)
    assert plan_heartbeat([lease], now=5036.0).drop == ((lease, Drop.EFFECT_TIMEOUT),)


def test_the_earliest_of_two_calls_in_flight_decides() -> None:
    lease = local_lease("two", deadline=10_000.0)
    long_call = lease.begin_call(1000.0, 300.0)
    short_call = lease.begin_call(1010.0, 10.0)
    assert plan_heartbeat([lease], now=1026.0).drop == ((lease, Drop.EFFECT_TIMEOUT),)
    lease.end_call(short_call, 1012.0)
    assert plan_heartbeat([lease], now=1026.0).extend == (lease,)
    lease.end_call(long_call, 1030.0)
    assert lease.calls == {}


def test_no_progress_is_not_counted_while_an_effect_call_runs() -> None:
    lease = local_lease("c", progress_timeout=20.0, deadline=10_000.0)
    lease.last_progress = 1000.0
    handle = lease.begin_call(1001.0, 60.0)
    assert plan_heartbeat([lease], now=1050.0).extend == (lease,)  # the call's limit governs
    lease.end_call(handle, 1050.0)  # a finished call is progress
    assert lease.last_progress == 1050.0
    assert plan_heartbeat([lease], now=1070.0).extend == (lease,)
    assert plan_heartbeat([lease], now=1070.5).drop == ((lease, Drop.NO_PROGRESS),)


def test_plan_drops_without_progress() -> None:
    lease = local_lease("p", progress_timeout=20.0)
    lease.last_progress = 1015.0
    assert plan_heartbeat([lease], now=1035.0).extend == (lease,)
    assert plan_heartbeat([lease], now=1035.5).drop == ((lease, Drop.NO_PROGRESS),)
    lease.last_progress = 1030.0  # progress reported: extended again
    assert plan_heartbeat([lease], now=1035.5).extend == (lease,)


def test_plan_without_progress_timeout_never_drops_for_progress() -> None:
    lease = local_lease("n", progress_timeout=None)
    lease.last_progress = 0.0
    assert plan_heartbeat([lease], now=1040.0).extend == (lease,)


def test_plan_drops_when_next_extension_crosses_stage_budget() -> None:
    lease = local_lease("s", stage_deadline=1100.0)  # L = 60
    assert plan_heartbeat([lease], now=1040.0).extend == (lease,)  # 1040 + 60 = 1100
    assert plan_heartbeat([lease], now=1040.5).drop == ((lease, Drop.STAGE_BUDGET),)


def test_plan_drops_even_when_not_due() -> None:
    # The watchdog lets a job go at once; it does not wait for its next beat.
    lease = local_lease("d", next_beat=2000.0)
    lease.begin_call(1000.0, 10.0)
    assert plan_heartbeat([lease], now=1020.0).drop == ((lease, Drop.EFFECT_TIMEOUT),)


def test_plan_reserve_spent_wins_over_other_drop_reasons() -> None:
    lease = local_lease("w", stage_deadline=1001.0)
    lease.begin_call(1000.0, 1.0)
    assert plan_heartbeat([lease], now=1058.0).drop == ((lease, Drop.WORKER_LATE),)
    put(lease, LeaseStatus.UNKNOWN)
    assert plan_heartbeat([lease], now=1058.0).drop == ((lease, Drop.RESERVE_SPENT),)


# --------------------------------------------------------------------------- loop lag


def test_the_loop_lag_a_lease_survives_is_lease_less_heartbeat_less_jitter() -> None:
    assert loop_lag_limit(60, 10.0, 5.0) == 45.0
    assert loop_lag_limit(3, 1.0, 0.5) == 1.5


def test_the_default_tolerated_lag_is_one_second_or_half_the_tightest_limit() -> None:
    assert tolerated_loop_lag(None, [("slow", 60, 10.0, 5.0)]) == 1.0
    assert tolerated_loop_lag(None, [("slow", 60, 10.0, 5.0), ("fast", 3, 1.0, 0.5)]) == 0.75
    assert tolerated_loop_lag(0.2, [("fast", 3, 1.0, 0.5)]) == 0.2


@pytest.mark.parametrize("requested", [1.5, 2.0, 0.0, -1.0, float("nan"), float("inf")])
def test_a_tolerated_lag_a_lease_could_not_survive_is_refused_naming_the_class(
    requested: float,
) -> None:
    with pytest.raises(ConfigError, match=r"max_loop_lag=.*below 1\.5.*'fast'"):
        tolerated_loop_lag(requested, [("slow", 60, 10.0, 5.0), ("fast", 3, 1.0, 0.5)])


def test_a_stall_within_the_tolerated_lag_costs_nothing() -> None:
    blocker = local_lease("a")
    stall = judge_stall(
        [blocker], blocker=blocker, blocker_job="a", began=1000.0, ended=1000.9, tolerated=1.0
    )
    assert (stall.drop, stall.lapsed, stall.event) == (None, (), None)


def test_a_stall_past_the_tolerated_lag_drops_the_blocker_and_names_the_lapsed_leases() -> None:
    blocker = local_lease("a", deadline=1060.0)
    lapsed = local_lease("b", deadline=1020.0)  # conservative deadline 1015: crossed
    alive = local_lease("c", deadline=1050.0)  # conservative deadline 1045: not crossed
    done = local_lease("d", deadline=1010.0)
    put(done, LeaseStatus.DONE)  # ended before: nothing to lapse
    stall = judge_stall(
        [blocker, lapsed, alive, done],
        blocker=blocker,
        blocker_job="a",
        began=1000.0,
        ended=1016.0,
        tolerated=1.0,
    )
    assert stall.drop is blocker
    assert stall.lapsed == (lapsed,)
    assert stall.event == {
        "job_id": "a",
        "token": 2,
        "blocked_for": 16.0,
        "tolerated": 1.0,
        "blocker_dropped": True,
        "lapsed": 1,
    }


def test_a_stall_by_a_job_not_yet_held_or_already_ended_drops_nothing_but_is_reported() -> None:
    ended = local_lease("a")
    put(ended, LeaseStatus.DONE)
    for blocker in (None, ended):
        stall = judge_stall(
            [ended], blocker=blocker, blocker_job="a", began=0.0, ended=5.0, tolerated=1.0
        )
        assert stall.drop is None
        assert stall.event is not None and stall.event["blocker_dropped"] is False
