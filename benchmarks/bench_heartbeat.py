"""Benchmark 3: one heartbeat round with M jobs in flight, batched vs naive, sync vs async.

M job records are written ``running`` (token 1, this worker) and M messages are
received and held (visibility 900 s), so the queue holds exactly M messages, all
in flight, none visible: moto scans the queue for each receipt handle, so the
depth is part of the result and is reported. Then, per round:

- *batched* (``heartbeat_flow``): CMV batches of 10, then consistent BatchGetItem
  of 100 keys (M/10 + M/100 calls);
- *naive*: M single ChangeMessageVisibility, then M conditional UpdateItem
  (token and state unchanged), which is how ownership is often confirmed;
- *async*: ``heartbeat_flow`` through ``AsyncDriver``, sequential, and as chunks of
  100 jobs run concurrently with ``asyncio.gather`` (the same calls in flight at once).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

from benchmarks.bench_common import (
    CountingDriver,
    CpuWindow,
    Moto,
    Tally,
    fmt,
    fresh_settings,
    job_bodies,
    job_item,
    median,
    moto_server,
    put_items,
    raw_clients,
    table,
)
from sqs_lease import Settings
from sqs_lease._aio import AsyncDriver
from sqs_lease._clock import lease_clock
from sqs_lease._core.calls import Call, Ok
from sqs_lease._core.heartbeats import HeartbeatReport, heartbeat_flow
from sqs_lease._core.lease import LocalLease
from sqs_lease._schema.job_requests import JobTable

NAME = "heartbeat"
TITLE = "3. One heartbeat round with M jobs in flight: batched vs naive, sync vs async"

WORKER = "bench-heartbeat"
JOB_CLASS = "bench.heartbeat"
LEASE = 900
CHUNK = 100


def _hold(moto: Moto, m: int) -> tuple[Settings, str, list[LocalLease], float]:
    """M running records and M received messages; returns leases and setup seconds."""
    t0 = time.monotonic()
    settings, url = fresh_settings(moto.endpoint, "hb")
    sqs, ddb = raw_clients(settings)
    jobs = JobTable(settings.jobs_table)
    ids = [f"h{i:05d}" for i in range(m)]
    put_items(
        ddb,
        settings.jobs_table,
        [job_item(jobs, j, JOB_CLASS, {"n": i}, running_as=WORKER) for i, j in enumerate(ids)],
    )
    bodies = job_bodies(ids, JOB_CLASS)
    handles: dict[str, str] = {}
    # Send and receive in steps of 10, so the visible depth stays at 10 while the
    # in-flight count grows to M (each of moto's receives scans the whole queue).
    for i in range(0, m, 10):
        chunk = bodies[i : i + 10]
        sqs.send_message_batch(
            QueueUrl=url, Entries=[{"Id": str(j), "MessageBody": b} for j, b in enumerate(chunk)]
        )
        want = len(chunk)
        while want > 0:
            out = sqs.receive_message(
                QueueUrl=url, MaxNumberOfMessages=want, VisibilityTimeout=LEASE
            )
            for msg in out.get("Messages") or []:
                handles[json.loads(msg["Body"])["job_id"]] = msg["ReceiptHandle"]
                want -= 1
    now = lease_clock()  # the clock the drivers stamp outcomes with
    leases = [
        LocalLease(
            job_id=j,
            token=1,
            receipt_handle=handles[j],
            lease_seconds=LEASE,
            heartbeat_seconds=60.0,
            jitter_seconds=5.0,
            deadline=now + LEASE,
            started_at=now,
            stage_deadline=now + 10 * LEASE,
        )
        for j in ids
    ]
    return settings, url, leases, time.monotonic() - t0


def _check(report: HeartbeatReport, leases: Sequence[LocalLease], what: str) -> None:
    bad = [b for b in report.beats.values() if b.status != "ok"]
    if bad or len(report.beats) != len(leases):
        raise RuntimeError(f"{what}: {len(bad)} beats not ok, e.g. {bad[:1]}")


def _timed(moto: Moto, fn: Callable[[], int]) -> dict[str, float]:
    with CpuWindow(moto) as w:
        calls = fn()
    return {"seconds": w.wall, "calls": calls, "moto_cpu": w.moto_cpu, "client_cpu": w.client_cpu}


def _measure(moto: Moto, m: int, rounds: int, naive_rounds: int) -> dict[str, Any]:
    settings, url, leases, setup = _hold(moto, m)
    jobs = JobTable(settings.jobs_table)
    tally = Tally()
    driver = CountingDriver(settings, tally)

    def batched() -> int:
        report = driver.run(
            heartbeat_flow(
                jobs, queue_url=url, leases=leases, worker_id=WORKER, wall_now=time.time()
            )
        )
        _check(report, leases, "batched")
        return report.calls

    def naive() -> int:
        calls = 0
        for lease in leases:
            out = driver.execute(
                Call(
                    "sqs",
                    "ChangeMessageVisibility",
                    {
                        "QueueUrl": url,
                        "ReceiptHandle": lease.receipt_handle,
                        "VisibilityTimeout": lease.lease_seconds,
                    },
                )
            )
            calls += 1
            if not isinstance(out, Ok):
                raise RuntimeError(f"naive CMV failed: {out.code}")
        now = time.time()
        for lease in leases:
            # A fenced conditional write per job (token 1 and running), as a naive
            # heartbeat would confirm ownership one job at a time.
            out = driver.execute(jobs.save_progress(lease.job_id, 1, "{}", now))
            calls += 1
            if not isinstance(out, Ok):
                raise RuntimeError(f"naive conditional UpdateItem failed: {out.code}")
        return calls

    async def async_rounds() -> tuple[list[dict[str, float]], list[dict[str, float]]]:
        seq: list[dict[str, float]] = []
        gathered: list[dict[str, float]] = []
        async with AsyncDriver(settings) as ad:

            async def one(chunk: Sequence[LocalLease]) -> int:
                report = await ad.run(
                    heartbeat_flow(
                        jobs, queue_url=url, leases=chunk, worker_id=WORKER, wall_now=time.time()
                    )
                )
                _check(report, chunk, "async")
                return report.calls

            await one(leases)  # open the connections before timing
            for _ in range(rounds):
                with CpuWindow(moto) as w:
                    calls = await one(leases)
                seq.append({"seconds": w.wall, "calls": calls, "moto_cpu": w.moto_cpu})
                chunks = [leases[i : i + CHUNK] for i in range(0, len(leases), CHUNK)]
                with CpuWindow(moto) as w:
                    counts = await asyncio.gather(*(one(c) for c in chunks))
                gathered.append({"seconds": w.wall, "calls": sum(counts), "moto_cpu": w.moto_cpu})
        return seq, gathered

    batched()  # warm the connection pool
    results: dict[str, list[dict[str, float]]] = {"batched": [], "naive": []}
    for i in range(max(rounds, naive_rounds)):
        if i < rounds:
            results["batched"].append(_timed(moto, batched))
        if i < naive_rounds:
            results["naive"].append(_timed(moto, naive))
    results["async sequential"], results["async gather"] = asyncio.run(async_rounds())
    summary: dict[str, Any] = {}
    for method, rs in results.items():
        secs = [r["seconds"] for r in rs]
        summary[method] = {
            "seconds_per_round": median(secs),
            "rounds": [round(s, 3) for s in secs],
            "calls_per_round": rs[0]["calls"],
            "moto_cpu_per_round": median([r["moto_cpu"] for r in rs]),
            "moto_busy": sum(r["moto_cpu"] for r in rs) / sum(secs),
        }
    base = summary["batched"]["seconds_per_round"]
    for v in summary.values():
        v["vs_batched"] = v["seconds_per_round"] / base
    per_op = {
        op: tally.seconds[op] / tally.calls[op] * 1000
        for op in sorted(tally.calls)
        if tally.calls[op]
    }
    return {
        "in_flight": m,
        "queue_depth": m,
        "visible": 0,
        "setup_seconds": setup,
        "methods": summary,
        "sync_ms_per_call": per_op,
    }


def run(quick: bool) -> dict[str, Any]:
    # 1,000 in flight takes minutes to set up on a loaded machine: --full only.
    sizes = (20,) if quick else ((100, 1000) if os.environ.get("BENCH_FULL") else (100, 400))
    out: dict[str, Any] = {"params": {"sizes": list(sizes), "chunk": CHUNK}, "sizes": {}}
    with moto_server() as moto:
        for m in sizes:
            rounds = 1 if quick else (5 if m <= 100 else 3)
            naive_rounds = 1 if quick or m > 100 else 3
            out["sizes"][str(m)] = _measure(moto, m, rounds, naive_rounds)
    return out


def render(r: dict[str, Any]) -> str:
    rows: list[list[Any]] = []
    notes = []
    for m, res in r["sizes"].items():
        for method, v in res["methods"].items():
            rows.append(
                [
                    m,
                    method,
                    v["seconds_per_round"],
                    " / ".join(fmt(x, 3) for x in v["rounds"]),
                    int(v["calls_per_round"]),
                    f"{fmt(v['vs_batched'])} x",
                    v["moto_cpu_per_round"],
                    f"{fmt(100 * v['moto_busy'], 0)}%",
                ]
            )
        ms = ", ".join(f"{op} {fmt(x, 1)} ms" for op, x in res["sync_ms_per_call"].items())
        notes.append(
            f"- M = {m}: queue depth {res['queue_depth']} (all in flight, {res['visible']} "
            f"visible); setting them up took {fmt(res['setup_seconds'], 1)} s. Mean latency "
            f"per sync call: {ms}."
        )
    big = r["sizes"].get(str(max(int(m) for m in r["sizes"])))
    verdict = ""
    if big is not None:
        mm = big["methods"]
        verdict = (
            f"With M = {big['in_flight']}: the naive round takes "
            f"**{fmt(mm['naive']['vs_batched'], 1)} x** the batched one "
            f"({int(mm['naive']['calls_per_round'])} calls vs "
            f"{int(mm['batched']['calls_per_round'])}). Through the async driver the same "
            f"round takes {fmt(mm['async sequential']['vs_batched'])} x the sync one when its "
            f"calls go one after another and **{fmt(mm['async gather']['vs_batched'])} x** "
            f"with {big['in_flight'] // r['params']['chunk']} chunks in flight at once: "
            f"concurrency only keeps moto busier ({fmt(100 * mm['async gather']['moto_busy'], 0)}%"
            f" of a core vs {fmt(100 * mm['batched']['moto_busy'], 0)}% for the sync round). "
            f"Moto's own CPU per batched round ({fmt(mm['batched']['moto_cpu_per_round'])} s) "
            "is the floor no client-side concurrency can beat, since moto serves under one GIL. "
            f"So one process holding {big['in_flight']} jobs against this moto keeps its "
            f"heartbeats on time only with H above about "
            f"{fmt(mm['async gather']['seconds_per_round'], 1)} s (async) / "
            f"{fmt(mm['batched']['seconds_per_round'], 1)} s (sync) plus the jitter budget."
        )
    return "\n".join(
        [
            "One round extends and confirms every held job. Methods as in the module doc: "
            "*batched* = `heartbeat_flow` (CMV batches of 10 + BatchGetItem of 100, "
            "consistent), *naive* = M single CMV + M conditional UpdateItem, *async gather* = "
            f"chunks of {r['params']['chunk']} jobs through `AsyncDriver` at once.",
            "",
            table(
                [
                    "M in flight",
                    "method",
                    "s / round (median)",
                    "rounds",
                    "calls / round",
                    "vs batched sync",
                    "moto CPU s / round",
                    "moto busy",
                ],
                rows,
            ),
            "",
            verdict,
            "",
            *notes,
        ]
    )
