"""Durable stages on a real moto server: each stage once, a rising token, crashes
between the steps of a stage ending, and a stale owner across a stage boundary.

The crash and pause scenarios run real worker processes (``fault_worker.py`` with
the ``ship`` job of ``fault_app.py``) and a real fenced receiver over HTTP: the
worker is SIGKILLed at a point of its stage ending, or SIGSTOPped after its
effect, and a second worker finishes the job.
"""

from __future__ import annotations

import json
import signal
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.request import urlopen

import pytest
from conftest import AwsTestEnv
from pydantic import BaseModel
from test_proof import WorkerProc, named
from test_stranded import _cli
from worker_helpers import (
    FAST,
    collect_journal,
    prepare,
    read_item,
    read_view,
    running,
    use_shell,
    wait_until,
)

from examples.receiver_service import create_ledger_table, serve
from sqs_lease import App, JobContext, NextStage, PermanentError, Producer, Settings, Worker
from sqs_lease._core.stages import stage_log
from sqs_lease._timeline_view import timeline_of
from sqs_lease.receiver import create_receiver_tables

if TYPE_CHECKING:
    from types_boto3_dynamodb import DynamoDBClient

pytestmark = [pytest.mark.integration]

shell = use_shell(__name__)
Shell: Any = Worker


class Order(BaseModel):
    order: str


class Rows(BaseModel):
    rows_key: str


def _report_app(seen: list[tuple[str, int, Any, dict[str, Any]]]) -> App:
    app = App()
    report = app.staged("report", payload=Order, **FAST)

    @report.stage("fetch")
    def fetch(ctx: JobContext[Any], p: Order) -> NextStage:
        seen.append((ctx.stage, ctx.token, ctx.job_class.lease_seconds, dict(ctx.results)))
        return NextStage("render", Rows(rows_key=f"rows/{p.order}"), result={"rows": 3})

    @report.stage("render", payload=Rows, lease_seconds=4)
    def render(ctx: JobContext[Any], p: Rows) -> NextStage:
        seen.append((ctx.stage, ctx.token, ctx.job_class.lease_seconds, dict(ctx.results)))
        return NextStage("publish", {"file": p.rows_key + ".pdf"})

    @report.stage("publish")
    def publish(ctx: JobContext[Any], p: dict[str, Any]) -> dict[str, Any]:
        seen.append((ctx.stage, ctx.token, ctx.job_class.lease_seconds, dict(ctx.results)))
        return {"url": "https://reports/" + p["file"]}

    return app


def test_a_staged_job_runs_each_stage_once_in_order_with_a_rising_token(
    aws: AwsTestEnv, ddb_client: DynamoDBClient
) -> None:
    settings, _, _ = prepare(aws.endpoint_url, aws.prefix)
    seen: list[tuple[str, int, Any, dict[str, Any]]] = []
    app = _report_app(seen)
    job_id = Producer(settings, app).submit("report", Order(order="o-1")).job_id
    worker = Shell(app, settings, worker_id="w", receive_wait=1)
    with collect_journal() as journal, running(worker):
        journal.wait_for("result_committed", job_id=job_id, timeout=30)
    assert seen == [
        ("fetch", 1, 3, {}),
        ("render", 2, 4, {"fetch": {"rows": 3}}),  # its own class: lease 4
        ("publish", 3, 3, {"fetch": {"rows": 3}, "render": {"file": "rows/o-1.pdf"}}),
    ]
    ends = journal.events("stage_committed", job_id=job_id)
    assert [(e["stage"], e["next_stage"], e["token"]) for e in ends] == [
        ("fetch", "render", 1),
        ("render", "publish", 2),
    ]
    view = read_view(ddb_client, settings, job_id)
    assert (view.state, view.stage, view.token) == ("succeeded", "publish", 3)
    assert [(e.stage, e.token, e.attempt) for e in stage_log(view)] == [
        ("fetch", 1, 1),
        ("render", 2, 1),
    ]
    shown = _cli(settings, "jobs", "show", job_id)
    assert shown.exit_code == 0, shown.output
    lines = shown.output.split("stages:\n", 1)[1].splitlines()[:3]
    assert [line.split(":")[0].strip() for line in lines] == ["fetch", "render", "publish"]
    assert lines[0].startswith("  fetch: succeeded, attempts 1, token 1, ")
    assert lines[0].endswith('result {"rows": 3}')
    assert lines[2] == "  publish: succeeded, attempts 1, token 3, -, result -"  # the job's result
    as_json = json.loads(_cli(settings, "jobs", "show", job_id, "--json").output)
    assert [r["stage"] for r in as_json["stages"]] == ["fetch", "render", "publish"]
    assert "stage_input" not in as_json  # shown as the stages, not as raw JSON


