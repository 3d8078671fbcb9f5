"""A caller reads its job's outcome from Python: ``Producer.status`` and ``Producer.wait``
(and the async twins), issue 29.

The wait's rules are checked on the pure flow (its polls, pauses, timeout and lost
reads, with a scripted clock); what a caller meets end to end runs against the moto
server over HTTP, with a real worker, a cancel and an absent job.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from core_harness import Script, job_item, ok, table, unreachable
from pydantic import BaseModel
from worker_helpers import prepare

from sqs_lease import (
    App,
    AsyncProducer,
    JobContext,
    JobNotFound,
    JobState,
    Producer,
    ResourceMissing,
    WaitTimedOut,
    Worker,
)
from sqs_lease._core.calls import Err, ErrorKind
from sqs_lease._core.status import MAX_POLL, JobStatus, poll_pauses, status_flow, wait_flow
from sqs_lease.testing import HANG_GUARD, running

# --------------------------------------------------------------------------- the flow


class FakeClock:
    """Seconds that pass only when the wait sleeps (the Script records the sleeps)."""

    def __init__(self, script: Script) -> None:
        self.script = script

    def __call__(self) -> float:
        return sum(self.script.sleeps)


def _item(state: JobState, **kw: Any) -> dict[str, Any]:
    return job_item("job-1", state=state, **kw)


def _wait(script: Script, timeout: float, **kw: Any) -> JobStatus:
    return script.run(
        wait_flow(
            table(), "job-1", timeout=timeout, clock=FakeClock(script), jitter=lambda: 0.0, **kw
        )
    )


def test_the_pauses_grow_by_half_from_a_fifth_of_a_second_to_the_most() -> None:
    pauses = poll_pauses()
    got = [next(pauses) for _ in range(12)]
    assert got[:4] == pytest.approx([0.2, 0.3, 0.45, 0.675])
    assert max(got) == MAX_POLL and got[-3:] == [MAX_POLL] * 3
    assert got == sorted(got)


def test_a_wait_reads_until_the_job_is_settled_and_returns_that_status() -> None:
    running_ = ok({"Item": _item(JobState.RUNNING)})
    done = _item(JobState.SUCCEEDED, owner=None)
    done["result"] = {"S": '{"pages": 3}'}
    script = Script([running_, running_, running_, ok({"Item": done})])
    status = _wait(script, timeout=60)
    assert status.state is JobState.SUCCEEDED and status.result == {"pages": 3}
    assert status.finished and status.settled and not status.cancelled
    assert script.ops == ["dynamodb.GetItem"] * 4
    assert script.sleeps == pytest.approx([0.2, 0.3, 0.45])  # no sleep after the last read
    assert all(c.params["ConsistentRead"] for c in script.calls)


@pytest.mark.parametrize(
    ("state", "code", "cancelled"),
    [
        (JobState.CANCELLED, "cancelled", True),
        (JobState.FAILED, "cancelled", True),  # cancelled by a version before the state
        (JobState.FAILED, "boom", False),
        (JobState.PARKED, "ambiguous", False),
    ],
)
def test_failed_cancelled_and_parked_jobs_end_a_wait_at_once(
    state: JobState, code: str, cancelled: bool
) -> None:
    script = Script([ok({"Item": _item(state, error_code=code, reason="why")})])
    status = _wait(script, timeout=60)
    assert (status.state, status.error_code, status.cancelled) == (state, code, cancelled)
    assert status.result is None and status.settled and script.sleeps == []
    with pytest.raises(ValueError, match=f"is {state.value}, not succeeded"):
        status.result_as(BaseModel)


def test_a_wait_past_its_timeout_raises_with_the_last_status_and_never_sleeps_past_it() -> None:
    script = Script(lambda call: ok({"Item": _item(JobState.QUEUED, owner=None)}))
    with pytest.raises(WaitTimedOut, match="still queued after 10 s") as caught:
        _wait(script, timeout=10)
    assert isinstance(caught.value, TimeoutError)
    assert caught.value.status is not None and caught.value.status.state is JobState.QUEUED
    assert sum(script.sleeps) == pytest.approx(10)  # the last pause cut to the deadline
    assert max(script.sleeps) <= MAX_POLL
    # One read at the deadline itself: a job settled in the last pause is seen.
    assert len(script.calls) == len(script.sleeps) + 1


def test_a_read_that_fails_is_one_poll_lost_not_the_end_of_the_wait() -> None:
    done = ok({"Item": _item(JobState.SUCCEEDED, owner=None)})
    throttled = Err(ErrorKind.THROTTLED, code="ProvisionedThroughputExceededException")
    script = Script([unreachable(), throttled, done])
    assert _wait(script, timeout=60).state is JobState.SUCCEEDED
    # Every read failing: the timeout says so, with no status.
    script = Script(lambda call: unreachable())
    with pytest.raises(WaitTimedOut, match=r"unread after 2 s .*EndpointConnectionError") as caught:
        _wait(script, timeout=2)
    assert caught.value.status is None


def test_an_absent_job_or_table_ends_a_wait_at_once() -> None:
    with pytest.raises(JobNotFound, match="no job 'job-1'"):
        _wait(Script([ok({})]), timeout=60)
    missing = Err(ErrorKind.NOT_FOUND, code="ResourceNotFoundException", message="no table")
    with pytest.raises(ResourceMissing, match="tables create"):
        _wait(Script([missing]), timeout=60)


def test_a_status_read_that_fails_raises_naming_the_read() -> None:
    with pytest.raises(Exception, match="read job 'job-1' failed") as caught:
        Script([unreachable()]).run(status_flow(table(), "job-1"))
    assert type(caught.value).__name__ == "AwsCallFailed"


@pytest.mark.parametrize(("timeout", "max_poll"), [(-1, 5.0), (float("nan"), 5.0), (5, 0)])
def test_a_wait_refuses_a_negative_timeout_or_no_pause(timeout: float, max_poll: float) -> None:
    with pytest.raises(ValueError, match=r"timeout=|max_poll="):
        _wait(Script([]), timeout=timeout, max_poll=max_poll)


def test_the_jitter_only_shortens_a_pause_by_at_most_a_fifth() -> None:
    script = Script(
        [ok({"Item": _item(JobState.RUNNING)})] * 3 + [ok({"Item": _item(JobState.SUCCEEDED)})]
    )
    script.run(
        wait_flow(table(), "job-1", timeout=60, clock=FakeClock(script), jitter=lambda: 0.999)
    )
    assert [round(s / p, 3) for s, p in zip(script.sleeps, poll_pauses(), strict=False)] == [
        0.8
    ] * 3


# --------------------------------------------------------------------------- end to end


class Scan(BaseModel):
    pages: int


class Pages(BaseModel):
    pages: int
    text: str


def _app() -> App:
    app = App()

    @app.job("scan", payload=Scan, lease_seconds=30, heartbeat_seconds=5)
    def scan(ctx: JobContext[Scan], p: Scan) -> dict[str, Any]:
        return {"pages": p.pages, "text": "x" * p.pages}

    return app


@pytest.fixture
def env(moto_endpoint: str) -> Iterator[Any]:
    settings, _, _ = prepare(moto_endpoint, f"st{uuid.uuid4().hex[:10]}")
    yield settings


def test_a_caller_submits_waits_and_reads_the_typed_result(env: Any) -> None:
    app = _app()
    producer = Producer(env, app)
    job_id = producer.submit("scan", Scan(pages=3)).job_id
    before = producer.status(job_id)
    assert before.state in (JobState.QUEUED, JobState.RUNNING) and before.result is None
    assert before.created_at is not None and before.finished_at is None
    with running(Worker(app, env, worker_id="w", receive_wait=1)):
        status = producer.wait(job_id, timeout=HANG_GUARD)
    assert status.state is JobState.SUCCEEDED and status.finished
    assert status.result_as(Pages) == Pages(pages=3, text="xxx")
    assert (status.job_class, status.attempt, status.token) == ("scan", 1, 1)
    assert status.finished_at is not None and status.created_at is not None
    assert status.finished_at >= status.created_at
    assert producer.status(job_id) == status  # nothing changes a finished record


def test_a_cancelled_job_reads_cancelled_and_a_wait_on_a_job_nobody_runs_times_out(
    env: Any,
) -> None:
    producer = Producer(env, _app())
    waiting = producer.submit("scan", Scan(pages=1)).job_id
    with pytest.raises(WaitTimedOut) as caught:
        producer.wait(waiting, timeout=0.5)
    assert caught.value.status is not None and caught.value.status.state is JobState.QUEUED
    producer.cancel(waiting, "not needed")
    status = producer.wait(waiting, timeout=HANG_GUARD)
    assert (
        status.cancelled
        and status.state is JobState.CANCELLED
        and status.reason == "cancelled: not needed"
    )
    with pytest.raises(JobNotFound, match="no job 'nobody'"):
        producer.status("nobody")


def test_the_async_producer_submits_and_waits_on_the_loop(env: Any) -> None:
    pytest.importorskip("aiobotocore")
    app = _app()

    async def main() -> tuple[JobStatus, list[int]]:
        ticks: list[int] = []

        async def ticker() -> None:  # the loop keeps running while the wait pauses
            for i in range(10_000):
                ticks.append(i)
                await asyncio.sleep(0.05)

        async with AsyncProducer(env, app) as producer:
            job_id = (await producer.submit("scan", Scan(pages=2))).job_id
            assert (await producer.status(job_id)).state is JobState.QUEUED
            tick = asyncio.create_task(ticker())
            try:
                with running(Worker(app, env, worker_id="w", receive_wait=1)):
                    status = await producer.wait(job_id, timeout=HANG_GUARD)
            finally:
                tick.cancel()
            cancelled = await producer.cancel_job(job_id)
            assert cancelled.verdict.value == "already_final"
            return status, ticks

    status, ticks = asyncio.run(main())
    assert status.state is JobState.SUCCEEDED and status.result == {"pages": 2, "text": "xx"}
    assert len(ticks) > 1
