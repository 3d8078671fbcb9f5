"""The worker for people: ``--output human`` (readable lines, a live status line on
a terminal), and Ctrl-C as a graceful stop without a traceback, in CLI mode and in
library mode (``Worker.run()`` from Python). Ctrl-C is a real SIGINT to a real
process against a real moto server."""

from __future__ import annotations

import io
import json
import logging
import os
import pty
import queue
import signal
import subprocess
import sys
import textwrap
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import pytest
from click.testing import CliRunner, Result
from conftest import AwsTestEnv

from sqs_lease import Producer, Settings
from sqs_lease._console import HumanConsole, render_event
from sqs_lease._journal import LOGGER_NAME, Journal, configure_stderr
from sqs_lease._resources import create_queue, create_tables
from sqs_lease.cli import cli

ROOT = Path(__file__).resolve().parent.parent
HANG_GUARD = 120.0

APP_SOURCE = """
from pydantic import BaseModel
from sqs_lease import App, JobContext

app = App()


class Doc(BaseModel):
    doc: str


@app.job("upper", payload=Doc, lease_seconds=10, heartbeat_seconds=2, jitter_seconds=1)
def upper(ctx: JobContext[Doc], payload: Doc) -> dict[str, str]:
    return {"text": payload.doc.upper()}


@app.job("slow", payload=Doc, lease_seconds=10, heartbeat_seconds=2, jitter_seconds=1)
def slow(ctx: JobContext[Doc], payload: Doc) -> dict[str, str]:
    ctx.wait(600)  # until the worker is told to stop
    return {"text": payload.doc}
"""

LIBRARY_SCRIPT = """
import dataclasses, json, sys
sys.path.insert(0, {here!r})
from app_mod import app
from sqs_lease import Settings, Worker
from sqs_lease._journal import configure_stderr

configure_stderr()
settings = Settings(endpoint_url={endpoint!r}, prefix={prefix!r})
stats = Worker(app, settings, receive_wait=1, shutdown_grace=30, worker_id="lib-w").run()
print(json.dumps(dataclasses.asdict(stats)))
print("after run", flush=True)
"""


@pytest.fixture
def restore_journal() -> Iterator[None]:
    logger = logging.getLogger(LOGGER_NAME)
    handlers, level, propagate = list(logger.handlers), logger.level, logger.propagate
    try:
        yield
    finally:
        logger.handlers[:] = handlers
        logger.setLevel(level)
        logger.propagate = propagate


@pytest.fixture
def app_dir(tmp_path: Path) -> Path:
    (tmp_path / "app_mod.py").write_text(textwrap.dedent(APP_SOURCE))
    return tmp_path


def ready(aws: AwsTestEnv) -> Settings:
    settings = Settings(endpoint_url=aws.endpoint_url, prefix=aws.prefix)
    create_tables(settings)
    create_queue(settings)
    return settings


def run(aws: AwsTestEnv, *args: str) -> Result:
    return CliRunner().invoke(
        cli, ["--endpoint-url", aws.endpoint_url, "--prefix", aws.prefix, *args]
    )


def _job_state(settings: Settings, job_id: str) -> str:
    shown = CliRunner().invoke(
        cli,
        [
            "--endpoint-url",
            str(settings.endpoint_url),
            "--prefix",
            settings.prefix,
            "jobs",
            "show",
            job_id,
            "--json",
        ],
    )
    assert shown.exit_code == 0, shown.output
    return str(json.loads(shown.stdout)["state"])


def _reader(stream: IO[str] | int) -> queue.Queue[str]:
    """Lines (or pty chunks) of a child's output, read on a thread."""
    out: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        if isinstance(stream, int):
            while True:
                try:
                    chunk = os.read(stream, 4096)
                except OSError:  # the child closed the pty
                    break
                if not chunk:
                    break
                out.put(chunk.decode("utf-8", "replace"))
        else:
            for line in stream:
                out.put(str(line))

    threading.Thread(target=pump, daemon=True).start()
    return out


def _wait_for(out: queue.Queue[str], text: str, seen: list[str]) -> None:
    """Read until ``text`` appears (a hang guard, never a timing assertion)."""
    while text not in "".join(seen):
        try:
            seen.append(out.get(timeout=HANG_GUARD))
        except queue.Empty:
            pytest.fail(f"{text!r} never appeared in: {''.join(seen)[-2000:]}")


def _drain(out: queue.Queue[str], seen: list[str]) -> str:
    while True:
        try:
            seen.append(out.get(timeout=1))
        except queue.Empty:
            return "".join(seen)


# --------------------------------------------------------------------------- rendering


