"""The planner/executor split: a plan is checked against the allow-list before anything
runs, and each accepted step runs as a stage with its tool's class (on moto)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pytest
from conftest import AwsTestEnv
from pydantic import BaseModel, ConfigDict
from worker_helpers import FAST, collect_journal, prepare, read_item, read_view, running

from sqs_lease import App, JobContext, Producer, Worker
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
