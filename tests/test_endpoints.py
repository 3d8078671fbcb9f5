"""Separate endpoints per service: boto3's ``AWS_ENDPOINT_URL_SQS`` /
``AWS_ENDPOINT_URL_DYNAMODB`` (and the matching settings and options) put SQS on one
emulator and DynamoDB on another; both count as local (dummy credentials), and every
error names the endpoint the failing call actually went to.

The end-to-end tests run the installed ``sqs-lease`` command in a process of its
own with an environment holding no credentials at all and no ``AWS_ENDPOINT_URL``,
against two moto servers in processes of their own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import boto3
import pytest

from sqs_lease import ConfigError, Settings
from sqs_lease._local import spawn_local_server, stop_local_server

CLI = str(Path(sys.executable).parent / "sqs-lease")
DEAD = "http://127.0.0.1:9"  # the discard port: nothing listens there

# One xdist worker runs this file (`make test` uses --dist loadgroup): its module
# fixture starts two emulators once.
pytestmark = pytest.mark.xdist_group("endpoints")

APP_SOURCE = """
from pydantic import BaseModel
from sqs_lease import App, JobContext

app = App()

class Doc(BaseModel):
    doc: str

@app.job("upper", payload=Doc, lease_seconds=10, heartbeat_seconds=2)
def upper(ctx: JobContext[Doc], p: Doc) -> dict[str, str]:
    return {"upper": p.doc.upper()}
"""


# --------------------------------------------------------------------------- settings


def test_settings_read_boto3s_per_service_endpoint_variables() -> None:
    s = Settings.from_env(
        {"AWS_ENDPOINT_URL_SQS": "http://127.0.0.1:1001", "AWS_ENDPOINT_URL_DYNAMODB": DEAD}
    )
    assert s.endpoint_for("sqs") == "http://127.0.0.1:1001"
    assert s.endpoint_for("dynamodb") == DEAD
    assert s.is_local_for("sqs") and s.is_local_for("dynamodb") and s.is_local
    assert s.describe_endpoints() == f"SQS at http://127.0.0.1:1001, DynamoDB at {DEAD}"


def test_a_service_endpoint_wins_over_the_general_one_and_options_over_the_environment() -> None:
    env = {"AWS_ENDPOINT_URL": "http://127.0.0.1:1000", "AWS_ENDPOINT_URL_SQS": DEAD}
    s = Settings.from_env(env)
    assert (s.endpoint_for("sqs"), s.endpoint_for("dynamodb")) == (DEAD, "http://127.0.0.1:1000")
    # An explicit general endpoint replaces what the environment says for either service...
    s = Settings.from_env(env, endpoint_url="http://127.0.0.1:2000")
    assert s.endpoint_for("sqs") == s.endpoint_for("dynamodb") == "http://127.0.0.1:2000"
    # ...and an explicit service endpoint wins over an explicit general one.
    s = Settings.from_env(
        env, endpoint_url="http://127.0.0.1:2000", dynamodb_endpoint_url="http://127.0.0.1:3000"
    )
    assert s.endpoint_for("sqs") == "http://127.0.0.1:2000"
    assert s.endpoint_for("dynamodb") == "http://127.0.0.1:3000"


def test_one_service_on_aws_and_one_local_is_not_local_and_says_so() -> None:
    s = Settings(region="eu-west-1", dynamodb_endpoint_url="http://localhost:8000")
    assert s.is_local_for("dynamodb") and not s.is_local_for("sqs") and not s.is_local
    assert s.describe_endpoint("sqs") == (
        "SQS at AWS's public endpoint in eu-west-1 (no endpoint set)"
    )


def test_ignoring_configured_endpoints_ignores_the_variables_as_boto3_does() -> None:
    s = Settings.from_env(
        {
            "AWS_ENDPOINT_URL": DEAD,
            "AWS_ENDPOINT_URL_SQS": DEAD,
            "AWS_IGNORE_CONFIGURED_ENDPOINT_URLS": "true",
        }
    )
    assert s.endpoint_for("sqs") is None and s.endpoint_for("dynamodb") is None


def test_a_malformed_service_endpoint_is_refused_naming_its_field() -> None:
    with pytest.raises(ConfigError, match=r"'dynamodb_endpoint_url'.*http://"):
        Settings.from_env({"AWS_ENDPOINT_URL_DYNAMODB": "127.0.0.1:8000"})


# --------------------------------------------------------------------------- two emulators


@dataclass(frozen=True)
class TwoEmulators:
    sqs: str
    dynamodb: str


@pytest.fixture(scope="module")
def two() -> Iterator[TwoEmulators]:
    """SQS on one moto server, DynamoDB on another, each in its own process."""
    sqs_proc, sqs_url = spawn_local_server()
    try:
        ddb_proc, ddb_url = spawn_local_server()
        try:
            yield TwoEmulators(sqs_url, ddb_url)
        finally:
            stop_local_server(ddb_proc)
    finally:
        stop_local_server(sqs_proc)


def _no_credentials_env(tmp_path: Path, **endpoints: str) -> dict[str, str]:
    """No AWS variable but the ones given: no keys, no profile, no files, no IMDS."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(
        {
            "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "no-credentials"),
            "AWS_CONFIG_FILE": str(tmp_path / "no-config"),
            "AWS_EC2_METADATA_DISABLED": "true",
            "AWS_DEFAULT_REGION": "us-east-1",
            "NO_PROXY": "127.0.0.1,localhost",
            "no_proxy": "127.0.0.1,localhost",
            **endpoints,
        }
    )
    return env


