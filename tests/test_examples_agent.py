"""The agent examples: each one command runs as written (the example's own code, in
its own process) on the session's moto server, and each says ``ok`` only when every
tool call succeeded, the long call's lease was extended while it ran and the invoice
was charged once."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import AwsTestEnv

ROOT = Path(__file__).resolve().parent.parent
AGENT = ROOT / "examples" / "agent"


def _run(script: str, aws: AwsTestEnv) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SQS_LEASE_")}
    proc = subprocess.run(
        [
            sys.executable,
            str(AGENT / script),
            "--endpoint-url",
            aws.endpoint_url,
            "--prefix",
            aws.prefix,
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=240,  # a hang guard
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    return proc.stdout


def _check_session(out: str) -> None:
    rows = re.findall(r"^  session-[0-9a-f]+:(\S+)\s+(\w+)\s+(\w+)\s+attempt", out, re.M)
    assert {name for name, _, _ in rows} == {
        "search",
        "ocr-1",
        "ocr-2",
        "browse",
        "export",
        "pay",
        "pay-again",
    }
    assert all(state == "succeeded" for _, _, state in rows), rows
    charged = re.search(r"payment service: (\d+) charge\(s\)", out)
    assert charged and charged.group(1) == "1"  # the lost answer and the second job: one charge
    # The lost answer was settled without paying again: reconciled by the check, or
    # replayed from the intent the other job of the same invoice confirmed first
    # (which one comes first is the machine's timing).
    assert '"reconciled": true' in out or '"replayed": true' in out
    # The ERP export is one job of three durable stages, in order, its token rising.
    stages = re.search(r"the ERP export's stages: (.*)$", out, re.M)
    assert stages, out
    seen = re.findall(r"(\w+) \(token (\d+)\)", stages.group(1))
    assert [name for name, _ in seen] == ["fetch", "transform", "upload"]
    tokens = [int(t) for _, t in seen]
    assert tokens == sorted(set(tokens))
    extended = re.search(r"lease was extended (\d+) times", out)
    assert extended and int(extended.group(1)) >= 2  # the browse outlived its 6 s lease
    assert out.rstrip().endswith("ok")


@pytest.mark.integration
def test_the_agent_worker_example_runs_every_tool_call_once_from_one_command(
    aws: AwsTestEnv,
) -> None:
    _check_session(_run("run_local.py", aws))


@pytest.mark.integration
def test_the_same_handlers_run_behind_the_deployable_lambda_entry_from_one_command(
    aws: AwsTestEnv,
) -> None:
    out = _run("lambda_local.py", aws)
    assert "SQS_LEASE_APP=examples.agent.tools:lambda_app" in out
    assert re.search(r"invocation 1: \d+ records", out)
    _check_session(out)


def test_both_apps_register_the_same_handlers_and_only_the_budget_differs() -> None:
    sys.path.insert(0, str(ROOT))
    from examples.agent import tools

    assert set(tools.app.classes) == set(tools.lambda_app.classes)
    for name, reg in tools.app.classes.items():
        other = tools.lambda_app.classes[name]
        assert reg.handler is other.handler
        assert reg.job_class.model_dump(exclude={"stage_budget_seconds"}) == (
            other.job_class.model_dump(exclude={"stage_budget_seconds"})
        )
        # A Lambda record starts only when its whole budget (+3 s) fits in 900 s.
        assert other.job_class.stage_budget_seconds + 3 <= 900
