"""The handler's context and its job class, without AWS: timeouts, waits, checks, stops."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from core_harness import local_lease
from pydantic import BaseModel

from sqs_lease import (
    App,
    AttemptTimedOut,
    ConfigError,
    EffectCall,
    JobCancelled,
    JobClass,
    JobClassError,
    JobContext,
    LeaseError,
    LeaseLost,
    OwnershipUnknown,
    WorkerShuttingDown,
)
from sqs_lease._core.intents import EffectResult, EffectSpec
from sqs_lease._core.lease import Drop, LeaseEvent, LocalLease
from sqs_lease._core.timing import EFFECT_MARGIN
from sqs_lease._journal import Journal


class Work(BaseModel):
    n: int


# --------------------------------------------------------------------------- the job class


def test_the_removed_tool_timeout_is_refused_naming_the_three_limits_that_replace_it() -> None:
    with pytest.raises(JobClassError) as caught:
        JobClass(name="old", payload_model=Work, tool_timeout_seconds=600)  # type: ignore[call-arg]
    text = str(caught.value)
    assert "'old'" in text and "tool_timeout_seconds=600" in text
    for new in ("effect_timeout_seconds", "progress_timeout_seconds", "stage_budget_seconds"):
        assert new in text
    app = App()
    with pytest.raises(JobClassError, match="tool_timeout_seconds"):
        app.job("old", payload=Work, tool_timeout_seconds=30)  # type: ignore[call-arg]
    assert app.classes == {}


def test_the_default_job_class_keeps_its_timeouts_inside_its_budget() -> None:
    jc = JobClass(name="d", payload_model=Work)
    assert jc.effect_timeout_seconds + EFFECT_MARGIN <= jc.stage_budget_seconds
    assert jc.progress_timeout_seconds is None  # opt-in; the stage budget bounds the attempt


@pytest.mark.parametrize(
    ("policy", "message"),
    [
        (
            {"stage_budget_seconds": 60, "effect_timeout_seconds": 56},
            r"effect_timeout_seconds=56 \+ the watchdog's margin 5 = 61 exceeds "
            r"stage_budget_seconds=60.*at most 55",
        ),
        (
            {
                "stage_budget_seconds": 60,
                "effect_timeout_seconds": 5,
                "progress_timeout_seconds": 61,
            },
            r"progress_timeout_seconds=61 exceeds stage_budget_seconds=60",
        ),
        ({"effect_timeout_seconds": 0}, r"effect_timeout_seconds=0 must be > 0"),
        ({"progress_timeout_seconds": -1}, r"progress_timeout_seconds=-1 must be > 0"),
        (
            {"progress_timeout_seconds": float("nan")},
            r"progress_timeout_seconds=nan must be a finite number",
        ),
        (
            {"stage_budget_seconds": 43_200, "effect_timeout_seconds": 60},
            r"stage_budget_seconds=43200 must stay under 42300",
        ),
        (
            {"stage_budget_seconds": 29, "effect_timeout_seconds": 5},
            r"stage_budget_seconds=29 is below lease_seconds=30",
        ),
    ],
    ids=[
        "effect-over-budget",
        "progress-over-budget",
        "effect-zero",
        "progress-negative",
        "progress-nan",
        "budget-over-cap",
        "budget-under-lease",
    ],
)
def test_inconsistent_timeouts_are_refused_with_the_numbers(
    policy: dict[str, Any], message: str
) -> None:
    with pytest.raises(JobClassError, match=message):
        JobClass(name="bad", payload_model=Work, **policy)


# --------------------------------------------------------------------------- the context


def _context(
    lease: LocalLease | None = None,
    run_effect: Any = None,
    **policy: Any,
) -> tuple[JobContext[Any], LocalLease, threading.Event, list[float]]:
    lease = lease or local_lease("job-1", token=3, deadline=10_000.0)
    now = [1000.0]
    stopped = threading.Event()
    app = App()
    app.target("t")
    ctx: JobContext[Any] = JobContext(
        job_id="job-1",
        job_class=JobClass(name="c", payload_model=Work, **policy),
        payload=Work(n=1),
        payload_hash="h",
        token=3,
        attempt=1,
        worker_id="w",
        lease=lease,
        lock=threading.Lock(),
        cancelled=stopped,
        clock=lambda: now[0],
        journal=Journal(),
        run_effect=run_effect,
        targets=app.targets,
    )
    return ctx, lease, stopped, now


def test_a_wait_that_runs_its_time_returns_false() -> None:
    ctx, _, _, _ = _context()
    assert ctx.wait(0.01) is False
    assert ctx.cancelled is False


def _stop_shutdown(lease: LocalLease) -> None:
    lease.process(LeaseEvent.STOP_ASKED)


def _stop_lost(lease: LocalLease) -> None:
    lease.process(LeaseEvent.LOST, "token moved to 4")


def _stop_cancelled(lease: LocalLease) -> None:
    lease.process(LeaseEvent.CANCELLED, "session ended")


@pytest.mark.parametrize(
    ("stop", "error"),
    [
        (_stop_shutdown, WorkerShuttingDown),
        (_stop_lost, LeaseLost),
        (_stop_cancelled, JobCancelled),
        (lambda lease: lease.drop(Drop.NO_PROGRESS), AttemptTimedOut),
        (lambda lease: lease.drop(Drop.EFFECT_TIMEOUT), AttemptTimedOut),
        (lambda lease: lease.drop(Drop.STAGE_BUDGET), AttemptTimedOut),
        (lambda lease: lease.drop(Drop.RESERVE_SPENT), OwnershipUnknown),
        (lambda lease: lease.drop(Drop.SHUTDOWN), WorkerShuttingDown),
    ],
    ids=[
        "shutdown",
        "lost",
        "cancelled",
        "no-progress",
        "effect",
        "budget",
        "reserve",
        "grace-overrun",
    ],
)
def test_after_a_stop_wait_and_check_raise_the_matching_lease_error(
    stop: Any, error: type[LeaseError]
) -> None:
    ctx, lease, stopped, _ = _context()
    stop(lease)
    stopped.set()  # the worker sets the event with every stop
    with pytest.raises(error) as waited:
        ctx.wait(600)  # raises at once: the stop came before the wait
    assert type(waited.value) is error
    with pytest.raises(error):
        ctx.check()
    assert ctx.cancelled is True


def test_a_wait_raises_when_the_stop_comes_during_it() -> None:
    ctx, lease, stopped, _ = _context()

    def stop_later() -> None:
        lease.process(LeaseEvent.STOP_ASKED)
        stopped.set()

    timer = threading.Timer(0.05, stop_later)
    timer.start()
    try:
        with pytest.raises(WorkerShuttingDown):
            ctx.wait(600)  # hang guard: the stop ends it
    finally:
        timer.cancel()


def test_an_effect_call_gets_its_timeout_and_is_watched_while_it_runs() -> None:
    seen: list[tuple[float, dict[int, float]]] = []

    def run_effect(spec: EffectSpec) -> EffectResult:
        return EffectResult(spec.tool(), None)

    ctx, lease, _, now = _context(run_effect=run_effect, effect_timeout_seconds=42)

    def call(c: EffectCall) -> dict[str, Any]:
        seen.append((c.timeout, dict(lease.calls)))
        now[0] = 1010.0  # the call took 10 s
        return {"ok": True}

    ctx.effect("a", "t", {"x": 1}, call)
    ctx.effect("b", "t", {"x": 2}, call, timeout=7.5)
    assert [t for t, _ in seen] == [42.0, 7.5]
    assert list(seen[0][1].values()) == [1000.0 + 42.0]  # its deadline, while it ran
    assert lease.calls == {}  # ended
    assert lease.last_progress == 1010.0  # a finished call is progress


@pytest.mark.parametrize("timeout", [0, -1, float("nan"), float("inf"), 3600.0])
def test_an_effect_timeout_that_does_not_fit_the_stage_is_refused(timeout: float) -> None:
    ctx, _, _, _ = _context(run_effect=lambda spec: EffectResult(spec.tool(), None))
    with pytest.raises(
        ConfigError,
        match=r"effect .a.: timeout=.* must be > 0 and at most stage_budget_seconds - 5 = 3595",
    ):
        ctx.effect("a", "t", {}, lambda c: {}, timeout=timeout)


def test_progress_resets_the_no_progress_clock() -> None:
    ctx, lease, _, now = _context()
    now[0] = 1234.0
    ctx.progress()
    assert lease.last_progress == 1234.0


def test_a_target_whose_success_meaning_is_unknown_is_refused_naming_the_choices() -> None:
    from sqs_lease import App
    from sqs_lease._errors import ConfigError

    with pytest.raises(ConfigError, match=r"success='done' must be one of accepted, completed"):
        App().target("payments", success="done")  # type: ignore[arg-type]
