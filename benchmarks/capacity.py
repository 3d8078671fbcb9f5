"""A capacity model: how many jobs per second one queue and its tables carry before a
quota or a hot key binds, from the writes, reads and calls each job makes.

Usage::

    python benchmarks/capacity.py [--json]

Pure arithmetic (no AWS, no emulator). The per-job calls are the protocol's, counted by
``make bench`` (BENCHMARKS.md, benchmark 6: 4 WCU for a short job with its producer,
11 more per effect, 3 per extra stage, all at records under 1 KB); this model scales
each write by the size DynamoDB bills it at, which the benchmark's small records hide:

- every write of the job record (the producer's put and its mark, each claim, each
  checkpoint and the next stage's mark, the commit) costs ceil(record KB) WCU, as an
  UpdateItem is billed on the larger of the item before and after;
- an effect's start is a transaction whose ConditionCheck on the job record is
  billed as a transactional write of the whole record (2 x ceil(KB)), beside the
  intent's and the attempt's small items (9 WCU in all);
- every heartbeat round reads each held record consistently: ceil(KB / 4) RCU;
- the sparse ``unsent`` index has one key value: a record enters it at its submit
  and at each checkpoint, and leaves at each mark (2 index writes per stage; 3 per
  re-send by the stranded sweep).

The AWS figures below are as AWS documents them (SQS and DynamoDB quotas, Lambda's
SQS scaling); docs/scale.md quotes this output.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import asdict, dataclass

from sqs_lease.testing._sim.capacity import Limits as AwsLimits
from sqs_lease.testing._sim.fleet import STANDARD_IN_FLIGHT

# AWS's limits: the simulated fleet's (``_sim/capacity.py``), so the model and the
# simulation cannot drift apart.
_AWS = AwsLimits()
SQS_INFLIGHT = STANDARD_IN_FLIGHT  # in-flight messages per queue, standard and FIFO alike
SQS_FIFO_TPS = 300  # calls/s per action (Send, Receive, Delete), FIFO without high throughput
DDB_PARTITION_WCU = int(_AWS.partition_write)  # writes/s of 1 KB per partition (and key value)
DDB_PARTITION_RCU = int(_AWS.partition_read)  # consistent reads/s of 4 KB per partition
DDB_TABLE_QUOTA = int(_AWS.quota_write)  # units/s per table, the default account quota
DDB_NEW_TABLE_WCU = int(_AWS.warm_write)  # a new on-demand table: 4,000 WRU or 12,000 RRU at
DDB_NEW_TABLE_RCU = int(_AWS.warm_read)  # once; then twice its previous peak, per 30 minutes
LAMBDA_ESM_BATCHES = 1_000  # concurrent batches per SQS event source mapping (default mode)
LAMBDA_ESM_FIRST = 5  # batches it starts with
LAMBDA_ESM_RAMP = 300  # batches it adds per minute while messages wait
LAMBDA_MAX_SECONDS = 900  # a function's longest run
LIVENESS_PART = 500  # jobs per liveness item (sqs_lease._core.liveness)
LIVENESS_ENTRY_BYTES = 45  # ["job-id (36)",token,deadline] in compact JSON, about
INTENT_WCU = 9  # per effect, besides its ConditionCheck: prepare 1, start 2 x 2, confirm 2 x 2
UNSENT_WRITES_PER_STAGE = 2  # enter at the submit (or checkpoint), leave at the mark
UNSENT_WRITES_PER_RESEND = 3  # the sweep's take (leave, enter again) and its mark
SLOT_WAIT_FLOOR = 6.0  # a waiter's delay at its floor is 4-8 s: about one wait per 6 s


@dataclass(frozen=True)
class Shape:
    """A workload: D seconds per stage, k stages, e effects, a job record of S KB."""

    name: str
    stage_seconds: float
    stages: int = 1
    effects: int = 0
    record_kb: float = 0.5  # the job record as stored: payload, timeline, stage log
    result_kb: float = 0.1
    heartbeat: float = 5.0
    per_worker: int = 1_000  # jobs one async worker holds (BENCHMARKS: 1,000-5,000)


def _kb(size: float) -> int:
    return max(1, math.ceil(size - 1e-9))


def record_wcu(s: Shape) -> int:
    """WCU of one job's record writes: 3k writes at its size, and the commit."""
    return 3 * s.stages * _kb(s.record_kb) + _kb(s.record_kb + s.result_kb)


