"""Benchmark 5: one async process holding thousands of in-flight jobs; the thread worker at its cap.

N jobs are submitted (records written, N messages sent), then one worker process
(``AsyncWorker``, or the thread ``Worker``) with ``concurrency=N`` claims them all;
every handler awaits (``await ctx.wait(HOLD)``: minutes) while the heartbeat
extends its lease every ``HEARTBEAT`` s. Once all N are held, the worker is
measured for a few heartbeat periods, then stopped (every job released).

Per heartbeat period: the AWS calls it made (by operation), the lateness of each
job's extension against its schedule (the ChangeMessageVisibility entry's send
time minus the lease's ``next_beat``, or minus the lease's start when the beat was
due before it: a receive that granted less than L makes the first beat due at once,
up to L minus the receive's visibility before the claim; p50/p99/max), the part of it that is the
worker's own (the round's start minus the schedule: what the loop or thread
adds before any call), CPU share of the worker and of the emulator (seconds of
CPU per second of wall; 1.0 = one core), and the worker's peak RSS.

moto's ChangeMessageVisibility scans the whole queue for each entry, and the
queue holds all N messages (in flight): the emulator's cost grows with N x N, so
``moto busy`` near 1.0 marks the emulator as the limit; the worker's own cost is
its CPU share and its own lateness, read apart. The worker runs in a process of
its own (``python -m benchmarks.bench_scale child ...``) so that its CPU and RSS
are its own.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.bench_common import (  # noqa: E402
    fmt,
    fresh_settings,
    job_bodies,
    job_item,
    moto_server,
    process_cpu,
    put_items,
    send_bodies,
    table,
)
from sqs_lease._aws import Timeouts, make_client  # noqa: E402
from sqs_lease._core.timing import beat_due  # noqa: E402

NAME = "scale"
TITLE = "5. Thousands of in-flight jobs in one async process (and the thread worker at its cap)"

JOB_CLASS = "bench.scale"
STOP_WAIT = 240.0  # seconds the stop (every job released) may take before the child is killed
LEASE = 120
JITTER = 5.0


DEFAULT_SIZES = (
    "thread:100:standin,thread:500:standin,thread:1000:standin,"
    "async:100:standin,async:1000:standin,async:5000:standin"
)
FULL_SIZES = DEFAULT_SIZES + ",async:300:moto"
RAMP_STALL = 20.0


def _sizes(quick: bool) -> list[tuple[str, int, str]]:
    """The runs, ``shell:jobs:backend`` (backend ``moto``, the default, or ``standin``):
    ``BENCH_SCALE_SIZES`` overrides :data:`DEFAULT_SIZES`."""
    if quick:
        return [("async", 20, "moto"), ("thread", 20, "moto"), ("async", 20, "standin")]
    out = []
    sizes = FULL_SIZES if os.environ.get("BENCH_FULL") else DEFAULT_SIZES
    for part in os.environ.get("BENCH_SCALE_SIZES", sizes).split(","):
        shell, n, *backend = part.split(":")
        out.append((shell, int(n), backend[0] if backend else "moto"))
    return out


def run(quick: bool) -> dict[str, Any]:
    heartbeat = 2.0 if quick else 10.0
    periods = 2 if quick else 3
    runs = []
    for shell, n, backend in _sizes(quick):
        try:
            if backend == "standin":
                runs.append(_spawn(shell, n, heartbeat, periods, backend, None, "benchscale", 0.0))
            else:
                runs.append(_one(shell, n, heartbeat, periods))
        except Exception as exc:  # one size failing keeps the others' figures
            runs.append(
                {
                    "shell": shell,
                    "jobs": n,
                    "backend": backend,
                    "error": f"{type(exc).__name__}: {exc}",
                }
            )
    return {
        "params": {
            "heartbeat_seconds": heartbeat,
            "lease_seconds": LEASE,
            "jitter_seconds": JITTER,
            "periods": periods,
            "hold": "handlers await until the worker stops (minutes)",
        },
        "runs": runs,
    }


def _one(shell: str, n: int, heartbeat: float, periods: int) -> dict[str, Any]:
    with moto_server() as moto:
        settings, url = fresh_settings(moto.endpoint, f"sc{shell[0]}")
        # Seeding thousands on a busy machine: a slow answer is not a failure here.
        patient = Timeouts(read=120.0, attempts=5)
        sqs, ddb = make_client(settings, "sqs", patient), make_client(settings, "dynamodb", patient)
        from sqs_lease._schema.job_requests import JobTable

        jobs = JobTable(settings.jobs_table)
        ids = [f"s{i:05d}" for i in range(n)]
        t0 = time.monotonic()
        put_items(ddb, settings.jobs_table, [job_item(jobs, j, JOB_CLASS, {"n": 0}) for j in ids])
        send_bodies(sqs, url, job_bodies(ids, JOB_CLASS))
        seeded = time.monotonic() - t0
        return _spawn(shell, n, heartbeat, periods, "moto", moto, settings.prefix, seeded)


def _spawn(
    shell: str,
    n: int,
    heartbeat: float,
    periods: int,
    backend: str,
    moto: Any,
    prefix: str,
    seeded: float,
) -> dict[str, Any]:
    """Run the measuring child; with the stand-in it seeds its own jobs."""
    out = (
        Path(os.environ.get("TMPDIR", "/tmp"))
        / f"bench-scale-{os.getpid()}-{shell}-{n}-{backend}.json"
    )
    cmd = [
        sys.executable,
        "-m",
        "benchmarks.bench_scale",
        "child",
        "--shell",
        shell,
        "--backend",
        backend,
        "--endpoint",
        moto.endpoint if moto else "",
        "--prefix",
        prefix,
        "--jobs",
        str(n),
        "--heartbeat",
        str(heartbeat),
        "--periods",
        str(periods),
        "--moto-pid",
        str(moto.pid if moto else 0),
        "--out",
        str(out),
    ]
    log = out.with_suffix(".log")
    with log.open("w") as err:
        proc = subprocess.Popen(cmd, cwd=ROOT, stderr=err, env=dict(os.environ))
        # The figures are written as soon as they are measured; the release of
        # every job at the stop may take minutes on moto: it gets a bounded wait.
        measured_at: float | None = None
        while proc.poll() is None:
            if measured_at is None and out.exists():
                measured_at = time.monotonic()
            if measured_at is not None and time.monotonic() - measured_at > STOP_WAIT:
                proc.kill()
                break
            time.sleep(1.0)
        proc.wait()
    if not out.exists():
        raise RuntimeError(f"{shell} {n}: child failed: {log.read_text()[-2000:]}")
    log.unlink(missing_ok=True)
    result: dict[str, Any] = json.loads(out.read_text())
    out.unlink(missing_ok=True)
    result.setdefault("seed_seconds", round(seeded, 1))
    return result


# --------------------------------------------------------------------------- the child


def _pct(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    values = sorted(values)
    return values[min(len(values) - 1, max(0, math.ceil(q * len(values)) - 1))]


def _rss_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


class _Probe:
    """Counts the worker's calls and times each extension against its schedule."""

    def __init__(self, clock: Any) -> None:
        self.clock = clock
        self.lock = threading.Lock()
        self.calls: Counter[str] = Counter()
        self.late: list[float] = []  # CMV entry sent - due
        self.own_late: list[float] = []  # round planned - due
        self.schedule: dict[str, float] = {}  # receipt handle -> when its beat was due
        self.rounds: list[float] = []  # seconds each heartbeat round took (planned -> paced)

    def planned(self, now: float, leases: Any) -> None:
        with self.lock:
            for lease in leases:
                # The core's measure (the pace's): a first beat "due" before the lease
                # began (the receive granted less than L) is late from the lease's start.
                due = beat_due(lease)
                self.schedule[lease.receipt_handle] = due
                self.own_late.append(now - due)

    def call(self, c: Any) -> None:
        sent = self.clock()
        with self.lock:
            self.calls[c.op] += 1
            if c.op == "ChangeMessageVisibilityBatch":
                for e in c.params["Entries"]:
                    due = self.schedule.pop(e["ReceiptHandle"], None)
                    if due is not None and e["VisibilityTimeout"] > 0:
                        self.late.append(sent - due)

    def round_done(self, seconds: float) -> None:
        with self.lock:
            self.rounds.append(seconds)

    def take(self) -> tuple[Counter[str], list[float], list[float], list[float]]:
        with self.lock:
            out = (self.calls, self.late, self.own_late, self.rounds)
            self.calls, self.late, self.own_late, self.rounds = Counter(), [], [], []
        return out


