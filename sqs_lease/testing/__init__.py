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
  tables created; ``submit``, ``worker`` (thread or async shell), ``running``,
  ``record``, ``deliver_twice``, ``wait_for``, ``wait_until_final``.
- :func:`running` / :class:`WorkerRunner`: workers run in threads, their errors
  surfaced when stopped; :func:`wait_for`: a polling hang guard; :data:`SHORT_LEASE`.
- :class:`Faults` for one worker of either shell: ``pause``/``resume`` (its AWS calls wait, as a
  paused process's would), ``cut``/``restore`` (its AWS calls fail as unreachable),
  ``lose_next_response(step)`` (the next call of that step, ``claim``, ``heartbeat``,
  ``effect_start``, ``effect_confirm``, ``commit`` or ``delete`` (:data:`FAULT_STEPS`), is
  applied, and its answer lost).
- :class:`ShiftedClock`: the toolkit's own timers of one worker (leases, heartbeat,
  watchdog) moved forward on demand.
- :class:`FencedTarget`: a fake outside system with a fence per job and idempotency
  keys, a :attr:`~FencedTarget.ledger` of every effect applied, and a ``check`` for
  reconciliation.
- Assertions: :func:`assert_no_effect_applied_twice`,
  :func:`assert_every_job_terminal_or_parked`.
