"""Helpers for the worker integration tests: journal collector, shells, record reads.

What the public testing kit (``sqs_lease.testing``) offers is used from there, not
copied: the worker runner, the wait, the env set-up, the record read, the short lease.
"""

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

from sqs_lease import AsyncWorker, JobPolicy, Settings, Worker
from sqs_lease._core.records import JobView
from sqs_lease._journal import LOGGER_NAME
from sqs_lease._schema.models import JobRecord
from sqs_lease._schema.views import record_of, view_of
from sqs_lease.testing import HANG_GUARD as HANG_GUARD
from sqs_lease.testing import SHELLS as SHELLS  # the tests import these from here
from sqs_lease.testing import SHORT_LEASE, job_item, make_env, read_journal, wait_for
from sqs_lease.testing import WorkerRunner as WorkerRunner
from sqs_lease.testing import running as running

if TYPE_CHECKING:
    from types_boto3_dynamodb import DynamoDBClient
    from types_boto3_sqs import SQSClient

FAST = SHORT_LEASE
"""A short lease that keeps the timing rule (the kit's)."""

ROOMY: JobPolicy = {
    "lease_seconds": 30,
    "heartbeat_seconds": 5.0,
    "jitter_seconds": 1.0,
    "missed_heartbeats": 2,
}
"""A lease no busy machine lapses (a thread starved for 20 s would): for tests whose
subject is not a lapse or a takeover, yet which count claims exactly. Finishing takes
no longer with it; only a lapse would wait for it."""

Event = dict[str, Any]


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
    """Settings for one test, with its table and queue (plus DLQ) created (the kit's
    ``make_env``)."""
    env = make_env(endpoint_url, prefix)
    return env.settings, env.queue_url, env.dlq_url


# HANG_GUARD (the kit's) is the least any wait in these tests allows: a hang guard,
# never a timing check (10-20 s waits failed under load). Only a failure pays it.


def wait_until(
    predicate: Callable[[], bool], timeout: float, what: str, interval: float = 0.05
) -> None:
    """The kit's ``wait_for``, allowing at least :data:`HANG_GUARD` seconds."""
    wait_for(predicate, max(timeout, HANG_GUARD), what, interval)


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


read_item = job_item


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
        return [ev for ev in read_journal(self.log) if ev["event"] == name]

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
    (``WORKER_NAME``, ``IDLE_EXIT``; ``SWEEP_INTERVAL`` and ``SWEEP_GRACE`` turn the
    stranded sweep on, as a fleet has it), journal on stderr, SIGTERM handled."""
    from sqs_lease._journal import configure_stderr

    configure_stderr()
    sweep = os.environ.get("SWEEP_INTERVAL")
    worker = Worker(
        app,
        Settings.from_env(),
        worker_id=os.environ["WORKER_NAME"],
        concurrency=4,
        receive_wait=1,
        shutdown_grace=5,
        sweep_interval=float(sweep) if sweep else None,
        sweep_grace=float(os.environ.get("SWEEP_GRACE", "60")),
    )
    worker.install_signal_handlers()
    worker.run(idle_exit=float(os.environ.get("IDLE_EXIT", "60")))
    return 0
