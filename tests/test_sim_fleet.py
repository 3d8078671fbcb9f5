"""A fleet's world (issue 33): DynamoDB's and SQS's limits in the simulator, and a
fleet of workers on one queue that holds under them.

The throughput model (``_sim/capacity.py``) and the indexed queue and tables are off
in every drawn world: ``simtools digest`` is the same before and after them."""

from __future__ import annotations

from typing import Any

import botocore.exceptions
import pytest

from sqs_lease._aws import classify
from sqs_lease._core.calls import Err, ErrorKind, Ok, Outcome
from sqs_lease.testing._sim import fleet
from sqs_lease.testing._sim.capacity import Limits, Throughput, read_units, write_units
from sqs_lease.testing._sim.chaos import Chaos
from sqs_lease.testing._sim.ddb import DdbFaults, IndexSpec, SimDynamo, TableSpec
from sqs_lease.testing._sim.resources import table_specs
from sqs_lease.testing._sim.sqs import Queue, SimSQS

URL = "https://sqs.sim.local/000000000000/q"


def _db(limits: Limits, *, indexed: bool = True) -> SimDynamo:
    chaos = Chaos(0)
    chaos.cutoff = 0.0  # no drawn fault
    spec = TableSpec("t", "id", indexes=(IndexSpec("by_tag", "tag", "at", ("n",)),))
    db = SimDynamo([spec], chaos, DdbFaults())
    db.throughput = Throughput(limits)
    db.indexed = indexed
    return db


def _put(db: SimDynamo, now: float, key: str, pad: int = 0, tag: str | None = None) -> Outcome:
    item: dict[str, Any] = {"id": {"S": key}, "pad": {"S": "x" * pad}}
    if tag is not None:
        item |= {"tag": {"S": tag}, "at": {"N": str(now)}}
    return db.handle("PutItem", {"TableName": "t", "Item": item}, now)


def test_units_are_billed_on_the_larger_item_in_steps() -> None:
    assert write_units(0, 1) == 1
    assert write_units(1024, 10) == 1
    assert write_units(1025, 10) == 2
    assert write_units(10, 16 * 1024) == 16
    assert read_units(4096, True) == 1
    assert read_units(4097, True) == 2
    assert read_units(100, False) == 0.5


def test_a_key_takes_a_partitions_writes_a_second_then_is_throttled() -> None:
    db = _db(Limits(partition_write=3.0))
    for _ in range(3):
        assert isinstance(_put(db, 10.2, "a"), Ok)
    refused = _put(db, 10.7, "a", pad=5)
    assert isinstance(refused, Err)
    assert refused.kind is ErrorKind.THROTTLED
    assert refused.code == "ProvisionedThroughputExceededException"
    held = db.get("t", {"id": {"S": "a"}})
    assert held is not None and held["pad"] == {"S": ""}  # nothing of the refused write
    assert isinstance(_put(db, 10.9, "b"), Ok)  # another key's partition
    assert isinstance(_put(db, 11.0, "a"), Ok)  # the next second
    assert db.throughput is not None and db.throughput.throttled == {"key": 1}


def test_a_large_item_costs_its_size_in_units() -> None:
    db = _db(Limits(partition_write=4.0))
    assert isinstance(_put(db, 1.0, "a", pad=3000), Ok)  # 3 units
    assert isinstance(_put(db, 1.1, "a", pad=10), Err)  # billed on the 3 KB item before
    assert isinstance(_put(db, 2.0, "b", pad=5000), Err)  # 5 units: never fits one second


def test_an_index_key_value_throttles_the_base_tables_writes() -> None:
    """Back-pressure: writes of different items that share one index key value are
    limited by that value's partition; an item outside the index is not."""
    db = _db(Limits(partition_write=5.0))
    for i in range(5):
        assert isinstance(_put(db, 3.0, f"k{i}", tag="hot"), Ok)
    refused = _put(db, 3.5, "k9", tag="hot")
    assert isinstance(refused, Err) and refused.kind is ErrorKind.THROTTLED
    assert "global secondary indexes" in refused.message
    assert db.get("t", {"id": {"S": "k9"}}) is None
    assert isinstance(_put(db, 3.5, "k9"), Ok)  # not in the index
    assert isinstance(_put(db, 3.6, "k8", tag="cold"), Ok)
    assert db.throughput is not None and db.throughput.throttled == {"index": 1}