def effect_wcu(s: Shape) -> int:
    """WCU of one effect: the intent's items and the start's ConditionCheck on the record."""
    return INTENT_WCU + 2 * _kb(s.record_kb)


def job_wcu(s: Shape) -> int:
    return record_wcu(s) + s.effects * effect_wcu(s)


def rcu_per_round(s: Shape) -> int:
    """RCU of one heartbeat read of one record (consistent, 4 KB steps)."""
    return max(1, math.ceil(s.record_kb / 4 - 1e-9))


def held_seconds(s: Shape) -> float:
    """Seconds one job holds a message in flight (each stage's, one after another)."""
    return s.stages * s.stage_seconds


@dataclass(frozen=True)
class Limits:
    shape: str
    wcu_per_job: int
    rcu_per_job: float
    in_flight: float  # jobs/s at 120,000 messages in flight (standard or FIFO)
    fifo_calls: float  # jobs/s at 300 calls/s per action (FIFO, not high-throughput)
    table_quota: float  # jobs/s at the default 40,000 WCU and 40,000 RCU per table
    new_table: float  # jobs/s on a new on-demand table (4,000 WRU or 12,000 RRU, mixed)
    unsent_key: float  # jobs/s at the `unsent` index key's 1,000 writes/s
    lambda_mapping: float | None  # jobs/s at 1,000 concurrent batches of one mapping
    # (None: a stage longer than a Lambda function may run, 900 s)
    binds_first: str  # on a standard queue with an ECS fleet and a warm table
    jobs_per_s: float
    binds_first_new: str  # the same on a new on-demand table
    jobs_per_s_new: float


def limits(s: Shape) -> Limits:
    """Jobs per second each limit allows for this shape, and which binds first."""
    held = held_seconds(s)
    wcu = job_wcu(s)
    rounds = held / s.heartbeat  # heartbeat rounds per job
    rcu = rounds * rcu_per_round(s)
    in_flight = SQS_INFLIGHT / held  # Little's law: in flight = rate x time held
    by_writes = DDB_TABLE_QUOTA / wcu
    by_reads = DDB_TABLE_QUOTA / rcu if rcu else math.inf
    table = min(by_writes, by_reads)
    quota = "read" if by_reads < by_writes else "write"
    new = 1 / (wcu / DDB_NEW_TABLE_WCU + rcu / DDB_NEW_TABLE_RCU)
    unsent = DDB_PARTITION_WCU / (UNSENT_WRITES_PER_STAGE * s.stages)
    fifo = SQS_FIFO_TPS / s.stages  # one Send, one Receive, one Delete per stage
    # A batch's records run one after another, each stage in its own invocation.
    lam = LAMBDA_ESM_BATCHES / held if s.stage_seconds <= LAMBDA_MAX_SECONDS else None
    standard = {
        "SQS in flight (120,000)": in_flight,
        f"the table's {quota} quota (40,000 units/s)": table,
        "the `unsent` index key (1,000 writes/s)": unsent,
    }
    binds = min(standard, key=lambda k: standard[k])
    fresh = {**standard, "a new on-demand table (4,000 WRU / 12,000 RRU)": new}
    del fresh[f"the table's {quota} quota (40,000 units/s)"]
    binds_new = min(fresh, key=lambda k: fresh[k])
    return Limits(
        shape=s.name,
        wcu_per_job=wcu,
        rcu_per_job=round(rcu, 1),
        in_flight=round(in_flight, 1),
        fifo_calls=round(fifo, 1),
        table_quota=round(table, 1),
        new_table=round(new, 1),
        unsent_key=round(unsent, 1),
        lambda_mapping=None if lam is None else round(lam, 1),
        binds_first=binds,
        jobs_per_s=round(standard[binds], 1),
        binds_first_new=binds_new,
        jobs_per_s_new=round(fresh[binds_new], 1),
    )


SHAPES = (
    Shape("short tool call: 1 s, 0.5 KB record", 1.0, per_worker=100),
    Shape("one-minute call, one effect, 4 KB", 60.0, effects=1, record_kb=4.0),
    Shape("three 10-minute stages, 8 KB", 600.0, stages=3, record_kb=8.0),
    Shape("one-hour stage, 16 KB", 3_600.0, record_kb=16.0, per_worker=5_000),
)

