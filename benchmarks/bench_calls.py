"""Benchmark 1: API calls (and DynamoDB capacity) per job against the protocol's floor.

N jobs go through a real threaded :class:`~sqs_lease.Worker` whose handler lasts
``k`` heartbeats and a half. Jobs are submitted in waves (the real producer) so
the queue never holds more than ``depth`` messages: moto's receive scans the
whole queue, and a deep queue would measure moto. Every call the worker makes
is counted by op (the library's drivers, subclassed to count).

Floor per job (DESIGN.md section 5): receive/10 + claim + commit + delete/10 (the
receive's own VisibilityTimeout is the first lease) + heartbeats x (1/10 CMV batch
+ 1/100 BatchGetItem) + the worker's one liveness write per round, shared by the
jobs it holds (1/concurrency per job-round); no write per job (issue 12 item 1).
"""

from __future__ import annotations

import math
import threading
import time
from typing import Any

from pydantic import BaseModel

from benchmarks.bench_common import (
    HANG_GUARD,
    CountingDriver,
    CpuWindow,
    Moto,
    Tally,
    counting_journal,
    fmt,
    fresh_settings,
    item_size,
    job_bodies,
    job_item,
    moto_server,
    put_items,
    raw_clients,
    rcu_consistent,
    scan_items,
    send_bodies,
    table,
    wait_until,
    wcu,
)
from sqs_lease import App, Producer, Timeouts, Worker
from sqs_lease._jobs import JobContext
from sqs_lease._schema.job_requests import JobTable

NAME = "calls"
TITLE = "1. API calls and DynamoDB capacity per job vs the protocol's floor"

LEASE = 3
HEARTBEAT = 1.0
JITTER = 0.5
MISSED = 2  # 3 > 2 x 1 + 0.5, and 1 <= 3 / 2
JOB_CLASS = "bench.calls"
WINDOW = 1.0
"""The batching window of the third column (``Worker(receive_window=...)``), seconds."""
COLUMNS = {
    # column: (how jobs arrive, the worker's receive_window)
    "batched": ("batched", 0.0),
    "producer": ("producer", 0.0),
    "window": ("producer", WINDOW),
}
HEADS = {
    "batched": "batched",
    "producer": "one by one",
    "window": f"one by one, window {WINDOW:g} s",
}


class CallsPayload(BaseModel):
    n: int
    note: str = ""


def expected_advisories(duration: float, heartbeat: float, lease: float) -> int:
    """Advisory writes the heartbeat plan makes for one job (one per lease/2 elapsed)."""
    advised, count = 0.0, 0
    beat = heartbeat
    while beat <= duration:
        if beat - advised >= lease / 2:
            advised, count = beat, count + 1
        beat += heartbeat
    return count


def _app(duration: float) -> App:
    app = App()

    @app.job(
        JOB_CLASS,
        payload=CallsPayload,
        lease_seconds=LEASE,
        heartbeat_seconds=HEARTBEAT,
        jitter_seconds=JITTER,
        missed_heartbeats=MISSED,
    )
    def handler(ctx: JobContext[Any], payload: CallsPayload) -> dict[str, int]:
        ctx.wait(duration)
        return {"n": payload.n}

    return app


def floor_at_held(held: float, beats: int) -> float:
    """The floor of a short job beating ``beats`` times while rounds hold ``held`` jobs:
    receive/10, claim, commit, delete/10, and per beat its share of one round (a
    visibility batch per 10 jobs, a read per 100, one liveness write): a round of
    fewer than 100 jobs still makes one read and one write, so with fewer held each
    job's share is larger than the 1/100 and 1/concurrency of the issue's floor."""
    if held <= 0:
        return math.nan
    per_round = math.ceil(held / 10) + math.ceil(held / 100) + 1
    return 2.2 + beats * per_round / held


