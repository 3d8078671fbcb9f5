"""Fleet-wide concurrency limits with real worker processes on the embedded emulator:
the limit is never exceeded at the target, and a SIGKILLed worker's slots come back."""

from __future__ import annotations

import select
import signal
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import boto3
import pytest
from conftest import AwsTestEnv
from worker_helpers import WorkerProcess

from sqs_lease import Producer, Settings, create_queue
from sqs_lease._resources import create_tables
from sqs_lease._schema.views import view_of

HERE = Path(__file__).resolve().parent
CLASS_LIMIT = 2  # tests/limit_worker.py's browse class


class Target:
    """A fake tool that counts the calls in flight (in total and per tenant) and the
    most it ever saw. A call lasts ``hold`` seconds, or until its caller is gone (a
    killed worker's socket closes: its call is no longer in flight)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.now = 0
        self.most = 0
        self.per: dict[str, int] = {}
        self.most_per: dict[str, int] = {}
        self.calls: list[str] = []
        self.done: list[str] = []
        target = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                q = {k: v[0] for k, v in parse_qs(urlparse(self.path).query).items()}
                who = q.get("who", "")
                target.enter(q["job"], who)
                gone = False
                try:
                    gone = _held(self.connection, float(q["hold"]))
                finally:
                    target.leave(q["job"], who, finished=not gone)
                if not gone:
                    self.send_response(200)
                    self.end_headers()
                    self.wfile.write(b"{}")

            def log_message(self, *args: Any) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def enter(self, job: str, who: str) -> None:
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)
            self.per[who] = self.per.get(who, 0) + 1
            self.most_per[who] = max(self.most_per.get(who, 0), self.per[who])
            self.calls.append(job)

    def leave(self, job: str, who: str, *, finished: bool) -> None:
        with self.lock:
            self.now -= 1
            self.per[who] -= 1
            if finished:
                self.done.append(job)

    def in_flight(self) -> int:
        with self.lock:
            return self.now


def _held(conn: socket.socket, hold: float) -> bool:
    """Hold the call open for ``hold`` s; True if the caller went away first."""
    deadline = time.monotonic() + hold
    while (left := deadline - time.monotonic()) > 0:
        readable, _, _ = select.select([conn], [], [], min(0.05, left))
        if readable:
            try:
                if conn.recv(1, socket.MSG_PEEK) == b"":
                    return True
            except OSError:
                return True
    return False


def start_worker(
    name: str, env: Settings, target: Target, log: Path, **extra: str
) -> WorkerProcess:
    return WorkerProcess(HERE / "limit_worker.py", name, env, log, TARGET=target.url, **extra)


@pytest.fixture
def env(aws: AwsTestEnv) -> Settings:
    settings = Settings(endpoint_url=aws.endpoint_url, prefix=aws.prefix)
    create_tables(settings)
    create_queue(settings, visibility=4)
    return settings


@pytest.fixture
def target() -> Iterator[Target]:
    t = Target()
    yield t
    t.server.shutdown()


@pytest.fixture
def procs() -> Iterator[list[WorkerProcess]]:
    made: list[WorkerProcess] = []
    yield made
    for p in made:
        p.stop()


def _wait(pred: Any, what: str, procs: list[WorkerProcess], timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout  # a hang guard only
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.1)
    logs = "\n".join(f"--- {p.name}\n" + p.log.read_text()[-3000:] for p in procs)
    raise AssertionError(f"no {what} within {timeout}s; logs:\n{logs}")


def _states(settings: Settings, ids: list[str]) -> dict[str, str]:
    ddb = boto3.client("dynamodb", endpoint_url=settings.endpoint_url, region_name="us-east-1")
    out = {}
    for jid in ids:
        item = ddb.get_item(
            TableName=settings.jobs_table, Key={"job_id": {"S": jid}}, ConsistentRead=True
        )["Item"]
        out[jid] = view_of(item).state.value
    return out


@pytest.mark.integration
def test_three_worker_processes_never_run_more_than_the_class_or_tenant_limit_at_the_target(
    env: Settings, target: Target, procs: list[WorkerProcess], tmp_path: Path
) -> None:
    p = Producer(env)
    ids: list[str] = []
    for n in range(9):
        who = f"t{n % 3}"
        jid = f"{env.prefix}-b{n}-{uuid.uuid4().hex[:4]}"
        p.submit("browse", {"n": n, "hold": 0.4, "who": who}, jid, tenant=who)
        ids.append(jid)
    for name in ("W1", "W2", "W3"):
        procs.append(start_worker(name, env, target, tmp_path / f"{name}.log", TENANT_LIMIT="1"))
    _wait(lambda: set(ids) <= set(target.done), "every job's call done", procs)
    _wait(lambda: set(_states(env, ids).values()) == {"succeeded"}, "every job committed", procs)
    assert target.most == CLASS_LIMIT  # reached, never exceeded
    assert max(target.most_per.values()) == 1  # no tenant ever had two calls in flight
    waited = [e for w in procs for e in w.events("job_waiting_for_slot")]
    assert waited, "no job ever waited: the limits were not exercised"
    assert {e["pool"] for e in waited} <= {"class:browse", "tenant:t0", "tenant:t1", "tenant:t2"}
    # Waiting spent no attempt: each job committed on the attempt that ran it.
    committed = [e for w in procs for e in w.events("result_committed")]
    assert sorted(e["job_id"] for e in committed) == sorted(ids)
    assert all(e["attempt"] == 1 for e in committed)


@pytest.mark.integration
def test_the_slots_of_a_sigkilled_worker_come_back_and_the_limit_still_holds(
    env: Settings, target: Target, procs: list[WorkerProcess], tmp_path: Path
) -> None:
    p = Producer(env)
    ids = [f"{env.prefix}-k{n}-{uuid.uuid4().hex[:4]}" for n in range(5)]
    for n, jid in enumerate(ids):
        p.submit("browse", {"n": n, "hold": 0.3}, jid)
    # W1 alone takes both slots of the class and holds its calls open.
    w1 = start_worker("W1", env, target, tmp_path / "W1.log", HOLD_LONG="1")
    procs.append(w1)
    _wait(lambda: target.in_flight() == CLASS_LIMIT, "W1 holding both slots", procs)
    held = [e["job_id"] for e in w1.events("browse_started")]
    assert len(held) == CLASS_LIMIT
    w1.proc.send_signal(signal.SIGKILL)
    w1.proc.wait(30)
    _wait(lambda: target.in_flight() == 0, "the killed worker's calls to end", procs)
    for name in ("W2", "W3"):
        # With the sweep a fleet runs: a job W1 was giving back to wait for a slot
        # when it died (its record names the fresh message W1 never sent) is the
        # stranded sweep's to send (docs/operations.md, slot waits).
        procs.append(
            start_worker(
                name,
                env,
                target,
                tmp_path / f"{name}.log",
                SWEEP_INTERVAL="1",
                SWEEP_GRACE="3",
                IDLE_EXIT="120",
            )
        )
    # Both slots were W1's: every job finishing means they came back.
    _wait(lambda: set(ids) <= set(target.done), "every job's call done", procs)
    _wait(lambda: set(_states(env, ids).values()) == {"succeeded"}, "every job committed", procs)
    assert target.most == CLASS_LIMIT
    reclaimed = {e["job_id"] for w in procs[1:] for e in w.events("job_reclaimed")}
    assert set(held) <= reclaimed  # W1's jobs were taken over once their leases lapsed
