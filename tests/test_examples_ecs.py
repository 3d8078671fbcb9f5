"""The ECS example: its one command runs, and its task definition and Dockerfile agree
with the worker's settings."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from sqs_lease.service import WorkerEnv, env_table

ROOT = Path(__file__).resolve().parent.parent
ECS = ROOT / "examples" / "ecs"


def _container() -> dict[str, object]:
    task = json.loads((ECS / "task-definition.json").read_text())
    container: dict[str, object] = task["containerDefinitions"][0]
    return container


def test_the_task_definition_sets_only_known_variables_and_a_grace_that_fits() -> None:
    container = _container()
    env = {e["name"]: e["value"] for e in container["environment"]}  # type: ignore[attr-defined]
    known = {name for name, _, _ in env_table()}
    assert set(env) <= known, set(env) - known
    assert float(env["SQS_LEASE_STOP_TIMEOUT"]) == container["stopTimeout"]
    worker = {
        k.removeprefix("SQS_LEASE_").lower(): v
        for k, v in env.items()
        if k.startswith("SQS_LEASE_") and k not in ("SQS_LEASE_PREFIX", "SQS_LEASE_QUEUE")
    }
    settings = WorkerEnv.load(**worker)  # raises if the grace would not fit stopTimeout
    assert settings.grace > 0


def test_the_dockerfile_runs_the_worker_as_pid_1_with_an_app_that_exists() -> None:
    text = (ECS / "Dockerfile").read_text()
    assert 'ENTRYPOINT ["sqs-lease", "worker"]' in text  # exec form: SIGTERM reaches it
    copied = re.findall(r"^COPY (examples/\S+) ", text, re.M)
    assert copied and all((ROOT / path).is_file() for path in copied)
    assert "SQS_LEASE_APP=ecs_app:app" in text


@pytest.mark.integration
@pytest.mark.fault
def test_the_ecs_example_runs_locally_with_one_command_and_stops_cleanly() -> None:
    proc = subprocess.run(
        [sys.executable, str(ECS / "run_local.py")],
        capture_output=True,
        text=True,
        timeout=240,  # a hang guard
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "worker exit code 0" in out
    assert re.search(r"export\s+queued", out)
    assert "JobClass=summarize,Model=example-model-1,Provider=example-ai" in out
    assert out.rstrip().endswith("ok")
