"""moto's CPU per DynamoDB write, by request shape (why benchmark 2's fenced loop is slower).

One moto server (``spawn_local_server``, 127.0.0.1), one client sending one request
at a time, the server process's CPU read from /proc around each batch of N
requests: milliseconds of moto CPU per request for

- GetItem of a missing key: moto's floor per request (HTTP, routing, parsing);
- Powertools' idempotency writes (PutItem IN_PROGRESS with its condition,
  UpdateItem COMPLETED without one), their shape copied from
  aws-lambda-powertools 3.x's ``DynamoDBPersistenceLayer``;
- the toolkit's claim and commit, built by ``JobTable`` as the worker sends them;
- a minimal fenced claim and commit, written by hand: what any lease-and-fence
  protocol must send at least (the claim conditioned on the state and the
  message's send id, setting state, owner and lease, adding 1 to the token and
  returning the old record, whose payload the worker runs; the commit conditioned
  on that token, setting state and result). No timeline, no timestamps, no
  attempt count: the floor of the shape, not a protocol anyone should run.

moto parses the UpdateExpression twice per request, then deep-copies its tree and
walks it ten times to validate it, so its cost grows with the expression, not with
the item. Run: ``.venv/bin/python -m benchmarks.write_cost [N] [REPS]``.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from benchmarks.bench_common import (
    Moto,
    fresh_settings,
    job_item,
    moto_server,
    put_items,
    raw_clients,
)
from sqs_lease._schema.job_requests import JobTable

JOB_CLASS = "bench.write"


def powertools_put(table: str, key: str, now: float) -> dict[str, Any]:
    """Powertools' PutItem of an IN_PROGRESS record (condition as in its source)."""
    return {
        "TableName": table,
        "Item": {
            "id": {"S": key},
            "expiration": {"N": str(int(now) + 3600)},
            "status": {"S": "INPROGRESS"},
            "in_progress_expiration": {"N": str(int(now * 1000) + 60000)},
        },
        "ConditionExpression": "attribute_not_exists(#id) OR #expiry < :now OR "
        "(#status = :inprogress AND attribute_exists(#in_progress_expiry) AND "
        "#in_progress_expiry < :now_in_millis)",
        "ExpressionAttributeNames": {
            "#id": "id",
            "#expiry": "expiration",
            "#in_progress_expiry": "in_progress_expiration",
            "#status": "status",
        },
        "ExpressionAttributeValues": {
            ":now": {"N": str(int(now))},
            ":now_in_millis": {"N": str(int(now * 1000))},
            ":inprogress": {"S": "INPROGRESS"},
        },
        "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
    }


def powertools_update(table: str, key: str, now: float) -> dict[str, Any]:
    """Powertools' UpdateItem to COMPLETED (no condition)."""
    return {
        "TableName": table,
        "Key": {"id": {"S": key}},
        "UpdateExpression": "SET #response_data = :response_data, #expiry = :expiry, "
        "#status = :status",
        "ExpressionAttributeNames": {
            "#response_data": "data",
            "#expiry": "expiration",
            "#status": "status",
        },
        "ExpressionAttributeValues": {
            ":expiry": {"N": str(int(now) + 3600)},
            ":response_data": {"S": '{"n": 1}'},
            ":status": {"S": "COMPLETED"},
        },
    }


def minimal_claim(table: str, job_id: str, now: float) -> dict[str, Any]:
    """The least a fenced claim can be: see the module doc."""
    return {
        "TableName": table,
        "Key": {"job_id": {"S": job_id}},
        "ConditionExpression": "#s IN (:q, :r) AND send_id = :sid",
        "UpdateExpression": "SET #s = :r, #o = :o, lease_deadline = :l ADD #t :one",
        "ExpressionAttributeNames": {"#s": "state", "#o": "owner", "#t": "token"},
        "ExpressionAttributeValues": {
            ":q": {"S": "queued"},
            ":r": {"S": "running"},
            ":sid": {"S": f"{job_id}.bench"},
            ":o": {"S": "w2"},
            ":l": {"N": str(now + 30)},
            ":one": {"N": "1"},
        },
        "ReturnValues": "ALL_OLD",
    }


