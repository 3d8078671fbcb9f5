"""A worker refuses nothing it can run, but says when its queue's redrive is too tight."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from conftest import AwsTestEnv
from pydantic import BaseModel

from sqs_lease import App, Settings, Worker, create_queue, create_tables
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
