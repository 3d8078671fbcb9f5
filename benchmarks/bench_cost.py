"""Benchmark 6: requests, DynamoDB capacity units and cost per million jobs, by job shape.

Each shape runs N jobs through a real threaded :class:`~sqs_lease.Worker` on moto,
submitted by the real :class:`~sqs_lease.Producer`; every call of both is counted
by op (the library's drivers, subclassed to count). Shapes:

- *short*: a handler that returns at once;
- *one effect*: one ``ctx.effect`` (a no-op tool) before it returns;
- *3 stages*: ``App.staged``, ``a -> b -> c`` (``NextStage`` twice);
- *heartbeat*: handlers held for a few heartbeats: the calls one round makes per
  job held (CMV batches, ownership reads, the worker's liveness write) are
  measured, and a *10-minute job* is the short job plus 600 s / H rounds of them
  (H = the default 5 s), not 10 minutes of waiting.

Capacity units are computed by DynamoDB's size rules, because moto's
``ReturnConsumedCapacity`` is a constant: a write is 1 unit per 1 KB of the item
(rounded up; transactional x2, each entry of a TransactWriteItems counted as a
transactional write, a ConditionCheck too), a read is 1 unit per 4 KB (strongly
consistent 1, eventually consistent 0.5, transactional 2). Item sizes are the
stored items' at the end of the run, per table and kind (job record, liveness
record, intent, ...): the largest, since a write is billed on the larger of the
item before and after. Cost per million jobs at the on-demand list prices in
:data:`PRICES` (us-east-1; the date and source are printed with them), for the
toolkit, an idempotent handler on Powertools (receive/10, PutItem + UpdateItem of
its idempotency record, delete/10) and a bare receive/delete loop. SQS requests
are billed per 64 KB chunk: every message here is far smaller, so one request
per call.
"""

from __future__ import annotations

import math
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from benchmarks.bench_common import (
    HANG_GUARD,
    CountingDriver,
    Moto,
    Tally,
    fmt,
    fresh_settings,
    item_size,
    moto_server,
    raw_clients,
    scan_items,
    table,
    wait_until,
)
from sqs_lease import (
    App,
    EffectCall,
    NextStage,
    Producer,
    Settings,
    Timeouts,
    ToolResult,
    Worker,
)
from sqs_lease._core.calls import Call, Ok, Outcome
from sqs_lease._jobs import JobContext
from sqs_lease._journal import Journal

NAME = "cost"
TITLE = "6. Requests, capacity units and cost per million jobs, by job shape"

PRICES: dict[str, float] = {
    "sqs_standard_per_million_requests": 0.40,
    "sqs_fifo_per_million_requests": 0.50,
    "ddb_on_demand_per_million_wru": 0.625,
    "ddb_on_demand_per_million_rru": 0.125,
}
PRICES_DATE = "2026-03 (SQS) / 2025-07 (DynamoDB, the rates in force since the 2024-11-01 cut)"
PRICES_SOURCE = (
    "AWS list prices, us-east-1, on-demand, first tier (SQS: first 1 M requests a month free, "
    "$0.40 per million standard / $0.50 FIFO up to 100 billion a month; DynamoDB on-demand: "
    "$0.625 per million write request units, $0.125 per million read request units, after the "
    "50% cut of 2024-11-01), as quoted by public pricing guides found through the stored docs "
    "(cloudburn.io 'Amazon SQS Pricing' 2026-03, factualminds.com 2026-06, airbyte.com "
    "'DynamoDB pricing' 2025-07); free tiers and storage not counted. Check "
    "aws.amazon.com/sqs/pricing and aws.amazon.com/dynamodb/pricing before you budget."
)

LEASE = 30  # the class defaults: L = 30 s, H = 5 s
HEARTBEAT = 5.0
TEN_MINUTES = 600.0
# The held pass: short L and H so a few rounds pass quickly (its calls per round
# per job do not depend on H).
HELD_LEASE, HELD_BEAT, HELD_JITTER = 3, 1.0, 0.5