def test_a_staged_jobs_timeline_shows_each_stage_ending_between_its_claims(
    aws: AwsTestEnv, ddb_client: DynamoDBClient
) -> None:
    settings, _, _ = prepare(aws.endpoint_url, aws.prefix)
    app = _report_app([])
    job_id = Producer(settings, app).submit("report", Order(order="o-2")).job_id
    worker = Shell(app, settings, worker_id="w", receive_wait=1)
    with collect_journal() as journal, running(worker):
        journal.wait_for("result_committed", job_id=job_id, timeout=30)
    item = read_item(ddb_client, settings, job_id)
    assert item is not None
    tl = timeline_of(item)
    assert [(ev.kind.value, ev.stage, ev.token) for ev in tl.events] == [
        ("submitted", None, 0),
        ("claimed", None, 1),
        ("stage_done", "fetch", 1),
        ("claimed", None, 2),
        ("stage_done", "render", 2),
        ("claimed", None, 3),
        ("committed", None, 3),
    ]
    shown = _cli(settings, "jobs", "timeline", job_id)
    assert shown.exit_code == 0, shown.output
    assert "stage fetch done: next: render" in shown.output
    assert "stage render done: next: publish" in shown.output


def test_a_stage_that_overruns_its_budget_is_stopped_with_a_reason_not_kept_alive(
    aws: AwsTestEnv, ddb_client: DynamoDBClient
) -> None:
    settings, _, _ = prepare(aws.endpoint_url, aws.prefix)
    app = App()
    report = app.staged("report", payload=Order, **FAST)

    @report.stage("fetch")
    def fetch(ctx: JobContext[Any], p: Order) -> NextStage:
        return NextStage("render", {"rows_key": "k"})

    # The render stage's own budget: 5.5 s, and one attempt.
    @report.stage("render", stage_budget_seconds=5.5, effect_timeout_seconds=0.5, max_attempts=1)
    def render(ctx: JobContext[Any], p: dict[str, Any]) -> dict[str, Any]:
        time.sleep(8)  # a blocked tool, deaf to the stop
        return {"late": True}

    job_id = Producer(settings, app).submit("report", Order(order="o-2")).job_id
    worker = Shell(app, settings, worker_id="w", receive_wait=1)
    with collect_journal() as journal, running(worker):
        journal.wait_for("job_failed", job_id=job_id, timeout=40)
        journal.wait_for("result_discarded", job_id=job_id, timeout=20)
    # The render stage's token: 2 on a calm machine; a busy one may let the first
    # stage's lease lapse and claim it again, so it is read, not assumed.
    render_token = journal.events("job_claimed", job_id=job_id)[-1]["token"]
    assert render_token >= 2
    (dropped,) = journal.events("lease_dropped", job_id=job_id)
    assert (dropped["reason"], dropped["token"]) == ("stage_budget_exceeded", render_token)
    # Not kept alive: no extension of the render stage's token after the drop.
    assert all(
        b["_mono"] < dropped["_mono"]
        for b in journal.events("heartbeat_ok", job_id=job_id, token=render_token)
    )
    view = read_view(ddb_client, settings, job_id)
    assert (view.state, view.stage, view.error_code) == ("failed", "render", "attempts_exhausted")
    assert view.reason is not None and "watchdog: stage_budget_exceeded" in view.reason
    assert [e.stage for e in stage_log(view)] == ["fetch"]  # the committed stage stays


