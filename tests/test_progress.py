"""Progress checkpoints (issue 13 item 3): ``ctx.progress(details)`` is kept on the
job record by the heartbeat, fenced on the token, only when it changed; the next
owner finds it in ``ctx.last_progress``."""

from __future__ import annotations

import json
import threading
from typing import TYPE_CHECKING, Any

import pytest
from conftest import AwsTestEnv
from core_harness import (
    OTHER,
    QUEUE,
    WORKER,
    Script,
    assert_fenced,
    condition_failed,
    job_item,
    local_lease,
    table,
    update_sets,
)
from pydantic import BaseModel
from test_core_flows import FakeAws
from worker_helpers import (
    FAST,
    HANG_GUARD,
    collect_journal,
    hold_heartbeat,
    prepare,
    read_record,
    running,
    wait_until,
)

from sqs_lease import (
    PROGRESS_LIMIT,
    App,
    JobContext,
    NextStage,
    Producer,
    ProgressTooLarge,
    Worker,
)
from sqs_lease._aws import SyncDriver
from sqs_lease._core.calls import Call, Err, ErrorKind, Outcome
from sqs_lease._core.heartbeats import HeartbeatReport, apply_beats, heartbeat_flow
from sqs_lease._core.limits import progress_text
from sqs_lease._core.records import JobState
from sqs_lease._schema.job_requests import JobTable

if TYPE_CHECKING:
    from types_boto3_dynamodb import DynamoDBClient

WALL = 1_700_000_000.0


class Work(BaseModel):
    pages: int


def _beat(s: Script, leases: list[Any]) -> HeartbeatReport:
    return s.run(
        heartbeat_flow(table(), queue_url=QUEUE, leases=leases, worker_id=WORKER, wall_now=WALL)
    )


def _running(job_id: str, token: int = 2) -> dict[str, Any]:
    return job_item(job_id, state=JobState.RUNNING, owner=WORKER, token=token)


# --------------------------------------------------------------------------- core


def test_changed_progress_is_saved_once_fenced_on_the_token_and_not_again_unchanged() -> None:
    lease = local_lease("job-1", token=2)
    lease.progress = '{"page":5}'
    s = Script(FakeAws({"job-1": _running("job-1")}))
    report = _beat(s, [lease])
    saves = s.calls_to("UpdateItem")
    assert len(saves) == 1
    assert_fenced(saves[0].params, token=2)
    sets = update_sets(saves[0].params)
    assert (sets["progress"], sets["progress_token"]) == ("'{\"page\":5}'", "2")
    assert s.event("progress_saved") == {"job_id": "job-1", "token": 2, "size": 10}
    apply_beats([lease], report, started=WALL)
    assert lease.progress_saved == '{"page":5}'
    again = Script(FakeAws({"job-1": _running("job-1")}))
    _beat(again, [lease])
    assert again.calls_to("UpdateItem") == []  # unchanged: no write


def test_a_stale_tokens_progress_write_is_refused_and_turns_the_beat_into_lost() -> None:
    now_item = job_item("job-1", state=JobState.RUNNING, owner=OTHER, token=3)

    def respond(c: Call) -> Outcome:
        if c.op == "UpdateItem":
            return condition_failed(now_item)
        return FakeAws({"job-1": _running("job-1")})(c)

    lease = local_lease("job-1", token=2)
    lease.progress = '{"page":9}'
    s = Script(respond)
    report = _beat(s, [lease])
    assert report.beats["job-1"].status == "lost"
    assert s.event("progress_refused") == {"job_id": "job-1", "token": 2}
    apply_beats([lease], report, started=WALL)
    assert lease.progress_saved is None


