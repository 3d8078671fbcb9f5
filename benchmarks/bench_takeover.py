"""Benchmark 4: time from a worker's death to takeover.

Two worker processes (``sqs-lease worker benchmarks.bench_takeover:app``) consume
one queue. A job is submitted; whichever worker claims it (token 1) holds it in a
handler that waits, heartbeating every H. After a random delay the holder is
SIGKILLed: no release, no goodbye. Its last extension made the message visible
again at (last extension + L); the survivor's long poll then receives it, claims
it (token 2) and commits. Takeover = the survivor's ``job_claimed`` (token 2,
journal timestamp) minus the moment of the kill. Expected: at most L (less the
time since the last extension) plus the poll's reaction: within L + receive wait.
The killed worker is restarted between repetitions.

This module is also the workers' app (the lease comes from the environment, so
``--quick`` can use a shorter one).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from typing import IO, Any

from pydantic import BaseModel

from benchmarks.bench_common import (
    HANG_GUARD,
    ROOT,
    fmt,
    fresh_settings,
    median,
    moto_server,
    table,
)
from sqs_lease import App, Producer
from sqs_lease._jobs import JobContext

NAME = "takeover"
TITLE = "4. Time from a worker's death to takeover"

_LEASE_ENV = "SQS_LEASE_BENCH_TAKEOVER_LEASE"
LEASE = int(os.environ.get(_LEASE_ENV, "5"))
HEARTBEAT = 1.0
JITTER = 1.0 if LEASE >= 5 else 0.5
MISSED = 3 if LEASE >= 5 else 2  # L > R x H + J: 5 > 3 + 1, 3 > 2 + 0.5
RECEIVE_WAIT = 2
JOB_CLASS = "bench.takeover"
APP_SPEC = "benchmarks.bench_takeover:app"


class TakeoverPayload(BaseModel):
    n: int


app = App()


@app.job(
    JOB_CLASS,
    payload=TakeoverPayload,
    lease_seconds=LEASE,
    heartbeat_seconds=HEARTBEAT,
    jitter_seconds=JITTER,
    missed_heartbeats=MISSED,
)
def hold(ctx: JobContext[Any], payload: TakeoverPayload) -> dict[str, int]:
    """The first owner holds the job (until it is killed); a takeover finishes at once."""
    if ctx.attempt == 1:
        ctx.wait(120)
    return {"n": payload.n, "attempt": ctx.attempt}


Event = dict[str, Any]


class WorkerProc:
    """One worker process; its journal (stderr, JSON lines) is collected as it arrives."""

    def __init__(self, name: str, endpoint: str, prefix: str, lease: int) -> None:
        self.name = name
        env = dict(os.environ)
        env[_LEASE_ENV] = str(lease)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "sqs_lease.cli",
                "--endpoint-url",
                endpoint,
                "--prefix",
                prefix,
                "worker",
                APP_SPEC,
                "--worker-id",
                name,
                "--concurrency",
                "1",
                "--receive-wait",
                str(RECEIVE_WAIT),
                "--shutdown-grace",
                "1",
            ],
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        self._events: list[Event] = []
        self._lock = threading.Lock()
        assert self.proc.stderr is not None
        self._reader = threading.Thread(target=self._read, args=(self.proc.stderr,), daemon=True)
        self._reader.start()

    def _read(self, stream: IO[bytes]) -> None:
        for line in stream:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict) and "event" in event:
                with self._lock:
                    self._events.append(event)

    def events(self, name: str, **match: Any) -> list[Event]:
        with self._lock:
            return [
                e
                for e in self._events
                if e["event"] == name and all(e.get(k) == v for k, v in match.items())
            ]

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        if self.alive():
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()
        self._reader.join(timeout=5)


def _wait_event(
    procs: list[WorkerProc], name: str, timeout: float, **match: Any
) -> tuple[WorkerProc, Event]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for p in procs:
            found = p.events(name, **match)
            if found:
                return p, found[0]
        time.sleep(0.005)
    raise TimeoutError(f"takeover benchmark: no {name} {match} within {timeout:g} s")


def run(quick: bool) -> dict[str, Any]:
    lease = 3 if quick else 5
    reps = 1 if quick else 5
    rng = random.Random(20240611)
    samples: list[dict[str, float]] = []
    with moto_server() as moto:
        settings, _url = fresh_settings(moto.endpoint, "tk")
        producer = Producer(settings)
        incarnation = 0

        def start(slot: int) -> WorkerProc:
            nonlocal incarnation
            incarnation += 1
            return WorkerProc(f"w{slot}-{incarnation}", moto.endpoint, settings.prefix, lease)

        slots = [start(0), start(1)]
        try:
            for p in slots:
                _wait_event([p], "worker_started", HANG_GUARD)
            for rep in range(reps):
                job_id = f"take-{rep}"
                producer.submit(JOB_CLASS, {"n": rep}, job_id)
                holder, claimed = _wait_event(
                    slots, "job_claimed", HANG_GUARD, job_id=job_id, token=1
                )
                time.sleep(0.3 if quick else rng.uniform(0.3, 1.7))
                extensions = [claimed, *holder.events("heartbeat_ok", job_id=job_id, token=1)]
                last_extension = max(float(e["ts"]) for e in extensions)
                kill_at = time.time()
                holder.kill()
                survivor = [p for p in slots if p is not holder]
                _, taken = _wait_event(
                    survivor,
                    "job_claimed",
                    lease + RECEIVE_WAIT + HANG_GUARD,
                    job_id=job_id,
                    token=2,
                )
                _wait_event(survivor, "result_committed", HANG_GUARD, job_id=job_id, token=2)
                takeover = float(taken["ts"]) - kill_at
                visible_after = last_extension + lease - kill_at
                samples.append(
                    {
                        "held_before_kill": kill_at - float(claimed["ts"]),
                        "since_last_extension": kill_at - last_extension,
                        "visible_after_kill": visible_after,
                        "takeover": takeover,
                        "reaction": takeover - visible_after,
                    }
                )
                if rep + 1 < reps:
                    i = slots.index(holder)
                    slots[i] = start(i)
                    _wait_event([slots[i]], "worker_started", HANG_GUARD)
        finally:
            for p in slots:
                p.stop()
    takeovers = [s["takeover"] for s in samples]
    return {
        "params": {
            "lease_seconds": lease,
            "heartbeat_seconds": HEARTBEAT,
            "receive_wait": RECEIVE_WAIT,
            "reps": reps,
            "queue_depth": 1,
        },
        "samples": samples,
        "takeover_median": median(takeovers),
        "takeover_min": min(takeovers),
        "takeover_max": max(takeovers),
        "reaction_median": median([s["reaction"] for s in samples]),
        "expected_upper": lease + RECEIVE_WAIT,
        "ratio_to_lease_plus_wait": median(takeovers) / (lease + RECEIVE_WAIT),
        "ratio_to_lease": median(takeovers) / lease,
    }


def render(r: dict[str, Any]) -> str:
    p = r["params"]
    rows = [
        [
            i + 1,
            s["held_before_kill"],
            s["since_last_extension"],
            s["visible_after_kill"],
            s["takeover"],
            s["reaction"],
        ]
        for i, s in enumerate(r["samples"])
    ]
    return "\n".join(
        [
            f"Two worker processes on one queue (queue depth: the one job); L = "
            f"{p['lease_seconds']} s, H = {fmt(p['heartbeat_seconds'], 1)} s, receive wait "
            f"W = {p['receive_wait']} s; the holder is SIGKILLed {p['reps']} times at a random "
            "point of its lease. Times in seconds from the kill.",
            "",
            table(
                [
                    "rep",
                    "held before kill",
                    "since last extension",
                    "visible again after",
                    "**takeover** (token 2 claimed)",
                    "reaction after visible",
                ],
                rows,
            ),
            "",
            f"Median takeover **{fmt(r['takeover_median'])} s** (min {fmt(r['takeover_min'])}, "
            f"max {fmt(r['takeover_max'])}) = {fmt(r['ratio_to_lease'])} x L and "
            f"{fmt(r['ratio_to_lease_plus_wait'])} x (L + W = {r['expected_upper']} s). The "
            "message comes back L after the holder's last extension, which precedes the kill by "
            "up to H, so takeover is L minus that plus the survivor's reaction (median "
            f"{fmt(r['reaction_median'])} s: moto's long poll re-checks for newly visible "
            "messages about once a second, then the claim's UpdateItem and CMV). The receive "
            "wait does not add: a long poll returns as soon as a message is visible.",
        ]
    )
