"""Run one real worker process for the fault tests (``python tests/fault_worker.py``).

Environment: ``AWS_ENDPOINT_URL``, ``SQS_LEASE_PREFIX``, ``WORKER_NAME``; optional
``SQS_LEASE_MUTATION`` (comma-separated) breaks protocol rules on purpose, so a
test can show that its checks catch the broken variant (the checker bites):
``no_commit_token`` drops the token from the commit's condition
(``no_checkpoint_token``: from a stage checkpoint's);
``commit_after_stop`` commits what a handler returns after its attempt was told
to stop (the worker's own guard, in front of the token condition).
``SQS_LEASE_SHELL``: ``thread`` (default) runs the thread worker, ``async`` the
async worker. ``SQS_LEASE_KILL_AT`` (thread worker) SIGKILLs the process at a
point of a stage ending: ``after_checkpoint`` (before the next stage's message
is sent) or ``before_delete`` (after it was sent and marked sent, before the
current message is deleted).
"""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sqs_lease import AsyncWorker, Settings, Worker
from sqs_lease._journal import configure_stderr


def _mutate(names: str) -> None:
    for name in names.split(","):
        if name == "no_commit_token":
            _no_commit_token()
        elif name == "no_checkpoint_token":
            _no_checkpoint_token()
        elif name == "commit_after_stop":
            from sqs_lease._core import attempt

            setattr(attempt, "stopped_ending", lambda end, stop: end)  # noqa: B010
        else:
            raise SystemExit(f"unknown mutation {name!r}")


def _no_checkpoint_token() -> None:
    from sqs_lease._schema import job_requests as _schema

    original = _schema.JobTable.advance_stage

    def advance_stage(self: Any, *args: Any, **kwargs: Any) -> Any:
        saved = _schema._mine
        _schema._mine = lambda token, worker_id: _schema.R.state == "running"
        try:
            return original(self, *args, **kwargs)
        finally:
            _schema._mine = saved

    _schema.JobTable.advance_stage = advance_stage  # type: ignore[method-assign]


def _no_commit_token() -> None:
    from sqs_lease._schema import job_requests as _schema

    original = _schema.JobTable.commit

    def unfenced(token: int, worker_id: str) -> Any:
        # Keep "state = running", drop "token = :t": the fence is gone.
        return _schema.R.state == "running"

    def commit(self: Any, *args: Any, **kwargs: Any) -> Any:
        saved = _schema._mine
        _schema._mine = unfenced
        try:
            return original(self, *args, **kwargs)
        finally:
            _schema._mine = saved

    _schema.JobTable.commit = commit  # type: ignore[method-assign]


def _kill_at(point: str) -> None:
    import json
    import signal

    from sqs_lease import _aws

    original = _aws.SyncDriver.execute
    sent = threading.Event()

    def execute(self: Any, c: Any) -> Any:
        staged = c.op == "SendMessage" and "stage" in json.loads(c.params["MessageBody"])
        if staged and point == "after_checkpoint":
            os.kill(os.getpid(), signal.SIGKILL)
        deleting = c.op in ("DeleteMessage", "DeleteMessageBatch")
        if deleting and sent.is_set() and point == "before_delete":
            os.kill(os.getpid(), signal.SIGKILL)
        out = original(self, c)
        if c.op == "UpdateItem" and sent.is_set() and point == "before_delete":
            # The next message is marked sent: the ended stage's delete comes next (at
            # once, or queued in the worker's batch, which would go only later).
            os.kill(os.getpid(), signal.SIGKILL)
        if staged:
            sent.set()
        return out

    _aws.SyncDriver.execute = execute  # type: ignore[method-assign]


def main() -> int:
    configure_stderr()
    if os.environ.get("SQS_LEASE_KILL_AT"):
        _kill_at(os.environ["SQS_LEASE_KILL_AT"])
    if os.environ.get("SQS_LEASE_MUTATION"):
        _mutate(os.environ["SQS_LEASE_MUTATION"])
    from fault_app import app

    settings = Settings.from_env()
    shell = {"thread": Worker, "async": AsyncWorker}[os.environ.get("SQS_LEASE_SHELL", "thread")]
    worker = shell(
        app,
        settings,
        worker_id=os.environ["WORKER_NAME"],
        concurrency=1,
        receive_wait=1,
        shutdown_grace=120,
    )
    worker.install_signal_handlers()
    worker.run(
        max_messages=int(os.environ.get("MAX_MESSAGES", "1")),
        idle_exit=float(os.environ.get("IDLE_EXIT", "60")),
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
