"""One liveness write per worker per round, not a write per job (issue 12 item 1).

The heartbeat round extends and confirms leases (CMV batches, one ownership read
per 100), then writes the worker's liveness record: every open lease it holds with
its token and wall-clock deadline. Advisory: unconditional, and a failed write
changes no lease.
"""

from __future__ import annotations

import json
from typing import Any

from core_harness import TABLE, WORKER, Script, delivery, job_item, ok, unreachable
from test_core_attempt import MONO, WALL, Shell, _up_to_handler

from sqs_lease._core.attempt import attempt_flow
from sqs_lease._core.calls import Call, Invoke, Outcome
from sqs_lease._core.lease import LeaseStatus
from sqs_lease._core.liveness import (
    LIVENESS_PART,
    HeldJob,
    liveness_key,
    liveness_of,
    liveness_parts,
)
from sqs_lease._core.records import JobState
from sqs_lease._core.rounds import heartbeat_round_flow
from sqs_lease._schema.job_requests import JobTable


def _hold(shell: Shell, job_id: str) -> Any:
    """An attempt of ``job_id`` held up to its handler (keep the flow: a collected flow
    forgets its lease)."""
    flow = attempt_flow(shell.env, delivery(job_id, receipt_handle=f"rh-{job_id}"))
    claimed = job_item(job_id, state=JobState.QUEUED, owner=None, token=4, attempt=1)
    answers = iter([ok({"Attributes": claimed}, sent_at=MONO, received_at=MONO)])
    instr = next(flow)
    while not (isinstance(instr, Invoke) and instr.what == "handler"):
        out: Any = None
        if isinstance(instr, Call):
            out = next(answers)
        elif isinstance(instr, Invoke):
            out = ok({"value": instr.fn()})
        instr = flow.send(out)
    return flow


def _aws(shell: Shell, token: int = 5) -> Any:
    """SQS and DynamoDB answering a round: every entry extended (sent now), every
    record still running under ``token``; any other call (the liveness write) ok."""

    def answer(call: Call) -> Outcome:
        if call.op == "BatchGetItem":
            keys = call.params["RequestItems"][TABLE]["Keys"]
            found = [
                job_item(k["job_id"]["S"], state=JobState.RUNNING, owner=WORKER, token=token)
                for k in keys
            ]
            return ok({"Responses": {TABLE: found}, "UnprocessedKeys": {}}, sent_at=shell.mono)
        if call.op == "ChangeMessageVisibilityBatch":
            entries = call.params["Entries"]
            return ok({"Successful": [{"Id": e["Id"]} for e in entries]}, sent_at=shell.mono)
        return ok()

    return answer


def test_a_heartbeat_round_writes_one_liveness_record_and_no_write_per_job() -> None:
    shell = Shell(lambda run: None)
    flows = [_hold(shell, f"job-{i:02d}") for i in range(12)]
    shell.mono = MONO + 10.0  # the first beat: the receive's 30 s lease extended to L
    Script(_aws(shell)).run(heartbeat_round_flow(shell.env))
    # Every lease due again, more than half a lease (L = 60 s) after its claim: where
    # the old heartbeat wrote its advisory lease fields with an UpdateItem per job.
    shell.mono = MONO + 35.0
    for held in shell.book.entries():
        held.lease.next_beat = shell.mono
    s = Script(_aws(shell))
    s.run(heartbeat_round_flow(shell.env))
    ops = [c.op for c in s.calls]
    # Two CMV batches, one ownership read, one liveness write: no UpdateItem per job.
    assert ops == [
        "ChangeMessageVisibilityBatch",
        "ChangeMessageVisibilityBatch",
        "BatchGetItem",
        "PutItem",
    ]
    put = s.calls[-1].params
    # Advisory, never a fence: its one condition keeps it off a job record under its key.
    assert put["ConditionExpression"] == "(attribute_not_exists (#0) OR #1 = :0)"
    assert put["ExpressionAttributeNames"] == {"#0": "job_id", "#1": "kind"}
    assert put["ExpressionAttributeValues"] == {":0": {"S": "liveness"}}
    live = liveness_of(put["Item"])
    assert live is not None and live.worker_id == WORKER
    assert put["Item"]["job_id"] == {"S": liveness_key(WORKER)}
    assert (live.beat_at, live.part, live.parts) == (WALL, 0, 1)
    assert [h.job_id for h in live.held] == [f"job-{i:02d}" for i in range(12)]
    assert {h.token for h in live.held} == {5}
    # The deadline on the wall clock: the lease extended by L = 60 s from the CMV's
    # send, read at the round's end (the shell's wall clock reads WALL then).
    for held in shell.book.entries():
        assert held.lease.status is LeaseStatus.OK
    assert {h.lease_deadline for h in live.held} == {WALL + 60.0}
    assert shell.counts["liveness_writes"] == 2  # one per round
    assert len(flows) == 12