def _instrument(probe: _Probe, drivers: bool) -> None:
    from sqs_lease._aio import AsyncDriver
    from sqs_lease._aws import SyncDriver
    from sqs_lease._core.leasebook import LeaseBook

    plan_round = LeaseBook.plan_round

    def planned(self: LeaseBook, now: float) -> Any:
        plan, dropped = plan_round(self, now)
        probe.planned(now, plan.extend)
        return plan, dropped

    LeaseBook.plan_round = planned  # type: ignore[method-assign]
    paced = LeaseBook.paced

    def measured(self: LeaseBook, leases: Any, *, due: float, started: float, ended: float) -> Any:
        probe.round_done(ended - started)  # every round that extended leases
        return paced(self, leases, due=due, started=started, ended=ended)

    LeaseBook.paced = measured  # type: ignore[method-assign]
    if not drivers:
        return
    sync_execute = SyncDriver.execute
    async_execute = AsyncDriver.execute

    def execute(self: SyncDriver, c: Any) -> Any:
        probe.call(c)
        return sync_execute(self, c)

    async def aexecute(self: AsyncDriver, c: Any) -> Any:
        probe.call(c)
        return await async_execute(self, c)

    SyncDriver.execute = execute  # type: ignore[method-assign]
    AsyncDriver.execute = aexecute  # type: ignore[method-assign]


