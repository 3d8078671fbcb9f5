"""A capacity model: how many workers and jobs per second one queue and the tables carry
before a quota or a hot key binds, from the requests and capacity units per job.

Usage::

    python benchmarks/capacity.py [--json]

Pure arithmetic (no AWS, no emulator): Little's law for what is in flight, the
per-job calls of the protocol (the floor measured by ``make bench``, see
BENCHMARKS.md), and AWS's published limits below. docs/scale.md quotes its output.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import asdict, dataclass

# AWS limits (us-east-1, as documented; the adjustable ones at their defaults).
SQS_INFLIGHT_STANDARD = 120_000  # messages in flight per standard queue (hard)
SQS_INFLIGHT_FIFO = 20_000  # per FIFO queue (hard)
SQS_FIFO_TPS = 3_000  # messages/s per FIFO queue with batching (high-throughput mode: far more)
DDB_PARTITION_WCU = 1_000  # per partition (and per partition-key value), writes/s of 1 KB
DDB_PARTITION_RCU = 3_000  # per partition, strongly consistent reads/s of 4 KB
DDB_TABLE_ON_DEMAND = 40_000  # default per-table on-demand max (read and write units), adjustable
LIVENESS_PART = 500  # jobs per liveness item (sqs_lease._core.liveness)
LIVENESS_ENTRY_BYTES = 45  # ["job-id (36)",token,deadline] in compact JSON, about
SLOT_POOL_MAX = 100  # slots per pool, read in one BatchGetItem per take


@dataclass(frozen=True)
class Shape:
    """A workload: job duration D, heartbeat H, jobs held per worker C."""

    name: str
    duration: float  # seconds a job holds its message (one stage)
    heartbeat: float = 5.0
    per_worker: int = 1_000  # jobs one async worker holds (BENCHMARKS: 1,000-5,000)
    # Per job, from the floor (BENCHMARKS.md, benchmark 6 measures them):
    worker_wcu: float = 2.0  # claim + commit
    producer_wcu: float = 2.0  # record put + mark_sent
    gsi_unsent_writes: float = 2.0  # the unsent index: put at submit, removed at send


@dataclass(frozen=True)
class Limits:
    shape: str
    jobs_per_s_inflight_standard: float
    jobs_per_s_inflight_fifo: float
    workers_at_inflight_limit: int
    jobs_per_s_table_wcu: float
    jobs_per_s_unsent_index: float
    heartbeat_requests_per_s_at_limit: float
    heartbeat_rcu_per_s_at_limit: float
    liveness_wcu_per_worker_round: int
    binds_first: str
    jobs_per_s: float


def limits(shape: Shape) -> Limits:
    """Throughput (jobs/s) each limit allows for this shape, and which binds first."""
    d = shape.duration
    # Little's law: in flight = rate x time held. Each message stays in flight its
    # job's duration (the heartbeat keeps extending it).
    standard = SQS_INFLIGHT_STANDARD / d
    fifo = SQS_INFLIGHT_FIFO / d
    workers = math.ceil(SQS_INFLIGHT_STANDARD / shape.per_worker)
    # Job records are keyed by job id (spread evenly): the table's quota binds, not
    # one partition.
    per_job_wcu = shape.worker_wcu + shape.producer_wcu
    table = DDB_TABLE_ON_DEMAND / per_job_wcu
    # The sparse `unsent` index has one key value: every submit adds an entry and the
    # send removes it, all in one index partition.
    unsent = DDB_PARTITION_WCU / shape.gsi_unsent_writes
    candidates = {
        "SQS in-flight (standard queue)": standard,
        "DynamoDB table write quota (default 40,000 WRU/s)": table,
        "the `unsent` index's one key value (1,000 writes/s)": unsent,
    }
    binds = min(candidates, key=lambda k: candidates[k])
    rate = candidates[binds]
    inflight = min(SQS_INFLIGHT_STANDARD, rate * d)
    rounds = inflight / shape.heartbeat  # job-rounds per second
    hb_requests = rounds * (1 / 10 + 1 / 100) + (inflight / shape.per_worker) / shape.heartbeat
    hb_rcu = rounds  # one consistent read of each record per round (records < 4 KB)
    live_bytes = min(shape.per_worker, LIVENESS_PART) * LIVENESS_ENTRY_BYTES + 150
    return Limits(
        shape=shape.name,
        jobs_per_s_inflight_standard=round(standard, 1),
        jobs_per_s_inflight_fifo=round(fifo, 1),
        workers_at_inflight_limit=workers,
        jobs_per_s_table_wcu=round(table, 1),
        jobs_per_s_unsent_index=round(unsent, 1),
        heartbeat_requests_per_s_at_limit=round(hb_requests, 1),
        heartbeat_rcu_per_s_at_limit=round(hb_rcu, 1),
        liveness_wcu_per_worker_round=math.ceil(live_bytes / 1024)
        * math.ceil(shape.per_worker / LIVENESS_PART),
        binds_first=binds,
        jobs_per_s=round(rate, 1),
    )


SHAPES = (
    Shape("short tool call (1 s)", 1.0, per_worker=100),
    Shape("one-minute call", 60.0),
    Shape("10-minute call", 600.0),
    Shape("one-hour stage", 3_600.0, per_worker=5_000),
)


def slot_pool_rcu(limit: int, duration: float) -> float:
    """Reads per second on one slot pool: every take reads the whole pool."""
    takes = limit / duration
    return takes * limit


def render(rows: list[Limits]) -> str:
    head = [
        "shape",
        "in-flight limit: jobs/s (standard / FIFO)",
        "workers at 120,000 in flight",
        "table quota: jobs/s",
        "`unsent` index: jobs/s",
        "binds first",
        "heartbeat there: requests/s, RCU/s",
        "liveness WCU per worker-round",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        lines.append(
            f"| {r.shape} | {r.jobs_per_s_inflight_standard:,.0f} / "
            f"{r.jobs_per_s_inflight_fifo:,.0f} | {r.workers_at_inflight_limit} | "
            f"{r.jobs_per_s_table_wcu:,.0f} | {r.jobs_per_s_unsent_index:,.0f} | "
            f"**{r.binds_first}: {r.jobs_per_s:,.0f} jobs/s** | "
            f"{r.heartbeat_requests_per_s_at_limit:,.0f}, {r.heartbeat_rcu_per_s_at_limit:,.0f} | "
            f"{r.liveness_wcu_per_worker_round} |"
        )
    pools = ", ".join(
        f"{n} slots / {d:g} s jobs: {slot_pool_rcu(n, d):,.0f} RCU/s"
        for n, d in ((100, 1.0), (100, 10.0), (20, 60.0))
    )
    lines += ["", f"Slot pools (one BatchGetItem of the whole pool per take): {pools}."]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = [limits(s) for s in SHAPES]
    if args.json:
        print(json.dumps([asdict(r) for r in rows], indent=2))
    else:
        print(render(rows))


if __name__ == "__main__":
    main()