def _pass(
    moto: Moto,
    app: App,
    *,
    arrivals: str,
    receive_window: float,
    n_jobs: int,
    concurrency: int,
    depth: int,
    wave: int,
    quick: bool,
) -> dict[str, Any]:
    """One run of N jobs; ``arrivals``: "batched" (a wave's records, then its messages
    in batches of 10) or "producer" (``Producer.submit``, one job after another);
    ``receive_window``: the worker's batching window (0: off)."""
    settings, url = fresh_settings(moto.endpoint, "calls")
    tally, producer_tally = Tally(), Tally()
    journal, events = counting_journal()
    worker = Worker(
        app,
        settings,
        concurrency=concurrency,
        receive_wait=1,
        receive_window=receive_window,
        journal=journal,
    )
    # The worker's own timeouts (see Worker.__init__), with a counting driver.
    read = max(0.5, min(5.0, HEARTBEAT))
    worker.driver = CountingDriver(settings, tally, Timeouts(read=read), worker.journal)
    worker.poll_driver = CountingDriver(
        settings, tally, Timeouts(read=1 + 5.0, attempts=1), worker.journal
    )
    producer = Producer(settings, app, driver=CountingDriver(settings, producer_tally))
    _ = producer.queue_url
    sqs, ddb = raw_clients(settings)
    table_ = JobTable(settings.jobs_table)

    def deleted() -> int:
        with tally.lock:
            return tally.calls["DeleteMessage"] + tally.entries["DeleteMessageBatch"]

    def submit_wave(first: int, count: int) -> None:
        ids = [f"c{i:05d}" for i in range(first, first + count)]
        if arrivals == "producer":
            for i, job_id in zip(range(first, first + count), ids, strict=True):
                producer.submit(JOB_CLASS, CallsPayload(n=i), job_id)
            return
        items = [
            job_item(table_, j, JOB_CLASS, {"n": first + i, "note": ""}) for i, j in enumerate(ids)
        ]
        put_items(ddb, settings.jobs_table, items)
        send_bodies(sqs, url, job_bodies(ids, JOB_CLASS))

    thread = threading.Thread(target=worker.run, name="bench-worker", daemon=True)
    submitted, max_depth = 0, 0
    with CpuWindow(moto) as window:
        thread.start()
        deadline = time.monotonic() + HANG_GUARD
        while submitted < n_jobs:
            if submitted - deleted() <= depth - wave:
                count = min(wave, n_jobs - submitted)
                submit_wave(submitted, count)
                submitted += count
                max_depth = max(max_depth, submitted - deleted())
            else:
                time.sleep(0.01)
            if time.monotonic() > deadline:
                raise TimeoutError("calls benchmark: submission did not finish")
        wait_until(
            lambda: worker.stats.committed + worker.stats.failed >= n_jobs,
            HANG_GUARD,
            "all jobs committed",
        )
    worker.stop()
    thread.join(timeout=30)
    items = scan_items(ddb, settings.jobs_table)
    return {
        "tally": tally,
        "producer_tally": producer_tally,
        "stats": worker.stats,
        "window": window,
        "max_depth": max_depth,
        "sizes": [item_size(it) for it in items],
        "events": events,
    }


def _summary(
    res: dict[str, Any], n_jobs: int, floor_ops: dict[str, float], floor: float
) -> dict[str, Any]:
    tally: Tally = res["tally"]
    producer_tally: Tally = res["producer_tally"]
    stats = res["stats"]
    window: CpuWindow = res["window"]
    sizes: list[int] = res["sizes"]
    busy = sum(c for label, c in tally.calls.items() if label != "ReceiveMessage(empty)")
    biggest = max(sizes) if sizes else 0
    writes = sum(
        tally.calls[x] for x in ("UpdateItem(claim)", "UpdateItem(commit)", "UpdateItem(advise)")
    )
    reads = tally.entries["BatchGetItem"]
    return {
        "committed": stats.committed,
        "failed": stats.failed,
        "lost": stats.lost,
        "queue_depth_seen": res["max_depth"],
        "wall_seconds": window.wall,
        "jobs_per_second": n_jobs / window.wall,
        "moto_busy": window.moto_busy,
        "calls_by_op_per_job": {label: c / n_jobs for label, c in sorted(tally.calls.items())},
        "calls_per_job": busy / n_jobs,
        "calls_per_job_with_idle_polls": tally.total() / n_jobs,
        "ratio_to_floor": busy / n_jobs / floor,
        "heartbeats_per_job": tally.entries["ChangeMessageVisibilityBatch"] / n_jobs,
        "cmv_batch_fill": tally.entries["ChangeMessageVisibilityBatch"]
        / max(1, tally.calls["ChangeMessageVisibilityBatch"]),
        "batch_get_fill": reads / max(1, tally.calls["BatchGetItem"]),
        "delete_batch_fill": tally.entries["DeleteMessageBatch"]
        / max(1, tally.calls["DeleteMessageBatch"]),
        "messages_per_receive": tally.entries["ReceiveMessage"]
        / max(1, tally.calls["ReceiveMessage"]),
        "advisories_per_job": tally.calls["UpdateItem(advise)"] / n_jobs,
        "errors": dict(tally.errors),
        "journal": {
            name: res["events"].counts[name]
            for name in (
                "heartbeat_lost",
                "ownership_unknown",
                "lease_dropped",
                "result_rejected",
                "job_reclaimed",
            )
        },
        "heartbeat_lost_reasons": dict(res["events"].lost_reasons),
        "producer_calls_per_job": {
            label: c / n_jobs for label, c in sorted(producer_tally.calls.items())
        },
        "item_bytes_max": biggest,
        "item_bytes_mean": sum(sizes) / len(sizes) if sizes else 0.0,
        "worker_writes_per_job": writes / n_jobs,
        "worker_wcu_per_job": writes * wcu(biggest) / n_jobs,
        "worker_item_reads_per_job": reads / n_jobs,
        "worker_rcu_per_job": reads * rcu_consistent(biggest) / n_jobs,
        "producer_wcu_per_job": (
            producer_tally.count("PutItem", "UpdateItem(mark_sent)") * wcu(biggest) / n_jobs
        ),
    }