def test_a_throttled_transaction_is_cancelled_on_its_item_and_applies_nothing() -> None:
    db = _db(Limits(partition_write=2.0))
    assert isinstance(_put(db, 5.0, "a"), Ok)
    txn = {
        "TransactItems": [
            {"Put": {"TableName": "t", "Item": {"id": {"S": "b"}}}},
            {"Put": {"TableName": "t", "Item": {"id": {"S": "a"}, "v": {"S": "2"}}}},
        ]
    }
    out = db.handle("TransactWriteItems", txn, 5.1)  # "a": 1 used + 2 (transactional)
    assert isinstance(out, Err) and out.kind is ErrorKind.TRANSACTION_CANCELLED
    assert [r["Code"] for r in out.reasons] == ["None", "ThrottlingError"]
    assert db.get("t", {"id": {"S": "b"}}) is None
    assert "v" not in (db.get("t", {"id": {"S": "a"}}) or {})
    assert isinstance(db.handle("TransactWriteItems", txn, 6.0), Ok)


def test_reads_are_billed_per_4kb_and_half_when_eventually_consistent() -> None:
    db = _db(Limits(partition_read=2.0))
    assert isinstance(_put(db, 1.0, "a", pad=5000), Ok)
    get = {"TableName": "t", "Key": {"id": {"S": "a"}}}
    assert isinstance(db.handle("GetItem", {**get, "ConsistentRead": True}, 2.0), Ok)  # 2
    assert isinstance(db.handle("GetItem", get, 2.1), Err)  # 1 more: past 2
    assert isinstance(db.handle("GetItem", get, 3.0), Ok)  # 1
    assert isinstance(db.handle("GetItem", get, 3.1), Ok)  # 2 in all


def test_an_on_demand_table_doubles_at_most_every_half_hour_up_to_its_quota() -> None:
    tp = Throughput(Limits(warm_write=10.0, quota_write=30.0, doubling=1800.0))
    busy = [(("w", "t"), 6.0)]  # over half the warm throughput
    for t in (1.0, 900.0, 1799.0):
        assert tp.admit(t, busy) is None
        tp.charge(t, busy)
    assert tp.admit(1799.5, [(("w", "t"), 5.0)]) is not None  # 11 > 10
    assert tp.table("t").write == 10.0
    assert tp.admit(1801.0, [(("w", "t"), 15.0)]) is None  # 30 minutes on: doubled
    assert tp.table("t").write == 20.0
    tp.charge(1801.0, [(("w", "t"), 15.0)])
    assert tp.admit(1802.0, [(("w", "t"), 21.0)]) is not None
    tp.admit(3500.0, [])
    assert tp.table("t").write == 20.0  # not again before another 30 minutes
    tp.admit(3700.0, [])
    assert tp.table("t").write == 30.0  # the quota, not 40
    quiet = Throughput(Limits(warm_write=10.0, doubling=1800.0))
    quiet.charge(1.0, [(("w", "t"), 1.0)])
    quiet.admit(4000.0, [])
    assert quiet.table("t").write == 10.0  # an idle table does not grow
    assert [w[1:] for w in tp.warmed] == [("t", 20.0, 12_000.0), ("t", 30.0, 12_000.0)]


def test_an_indexed_query_finds_what_a_scan_finds() -> None:
    scanned, indexed = _db(Limits(), indexed=False), _db(Limits(), indexed=True)
    for db in (scanned, indexed):
        db.throughput = None
        for i in range(30):
            _put(db, float(i), f"k{i}", tag=f"v{i % 3}")
        for i in range(0, 30, 4):  # some leave the index, some move to another value
            _put(db, 40.0 + i, f"k{i}", tag="v1" if i % 8 else None)
        db.handle("DeleteItem", {"TableName": "t", "Key": {"id": {"S": "k5"}}}, 90.0)
    query = {
        "TableName": "t",
        "IndexName": "by_tag",
        "KeyConditionExpression": "#t = :v AND #a > :a",
        "ExpressionAttributeNames": {"#t": "tag", "#a": "at"},
        "ExpressionAttributeValues": {":v": {"S": "v1"}, ":a": {"N": "3"}},
    }
    a, b = scanned.handle("Query", query, 100.0), indexed.handle("Query", query, 100.0)
    assert isinstance(a, Ok) and isinstance(b, Ok)
    assert a.response["Count"] > 5
    assert a.response == b.response