def child(args: argparse.Namespace) -> None:
    import logging

    from pydantic import BaseModel

    from benchmarks.bench_common import setup_env
    from sqs_lease import App, AsyncWorker, Journal, Settings, Worker
    from sqs_lease._clock import lease_clock

    setup_env()
    logging.getLogger("sqs_lease.journal").setLevel(logging.WARNING)  # no journal I/O
    probe = _Probe(lease_clock)
    _instrument(probe, drivers=args.backend == "moto")
    standin: Any = None
    seeded = 0.0
    report_base_rss: float | None = None
    if args.backend == "standin":
        from benchmarks.standin import StandIn
        from sqs_lease._resources import create_queue
        from sqs_lease._schema.job_requests import JobTable

        standin = StandIn(lease_clock, ddb=os.environ.get("BENCH_STANDIN_DDB", "sim"))
        standin.start()
        settings = Settings(prefix=args.prefix)  # no endpoint: mock_aws answers in-process
        standin.create_tables(settings)
        create_queue(settings)
        ids = [f"s{i:05d}" for i in range(args.jobs)]
        t0 = time.monotonic()
        jobs = JobTable(settings.jobs_table)
        standin.put_items(
            settings.jobs_table, [job_item(jobs, j, JOB_CLASS, {"n": 0}) for j in ids]
        )
        standin.send(job_bodies(ids, JOB_CLASS))
        seeded = time.monotonic() - t0
        standin.install(probe.call)
        # The stand-in's items and moto's machinery live in this process: the
        # baseline RSS before the worker starts, so the worker's share reads apart.
        report_base_rss = round(_rss_kb("VmRSS") / 1024, 1)
    else:
        settings = Settings(endpoint_url=args.endpoint, prefix=args.prefix)

    class Payload(BaseModel):
        n: int

    app = App()
    policy: dict[str, Any] = {
        "lease_seconds": LEASE,
        "heartbeat_seconds": args.heartbeat,
        "jitter_seconds": JITTER,
        "missed_heartbeats": 3,
    }
    hold = 3600.0
    if args.shell == "async":

        @app.job(JOB_CLASS, payload=Payload, **policy)
        async def held_async(ctx: Any, p: Payload) -> None:
            await ctx.wait(hold)  # raises once told to stop

    else:

        @app.job(JOB_CLASS, payload=Payload, **policy)
        def held_sync(ctx: Any, p: Payload) -> None:
            ctx.wait(hold)

    kw: dict[str, Any] = {
        "concurrency": args.jobs,
        "receive_wait": 1,
        # A receive moto failed after marking its messages (it happens under load)
        # hides them this long: keep it short so the ramp does not wait a lease.
        "receive_visibility": 30,
        "shutdown_grace": 5.0,
        "sweep_interval": None,
        "journal": Journal(worker_id="bench-scale"),
    }
    worker: Any = (
        AsyncWorker(app, settings, **kw) if args.shell == "async" else Worker(app, settings, **kw)
    )
    report: dict[str, Any] = {"shell": args.shell, "jobs": args.jobs, "backend": args.backend}
    if standin is not None:
        report["standin_ddb"] = standin.backend
        report["seed_seconds"] = round(seeded, 1)
        report["standin_rss_mb"] = report_base_rss
    done = threading.Event()

    def measure() -> None:
        t0 = last_growth = time.monotonic()
        seen = 0
        # Until all are held, or the count stopped growing for RAMP_STALL s (a few
        # messages moto lost track of, or the worker's backpressure holding it at
        # what its heartbeat keeps on time: the figures say how many were held).
        while len(worker.book) < args.jobs and time.monotonic() - t0 < 420:
            if len(worker.book) > seen:
                seen, last_growth = len(worker.book), time.monotonic()
            elif seen and time.monotonic() - last_growth > RAMP_STALL:
                break
            time.sleep(0.2)
        report["ramp_seconds"] = round(time.monotonic() - t0, 1)
        report["held"] = len(worker.book)
        probe.take()
        rows = []
        for _ in range(args.periods):
            w0, c0 = time.monotonic(), time.process_time()
            m0 = standin.cpu if standin else process_cpu(args.moto_pid)
            time.sleep(args.heartbeat)
            wall = time.monotonic() - w0
            cpu = time.process_time() - c0
            moto_cpu = (standin.cpu if standin else process_cpu(args.moto_pid)) - m0
            if standin is not None:
                # The stand-in runs in this process: its CPU is not the worker's cost (a
                # call spanning two periods is counted in the second: clamp the edge).
                cpu = max(0.0, cpu - moto_cpu)
            calls, late, own, rounds = probe.take()
            rows.append(
                {
                    "calls": dict(calls),
                    "calls_total": sum(calls.values()),
                    "extended": len(late),
                    "late_p50": _pct(late, 0.50),
                    "late_p99": _pct(late, 0.99),
                    "late_max": max(late) if late else math.nan,
                    "own_late_p99": _pct(own, 0.99),
                    "own_late_max": max(own) if own else math.nan,
                    "worker_cpu": cpu / wall,
                    "moto_cpu": moto_cpu / wall,
                    "held": len(worker.book),
                    "rounds": len(rounds),
                    "round_p50": _pct(rounds, 0.50),
                    "round_max": max(rounds) if rounds else math.nan,
                    "threads": threading.active_count(),
                }
            )
        report["periods"] = rows
        report["peak_rss_mb"] = round(_rss_kb("VmHWM") / 1024, 1)
        report["load_avg"] = [round(x, 2) for x in os.getloadavg()]
        if standin is not None:
            report["lapsed_extensions"] = standin.lapsed
        _write(args.out, report)
        s0 = time.monotonic()
        worker.stop()
        done.wait(600)
        report["stop_seconds"] = round(time.monotonic() - s0, 1)

    def run_worker() -> None:
        try:
            report["stats"] = worker.run().__dict__
        finally:
            done.set()

    measuring = threading.Thread(target=measure, daemon=True)
    measuring.start()
    run_worker()
    measuring.join(60)
    _write(args.out, report)