def test_a_failed_stage_is_retried_from_the_cli_once_and_the_committed_stage_is_not_run_again(
    aws: AwsTestEnv, ddb_client: DynamoDBClient, shell: str
) -> None:
    if shell != "thread":
        pytest.skip("the retry is the CLI's; the stage runs on either shell alike")
    settings, _, _ = prepare(aws.endpoint_url, aws.prefix)
    app = App()
    report = app.staged("report", payload=Order, **FAST)
    runs: list[tuple[str, int]] = []
    renderer = {"down": True}

    @report.stage("fetch")
    def fetch(ctx: JobContext[Any], p: Order) -> NextStage:
        runs.append((ctx.stage, ctx.token))
        return NextStage("render", {"rows_key": "k"}, result={"rows": 3})

    @report.stage("render", max_attempts=1)
    def render(ctx: JobContext[Any], p: dict[str, Any]) -> dict[str, Any]:
        runs.append((ctx.stage, ctx.token))
        if renderer["down"]:
            raise PermanentError("the renderer is down", code="renderer_down")
        return {"url": "https://reports/k.pdf", "rows": ctx.results["fetch"]["rows"]}

    job_id = Producer(settings, app).submit("report", Order(order="o-r")).job_id
    with collect_journal() as journal, running(Shell(app, settings, worker_id="w", receive_wait=1)):
        journal.wait_for("job_failed", job_id=job_id, timeout=30)
    view = read_view(ddb_client, settings, job_id)
    assert (view.state, view.stage, view.token) == ("failed", "render", 2)

    # A committed stage is not retried: it ran once and its checkpoint stays.
    refused = _cli(settings, "jobs", "retry", job_id, "--stage", "fetch")
    assert refused.exit_code != 0 and "'fetch' of job" in refused.output, refused.output
    assert "is committed" in refused.output
    retried = _cli(settings, "jobs", "retry", job_id, "--stage", "render")
    assert retried.exit_code == 0, retried.output
    assert "queued again at stage render" in retried.output and "kept: fetch" in retried.output
    # Run twice, the retry of the same failure does nothing the second time.
    again = _cli(settings, "jobs", "retry", job_id, "--json")
    assert again.exit_code == 3, again.output
    assert json.loads(again.output)["verdict"] == "nothing_to_do"

    renderer["down"] = False
    with collect_journal() as journal, running(Shell(app, settings, worker_id="w", receive_wait=1)):
        journal.wait_for("result_committed", job_id=job_id, timeout=30)
    assert runs == [("fetch", 1), ("render", 2), ("render", 3)]  # fetch once, render again
    view = read_view(ddb_client, settings, job_id)
    assert (view.state, view.stage, view.token) == ("succeeded", "render", 3)
    assert [(e.stage, e.token) for e in stage_log(view)] == [("fetch", 1)]
    item = read_item(ddb_client, settings, job_id) or {}
    assert json.loads(item["result"]["S"]) == {"url": "https://reports/k.pdf", "rows": 3}


# --------------------------------------------------------------------------- processes


@pytest.fixture
def stage_env(moto_endpoint: str, tmp_path: Path) -> Iterator[dict[str, Any]]:
    prefix = "s" + uuid.uuid4().hex[:10]
    settings = Settings(endpoint_url=moto_endpoint, prefix=prefix)
    prepare(moto_endpoint, prefix)
    create_receiver_tables(settings)
    create_ledger_table(settings, prefix)
    server, url = serve(
        settings, prefix, unsigned_fences=True
    )  # loopback test receiver, unsigned knowingly
    gates = tmp_path / "gates"
    gates.mkdir()
    procs: list[WorkerProc] = []
    yield {
        "settings": settings,
        "prefix": prefix,
        "receiver": url,
        "gates": gates,
        "tmp": tmp_path,
        "procs": procs,
        "endpoint": moto_endpoint,
        "runs": tmp_path / "runs.txt",
    }
    for p in procs:
        p.stop()
    server.shutdown()


