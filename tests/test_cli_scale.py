"""Operator reads that hold at ten million records, on a real moto server over HTTP.

``jobs show`` takes lease left and heartbeat age from the owner's liveness record
(one write per worker per round, not a write per job) and says when there is
none; ``jobs list`` finds parked and failed jobs through the sparse ``attention``
index and running ones through the workers' liveness records, never by a Scan;
a state no index holds needs ``--scan``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from conftest import AwsTestEnv
from test_cli import ready, run

import sqs_lease._operator as operator_module
from sqs_lease import Settings
from sqs_lease._core.liveness import HeldJob, Liveness
from sqs_lease._schema.job_requests import JobTable
from sqs_lease._schema.models import JobRecord


@pytest.fixture
def ops(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The DynamoDB operations the CLI's reads send (read from botocore's events)."""
    seen: list[str] = []
    make = operator_module.make_client  # type: ignore[attr-defined]

    def counting(settings: Settings, service: str) -> Any:
        client = make(settings, service)
        client.meta.events.register(
            "before-call.dynamodb.*", lambda model, **_: seen.append(model.name)
        )
        return client

    monkeypatch.setattr(operator_module, "make_client", counting)
    yield seen


def _setup(aws: AwsTestEnv) -> tuple[Any, JobTable]:
    ready(aws)
    settings = Settings(endpoint_url=aws.endpoint_url, prefix=aws.prefix)
    ddb = boto3.client("dynamodb", endpoint_url=aws.endpoint_url, region_name="us-east-1")
    return ddb, JobTable(settings.jobs_table)


def _running(ddb: Any, jobs: JobTable, job_id: str, owner: str, token: int = 2) -> None:
    now = time.time()
    rec = JobRecord(
        job_id=job_id,
        job_class="ocr",
        state="running",
        owner=owner,
        token=token,
        attempt=token,
        payload="{}",
        payload_hash="ab" * 32,
        created_at=now - 60,
        updated_at=now - 30,
        lease_deadline=now - 5,  # as the claim wrote it, long ago: not what is shown
        last_heartbeat=now - 30,
    )
    ddb.put_item(TableName=jobs.table, Item=rec.serialize())


def test_jobs_show_takes_lease_left_and_heartbeat_age_from_the_owners_liveness_record(
    aws: AwsTestEnv,
) -> None:
    ddb, jobs = _setup(aws)
    _running(ddb, jobs, "j-live", "w-9")

    none = json.loads(run(aws, "jobs", "show", "j-live", "--json").stdout)
    assert (none["lease_left"], none["heartbeat_age"]) == (None, None)
    assert "none found for worker 'w-9'" in none["liveness"]

    now = time.time()
    alive = Liveness("w-9", now - 2.0, 0.25, 0, 1, (HeldJob("j-live", 2, now + 20.0),))
    ddb.put_item(**jobs.liveness(alive).params)
    shown = json.loads(run(aws, "jobs", "show", "j-live", "--json").stdout)
    assert 15.0 < shown["lease_left"] <= 20.0  # numbers in JSON
    assert 2.0 <= shown["heartbeat_age"] < 7.0
    # One name per fact: the beat the age is of, not the record's stale attribute.
    assert shown["last_heartbeat"] == pytest.approx(now - 2.0)
    assert "w-9" in shown["liveness"] and "0.25s" in shown["liveness"]
    text = run(aws, "jobs", "show", "j-live").stdout
    assert "liveness: worker 'w-9'" in text
    assert "lease_left: " in text and "s\n" in text.split("lease_left: ")[1][:12]
    assert ": -\n" not in text.replace("reason: -\n", "")  # empty fields hidden

    # A record of a later claim (token 3) than the one the liveness record lists.
    _running(ddb, jobs, "j-live", "w-9", token=3)
    moved = json.loads(run(aws, "jobs", "show", "j-live", "--json").stdout)
    assert moved["lease_left"] is None and "lists token 2" in moved["liveness"]


