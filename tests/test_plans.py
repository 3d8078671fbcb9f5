"""The planner/executor split: a plan is checked against the allow-list before anything
runs, and each accepted step runs as a stage with its tool's class (on moto)."""

from __future__ import annotations

import json
import threading
from typing import TYPE_CHECKING, Any

import pytest
from conftest import AwsTestEnv
from pydantic import BaseModel, ConfigDict
from worker_helpers import (
    FAST,
    ROOMY,
    SHELLS,
    collect_journal,
    prepare,
    read_item,
    read_view,
    running,
    wait_until,
)

from sqs_lease import App, JobContext, JobState, Producer, Worker
from sqs_lease._core.stages import stage_log
from sqs_lease.plans import PlannedJob, PlanRefused

if TYPE_CHECKING:
    from types_boto3_dynamodb import DynamoDBClient


class Search(BaseModel):
    model_config = ConfigDict(extra="forbid")
    query: str


class Mail(BaseModel):
    model_config = ConfigDict(extra="forbid")
    to: str


def _app(seen: list[tuple[str, int, int, Any]]) -> tuple[App, PlannedJob]:
    app = App()
    research = app.planned("research", **FAST)

    @research.tool("search", args=Search)
    def search(ctx: JobContext[Any], args: Search) -> dict[str, Any]:
        seen.append((ctx.stage, ctx.token, ctx.job_class.lease_seconds, args.query))
        return {"hits": [args.query + "-1"]}

    @research.tool("mail", args=Mail, lease_seconds=4, max_attempts=2)
    def mail(ctx: JobContext[Any], args: Mail) -> dict[str, Any]:
        seen.append((ctx.stage, ctx.token, ctx.job_class.lease_seconds, dict(ctx.results)))
        return {"sent_to": args.to}

    return app, research


@pytest.mark.parametrize(
    ("steps", "step", "field", "words"),
    [
        ([{"tool": "shell", "args": {"cmd": "rm"}}], 1, "tool", "not on the allow-list"),
        (
            [{"tool": "search", "args": {"query": "a"}}, {"tool": "mail", "lease_seconds": 900}],
            2,
            "lease_seconds",
            "may not be set by a plan",
        ),
        (
            [{"tool": "mail", "args": {"to": "x", "idempotency_key": "k"}}],
            1,
            "args.idempotency_key",
            "may not be set by a plan",
        ),
        ([{"tool": "search", "args": {"query": "a", "timeout": 5}}], 1, "args.timeout", "keys"),
        ([{"tool": "search", "args": {"q": "a"}}], 1, "args.query", "Field required"),
        ([{"tool": "search", "why": "because"}], 1, "why", "only tool and args"),
        ([], 0, "steps", "1 to 50 steps"),
    ],
)
def test_a_plan_is_refused_naming_the_step_and_the_field(
    steps: list[Any], step: int, field: str, words: str
) -> None:
    _, research = _app([])
    with pytest.raises(PlanRefused) as caught:
        research.accept(steps)
    assert (caught.value.step, caught.value.field) == (step, field)
    assert words in str(caught.value)
    if step:
        assert f"step {step}" in str(caught.value) and field.split(".")[-1] in str(caught.value)


def test_a_refused_plan_is_never_submitted(aws: AwsTestEnv, ddb_client: DynamoDBClient) -> None:
    settings, _, _ = prepare(aws.endpoint_url, aws.prefix)
    app, _ = _app([])
    bad = {"steps": [{"tool": "search", "args": {"query": "a"}}, {"tool": "exec"}]}
    with pytest.raises(PlanRefused, match=r"step 2: tool 'exec' is not on the allow-list"):
        Producer(settings, app).submit("research", bad, job_id=f"{aws.prefix}-bad")
    assert read_item(ddb_client, settings, f"{aws.prefix}-bad") is None