- :func:`read_journal`: the events of journal files (a worker's stderr).
- :func:`simulate`: your handlers in the deterministic simulator, one random fault
  schedule per seed, every invariant a schedule broke with the :func:`replay` call
  that reproduces it (what the simulated world covers: its docstring).
"""

from __future__ import annotations

import importlib
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .._clock import lease_clock
from .._errors import FenceRefused

# Loading the kit (its pytest plugin is loaded in every pytest run of an environment
# that installs the package) imports no worker, boto3, moto or simulator: each part
# is imported where a function or fixture first needs it, and the names below on
# first use (module ``__getattr__``).
if TYPE_CHECKING:
    from pydantic import BaseModel

    from .._aio_worker import AsyncWorker
    from .._config import Settings
    from .._core.calls import Call, Outcome
    from .._core.intents import CheckAnswer, IntentView
    from .._core.records import JobView
    from .._jobs import App, EffectCall, JobPolicy
    from .._journal import read_journal
    from .._shell import WorkerStats
    from .._worker import Worker
    from ._simulate import SeedFailure, SimulationReport, replay, simulate

    AnyWorker = Worker | AsyncWorker
    SHELLS: dict[str, type[Worker] | type[AsyncWorker]]

_WHERE = {
    "read_journal": ".._journal",
    "SeedFailure": "._simulate",
    "SimulationReport": "._simulate",
    "replay": "._simulate",
    "simulate": "._simulate",
}

__all__ = [
    "FAULT_STEPS",
    "HANG_GUARD",
    "SHELLS",
    "SHORT_LEASE",
    "Applied",
    "Faults",
    "FencedTarget",
    "LeaseEnv",
    "SeedFailure",
    "ShiftedClock",
    "SimulationReport",
    "StaleFence",
    "WorkerRunner",
    "assert_every_job_terminal_or_parked",
    "assert_no_effect_applied_twice",
    "emulator",
    "job_item",
    "make_env",
    "read_journal",
    "replay",
    "running",
    "simulate",
    "wait_for",
]


def __getattr__(name: str) -> Any:
    if name == "SHELLS":
        value: Any = _shells()
    elif name in _WHERE:
        value = getattr(importlib.import_module(_WHERE[name], __name__), name)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value  # the next use is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


HANG_GUARD = 120.0
"""Every wait's default bound, in seconds: a hang guard sized for a loaded CI machine,
never a speed check (a wait that succeeds returns as soon as its condition holds)."""


def _shells() -> dict[str, type[Worker] | type[AsyncWorker]]:
    """``SHELLS``: the worker shells (same constructor, same ``run``/``stop``):
    ``LeaseEnv.worker``'s ``shell``; the async one needs the ``async`` extra."""
    from .._aio_worker import AsyncWorker
    from .._worker import Worker

    return {"thread": Worker, "async": AsyncWorker}


SHORT_LEASE: JobPolicy = {
    "lease_seconds": 3,
    "heartbeat_seconds": 1.0,
    "jitter_seconds": 0.5,
    "missed_heartbeats": 2,
}
"""A short lease for tests that keeps the timing rule (3 > 2 x 1 + 0.5 and 1 <= 3 / 2):
``@app.job("charge", payload=Charge, **SHORT_LEASE)``; takeovers come within seconds."""


def wait_for(
    predicate: Callable[[], bool],
    timeout: float = HANG_GUARD,
    what: str = "a condition",
    interval: float = 0.05,
) -> None:
    """Poll ``predicate`` until true; fail naming ``what`` after ``timeout`` seconds (a
    hang guard, not a measure of speed)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


class WorkerRunner:
    """Runs ``worker.run(**run_kwargs)`` in a thread; :meth:`stop` and :meth:`join`
    re-raise what the worker raised, so a crashed worker fails the test."""

    def __init__(self, worker: AnyWorker, **run_kwargs: Any) -> None:
        self.worker = worker
        self.run_kwargs = run_kwargs
        self.stats: WorkerStats | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(
            target=self._main, name=f"runner-{worker.worker_id}", daemon=True
        )

    def _main(self) -> None:
        try:
            self.stats = self.worker.run(**self.run_kwargs)
        except BaseException as exc:  # surfaced by join()
            self.error = exc

    def start(self) -> WorkerRunner:
        self.thread.start()
        return self

    def join(self, timeout: float) -> WorkerStats:
        """Wait for the worker's end (a hang guard); its counters, or its error raised."""
        self.thread.join(timeout)
        if self.thread.is_alive():
            raise AssertionError(f"worker {self.worker.worker_id} still running after {timeout} s")
        if self.error is not None:
            raise self.error
        assert self.stats is not None
        return self.stats

    def stop(self, timeout: float = HANG_GUARD) -> WorkerStats:
        """Ask the worker to stop (a graceful shutdown) and join it."""
        self.worker.stop()
        return self.join(timeout)


@contextmanager
def running(*workers: AnyWorker, **run_kwargs: Any) -> Iterator[list[WorkerRunner]]:
    """Run workers in threads for the block (``run_kwargs`` go to ``run``); always
    stop and join them at its end."""
    runners = [WorkerRunner(w, **run_kwargs).start() for w in workers]
    try:
        yield runners
    finally:
        for r in runners:
            r.worker.stop()
        for r in runners:
            r.thread.join(HANG_GUARD)


def job_item(ddb: Any, settings: Settings, job_id: str) -> dict[str, Any] | None:
    """A job record's DynamoDB item (a consistent read), None when there is none;
    ``view_of(item)`` is the toolkit's reading of it."""
    got = ddb.get_item(
        TableName=settings.jobs_table, Key={"job_id": {"S": job_id}}, ConsistentRead=True
    )
    item = got.get("Item")
    return None if item is None else dict(item)


@contextmanager
def emulator() -> Iterator[str]:
    """Run the embedded emulator (moto, its own process, 127.0.0.1) for the block;
    yield its endpoint URL. Dummy credentials are what it needs: set them with
    ``local_credentials_env()`` (the pytest plugin does)."""
    from .._local import spawn_local_server, stop_local_server

    proc, endpoint = spawn_local_server()
    try:
        yield endpoint
    finally:
        stop_local_server(proc)


def credentials_env() -> dict[str, str]:
    """Dummy credentials and region for the emulator (never real ones)."""
    from .._local import local_credentials_env

    return {**local_credentials_env(), "AWS_DEFAULT_REGION": "us-east-1"}


@dataclass
class LeaseEnv:
    """One test's queue (with DLQ) and tables on the emulator, under a fresh prefix."""

    settings: Settings
    queue_url: str
    dlq_url: str
    workers: list[AnyWorker] = field(default_factory=list)

    def submit(
        self, app: App, job_class: str, payload: BaseModel | Mapping[str, Any], **kw: Any
    ) -> str:
        """Submit a job; return its id (``kw``: ``job_id``, ``group``, ...)."""
        from .._producer import Producer

        return Producer(self.settings, app).submit(job_class, payload, **kw).job_id

    def worker(self, app: App, name: str, *, shell: str = "thread", **kw: Any) -> AnyWorker:
        """A worker on this env (short receive wait) in ``shell`` (``thread`` or
        ``async``, :data:`SHELLS`); the plugin's ``lease_env`` stops it after the test."""
        shells = _shells()
        if shell not in shells:
            raise ValueError(f"shell={shell!r}: use one of {sorted(shells)}")
        kw.setdefault("receive_wait", 1)
        kw.setdefault("shutdown_grace", 3.0)
        w = shells[shell](app, self.settings, worker_id=name, **kw)
        self.workers.append(w)
        return w

    @contextmanager
    def running(self, *workers: AnyWorker) -> Iterator[list[WorkerRunner]]:
        """Run workers in threads for the block; stop and join them at its end
        (:func:`running`)."""
        with running(*workers) as runners:
            yield runners

    def record(self, job_id: str) -> JobView:
        """The job's record as the toolkit reads it (a consistent read)."""
        from .._schema.views import view_of

        item = job_item(self._ddb(), self.settings, job_id)
        if item is None:
            raise AssertionError(f"no job record {job_id!r}")
        return view_of(item)

    def deliver_twice(self, job_id: str) -> None:
        """Send the job's current message once more (SQS delivers at least once)."""
        from .._core.messages import message_body

        view = self.record(job_id)
        body = message_body(view.job_id, view.job_class, view.stage, view.send_id)
        self._sqs().send_message(QueueUrl=self.queue_url, MessageBody=body)

    def wait_for(
        self,
        predicate: Callable[[], bool],
        *,
        timeout: float = HANG_GUARD,
        what: str = "a condition",
    ) -> None:
        """Poll ``predicate`` until true (:func:`wait_for`)."""
        wait_for(predicate, timeout, what)

    def wait_until_final(self, *job_ids: str, timeout: float = HANG_GUARD) -> None:
        """Wait until every job is terminal or parked."""
        from .._core.records import JobState

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
    from .._config import Settings
    from .._resources import create_queue, create_tables

    settings = Settings(endpoint_url=endpoint_url, prefix=prefix or f"t{uuid.uuid4().hex[:10]}")
    create_tables(settings)
    url, dlq = create_queue(settings, **queue)
    return LeaseEnv(settings, url, dlq)


# --------------------------------------------------------------------------- faults

FAULT_STEPS: Mapping[str, str] = {
    "claim": "the claim: the conditional write that makes the worker the job's owner "
    "(its token + 1)",
    "heartbeat": "a heartbeat's lease extension: the visibility of the messages the "
    "worker holds, extended in one batch",
    "effect_start": "an effect's start: the transaction that marks its intent in "
    "progress, fenced on the token, before the tool is called",
    "effect_confirm": "an effect's confirm: the transaction that records the tool's "
    "answer (or the reconciling check's) on the intent",
    "commit": "the handler's result written: the job's success, or a stage's checkpoint "
    "(NextStage)",
    "delete": "the delete of an ended job's message (DeleteMessage or DeleteMessageBatch)",
}
"""The steps :meth:`Faults.lose_next_response` names, each with the call it loses."""


def _assigned(params: Mapping[str, Any], attribute: str) -> str | None:
    """The string an update's SET gives ``attribute`` (None: not set, or not a string)."""
    names = params.get("ExpressionAttributeNames") or {}
    values = params.get("ExpressionAttributeValues") or {}
    for placeholder, value in re.findall(r"(#\w+) = (:\w+)", params.get("UpdateExpression", "")):
        if names.get(placeholder) == attribute:
            got = values.get(value, {}).get("S")
            return got if isinstance(got, str) else None
    return None


def _steps_of(c: Call, tables: tuple[str, str]) -> set[str]:
    """The protocol steps (:data:`FAULT_STEPS`) a call is, read from its parameters:
    ``tables`` are the worker's jobs and intents tables."""
    jobs, intents = tables
    p = c.params
    if c.op == "UpdateItem" and p.get("TableName") == jobs:
        state = _assigned(p, "state")
        if state == "running":
            return {"claim"}
        if state == "succeeded" or (state == "queued" and _assigned(p, "stage_input")):
            return {"commit"}
    elif c.op == "TransactWriteItems":
        for item in p.get("TransactItems", ()):
            update = item.get("Update") or {}
            if update.get("TableName") != intents:
                continue
            state = _assigned(update, "state")
            if state == "in_progress":
                return {"effect_start"}
            if state == "confirmed":
                return {"effect_confirm"}
    elif c.op == "ChangeMessageVisibilityBatch":
        # A hand-back makes its messages visible at once (0); a heartbeat extends them.
        entries = p.get("Entries", ())
        if entries and all(e.get("VisibilityTimeout", 0) > 0 for e in entries):
            return {"heartbeat"}
    elif c.op in ("DeleteMessage", "DeleteMessageBatch"):
        return {"delete"}
    return set()


_AWS_OPERATIONS: set[str] = set()


def _check_fault_name(name: str) -> None:
    """A step of :data:`FAULT_STEPS`, or an SQS or DynamoDB operation; else a
    ConfigError naming the steps (and the nearest one)."""
    import difflib

    if name in FAULT_STEPS:
        return
    if not _AWS_OPERATIONS:
        import botocore.session

        session = botocore.session.get_session()
        for service in ("sqs", "dynamodb"):
            _AWS_OPERATIONS.update(session.get_service_model(service).operation_names)
    if name in _AWS_OPERATIONS:
        return
    near = difflib.get_close_matches(name, [*FAULT_STEPS, *_AWS_OPERATIONS], n=1, cutoff=0.6)
    hint = f"did you mean {near[0]!r}? " if near else ""
    from .._errors import ConfigError

    raise ConfigError(
        f"lose_next_response({name!r}): no such step; {hint}the steps are: "
        f"{', '.join(FAULT_STEPS)} (or, advanced, an SQS or DynamoDB operation's name, "
        "e.g. 'UpdateItem')"
    )


class Faults:
    """Faults applied to one worker's AWS traffic (its every driver), thread or async.

    Apply them before or while the worker runs. They act where the worker meets
    AWS, so the protocol sees what a real fault would show it: a paused worker's
    calls wait, a cut worker's calls fail as unreachable, a lost response is a call
    that applied and whose answer never came (outcome unknown). The async worker
    builds its drivers when it runs: the faults wrap them then.
    """

    def __init__(self, worker: AnyWorker) -> None:
        from .._aio_worker import AsyncWorker

        self.worker = worker
        self._running = threading.Event()
        self._running.set()
        self._cut = False
        self._lose: dict[str, int] = {}
        self._mutex = threading.Lock()
        self._tables = (worker.settings.jobs_table, worker.settings.intents_table)
        self.lost: list[Call] = []
        if isinstance(worker, AsyncWorker):
            worker._driver_hooks.append(self._wrap_async)
        else:
            for driver in (worker.driver, worker.poll_driver):
                self._wrap(driver)

    def _cut_outcome(self, sent: float, clock: Callable[[], float]) -> Outcome | None:
        if not self._cut:
            return None
        from botocore.exceptions import EndpointConnectionError

        from .._aws import classify

        return classify(EndpointConnectionError(endpoint_url="kit-fault"), sent, clock())

    def _after(self, c: Call, out: Outcome, sent: float, clock: Callable[[], float]) -> Outcome:
        with self._mutex:
            if not self._lose:
                return out
            names = {c.op} | _steps_of(c, self._tables)
            name = next((n for n in self._lose if n in names), None)
            if name is None:
                return out
            self._lose[name] -= 1
            if not self._lose[name]:
                del self._lose[name]
            self.lost.append(c)
        from botocore.exceptions import ReadTimeoutError

        from .._aws import classify

        return classify(ReadTimeoutError(endpoint_url="kit-fault"), sent, clock())

    def _wrap(self, driver: Any) -> None:
        real: Callable[[Call], Outcome] = driver.execute

        def execute(c: Call) -> Outcome:
            self._running.wait()
            sent = driver.clock()
            cut = self._cut_outcome(sent, driver.clock)
            if cut is not None:
                return cut
            return self._after(c, real(c), sent, driver.clock)

        driver.execute = execute

    def _wrap_async(self, driver: Any) -> None:
        import asyncio

        real: Callable[[Call], Any] = driver.execute

        async def execute(c: Call) -> Outcome:
            while not self._running.is_set():
                await asyncio.sleep(0.02)  # paused: the call waits, the loop does not
            sent = driver.clock()
            cut = self._cut_outcome(sent, driver.clock)
            if cut is not None:
                return cut
            return self._after(c, await real(c), sent, driver.clock)

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

    def lose_next_response(self, step: str, times: int = 1) -> None:
        """The next ``times`` calls of ``step`` are applied by AWS and their answers lost
        (a read timeout): the worker cannot tell whether they applied.

        ``step`` is one of :data:`FAULT_STEPS`: ``claim``, ``heartbeat``,
        ``effect_start``, ``effect_confirm``, ``commit``, ``delete``. Advanced: an
        AWS operation's name (``UpdateItem``, ``TransactWriteItems``,
        ``DeleteMessageBatch``, ...) loses the next call of that operation, whichever
        step sent it. Any other name is a :class:`~sqs_lease.ConfigError` listing
        the steps. Every call lost is in :attr:`lost`."""
        _check_fault_name(step)
        with self._mutex:
            self._lose[step] = self._lose.get(step, 0) + times


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

    def install(self, worker: AnyWorker) -> ShiftedClock:
        """Make this the worker's lease clock (before it runs; thread or async)."""
        from .._worker import Worker

        worker._clock = self
        if isinstance(worker, Worker):
            for driver in (worker.driver, worker.poll_driver):
                driver.clock = self
        return self


# --------------------------------------------------------------------------- target


class StaleFence(FenceRefused):
    """The fenced target refused a call: a newer token of the job was seen (a
    ``FenceRefused``, so the worker ends the attempt as a lease loss, as it does for a
    real receiver's 412)."""


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
        from .._core.intents import CheckAnswer, Verdict

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
    from .._core.records import JobState

    open_jobs = {}
    for job_id in job_ids:
        view = env.record(job_id)
        if not (view.state.terminal or view.state is JobState.PARKED):
            open_jobs[job_id] = view.state.value
    if open_jobs:
        raise AssertionError(f"jobs not terminal or parked: {open_jobs}")
