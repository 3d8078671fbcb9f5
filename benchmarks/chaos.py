"""`make chaos`: real worker processes, real faults, invariants checked from the evidence.

Each run starts its own moto server (a separate process), creates the queue and
tables, starts the fenced payment receiver (``examples/receiver_service.py``,
in a subprocess whose journal is kept), and K worker processes
(``python -m sqs_lease.cli worker benchmarks.chaos_app:app``), each talking to
AWS through its own :class:`infra.proxy.FaultProxy` (the proxies live in this
process). Workers reach the receiver directly. Jobs are submitted over the
first part of the fault window, so work is in flight while faults land.

A seeded, bounded schedule of faults then runs for ``--fault-seconds``:

- ``pause``: SIGSTOP a worker, SIGCONT it 1-8 s later;
- ``kill``: SIGKILL a worker, restart it (a new worker id) 0.5-3 s later;
- ``cut``: black-hole its proxy (bytes swallowed, calls time out), heal later;
- ``reset``: cut its proxy with RST (connection errors), heal later;
- ``cut_down``: drop only server->client bytes (requests apply, answers are lost);
- ``latency``: add 0.2-1.5 s per chunk through its proxy, remove later.

At most K-1 workers are under a fault at once. When the window ends every
proxy is healed, every worker continued (or restarted), and the workers drain
until every job is terminal or parked (bounded by ``--drain-seconds``). They
are then stopped with SIGTERM, and the invariants are checked from what was
recorded: every incarnation's journal, the job records, the intents and
attempts tables, the receiver's ledger, fence marks and journal.

1. no duplicated effect: one ledger row per idempotency key and per business
   effect (invoice, amount); no ledger row that no job asked for;
2. no stale effect: no ledger row whose commit started after a row with a
   higher token of the same fence scope (job) had committed (ledger
   ``applied_at`` vs the receiver journal's post-commit ``effect_applied``);
   every fence mark is at least the highest token among its scope's rows (it
   may be higher: a replay or refusal to a newer owner raises it too) and
   belongs to a submitted job; every row's token is one that started an
   attempt for that key (attempts table);
3. no job lost: every submitted job is succeeded, failed with a reason or
   parked with a reason;
4. no result from a superseded token: every ``result_committed`` names the
   record's final token, at most one per job, and each stored result carries
   the record's own token and owner;
5. intents settled: none ``in_progress`` (unless ambiguous-and-parked),
   every intent of a succeeded job confirmed with the ledger row's charge id,
   every ambiguous intent's job parked, every effect of a succeeded job applied
   exactly once;
6. no lease extended by a worker that knew it lost it (no ``heartbeat_ok``
   after ``heartbeat_lost`` for one job and token in one journal).

A failing run keeps its artefacts (journals, evidence.json, schedule) under
``.chaos/run-SEED/`` and the script exits non-zero; run ``N`` of an invocation
with ``--seed S`` uses seed ``S + N - 1``, so ``--runs 1 --seed <that seed>``
replays its schedule (the timing of real processes is not replayed).

Usage::

    python benchmarks/chaos.py [--runs N] [--seed S] [--workers K] [--jobs J]
                               [--fault-seconds T] [--report FILE]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import random
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any
from urllib.parse import urlparse
from urllib.request import urlopen

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import boto3  # noqa: E402

from infra.proxy import FaultProxy  # noqa: E402
from sqs_lease import Settings, create_queue, create_tables  # noqa: E402
from sqs_lease._local import (  # noqa: E402
    local_credentials_env,
    spawn_local_server,
    stop_local_server,
)
from sqs_lease.testing import read_journal  # noqa: E402

Event = dict[str, Any]
TERMINAL = ("succeeded", "failed", "parked")
FAULT_KINDS = ("pause", "pause_in_call", "kill", "cut", "reset", "cut_down", "latency")
FAULT_WEIGHTS = (2, 2, 2, 2, 1, 2, 2)
RESTART_DELAY = 1.0  # a supervisor's pause before restarting a worker that exited
ARM_SECONDS = 3.0  # how long a pause_in_call waits for its worker to start a tool call
APP_SPEC = "benchmarks.chaos_app:app"


def say(text: str = "") -> None:
    print(text, flush=True)


# --------------------------------------------------------------------------- the plan


@dataclass(frozen=True)
class JobPlan:
    job_id: str
    job_class: str
    payload: dict[str, Any]
    at: float  # seconds after the run's start
    effects: tuple[tuple[str, int], ...]  # (invoice, amount) the job must apply once


@dataclass(frozen=True)
class Fault:
    at: float
    kind: str
    worker: int
    duration: float
    latency: float = 0.0

    def describe(self) -> str:
        extra = f" +{self.latency:.2f}s/chunk" if self.kind == "latency" else ""
        if self.kind == "pause_in_call":
            extra = f" at its next tool call (<= {ARM_SECONDS:g}s)"
        return f"t+{self.at:.1f} {self.kind} w{self.worker}{extra} ({self.duration:.1f}s)"


def plan_jobs(rng: random.Random, count: int, fault_seconds: float) -> list[JobPlan]:
    """A mixed workload; durations come from the seed so a replay does the same work."""
    jobs: list[JobPlan] = []
    upfront = max(1, count // 4)
    for i in range(count):
        at = 0.0 if i < upfront else round(rng.uniform(0.0, 0.6 * fault_seconds), 2)
        kind = rng.choices(("pay", "notify", "compute"), weights=(45, 25, 30))[0]
        if kind == "pay":
            invoice, amount = f"INV-{i:03d}", rng.randint(100, 999)
            fee = rng.randint(1, 99) if rng.random() < 0.7 else None
            payload: dict[str, Any] = {
                "invoice": invoice,
                "amount": amount,
                "fee": fee,
                "work": round(rng.uniform(0.2, 1.5), 2),
                "middle": round(rng.uniform(0.0, 0.8), 2),
                "tail": round(rng.uniform(0.0, 0.7), 2),
                "think": round(rng.uniform(0.1, 0.8), 2),
            }
            effects = ((invoice, amount),) + (((invoice, fee),) if fee is not None else ())
        elif kind == "notify":
            invoice, amount = f"NTF-{i:03d}", rng.randint(1, 50)
            payload = {
                "invoice": invoice,
                "amount": amount,
                "work": round(rng.uniform(0.1, 1.2), 2),
                "think": round(rng.uniform(0.0, 0.5), 2),
            }
            effects = ((invoice, amount),)
        else:
            payload = {"items": rng.randint(1, 100), "work": round(rng.uniform(0.2, 3.0), 2)}
            effects = ()
        jobs.append(JobPlan(f"{kind}-{i:03d}", kind, payload, at, effects))
    jobs.sort(key=lambda j: (j.at, j.job_id))
    return jobs


def plan_faults(
    rng: random.Random, workers: int, fault_seconds: float, max_faults: int
) -> list[Fault]:
    """Fault episodes in the window; at most ``workers - 1`` workers faulted at once."""
    faults: list[Fault] = []
    busy_until = [0.0] * workers
    t = rng.uniform(0.5, 2.0)
    while t < fault_seconds - 1.0 and len(faults) < max_faults:
        busy = sum(1 for b in busy_until if b > t)
        free = [k for k in range(workers) if busy_until[k] <= t]
        if not free or busy >= max(1, workers - 1):
            t = min(b for b in busy_until if b > t) + 0.1
            continue
        k = rng.choice(free)
        kind = rng.choices(FAULT_KINDS, weights=FAULT_WEIGHTS)[0]
        latency = 0.0
        if kind == "pause":
            duration = rng.uniform(1.0, 8.0)
        elif kind == "pause_in_call":
            # Longer than a lease plus a takeover: the successor redoes the step first.
            duration = rng.uniform(6.5, 8.0)
        elif kind == "kill":
            duration = rng.uniform(0.5, 3.0)  # until the restart
        elif kind in ("cut", "reset"):
            duration = rng.uniform(1.0, 8.0)
        elif kind == "cut_down":
            duration = rng.uniform(1.0, 5.0)
        else:
            duration = rng.uniform(2.0, 8.0)
            latency = round(rng.uniform(0.2, 1.5), 2)
        # Short windows get short episodes, so several kinds fit in one run.
        longest = max(1.0, 0.4 * fault_seconds)
        duration = round(max(0.3, min(duration, longest, fault_seconds - t)), 2)
        faults.append(Fault(round(t, 2), kind, k + 1, duration, latency))
        # A restarted worker needs a moment to import and poll before its next fault.
        settle = 1.5 if kind == "kill" else 0.3
        busy_until[k] = t + duration + settle + (ARM_SECONDS if kind == "pause_in_call" else 0)
        t += rng.expovariate(1.0 / 1.2)
    return faults


# --------------------------------------------------------------------------- processes


def _env(extra: dict[str, str]) -> dict[str, str]:
    env = {**os.environ, **local_credentials_env(), **extra}
    env.pop("AWS_PROFILE", None)
    for name in ("NO_PROXY", "no_proxy"):
        names = [n for n in env.get(name, "").split(",") if n]
        env[name] = ",".join(names + [h for h in ("127.0.0.1", "localhost") if h not in names])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    return env


def read_events(path: Path) -> list[Event]:
    """JSON journal lines of one file (a SIGKILLed process may leave half a line)."""
    return read_journal(path)


class Slot:
    """Worker number k: its proxy, and one process per incarnation (new id each)."""

    def __init__(
        self,
        k: int,
        proxy: FaultProxy,
        prefix: str,
        env: dict[str, str],
        run_dir: Path,
        concurrency: int,
    ) -> None:
        self.k = k
        self.proxy = proxy
        self.prefix = prefix
        self.env = env
        self.run_dir = run_dir
        self.concurrency = concurrency
        self.incarnation = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.logs: list[Path] = []
        self.paused = False
        self.killed = False
        self.crashes: list[str] = []
        self._files: list[IO[bytes]] = []
        self._armed: tuple[Path, int] = (Path(), 0)
        self._exited_at: float | None = None

    @property
    def name(self) -> str:
        return f"w{self.k}-{self.incarnation}"

    def start(self) -> None:
        self.incarnation += 1
        log = self.run_dir / f"{self.name}.jsonl"
        err = log.open("wb")
        out = (self.run_dir / f"{self.name}.stdout").open("wb")
        self._files += [err, out]
        self.logs.append(log)
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "sqs_lease.cli",
                "--endpoint-url",
                self.proxy.url,
                "--prefix",
                self.prefix,
                "worker",
                APP_SPEC,
                "--worker-id",
                self.name,
                "--concurrency",
                str(self.concurrency),
                "--receive-wait",
                "1",
                "--shutdown-grace",
                "5",
            ],
            cwd=ROOT,
            env=self.env,
            stdout=out,
            stderr=err,
            stdin=subprocess.DEVNULL,
        )
        self.paused = self.killed = False
        self._exited_at = None

    def signal(self, sig: signal.Signals) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(sig)

    def pause(self) -> None:
        self.signal(signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        self.signal(signal.SIGCONT)
        self.paused = False

    def kill(self) -> None:
        if self.proc is not None:
            self.signal(signal.SIGKILL)
            self.proc.wait(10)
        self.killed = True
        self.paused = False

    def watch(self) -> None:
        """Restart a process that exited on its own, as a supervisor would (and say so).

        The restart waits ``RESTART_DELAY``: a worker that cannot reach AWS at
        start-up exits at once, and restarting it in a tight loop would burn the
        CPU the other processes need.
        """
        if self.killed or self.proc is None or self.proc.poll() is None:
            return
        now = time.monotonic()
        if self._exited_at is None:
            last = ""
            for line in self.logs[-1].read_text(errors="replace").splitlines():
                if line.strip() and not line.startswith("{"):
                    last = line.strip()
            code = self.proc.returncode
            self.crashes.append(f"{self.name} exited with code {code}: {last[:200]}")
            self._exited_at = now
        elif now - self._exited_at >= RESTART_DELAY:
            self.start()

    def arm(self) -> None:
        """Remember where the journal ends now: :meth:`in_call` looks past it."""
        log = self.logs[-1]
        self._armed = (log, log.stat().st_size if log.exists() else 0)

    def in_call(self) -> bool:
        """Since :meth:`arm`, did this worker start a tool call (``tool_request_started``)?"""
        log, offset = self._armed
        if log != self.logs[-1] or not log.exists():
            return False
        with log.open("rb") as fh:
            fh.seek(offset)
            return b'"event":"tool_request_started"' in fh.read()

    def ready(self) -> bool:
        """The current incarnation journaled ``worker_started`` (it is polling)."""
        return any(e["event"] == "worker_started" for e in read_events(self.logs[-1]))

    def stop(self, timeout: float = 15.0) -> None:
        proc = self.proc
        if proc is not None and proc.poll() is None:
            self.resume()
            proc.terminate()
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        for fh in self._files:
            with contextlib.suppress(OSError):
                fh.close()
        self._files.clear()


def start_receiver(endpoint: str, prefix: str, log: Path) -> tuple[subprocess.Popen[str], str]:
    """The fenced receiver in its own process; its journal goes to ``log``."""
    err = log.open("w")
    proc = subprocess.Popen(
        [
            sys.executable,
            str(Path(__file__).resolve()),
            "--serve-receiver",
            "--endpoint-url",
            endpoint,
            "--prefix",
            prefix,
        ],
        cwd=ROOT,
        env=_env({}),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=err,
        text=True,
    )
    err.close()
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], 30)
    line = proc.stdout.readline() if ready else ""
    if not line.startswith("listening "):
        proc.kill()
        raise RuntimeError(f"receiver did not start (got {line!r}); see {log}")
    return proc, line.split(" ", 1)[1].strip()


def serve_moto() -> int:
    """``--serve-moto``: moto on 127.0.0.1 with serialised DynamoDB; prints ``endpoint URL``."""
    from sqs_lease._local import LocalAws

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    local = LocalAws().start()

    def watch_stdin() -> None:  # the parent died or closed the pipe: stop
        with contextlib.suppress(OSError):
            while os.read(0, 4096):
                pass
        stop.set()

    threading.Thread(target=watch_stdin, daemon=True).start()
    print(f"endpoint {local.endpoint_url}", flush=True)
    stop.wait()
    local.stop()
    return 0


def start_moto(mode: str, log: Path) -> tuple[subprocess.Popen[str], str]:
    """One moto server process for a run; its stderr (werkzeug tracebacks) goes to ``log``."""
    err = log.open("w")
    saved = os.dup(2)
    try:
        if mode == "plain":
            # spawn_local_server lets the child inherit our stderr: point fd 2 at the log.
            os.dup2(err.fileno(), 2)
            return spawn_local_server(serial_dynamodb=False)
        proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--serve-moto"],
            cwd=ROOT,
            env=_env({}),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            start_new_session=True,
        )
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], 30)
        line = proc.stdout.readline() if ready else ""
        if not line.startswith("endpoint http://127.0.0.1:"):
            proc.kill()
            raise RuntimeError(f"moto did not start (got {line!r}); see {log}")
        return proc, line.split(" ", 1)[1].strip()
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        err.close()


def serve_receiver(endpoint: str, prefix: str) -> int:
    """``--serve-receiver``: run the example payment receiver with its journal on stderr."""
    from examples.receiver_service import serve
    from sqs_lease._journal import configure_stderr

    configure_stderr()
    # Loopback only, its workers send unsigned fences: unsigned knowingly.
    settings = Settings(endpoint_url=endpoint, prefix=prefix)
    server, url = serve(settings, prefix, unsigned_fences=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())

    def watch_stdin() -> None:  # the parent died or closed the pipe: stop
        with contextlib.suppress(OSError):
            while os.read(0, 4096):
                pass
        stop.set()

    threading.Thread(target=watch_stdin, daemon=True).start()
    print(f"listening {url}", flush=True)
    stop.wait()
    server.shutdown()
    return 0


# --------------------------------------------------------------------------- evidence


def scan(ddb: Any, table: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    for page in ddb.get_paginator("scan").paginate(TableName=table, ConsistentRead=True):
        # The jobs table also holds the workers' liveness items (no state): not jobs.
        items += [i for i in page["Items"] if i.get("kind", {}).get("S") != "liveness"]
    return items


def plain(item: dict[str, Any]) -> dict[str, Any]:
    """A DynamoDB item as plain values (S, N, BOOL, NULL)."""
    out: dict[str, Any] = {}
    for name, value in item.items():
        if "S" in value:
            out[name] = value["S"]
        elif "N" in value:
            number = float(value["N"])
            out[name] = int(number) if number.is_integer() else number
        elif "BOOL" in value:
            out[name] = value["BOOL"]
        elif "NULL" in value:
            out[name] = None
        else:
            out[name] = value
    return out


@dataclass
class Evidence:
    records: dict[str, dict[str, Any]]
    intents: list[dict[str, Any]]
    attempts: list[dict[str, Any]]
    ledger: list[dict[str, Any]]
    fences: list[dict[str, Any]]
    journals: dict[str, list[Event]]  # incarnation -> events, in file order
    receiver_journal: list[Event]


def collect(
    settings: Settings, rprefix: str, receiver_url: str, slots: Sequence[Slot], receiver_log: Path
) -> Evidence:
    ddb = boto3.client("dynamodb", endpoint_url=settings.endpoint_url, region_name=settings.region)
    records = {r["job_id"]: r for r in map(plain, scan(ddb, settings.jobs_table))}
    with urlopen(receiver_url + "/ledger", timeout=30) as resp:
        ledger = list(json.loads(resp.read())["rows"])
    return Evidence(
        records=records,
        intents=[plain(i) for i in scan(ddb, settings.intents_table)],
        attempts=[plain(i) for i in scan(ddb, settings.attempts_table)],
        ledger=ledger,
        fences=[plain(i) for i in scan(ddb, f"{rprefix}-fences")],
        journals={log.stem: read_events(log) for s in slots for log in s.logs},
        receiver_journal=read_events(receiver_log),
    )


def check_invariants(jobs: Sequence[JobPlan], ev: Evidence) -> list[str]:
    """Every invariant, from the evidence alone; returns the violations found."""
    bad: list[str] = []
    plans = {j.job_id: j for j in jobs}
    all_events = [e for events in ev.journals.values() for e in events]

    # (a) no duplicated effect
    expected = {eff: j.job_id for j in jobs for eff in j.effects}
    by_key = collections.Counter(str(r["idem_key"]) for r in ev.ledger)
    by_effect = collections.Counter((str(r["invoice"]), int(r["amount"])) for r in ev.ledger)
    for key, n in by_key.items():
        if n > 1:
            bad.append(f"duplicate: idempotency key {key} applied {n} times")
    for eff, n in by_effect.items():
        if n > 1:
            bad.append(f"duplicate: effect {eff} applied {n} times")
        if eff not in expected:
            bad.append(f"unexpected effect at the receiver: {eff}")

    # (b) no effect accepted with a lower token than one already accepted
    post_commit = {
        str(e.get("idem_key")): float(e["ts"])
        for e in ev.receiver_journal
        if e.get("event") == "effect_applied"
    }
    by_scope: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    for row in ev.ledger:
        by_scope[str(row["scope"])].append(row)
        if str(row["idem_key"]) not in post_commit:
            bad.append(f"ledger row {row['idem_key']} has no effect_applied in the receiver log")
    for scope, rows in by_scope.items():
        for hi in rows:
            hi_done = post_commit.get(str(hi["idem_key"]))
            if hi_done is None:
                continue
            for lo in rows:
                # lo's commit started (applied_at is taken before the transaction)
                # after hi's had committed: the fence must have refused lo.
                if int(lo["token"]) < int(hi["token"]) and float(lo["applied_at"]) > hi_done:
                    bad.append(
                        f"stale effect: job {scope} accepted token {lo['token']} "
                        f"({lo['idem_key']}) after token {hi['token']} ({hi['idem_key']})"
                    )
    marks = {str(f["scope"]): int(f["token"]) for f in ev.fences}
    for scope, rows in by_scope.items():
        top = max(int(r["token"]) for r in rows)
        if marks.get(scope, -1) < top:
            bad.append(f"fence mark of job {scope} is {marks.get(scope)}, rows' highest {top}")
    for scope in set(marks) - set(plans):
        bad.append(f"fence mark for {scope}, which is no submitted job")
    attempt_tokens: dict[str, set[int]] = collections.defaultdict(set)
    for a in ev.attempts:
        attempt_tokens[str(a["intent_key"])].add(int(a["token"]))
    for row in ev.ledger:
        key, token = str(row["idem_key"]), int(row["token"])
        if token not in attempt_tokens.get(key, set()):
            bad.append(f"effect {key} applied with token {token}, which started no attempt")

    # (c) no job lost
    for j in jobs:
        rec = ev.records.get(j.job_id)
        if rec is None:
            bad.append(f"lost: job {j.job_id} has no record")
        elif rec["state"] not in TERMINAL:
            bad.append(f"lost: job {j.job_id} is {rec['state']} (token {rec.get('token')})")
        elif rec["state"] in ("failed", "parked") and not rec.get("reason"):
            bad.append(f"job {j.job_id} is {rec['state']} without a reason")

    # (d) no result committed by a superseded token
    commits = collections.Counter(
        str(e["job_id"]) for e in all_events if e["event"] == "result_committed"
    )
    for job_id, n in commits.items():
        if n > 1:
            bad.append(f"job {job_id}: {n} result_committed events")
    for e in all_events:
        if e["event"] != "result_committed":
            continue
        current = ev.records.get(str(e["job_id"])) or {}
        if current.get("state") != "succeeded" or int(current.get("token", -1)) != int(e["token"]):
            bad.append(
                f"job {e['job_id']}: result_committed by {e.get('worker')} with token "
                f"{e['token']}, record is {current.get('state')} token {current.get('token')}"
            )
    for job_id, rec in ev.records.items():
        if rec["state"] != "succeeded":
            continue
        result = json.loads(rec.get("result") or "{}")
        if result.get("token") != rec["token"] or result.get("worker") != rec.get("owner"):
            bad.append(
                f"job {job_id}: stored result is from {result.get('worker')} token "
                f"{result.get('token')}, record is owner {rec.get('owner')} token {rec['token']}"
            )

    # (e) intents settled, and consistent with the ledger
    ledger_by_key = {str(r["idem_key"]): r for r in ev.ledger}
    for intent in ev.intents:
        key, state = str(intent["intent_key"]), intent["state"]
        job_state = ev.records.get(str(intent["job_id"]), {}).get("state")
        if state == "in_progress":
            bad.append(f"intent {key} left in_progress (job {job_state})")
        elif state == "ambiguous" and job_state != "parked":
            bad.append(f"intent {key} is ambiguous but its job is {job_state}")
        elif state == "prepared" and job_state == "succeeded":
            bad.append(f"intent {key} is prepared but its job succeeded")
        if state == "confirmed":
            applied = ledger_by_key.get(key)
            if applied is None:
                bad.append(f"intent {key} is confirmed but the receiver never applied it")
            elif applied["charge_id"] != intent.get("external_id"):
                bad.append(
                    f"intent {key} confirmed with {intent.get('external_id')}, "
                    f"the receiver applied {applied['charge_id']}"
                )
    for job_id, plan in plans.items():
        if ev.records.get(job_id, {}).get("state") != "succeeded":
            continue
        for eff in plan.effects:
            if by_effect.get(eff, 0) != 1:
                bad.append(
                    f"job {job_id} succeeded but effect {eff} applied {by_effect.get(eff, 0)} times"
                )

    # (f) no lease extended by a worker that knew it had lost it
    for name, events in ev.journals.items():
        lost: set[tuple[str, int]] = set()
        for e in events:
            if e["event"] == "heartbeat_lost":
                lost.add((str(e["job_id"]), int(e["token"])))
            elif e["event"] == "heartbeat_ok" and (str(e["job_id"]), int(e["token"])) in lost:
                bad.append(f"{name} extended {e['job_id']} token {e['token']} after losing it")
    return bad


# --------------------------------------------------------------------------- one run


@dataclass
class RunResult:
    index: int
    seed: int
    ok: bool
    wall: float
    jobs: int
    states: dict[str, int]
    faults: dict[str, int]
    takeovers: int
    rejected: int
    parked: int
    ambiguous: int
    duplicates: int
    lost: int
    stale_refused: int
    replays: int
    abandoned: int
    reconciled: dict[str, int]
    retries: int
    ownership_unknown: int
    heartbeat_lost: int
    effects: int
    incarnations: int
    in_call: int
    emulator_errors: int
    crashes: list[str]
    violations: list[str]
    artefacts: str
    drained_in: float | None
    phases: dict[str, float] = field(default_factory=dict)
    error: str | None = None


@dataclass
class Options:
    runs: int
    seed: int
    workers: int
    jobs: int
    fault_seconds: float
    drain_seconds: float
    max_faults: int
    concurrency: int
    artefacts: Path
    keep: bool
    moto: str = "serialised"
    report: Path | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@contextlib.contextmanager
def _cleanup() -> Iterator[list[Callable[[], object]]]:
    undo: list[Callable[[], object]] = []
    try:
        yield undo
    finally:
        for fn in reversed(undo):
            with contextlib.suppress(Exception):
                fn()


def _apply(fault: Fault, slot: Slot, start: bool) -> None:
    kind, proxy = fault.kind, slot.proxy
    if kind in ("pause", "pause_in_call"):
        slot.pause() if start else slot.resume()
    elif kind == "kill":
        slot.kill() if start else slot.start()
    elif kind == "cut":
        proxy.cut() if start else proxy.heal()
    elif kind == "reset":
        proxy.cut("reset") if start else proxy.heal()
    elif kind == "cut_down":
        proxy.cut_one_way("down") if start else proxy.heal()
    elif kind == "latency":
        proxy.set_latency(fault.latency if start else 0.0)
    else:
        raise ValueError(kind)


def run_once(index: int, seed: int, opt: Options) -> RunResult:
    rng = random.Random(seed)
    jobs = plan_jobs(rng, opt.jobs, opt.fault_seconds)
    faults = plan_faults(rng, opt.workers, opt.fault_seconds, opt.max_faults)
    run_dir = opt.artefacts / f"run-{seed}"
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    prefix, rprefix = f"chaos{seed}", f"chaos{seed}-rcv"
    (run_dir / "schedule.json").write_text(
        json.dumps(
            {
                "seed": seed,
                "options": {k: str(v) for k, v in asdict(opt).items()},
                "jobs": [asdict(j) for j in jobs],
                "faults": [asdict(f) for f in faults],
            },
            indent=1,
        )
    )
    say(
        f"run {index}/{opt.runs} seed {seed}: {len(jobs)} jobs, {len(faults)} faults over "
        f"{opt.fault_seconds:g}s, {opt.workers} workers"
    )
    say("  schedule: " + ("; ".join(f.describe() for f in faults) or "(no faults)"))
    started = time.monotonic()
    executed: collections.Counter[str] = collections.Counter()
    slots: list[Slot] = []
    drained_in: float | None = None
    with _cleanup() as undo:
        moto, endpoint = start_moto(opt.moto, run_dir / "moto.log")
        undo.append(lambda: stop_local_server(moto))
        settings = Settings(endpoint_url=endpoint, prefix=prefix)
        create_tables(settings)
        create_queue(settings, visibility=4)
        from examples.receiver_service import create_ledger_table
        from sqs_lease.receiver import create_receiver_tables

        create_receiver_tables(settings, prefix=rprefix)
        create_ledger_table(settings, rprefix)
        receiver_log = run_dir / "receiver.jsonl"
        receiver, receiver_url = start_receiver(endpoint, rprefix, receiver_log)

        def stop_receiver() -> None:
            if receiver.stdin is not None:
                receiver.stdin.close()
            receiver.terminate()
            receiver.wait(10)

        undo.append(stop_receiver)
        upstream = urlparse(endpoint)
        env = _env(
            {
                "CHAOS_RECEIVER_URL": receiver_url,
                "CHAOS_RECEIVER_AWS": endpoint,
                "CHAOS_RECEIVER_PREFIX": rprefix,
            }
        )
        for k in range(1, opt.workers + 1):
            proxy = FaultProxy(upstream.hostname or "127.0.0.1", upstream.port or 80).start()
            undo.append(proxy.stop)
            slots.append(Slot(k, proxy, prefix, env, run_dir, opt.concurrency))
        for slot in slots:
            undo.append(slot.stop)
            slot.start()
        # The schedule starts with the whole fleet polling.
        ready_by = time.monotonic() + 30
        while not all(slot.ready() for slot in slots) and time.monotonic() < ready_by:
            for slot in slots:
                slot.watch()
            time.sleep(0.1)

        from benchmarks.chaos_app import app
        from sqs_lease import Producer

        producer = Producer(settings, app)
        # The timeline: submissions, fault starts and ends (ends first at equal times).
        timeline: list[tuple[float, int, str, Any]] = [(j.at, 2, "submit", j) for j in jobs]
        for f in faults:
            timeline += [(f.at, 1, "start", f), (f.at + f.duration, 0, "end", f)]
        timeline.sort(key=lambda x: (x[0], x[1]))
        active: set[Fault] = set()
        armed: list[tuple[float, Fault]] = []  # pause_in_call waiting for a tool call
        ends: list[tuple[float, Fault]] = []  # pause_in_call episodes, timed from the pause
        in_call = 0

        def tick() -> None:
            nonlocal in_call
            now = time.monotonic()
            for slot in slots:
                slot.watch()
            for entry in list(armed):
                deadline, f = entry
                slot = slots[f.worker - 1]
                hit = slot.in_call()
                if hit or now >= deadline:
                    armed.remove(entry)
                    slot.pause()
                    executed[f.kind] += 1
                    in_call += int(hit)
                    active.add(f)
                    ends.append((now + f.duration, f))
            for entry in list(ends):
                if now >= entry[0]:
                    ends.remove(entry)
                    if entry[1] in active:
                        _apply(entry[1], slots[entry[1].worker - 1], False)
                        active.discard(entry[1])

        t0 = time.monotonic()
        for at, _, what, item in timeline:
            while (delay := t0 + at - time.monotonic()) > 0:
                time.sleep(min(delay, 0.03))
                tick()
            if what == "submit":
                producer.submit(item.job_class, item.payload, job_id=item.job_id)
            elif what == "start" and item.kind == "pause_in_call":
                slots[item.worker - 1].arm()
                armed.append((time.monotonic() + ARM_SECONDS, item))
            elif what == "start":
                _apply(item, slots[item.worker - 1], True)
                executed[item.kind] += 1
                active.add(item)
            elif item in active and item.kind != "pause_in_call":
                _apply(item, slots[item.worker - 1], False)
                active.discard(item)
        while time.monotonic() < t0 + opt.fault_seconds:
            time.sleep(0.03)
            tick()
        # Window over: heal everything, continue everyone, restart the dead.
        armed.clear()
        for f in list(active):
            _apply(f, slots[f.worker - 1], False)
        for slot in slots:
            slot.proxy.heal()
            slot.proxy.set_latency(0.0)
            slot.resume()
        # Drain: until every job is terminal or parked (bounded).
        ddb = boto3.client("dynamodb", endpoint_url=endpoint, region_name=settings.region)
        drain_start = time.monotonic()
        while time.monotonic() - drain_start < opt.drain_seconds:
            for slot in slots:
                slot.watch()
            states = {
                str(i["job_id"]["S"]): str(i["state"]["S"]) for i in scan(ddb, settings.jobs_table)
            }
            if len(states) == len(jobs) and all(s in TERMINAL for s in states.values()):
                drained_in = time.monotonic() - drain_start
                break
            time.sleep(0.5)
        stop_start = time.monotonic()
        for slot in slots:  # SIGTERM them all first, then wait: they stop in parallel
            slot.resume()
            slot.signal(signal.SIGTERM)
        for slot in slots:
            slot.stop()
        evidence = collect(settings, rprefix, receiver_url, slots, receiver_log)
        phases = {
            "setup": t0 - started,
            "faults": drain_start - t0,
            "drain": stop_start - drain_start,
            "stop": time.monotonic() - stop_start,
        }
    violations = check_invariants(jobs, evidence)
    moto_log = run_dir / "moto.log"
    moto_errors = moto_log.read_text(errors="replace").count("Error on request")
    crashes = [c for s in slots for c in s.crashes]
    wall = time.monotonic() - started
    events = [e for evs in evidence.journals.values() for e in evs]
    count = collections.Counter(str(e["event"]) for e in events)
    reconciled = collections.Counter(
        str(e.get("verdict")) for e in events if e["event"] == "intent_reconciled"
    )
    states_count = collections.Counter(str(r["state"]) for r in evidence.records.values())
    dup = sum(
        n - 1
        for n in collections.Counter(
            (str(r["invoice"]), int(r["amount"])) for r in evidence.ledger
        ).values()
        if n > 1
    )
    lost = sum(1 for j in jobs if evidence.records.get(j.job_id, {}).get("state") not in TERMINAL)
    ok = not violations
    result = RunResult(
        index=index,
        seed=seed,
        ok=ok,
        wall=round(wall, 1),
        jobs=len(jobs),
        states=dict(sorted(states_count.items())),
        faults=dict(sorted(executed.items())),
        takeovers=count["job_reclaimed"],
        rejected=count["result_rejected"],
        parked=states_count["parked"],
        ambiguous=sum(1 for i in evidence.intents if i["state"] == "ambiguous"),
        duplicates=dup,
        lost=lost,
        stale_refused=sum(1 for e in evidence.receiver_journal if e["event"] == "fence_rejected"),
        replays=sum(1 for e in evidence.receiver_journal if e["event"] == "idempotency_replayed"),
        abandoned=count["job_abandoned"],
        reconciled=dict(sorted(reconciled.items())),
        retries=count["job_retry_scheduled"],
        ownership_unknown=count["ownership_unknown"],
        heartbeat_lost=count["heartbeat_lost"],
        effects=len(evidence.ledger),
        incarnations=sum(s.incarnation for s in slots),
        in_call=in_call,
        emulator_errors=moto_errors,
        crashes=crashes,
        violations=violations,
        artefacts=str(run_dir),
        drained_in=None if drained_in is None else round(drained_in, 1),
        phases={k: round(v, 1) for k, v in phases.items()},
    )
    (run_dir / "result.json").write_text(json.dumps(asdict(result), indent=1))
    if not ok:
        (run_dir / "evidence.json").write_text(json.dumps(asdict(evidence), indent=1))
    elif not opt.keep and not crashes:
        shutil.rmtree(run_dir, ignore_errors=True)
    return result


def summary_line(r: RunResult) -> str:
    faults = ", ".join(f"{k} {v}" for k, v in r.faults.items()) or "none"
    states = ", ".join(f"{k} {v}" for k, v in r.states.items())
    return (
        f"  {states}; faults {sum(r.faults.values())} ({faults}); takeovers {r.takeovers}, "
        f"rejected {r.rejected}, stale refused {r.stale_refused}, parked {r.parked}, "
        f"ambiguous {r.ambiguous}, duplicates {r.duplicates}, lost {r.lost}; "
        f"{r.wall:.1f}s ({', '.join(f'{k} {v:g}' for k, v in r.phases.items())})  "
        f"{'OK' if r.ok else 'FAILED'}"
    )


# --------------------------------------------------------------------------- totals


@dataclass
class Totals:
    runs: int = 0
    failed: int = 0
    jobs: int = 0
    effects: int = 0
    wall: float = 0.0
    faults: collections.Counter[str] = field(default_factory=collections.Counter)
    states: collections.Counter[str] = field(default_factory=collections.Counter)
    reconciled: collections.Counter[str] = field(default_factory=collections.Counter)
    sums: collections.Counter[str] = field(default_factory=collections.Counter)

    def add(self, r: RunResult) -> None:
        self.runs += 1
        self.failed += int(not r.ok)
        self.jobs += r.jobs
        self.effects += r.effects
        self.wall += r.wall
        self.faults.update(r.faults)
        self.states.update(r.states)
        self.reconciled.update(r.reconciled)
        for name in (
            "takeovers",
            "rejected",
            "parked",
            "ambiguous",
            "duplicates",
            "lost",
            "stale_refused",
            "replays",
            "abandoned",
            "retries",
            "ownership_unknown",
            "heartbeat_lost",
            "incarnations",
            "in_call",
            "emulator_errors",
        ):
            self.sums[name] += int(getattr(r, name))
        self.sums["exits"] += len(r.crashes)

    def lines(self) -> list[str]:
        s = self.sums
        rate = self.runs / (self.wall / 60) if self.wall else 0.0
        return [
            f"runs {self.runs} ({self.failed} failed), wall {self.wall:.0f}s, {rate:.2f} runs/min",
            f"jobs {self.jobs}: " + ", ".join(f"{k} {v}" for k, v in sorted(self.states.items())),
            f"faults {sum(self.faults.values())}: "
            + ", ".join(f"{k} {v}" for k, v in sorted(self.faults.items())),
            f"takeovers {s['takeovers']}, rejected results {s['rejected']}, "
            f"abandoned attempts {s['abandoned']}, retries {s['retries']}, "
            f"heartbeat_lost {s['heartbeat_lost']}, ownership_unknown {s['ownership_unknown']}",
            f"effects applied {self.effects}, stale effects refused by the receiver "
            f"{s['stale_refused']}, receiver replays {s['replays']}, reconciliations "
            + (", ".join(f"{k} {v}" for k, v in sorted(self.reconciled.items())) or "0"),
            f"parked jobs {s['parked']}, ambiguous intents {s['ambiguous']}, "
            f"worker incarnations {s['incarnations']}, pauses that caught a tool call "
            f"{s['in_call']}, worker exits (restarted) {s['exits']}, emulator HTTP 500s "
            f"{s['emulator_errors']}",
            f"duplicates {s['duplicates']}, lost jobs {s['lost']}",
        ]


def write_report(
    path: Path, opt: Options, argv: Sequence[str], totals: Totals, results: Sequence[RunResult]
) -> None:
    s = totals.sums
    rate = totals.runs / (totals.wall / 60) if totals.wall else 0.0
    out = [
        f"### chaos: {totals.runs} runs, {totals.failed} failed "
        f"({time.strftime('%Y-%m-%d %H:%M:%S')})",
        "",
        f"Command: `python benchmarks/chaos.py {' '.join(argv)}` "
        f"(first seed {opt.seed}, {opt.workers} workers x {opt.concurrency} slots, "
        f"{opt.jobs} jobs, {opt.fault_seconds:g} s of faults per run)",
        "",
        "| figure | value |",
        "|---|---|",
        f"| runs | {totals.runs} ({totals.failed} failed) |",
        f"| wall time | {totals.wall:.0f} s ({rate:.2f} runs/min) |",
        f"| jobs | {totals.jobs} ("
        + ", ".join(f"{k} {v}" for k, v in sorted(totals.states.items()))
        + ") |",
        f"| faults injected | {sum(totals.faults.values())} ("
        + ", ".join(f"{k} {v}" for k, v in sorted(totals.faults.items()))
        + ") |",
        f"| takeovers (job_reclaimed) | {s['takeovers']} |",
        f"| rejected results (result_rejected) | {s['rejected']} |",
        f"| abandoned attempts / retries | {s['abandoned']} / {s['retries']} |",
        f"| effects applied / stale effects refused (412) / receiver replays | "
        f"{totals.effects} / {s['stale_refused']} / {s['replays']} |",
        "| reconciliations | "
        + (", ".join(f"{k} {v}" for k, v in sorted(totals.reconciled.items())) or "0")
        + " |",
        f"| parked jobs / ambiguous intents | {s['parked']} / {s['ambiguous']} |",
        f"| pauses that caught a tool call | {s['in_call']} |",
        f"| worker incarnations / exits on their own (restarted) | "
        f"{s['incarnations']} / {s['exits']} |",
        f"| emulator errors (moto HTTP 500) | {s['emulator_errors']} |",
        f"| **duplicated effects** | **{s['duplicates']}** |",
        f"| **lost jobs** | **{s['lost']}** |",
        "",
    ]
    failed = [r for r in results if not r.ok]
    for r in failed:
        out.append(f"- FAILED seed {r.seed}: {r.artefacts}: " + "; ".join(r.violations[:5]))
    if failed:
        out.append("")
    with path.open("a") as fh:
        fh.write("\n".join(out) + "\n")


# --------------------------------------------------------------------------- main


def parse(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python benchmarks/chaos.py",
        description="Real multi-process chaos against moto: faults, then invariants.",
    )
    p.add_argument("--runs", type=int, default=5, help="runs (default 5)")
    p.add_argument("--seed", type=int, default=None, help="first run's seed (default: random)")
    p.add_argument("--workers", type=int, default=3, help="worker processes (default 3)")
    p.add_argument("--jobs", type=int, default=24, help="jobs per run (default 24)")
    p.add_argument(
        "--fault-seconds",
        type=float,
        default=20.0,
        help="fault window per run, at most 60 (default 20)",
    )
    p.add_argument(
        "--drain-seconds",
        type=float,
        default=60.0,
        help="bound on the drain after the window, at most 90 (default 60)",
    )
    p.add_argument("--max-faults", type=int, default=40, help="faults per run at most")
    p.add_argument("--concurrency", type=int, default=3, help="job slots per worker")
    p.add_argument(
        "--artefacts",
        type=Path,
        default=ROOT / ".chaos",
        help="where runs keep journals (default .chaos/)",
    )
    p.add_argument("--keep", action="store_true", help="keep artefacts of passing runs too")
    p.add_argument("--report", type=Path, default=None, help="append a markdown summary here")
    p.add_argument(
        "--moto",
        choices=("serialised", "plain"),
        default="serialised",
        help="serialised (default): moto with DynamoDB requests one at a time, since "
        "moto's cancelled transactions can undo concurrent writes; plain: "
        "spawn_local_server as is",
    )
    p.add_argument("--serve-receiver", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--serve-moto", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--endpoint-url", help=argparse.SUPPRESS)
    p.add_argument("--prefix", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if not (args.serve_receiver or args.serve_moto):
        if not 1 <= args.runs <= 10_000:
            p.error("--runs must be 1..10000")
        if not 2 <= args.workers <= 16:
            p.error("--workers must be 2..16")
        if not 1 <= args.jobs <= 500:
            p.error("--jobs must be 1..500")
        if not 0 < args.fault_seconds <= 60:
            p.error("--fault-seconds must be in (0, 60]")
        if not 0 < args.drain_seconds <= 90:
            p.error("--drain-seconds must be in (0, 90]")
        if not 0 <= args.max_faults <= 200:
            p.error("--max-faults must be 0..200")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse(argv)
    if args.serve_moto:
        return serve_moto()
    if args.serve_receiver:
        return serve_receiver(args.endpoint_url, args.prefix)
    os.environ.update(local_credentials_env())
    os.environ.pop("AWS_PROFILE", None)
    os.environ.update({k: v for k, v in _env({}).items() if k.lower() == "no_proxy"})
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1, 10**6)
    opt = Options(
        runs=args.runs,
        seed=seed,
        workers=args.workers,
        jobs=args.jobs,
        fault_seconds=args.fault_seconds,
        drain_seconds=args.drain_seconds,
        max_faults=args.max_faults,
        concurrency=args.concurrency,
        artefacts=args.artefacts.resolve(),
        keep=args.keep,
        moto=args.moto,
        report=args.report,
    )
    say(
        f"chaos: {opt.runs} runs from seed {seed}, {opt.workers} workers x {opt.concurrency} "
        f"slots, {opt.jobs} jobs, {opt.fault_seconds:g}s faults, drain <= "
        f"{opt.drain_seconds:g}s; artefacts {opt.artefacts}"
    )
    totals = Totals()
    results: list[RunResult] = []
    for i in range(opt.runs):
        run_seed = seed + i
        try:
            r = run_once(i + 1, run_seed, opt)
        except Exception as exc:  # a run that could not even finish is a failed run
            run_dir = opt.artefacts / f"run-{run_seed}"
            say(f"  run {i + 1} seed {run_seed} crashed: {type(exc).__name__}: {exc}")
            r = RunResult(
                index=i + 1,
                seed=run_seed,
                ok=False,
                wall=0.0,
                jobs=0,
                states={},
                faults={},
                takeovers=0,
                rejected=0,
                parked=0,
                ambiguous=0,
                duplicates=0,
                lost=0,
                stale_refused=0,
                replays=0,
                abandoned=0,
                reconciled={},
                retries=0,
                ownership_unknown=0,
                heartbeat_lost=0,
                effects=0,
                incarnations=0,
                in_call=0,
                emulator_errors=0,
                crashes=[],
                violations=[f"run crashed: {type(exc).__name__}: {exc}"],
                artefacts=str(run_dir),
                drained_in=None,
                error=repr(exc),
            )
        results.append(r)
        totals.add(r)
        say(summary_line(r))
        for c in r.crashes:
            say(f"  note: worker {c}")
        if r.drained_in is None and r.ok is False:
            say("  drain did not finish within the bound")
        if not r.ok:
            for v in r.violations[:20]:
                say(f"  VIOLATION: {v}")
            say(
                f"  FAILED: seed {r.seed}, artefacts {r.artefacts}; replay: python "
                f"benchmarks/chaos.py --runs 1 --seed {r.seed} --workers {opt.workers} "
                f"--jobs {opt.jobs} --fault-seconds {opt.fault_seconds:g}"
            )
    say("")
    say("totals")
    for line in totals.lines():
        say("  " + line)
    if opt.report is not None:
        write_report(opt.report, opt, argv, totals, results)
        say(f"  report appended to {opt.report}")
    failed = [r for r in results if not r.ok]
    if failed:
        say("chaos: FAILED seeds " + ", ".join(str(r.seed) for r in failed))
        return 1
    say("chaos: OK")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