SIZES_KB = (0.5, 4.0, 16.0, 64.0, 400.0)


def size_rows() -> list[tuple[float, int, int, int, float, float]]:
    """Per record size: WCU of a one-stage job, with one effect, heartbeat RCU per
    round, and jobs/s at the 40,000 WCU quota and on a new table (no effect)."""
    rows = []
    for kb in SIZES_KB:
        s = Shape("", 1.0, record_kb=kb)
        e = Shape("", 1.0, record_kb=kb, effects=1)
        rows.append(
            (
                kb,
                job_wcu(s),
                job_wcu(e),
                rcu_per_round(s),
                DDB_TABLE_QUOTA / job_wcu(s),
                DDB_NEW_TABLE_WCU / job_wcu(s),
            )
        )
    return rows


def heartbeat_leases(record_kb: float, heartbeat: float, units: int) -> int:
    """Leases whose heartbeat reads alone use ``units`` RCU/s."""
    return int(units * heartbeat / rcu_per_round(Shape("", 1.0, record_kb=record_kb)))


def slot_waiters_at_unsent_key() -> int:
    """Slot waiters whose waits alone fill the `unsent` key (each wait enters and
    leaves the index once, about every SLOT_WAIT_FLOOR seconds)."""
    return int(DDB_PARTITION_WCU * SLOT_WAIT_FLOOR / UNSENT_WRITES_PER_STAGE)


def sweep_resends_per_s() -> float:
    """Re-sends per second the stranded sweep can make before the `unsent` key binds."""
    return DDB_PARTITION_WCU / UNSENT_WRITES_PER_RESEND


def lambda_ramp_minutes() -> float:
    return (LAMBDA_ESM_BATCHES - LAMBDA_ESM_FIRST) / LAMBDA_ESM_RAMP


def render(rows: list[Limits]) -> str:
    head = [
        "shape",
        "WCU / job",
        "RCU / job",
        "SQS in flight",
        "FIFO calls",
        "table quota",
        "new table",
        "`unsent` key",
        "Lambda mapping",
        "binds first (warm table)",
        "binds first (new table)",
    ]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        out.append(
            f"| {r.shape} | {r.wcu_per_job} | {r.rcu_per_job:,.0f} | {r.in_flight:,.0f} | "
            f"{r.fifo_calls:,.0f} | {r.table_quota:,.0f} | {r.new_table:,.0f} | "
            f"{r.unsent_key:,.0f} | "
            f"{'-' if r.lambda_mapping is None else f'{r.lambda_mapping:,.1f}'} | "
            f"**{r.binds_first}: {r.jobs_per_s:,.0f}** | "
            f"**{r.binds_first_new}: {r.jobs_per_s_new:,.0f}** |"
        )
    out += [
        "",
        "Jobs/s per limit. By record size (one stage, 0.1 KB result):",
        "",
        "| record | WCU / job | with one effect | heartbeat RCU / round | jobs/s at 40,000 WCU "
        "| jobs/s on a new table |",
        "|---|---|---|---|---|---|",
    ]
    for kb, w, we, rc, q, n in size_rows():
        out.append(f"| {kb:g} KB | {w} | {we} | {rc} | {q:,.0f} | {n:,.0f} |")
    out += [
        "",
        f"Heartbeat reads alone fill a new table's 12,000 RRU at "
        f"{heartbeat_leases(8.0, 5.0, DDB_NEW_TABLE_RCU):,} leases of 8 KB records "
        f"(H = 5 s; {heartbeat_leases(0.5, 5.0, DDB_NEW_TABLE_RCU):,} under 4 KB). "
        f"Slot waiters fill the `unsent` key alone at about "
        f"{slot_waiters_at_unsent_key():,} waiters. The stranded sweep re-sends at most "
        f"{sweep_resends_per_s():,.0f} records/s before the key binds. A Lambda mapping "
        f"ramps from {LAMBDA_ESM_FIRST} to {LAMBDA_ESM_BATCHES:,} concurrent batches in "
        f"{lambda_ramp_minutes():.1f} minutes.",
    ]
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = [limits(s) for s in SHAPES]
    if args.json:
        print(json.dumps([asdict(r) for r in rows], indent=2))
    else:
        print(render(rows))


if __name__ == "__main__":
    main()