def test_an_event_renders_as_one_readable_line_with_alerts_marked() -> None:
    line = render_event(
        {
            "event": "heartbeat_lost",
            "ts": 0,
            "worker": "w",
            "job_id": "j1",
            "token": 3,
            "detected_by": "heartbeat",
            "reason": "taken over by w2",
        }
    )
    assert " ! heartbeat_lost" in line
    assert 'job j1  token=3  detected_by=heartbeat  reason="taken over by w2"' in line
    assert "worker" not in line and "{" not in line
    assert " ! " not in render_event({"event": "job_claimed", "ts": 0, "job_id": "j1"})


CLAIMED: dict[str, Any] = {
    "event": "job_claimed",
    "ts": 0,
    "worker": "w",
    "job_id": "invoice-7",
    "token": 2,
    "payload_hash": "f3013f933b9fb80ab6d995e7ad9da36f683837ba1d81e950c943d40111eac2f0",
    "message_id": "2b1c6f0e-8d55-4c1e-9d47-1f5a4d0c9e21",
    "receive_count": 1,
}


def test_a_line_for_people_shows_ids_by_their_first_characters_and_fits_the_terminal() -> None:
    whole = render_event(CLAIMED, details=True)
    assert CLAIMED["payload_hash"] in whole and CLAIMED["message_id"] in whole
    short = render_event(CLAIMED)
    assert "payload_hash=f3013f93…" in short and "message_id=2b1c6f0e…" in short
    assert "job invoice-7" in short and "token=2" in short  # the user's own id whole
    assert len(whole) - len(short) == (64 - 9) + (36 - 9)
    cut = render_event(CLAIMED, width=40)
    assert len(cut) == 40 and cut.endswith("…") and cut.startswith(short[:39])
    assert render_event(CLAIMED, width=400) == short