def _write(path: str, report: dict[str, Any]) -> None:
    tmp = Path(path + ".tmp")
    tmp.write_text(json.dumps(report, default=str))
    tmp.replace(path)  # the parent sees the whole file or none


# --------------------------------------------------------------------------- rendering


def _label(r: dict[str, Any]) -> str:
    where = "stand-in" if r.get("backend") == "standin" else "moto"
    return f"{r['shell']} {r['jobs']} ({where})"


def render(result: dict[str, Any]) -> str:
    p = result["params"]
    head = (
        f"Handlers await until the worker stops; heartbeat {p['heartbeat_seconds']:g} s, lease "
        f"{p['lease_seconds']} s, jitter {p['jitter_seconds']:g} s; every job held at once "
        f"(`concurrency` = N), then {p['periods']} heartbeat periods measured. The queue holds "
        "all N messages in flight (moto scans it for every visibility change). Lateness: a "
        "job's ChangeMessageVisibility entry sent minus its schedule (`next_beat`; a first "
        "beat due before the lease began, because the receive granted less than L, counts "
        "from the lease's start; negative: sent ahead of its schedule, a lease joined to an "
        "earlier round so the jobs held share their rounds); *own*: "
        "the round's start minus the schedule, before any call (the worker's share). *Rounds*: "
        "the heartbeat rounds that extended leases in the period, and how long each took "
        "(planned to applied); *threads*: the worker process's threads at the period's end "
        "(the thread worker runs a thread per held job). CPU: "
        "seconds per second of wall (1.0 = one core saturated). *(moto)*: the embedded moto "
        "server in its own process; *(stand-in)*: `benchmarks/standin.py` in the worker's "
        "process (SQS from dicts, O(1) per entry; DynamoDB from the simulator's SimDynamo, "
        "conditions evaluated from each request's expressions), whose CPU is timed per call "
        "and counted as the emulator's, not the worker's."
    )
    rows = []
    for r in result["runs"]:
        for i, per in enumerate(r.get("periods", [])):
            rows.append(
                [
                    _label(r) if i == 0 else "",
                    i + 1,
                    per["held"],
                    per["extended"],
                    per["calls_total"],
                    ", ".join(f"{k} {v}" for k, v in sorted(per["calls"].items())),
                    fmt(per["late_p50"], 3),
                    fmt(per["late_p99"], 3),
                    fmt(per["late_max"], 3),
                    fmt(per["own_late_p99"], 3),
                    f"{per.get('rounds', '-')}: {fmt(per.get('round_p50', math.nan), 3)} / "
                    f"{fmt(per.get('round_max', math.nan), 3)}",
                    per.get("threads", "-"),
                    fmt(per["worker_cpu"]),
                    fmt(per["moto_cpu"]),
                ]
            )
    summary = [
        [
            _label(r),
            r.get("held"),
            r.get("ramp_seconds"),
            r.get("peak_rss_mb"),
            r.get("standin_rss_mb", "-"),
            r.get("stop_seconds", f"> {STOP_WAIT:g} (killed)"),
            r.get("stats", {}).get("released"),
            r.get("seed_seconds"),
            r.get("lapsed_extensions", "-"),
            " / ".join(f"{x:g}" for x in r.get("load_avg", [])),
            r.get("error", ""),
        ]
        for r in result["runs"]
    ]
    return "\n".join(
        [
            head,
            "",
            table(
                [
                    "worker",
                    "period",
                    "held",
                    "extended",
                    "calls",
                    "calls by op",
                    "late p50 s",
                    "late p99 s",
                    "late max s",
                    "own late p99 s",
                    "rounds: p50 / max s",
                    "threads",
                    "worker CPU",
                    "emulator CPU",
                ],
                rows,
            ),
            "",
            table(
                [
                    "worker",
                    "jobs held",
                    "ramp s (receive + claim all)",
                    "peak RSS MB",
                    "of it, stand-in + seed before start MB",
                    "stop s (release all)",
                    "released",
                    "seed s",
                    "lapsed extensions",
                    "load avg 1/5/15 min",
                    "error",
                ],
                summary,
            ),
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="benchmarks/bench_scale.py")
    sub = parser.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("child")
    c.add_argument("--shell", choices=["async", "thread"], required=True)
    c.add_argument("--backend", choices=["moto", "standin"], default="moto")
    c.add_argument("--endpoint", required=True)
    c.add_argument("--prefix", required=True)
    c.add_argument("--jobs", type=int, required=True)
    c.add_argument("--heartbeat", type=float, required=True)
    c.add_argument("--periods", type=int, required=True)
    c.add_argument("--moto-pid", type=int, required=True)
    c.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    child(args)
    return 0


if __name__ == "__main__":
    asyncio.set_event_loop_policy(None)
    raise SystemExit(main())
