"""Benchmark 2: overhead against a bare boto3 receive/delete loop, in one run.

The same N messages (handler duration 0, the same concurrency) go through:

- ``bare``: receive 10 -> run the handlers on C threads -> DeleteMessageBatch;
- ``powertools``: the same loop, each handler wrapped in Powertools for AWS
  Lambda's ``idempotent_function`` with its ``DynamoDBPersistenceLayer`` (what an
  idempotent SQS-triggered Lambda does per record), when the package is installed;
- ``fenced loop``: the minimal fenced loop, the protocol's floor made by hand: the
  same loop making, per message, the conditional claim (UpdateItem, token + 1) and
  the fenced commit (UpdateItem on that token), with plain boto3 and no logic, and
  one DeleteMessageBatch per receive (2.2 requests per job). Its two requests are
  built by the toolkit's own ``JobTable.claim`` / ``JobTable.commit``, so they keep
  the worker's request shape (moto's cost per write grows with the expression).
  moto's own throughput for the calls the protocol needs: the baseline that tells
  whether moto or the worker is the limit;
- ``sqs-lease``: a real threaded ``Worker``;
- ``sqs-lease async``: a real ``AsyncWorker`` (the same plain handler, in its pool).

A feeder keeps every queue at the same depth (SendMessageBatch, its calls not
counted), so moto's queue scans cost the same for everyone. Contenders run
interleaved, repeated: the load of a shared machine drifts by tens of percent
within a minute, so a ratio is taken within each repetition (contenders run
back to back) and the median of those ratios counts; moto's CPU per job is the
median over every run.
"""

from __future__ import annotations

import importlib
import json
import os
import statistics
import threading
import time
import warnings
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from benchmarks.bench_common import (
    HANG_GUARD,
    CpuWindow,
    Feeder,
    Moto,
    count_client_calls,
    fmt,
    fresh_settings,
    job_bodies,
    job_item,
    moto_server,
    put_items,
    ratio,
    raw_clients,
    table,
    wait_until,
)
from sqs_lease import App, AsyncWorker, Journal, Settings, Worker
from sqs_lease._aio import AsyncDriver
from sqs_lease._core.calls import Call, Outcome
from sqs_lease._jobs import JobContext
from sqs_lease._schema.job_requests import JobTable

NAME = "overhead"
TITLE = "2. Overhead vs a bare boto3 loop (and Powertools idempotency), same run"

JOB_CLASS = "bench.overhead"
LEASE = 30
RAW_WORKER = "bench-raw"
CONTENDERS = ("bare", "powertools", "fenced loop", "sqs-lease", "sqs-lease async")
WORKERS = ("sqs-lease", "sqs-lease async")


class OverheadPayload(BaseModel):
    n: int


def _app() -> App:
    app = App()

    @app.job(JOB_CLASS, payload=OverheadPayload, lease_seconds=LEASE)
    def handler(ctx: JobContext[Any], payload: OverheadPayload) -> dict[str, int]:
        return {"n": payload.n}

    return app


@dataclass
class Run:
    contender: str
    jobs: int
    wall: float
    moto_cpu: float
    client_cpu: float
    calls: Counter[str] = field(default_factory=Counter)
    max_depth: int = 0

    @property
    def jobs_per_second(self) -> float:
        return self.jobs / self.wall


def _powertools() -> tuple[Any, str]:
    """Powertools' idempotency module, or None and why it is left out."""
    try:
        mod = importlib.import_module("aws_lambda_powertools.utilities.idempotency")
        version = importlib.import_module("aws_lambda_powertools.shared.version").VERSION
    except ImportError:
        return None, (
            "aws-lambda-powertools is not installed in this environment (it is not a "
            "dependency of the library): `make bench` installs the `bench` extra "
            "(`pip install -c constraints.txt -e '.[bench]'`), and the next run includes it"
        )
    return mod, str(version)