def run(quick: bool) -> dict[str, Any]:
    n_jobs = 6 if quick else 200
    concurrency = 6 if quick else 50
    depth = 12 if quick else 50
    wave = 6 if quick else 25
    k = 1 if quick else 2
    duration = k * HEARTBEAT + HEARTBEAT / 2
    adv_expected = expected_advisories(duration, HEARTBEAT, LEASE)
    floor_ops = {
        "ReceiveMessage": 1 / 10,
        "UpdateItem(claim)": 1.0,
        "UpdateItem(commit)": 1.0,
        "DeleteMessageBatch": 1 / 10,
        "ChangeMessageVisibilityBatch": k / 10,
        "BatchGetItem": k / 100,
        "PutItem(liveness)": k / concurrency,
    }
    floor = sum(floor_ops.values())
    app = _app(duration)
    out: dict[str, Any] = {
        "params": {
            "jobs": n_jobs,
            "concurrency": concurrency,
            "queue_depth_max": depth,
            "wave": wave,
            "handler_seconds": duration,
            "heartbeats_planned": k,
            "lease_seconds": LEASE,
            "heartbeat_seconds": HEARTBEAT,
        },
        "floor_by_op_per_job": floor_ops,
        "floor_calls_per_job": floor,
        "advisories_expected": adv_expected,
    }
    with moto_server() as moto:
        for column, (arrivals, receive_window) in COLUMNS.items():
            res = _pass(
                moto,
                app,
                arrivals=arrivals,
                receive_window=receive_window,
                n_jobs=n_jobs,
                concurrency=concurrency,
                depth=depth,
                wave=wave,
                quick=quick,
            )
            col = out[column] = _summary(res, n_jobs, floor_ops, floor)
            held = col["batch_get_fill"]  # keys per ownership read: the jobs a round held
            col["held_per_round"] = held
            col["floor_at_held"] = floor_at_held(held, k)
            col["ratio_to_floor_at_held"] = col["calls_per_job"] / col["floor_at_held"]
    return out


def _slash(cols: list[dict[str, Any]], key: str, digits: int = 2) -> str:
    """One figure per column, as "a / b / c"."""
    return " / ".join(fmt(c[key], digits) if digits >= 0 else str(c[key]) for c in cols)


def _journal_line(cols: list[dict[str, Any]]) -> str:
    names = list(cols[0]["journal"])
    counts = ", ".join(
        f"{name} " + " / ".join(str(c["journal"][name]) for c in cols) for name in names
    )
    reasons: dict[str, int] = {}
    for col in cols:
        for why, n in col["heartbeat_lost_reasons"].items():
            reasons[why] = reasons.get(why, 0) + n
    text = f"- Journal ({' / '.join(HEADS.values())}): {counts}."
    if reasons:
        text += " heartbeat_lost reasons: " + ", ".join(f"{k!r} x{v}" for k, v in reasons.items())
        text += "."
    if reasons and set(reasons) == {"job is succeeded"}:
        text += (
            " **Each is a heartbeat round racing its job's own commit**: the round picked the "
            "job while its handler ran, the handler returned and committed, then the round's "
            "consistent ownership read found the job "
            "`succeeded` and the flow journaled a lost lease for a job that had just succeeded. "
            "Harmless (the worker ignores beats of finished jobs; no lease was lost), but a "
            "misleading event."
        )
    return text


