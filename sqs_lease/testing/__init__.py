"""Test your handlers against takeovers and lost responses: the public testing kit.

Everything here runs on the embedded emulator (moto on 127.0.0.1), with the real
worker, the real queue and tables, and the real fence; nothing is mocked away.
With pytest, load the plugin in your ``conftest.py``::

    pytest_plugins = ["sqs_lease.testing.pytest_plugin"]

and use its fixtures (``lease_endpoint``, ``lease_env``). Without pytest, use
:func:`emulator` and :func:`make_env` directly. The worked example is in
docs/testing.md ("Testing your handlers").

What the kit offers:

- :class:`LeaseEnv`: settings with a fresh prefix, the queue (with DLQ) and the
  tables created; ``submit``, ``worker``, ``record``, ``deliver_twice``.
- :class:`Faults` for one worker: ``pause``/``resume`` (its AWS calls wait, as a
  paused process's would), ``cut``/``restore`` (its AWS calls fail as unreachable),
  ``lose_next_response(op)`` (the next call of that operation is applied, and its
  answer lost).
- :class:`ShiftedClock`: the toolkit's own timers of one worker (leases, heartbeat,
  watchdog) moved forward on demand.
- :class:`FencedTarget`: a fake outside system with a fence per job and idempotency
  keys, a :attr:`~FencedTarget.ledger` of every effect applied, and a ``check`` for
  reconciliation.
- Assertions: :func:`assert_no_effect_applied_twice`,
  :func:`assert_every_job_terminal_or_parked`.
- :func:`read_journal`: the events of journal files (a worker's stderr).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from botocore.exceptions import EndpointConnectionError, ReadTimeoutError
from pydantic import BaseModel

from .._aws import classify
from .._clock import lease_clock
from .._config import Settings
from .._core.calls import Call, Outcome
from .._core.flows import message_body
from .._core.intents import CheckAnswer, IntentView, Verdict
from .._core.records import JobState, JobView
from .._jobs import App, EffectCall
from .._journal import read_journal
from .._local import local_credentials_env, spawn_local_server, stop_local_server
from .._producer import Producer
from .._resources import create_queue, create_tables
from .._schema import view_of
from .._worker import Worker

__all__ = [
    "Applied",
    "Faults",
    "FencedTarget",
    "LeaseEnv",
    "ShiftedClock",
    "StaleFence",
    "assert_every_job_terminal_or_parked",
    "assert_no_effect_applied_twice",
    "emulator",
    "make_env",
    "read_journal",
]


@contextmanager
def emulator() -> Iterator[str]:
    """Run the embedded emulator (moto, its own process, 127.0.0.1) for the block;
    yield its endpoint URL. Dummy credentials are what it needs: set them with
    ``local_credentials_env()`` (the pytest plugin does)."""
    proc, endpoint = spawn_local_server()
    try:
        yield endpoint
    finally:
        stop_local_server(proc)


def credentials_env() -> dict[str, str]:
    """Dummy credentials and region for the emulator (never real ones)."""
    return {**local_credentials_env(), "AWS_DEFAULT_REGION": "us-east-1"}


@dataclass
class LeaseEnv:
    """One test's queue (with DLQ) and tables on the emulator, under a fresh prefix."""

    settings: Settings
    queue_url: str
    dlq_url: str
    workers: list[Worker] = field(default_factory=list)

    def submit(
        self, app: App, job_class: str, payload: BaseModel | Mapping[str, Any], **kw: Any
    ) -> str:
        """Submit a job; return its id (``kw``: ``job_id``, ``group``, ...)."""
        return Producer(self.settings, app).submit(job_class, payload, **kw).job_id

    def worker(self, app: App, name: str, **kw: Any) -> Worker:
        """A thread worker on this env (short receive wait), stopped by :meth:`stop_all`."""
        kw.setdefault("receive_wait", 1)
        kw.setdefault("shutdown_grace", 3.0)
        w = Worker(app, self.settings, worker_id=name, **kw)
        self.workers.append(w)
        return w

    @contextmanager
    def running(self, *workers: Worker) -> Iterator[None]:
        """Run workers in threads for the block; stop and join them at its end."""
        threads = [
            threading.Thread(target=w.run, name=f"kit-{w.worker_id}", daemon=True) for w in workers
        ]
        for t in threads:
            t.start()
        try:
            yield
        finally:
            for w in workers:
                w.stop()
            for t in threads:
                t.join(30.0)

    def record(self, job_id: str) -> JobView:
        """The job's record as the toolkit reads it (a consistent read)."""
        item = (
            self._ddb()
            .get_item(
                TableName=self.settings.jobs_table,
                Key={"job_id": {"S": job_id}},
                ConsistentRead=True,
            )
            .get("Item")
        )
        if item is None:
            raise AssertionError(f"no job record {job_id!r}")
        return view_of(item)

    def deliver_twice(self, job_id: str) -> None:
        """Send the job's current message once more (SQS delivers at least once)."""
        view = self.record(job_id)
        body = message_body(view.job_id, view.job_class, view.stage, view.send_id)
        self._sqs().send_message(QueueUrl=self.queue_url, MessageBody=body)

    def wait_for(
        self, predicate: Callable[[], bool], *, timeout: float = 30.0, what: str = "a condition"
    ) -> None:
        """Poll ``predicate`` until true; fail naming ``what`` after ``timeout`` (a
        hang guard, not a measure of speed)."""
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() >= deadline:
                raise AssertionError(f"timed out after {timeout} s waiting for {what}")
            time.sleep(0.05)

    def wait_until_final(self, *job_ids: str, timeout: float = 60.0) -> None:
        """Wait until every job is terminal or parked."""

        def final() -> bool:
            return all(
                (v := self.record(j).state).terminal or v is JobState.PARKED for j in job_ids
            )

        self.wait_for(final, timeout=timeout, what=f"jobs {list(job_ids)} to end")

    def _ddb(self) -> Any:
        from .._aws import make_client

        return make_client(self.settings, "dynamodb")

    def _sqs(self) -> Any:
        from .._aws import make_client

        return make_client(self.settings, "sqs")


