"""``sqs-lease jobs show --follow``: a line per change of a job, a bar for its progress,
until it ends (against a real moto server, with a real worker)."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from click.testing import CliRunner
from pydantic import BaseModel
from worker_helpers import prepare

from sqs_lease import App, JobContext, Producer, Worker, _cli_jobs
from sqs_lease._cli_jobs import follow_line, progress_bar
from sqs_lease._operator import read_job
from sqs_lease.cli import cli
from sqs_lease.testing import HANG_GUARD, running

pytestmark = pytest.mark.integration


def test_a_bar_is_drawn_for_done_of_total_and_nothing_else() -> None:
    assert progress_bar('{"done": 1, "total": 4}') == "[#####---------------] 25% (1 of 4)"
    assert progress_bar({"done": 9, "total": 4}, width=4) == "[####] 100% (9 of 4)"
    for other in (
        '{"cursor": "x"}',
        '{"done": true, "total": 2}',
        '{"done": 1, "total": 0}',
        "[1, 2]",
        "not json",
        None,
    ):
        assert progress_bar(other) is None, other
    line = follow_line(0.0, {"state": "running", "stage": None, "progress": '{"cursor": "x"}'})
    assert "state=running" in line and "stage=" not in line and 'progress={"cursor": "x"}' in line


class Scan(BaseModel):
    pages: int


@pytest.fixture
def env(moto_endpoint: str) -> Iterator[Any]:
    settings, _, _ = prepare(moto_endpoint, f"fw{uuid.uuid4().hex[:10]}")
    yield settings


def test_follow_prints_each_change_with_the_progress_bar_until_the_job_ends(
    env: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    half = threading.Event()  # the handler stays at 1 of 2 until the follow has shown it
    app = App()

    @app.job("scan", payload=Scan, lease_seconds=6, heartbeat_seconds=1, jitter_seconds=0.5)
    def scan(ctx: JobContext[Scan], p: Scan) -> dict[str, Any]:
        ctx.progress({"done": 1, "total": p.pages})
        assert half.wait(HANG_GUARD)
        return {"pages": p.pages}

    job_id = Producer(env, app).submit("scan", Scan(pages=2)).job_id
    # Each of the follow's pauses looks at the record: once 1 of 2 is saved, the next
    # read shows it (the handler waits), and the pause after that lets the handler end.
    seen_half: list[bool] = []

    def pause(seconds: float) -> None:
        item = read_job(env, job_id) or {}
        saved = "progress" in item and json.loads(item["progress"]["S"]).get("done") == 1
        if saved and not seen_half:
            seen_half.append(True)  # the follow's next read shows it
        elif seen_half:
            half.set()
        time.sleep(0.05)

    monkeypatch.setattr(_cli_jobs, "_pause", pause)
    args = ["--endpoint-url", env.endpoint_url, "--prefix", env.prefix]
    with running(Worker(app, env, worker_id="fw", receive_wait=1)):
        result = CliRunner().invoke(cli, [*args, "jobs", "show", job_id, "--follow"])
    assert result.exit_code == 0, (result.output, result.exception)
    lines = result.stdout.splitlines()
    assert "[##########----------] 50% (1 of 2)" in result.stdout, lines
    states = [line.split("state=")[1].split()[0] for line in lines if "state=" in line]
    assert states[-1] == "succeeded" and "running" in states, lines
    # then the record, as jobs show prints it
    assert any(line.startswith("job_id") for line in lines)
