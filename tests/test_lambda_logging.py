"""The journal in a Lambda function's log, under each logging setup the runtime makes.

The Python runtime (awslambdaric's ``bootstrap._setup_logging``) puts one handler on
the root logger: a text formatter ``[LEVEL]\\t<time>\\t<request id>\\t<message>``, or,
with ``AWS_LAMBDA_LOG_FORMAT=JSON``, a JSON formatter whose object carries
``message`` (the record's message, as text) and every extra attribute of the record
at the top level. The root logger stays at WARNING unless ``AWS_LAMBDA_LOG_LEVEL``
sets it. The handlers below do the same, so each test sees what CloudWatch would.
"""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest
from conftest import AwsTestEnv
from test_aws_lambda import BUDGET, RunningDown, Work, event_of
from worker_helpers import prepare

from sqs_lease import App, JobContext, Producer
from sqs_lease._journal import EVENT_LEVELS, LOGGER_NAME, Journal, JsonLineFormatter
from sqs_lease.aws_lambda import handler

if TYPE_CHECKING:
    from types_boto3_sqs import SQSClient

_LOG_RECORD_KEYS = frozenset(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {
    "message",
    "asctime",
    "aws_request_id",
}


class _RequestId(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.aws_request_id = "req-1"
        return True


class _RuntimeJson(logging.Formatter):
    """The runtime's JSON log format: its own keys first, then the record's extra
    attributes; its encoder has no fallback for values JSON cannot hold."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "timestamp": "2026-12-05T00:00:00.000Z",
            "level": record.levelname,
            "message": record.getMessage(),
            "logger": record.name,
            "requestId": record.aws_request_id,  # type: ignore[attr-defined]
        }
        out.update(
            (k, v) for k, v in record.__dict__.items() if k not in _LOG_RECORD_KEYS and k not in out
        )
        return json.dumps(out) + "\n"


@pytest.fixture
def runtime_logging(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """``setup(fmt, level)``: the runtime's root handler, writing to a buffer; the
    journal logger as a fresh process has it (no level of its own)."""
    root = logging.getLogger()
    journal_logger = logging.getLogger(LOGGER_NAME)
    saved = (root.level, list(root.handlers), journal_logger.level, journal_logger.propagate)
    journal_handlers = list(journal_logger.handlers)
    package = logging.getLogger("sqs_lease")
    package_saved = (package.level, list(package.handlers), package.propagate)
    buffer = io.StringIO()

    def setup(fmt: str, level: str | None) -> io.StringIO:
        monkeypatch.setenv("AWS_LAMBDA_LOG_FORMAT", fmt)
        if level is None:
            monkeypatch.delenv("AWS_LAMBDA_LOG_LEVEL", raising=False)
        else:
            monkeypatch.setenv("AWS_LAMBDA_LOG_LEVEL", level)
        h = logging.StreamHandler(buffer)
        h.terminator = ""
        h.addFilter(_RequestId())
        if fmt == "JSON":
            h.setFormatter(_RuntimeJson())
        else:
            h.setFormatter(
                logging.Formatter(
                    "[%(levelname)s]\t%(asctime)s.%(msecs)03dZ\t%(aws_request_id)s\t%(message)s\n"
                )
            )
        root.handlers = [h]
        root.setLevel(level or logging.WARNING)
        journal_logger.setLevel(logging.NOTSET)
        journal_logger.propagate = True
        journal_logger.handlers = []
        return buffer

    try:
        yield setup
    finally:
        root.setLevel(saved[0])
        root.handlers = saved[1]
        journal_logger.setLevel(saved[2])
        journal_logger.propagate = saved[3]
        journal_logger.handlers = journal_handlers
        package.setLevel(package_saved[0])
        package.handlers = package_saved[1]
        package.propagate = package_saved[2]


def _run_two_jobs(aws: AwsTestEnv, sqs: SQSClient) -> tuple[list[str], dict[str, Any]]:
    """One job that succeeds and one whose handler fails for good (max_attempts=1)."""
    settings, url, _ = prepare(aws.endpoint_url, aws.prefix)
    app = App()

    @app.job("work", payload=Work, **{**BUDGET, "max_attempts": 1})
    def work(ctx: JobContext[Work], p: Work) -> dict[str, int]:
        if p.n == 1:
            raise RuntimeError("the tool broke")
        return {"n": p.n}

    producer = Producer(settings, app)
    ids = [producer.submit("work", Work(n=i), job_id=f"{aws.prefix}-{i}").job_id for i in range(2)]
    answer = handler(app, settings)(event_of(sqs, url, 2), RunningDown(60))
    return ids, answer


def _text_events(text: str) -> list[tuple[str, dict[str, Any]]]:
    """(level, event) of each journal line of the runtime's text format."""
    out = []
    for line in text.splitlines():
        level, _, _, message = line.split("\t", 3)
        if message.startswith("{"):
            event = json.loads(message)  # the whole message is one JSON object
            assert isinstance(event, dict)
            out.append((level.strip("[]"), event))
    return out


def test_under_the_default_text_format_the_journal_reaches_the_log_one_object_a_line(
    aws: AwsTestEnv, sqs_client: SQSClient, runtime_logging: Any
) -> None:
    buffer = runtime_logging("Text", None)  # the runtime's default: root at WARNING
    ids, answer = _run_two_jobs(aws, sqs_client)
    assert len(answer["batchItemFailures"]) == 0  # a job that failed for good is ended
    events = _text_events(buffer.getvalue())
    names = {e["event"] for _, e in events}
    assert {"job_claimed", "result_committed", "job_failed"} <= names
    for level, event in events:
        assert level == logging.getLevelName(EVENT_LEVELS[event["event"]]), event
    (failed,) = [(lv, e) for lv, e in events if e["event"] == "job_failed"]
    assert failed[0] == "WARNING" and failed[1]["job_id"] == ids[1]


def test_an_operator_log_level_keeps_only_what_it_asks_for(
    aws: AwsTestEnv, sqs_client: SQSClient, runtime_logging: Any
) -> None:
    buffer = runtime_logging("Text", "WARNING")
    _run_two_jobs(aws, sqs_client)
    events = _text_events(buffer.getvalue())
    assert "job_failed" in {e["event"] for _, e in events}
    assert all(EVENT_LEVELS[e["event"]] >= logging.WARNING for _, e in events), events


@pytest.mark.parametrize("level", [None, "INFO"])
def test_under_the_json_format_fields_are_merged_never_a_json_string_in_a_json_line(
    aws: AwsTestEnv, sqs_client: SQSClient, runtime_logging: Any, level: str | None
) -> None:
    buffer = runtime_logging("JSON", level)
    ids, _ = _run_two_jobs(aws, sqs_client)
    docs = [json.loads(line) for line in buffer.getvalue().splitlines() if line.strip()]
    journal = [d for d in docs if d["logger"] == LOGGER_NAME]
    assert all("event" in d for d in journal), journal
    assert {"job_claimed", "result_committed", "job_failed"} <= {d["event"] for d in journal}
    for d in journal:
        # The message is the event's name, the fields are the object's own keys.
        assert d["message"] == d["event"], d
        assert d["level"] == logging.getLevelName(EVENT_LEVELS[d["event"]])
        assert isinstance(d["ts"], float)
    committed = next(d for d in journal if d["event"] == "result_committed")
    assert committed["job_id"] == ids[0] and committed["token"] == 1


def test_powertools_logger_users_get_the_fields_merged_into_their_json(
    aws: AwsTestEnv,
    sqs_client: SQSClient,
    runtime_logging: Any,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from aws_lambda_powertools import Logger
    from aws_lambda_powertools.logging.utils import copy_config_to_registered_loggers

    runtime_logging("Text", None)
    # A service name of its own: Powertools keeps one logger (and its stream) a name.
    logger = Logger(service="journal-merge-check")
    # Powertools copies its handlers to top-level loggers: the package's.
    copy_config_to_registered_loggers(source_logger=logger, include={"sqs_lease"})
    capsys.readouterr()
    ids, _ = _run_two_jobs(aws, sqs_client)
    docs = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.strip()]
    journal = [d for d in docs if "event" in d]
    assert {"job_claimed", "result_committed", "job_failed"} <= {d["event"] for d in journal}
    for d in journal:
        assert d["message"] == d["event"] and d["service"] == "journal-merge-check", d
    failed = next(d for d in journal if d["event"] == "job_failed")
    assert failed["level"] == "WARNING" and failed["job_id"] == ids[1]


def test_a_field_a_log_record_keeps_for_itself_is_renamed_not_lost() -> None:
    logger = logging.getLogger(LOGGER_NAME + ".test-reserved")
    seen: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record)

    logger.addHandler(Keep())
    logger.setLevel(logging.INFO)
    logger.propagate = False
    journal = Journal(logger=logger, merge_fields=True)
    journal("job_submit_duplicate", job_id="j", message="sent", name="n")
    (record,) = seen
    assert record.getMessage() == "job_submit_duplicate"
    assert record.journal_message == "sent" and record.journal_name == "n"  # type: ignore[attr-defined]
    # The ECS / CLI formatter prints either way as the one JSON object.
    line = json.loads(JsonLineFormatter().format(record))
    assert line["event"] == "job_submit_duplicate" and line["job_id"] == "j"


def test_every_failure_event_is_logged_at_warning_or_above() -> None:
    failures = {
        "aws_lost",
        "heartbeat_lost",
        "job_failed",
        "job_parked",
        "result_rejected",
        "intent_ambiguous",
        "message_poisoned",
        "lambda_record_failed",
        "lambda_budget_never_fits",
        "lambda_visibility_too_short",
        "stranded_sweep_failed",
        "dlq_reconcile_failed",
        "job_dead_lettered",
    }
    assert {e for e in failures if EVENT_LEVELS[e] < logging.WARNING} == set()
    assert EVENT_LEVELS["heartbeat_ok"] <= logging.INFO
    assert EVENT_LEVELS["job_claimed"] <= logging.INFO