def _spawn(env: dict[str, Any], name: str, **extra: str) -> WorkerProc:
    w = WorkerProc(
        name,
        env["endpoint"],
        env["prefix"],
        env["receiver"],
        env["gates"],
        env["tmp"],
        {"RUNS_FILE": str(env["runs"]), **extra},
    )
    env["procs"].append(w)
    return w


def _runs(env: dict[str, Any]) -> list[tuple[str, int, str]]:
    path: Path = env["runs"]
    lines = path.read_text().splitlines() if path.exists() else []
    return [(s, int(t), w) for s, t, w in (line.split() for line in lines)]


def _ledger(env: dict[str, Any]) -> list[dict[str, Any]]:
    with urlopen(env["receiver"] + "/ledger", timeout=10) as resp:
        rows: list[dict[str, Any]] = json.loads(resp.read())["rows"]
    return rows


def _in_process_worker(env: dict[str, Any], monkeypatch: pytest.MonkeyPatch, name: str) -> Any:
    from fault_app import app

    monkeypatch.setenv("RUNS_FILE", str(env["runs"]))
    monkeypatch.setenv("RECEIVER_URL", env["receiver"])
    monkeypatch.setenv("GATE_DIR", str(env["gates"]))
    monkeypatch.setenv("WORKER_NAME", name)
    # The sweep every second, for records unsent for a second (the default is a minute).
    return Worker(
        app, env["settings"], worker_id=name, receive_wait=1, sweep_interval=1.0, sweep_grace=1.0
    )