def _fleet_queue(in_flight_limit: int) -> tuple[SimSQS, Queue]:
    """A fleet's queue (indexed, with an in-flight limit), no drawn fault."""
    chaos = Chaos(0)
    chaos.cutoff = 0.0
    sqs = SimSQS(chaos)
    sqs.indexed = True
    sqs.in_flight_limit = in_flight_limit
    return sqs, sqs.create_queue(URL, visibility=30)


def test_sqs_refuses_a_receive_past_the_in_flight_limit() -> None:
    sqs, q = _fleet_queue(in_flight_limit=2)
    for i in range(4):
        sqs.now = float(i)
        sqs.send(q, f"m{i}")
    receive = {"QueueUrl": URL, "MaxNumberOfMessages": 1}
    got = [sqs.handle("ReceiveMessage", receive, 10.0 + i) for i in range(3)]
    bodies = [m["Body"] for out in got[:2] if isinstance(out, Ok) for m in out.response["Messages"]]
    assert bodies == ["m0", "m1"]  # the oldest visible first
    refused = got[2]
    assert isinstance(refused, Err) and refused.code == "OverLimit"
    assert refused.kind is ErrorKind.THROTTLED
    handle = got[0].response["Messages"][0]["ReceiptHandle"]  # type: ignore[union-attr]
    assert isinstance(
        sqs.handle("DeleteMessage", {"QueueUrl": URL, "ReceiptHandle": handle}, 13.0), Ok
    )
    again = sqs.handle("ReceiveMessage", receive, 14.0)
    assert isinstance(again, Ok) and again.response["Messages"][0]["Body"] == "m2"
    # m1's visibility lapses: it is received again, before the newer m3
    late = sqs.handle("ReceiveMessage", {**receive, "MaxNumberOfMessages": 2}, 45.0)
    assert isinstance(late, Ok)
    assert [m["Body"] for m in late.response["Messages"]] == ["m3", "m1"] or [
        m["Body"] for m in late.response["Messages"]
    ] == ["m1", "m3"]
    assert sqs.peak_in_flight == 2


def test_the_aws_driver_reads_sqs_over_limit_as_throttled() -> None:
    response: Any = {
        "Error": {"Code": "OverLimit", "Message": "too many"},
        "ResponseMetadata": {"HTTPStatusCode": 403},
    }
    exc = botocore.exceptions.ClientError(response, "ReceiveMessage")
    assert classify(exc, 0.0, 0.0).kind is ErrorKind.THROTTLED


def test_the_simulated_tables_have_the_real_tables_indexes() -> None:
    names = {t.name: {i.name for i in t.indexes} for t in table_specs()}
    assert names["sim-jobs"] == {"unsent", "group", "attention", "workers"}
    assert names["sim-intents"] == {"ambiguous"}


def test_a_fleet_under_a_throttled_table_loses_no_job() -> None:
    """A burst on a table far smaller than the load: throttles on the table, an index
    key and the producer's writes; every job still ends once, nothing dead-lettered."""
    spec = fleet.FleetSpec(
        workers=12,
        jobs=240,
        burst=4.0,
        concurrency=3,
        limits=Limits(warm_write=150.0, warm_read=400.0, partition_write=150.0),
    )
    report = fleet.run(spec)
    assert report.ok, report.violations
    assert report.states == {"succeeded": 240}
    assert report.finished == 240
    assert report.dead_lettered == 0
    assert sum(report.throttled.values()) > 0
    assert report.busiest_second["w:table"] <= 150.0
    assert report.drained_at is not None


def test_a_fleet_spec_names_a_bad_table() -> None:
    with pytest.raises(ValueError, match=r"FleetSpec\.table"):
        fleet.run(fleet.FleetSpec(workers=1, jobs=1, table="warm"))


def test_a_delayed_message_never_received_is_not_in_flight() -> None:
    sqs, q = _fleet_queue(in_flight_limit=1)
    sqs.now = 0.0
    sqs.send(q, "waits", delay=60)  # a slot waiter's delayed message
    sqs.send(q, "now")
    out = sqs.handle("ReceiveMessage", {"QueueUrl": URL, "MaxNumberOfMessages": 10}, 1.0)
    assert isinstance(out, Ok) and [m["Body"] for m in out.response["Messages"]] == ["now"]
    refused = sqs.handle("ReceiveMessage", {"QueueUrl": URL}, 2.0)  # "now" is in flight
    assert isinstance(refused, Err) and refused.code == "OverLimit"
