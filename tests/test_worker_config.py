"""A worker refuses nothing it can run, but says when its queue's redrive is too tight."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from conftest import AwsTestEnv
from pydantic import BaseModel

from sqs_lease import (
    App,
    JobPolicy,
    NextStage,
    Settings,
    Worker,
    create_queue,
    create_tables,
)
from sqs_lease._core.timing import pace_budget
from sqs_lease._errors import ConfigError
from sqs_lease._journal import LOGGER_NAME
from sqs_lease.service import ExitCode, WorkerEnv, run_worker

pytestmark = pytest.mark.integration


class _P(BaseModel):
    n: int


def _app() -> App:
    app = App()
    app.job(
        "c",
        payload=_P,
        lease_seconds=4,
        heartbeat_seconds=1,
        jitter_seconds=1,
        missed_heartbeats=2,
        max_attempts=5,
    )(lambda ctx, p: {})
    return app


@pytest.mark.parametrize(("max_receives", "warned"), [(6, True), (50, False)])
def test_a_redrive_close_to_max_attempts_is_journaled(
    aws: AwsTestEnv, caplog: pytest.LogCaptureFixture, max_receives: int, warned: bool
) -> None:
    settings = Settings(endpoint_url=aws.endpoint_url, prefix=aws.prefix)
    create_tables(settings)
    create_queue(settings, max_receives=max_receives)
    logger = logging.getLogger(LOGGER_NAME)
    saved = logger.propagate
    logger.propagate = True  # the CLI tests may have turned it off
    try:
        with caplog.at_level(logging.INFO, logger=LOGGER_NAME):
            Worker(_app(), settings)
    finally:
        logger.propagate = saved
    events = [json.loads(r.getMessage()) for r in caplog.records if r.name == LOGGER_NAME]
    tight = [e for e in events if e["event"] == "redrive_too_tight"]
    assert bool(tight) is warned
    if warned:
        assert (tight[0]["max_receive_count"], tight[0]["max_attempts"]) == (6, 5)


@pytest.mark.parametrize(
    ("option", "value", "named"),
    [
        ("sweep_interval", 0.0, "sweep_interval=0.0"),
        ("sweep_grace", -1.0, "sweep_grace=-1.0"),
        ("sweep_limit", 0, "sweep_limit=0"),
        ("receive_window", -0.5, "receive_window=-0.5"),
        ("receive_window", 21.0, "receive_window=21.0"),
        ("receive_window", float("nan"), "receive_window=nan"),
    ],
)
def test_a_bad_sweep_option_is_a_config_error_naming_it(
    option: str, value: float, named: str
) -> None:
    settings = Settings(endpoint_url="http://127.0.0.1:9", prefix="unused")
    options: dict[str, Any] = {option: value}
    with pytest.raises(ConfigError, match=named):
        Worker(_app(), settings, **options)  # refused before any AWS call


@pytest.mark.parametrize("use_async", [False, True])
def test_the_receive_window_reaches_the_worker_from_its_environment(
    aws: AwsTestEnv, monkeypatch: pytest.MonkeyPatch, use_async: bool
) -> None:
    settings = Settings(endpoint_url=aws.endpoint_url, prefix=aws.prefix)
    create_tables(settings)
    create_queue(settings)
    monkeypatch.setenv("SQS_LEASE_RECEIVE_WINDOW", "1.5")
    seen: list[float] = []

    def grab(worker: Any) -> None:
        seen.append(worker._pacer.window)
        worker.stop()  # only the settings matter here

    env = WorkerEnv.load(app="unused:app", use_async=use_async)
    result = run_worker(settings, env, app=_app(), install_signals=False, on_worker=grab)
    assert result.code is ExitCode.OK, result.message
    assert seen == [1.5]


def test_a_receive_window_out_of_range_names_the_variable() -> None:
    with pytest.raises(ConfigError, match="SQS_LEASE_RECEIVE_WINDOW"):
        WorkerEnv.load(receive_window=30)


def test_a_stages_own_lease_and_attempts_reach_the_pace_and_the_redrive_rule(
    aws: AwsTestEnv, caplog: pytest.LogCaptureFixture
) -> None:
    # Issue 26 defect 10: the backpressure budget and the redrive bound read the
    # jobs' defaults only. A stage with a tighter lease and more attempts than its
    # job must set both (every rule that reads "the classes" reads every stage).
    settings = Settings(endpoint_url=aws.endpoint_url, prefix=aws.prefix)
    create_tables(settings)
    create_queue(settings, max_receives=6)
    app = App()
    slow: JobPolicy = {"lease_seconds": 60, "heartbeat_seconds": 10.0, "jitter_seconds": 5.0}
    report = app.staged("report", payload=_P, **slow | {"max_attempts": 2})
    report.stage("fetch")(lambda ctx, p: NextStage("render", p))
    report.stage(
        "render",
        payload=_P,
        lease_seconds=4,
        heartbeat_seconds=1,
        jitter_seconds=1,
        missed_heartbeats=2,
        max_attempts=5,
    )(lambda ctx, p: {})
    logger = logging.getLogger(LOGGER_NAME)
    saved = logger.propagate
    logger.propagate = True
    try:
        with caplog.at_level(logging.INFO, logger=LOGGER_NAME):
            worker = Worker(app, settings)
    finally:
        logger.propagate = saved
    assert worker.book.pace is not None
    assert worker.book.pace.budget == pace_budget([(4, 1.0, 1.0)]) == 0.5
    events = [json.loads(r.getMessage()) for r in caplog.records if r.name == LOGGER_NAME]
    tight = [e for e in events if e["event"] == "redrive_too_tight"]
    assert [(e["max_receive_count"], e["max_attempts"]) for e in tight] == [(6, 5)]
    assert [n for n, _ in app.lease_rules()] == ["report/fetch", "report/render"]
