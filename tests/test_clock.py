"""The lease clock: CLOCK_BOOTTIME where the platform has it, one function every shell uses."""

from __future__ import annotations

import inspect
import sys
import threading
import time
from typing import Any

import pytest
from conftest import AwsTestEnv
from pydantic import BaseModel
from worker_helpers import FAST, HANG_GUARD, collect_journal, prepare, read_view, running

from sqs_lease import App, JobContext, JobState, OwnershipUnknown, Producer, Worker, _clock
from sqs_lease._aio import AsyncDriver
from sqs_lease._aws import SyncDriver
from sqs_lease._clock import CLOCK_NAME, lease_clock, pick_clock


class _Machine:
    """A stand-in for the ``time`` module of a machine that can be suspended.

    ``monotonic`` stops while suspended (Linux's CLOCK_MONOTONIC); BOOTTIME goes on.
    """

    CLOCK_BOOTTIME = 7

    def __init__(self, *, boottime: bool = True, refuse: bool = False) -> None:
        self.awake = 100.0
        self.asleep = 0.0
        self.refuse = refuse
        if not boottime:
            self.CLOCK_BOOTTIME = None  # type: ignore[assignment]

    def monotonic(self) -> float:
        return self.awake

    def clock_gettime(self, clock_id: int) -> float:
        assert clock_id == 7
        if self.refuse:
            raise OSError(22, "Invalid argument")  # a kernel that names the clock but lacks it
        return self.awake + self.asleep

    def run(self, seconds: float) -> None:
        self.awake += seconds

    def suspend(self, seconds: float) -> None:
        self.asleep += seconds


def test_boottime_is_chosen_where_the_platform_has_it_and_counts_a_suspend() -> None:
    machine = _Machine()
    name, clock = pick_clock(machine)
    assert name == "CLOCK_BOOTTIME"
    t0 = clock()
    machine.run(1.0)
    machine.suspend(3600.0)  # a laptop lid, a frozen VM: SQS's clock went on meanwhile
    assert clock() - t0 == 3601.0
    assert machine.monotonic() - 100.0 == 1.0  # what the monotonic clock would have said


@pytest.mark.parametrize(
    "machine", [_Machine(boottime=False), _Machine(refuse=True)], ids=["absent", "refused"]
)
def test_without_a_working_boottime_the_clock_falls_back_to_monotonic(machine: _Machine) -> None:
    name, clock = pick_clock(machine)
    assert name == "monotonic"
    t0 = clock()
    machine.run(2.5)
    assert clock() - t0 == 2.5


@pytest.mark.skipif(not hasattr(time, "CLOCK_BOOTTIME"), reason="no CLOCK_BOOTTIME here")
def test_this_platform_uses_boottime() -> None:
    assert CLOCK_NAME == "CLOCK_BOOTTIME"
    before = time.clock_gettime(time.CLOCK_BOOTTIME)
    now = lease_clock()
    assert before <= now <= time.clock_gettime(time.CLOCK_BOOTTIME)


def test_the_lease_clock_never_goes_backwards() -> None:
    readings = [lease_clock() for _ in range(1000)]
    assert readings == sorted(readings)


def test_the_drivers_stamp_outcomes_on_the_lease_clock() -> None:
    for driver in (SyncDriver, AsyncDriver):
        assert inspect.signature(driver).parameters["clock"].default is lease_clock


def test_nothing_else_in_the_package_reads_a_monotonic_clock_for_leases() -> None:
    # One function in one place: the worker shells (their shared base) and the
    # drivers import lease_clock; no shell reads a clock of its own for a lease.
    import sqs_lease._aio
    import sqs_lease._aio_worker
    import sqs_lease._aws
    import sqs_lease._jobs
    import sqs_lease._shell
    import sqs_lease._worker

    shells = (sqs_lease._worker, sqs_lease._aio_worker, sqs_lease._shell)
    for module in (*shells, sqs_lease._aws, sqs_lease._aio, sqs_lease._jobs):
        source = inspect.getsource(module)
        assert "time.monotonic" not in source, module.__name__
        assert "perf_counter" not in source, module.__name__
    assert "lease_clock" in sys.modules["sqs_lease._shell"].__dict__


class Work(BaseModel):
    n: int


def test_the_worker_its_drivers_and_the_context_measure_leases_on_the_lease_clock(
    aws: AwsTestEnv, ddb_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A suspend only the lease clock sees (it jumps a lease ahead) stops the attempt.

    Were the worker, its drivers or the handler's context on the monotonic clock,
    the jump would go unseen and the handler's check would pass.
    """
    real = _clock._read
    jump = [0.0]
    monkeypatch.setattr(_clock, "_read", lambda: real() + jump[0])
    settings, _, _ = prepare(aws.endpoint_url, aws.prefix)
    app = App()
    inside = threading.Event()
    resumed = threading.Event()
    seen: dict[str, Any] = {}

    @app.job("sleepy", payload=Work, **FAST | {"lease_seconds": 20, "heartbeat_seconds": 5.0})
    def sleepy(ctx: JobContext[Any], p: Work) -> dict[str, int]:
        seen["context_clock"] = ctx._clock
        ctx.check()  # the lease is fresh
        inside.set()
        assert resumed.wait(HANG_GUARD)
        try:
            ctx.check()
        except OwnershipUnknown as exc:
            seen["after_jump"] = str(exc)
            raise
        return {"n": p.n}

    job_id = Producer(settings, app).submit("sleepy", Work(n=1), job_id=f"{aws.prefix}-c").job_id
    worker = Worker(app, settings, worker_id=f"w-{aws.prefix}", receive_wait=1, shutdown_grace=5)
    assert worker._clock is lease_clock
    assert worker.driver.clock is lease_clock and worker.poll_driver.clock is lease_clock
    with collect_journal() as journal, running(worker) as (runner,):
        assert inside.wait(HANG_GUARD)
        jump[0] = 3600.0  # the machine slept an hour; CLOCK_MONOTONIC would not know
        resumed.set()
        journal.wait_for("job_abandoned", job_id=job_id, timeout=20)
        runner.stop()
    assert seen["context_clock"] is lease_clock
    assert "lease reserve spent" in seen["after_jump"] or "no longer held" in seen["after_jump"]
    assert journal.events("result_committed", job_id=job_id) == []
    assert read_view(ddb_client, settings, job_id).state is not JobState.SUCCEEDED