def _idempotent_handler(pt: Any, ddb: Any, table_name: str) -> Callable[[dict[str, Any]], Any]:
    ddb.create_table(
        TableName=table_name,
        KeySchema=[{"AttributeName": "id", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "id", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    layer = pt.DynamoDBPersistenceLayer(table_name=table_name, boto3_client=ddb)
    config = pt.IdempotencyConfig(event_key_jmespath="messageId")

    def handle(record: dict[str, Any]) -> dict[str, Any]:
        return {"n": json.loads(record["body"])["job_id"]}

    wrapped: Callable[..., Any] = pt.idempotent_function(
        handle, data_keyword_argument="record", persistence_store=layer, config=config
    )
    return lambda record: wrapped(record=record)


def _loop_contender(
    moto: Moto,
    settings: Settings,
    url: str,
    bodies: list[str],
    concurrency: int,
    depth: int,
    kind: str,
    pt: Any,
) -> Run:
    """bare / powertools / fenced loop: receive 10, handle on the pool, delete."""
    sqs, ddb = raw_clients(settings)
    feed_sqs, _ = raw_clients(settings)
    calls: Counter[str] = Counter()
    lock = threading.Lock()
    count_client_calls(sqs, calls, lock)
    count_client_calls(ddb, calls, lock)
    jobs = JobTable(settings.jobs_table)
    per_message: Callable[[dict[str, Any]], Any]
    if kind == "bare":

        def per_message(m: dict[str, Any]) -> None:
            return None

    elif kind == "powertools":
        per_message = _idempotent_handler(pt, ddb, f"{settings.prefix}-powertools")
    else:

        def per_message(m: dict[str, Any]) -> None:
            body = json.loads(m["Body"])
            job_id = body["job_id"]
            now = time.time()
            claim = jobs.claim(
                job_id,
                RAW_WORKER,
                now,
                LEASE,
                job_class=body["job_class"],
                send_id=body.get("send_id"),
            )
            old = ddb.update_item(**claim.params)
            token = int(old["Attributes"]["token"]["N"]) + 1
            ddb.update_item(
                **jobs.commit(
                    job_id, token, RAW_WORKER, "{}", now, write_id=f"{job_id}:commit"
                ).params
            )

    done = 0
    with lock:
        calls.clear()  # setup (the Powertools table) is not the run's
    feeder = Feeder(feed_sqs, url, bodies, depth, lambda: done)
    with ThreadPoolExecutor(concurrency) as pool, CpuWindow(moto) as window:
        feeder.start()
        deadline = time.monotonic() + HANG_GUARD
        while done < len(bodies) and time.monotonic() < deadline:
            out = sqs.receive_message(
                QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1, VisibilityTimeout=LEASE
            )
            msgs: list[dict[str, Any]] = out.get("Messages") or []
            if not msgs:
                continue
            if kind == "powertools":
                records = [{"messageId": m["MessageId"], "body": m["Body"]} for m in msgs]
                list(pool.map(per_message, records))
            else:
                list(pool.map(per_message, msgs))
            # Every loop deletes a receive's messages in one batch.
            entries = [
                {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(msgs)
            ]
            sqs.delete_message_batch(QueueUrl=url, Entries=entries)
            done += len(msgs)
    feeder.stop()
    if done < len(bodies):
        raise TimeoutError(f"{kind}: {done} of {len(bodies)} messages in 300 s")
    return Run(kind, done, window.wall, window.moto_cpu, window.client_cpu, calls, feeder.max_depth)


def _counting_async(calls: Counter[str], lock: threading.Lock) -> Callable[[], None]:
    """Count the async driver's calls by op (its clients are made inside ``serve``)."""
    execute = AsyncDriver.execute

    async def counted(driver: AsyncDriver, c: Call) -> Outcome:
        with lock:
            calls[c.op] += 1
        return await execute(driver, c)

    AsyncDriver.execute = counted  # type: ignore[method-assign,assignment]

    def undo() -> None:
        AsyncDriver.execute = execute  # type: ignore[method-assign]

    return undo


def _worker_contender(
    moto: Moto,
    settings: Settings,
    url: str,
    bodies: list[str],
    concurrency: int,
    depth: int,
    kind: str,
) -> Run:
    worker: Worker | AsyncWorker
    calls: Counter[str] = Counter()
    lock = threading.Lock()
    undo: Callable[[], None] = lambda: None  # noqa: E731
    if kind == "sqs-lease":
        worker = Worker(
            _app(), settings, concurrency=concurrency, receive_wait=1, journal=Journal()
        )
        for drv in (worker.driver, worker.poll_driver):
            for client in drv.clients.values():
                count_client_calls(client, calls, lock)
    else:
        worker = AsyncWorker(
            _app(),
            settings,
            concurrency=concurrency,
            threads=concurrency,
            receive_wait=1,
            journal=Journal(),
        )
        undo = _counting_async(calls, lock)
    feed_sqs, _ = raw_clients(settings)

    def committed() -> int:
        return worker.stats.committed

    feeder = Feeder(feed_sqs, url, bodies, depth, committed)
    thread = threading.Thread(target=worker.run, name="bench-worker", daemon=True)
    # Started before the window: the async worker makes its clients as it starts
    # (the thread worker made them in its constructor); a start is not per job.
    thread.start()
    if isinstance(worker, AsyncWorker):
        wait_until(lambda: worker._driver is not None, HANG_GUARD, "the async worker started")
    time.sleep(0.5)
    with CpuWindow(moto) as window:
        feeder.start()
        wait_until(lambda: committed() >= len(bodies), HANG_GUARD, "sqs-lease: all jobs committed")
    feeder.stop()
    worker.stop()
    thread.join(timeout=30)
    undo()
    return Run(
        kind,
        committed(),
        window.wall,
        window.moto_cpu,
        window.client_cpu,
        calls,
        feeder.max_depth,
    )


def _point(r: Run, concurrency: int) -> dict[str, float]:
    return {
        "concurrency": concurrency,
        "jobs_per_second": r.jobs_per_second,
        "calls_per_job": sum(r.calls.values()) / r.jobs,
        "moto_busy": r.moto_cpu / r.wall,
    }


def _one(moto: Moto, kind: str, n: int, concurrency: int, depth: int, pt: Any) -> Run:
    settings, url = fresh_settings(moto.endpoint, "ovh")
    ids = [f"o{i:05d}" for i in range(n)]
    if kind in ("fenced loop", *WORKERS):
        _sqs, ddb = raw_clients(settings)
        jobs = JobTable(settings.jobs_table)
        put_items(
            ddb,
            settings.jobs_table,
            [job_item(jobs, j, JOB_CLASS, {"n": i}) for i, j in enumerate(ids)],
        )
    bodies = job_bodies(ids, JOB_CLASS)
    if kind in WORKERS:
        return _worker_contender(moto, settings, url, bodies, concurrency, depth, kind)
    return _loop_contender(moto, settings, url, bodies, concurrency, depth, kind, pt)


SWEPT = ("powertools", "fenced loop", "sqs-lease", "sqs-lease async")
"""Contenders run again at other concurrencies, for the plot (throughput and requests
per job against concurrency)."""


def run(quick: bool) -> dict[str, Any]:
    full = bool(os.environ.get("BENCH_FULL"))
    n = 10 if quick else (200 if full else 100)
    reps = 1 if quick else (7 if full else 5)
    concurrency, depth = 10, 50
    sweep_n = 10 if quick else (100 if full else 50)
    sweep_at = (2, 20) if quick else ((1, 5, 25, 50) if full else (1, 25))
    pt, pt_note = _powertools()
    contenders = [c for c in CONTENDERS if c != "powertools" or pt is not None]
    runs: dict[str, list[Run]] = {c: [] for c in contenders}
    sweep: dict[str, list[dict[str, float]]] = {c: [] for c in SWEPT if c in contenders}
    warnings.filterwarnings("ignore", message=".*remaining time left.*")
    with moto_server() as moto:
        for i in range(reps):
            # Every other repetition in reverse, so no contender always runs last.
            for kind in contenders if i % 2 == 0 else contenders[::-1]:
                runs[kind].append(_one(moto, kind, n, concurrency, depth, pt))
        for conc in sweep_at:
            for kind in sweep:
                one = _one(moto, kind, sweep_n, conc, max(depth, 2 * conc), pt)
                sweep[kind].append(_point(one, conc))
    for kind in sweep:
        # The main runs are the point at concurrency 10 (their median).
        main = sorted(runs[kind], key=lambda r: r.jobs_per_second)[len(runs[kind]) // 2]
        sweep[kind].append(_point(main, concurrency))
        sweep[kind].sort(key=lambda p: p["concurrency"])
    out: dict[str, Any] = {
        "params": {
            "messages": n,
            "concurrency": concurrency,
            "queue_depth": depth,
            "reps": reps,
            "sweep_messages": sweep_n,
        },
        "sweep": sweep,
        "powertools": pt_note if pt is None else f"aws-lambda-powertools {pt_note}",
        "powertools_included": pt is not None,
        "contenders": {},
    }
    for kind, rs in runs.items():
        best = sorted(rs, key=lambda r: r.jobs_per_second)[len(rs) // 2]
        out["contenders"][kind] = {
            "jobs_per_second": best.jobs_per_second,
            "jobs_per_second_all": [round(r.jobs_per_second, 1) for r in rs],
            "wall_seconds": best.wall,
            "calls_per_job": sum(best.calls.values()) / best.jobs,
            "calls_by_op_per_job": {k: v / best.jobs for k, v in sorted(best.calls.items())},
            "calls_per_second": sum(best.calls.values()) / best.wall,
            "moto_busy": best.moto_cpu / best.wall,
            "moto_cpu_ms_per_job": statistics.median(1000 * x.moto_cpu / x.jobs for x in rs),
            "client_cpu_ms_per_job": statistics.median(1000 * x.client_cpu / x.jobs for x in rs),
            "max_depth": best.max_depth,
        }
    c = out["contenders"]

    def paired(w: str, kind: str) -> list[float]:
        """The worker's jobs/s over the contender's, within each repetition."""
        return [
            ratio(a.jobs_per_second, b.jobs_per_second)
            for a, b in zip(runs[w], runs[kind], strict=True)
        ]

    out["ratios"] = {
        w: {
            kind: {
                "throughput": statistics.median(paired(w, kind)),
                "throughput_all": [round(x, 2) for x in paired(w, kind)],
                "calls": ratio(c[w]["calls_per_job"], c[kind]["calls_per_job"]),
                "moto_cpu": ratio(c[w]["moto_cpu_ms_per_job"], c[kind]["moto_cpu_ms_per_job"]),
            }
            for kind in contenders
            if kind not in WORKERS
        }
        for w in WORKERS
    }
    return out


def render(r: dict[str, Any]) -> str:
    p = r["params"]
    c: dict[str, Any] = r["contenders"]
    desc = {
        "bare": "receive 10, handlers, DeleteMessageBatch",
        "powertools": "bare + `idempotent_function` (DynamoDB persistence) per message",
        "fenced loop": "bare + conditional claim and fenced commit per message, no logic "
        "(the protocol's floor, 2.2 requests per job)",
        "sqs-lease": "threaded `Worker`: claim, lease, fenced commit, batched delete",
        "sqs-lease async": "`AsyncWorker`, the same plain handler in its pool",
    }
    rows: list[list[Any]] = []
    for kind, v in c.items():
        rt = r["ratios"]["sqs-lease"].get(kind)
        rta = r["ratios"]["sqs-lease async"].get(kind)
        rows.append(
            [
                f"{kind}: {desc[kind]}",
                v["jobs_per_second"],
                " / ".join(fmt(x, 1) for x in v["jobs_per_second_all"]),
                "-" if rt is None else f"{fmt(rt['throughput'])} / {fmt(rta['throughput'])}",
                v["calls_per_job"],
                v["moto_cpu_ms_per_job"],
                f"{fmt(100 * v['moto_busy'], 0)}%",
                v["client_cpu_ms_per_job"],
            ]
        )
    ops = "; ".join(
        f"{kind}: " + ", ".join(f"{k} {fmt(n)}" for k, n in v["calls_by_op_per_job"].items())
        for kind, v in c.items()
    )
    lines: list[str] = []
    for w, label in (("sqs-lease", "thread worker"), ("sqs-lease async", "async worker")):
        rs = r["ratios"][w]
        parts = [
            f"**{fmt(rs[k]['throughput'])} x {k}**"
            for k in ("powertools", "fenced loop")
            if k in rs
        ]
        if parts:
            each = "; ".join(
                f"÷ {k} run by run: " + " / ".join(fmt(x) for x in rs[k]["throughput_all"])
                for k in ("powertools", "fenced loop")
                if k in rs
            )
            lines.append(
                f"The {label} runs at {' and '.join(parts)} (throughput; requests per job "
                f"{fmt(c[w]['calls_per_job'])} vs the fenced loop's "
                f"{fmt(c['fenced loop']['calls_per_job'])}; {each})."
            )
    verdict = " ".join(lines)
    pt_line = (
        f"Powertools: {r['powertools']}, from the `bench` extra that `make bench` installs "
        "(not a dependency of the library); where it is missing the row is left out and "
        "the reason printed here."
        if r["powertools_included"]
        else f"Powertools left out: {r['powertools']}."
    )
    return "\n".join(
        [
            f"{p['messages']} messages per run, handler duration 0, concurrency {p['concurrency']} "
            f"for everyone, **queue depth held at {p['queue_depth']}** by a feeder; "
            f"{p['reps']} interleaved runs each: jobs/s of the median run (all runs' listed); "
            "**a ratio is the median of the ratios within each run**, contenders back to back, "
            "since the load of a shared machine drifts between runs; moto and client CPU per "
            "job are medians over all runs.",
            "",
            table(
                [
                    "contender",
                    "jobs/s",
                    "all runs",
                    "sqs-lease ÷ this (thread / async)",
                    "calls/job",
                    "moto CPU ms/job",
                    "moto busy",
                    "client CPU ms/job",
                ],
                rows,
            ),
            "",
            verdict,
            "",
            f"- Calls per job by op: {ops}.",
            _sweep_line(r),
            f"- {pt_line} Powertools writes the idempotency record twice per message "
            "(PutItem IN_PROGRESS with a condition, UpdateItem COMPLETED); it gives no lease, "
            "no fencing and no heartbeat, so it is cheaper per message but does not stop a "
            "second delivery from running while the first is still alive.",
        ]
    )


def _sweep_line(r: dict[str, Any]) -> str:
    """The concurrency sweep (the plot's upper panels), as one line per contender."""
    sweep: dict[str, list[dict[str, float]]] = r.get("sweep") or {}
    if not sweep:
        return "- No concurrency sweep in this run."
    parts = []
    for kind, points in sweep.items():
        cells = ", ".join(
            f"{int(pt['concurrency'])}: {fmt(pt['jobs_per_second'], 1)} jobs/s "
            f"{fmt(pt['calls_per_job'])} req/job"
            for pt in points
        )
        parts.append(f"{kind} ({cells})")
    return (
        f"- Against concurrency ({r['params'].get('sweep_messages')} messages per point; the "
        "point at 10 is the median run above; plotted in `benchmarks.png`): "
        + "; ".join(parts)
        + "."
    )
