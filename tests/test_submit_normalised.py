"""One payload, one job, whichever path validated it (issue 29).

A model's float field dumps ``{"seconds": 2}`` as ``2.0``; the same payload submitted
without the app (the CLI without ``--app``, a ``Producer`` without one) stayed ``2``,
so the two hashed apart: a resubmit was refused as a conflict, and a job without an id
got two ids (two jobs, two runs). Payloads are now stored as ``payload_text`` (whole
numbers as ints), a resubmit compares values, and a job an earlier version stored
under its float text keeps its id. On a real moto server, through the producer and
the CLI.
"""

from __future__ import annotations

import json
import textwrap
import time
import uuid
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import AwsTestEnv
from pydantic import BaseModel

from sqs_lease import App, JobContext, Producer, Settings, create_queue, create_tables
from sqs_lease._aws import SyncDriver
from sqs_lease._core.inputs import payload_text, same_payload
from sqs_lease._core.sending import submit_flow
from sqs_lease._jobs import canonical_json, payload_hash
from sqs_lease._journal import Journal
from sqs_lease._schema.job_requests import JobTable
from sqs_lease.cli import cli

pytestmark = pytest.mark.integration


class Sleep(BaseModel):
    seconds: float
    label: str = "nap"


def _app() -> App:
    app = App()

    @app.job("sleep", payload=Sleep)
    def sleep(ctx: JobContext[Sleep], p: Sleep) -> dict[str, float]:
        return {"slept": p.seconds}

    return app


def _settings(aws: AwsTestEnv) -> Settings:
    settings = Settings(endpoint_url=aws.endpoint_url, prefix=aws.prefix)
    create_tables(settings)
    create_queue(settings)
    return settings


def test_whole_numbers_are_one_value_and_other_values_stay_apart() -> None:
    assert payload_text({"b": 2.0, "a": [1.0, 1.5, True]}) == '{"a":[1,1.5,true],"b":2}'
    assert same_payload('{"seconds":2.0}', '{"seconds":2}')
    assert not same_payload('{"seconds":2.5}', '{"seconds":2}')
    assert not same_payload('{"flag":true}', '{"flag":1}')  # a boolean is not a number
    assert not same_payload('{"n":"2"}', '{"n":2}')


def test_the_app_path_and_the_plain_path_make_one_job(aws: AwsTestEnv) -> None:
    settings = _settings(aws)
    with_app, plain = Producer(settings, _app()), Producer(settings)
    first = with_app.submit("sleep", {"seconds": 2})
    again = plain.submit("sleep", {"seconds": 2, "label": "nap"})
    assert first.created and not again.created
    assert again.job_id == first.job_id  # one id: one job, run once
    stored = with_app.status(first.job_id)
    assert stored.state.value == "queued"
    # An explicit id: the plain path's 2.0 and the app's 2 are one payload, no conflict.
    jid = f"{aws.prefix}-explicit"
    assert plain.submit("sleep", {"seconds": 2.0, "label": "nap"}, job_id=jid).created
    assert not with_app.submit("sleep", Sleep(seconds=2), job_id=jid).created


def test_a_job_stored_by_an_earlier_version_keeps_its_id(aws: AwsTestEnv) -> None:
    settings = _settings(aws)
    # As a version before the rule stored it: the model's dump, floats as written.
    before = canonical_json({"label": "nap", "seconds": 2.0})
    digest = payload_hash(before)
    legacy_id = f"sleep-{digest[:24]}"
    table = JobTable(settings.jobs_table)
    producer = Producer(settings, _app())
    SyncDriver(settings, Journal()).run(
        submit_flow(
            table,
            queue_url=producer.queue_url,
            job_id=legacy_id,
            job_class="sleep",
            payload_json=before,
            payload_hash=digest,
            wall_now=time.time(),
            send_id="legacy-send",
        )
    )
    again = producer.submit("sleep", {"seconds": 2})
    assert (again.job_id, again.created) == (legacy_id, False)


APP_SOURCE = """
from pydantic import BaseModel
from sqs_lease import App, JobContext

app = App()


class Sleep(BaseModel):
    seconds: float
    label: str = "nap"


@app.job("sleep", payload=Sleep)
def sleep(ctx: JobContext[Sleep], p: Sleep) -> dict[str, float]:
    return {"slept": p.seconds}
"""


def test_the_cli_with_and_without_the_app_makes_one_job(
    aws: AwsTestEnv, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _settings(aws)
    module = f"submit_app_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text(textwrap.dedent(APP_SOURCE))
    monkeypatch.syspath_prepend(str(tmp_path))
    opts = ["--endpoint-url", aws.endpoint_url, "--prefix", aws.prefix]
    payload = '{"seconds": 2, "label": "nap"}'

    def submit(*extra: str) -> dict[str, object]:
        out = CliRunner().invoke(cli, [*opts, "submit", "sleep", "--payload", payload, *extra])
        assert out.exit_code == 0, out.output
        data: dict[str, object] = json.loads(out.stdout)
        return data

    first = submit("--app", f"{module}:app", "--json")
    again = submit("--json")
    assert again["job_id"] == first["job_id"]
    assert again["created"] is False