SHORT_FLOOR = 0.1 + 1 + 1 + 0.1
"""receive/10 + claim + commit + delete/10 (DESIGN.md, section 5)."""
EFFECT_FLOOR = SHORT_FLOOR + 3
"""The intent's three writes (DESIGN.md, step 6): prepared (new key), in_progress
(a transaction with the job's token), confirmed."""
STAGE_FLOOR = 3 + 1 + 0.1 + 0.1
"""Each stage after the first (docs/stages.md): the checkpoint, the next message
marked sent and the next stage's claim (3 writes), its SendMessage, receive/10, and
the ended stage's delete in the worker's batch (1/10; at once on a FIFO queue)."""
FLOORS: dict[str, float] = {
    "short": SHORT_FLOOR,
    "effect": EFFECT_FLOOR,
    "staged": SHORT_FLOOR + 2 * STAGE_FLOOR,
}


class Work(BaseModel):
    n: int


@dataclass
class Capacity:
    """What each call consumed, as (table kind, factor, items) to price once the
    stored items' sizes are known."""

    writes: list[tuple[str, float, int]] = field(default_factory=list)
    reads: list[tuple[str, float, int]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


def _kind(table_name: str, item: Mapping[str, Any] | None = None) -> str:
    """The table's role (the part after the run's prefix), and ``jobs:liveness``."""
    role = table_name.rsplit("-", 1)[-1]
    if item is not None and item.get("kind", {}).get("S") == "liveness":
        return f"{role}:liveness"
    return role


def capacity_of(
    c: Call, out: Outcome
) -> tuple[list[tuple[str, float, int]], list[tuple[str, float, int]]]:
    """The (kind, factor, items) writes and reads one DynamoDB call consumes."""
    p = c.params
    writes: list[tuple[str, float, int]] = []
    reads: list[tuple[str, float, int]] = []
    if c.service != "dynamodb":
        return writes, reads
    if c.op in ("PutItem", "UpdateItem", "DeleteItem"):
        writes.append((_kind(p["TableName"], p.get("Item")), 1.0, 1))
    elif c.op == "TransactWriteItems":
        for entry in p.get("TransactItems", []):
            for body in entry.values():
                writes.append((_kind(body["TableName"], body.get("Item")), 2.0, 1))
    elif c.op == "GetItem":
        reads.append((_kind(p["TableName"]), 1.0 if p.get("ConsistentRead") else 0.5, 1))
    elif c.op == "BatchGetItem":
        for name, spec in (p.get("RequestItems") or {}).items():
            factor = 1.0 if spec.get("ConsistentRead") else 0.5
            reads.append((_kind(name), factor, len(spec.get("Keys") or [])))
    elif c.op == "Query" and isinstance(out, Ok):
        # A Query is billed on the summed size of what it read, in 4 KB steps: priced
        # per item here (an upper bound for small items; queries are rare per job).
        n = int(out.response.get("ScannedCount", out.response.get("Count", 0)) or 0)
        reads.append((_kind(p["TableName"]), 1.0 if p.get("ConsistentRead") else 0.5, max(1, n)))
    return writes, reads


class CostDriver(CountingDriver):
    """The counting driver, also noting each DynamoDB call's capacity items."""

    def __init__(self, settings: Settings, tally: Tally, cap: Capacity, **kw: Any) -> None:
        super().__init__(settings, tally, **kw)
        self.cap = cap

    def execute(self, c: Call) -> Outcome:
        out = super().execute(c)
        w, r = capacity_of(c, out)
        with self.cap.lock:
            self.cap.writes += w
            self.cap.reads += r
        return out


def wcu(size: int) -> int:
    return max(1, math.ceil(size / 1024))


def rcu(size: int) -> int:
    return max(1, math.ceil(size / 4096))


def units(cap: Capacity, sizes: Mapping[str, int]) -> tuple[float, float, dict[str, float]]:
    """Write and read units of the noted calls, and the write units by table kind."""
    by_kind: dict[str, float] = defaultdict(float)
    w = 0.0
    for kind, factor, n in cap.writes:
        u = factor * n * wcu(sizes.get(kind, 1))
        by_kind[kind] += u
        w += u
    r = sum(factor * n * rcu(sizes.get(kind, 1)) for kind, factor, n in cap.reads)
    return w, r, dict(by_kind)


def _sizes(settings: Settings) -> dict[str, int]:
    """The largest stored item per table kind (the job table's liveness items apart)."""
    _, ddb = raw_clients(settings)
    out: dict[str, int] = {}
    for name in (settings.jobs_table, settings.intents_table, f"{settings.prefix}-attempts"):
        try:
            items = scan_items(ddb, name)
        except Exception:  # a table this run did not create
            continue
        for it in items:
            kind = _kind(name, it)
            out[kind] = max(out.get(kind, 0), item_size(it))
    return out


def _app(shape: str, hold: float) -> App:
    app = App()
    app.target("svc")
    timing: dict[str, Any] = (
        {
            "lease_seconds": HELD_LEASE,
            "heartbeat_seconds": HELD_BEAT,
            "jitter_seconds": HELD_JITTER,
            "missed_heartbeats": 2,
        }
        if shape == "held"
        else {}
    )

    def tool(call: EffectCall) -> ToolResult:
        return ToolResult({"ok": True}, external_id=f"x-{call.key[-12:]}")

    if shape == "staged":
        job = app.staged("cost", payload=Work, **timing)

        @job.stage("a")
        def a(ctx: JobContext[Any], p: Work) -> NextStage:
            return NextStage("b", {"n": p.n})

        @job.stage("b", payload=Work)
        def b(ctx: JobContext[Any], p: Work) -> NextStage:
            return NextStage("c", {"n": p.n})

        @job.stage("c", payload=Work)
        def c(ctx: JobContext[Any], p: Work) -> dict[str, int]:
            return {"n": p.n}

        return app

    @app.job("cost", payload=Work, **timing)
    def handler(ctx: JobContext[Any], p: Work) -> dict[str, Any]:
        if shape == "effect":
            done = ctx.effect("post", "svc", {"n": p.n}, tool)
            return {"n": p.n, "id": done.external_id}
        if hold:
            ctx.wait(hold)
        return {"n": p.n}

    return app


class _Ended:
    """Whether all ``n`` job records are ``succeeded`` or ``failed`` (call it).

    The worker's own counters cannot say it: a staged job's every stage ending
    counts as a commit. So once they reach ``n`` the records are read (a Scan on a
    client of its own, not counted), at most every half second."""

    def __init__(self, settings: Settings, worker: Worker, n: int) -> None:
        _sqs, self._ddb = raw_clients(settings)
        self._table = settings.jobs_table
        self._worker = worker
        self._n = n
        self._last = 0.0
        self.states: Counter[str] = Counter()

    def count(self, state: str) -> int:
        return self.states[state]

    def __call__(self) -> bool:
        if self._worker.stats.committed + self._worker.stats.failed < self._n:
            return False
        now = time.monotonic()
        if now - self._last < 0.5:
            return False
        self._last = now
        items = scan_items(self._ddb, self._table)
        self.states = Counter(it["state"]["S"] for it in items if "state" in it)
        return self.states["succeeded"] + self.states["failed"] >= self._n


def _pass(moto: Moto, shape: str, n: int, concurrency: int, hold: float) -> dict[str, Any]:
    settings, _url = fresh_settings(moto.endpoint, "cost")
    app = _app(shape, hold)
    tally, producer_tally = Tally(), Tally()
    cap, producer_cap = Capacity(), Capacity()
    worker = Worker(app, settings, concurrency=concurrency, receive_wait=1, journal=Journal())
    worker.driver = CostDriver(settings, tally, cap, timeouts=Timeouts(read=5.0))
    worker.poll_driver = CostDriver(settings, tally, cap, timeouts=Timeouts(read=6.0, attempts=1))
    producer = Producer(settings, app, driver=CostDriver(settings, producer_tally, producer_cap))
    for i in range(n):
        producer.submit("cost", Work(n=i), f"j{i:05d}")
    thread = threading.Thread(target=worker.run, name="bench-cost", daemon=True)
    t0 = time.monotonic()
    thread.start()
    ended = _Ended(settings, worker, n)
    wait_until(ended, HANG_GUARD + 3 * hold, f"{shape}: all jobs ended")
    wall = time.monotonic() - t0
    worker.stop()
    thread.join(timeout=30)
    sizes = _sizes(settings)
    w, r, w_by_kind = units(cap, sizes)
    pw, pr, _ = units(producer_cap, sizes)
    busy = {k: v for k, v in tally.calls.items() if k != "ReceiveMessage(empty)"}
    return {
        "jobs": n,
        # From the records: the worker counts every stage's end as a commit.
        "committed": ended.count("succeeded"),
        "failed": ended.count("failed"),
        "wall": wall,
        "calls": dict(sorted(busy.items())),
        "entries": dict(tally.entries),
        "idle_polls": tally.calls["ReceiveMessage(empty)"],
        "producer_calls": dict(sorted(producer_tally.calls.items())),
        "sizes": sizes,
        "wcu": w,
        "rcu": r,
        "wcu_by_kind": w_by_kind,
        "producer_wcu": pw,
        "producer_rcu": pr,
    }


def _per_job(res: dict[str, Any]) -> dict[str, Any]:
    n = res["jobs"]
    calls = {k: v / n for k, v in res["calls"].items()}
    producer = {k: v / n for k, v in res["producer_calls"].items()}
    sqs_ops = (
        "ReceiveMessage",
        "DeleteMessage",
        "DeleteMessageBatch",
        "ChangeMessageVisibility",
        "ChangeMessageVisibilityBatch",
        "SendMessage",
        "SendMessageBatch",
    )
    return {
        "calls": calls,
        "requests": sum(calls.values()),
        "sqs_requests": sum(v for k, v in calls.items() if k.split("(")[0] in sqs_ops),
        "wcu": res["wcu"] / n,
        "rcu": res["rcu"] / n,
        "producer_calls": producer,
        "producer_requests": sum(producer.values()),
        "producer_sqs": sum(v for k, v in producer.items() if k.split("(")[0] in sqs_ops),
        "producer_wcu": res["producer_wcu"] / n,
        "producer_rcu": res["producer_rcu"] / n,
    }


def _round_cost(held: dict[str, Any]) -> dict[str, float]:
    """Calls and units per job per heartbeat round, from the held pass."""
    n = held["jobs"]
    beats = held["entries"].get("ChangeMessageVisibilityBatch", 0)  # job-rounds
    rounds = max(1.0, beats / n)
    job_rounds = max(1, beats)
    c = held["calls"]
    sizes = held["sizes"]
    live_puts = c.get("PutItem(liveness)", 0)
    return {
        "rounds_per_job": rounds,
        "cmv": c.get("ChangeMessageVisibilityBatch", 0) / job_rounds,
        "read": c.get("BatchGetItem", 0) / job_rounds,
        "liveness": live_puts / job_rounds,
        "requests": (
            c.get("ChangeMessageVisibilityBatch", 0) + c.get("BatchGetItem", 0) + live_puts
        )
        / job_rounds,
        "sqs": c.get("ChangeMessageVisibilityBatch", 0) / job_rounds,
        # the consistent ownership read: each job's record once per round (the held
        # pass reads nothing else: claims and commits are writes)
        "rcu": held["rcu"] / job_rounds,
        "wcu": held["wcu_by_kind"].get("jobs:liveness", 0.0) / job_rounds,
        "liveness_bytes": sizes.get("jobs:liveness", 0),
        "held": n,
    }


def cost(sqs_requests: float, ddb_requests: float, wcu_: float, rcu_: float) -> float:
    """Dollars per million jobs (``ddb_requests`` is not billed on its own: units are)."""
    del ddb_requests
    return (
        sqs_requests * PRICES["sqs_standard_per_million_requests"]
        + wcu_ * PRICES["ddb_on_demand_per_million_wru"]
        + rcu_ * PRICES["ddb_on_demand_per_million_rru"]
    )


def baselines() -> dict[str, dict[str, float]]:
    """Per job, worker side and producer side, of the two contenders (fixed by their
    code: bench_overhead counts the same calls): items under 1 KB."""
    return {
        "powertools": {
            "requests": 2.2,
            "sqs": 0.2,
            "wcu": 2.0,
            "rcu": 0.0,
            "producer_requests": 0.1,
            "producer_sqs": 0.1,
            "producer_wcu": 0.0,
        },
        "bare loop": {
            "requests": 0.2,
            "sqs": 0.2,
            "wcu": 0.0,
            "rcu": 0.0,
            "producer_requests": 0.1,
            "producer_sqs": 0.1,
            "producer_wcu": 0.0,
        },
    }


def run(quick: bool) -> dict[str, Any]:
    n = 10 if quick else 60
    concurrency = 10 if quick else 30
    # The held pass holds 100 jobs at once: the floor's 1/100 ownership read per job
    # and round is one BatchGetItem of 100 keys, which fewer jobs held cannot fill.
    held_n = 10 if quick else 100
    # Each job is held for ten heartbeats (four when quick): its first round and its
    # last are partial (jobs are claimed over a second or more and end one by one),
    # so a hold of two or three beats measured mostly those, not the steady rounds
    # a 10-minute job lives in.
    hold = (10.0 if not quick else 4.0) * HELD_BEAT
    out: dict[str, Any] = {
        "params": {
            "jobs": n,
            "concurrency": concurrency,
            "held_seconds": hold,
            "held_jobs": held_n,
            "lease": LEASE,
            "heartbeat": HEARTBEAT,
        },
        "prices": PRICES,
        "prices_date": PRICES_DATE,
        "prices_source": PRICES_SOURCE,
    }
    with moto_server() as moto:
        for shape in ("short", "effect", "staged", "held"):
            res = (
                _pass(moto, shape, held_n, held_n, hold)
                if shape == "held"
                else _pass(moto, shape, n, concurrency, 0.0)
            )
            out[shape] = {"raw": res, "per_job": _per_job(res)}
    rc = _round_cost(out["held"]["raw"])
    out["round"] = rc
    short = out["short"]["per_job"]
    rounds = TEN_MINUTES / HEARTBEAT
    out["ten_minutes"] = {
        "rounds": rounds,
        "requests": short["requests"] + rounds * rc["requests"],
        "sqs_requests": short["sqs_requests"] + rounds * rc["sqs"],
        "wcu": short["wcu"] + rounds * rc["wcu"],
        "rcu": short["rcu"] + rounds * rc["rcu"],
        "producer_requests": short["producer_requests"],
        "producer_sqs": short["producer_sqs"],
        "producer_wcu": short["producer_wcu"],
        "producer_rcu": short["producer_rcu"],
    }
    return out


def _row(name: str, d: Mapping[str, float], floor: float | None) -> list[Any]:
    req = d["requests"]
    ddb = req - d["sqs_requests"]
    worker_cost = cost(d["sqs_requests"], ddb, d["wcu"], d["rcu"])
    total = worker_cost + cost(d["producer_sqs"], 0, d["producer_wcu"], d.get("producer_rcu", 0.0))
    return [
        name,
        req,
        "-" if floor is None else f"{fmt(req / floor)} x",
        d["sqs_requests"],
        d["wcu"],
        d["rcu"],
        worker_cost,
        d["producer_requests"],
        d["producer_wcu"],
        total,
    ]


def render(r: dict[str, Any]) -> str:
    p = r["params"]
    rc = r["round"]
    floor_round = 0.1 + 0.01
    rows = [
        _row("short (no-op handler)", r["short"]["per_job"], FLOORS["short"]),
        _row("one effect (`ctx.effect`, no-op tool)", r["effect"]["per_job"], FLOORS["effect"]),
        _row("3 stages (`App.staged`, a -> b -> c)", r["staged"]["per_job"], FLOORS["staged"]),
        _row(
            f"10-minute job (short + {fmt(r['ten_minutes']['rounds'], 0)} rounds at H = "
            f"{fmt(p['heartbeat'], 0)} s)",
            r["ten_minutes"],
            SHORT_FLOOR + r["ten_minutes"]["rounds"] * (floor_round + 1 / rc["held"]),
        ),
    ]
    b = baselines()
    for name, d in b.items():
        rows.append(
            _row(
                f"{name} (any duration: no lease, no heartbeat)",
                {
                    "requests": d["requests"],
                    "sqs_requests": d["sqs"],
                    "wcu": d["wcu"],
                    "rcu": d["rcu"],
                    "producer_requests": d["producer_requests"],
                    "producer_sqs": d["producer_sqs"],
                    "producer_wcu": d["producer_wcu"],
                },
                None,
            )
        )
    by_op_rows = []
    for shape in ("short", "effect", "staged", "held"):
        calls = r[shape]["per_job"]["calls"]
        by_op_rows.append([shape, ", ".join(f"{k} {fmt(v)}" for k, v in calls.items())])
    sizes = r["short"]["raw"]["sizes"] | r["effect"]["raw"]["sizes"] | r["held"]["raw"]["sizes"]
    prices = r["prices"]
    return "\n".join(
        [
            f"{p['jobs']} jobs per shape through one threaded `Worker` (concurrency "
            f"{p['concurrency']}), submitted one by one with the real `Producer`; every call "
            "counted by op. Capacity units computed by DynamoDB's size rules from the stored "
            "items (write: 1 per KB rounded up, transactional x2; read: 4 KB per unit, strongly "
            "consistent 1, eventually consistent 0.5), because moto's consumed capacity is a "
            "constant. The 10-minute job is the short job plus 600 s / H heartbeat rounds at "
            "the per-round calls measured with "
            f"{rc['held']} jobs held ({fmt(rc['rounds_per_job'], 1)} rounds each): per job per "
            f"round {fmt(rc['cmv'], 3)} CMV batch, {fmt(rc['read'], 3)} BatchGetItem, "
            f"{fmt(rc['liveness'], 3)} liveness PutItem ({rc['liveness_bytes']} B item for "
            f"{rc['held']} jobs = {fmt(rc['wcu'], 3)} WCU per job-round). The floor of a round "
            "is 1/10 + 1/100 + 1/(jobs held) requests per job, 0.12 with 100 held; a worker "
            "holding fewer still makes one read and one liveness write a round, so its round "
            "costs 1/10 + 2/(jobs held) per job (0.133 with 60 held, 1.05 x the 100-job "
            "figure). Floors: a short job 2.2 "
            "(receive/10, claim, commit, delete/10); one effect 3 more (the intent's three "
            "writes: prepared, in progress, confirmed); each stage after the first 4.2 (the "
            "checkpoint, marking the next message sent, the next claim, SendMessage, "
            "receive/10 and a batched delete/10; on a FIFO queue the ended stage's message "
            "is deleted at once, 1 request, so the group's next stage is not held back).",
            "",
            table(
                [
                    "job shape",
                    "requests / job (worker)",
                    "÷ floor",
                    "of which SQS",
                    "WCU / job",
                    "RCU / job",
                    "$ per million jobs (worker)",
                    "producer requests / job",
                    "producer WCU / job",
                    "**$ per million jobs (all)**",
                ],
                rows,
            ),
            "",
            table(["shape", "worker calls per job, by op"], by_op_rows),
            "",
            f"- Prices ({r['prices_date']}): SQS standard "
            f"${prices['sqs_standard_per_million_requests']:.2f} per million requests (FIFO "
            f"${prices['sqs_fifo_per_million_requests']:.2f}), DynamoDB on-demand "
            f"${prices['ddb_on_demand_per_million_wru']:.3f} per million write request units "
            f"and ${prices['ddb_on_demand_per_million_rru']:.3f} per million read request "
            f"units. Source: {r['prices_source']}",
            "- Largest stored item per table kind (bytes): "
            + ", ".join(f"{k} {v}" for k, v in sorted(sizes.items()))
            + ". The toolkit's producer writes the job record and marks it sent (2 WCU per "
            "job) beside its SendMessage: Powertools and the bare loop keep no record; their "
            "producer is one SendMessageBatch per 10 jobs. Powertools' idempotency record is "
            "written twice per job (PutItem IN_PROGRESS, UpdateItem COMPLETED), under 1 KB "
            "for small results. Neither contender leases, fences or heartbeats: a 10-minute "
            "job costs them what a short one does (the queue's visibility must then cover "
            "the whole run, and a dead consumer's job waits that long).",
        ]
    )