def test_a_valid_plan_runs_each_step_as_a_stage_with_its_tool_s_class(
    aws: AwsTestEnv, ddb_client: DynamoDBClient
) -> None:
    settings, _, _ = prepare(aws.endpoint_url, aws.prefix)
    seen: list[tuple[str, int, int, Any]] = []
    app, _ = _app(seen)
    plan = {
        "steps": [
            {"tool": "search", "args": {"query": "sqs"}},
            {"tool": "mail", "args": {"to": "ops@example.com"}},
        ]
    }
    job_id = Producer(settings, app).submit("research", plan).job_id
    worker = Worker(app, settings, worker_id="w", receive_wait=1)
    with collect_journal() as journal, running(worker):
        journal.wait_for("result_committed", job_id=job_id, timeout=30)
    assert seen == [
        ("1-search", 1, FAST["lease_seconds"], "sqs"),
        ("2-mail", 2, 4, {"1-search": {"hits": ["sqs-1"]}}),  # mail's own lease
    ]
    view = read_view(ddb_client, settings, job_id)
    assert (view.state, view.stage) == ("succeeded", "2-mail")
    assert [e.stage for e in stage_log(view)] == ["1-search"]
    item = read_item(ddb_client, settings, job_id)
    assert item is not None
    assert json.loads(item["payload"]["S"]) == plan  # the accepted plan is the job's payload
    assert json.loads(item["result"]["S"]) == {
        "steps": 2,
        "results": [{"hits": ["sqs-1"]}, {"sent_to": "ops@example.com"}],
    }


@pytest.mark.integration
@pytest.mark.parametrize("shell", sorted(SHELLS, reverse=True))
def test_a_limited_tool_holds_its_limit_across_every_plan_and_step_that_calls_it(
    aws: AwsTestEnv, ddb_client: DynamoDBClient, shell: str
) -> None:
    # Three plans call the limited tool at three different steps (1-mail, 2-mail,
    # 3-mail): the limit is the tool's, so at most one of them runs at once. Each
    # call waits a while for a second one to enter, so a pool per step shows.
    settings, _, _ = prepare(aws.endpoint_url, aws.prefix)
    app = App()
    research = app.planned("research", **ROOMY)
    lock = threading.Lock()
    inside = [0]
    most = [0]
    crowded = threading.Event()

    @research.tool("search", args=Search)
    def search(ctx: JobContext[Any], args: Search) -> dict[str, Any]:
        return {"hits": [args.query]}

    @research.tool("mail", args=Mail, concurrency_limit=1)
    def mail(ctx: JobContext[Any], args: Mail) -> dict[str, Any]:
        with lock:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
            if inside[0] > 1:
                crowded.set()
        try:
            crowded.wait(3.0)
        finally:
            with lock:
                inside[0] -= 1
        return {"sent_to": args.to}

    s = {"tool": "search", "args": {"query": "q"}}
    m = {"tool": "mail", "args": {"to": "ops@example.com"}}
    plans = [[m], [s, m], [s, s, m]]
    producer = Producer(settings, app)
    ids = [
        producer.submit("research", {"steps": p}, job_id=f"{aws.prefix}-{n}").job_id
        for n, p in enumerate(plans)
    ]
    worker = SHELLS[shell](
        app, settings, worker_id=f"w-{aws.prefix}", concurrency=3, receive_wait=1
    )
    with running(worker) as (runner,):
        wait_until(
            lambda: all(read_view(ddb_client, settings, j).state.terminal for j in ids),
            120,
            "every plan ended",
        )
        runner.stop()
    assert {read_view(ddb_client, settings, j).state for j in ids} == {JobState.SUCCEEDED}
    assert most[0] == 1, f"{most[0]} calls of a tool limited to 1 ran at once"


def test_a_tools_limit_is_one_pool_for_every_step_that_calls_it() -> None:
    seen: list[tuple[str, int, int, Any]] = []
    app, research = _app(seen)
    limited = App()
    lim = limited.planned("research", **FAST)

    @lim.tool("mail", args=Mail, concurrency_limit=2)
    def mail(ctx: JobContext[Any], args: Mail) -> None:
        return None

    assert limited.has_limits
    assert limited.stage_limit_for("research", "1-mail") == ("mail", 2)
    assert limited.stage_limit_for("research", "7-mail") == ("mail", 2)
    assert app.stage_limit_for("research", "1-search") is None  # no limit: no pool
    assert research.tools["search"].job_class.concurrency_limit is None