def minimal_commit(table: str, job_id: str, token: int) -> dict[str, Any]:
    """The least a fenced commit can be: see the module doc."""
    return {
        "TableName": table,
        "Key": {"job_id": {"S": job_id}},
        "ConditionExpression": "#t = :t AND #s = :r",
        "UpdateExpression": "SET #s = :ok, #res = :res REMOVE lease_deadline",
        "ExpressionAttributeNames": {"#s": "state", "#t": "token", "#res": "result"},
        "ExpressionAttributeValues": {
            ":t": {"N": str(token)},
            ":r": {"S": "running"},
            ":ok": {"S": "succeeded"},
            ":res": {"S": "{}"},
        },
    }


def _timed(moto: Moto, send: Callable[..., Any], requests: Sequence[Mapping[str, Any]]) -> float:
    before = moto.cpu()
    for params in requests:
        send(**params)
    return 1000 * (moto.cpu() - before) / len(requests)


def measure(moto: Moto, n: int) -> dict[str, float]:
    """One pass of every shape over ``n`` fresh keys: moto CPU ms per request."""
    settings, _url = fresh_settings(moto.endpoint, "wc")
    _sqs, ddb = raw_clients(settings)
    jobs = JobTable(settings.jobs_table)
    ids = [f"w{i:05d}" for i in range(n)]
    put_items(ddb, jobs.table, [job_item(jobs, j, JOB_CLASS, {"n": i}) for i, j in enumerate(ids)])
    pt = f"{settings.prefix}-powertools"
    ddb.create_table(
        TableName=pt,
        KeySchema=[{"AttributeName": "id", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "id", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    now = time.time()
    out: dict[str, float] = {}
    missing = [{"TableName": pt, "Key": {"id": {"S": f"none-{j}"}}} for j in ids]
    out["GetItem, missing key (the floor)"] = _timed(moto, ddb.get_item, missing)
    out["powertools PutItem"] = _timed(
        moto, ddb.put_item, [powertools_put(pt, j, now) for j in ids]
    )
    out["powertools UpdateItem"] = _timed(
        moto, ddb.update_item, [powertools_update(pt, j, now) for j in ids]
    )
    claims = [
        jobs.claim(j, "w1", now, 30, job_class=JOB_CLASS, send_id=f"{j}.bench").params for j in ids
    ]
    before = moto.cpu()
    tokens = [int(ddb.update_item(**c)["Attributes"]["token"]["N"]) + 1 for c in claims]
    out["sqs-lease claim UpdateItem"] = 1000 * (moto.cpu() - before) / n
    commits = [
        jobs.commit(j, t, "w1", "{}", now, write_id=f"{j}:commit").params
        for j, t in zip(ids, tokens, strict=True)
    ]
    out["sqs-lease commit UpdateItem"] = _timed(moto, ddb.update_item, commits)
    # The minimal writes run on their own fresh records (the same item as the
    # toolkit's claim reads), so both pairs meet the same item size.
    bare = [f"m{i:05d}" for i in range(n)]
    put_items(ddb, jobs.table, [job_item(jobs, j, JOB_CLASS, {"n": i}) for i, j in enumerate(bare)])
    before = moto.cpu()
    tokens = [
        int(ddb.update_item(**minimal_claim(jobs.table, j, now))["Attributes"]["token"]["N"]) + 1
        for j in bare
    ]
    out["minimal fenced claim"] = 1000 * (moto.cpu() - before) / n
    out["minimal fenced commit"] = _timed(
        moto,
        ddb.update_item,
        [minimal_commit(jobs.table, j, t) for j, t in zip(bare, tokens, strict=True)],
    )
    return out


def main(argv: Sequence[str]) -> int:
    n = int(argv[0]) if argv else 150
    reps = int(argv[1]) if len(argv) > 1 else 3
    runs: list[dict[str, float]] = []
    with moto_server() as moto:
        for _ in range(reps):
            runs.append(measure(moto, n))
    print(f"moto CPU ms per request, median of {reps} passes of {n} requests each")
    for shape in runs[0]:
        values = [r[shape] for r in runs]
        print(f"  {shape:36s} {statistics.median(values):6.2f}  (min {min(values):.2f})")
    per_job = {
        "powertools": ("powertools PutItem", "powertools UpdateItem"),
        "sqs-lease": ("sqs-lease claim UpdateItem", "sqs-lease commit UpdateItem"),
        "minimal fenced": ("minimal fenced claim", "minimal fenced commit"),
    }
    for who, (a, b) in per_job.items():
        total = statistics.median(r[a] + r[b] for r in runs)
        print(f"  {who} writes per job: {total:.2f} ms")
    print(f"1-min load average {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
