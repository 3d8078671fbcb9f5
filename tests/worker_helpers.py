"""Helpers for the worker integration tests: journal collector, worker runner, record reads."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from sqs_lease import AsyncWorker, Settings, Worker, WorkerStats, create_queue, create_tables
from sqs_lease._core.records import JobView
from sqs_lease._journal import LOGGER_NAME
from sqs_lease._schema import JobRecord, record_of, view_of

if TYPE_CHECKING:
    from types_boto3_dynamodb import DynamoDBClient
    from types_boto3_sqs import SQSClient

FAST: dict[str, Any] = {
    "lease_seconds": 3,
    "heartbeat_seconds": 1.0,
    "jitter_seconds": 0.5,
    "missed_heartbeats": 2,
}
"""A short lease that keeps the timing rule: 3 > 2 x 1 + 0.5 and 1 <= 3 / 2."""

Event = dict[str, Any]

SHELLS: dict[str, Any] = {"thread": Worker, "async": AsyncWorker}
"""The worker shells every integration test runs against (same constructor, same run/stop)."""


def use_shell(module: str) -> Any:
    """An autouse fixture for a test module: its ``Shell`` is each worker shell in turn.

    The module builds workers with ``Shell(app, settings, ...)``; tests run once with
    the thread worker and once with the async worker (``-k thread`` / ``-k async``).
    """

    @pytest.fixture(autouse=True, params=sorted(SHELLS, reverse=True))
    def shell(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
        monkeypatch.setattr(sys.modules[module], "Shell", SHELLS[request.param])
        return str(request.param)

    return shell


def prepare(endpoint_url: str, prefix: str) -> tuple[Settings, str, str]:
    """Settings for one test, with its table and queue (plus DLQ) created."""
    settings = Settings(endpoint_url=endpoint_url, prefix=prefix)
    create_tables(settings)
    url, dlq = create_queue(settings)
    return settings, url, dlq


HANG_GUARD = 120.0
"""The least any wait in these tests allows. A wait's timeout is a hang guard, never
a timing check: a test asks for something that will happen, and on a shared machine
beside a CPU-bound job it may take far longer than the number its author had in
mind (10-20 s waits failed so under load). Only a failure pays the guard."""


def wait_until(
    predicate: Callable[[], bool], timeout: float, what: str, interval: float = 0.05
) -> None:
    """Poll ``predicate`` until true; fail naming ``what`` after ``timeout`` seconds
    (at least :data:`HANG_GUARD`)."""
    timeout = max(timeout, HANG_GUARD)
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


class JournalCollector(logging.Handler):
    """Collects journal events (parsed JSON) with the monotonic time they arrived."""

    def __init__(self) -> None:
        super().__init__(level=logging.DEBUG)
        self._events: list[Event] = []
        self._mutex = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        if record.name != LOGGER_NAME:
            return
        event: Event = json.loads(record.getMessage())
        event["_mono"] = time.monotonic()
        with self._mutex:
            self._events.append(event)

    def events(self, name: str | None = None, **match: Any) -> list[Event]:
        """Events named ``name`` (any if None) whose fields equal every ``match`` value."""
        with self._mutex:
            snapshot = list(self._events)
        return [
            e
            for e in snapshot
            if (name is None or e["event"] == name) and all(e.get(k) == v for k, v in match.items())
        ]

    def wait_for(
        self, name: str, *, count: int = 1, timeout: float = 10.0, **match: Any
    ) -> list[Event]:
        """Wait until at least ``count`` matching events arrived; return them (the
        timeout is at least :data:`HANG_GUARD`)."""
        timeout = max(timeout, HANG_GUARD)
        deadline = time.monotonic() + timeout
        while True:
            found = self.events(name, **match)
            if len(found) >= count:
                return found
            if time.monotonic() >= deadline:
                seen = [(e["event"], e.get("job_id"), e.get("token")) for e in self.events()]
                raise AssertionError(
                    f"timed out after {timeout} s waiting for {count} x {name} {match}; "
                    f"journal so far: {seen}"
                )
            time.sleep(0.05)

    def names(self, **match: Any) -> list[str]:
        return [str(e["event"]) for e in self.events(**match)]


@contextmanager
def collect_journal() -> Iterator[JournalCollector]:
    """Attach a collector to the journal logger (at INFO at least) for the block."""
    logger = logging.getLogger(LOGGER_NAME)
    collector = JournalCollector()
    old_level = logger.level
    if logger.getEffectiveLevel() > logging.INFO:
        logger.setLevel(logging.INFO)
    logger.addHandler(collector)
    try:
        yield collector
    finally:
        logger.removeHandler(collector)
        logger.setLevel(old_level)


class TextCapture(logging.Handler):
    """Keeps every record's rendered text (message, exception and stack) as one string."""

    def __init__(self) -> None:
        super().__init__(level=logging.DEBUG)
        self.setFormatter(logging.Formatter("%(name)s %(levelname)s %(message)s"))
        self.lines: list[str] = []
        self._mutex = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        text = self.format(record)
        with self._mutex:
            self.lines.append(text)

    def text(self) -> str:
        with self._mutex:
            return "\n".join(self.lines)


