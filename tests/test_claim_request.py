"""The claim's request, applied by a real moto server and by the simulator's model.

The claim was trimmed to what the protocol and people need (moto's cost of a write
grows with its expression: BENCHMARKS.md, benchmark 2): no ``attribute_exists``
(the class equality refuses a missing record), ``ADD`` for the token and attempt
counters, no ``last_heartbeat``. Both stores must give the same answers as before.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import boto3
import pytest
from conftest import AwsTestEnv
from worker_helpers import prepare

from sqs_lease._core.calls import Call
from sqs_lease._schema.job_requests import JobTable
from sqs_lease.testing._sim.chaos import Chaos
from sqs_lease.testing._sim.ddb import DdbFaults, SimDynamo, TableSpec

Send = Callable[[Call], tuple[bool, dict[str, Any] | None]]
"""Applies a call: (condition held, the answer's Attributes / ALL_OLD item)."""
Get = Callable[[str], dict[str, Any] | None]


@pytest.fixture(params=["moto", "sim"])
def store(request: pytest.FixtureRequest) -> Iterator[tuple[JobTable, Send, Get]]:
    if request.param == "sim":
        table = JobTable("jobs")
        chaos = Chaos(0)
        chaos.cutoff = 0.0  # no faults
        db = SimDynamo([TableSpec("jobs", "job_id")], chaos, DdbFaults())

        def sim_send(c: Call) -> tuple[bool, dict[str, Any] | None]:
            out = db.handle(c.op, c.params, 0.0)
            response = getattr(out, "response", None)
            if response is not None:
                return True, response.get("Attributes")
            return False, getattr(out, "item", None)

        yield table, sim_send, lambda job_id: db.get("jobs", {"job_id": {"S": job_id}})
        return
    aws: AwsTestEnv = request.getfixturevalue("aws")
    settings, _queue, _dlq = prepare(aws.endpoint_url, aws.prefix)
    client = boto3.client("dynamodb", endpoint_url=aws.endpoint_url)
    table = JobTable(settings.jobs_table)

    def moto_send(c: Call) -> tuple[bool, dict[str, Any] | None]:
        try:
            out = getattr(client, _snake(c.op))(**c.params)
        except client.exceptions.ConditionalCheckFailedException as exc:
            answer: dict[str, Any] = dict(exc.response)
            return False, answer.get("Item")
        return True, out.get("Attributes")

    def moto_get(job_id: str) -> dict[str, Any] | None:
        key = {"job_id": {"S": job_id}}
        got = client.get_item(TableName=table.table, Key=key, ConsistentRead=True)
        item: dict[str, Any] | None = got.get("Item")
        return item

    yield table, moto_send, moto_get


def _snake(op: str) -> str:
    return "".join(f"_{ch.lower()}" if ch.isupper() else ch for ch in op).lstrip("_")


def _submit(table: JobTable, send: Send, job_id: str) -> None:
    new = table.put_new(
        job_id=job_id,
        job_class="c",
        payload_json='{"n":1}',
        payload_hash="h",
        wall_now=1.0,
        send_id="s1",
    )
    assert send(new)[0]
    assert send(table.mark_sent(job_id, "s1", 2.0))[0]


@pytest.mark.integration
def test_a_claim_naming_a_job_without_a_record_is_refused_and_creates_none(
    store: tuple[JobTable, Send, Get],
) -> None:
    table, send, get = store
    for send_id in ("s1", None):  # with a send id, and as an older producer's message
        held, old = send(table.claim("ghost", "w1", 10.0, 30, job_class="c", send_id=send_id))
        assert not held and old is None
    assert get("ghost") is None


@pytest.mark.integration
def test_a_claim_counts_token_and_attempt_up_from_the_record_and_answers_the_old_record(
    store: tuple[JobTable, Send, Get],
) -> None:
    table, send, get = store
    _submit(table, send, "j1")
    held, old = send(table.claim("j1", "w1", 10.0, 30, job_class="c", send_id="s1"))
    assert held and old is not None
    assert (old["token"], old["attempt"], old["state"]) == ({"N": "0"}, {"N": "0"}, {"S": "queued"})
    assert old["payload"] == {"S": '{"n":1}'}  # the claim reads the job from ALL_OLD
    # A running record is not claimed (the duplicate rule decides first, issue 26)...
    held, current = send(table.claim("j1", "w2", 11.0, 30, job_class="c", send_id="s1"))
    assert not held and current is not None and current["owner"] == {"S": "w1"}
    # ... nor taken over under another token than the one judged dead ...
    held, current = send(
        table.claim("j1", "w2", 11.0, 30, job_class="c", send_id="s1", take_from=0)
    )
    assert not held and current is not None and current["token"] == {"N": "1"}
    # ... but taken over under the token its claimer watched and found dead.
    held, old = send(table.claim("j1", "w2", 11.0, 30, job_class="c", send_id="s1", take_from=1))
    assert held and old is not None and old["owner"] == {"S": "w1"}  # a reclaim
    job = get("j1")
    assert job is not None
    assert (job["token"], job["attempt"], job["owner"]) == ({"N": "2"}, {"N": "2"}, {"S": "w2"})
    assert float(job["lease_deadline"]["N"]) == 41.0
    assert "last_heartbeat" not in job  # = updated_at; heartbeat age is the liveness record's
    # The new token fences: the first claim's commit is refused, the second's lands.
    assert not send(table.commit("j1", 1, "w1", "{}", 12.0, write_id="n-1:commit"))[0]
    assert send(table.commit("j1", 2, "w2", "{}", 12.0, write_id="n-1:commit"))[0]
    assert not send(table.claim("j1", "w3", 13.0, 30, job_class="c", send_id="s1"))[0]


@pytest.mark.integration
def test_a_claim_of_another_class_or_message_is_refused_with_the_record(
    store: tuple[JobTable, Send, Get],
) -> None:
    table, send, get = store
    _submit(table, send, "j2")
    for job_class, send_id in (("other", "s1"), ("c", "s0")):
        held, current = send(
            table.claim("j2", "w1", 10.0, 30, job_class=job_class, send_id=send_id)
        )
        assert not held and current is not None and current["token"] == {"N": "0"}
    job = get("j2")
    assert job is not None and job["state"] == {"S": "queued"} and job["attempt"] == {"N": "0"}


@pytest.mark.integration
def test_the_claim_of_a_next_stage_reads_no_progress_hint_of_the_stage_before(
    store: tuple[JobTable, Send, Get],
) -> None:
    # A progress hint belongs to the stage that saved it (issue 26 defect 5): the
    # checkpoint that moves the record on clears it, so the next stage's claim (its
    # ALL_OLD is what ``ctx.last_progress`` is read from) finds none.
    table, send, get = store
    _submit(table, send, "j3")
    assert send(table.claim("j3", "w1", 10.0, 30, job_class="c", send_id="s1"))[0]
    assert send(table.save_progress("j3", 1, '{"pages_done":500}', 11.0))[0]
    # The hint survives a takeover within the stage: the next owner resumes from it.
    held, old = send(table.claim("j3", "w2", 12.0, 30, job_class="c", send_id="s1", take_from=1))
    assert held and old is not None and old["progress"] == {"S": '{"pages_done":500}'}
    checkpoint = table.advance_stage(
        "j3",
        2,
        "w2",
        stage="fetch",
        next_stage="render",
        stage_input='{"rows":1}',
        stage_log='[{"stage":"fetch"}]',
        send_id="s2",
        wall_now=13.0,
        write_id="n-1:stage",
    )
    assert send(checkpoint)[0]
    job = get("j3")
    assert job is not None
    assert not {"progress", "progress_token", "progress_at"} & set(job)
    held, old = send(table.claim("j3", "w3", 14.0, 30, job_class="c", send_id="s2"))
    assert held and old is not None and "progress" not in old
    assert table.parse(old).progress_json is None