def make_env(endpoint_url: str, prefix: str | None = None, **queue: Any) -> LeaseEnv:
    """Create the queue (with DLQ) and the tables under ``prefix`` (default: fresh)."""
    settings = Settings(endpoint_url=endpoint_url, prefix=prefix or f"t{uuid.uuid4().hex[:10]}")
    create_tables(settings)
    url, dlq = create_queue(settings, **queue)
    return LeaseEnv(settings, url, dlq)


# --------------------------------------------------------------------------- faults


class Faults:
    """Faults applied to one thread worker's AWS traffic (its every driver).

    Apply them before or while the worker runs. They act where the worker meets
    AWS, so the protocol sees what a real fault would show it: a paused worker's
    calls wait, a cut worker's calls fail as unreachable, a lost response is a call
    that applied and whose answer never came (outcome unknown).
    """

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self._running = threading.Event()
        self._running.set()
        self._cut = False
        self._lose: dict[str, int] = {}
        self._mutex = threading.Lock()
        self.lost: list[Call] = []
        for driver in (worker.driver, worker.poll_driver):
            self._wrap(driver)

    def _wrap(self, driver: Any) -> None:
        real: Callable[[Call], Outcome] = driver.execute

        def execute(c: Call) -> Outcome:
            self._running.wait()
            sent = driver.clock()
            where = "kit-fault"
            if self._cut:
                return classify(EndpointConnectionError(endpoint_url=where), sent, driver.clock())
            out = real(c)
            with self._mutex:
                left = self._lose.get(c.op, 0)
                if left:
                    self._lose[c.op] = left - 1
                    self.lost.append(c)
                    err = ReadTimeoutError(endpoint_url=where)
                    return classify(err, sent, driver.clock())
            return out

        driver.execute = execute

    def pause(self) -> None:
        """Hold every AWS call of the worker (its heartbeat too) until :meth:`resume`,
        as a paused process's would be: its leases lapse and another worker may take
        its jobs over. Its handlers keep running until their next AWS call."""
        self._running.clear()

    def resume(self) -> None:
        self._running.set()

    def cut(self) -> None:
        """Every AWS call of the worker fails as unreachable until :meth:`restore`."""
        self._cut = True

    def restore(self) -> None:
        self._cut = False

    def lose_next_response(self, op: str, times: int = 1) -> None:
        """The next ``times`` calls to ``op`` (``UpdateItem``, ``DeleteMessage``, ...)
        are applied by AWS and their answers lost (read timeout): outcome unknown."""
        with self._mutex:
            self._lose[op] = self._lose.get(op, 0) + times