def _cli(env: dict[str, str], cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [CLI, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=300
    )


def _ok(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def _error_line(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    return lines[0]


def _client(service: str, url: str) -> object:
    return boto3.client(
        service,  # type: ignore[call-overload]
        endpoint_url=url,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )


@pytest.mark.integration
def test_a_job_runs_with_sqs_and_dynamodb_on_separate_emulators_named_only_by_boto3s_variables(
    two: TwoEmulators, tmp_path: Path
) -> None:
    prefix = f"e{uuid.uuid4().hex[:10]}"
    env = _no_credentials_env(
        tmp_path, AWS_ENDPOINT_URL_SQS=two.sqs, AWS_ENDPOINT_URL_DYNAMODB=two.dynamodb
    )
    (tmp_path / "two_app.py").write_text(textwrap.dedent(APP_SOURCE))
    _ok(_cli(env, tmp_path, "--prefix", prefix, "tables", "create"))
    _ok(_cli(env, tmp_path, "--prefix", prefix, "queue", "create"))
    _ok(
        _cli(
            env, tmp_path, "--prefix", prefix, "submit", "upper",
            "--payload", '{"doc": "abc"}', "--app", "two_app:app", "--id", "sep-1",
        )
    )  # fmt: skip
    stats = _ok(
        _cli(
            env, tmp_path, "--prefix", prefix, "worker", "two_app:app",
            "--idle-exit", "1", "--receive-wait", "1",
        )
    )  # fmt: skip
    assert json.loads(stats.strip().splitlines()[-1])["committed"] == 1
    show = _cli(env, tmp_path, "--prefix", prefix, "jobs", "show", "sep-1", "--json")
    shown = json.loads(_ok(show))
    assert shown["state"] == "succeeded"

    # Each service's resources live on its own emulator, and only there.
    sqs_there, sqs_other = _client("sqs", two.sqs), _client("sqs", two.dynamodb)
    ddb_there, ddb_other = _client("dynamodb", two.dynamodb), _client("dynamodb", two.sqs)
    assert f"{prefix}-jobs" in ddb_there.list_tables()["TableNames"]  # type: ignore[attr-defined]
    assert f"{prefix}-jobs" not in ddb_other.list_tables()["TableNames"]  # type: ignore[attr-defined]
    queues = sqs_there.list_queues(QueueNamePrefix=prefix).get("QueueUrls", [])  # type: ignore[attr-defined]
    assert any(q.endswith(f"/{prefix}-jobs") for q in queues)
    assert not sqs_other.list_queues(QueueNamePrefix=prefix).get("QueueUrls")  # type: ignore[attr-defined]


@pytest.mark.integration
def test_cli_options_name_each_services_endpoint(two: TwoEmulators, tmp_path: Path) -> None:
    prefix = f"o{uuid.uuid4().hex[:10]}"
    env = _no_credentials_env(tmp_path)
    opts = ["--sqs-endpoint-url", two.sqs, "--dynamodb-endpoint-url", two.dynamodb]
    _ok(_cli(env, tmp_path, *opts, "--prefix", prefix, "tables", "create"))
    _ok(_cli(env, tmp_path, *opts, "--prefix", prefix, "queue", "create"))
    assert f"{prefix}-jobs" in _client("dynamodb", two.dynamodb).list_tables()["TableNames"]  # type: ignore[attr-defined]
    assert _client("sqs", two.sqs).list_queues(QueueNamePrefix=prefix).get("QueueUrls")  # type: ignore[attr-defined]


@pytest.mark.integration
@pytest.mark.parametrize("keys", [False, True], ids=["no-credentials", "credentials"])
def test_errors_name_the_endpoint_each_service_actually_used(
    two: TwoEmulators, tmp_path: Path, keys: bool
) -> None:
    prefix = f"x{uuid.uuid4().hex[:10]}"
    creds = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"} if keys else {}
    # DynamoDB where nothing answers: the error names that endpoint, not "real AWS".
    env = _no_credentials_env(
        tmp_path, AWS_ENDPOINT_URL_SQS=two.sqs, AWS_ENDPOINT_URL_DYNAMODB=DEAD, **creds
    )
    for args in (("tables", "create"), ("jobs", "list")):
        line = _error_line(_cli(env, tmp_path, "--prefix", prefix, *args))
        assert DEAD in line and "real AWS" not in line and "credentials" not in line, line

    # SQS answers but has no queue of that name: the error names the SQS endpoint.
    env = _no_credentials_env(
        tmp_path, AWS_ENDPOINT_URL_SQS=two.sqs, AWS_ENDPOINT_URL_DYNAMODB=two.dynamodb, **creds
    )
    _ok(_cli(env, tmp_path, "--prefix", prefix, "tables", "create"))
    line = _error_line(
        _cli(env, tmp_path, "--prefix", prefix, "submit", "upper", "--payload", "{}")
    )
    assert f"SQS at {two.sqs}" in line and "queue create" in line, line
