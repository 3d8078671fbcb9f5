"""Under ``--json``, every command's failure is one JSON object on stdout (issue 29):
``{"error": ..., "code": ..., "exit": N}`` with the same non-zero exit status, beside the
``error:`` line on stderr. A script that parses stdout never meets an empty stdout or
an object that looks like an empty success."""

from __future__ import annotations

import json
from typing import Any

import click
import pytest
from click.testing import CliRunner, Result
from conftest import AwsTestEnv

from sqs_lease._config import Settings
from sqs_lease._resources import create_queue, create_tables
from sqs_lease.cli import cli

DEAD = "http://127.0.0.1:9"
"""An endpoint nothing answers on (the discard port): every AWS call fails."""

NOT_WALKED = {"local": "starts an emulator and serves until Ctrl-C (tested on its own)"}


def _leaves() -> list[tuple[str, click.Command]]:
    out: list[tuple[str, click.Command]] = []
    stack: list[tuple[str, click.Command]] = [("", cli)]
    while stack:
        path, command = stack.pop()
        sub = getattr(command, "commands", None)
        if sub:
            stack.extend((f"{path} {name}".strip(), c) for name, c in sub.items())
        elif path not in NOT_WALKED:
            out.append((path, command))
    return sorted(out, key=lambda pc: pc[0])


def _required(command: click.Command) -> list[str]:
    """Placeholder values for what the command requires (``x`` each)."""
    args: list[str] = []
    for p in command.params:
        if isinstance(p, click.Argument) and p.required:
            args.append("x")
        elif isinstance(p, click.Option) and p.required:
            args += [p.opts[0], "x"]
    return args


def _one_error(result: Result) -> dict[str, Any]:
    assert result.exit_code not in (0, None), result.output
    lines = result.stdout.splitlines()
    assert len(lines) == 1, f"stdout is not one JSON line: {result.stdout!r}"
    data: dict[str, Any] = json.loads(lines[0])
    assert list(data) == ["error", "code", "exit"], data
    assert data["exit"] == result.exit_code and data["error"] and data["code"], data
    return data


@pytest.mark.parametrize(("path", "command"), _leaves(), ids=[p for p, _ in _leaves()])
def test_every_command_fails_in_json_when_aws_does_not_answer(
    path: str, command: click.Command
) -> None:
    result = CliRunner().invoke(
        cli, ["--endpoint-url", DEAD, *path.split(), *_required(command), "--json"]
    )
    _one_error(result)
    assert result.stderr.startswith("error:") or "Error:" in result.stderr, result.stderr


def test_a_usage_error_under_json_is_one_object_too() -> None:
    result = CliRunner().invoke(cli, ["--endpoint-url", DEAD, "jobs", "show", "--json"])
    data = _one_error(result)
    assert data["code"] == "usage" and "JOB_ID" in data["error"]
    plain = CliRunner().invoke(cli, ["--endpoint-url", DEAD, "jobs", "show"])
    assert plain.exit_code == 2 and plain.stdout == ""  # no JSON unless asked


@pytest.mark.integration
def test_absent_things_under_json_say_not_found_and_never_look_like_an_empty_success(
    aws: AwsTestEnv,
) -> None:
    settings = Settings(endpoint_url=aws.endpoint_url, prefix=aws.prefix)
    create_tables(settings)
    create_queue(settings)

    def run(*args: str) -> Result:
        return CliRunner().invoke(
            cli, ["--endpoint-url", aws.endpoint_url, "--prefix", aws.prefix, *args, "--json"]
        )

    for args in (("jobs", "show", "nobody"), ("intents", "show", "nobody")):
        data = _one_error(run(*args))
        assert data["exit"] == 1 and "nobody" in data["error"], data
    shown = _one_error(run("dlq", "show", "nobody"))
    assert (shown["code"], shown["exit"]) == ("message_not_found", 1)
    # The receiver's table was never made: that is named, as JSON too.
    table = _one_error(run("receiver", "mark", "show", "no-scope"))
    assert (table["code"], table["exit"]) == ("resource_missing", 2)


@pytest.mark.integration
def test_a_wrong_region_is_named_before_any_create_is_suggested(aws: AwsTestEnv) -> None:
    """The tables exist in the region the settings name; asked in another, the error
    names the region and endpoint asked and says to check them before creating."""
    create_tables(Settings(endpoint_url=aws.endpoint_url, prefix=aws.prefix))
    args = ["--endpoint-url", aws.endpoint_url, "--prefix", aws.prefix]
    result = CliRunner().invoke(
        cli, [*args, "--region", "eu-west-3", "jobs", "show", "x", "--json"]
    )
    data = _one_error(result)
    assert data["code"] == "resource_missing"
    assert f"{aws.endpoint_url} (region eu-west-3)" in data["error"]
    assert data["error"].index("--region") < data["error"].index("tables create")
    right = CliRunner().invoke(cli, [*args, "jobs", "show", "x", "--json"])
    assert _one_error(right)["exit"] == 1  # the right region: the job is just not there