def test_rounds_within_one_heartbeat_interval_write_the_liveness_record_once() -> None:
    shell = Shell(lambda run: None)
    run, _flow = _up_to_handler(shell)
    shell.mono = MONO + 10.0
    first = Script(_aws(shell))
    first.run(heartbeat_round_flow(shell.env))
    assert [c.op for c in first.calls][-1] == "PutItem"
    # The same lease due again 1 s later (as if its schedule said so): extended, but
    # the record was written less than H (10 s) ago.
    run.held.lease.next_beat = shell.mono = MONO + 11.0
    second = Script(_aws(shell))
    second.run(heartbeat_round_flow(shell.env))
    assert "PutItem" not in [c.op for c in second.calls]
    run.held.lease.next_beat = shell.mono = MONO + 20.0
    third = Script(_aws(shell))
    third.run(heartbeat_round_flow(shell.env))
    assert [c.op for c in third.calls][-1] == "PutItem"


def test_a_failed_liveness_write_is_journaled_and_changes_no_lease() -> None:
    shell = Shell(lambda run: None)
    run, _flow = _up_to_handler(shell)
    shell.mono = MONO + 10.0
    aws = _aws(shell)
    s = Script(lambda c: unreachable() if c.op == "PutItem" else aws(c))
    s.run(heartbeat_round_flow(shell.env))
    failed = s.event("liveness_failed")
    assert (failed["part"], failed["jobs"]) == (0, 1) and failed["error_code"]
    assert run.held.lease.status is LeaseStatus.OK  # extended and confirmed all the same
    assert run.held.lease.deadline == MONO + 10.0 + 60.0
    assert s.events_named("heartbeat_lost") == [] and s.events_named("ownership_unknown") == []


def test_a_worker_holding_more_than_a_part_writes_one_item_per_part() -> None:
    held = [HeldJob(f"j{i:05d}", 1, WALL + 30) for i in range(LIVENESS_PART * 2 + 1)]
    parts = liveness_parts("w", WALL, 0.2, held)
    assert [len(p.held) for p in parts] == [LIVENESS_PART, LIVENESS_PART, 1]
    assert [(p.part, p.parts) for p in parts] == [(0, 3), (1, 3), (2, 3)]
    items = [JobTable(TABLE).liveness(p).params["Item"] for p in parts]
    assert [i["job_id"]["S"] for i in items] == ["worker#w", "worker#w#1", "worker#w#2"]
    # Far under DynamoDB's 400 KB item limit, and each item reads back whole.
    assert max(len(json.dumps(i)) for i in items) < 40_000
    assert [liveness_of(i) for i in items] == parts
    assert liveness_parts("w", WALL, 0.2, [])[0].held == ()  # holding nothing says so


def test_a_liveness_item_expires_by_the_tables_garbage_collection_ttl_attribute() -> None:
    from sqs_lease.deploy import GC_TTL_ATTRIBUTE

    item = JobTable(TABLE).liveness(liveness_parts("w", WALL, 0.1, [])[0]).params["Item"]
    assert int(item[GC_TTL_ATTRIBUTE]["N"]) > WALL  # TTL: garbage collection, a day on