class ShiftedClock:
    """The lease clock of one worker, moved forward on demand (its leases, heartbeat
    schedule, watchdog and handler contexts read it; SQS and DynamoDB keep their own).

    ``clock.advance(10)`` makes the worker see 10 s more than have passed: its local
    leases run out early, as a worker's whose process stalled would.
    """

    def __init__(self, base: Callable[[], float] = lease_clock) -> None:
        self._base = base
        self.offset = 0.0

    def __call__(self) -> float:
        return self._base() + self.offset

    def advance(self, seconds: float) -> None:
        self.offset += seconds

    def install(self, worker: Worker) -> ShiftedClock:
        """Make this the worker's lease clock (before it runs)."""
        worker._clock = self
        for driver in (worker.driver, worker.poll_driver):
            driver.clock = self
        return self


# --------------------------------------------------------------------------- target


class StaleFence(Exception):
    """The fenced target refused a call: a newer token of the job was seen."""


@dataclass(frozen=True)
class Applied:
    """One effect the target applied: the key, the job (fence scope), token, payload."""

    key: str
    job_id: str
    token: int
    payload: Mapping[str, Any]
    external_id: str


class FencedTarget:
    """A fake outside system that applies effects, fenced and idempotent, in memory.

    Per job (the fence's scope) it keeps the highest token it accepted and refuses
    lower ones (:class:`StaleFence`); a repeated key replays the first response; every
    effect applied is in :attr:`ledger`. :meth:`call` is a tool for ``ctx.effect``;
    :meth:`check` answers reconciliation (declare it: ``app.target(name,
    check=target.check, key_retention_seconds=...)``).
    """

    def __init__(self, name: str = "target") -> None:
        self.name = name
        self.ledger: list[Applied] = []
        self.refused: list[tuple[str, int]] = []
        self._marks: dict[str, int] = {}
        self._done: dict[str, Applied] = {}
        self._mutex = threading.Lock()

    def call(self, ec: EffectCall) -> dict[str, Any]:
        """Apply the effect once per key, only for the job's newest token seen."""
        with self._mutex:
            mark = self._marks.get(ec.job_id, 0)
            if ec.token < mark:
                self.refused.append((ec.job_id, ec.token))
                raise StaleFence(f"job {ec.job_id}: token {ec.token} < {mark}")
            self._marks[ec.job_id] = ec.token
            done = self._done.get(ec.key)
            if done is None:
                done = Applied(ec.key, ec.job_id, ec.token, dict(ec.payload), uuid.uuid4().hex)
                self._done[ec.key] = done
                self.ledger.append(done)
            return {"id": done.external_id}

    def check(self, intent: IntentView) -> CheckAnswer:
        """Whether the intent's key was applied here."""
        with self._mutex:
            done = self._done.get(intent.key)
        if done is None:
            return CheckAnswer(Verdict.NOT_APPLIED)
        return CheckAnswer(Verdict.CONFIRMED, external_id=done.external_id)


# --------------------------------------------------------------------------- assertions


def assert_no_effect_applied_twice(
    target: FencedTarget, by: Callable[[Applied], Any] | None = None
) -> None:
    """Fail if the target applied one effect twice: two ledger rows with the same key,
    or the same ``by(row)`` (a business identity, e.g. the invoice) where given."""
    seen: dict[Any, Applied] = {}
    for row in target.ledger:
        ident = row.key if by is None else by(row)
        if ident in seen:
            raise AssertionError(
                f"effect {ident!r} applied twice: token {seen[ident].token} and {row.token}"
            )
        seen[ident] = row


def assert_every_job_terminal_or_parked(env: LeaseEnv, job_ids: Sequence[str]) -> None:
    """Fail naming each job that is neither terminal (succeeded, failed) nor parked."""
    open_jobs = {}
    for job_id in job_ids:
        view = env.record(job_id)
        if not (view.state.terminal or view.state is JobState.PARKED):
            open_jobs[job_id] = view.state.value
    if open_jobs:
        raise AssertionError(f"jobs not terminal or parked: {open_jobs}")