@pytest.mark.fault
@pytest.mark.parametrize("point", ["after_checkpoint", "before_delete"])
def test_a_worker_killed_between_the_steps_of_a_stage_ending_loses_and_repeats_no_stage(
    point: str,
    stage_env: dict[str, Any],
    shell: str,
    ddb_client: DynamoDBClient,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if shell != "thread":
        pytest.skip("the kill point hooks the thread worker's driver; the flow is the same")
    env = stage_env
    settings: Settings = env["settings"]
    job_id = Producer(settings).submit("ship", {"invoice": "inv-k", "amount": 5}, "ship-k").job_id
    # Submitted without the app: the first stage is named by the worker's app.
    w1 = _spawn(env, "W1", SQS_LEASE_KILL_AT=point, MAX_MESSAGES="5")
    assert w1.proc.wait(60) == -signal.SIGKILL
    view = read_view(ddb_client, settings, job_id)
    assert (view.state, view.stage, view.token) == ("queued", "receipt", 1)
    # Killed before the send: the record waits unsent (the sweep's); after it: sent.
    assert view.message_sent is (point == "before_delete")
    w2 = _in_process_worker(env, monkeypatch, "W2")
    with collect_journal() as journal, running(w2):
        wait_until(
            lambda: (read_item(ddb_client, settings, job_id) or {})["state"]["S"] == "succeeded",
            60,
            "the job to succeed",
        )
        # The killed worker's message comes back after its lease and claims nothing:
        # a stray while the job runs, already done once it has finished.
        wait_until(
            lambda: bool(
                journal.events("message_stray", job_id=job_id)
                or journal.events("job_already_done", job_id=job_id)
            ),
            30,
            "the killed worker's message to come back",
        )
    runs = _runs(env)
    assert Counter(s for s, _, _ in runs) == {"charge": 1, "receipt": 1, "close": 1}, runs
    assert runs[0] == ("charge", 1, "W1")
    assert [t for _, t, _ in runs] == [1, 2, 3]  # the token rose across the stages
    if point == "after_checkpoint":
        (swept,) = journal.events("job_send_taken", job_id=job_id, by="sweep")
        assert swept["previous_send_id"] == "stage.1.receipt"
    keys = sorted(r["idem_key"] for r in _ledger(env))
    assert keys == [f"{job_id}:charge", f"{job_id}:receipt"]
    final = read_view(ddb_client, settings, job_id)
    assert [e.stage for e in stage_log(final)] == ["charge", "receipt"]


def _stale_owner(env: dict[str, Any], shell: str, mutation: str = "") -> tuple[str, WorkerProc]:
    """W1 does stage 1's effect and is paused; W2 takes stage 1 over and holds stage 2;
    W1 wakes up, sends a late effect and ends its stage late. Returns the job id and W1."""
    settings: Settings = env["settings"]
    job_id = Producer(settings).submit("ship", {"invoice": "inv-p", "amount": 7}, "ship-p").job_id
    mut = {"SQS_LEASE_MUTATION": mutation} if mutation else {}
    w1 = _spawn(env, "W1", SQS_LEASE_SHELL=shell, GATE_AFTER_EFFECT="1", LATE_EFFECT="1", **mut)
    w1.wait_for(named("step_done", step="charge"), "W1's charge effect")
    w1.proc.send_signal(signal.SIGSTOP)  # W1 freezes in stage 1, after its effect
    w2 = _spawn(env, "W2", SQS_LEASE_SHELL=shell, GATE_IN_RECEIPT="1", MAX_MESSAGES="3")
    w2.wait_for(named("stage_committed", stage="charge", token=2), "W2 takes stage 1 over")
    w2.wait_for(named("step_done", step="receipt"), "W2's stage 2 effect", timeout=30)
    # W2 holds stage 2 (token 3). W1 wakes up: its late effect and its late stage end.
    w1.proc.send_signal(signal.SIGCONT)
    (env["gates"] / "W1.late").touch()
    w1.wait_for(named("late_effect"), "W1's late effect")
    ends = ("result_rejected", "result_discarded", "stage_committed")
    w1.wait_for(lambda e: e.get("event") in ends, "W1's late end")
    return job_id, w1


@pytest.mark.fault
def test_a_stale_owner_of_stage_one_is_fenced_out_once_stage_two_was_claimed(
    stage_env: dict[str, Any], shell: str, ddb_client: DynamoDBClient
) -> None:
    env = stage_env
    settings: Settings = env["settings"]
    job_id, w1 = _stale_owner(env, shell)
    (env["gates"] / "W2.receipt").touch()
    wait_until(
        lambda: (read_item(ddb_client, settings, job_id) or {})["state"]["S"] == "succeeded",
        60,
        "the job to succeed",
    )
    (late,) = [e for e in w1.events() if e.get("event") == "late_effect"]
    assert late["status"] == 412 and late["token"] == 1  # stale_token: the receiver refused it
    assert [e for e in w1.events() if e.get("event") == "stage_committed"] == []
    ledger = {r["idem_key"]: int(r["token"]) for r in _ledger(env)}
    assert ledger == {f"{job_id}:charge": 1, f"{job_id}:receipt": 3}  # no late effect applied
    runs = _runs(env)
    assert [(s, t) for s, t, _ in runs] == [
        ("charge", 1),
        ("charge", 2),
        ("receipt", 3),
        ("close", 4),
    ]
    final = read_view(ddb_client, settings, job_id)
    assert [(e.stage, e.token) for e in stage_log(final)] == [("charge", 2), ("receipt", 3)]


@pytest.mark.fault
def test_without_the_checkpoints_fence_the_stale_owner_s_late_stage_end_lands(
    stage_env: dict[str, Any], shell: str
) -> None:
    """The check above bites: with the token dropped from the checkpoint's condition
    (and the worker's own guard off), W1's late stage end is written."""
    if shell != "thread":
        pytest.skip("one shell shows the check bites")
    _, w1 = _stale_owner(stage_env, shell, "no_checkpoint_token,commit_after_stop")
    landed = [e for e in w1.events() if e.get("event") == "stage_committed"]
    assert [(e["stage"], e["token"]) for e in landed] == [("charge", 1)]
