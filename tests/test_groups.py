"""Cancelling a whole agent session (a group of jobs): the flows by hand, then on a
real moto server, with real worker processes holding the session's jobs."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import AwsTestEnv
from core_harness import Script
from test_cli import run as run_cli
from worker_helpers import HANG_GUARD, WorkerProcess

from sqs_lease import GroupCancelled, Producer, Settings, SubmitConflict, create_queue
from sqs_lease._core.calls import Err, ErrorKind, Ok
from sqs_lease._core.groups import cancel_group_flow
from sqs_lease._core.sending import submit_flow
from sqs_lease._errors import ConfigError
from sqs_lease._resources import create_tables
from sqs_lease._schema.group_requests import GroupTable
from sqs_lease._schema.job_requests import JobTable
from sqs_lease._schema.models import GROUP_INDEX
from sqs_lease._schema.views import view_of

HERE = Path(__file__).resolve().parent
JOBS = JobTable("jobs-test")
GROUPS = GroupTable("groups-test")
CANCELLED_GROUP = {
    "group_id": {"S": "s1"},
    "jobs": {"N": "2"},
    "cancelled_at": {"N": "5"},
    "reason": {"S": "user closed the session"},
}


def _submit(group: str = "s1") -> Any:
    return submit_flow(
        JOBS,
        queue_url="q",
        job_id="j9",
        job_class="c",
        payload_json="{}",
        payload_hash="h",
        wall_now=10.0,
        send_id="s",
        group=group,
        groups=GROUPS,
    )


def _index_item(job_id: str, state: str, error_code: str | None = None) -> dict[str, Any]:
    item = {
        "job_id": {"S": job_id},
        "job_class": {"S": "c"},
        "state": {"S": state},
        "group_id": {"S": "s1"},
        "created_at": {"N": "1"},
    }
    if error_code:
        item["error_code"] = {"S": error_code}
    return item


def _cancelled(job_id: str) -> Ok:
    item = {**_index_item(job_id, "failed", "cancelled"), "token": {"N": "2"}}
    return Ok({"Attributes": item})


# =========================================================================== by hand


def test_a_grouped_submit_writes_its_record_in_one_transaction_with_the_group_marker() -> None:
    s = Script([Ok({}), Ok({"MessageId": "m1"}), Ok({})])
    res = s.run(_submit())
    assert res.created
    assert s.ops[0] == "dynamodb.TransactWriteItems"
    count, put = s.calls[0].params["TransactItems"]
    assert count["Update"]["TableName"] == "groups-test"
    assert "attribute_not_exists" in count["Update"]["ConditionExpression"]
    assert put["Put"]["Item"]["group_id"] == {"S": "s1"}


def test_a_submit_to_a_cancelled_group_is_refused_naming_the_group_and_its_reason() -> None:
    refused = Err(
        ErrorKind.TRANSACTION_CANCELLED,
        "TransactionCanceledException",
        reasons=({"Code": "ConditionalCheckFailed", "Item": CANCELLED_GROUP}, {"Code": "None"}),
    )
    s = Script([refused])
    with pytest.raises(GroupCancelled, match=r"group 's1' was cancelled \(user closed") as caught:
        s.run(_submit())
    assert caught.value.group_id == "s1"
    assert s.ops == ["dynamodb.TransactWriteItems"]  # nothing sent


def test_a_resubmit_in_the_same_group_finds_its_record_and_sends_nothing_twice() -> None:
    existing = {**_index_item("j9", "queued"), "payload_hash": {"S": "h"}, "send_id": {"S": "s"}}
    existing["message_sent"] = {"BOOL": True}
    exists = Err(
        ErrorKind.TRANSACTION_CANCELLED,
        "TransactionCanceledException",
        reasons=({"Code": "None"}, {"Code": "ConditionalCheckFailed", "Item": existing}),
    )
    s = Script([exists])
    res = s.run(_submit())
    assert not res.created and res.message_id is None


def test_a_grouped_submit_cancelled_by_a_concurrent_transaction_is_tried_again() -> None:
    conflict = Err(
        ErrorKind.TRANSACTION_CANCELLED,
        "TransactionCanceledException",
        reasons=({"Code": "TransactionConflict"}, {"Code": "None"}),
    )
    s = Script([conflict, conflict, Ok({}), Ok({"MessageId": "m1"}), Ok({})])
    assert s.run(_submit()).created
    assert s.ops[:3] == ["dynamodb.TransactWriteItems"] * 3
    assert len(s.sleeps) == 2


def test_the_same_job_id_in_another_group_is_a_conflict() -> None:
    existing = {**_index_item("j9", "queued"), "payload_hash": {"S": "h"}}
    exists = Err(
        ErrorKind.TRANSACTION_CANCELLED,
        "TransactionCanceledException",
        reasons=({"Code": "None"}, {"Code": "ConditionalCheckFailed", "Item": existing}),
    )
    with pytest.raises(SubmitConflict, match=r"exists in group 's1'.*names group 's2'"):
        Script([exists]).run(_submit("s2"))


def test_a_group_cancel_reads_the_index_again_until_it_shows_every_counted_job() -> None:
    # The marker counts 2 jobs; the eventually consistent index shows one at first.
    marked = Ok({"Attributes": {**CANCELLED_GROUP, "reason": {"S": "stop"}}})
    s = Script(
        [
            marked,
            Ok({"Items": [_index_item("a", "running")]}),
            _cancelled("a"),
            Ok({"Items": [_index_item("a", "running"), _index_item("b", "succeeded")]}),
        ]
    )
    rep = s.run(cancel_group_flow(JOBS, GROUPS, group="s1", reason="stop", wall_now=9.0))
    assert rep.cancelled == ("a",)
    assert rep.finished == (("b", "succeeded"),)
    assert rep.missing == 0 and rep.complete
    assert s.sleeps == [1.0]
    queries = [c for c in s.calls if c.op == "Query"]
    assert {q.params["IndexName"] for q in queries} == {GROUP_INDEX}  # an index, never a scan
    assert "Scan" not in s.ops
    done = [e for e in s.events if e.event == "group_cancelled"]
    assert done[0].fields["cancelled"] == 1 and done[0].fields["missing"] == 0


def test_a_group_cancel_reports_counted_jobs_the_index_never_showed_as_missing() -> None:
    marked = Ok({"Attributes": CANCELLED_GROUP})
    s = Script([marked, Ok({"Items": []}), Ok({"Items": []})])
    rep = s.run(cancel_group_flow(JOBS, GROUPS, group="s1", reason="stop", wall_now=9.0, rounds=2))
    assert rep.missing == 2 and not rep.complete
    assert rep.reason == "user closed the session"  # the first cancel's reason stays


# =========================================================================== real moto


@pytest.fixture
def env(aws: AwsTestEnv) -> Settings:
    settings = Settings(endpoint_url=aws.endpoint_url, prefix=aws.prefix)
    create_tables(settings)
    create_queue(settings, visibility=4)
    return settings


def _state(settings: Settings, job_id: str) -> Any:
    import boto3

    ddb = boto3.client("dynamodb", endpoint_url=settings.endpoint_url, region_name="us-east-1")
    item = ddb.get_item(
        TableName=settings.jobs_table, Key={"job_id": {"S": job_id}}, ConsistentRead=True
    )["Item"]
    return view_of(item)


def _finish(settings: Settings, job_id: str) -> None:
    import boto3

    ddb = boto3.client("dynamodb", endpoint_url=settings.endpoint_url, region_name="us-east-1")
    ddb.update_item(
        TableName=settings.jobs_table,
        Key={"job_id": {"S": job_id}},
        UpdateExpression="SET #s = :s",
        ExpressionAttributeNames={"#s": "state"},
        ExpressionAttributeValues={":s": {"S": "succeeded"}},
    )


@pytest.mark.integration
def test_cancelling_a_group_ends_its_open_jobs_refuses_new_ones_and_spares_other_groups(
    env: Settings,
) -> None:
    p = Producer(env)
    for n in range(3):
        p.submit("c", {"n": n}, f"{env.prefix}-s1-{n}", group="s1")
    p.submit("c", {"n": 9}, f"{env.prefix}-s2-0", group="s2")
    p.submit("c", {"n": 8}, f"{env.prefix}-none")
    _finish(env, f"{env.prefix}-s1-2")
    rep = p.cancel_group("s1", "the user closed the session")
    assert sorted(rep.cancelled) == [f"{env.prefix}-s1-0", f"{env.prefix}-s1-1"]
    assert rep.finished == ((f"{env.prefix}-s1-2", "succeeded"),)
    assert rep.jobs == 3 and rep.complete
    for n in (0, 1):
        view = _state(env, f"{env.prefix}-s1-{n}")
        assert (view.state.value, view.error_code) == ("cancelled", "cancelled")
        assert view.reason == "cancelled: group s1: the user closed the session"
    assert _state(env, f"{env.prefix}-s2-0").state.value == "queued"
    assert _state(env, f"{env.prefix}-none").state.value == "queued"
    with pytest.raises(GroupCancelled, match="the user closed the session"):
        p.submit("c", {"n": 4}, f"{env.prefix}-s1-4", group="s1")
    with pytest.raises(GroupCancelled):  # a resubmit of one of its jobs too
        p.submit("c", {"n": 0}, f"{env.prefix}-s1-0", group="s1")
    # again: idempotent, nothing left to cancel, everything reported finished
    again = p.cancel_group("s1", "another reason")
    assert again.cancelled == () and len(again.finished) == 3
    assert again.reason == "the user closed the session"


@pytest.mark.integration
def test_a_group_id_that_cannot_be_stored_is_refused_before_any_call(env: Settings) -> None:
    with pytest.raises(ConfigError, match=r"group='a b'"):
        Producer(env).submit("c", {"n": 1}, "x", group="a b")


@pytest.mark.integration
def test_submits_racing_a_group_cancel_end_cancelled_or_refused_never_open(env: Settings) -> None:
    p = Producer(env)
    refused: list[str] = []
    created: list[str] = []
    started = threading.Event()

    def producer() -> None:
        for n in range(40):  # bounded
            jid = f"{env.prefix}-r-{n}"
            try:
                p.submit("c", {"n": n}, jid, group="race")
                created.append(jid)
            except GroupCancelled:
                refused.append(jid)
            if n == 5:
                started.set()

    t = threading.Thread(target=producer)
    t.start()
    assert started.wait(HANG_GUARD)
    rep = p.cancel_group("race", "stop now")
    t.join(120)
    assert not t.is_alive()
    assert refused, "the cancel came after every submit: the race was not exercised"
    # Every job created before the cancel was counted and cancelled; none after it.
    assert rep.jobs == len(rep.cancelled) + len(rep.finished) and rep.complete
    assert sorted(rep.cancelled) == sorted(created)
    for jid in created:
        assert _state(env, jid).error_code == "cancelled"


@pytest.mark.integration
def test_the_cli_cancels_a_group_and_says_what_it_did(aws: AwsTestEnv, env: Settings) -> None:
    p = Producer(env)
    p.submit("c", {"n": 1}, f"{env.prefix}-c-1", group="cli-s")
    out = run_cli(aws, "jobs", "cancel", "--group", "cli-s", "--reason", "done")
    assert out.exit_code == 0, out.output
    assert f"{env.prefix}-c-1\tcancelled" in out.output
    assert "group cli-s: 1 cancelled, 0 already finished, of 1 submitted (done)" in out.output
    refused = run_cli(aws, "submit", "c", "--payload", "{}", "--group", "cli-s")
    assert refused.exit_code != 0 and "was cancelled (done)" in refused.output
    both = run_cli(aws, "jobs", "cancel", "x", "--group", "cli-s")
    assert both.exit_code == 2 and "one of them" in both.output


# ------------------------------------------------------------- real worker processes


@pytest.fixture
def procs(env: Settings, tmp_path: Path) -> Iterator[list[WorkerProcess]]:
    made: list[WorkerProcess] = []
    (tmp_path / "gates").mkdir()
    yield made
    for p in made:
        p.stop()


def _wait(pred: Any, what: str, procs: list[WorkerProcess], timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout  # a hang guard only
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.1)
    logs = "\n".join(p.log.read_text()[-2000:] for p in procs)
    raise AssertionError(f"no {what} within {timeout}s; logs:\n{logs}")


@pytest.mark.integration
def test_owners_of_a_cancelled_sessions_jobs_lose_their_leases_at_the_next_heartbeat(
    env: Settings, procs: list[WorkerProcess], tmp_path: Path
) -> None:
    gates = tmp_path / "gates"
    for name in ("W1", "W2"):
        procs.append(
            WorkerProcess(
                HERE / "group_worker.py", name, env, tmp_path / f"{name}.log", GATE_DIR=str(gates)
            )
        )
    p = Producer(env)
    ids = [f"{env.prefix}-step-{n}-{uuid.uuid4().hex[:4]}" for n in range(4)]
    for n, jid in enumerate(ids):
        p.submit("session_step", {"n": n}, jid, group="agent-7")
    other = f"{env.prefix}-other"
    p.submit("session_step", {"n": 99}, other, group="agent-8")

    def started() -> set[str]:
        return {e["job_id"] for w in procs for e in w.events("step_started")}

    _wait(lambda: set(ids) | {other} <= started(), "every step started", procs)
    rep = p.cancel_group("agent-7", "the agent session was stopped")
    assert sorted(rep.cancelled) == sorted(ids)

    def lost() -> set[str]:
        return {
            e["job_id"]
            for w in procs
            for e in w.events("heartbeat_lost")
            if e.get("cancelled") and e.get("detected_by") == "heartbeat"
        }

    _wait(lambda: set(ids) <= lost(), "heartbeat_lost (cancelled) for every step", procs)
    # Let every handler go, the cancelled ones included: nothing of them is committed.
    for jid in [*ids, other]:
        (gates / jid).touch()
    _wait(lambda: _state(env, other).state.value == "succeeded", "the other session", procs)
    for jid in ids:
        view = _state(env, jid)
        assert (view.state.value, view.error_code) == ("cancelled", "cancelled")
    committed = {e["job_id"] for w in procs for e in w.events("result_committed")}
    assert committed.isdisjoint(ids) and other in committed


def _fail(settings: Settings, job_id: str) -> None:
    """The job failed on its own (a handler's error) before its group was cancelled."""
    import boto3

    ddb = boto3.client("dynamodb", endpoint_url=settings.endpoint_url, region_name="us-east-1")
    ddb.update_item(
        TableName=settings.jobs_table,
        Key={"job_id": {"S": job_id}},
        UpdateExpression="SET #s = :s, #e = :e, #t = :t",
        ExpressionAttributeNames={"#s": "state", "#e": "error_code", "#t": "token"},
        ExpressionAttributeValues={":s": {"S": "failed"}, ":e": {"S": "boom"}, ":t": {"N": "1"}},
    )


@pytest.mark.integration
def test_jobs_retry_refuses_a_job_of_a_cancelled_group_that_had_failed_before_the_cancel(
    aws: AwsTestEnv, env: Settings
) -> None:
    p = Producer(env)
    failed, other = f"{env.prefix}-r-1", f"{env.prefix}-r-2"
    p.submit("c", {"n": 1}, failed, group="rs")
    p.submit("c", {"n": 2}, other, group="rs-open")
    _fail(env, failed)
    _fail(env, other)
    rep = p.cancel_group("rs", "the user closed the session")
    assert rep.finished == ((failed, "failed"),) and rep.cancelled == ()
    # The cancel found it terminal and left its record as it was: only the group's
    # marker says the session is over, and the retry reads it.
    refused = run_cli(aws, "jobs", "retry", failed)
    assert refused.exit_code != 0, refused.output
    assert "group 'rs', cancelled (the user closed the session)" in refused.output
    view = _state(env, failed)
    assert (view.state.value, view.error_code, view.token) == ("failed", "boom", 1)
    # A failed job of a group that is not cancelled is retried as before.
    retried = run_cli(aws, "jobs", "retry", other)
    assert retried.exit_code == 0, retried.output
    assert _state(env, other).state.value == "queued"