def render(r: dict[str, Any]) -> str:
    p = r["params"]
    cols = [r[name] for name in COLUMNS]
    b, t = r["batched"], r["producer"]
    floor: dict[str, float] = r["floor_by_op_per_job"]
    heads = " / ".join(HEADS.values())
    notes = {
        "ReceiveMessage": "messages per receive: "
        + ", ".join(f"{fmt(r[n]['messages_per_receive'], 1)} {HEADS[n]}" for n in COLUMNS),
        "DeleteMessageBatch": f"ended jobs' messages, {_slash(cols, 'delete_batch_fill', 1)} "
        "per batch",
        "ChangeMessageVisibilityBatch": (
            f"{fmt(b['heartbeats_per_job'])} beats/job; entries per batch: "
            f"{_slash(cols, 'cmv_batch_fill', 1)}"
        ),
        "BatchGetItem": f"keys per call: {_slash(cols, 'batch_get_fill', 1)}; one read a round "
        "for every job held, so 1/100 per job only with 100 held",
        "PutItem(liveness)": "the worker's liveness record, once per round for all the jobs "
        "it holds (lease left and heartbeat age for `jobs show`)",
        "ReceiveMessage(empty)": "idle long polls (between waves); not in the total",
    }
    labels = sorted({label for c in cols for label in c["calls_by_op_per_job"]} | set(floor))
    rows: list[list[Any]] = [
        [
            label,
            *(c["calls_by_op_per_job"].get(label, 0.0) for c in cols),
            floor.get(label, "-"),
            notes.get(label, ""),
        ]
        for label in labels
    ]
    rows.append(
        [
            "**total (busy calls)**",
            *(c["calls_per_job"] for c in cols),
            r["floor_calls_per_job"],
            "**" + " / ".join(f"{fmt(c['ratio_to_floor'])} x" for c in cols) + " the floor**; "
            "at the jobs its rounds held ("
            + " / ".join(fmt(c["held_per_round"], 0) for c in cols)
            + "), whose floor is "
            + " / ".join(fmt(c["floor_at_held"]) for c in cols)
            + ": **"
            + " / ".join(f"{fmt(c['ratio_to_floor_at_held'])} x" for c in cols)
            + "**",
        ]
    )
    producer = ", ".join(f"{k} {fmt(v)}" for k, v in t["producer_calls_per_job"].items())
    errors = {k: v for c in cols for k, v in c["errors"].items()}
    err_text = ", ".join(f"{k} x{v}" for k, v in errors.items()) or "none"
    return "\n".join(
        [
            f"{p['jobs']} jobs per column through one threaded `Worker` (concurrency "
            f"{p['concurrency']}), handler {fmt(p['handler_seconds'], 1)} s = "
            f"{p['heartbeats_planned']} heartbeats (L = {p['lease_seconds']} s, H = "
            f"{fmt(p['heartbeat_seconds'], 1)} s), waves of {p['wave']} jobs, **queue depth "
            f"held <= {p['queue_depth_max']}** (seen {_slash(cols, 'queue_depth_seen', -1)}). "
            "Columns: *batched* = a wave's records written, then its messages sent 10 per "
            "SendMessageBatch; *one by one* = the real `Producer.submit` per job, so messages "
            "trickle in and each long poll returns about one; *window* = the same trickle to a "
            f"worker with `receive_window={WINDOW:g}` (after a short receive it waits "
            f"{WINDOW:g} s, so the messages sent meanwhile come in one receive: fewer requests "
            "for up to that much latency; off by default).",
            "",
            table(
                ["call (worker)", *(f"{h} / job" for h in HEADS.values()), "floor / job", "note"],
                rows,
            ),
            "",
            f"- Columns {heads}: committed {_slash(cols, 'committed', -1)}, failed "
            f"{_slash(cols, 'failed', -1)}, lost {_slash(cols, 'lost', -1)}; call errors: "
            f"{err_text}. {_slash(cols, 'jobs_per_second', 1)} jobs/s, set by the handler's "
            "duration; moto busy "
            + " / ".join(f"{fmt(100 * c['moto_busy'], 0)}%" for c in cols)
            + " of one core: not the limit here.",
            _journal_line(cols),
            f"- Producer per job (not in the worker's totals): {producer}.",
            f"- DynamoDB per job (worker): {fmt(b['worker_writes_per_job'])} writes = "
            f"**{fmt(b['worker_wcu_per_job'])} WCU**, {fmt(b['worker_item_reads_per_job'])} "
            f"strongly consistent item reads = **{fmt(b['worker_rcu_per_job'])} RCU** "
            f"(one by one: {fmt(t['worker_wcu_per_job'])} WCU, "
            f"{fmt(t['worker_rcu_per_job'])} RCU); producer {fmt(t['producer_wcu_per_job'])} "
            f"WCU. Items are at most {b['item_bytes_max']} B (mean "
            f"{fmt(b['item_bytes_mean'], 0)} B), so each write is 1 WCU (1 KB steps) and each "
            "consistent read 1 RCU (4 KB steps); a failed conditional write is billed too. "
            "Computed from the stored items' sizes by DynamoDB's rules, because moto's "
            "`ReturnConsumedCapacity` is a constant (1.0 per op, BatchGetItem = key count), "
            "not a measurement.",
        ]
    )