def test_jobs_list_running_comes_from_the_liveness_records_never_a_scan(
    aws: AwsTestEnv, ops: list[str]
) -> None:
    ddb, jobs = _setup(aws)
    now = time.time()
    for n, worker in enumerate(("w-1", "w-2")):
        _running(ddb, jobs, f"j-{n}", worker)
        held = (HeldJob(f"j-{n}", 2, now + 25.0),)
        ddb.put_item(**jobs.liveness(Liveness(worker, now, 0.1, 0, 1, held)).params)
    # A record that says running, held by no live worker, is not listed as held.
    _running(ddb, jobs, "j-orphan", "w-gone")
    ops.clear()
    listed = run(aws, "jobs", "list", "--state", "running", "--json")
    assert listed.exit_code == 0, listed.output
    rows = [json.loads(line) for line in listed.stdout.splitlines()]
    assert [r["job_id"] for r in rows] == ["j-0", "j-1"]
    assert all(isinstance(r["lease_left"], float) for r in rows)
    assert "Scan" not in ops and "Query" in ops


def test_jobs_list_parked_and_failed_use_the_attention_index_never_a_scan(
    aws: AwsTestEnv, ops: list[str]
) -> None:
    ddb, jobs = _setup(aws)
    now = time.time()
    for job_id in ("p-1", "f-1", "ok-1"):
        put = jobs.put_new(
            job_id=job_id,
            job_class="ocr",
            payload_json="{}",
            payload_hash="ab" * 32,
            wall_now=now,
            send_id=f"{job_id}.s",
        )
        ddb.put_item(**put.params)
        claim = jobs.claim(job_id, "w-1", now, 30, job_class="ocr", send_id=f"{job_id}.s")
        ddb.update_item(**claim.params)
    # The library's own writes: park one, fail one, commit one.
    ddb.update_item(
        **jobs.park("p-1", 1, "w-1", "intent ambiguous", now, write_id="n-1:park").params
    )
    ddb.update_item(
        **jobs.end_in_error(
            "f-1", 1, "w-1", "boom", "error", now, write_id="n-1:fail", retry=False
        ).params
    )
    ddb.update_item(**jobs.commit("ok-1", 1, "w-1", "{}", now, write_id="n-1:commit").params)
    ops.clear()
    parked = run(aws, "jobs", "list", "--state", "parked", "--json")
    failed = run(aws, "jobs", "list", "--state", "failed", "--json")
    assert [json.loads(x)["job_id"] for x in parked.stdout.splitlines()] == ["p-1"]
    assert [json.loads(x)["job_id"] for x in failed.stdout.splitlines()] == ["f-1"]
    assert json.loads(failed.stdout)["reason"] == "boom"
    assert "Scan" not in ops and ops.count("Query") == 2
    # The index projects only some attributes: each row shows what the table shows.
    table_rows = {
        r["job_id"]: r
        for r in map(json.loads, run(aws, "jobs", "list", "--json").stdout.splitlines())
    }
    for listed in (parked, failed):
        row = json.loads(listed.stdout)
        assert row == table_rows[row["job_id"]]

    # A resume takes the job out of the index.
    ddb.update_item(**jobs.unpark("p-1", "p-1.s2", now).params)
    assert run(aws, "jobs", "list", "--state", "parked").stdout.splitlines()[1:] == []


def test_a_state_no_index_holds_needs_scan_and_says_so(aws: AwsTestEnv, ops: list[str]) -> None:
    ready(aws)
    refused = run(aws, "jobs", "list", "--state", "succeeded")
    assert refused.exit_code == 2
    assert "--scan" in refused.stderr and "parked, failed, cancelled, running" in refused.stderr
    assert "Scan" not in ops
    assert run(aws, "jobs", "list", "--state", "succeeded", "--scan").exit_code == 0
    assert "Scan" in ops