def test_progress_details_over_the_limit_raise_a_named_error() -> None:
    assert progress_text({"cursor": "x" * 100}) == '{"cursor":"' + "x" * 100 + '"}'
    with pytest.raises(ProgressTooLarge, match="PROGRESS_LIMIT"):
        progress_text({"cursor": "x" * PROGRESS_LIMIT})
    with pytest.raises(ValueError):  # also a ValueError, for callers that catch those
        progress_text(["€" * (PROGRESS_LIMIT // 3)])


# --------------------------------------------------------------------------- on moto


def test_progress_details_survive_a_takeover_and_a_stale_owner_cannot_overwrite_them(
    aws: AwsTestEnv, ddb_client: DynamoDBClient
) -> None:
    settings, _, _ = prepare(aws.endpoint_url, aws.prefix)
    app = App()
    release = threading.Event()
    seen: dict[int, Any] = {}

    @app.job("pages", payload=Work, **FAST)
    def pages(ctx: JobContext[Any], p: Work) -> dict[str, Any]:
        seen[ctx.token] = ctx.last_progress
        if ctx.token == 1:
            ctx.progress({"pages_done": 5, "cursor": "c5"})
            release.wait(HANG_GUARD)  # paused here; taken over meanwhile
            ctx.progress({"pages_done": 9, "cursor": "c9"})  # a stale owner's details
            ctx.wait(10)  # raises once the attempt learns it lost the lease
        return {"resumed_from": ctx.last_progress}

    submitted = Producer(settings, app).submit("pages", Work(pages=10), job_id=f"{aws.prefix}-p")
    job_id = submitted.job_id
    w1 = Worker(app, settings, worker_id="W1", receive_wait=1, concurrency=1)
    w2 = Worker(app, settings, worker_id="W2", receive_wait=1)
    paused = threading.Event()
    hold_heartbeat(w1, paused)
    with collect_journal() as journal, running(w1):
        journal.wait_for("progress_saved", job_id=job_id, worker="W1", timeout=15)
        paused.set()
        with running(w2):
            journal.wait_for("result_committed", job_id=job_id, worker="W2", timeout=20)
        paused.clear()
        release.set()
        wait_until(
            lambda: any(
                e["event"] in ("heartbeat_lost", "job_abandoned", "result_discarded")
                for e in journal.events(job_id=job_id, worker="W1", token=1)
            ),
            15,
            "W1's attempt ends (its lease lost or dropped)",
        )
    assert seen == {1: None, 2: {"pages_done": 5, "cursor": "c5"}}
    rec = read_record(ddb_client, settings, job_id)
    assert json.loads(rec.result or "null") == {"resumed_from": {"pages_done": 5, "cursor": "c5"}}
    assert (rec.progress, rec.progress_token) == ('{"cursor":"c5","pages_done":5}', 1)
    assert journal.events("progress_saved", job_id=job_id, token=1) != []
    assert len(journal.events("progress_saved", job_id=job_id)) == 1


def test_the_progress_write_lands_only_under_the_current_token(
    aws: AwsTestEnv, ddb_client: DynamoDBClient
) -> None:
    settings, _, _ = prepare(aws.endpoint_url, aws.prefix)
    app = App()

    @app.job("pages", payload=Work, **FAST)
    def pages(ctx: JobContext[Any], p: Work) -> None:  # pragma: no cover - never run
        return None

    job_id = Producer(settings, app).submit("pages", Work(pages=1), job_id=f"{aws.prefix}-s").job_id
    req = JobTable(settings.jobs_table)
    for _ in range(2):  # two claims: token 2 is current, token 1 is stale
        ddb_client.update_item(
            TableName=settings.jobs_table,
            Key={"job_id": {"S": job_id}},
            UpdateExpression="SET #s = :r, #t = #t + :one",
            ExpressionAttributeNames={"#s": "state", "#t": "token"},
            ExpressionAttributeValues={":r": {"S": "running"}, ":one": {"N": "1"}},
        )
    driver = SyncDriver(settings)
    stale = driver.execute(req.save_progress(job_id, 1, '{"page":9}', WALL))
    assert isinstance(stale, Err) and stale.kind is ErrorKind.CONDITION_FAILED
    assert read_record(ddb_client, settings, job_id).progress is None
    current = driver.execute(req.save_progress(job_id, 2, '{"page":3}', WALL))
    assert not isinstance(current, Err)
    assert read_record(ddb_client, settings, job_id).progress == '{"page":3}'


def test_a_next_stage_starts_without_the_progress_hint_of_the_stage_before(
    aws: AwsTestEnv, ddb_client: DynamoDBClient
) -> None:
    # Issue 26 defect 5: the first stage's hint ("done") was read by the second
    # stage as its own, which then skipped its work. A hint belongs to its stage.
    settings, _, _ = prepare(aws.endpoint_url, aws.prefix)
    app = App()
    seen: dict[str, Any] = {}
    saved = threading.Event()
    job = app.staged("pages", payload=Work, **FAST)

    @job.stage("fetch")
    def fetch(ctx: JobContext[Any], p: Work) -> NextStage:
        seen["fetch"] = ctx.last_progress
        ctx.progress({"pages_done": p.pages, "all_done": True})
        saved.wait(HANG_GUARD)  # until a heartbeat kept the hint on the record
        return NextStage("render", Work(pages=p.pages))

    @job.stage("render", payload=Work)
    def render(ctx: JobContext[Any], p: Work) -> dict[str, Any]:
        seen["render"] = ctx.last_progress
        done = (ctx.last_progress or {}).get("pages_done", 0)
        return {"rendered": p.pages - done}  # a resume hint skips what it says is done

    job_id = Producer(settings, app).submit("pages", Work(pages=7), job_id=f"{aws.prefix}-g").job_id
    worker = Worker(app, settings, worker_id="W1", receive_wait=1)
    with collect_journal() as journal, running(worker):
        journal.wait_for("progress_saved", job_id=job_id, token=1, timeout=HANG_GUARD)
        saved.set()
        journal.wait_for("result_committed", job_id=job_id, timeout=HANG_GUARD)
    assert seen == {"fetch": None, "render": None}
    rec = read_record(ddb_client, settings, job_id)
    assert json.loads(rec.result or "null") == {"rendered": 7}
    # The checkpoint cleared it; the second stage saved none of its own.
    assert not {"progress", "progress_token", "progress_at"} & set(rec.attribute_values)