def test_on_a_terminal_lines_fit_its_width_but_alerts_keep_their_reason(
    restore_journal: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sqs_lease import _console

    monkeypatch.setattr(_console, "_columns", lambda: 60)
    reason = "lease taken over by worker w2 at token 3: " + "why " * 20
    for details in (False, True):
        stream = io.StringIO()
        with HumanConsole(stream, live=True, refresh=3600, details=details):
            journal = Journal(worker_id="w")
            journal(
                "job_claimed",
                **{k: v for k, v in CLAIMED.items() if k not in ("event", "ts", "worker")},
            )
            journal("heartbeat_lost", job_id="invoice-7", token=2, reason=reason)
        lines = [part.split("\n")[0] for part in stream.getvalue().split("\r\x1b[2K")]
        claimed = next(line for line in lines if "job_claimed" in line)
        lost = next(line for line in lines if "heartbeat_lost" in line)
        assert reason.strip() in lost  # an alert is never cut
        if details:
            assert CLAIMED["payload_hash"] in claimed and len(claimed) > 60
        else:
            assert len(claimed) <= 59 and claimed.endswith("…")


def test_the_status_line_shows_in_flight_done_failed_and_the_last_event(
    restore_journal: None,
) -> None:
    configure_stderr()
    stream = io.StringIO()
    counts = {"in_flight": 1, "committed": 4, "failed": 2, "parked": 1}
    journal = Journal(worker_id="w")
    with HumanConsole(stream, live=True, refresh=3600) as console:
        console.watch(lambda: counts)
        assert not any(
            getattr(h, "_sqs_lease", False) for h in logging.getLogger(LOGGER_NAME).handlers
        )  # no JSON lines meanwhile
        journal("job_claimed", job_id="j7", token=1)
        journal("heartbeat_ok", job_id="j7", token=1)
    text = stream.getvalue()
    assert "job_claimed" in text and "job j7" in text
    assert "heartbeat_ok  " not in text  # too frequent for a line of its own
    # The status line is redrawn in place (carriage return, clear line) after each event.
    drawn = text.split("\r\x1b[2K")
    assert len(drawn) >= 3
    last = drawn[-1]
    assert last.startswith("in flight 1 | done 4 | failed 2 | parked 1 | last: heartbeat_ok j7")
    assert last.endswith("\n")  # the final status stays on screen, on its own line
    assert any(getattr(h, "_sqs_lease", False) for h in logging.getLogger(LOGGER_NAME).handlers)


def test_without_a_terminal_there_is_no_status_line() -> None:
    stream = io.StringIO()
    with HumanConsole(stream, refresh=3600):
        Journal(worker_id="w")("job_claimed", job_id="j1", token=1)
    assert "\r" not in stream.getvalue() and "in flight" not in stream.getvalue()


# --------------------------------------------------------------------------- CLI, CliRunner


@pytest.mark.integration
def test_worker_output_human_prints_readable_lines_and_a_summary(
    aws: AwsTestEnv, app_dir: Path, monkeypatch: pytest.MonkeyPatch, restore_journal: None
) -> None:
    monkeypatch.syspath_prepend(str(app_dir))
    settings = ready(aws)
    Producer(settings).submit("upper", {"doc": "abc"}, "h1")
    args = ["worker", "app_mod:app", "--idle-exit", "2", "--receive-wait", "1", "--worker-id", "hw"]
    result = run(aws, *args, "--output", "human")
    assert result.exit_code == 0, (result.output, result.exception)
    assert not any(line.startswith("{") for line in result.stderr.splitlines())
    assert "job_claimed" in result.stderr and "job h1" in result.stderr
    assert "result_committed" in result.stderr
    assert result.stdout.startswith("stopped: ") and "committed 1" in result.stdout

    Producer(settings).submit("upper", {"doc": "def"}, "h2")
    as_json = run(aws, *args, "--output", "human", "--json")
    assert json.loads(as_json.stdout)["committed"] == 1


@pytest.mark.integration
def test_ctrl_c_outside_a_workers_run_is_one_line_and_exit_130(
    aws: AwsTestEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    def interrupted(settings: Settings, warm: object = None) -> list[str]:
        raise KeyboardInterrupt

    monkeypatch.setattr("sqs_lease.cli.create_tables", interrupted)
    result = run(aws, "tables", "create")
    assert result.exit_code == 130
    assert result.stderr.strip() == "interrupted"
    assert "Traceback" not in result.output


# --------------------------------------------------------------------------- real SIGINT


@pytest.mark.fault
@pytest.mark.integration
def test_ctrl_c_stops_a_cli_worker_on_a_terminal_with_a_live_status_line(
    aws: AwsTestEnv, app_dir: Path
) -> None:
    settings = ready(aws)
    Producer(settings).submit("slow", {"doc": "x"}, "c1")
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sqs_lease.cli",
            "--endpoint-url",
            aws.endpoint_url,
            "--prefix",
            aws.prefix,
            "worker",
            "app_mod:app",
            "--receive-wait",
            "1",
            "--output",
            "human",
            "--worker-id",
            "tty-w",
        ],
        cwd=app_dir,
        stdout=subprocess.PIPE,
        stderr=slave,
        stdin=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    os.close(slave)
    try:
        out = _reader(master)
        seen: list[str] = []
        _wait_for(out, "in flight 1", seen)  # the live status line, on the terminal
        proc.send_signal(signal.SIGINT)
        stdout, _ = proc.communicate(timeout=HANG_GUARD)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = _drain(out, seen)
    os.close(master)
    assert proc.returncode == 0, text
    assert "Traceback" not in text and "KeyboardInterrupt" not in text
    assert "\r\x1b[2K" in text and "last: job_claimed c1" in text
    assert "worker_stopping" in text and "signal=SIGINT" in text
    assert stdout.startswith("stopped: ") and "claimed 1" in stdout
    assert _job_state(settings, "c1") == "queued"  # handed back, not lost


@pytest.mark.fault
@pytest.mark.integration
def test_ctrl_c_stops_a_worker_run_from_python_without_a_traceback(
    aws: AwsTestEnv, app_dir: Path
) -> None:
    settings = ready(aws)
    Producer(settings).submit("slow", {"doc": "x"}, "l1")
    script = app_dir / f"run_{uuid.uuid4().hex[:6]}.py"
    script.write_text(
        LIBRARY_SCRIPT.format(here=str(app_dir), endpoint=aws.endpoint_url, prefix=aws.prefix)
    )
    proc = subprocess.Popen(
        [sys.executable, str(script)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        assert proc.stderr is not None
        err = _reader(proc.stderr)
        seen: list[str] = []
        _wait_for(err, '"event":"job_claimed"', seen)
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=HANG_GUARD)  # not communicate(): the reader owns stderr
        assert proc.stdout is not None
        stdout = proc.stdout.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = _drain(err, seen)
    assert proc.returncode == 0, text
    assert "Traceback" not in text and "KeyboardInterrupt" not in text
    events = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
    names = [e["event"] for e in events]
    assert {"event": "worker_stopping", "signal": "SIGINT"}.items() <= next(
        e for e in events if e["event"] == "worker_stopping"
    ).items()
    assert names[-1] == "worker_stopped"
    stats_line, after = stdout.strip().splitlines()
    assert json.loads(stats_line)["claimed"] == 1
    assert after == "after run"  # run() returned; the program goes on
    assert _job_state(settings, "l1") == "queued"