class WorkerRunner:
    """Runs ``worker.run(**kwargs)`` in a thread; ``stop``/``join`` re-raise its error."""

    def __init__(self, worker: Worker | AsyncWorker, **run_kwargs: Any) -> None:
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
        self.thread.join(timeout)
        if self.thread.is_alive():
            raise AssertionError(f"worker {self.worker.worker_id} still running after {timeout} s")
        if self.error is not None:
            raise self.error
        assert self.stats is not None
        return self.stats

    def stop(self, timeout: float = 20.0) -> WorkerStats:
        self.worker.stop()
        return self.join(timeout)


@contextmanager
def running(*workers: Worker | AsyncWorker, **run_kwargs: Any) -> Iterator[list[WorkerRunner]]:
    """Run workers in threads for the block; always stop them at the end."""
    runners = [WorkerRunner(w, **run_kwargs).start() for w in workers]
    try:
        yield runners
    finally:
        for r in runners:
            r.worker.stop()
        for r in runners:
            r.thread.join(30.0)


def read_item(ddb: DynamoDBClient, settings: Settings, job_id: str) -> dict[str, Any] | None:
    got = ddb.get_item(
        TableName=settings.jobs_table, Key={"job_id": {"S": job_id}}, ConsistentRead=True
    )
    item = got.get("Item")
    return None if item is None else dict(item)


def read_view(ddb: DynamoDBClient, settings: Settings, job_id: str) -> JobView:
    item = read_item(ddb, settings, job_id)
    assert item is not None, f"no record for job {job_id!r}"
    return view_of(item)


def read_record(ddb: DynamoDBClient, settings: Settings, job_id: str) -> JobRecord:
    item = read_item(ddb, settings, job_id)
    assert item is not None, f"no record for job {job_id!r}"
    return record_of(item)


def result_of(record: JobRecord) -> Any:
    text: str | None = record.result
    return None if text is None else json.loads(text)


def queue_depth(sqs: SQSClient, url: str) -> int:
    """Visible + in flight + delayed messages of a queue."""
    attrs = sqs.get_queue_attributes(
        QueueUrl=url,
        AttributeNames=[
            "ApproximateNumberOfMessages",
            "ApproximateNumberOfMessagesNotVisible",
            "ApproximateNumberOfMessagesDelayed",
        ],
    )["Attributes"]
    return sum(int(v) for v in attrs.values())


def drain(sqs: SQSClient, url: str, *, timeout: float, want: int) -> list[dict[str, Any]]:
    """Receive (hiding them for 60 s) until ``want`` messages came or ``timeout`` passed."""
    got: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    while len(got) < want and time.monotonic() < deadline:
        out = sqs.receive_message(
            QueueUrl=url,
            MaxNumberOfMessages=10,
            WaitTimeSeconds=1,
            VisibilityTimeout=60,
            MessageAttributeNames=["All"],
            MessageSystemAttributeNames=["All"],
        )
        got.extend(dict(m) for m in out.get("Messages", []))
    return got


def hold_heartbeat(worker: Worker | AsyncWorker, paused: threading.Event) -> None:
    """Keep ``worker``'s heartbeat from running while ``paused`` is set (as a paused
    process's would), in the way of its shell: a thread waits, a task awaits."""
    beat = worker._beat_once
    if isinstance(worker, AsyncWorker):

        async def stalled_task() -> None:
            while paused.is_set():
                await asyncio.sleep(0.05)
            await beat()  # type: ignore[misc]

        worker._beat_once = stalled_task  # type: ignore[method-assign]
        return

    def stalled() -> None:
        while paused.is_set():
            time.sleep(0.05)
        beat()

    worker._beat_once = stalled  # type: ignore[method-assign]


class WorkerProcess:
    """A worker script run in a process of its own; its journal (stderr) goes to ``log``.

    The script reads ``AWS_ENDPOINT_URL``, ``SQS_LEASE_PREFIX``, ``WORKER_NAME`` and
    whatever ``extra`` names (e.g. a gate directory or a target's URL)."""

    def __init__(self, script: Path, name: str, env: Settings, log: Path, **extra: str) -> None:
        self.name = name
        self.log = log
        self._fh = log.open("w")
        self.proc = subprocess.Popen(
            [sys.executable, str(script)],
            env={
                **os.environ,
                "AWS_ENDPOINT_URL": env.endpoint_url or "",
                "SQS_LEASE_PREFIX": env.prefix,
                "WORKER_NAME": name,
                **extra,
            },
            stdout=subprocess.DEVNULL,
            stderr=self._fh,
        )

    def events(self, name: str) -> list[dict[str, Any]]:
        """The journal events called ``name`` the process wrote so far."""
        out = []
        for line in self.log.read_text().splitlines():
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            if isinstance(ev, dict) and ev.get("event") == name:
                out.append(ev)
        return out

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it has not stopped within 20 s (a hang guard)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self._fh.close()


def serve_as_script_worker(app: Any) -> int:
    """The worker side of :class:`WorkerProcess`: run ``app`` from the environment
    (``WORKER_NAME``, ``IDLE_EXIT``), journal on stderr, SIGTERM handled."""
    from sqs_lease._journal import configure_stderr

    configure_stderr()
    worker = Worker(
        app,
        Settings.from_env(),
        worker_id=os.environ["WORKER_NAME"],
        concurrency=4,
        receive_wait=1,
        shutdown_grace=5,
        sweep_interval=None,
    )
    worker.install_signal_handlers()
    worker.run(idle_exit=float(os.environ.get("IDLE_EXIT", "60")))
    return 0
