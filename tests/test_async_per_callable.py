"""``async def`` is decided per callable (each stage, each planned tool), never per job
class: the async worker awaits exactly the async ones and runs the plain ones in its
pool; the thread worker, which cannot run an async one, refuses the app at start
naming the class and the stage or tool (on moto, in both worker shells)."""

from __future__ import annotations

import asyncio
import threading
from typing import TYPE_CHECKING, Any

import pytest
from conftest import AwsTestEnv
from pydantic import BaseModel, ConfigDict
from worker_helpers import (
    ROOMY,
    SHELLS,
    prepare,
    read_record,
    read_view,
    result_of,
    running,
    use_shell,
    wait_until,
)

from sqs_lease import (
    App,
    AsyncJobContext,
    ConfigError,
    JobContext,
    JobState,
    NextStage,
    Producer,
    Settings,
    Worker,
)

if TYPE_CHECKING:
    from types_boto3_dynamodb import DynamoDBClient

pytestmark = pytest.mark.integration

Shell: Any = Worker  # each worker shell in turn (use_shell)
shell = use_shell(__name__)


class Order(BaseModel):
    n: int


class Query(BaseModel):
    model_config = ConfigDict(extra="forbid")
    q: str


def _mixed_app(threads: dict[str, str]) -> App:
    app = App()
    report = app.staged("report", payload=Order, **ROOMY)

    @report.stage("fetch")
    def fetch(ctx: JobContext[Any], p: Order) -> Any:
        threads["fetch"] = threading.current_thread().name
        return NextStage("render", {"n": p.n + 1})

    @report.stage("render", payload=Order)
    async def render(ctx: AsyncJobContext[Any], p: Order) -> Any:
        threads["render"] = threading.current_thread().name
        await asyncio.sleep(0)
        return NextStage("publish", {"n": p.n + 1})

    @report.stage("publish")
    def publish(ctx: JobContext[Any], p: Any) -> Any:
        threads["publish"] = threading.current_thread().name
        return {"n": p["n"], "ctx": type(ctx).__name__}

    research = app.planned("research", **ROOMY)

    @research.tool("lookup", args=Query)
    async def lookup(ctx: AsyncJobContext[Any], args: Query) -> dict[str, Any]:
        threads["lookup"] = threading.current_thread().name
        await asyncio.sleep(0)
        return {"hit": args.q, "ctx": type(ctx).__name__}

    @research.tool("note", args=Query)
    def note(ctx: JobContext[Any], args: Query) -> dict[str, Any]:
        threads["note"] = threading.current_thread().name
        return {"noted": args.q, "ctx": type(ctx).__name__}

    return app


def test_a_staged_class_mixing_async_and_plain_stages_and_a_plan_with_an_async_tool_run(
    aws: AwsTestEnv, ddb_client: DynamoDBClient, shell: str
) -> None:
    settings, _, _ = prepare(aws.endpoint_url, aws.prefix)
    threads: dict[str, str] = {}
    app = _mixed_app(threads)
    if shell == "thread":
        # The thread worker cannot await: it refuses the app, naming every async callable.
        with pytest.raises(ConfigError) as refused:
            Shell(app, settings, worker_id="w", receive_wait=1)
        text = str(refused.value)
        assert "report" in text and "render" in text, text
        assert "research" in text and "lookup" in text, text
        assert "fetch" not in text and "note" not in text, text
        return
    producer = Producer(settings, app)
    staged = producer.submit("report", Order(n=1), job_id=f"{aws.prefix}-s").job_id
    plan = {"steps": [{"tool": "note", "args": {"q": "a"}}, {"tool": "lookup", "args": {"q": "b"}}]}
    planned = producer.submit("research", plan, job_id=f"{aws.prefix}-p").job_id
    worker = Shell(app, settings, worker_id=f"w-{aws.prefix}", receive_wait=1)
    with running(worker) as (runner,):
        wait_until(
            lambda: all(
                read_view(ddb_client, settings, j).state.terminal for j in (staged, planned)
            ),
            60,
            "both jobs ended",
        )
        runner.stop()
    assert read_view(ddb_client, settings, staged).state is JobState.SUCCEEDED
    assert read_view(ddb_client, settings, planned).state is JobState.SUCCEEDED
    assert result_of(read_record(ddb_client, settings, staged)) == {"n": 3, "ctx": "JobContext"}
    assert result_of(read_record(ddb_client, settings, planned)) == {
        "steps": 2,
        "results": [
            {"noted": "a", "ctx": "JobContext"},
            {"hit": "b", "ctx": "AsyncJobContext"},
        ],
    }
    # Plain callables in the pool, async ones on the loop.
    assert threads["fetch"].startswith("sqs-lease-job")
    assert threads["publish"].startswith("sqs-lease-job")
    assert threads["note"].startswith("sqs-lease-job")
    assert not threads["render"].startswith("sqs-lease-job")
    assert not threads["lookup"].startswith("sqs-lease-job")


def test_the_thread_worker_refuses_a_plan_whose_only_async_callable_is_a_tool() -> None:
    app = App()
    research = app.planned("research", **ROOMY)

    @research.tool("lookup", args=Query)
    async def lookup(ctx: AsyncJobContext[Any], args: Query) -> None:
        return None

    with pytest.raises(ConfigError, match=r"research.*tool 'lookup'.*AsyncWorker"):
        SHELLS["thread"](app, Settings(endpoint_url="http://127.0.0.1:9", prefix="x"))


def test_the_lambda_shell_refuses_an_async_stage_naming_it() -> None:
    from sqs_lease.aws_lambda import LambdaShell

    app = App()
    report = app.staged("report", payload=Order, **ROOMY | {"stage_budget_seconds": 600})

    @report.stage("fetch")
    def fetch(ctx: JobContext[Any], p: Order) -> Any:
        return NextStage("render", {"n": p.n})

    @report.stage("render", payload=Order)
    async def render(ctx: AsyncJobContext[Any], p: Order) -> None:
        return None

    settings = Settings(endpoint_url="http://127.0.0.1:9", prefix="x")
    with pytest.raises(ConfigError, match=r"'report' stage 'render'.*Lambda shell cannot await"):
        LambdaShell(app, settings, journal=None, tick=0.1)


def test_a_plain_handlers_effect_refuses_an_async_tool_before_anything_is_sent(
    aws: AwsTestEnv, ddb_client: DynamoDBClient, shell: str
) -> None:
    # A plain handler's ctx.effect calls its tool and cannot await it: the coroutine
    # would be taken for the tool's answer. Refused (the job fails at once, naming the
    # effect), and the tool never runs, in either worker.
    settings, _, _ = prepare(aws.endpoint_url, aws.prefix)
    app = App()
    app.target("svc")
    ran: list[str] = []

    async def charge(call: Any) -> dict[str, Any]:
        ran.append(call.key)
        return {"ok": True}

    @app.job("pay", payload=Order, **ROOMY)
    def pay(ctx: JobContext[Order], p: Order) -> Any:
        return ctx.effect("charge", "svc", {"n": p.n}, charge).response

    job_id = Producer(settings, app).submit("pay", Order(n=1), job_id=f"{aws.prefix}-e").job_id
    worker = Shell(app, settings, worker_id=f"w-{aws.prefix}", receive_wait=1)
    with running(worker) as (runner,):
        wait_until(
            lambda: read_view(ddb_client, settings, job_id).state.terminal, 60, "the job ended"
        )
        runner.stop()
    view = read_view(ddb_client, settings, job_id)
    assert (view.state, view.error_code) == (JobState.FAILED, "async_tool_in_plain_handler")
    assert ran == []
