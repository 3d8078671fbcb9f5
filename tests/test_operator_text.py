"""Outside text on its way to people (issue 32, items 4, 5, 7): control characters made
visible on a terminal, URLs and payload text kept out of reasons and logs, idempotency
keys that any HTTP stack can send and the receiver decodes the same way."""

from __future__ import annotations

import io
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from click.testing import CliRunner, Result
from conftest import AwsTestEnv
from pydantic import BaseModel, ValidationError

from sqs_lease import EffectCall, ToolNotApplied
from sqs_lease._console import HumanConsole, render_event
from sqs_lease._core.endings import ending_for
from sqs_lease._core.texts import visible, without_urls
from sqs_lease._errors import ConfigError, FenceError
from sqs_lease._fence import IDEMPOTENCY_KEY, fence_headers, parse_fence
from sqs_lease.cli import cli
from sqs_lease.effects import http_json

# What a stranger plants: an OSC 0 window title, an OSC 52 clipboard write, a cursor
# move up and a carriage return that would overwrite a line, a C1 CSI, DEL, a bidi
# override.
OSC_TITLE = "\x1b]0;owned\x07"
OSC_CLIPBOARD = "\x1b]52;c;Y3VybCBldmlsfHNo\x07"
OVERWRITE = "\x1b[1A\rstate: succeeded"
HOSTILE = OSC_TITLE + OSC_CLIPBOARD + OVERWRITE + "\x9b2J\x7f\u202e"
RAW = ("\x1b", "\x07", "\r", "\x9b", "\x7f", "\u202e")


def assert_no_raw_controls(text: str) -> None:
    for ch in RAW:
        assert ch not in text, (ch, text)


# --------------------------------------------------------------------------- item 4, pure


def test_visible_shows_every_control_character_as_an_escape_and_leaves_text_alone() -> None:
    shown = visible(HOSTILE)
    assert_no_raw_controls(shown)
    assert "\\x1b]0;owned\\x07" in shown and "\\r" in shown and "\\x9b" in shown
    assert "\\u202e" in shown and "\\x7f" in shown
    assert visible("a\nb\tc\x00") == "a\\nb\\tc\\x00"
    assert visible("\ud800") == "\\ud800"  # a lone surrogate no strict stream can encode
    for fine in ("job-1", "Zürich 東京 🚀", "C:\\path", "a b"):
        assert visible(fine) == fine


def test_the_human_worker_output_shows_planted_controls_visibly() -> None:
    record = {"event": "job_failed", "ts": 0, "job_id": "j" + HOSTILE, "reason": HOSTILE}
    line = render_event(record)
    assert_no_raw_controls(line)
    assert "\n" not in line
    stream = io.StringIO()
    with HumanConsole(stream, live=True, refresh=3600) as console:
        console.emit(_record(json.dumps({"event": "job_parked", "ts": 0, "job_id": "j" + HOSTILE})))
        status = console.status_line()
    assert_no_raw_controls(status)
    # The console's own redraw (\r + erase line) is the only escape it writes.
    written = stream.getvalue().replace("\r\x1b[2K", "")
    assert_no_raw_controls(written)


def _record(message: str) -> Any:
    import logging

    return logging.LogRecord("sqs_lease.journal", logging.INFO, "", 0, message, None, None)


# --------------------------------------------------------------------------- item 5, pure


def test_urls_in_error_texts_keep_only_scheme_and_host() -> None:
    text = "POST https://user:pw@hooks.example.com:8443/T0/B1/SECRETPATH?token=abc#x failed"
    assert without_urls(text) == "POST https://hooks.example.com:8443 failed"
    end = ending_for(RuntimeError(f"calling {text}"))
    assert (
        "SECRETPATH" not in end.reason and "token=abc" not in end.reason and "pw" not in end.reason
    )
    assert "https://hooks.example.com:8443" in end.reason


def test_a_card_number_inside_a_longer_payload_string_is_taken_out_of_the_reason() -> None:
    payload = json.dumps({"note": "please charge card 4111111111111111 for the order"})
    end = ending_for(ValueError("card 4111111111111111 declined"), payload)
    assert "4111111111111111" not in end.reason
    assert end.reason == "ValueError: card <payload> declined"


class Prompted(BaseModel):
    count: int


def test_a_validation_error_is_said_without_its_cut_input_value() -> None:
    prompt = "Summarise the confidential merger memo for Acme and Globex in five bullet points"
    payload = json.dumps({"prompt": prompt})
    with pytest.raises(ValidationError) as info:
        Prompted.model_validate({"count": prompt})
    assert "input_value=" in str(info.value)  # what pydantic itself says
    end = ending_for(info.value, payload)
    assert "confidential" not in end.reason and "input_value" not in end.reason
    assert "bullet" not in end.reason and "Summarise" not in end.reason
    assert "count" in end.reason and "1 validation error(s) for Prompted" in end.reason
    # A cut excerpt of the payload in any library's words goes too.
    excerpt = ValueError(f"cannot parse near '{prompt[:30]}...{prompt[-20:]}'")
    reason = ending_for(excerpt, payload).reason
    assert "merger" not in reason and "bullet points" not in reason


# --------------------------------------------------------------------------- http targets


class _Target(BaseHTTPRequestHandler):
    seen: list[dict[str, str]] = []  # noqa: RUF012 - shared on purpose: the test reads it

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", "0"))
        self.rfile.read(length)
        _Target.seen.append(dict(self.headers))
        status = 400 if "bad" in self.path else 201
        payload = json.dumps({"id": "x1"}).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def target() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Target)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_http_json_errors_name_the_url_by_scheme_and_host_only(target: str) -> None:
    call = EffectCall("k-url", 3, "job-1", "notify", "hook", {"n": 1})
    with pytest.raises(ToolNotApplied) as info:
        http_json(call, f"{target}/bad/T0/SECRETPATH?token=s3cr3t")
    text = str(info.value)
    assert "SECRETPATH" not in text and "s3cr3t" not in text
    assert text.startswith(target + ":")


# --------------------------------------------------------------------------- item 7


def test_a_key_outside_latin_1_is_sent_percent_encoded_and_decodes_to_itself(target: str) -> None:
    key = "支払い:INV-1:capture é%"
    call = EffectCall(key, 3, "job-1", "capture", "payments", {"amount": 5})
    _Target.seen.clear()
    result = http_json(call, target + "/charge")  # before: UnicodeEncodeError ("unknown")
    assert result.external_id == "x1"
    sent = _Target.seen[-1][IDEMPOTENCY_KEY]
    assert sent.isascii() and "payment" not in sent
    assert sent.startswith("%E6%94%AF") and sent.endswith("%20%C3%A9%25")
    assert parse_fence(_Target.seen[-1]).idem_key == key  # the receiver's decode, same module
    # A plain key goes unchanged, so targets that met it before see the same key.
    assert fence_headers("payment:INV-1:capture", "job-1", 3)[IDEMPOTENCY_KEY] == (
        "payment:INV-1:capture"
    )


def test_the_signature_covers_the_key_as_sent() -> None:
    headers = fence_headers("ключ-1", "job-1", 4, secret=b"s")
    assert parse_fence(headers, secrets=[b"s"]).idem_key == "ключ-1"


@pytest.mark.parametrize("bad", ["a\x00b", "a\x1b]0;x\x07", "a\r\nX-Evil: 1", "a\x85", "\ud800"])
def test_control_characters_in_a_key_are_refused_before_anything_is_sent(
    bad: str, target: str
) -> None:
    with pytest.raises(FenceError):
        fence_headers(bad, "job-1", 1)
    call = EffectCall(bad, 3, "job-1", "capture", "payments", {"amount": 5})
    with pytest.raises(ToolNotApplied) as info:  # never "outcome unknown"
        _ = call.headers
    assert info.value.retry is False
    with pytest.raises(ToolNotApplied):
        http_json(call, target + "/charge")


def test_the_receiver_refuses_a_decoded_key_with_control_characters() -> None:
    headers = {
        IDEMPOTENCY_KEY: "k%0D%0AX",
        "X-Execution-Fence-Scope": "j",
        "X-Execution-Fence": "1",
    }
    with pytest.raises(FenceError) as info:
        parse_fence(headers)
    assert info.value.status == 400


def test_a_request_that_cannot_be_built_is_not_sent_rather_than_unknown(target: str) -> None:
    call = EffectCall("k-h", 3, "job-1", "capture", "payments", {"amount": 5})
    with pytest.raises(ToolNotApplied) as info:
        http_json(call, target + "/charge", headers={"Authorization": "Bearer 東京"})
    assert info.value.retry is False and "not sent" in str(info.value)
    with pytest.raises(ToolNotApplied):
        http_json(call, target + "/päth")


def test_an_effect_with_a_control_character_in_its_key_is_refused_up_front() -> None:
    from test_job_context import _context

    ran: list[Any] = []
    ctx, _, _, _ = _context(run_effect=lambda spec: ran.append(spec))
    with pytest.raises(ConfigError, match="control or format characters"):
        ctx.effect("a", "t", {"x": 1}, lambda c: {}, key="inv\x1b[2J")
    assert ran == []  # no intent prepared
    for hidden in ("inv\u202ecod", "inv\u200b1"):  # a bidi override, a zero-width space
        with pytest.raises(ConfigError, match="control or format characters"):
            ctx.effect("a", "t", {"x": 1}, lambda c: {}, key=hidden)
    assert ran == []


# --------------------------------------------------------------------------- CLI, item 4


def _run(aws: AwsTestEnv, *args: str) -> Result:
    opts = ["--endpoint-url", aws.endpoint_url, "--prefix", aws.prefix]
    # color=True: click strips CSI sequences (only those) from a non-terminal stream.
    return CliRunner().invoke(cli, [*opts, *args], color=True)


@pytest.mark.integration
def test_jobs_commands_show_a_planted_job_id_and_reason_with_controls_visible(
    aws: AwsTestEnv, ddb_client: Any
) -> None:
    assert _run(aws, "tables", "create").exit_code == 0
    assert _run(aws, "queue", "create").exit_code == 0
    job_id = "j" + OSC_TITLE + OVERWRITE
    reason = "boom" + OSC_CLIPBOARD + "\n" + OVERWRITE + "\u202e"
    refused = _run(aws, "submit", "ocr", "--payload", "{}", "--id", job_id)
    assert refused.exit_code != 0  # submit keeps such ids out (issue 32, item 1) ...
    assert_no_raw_controls(refused.output)  # ... and its error line shows them visibly
    # ... but a hand edit, an older version or a producer with table access can plant
    # one: the record of a plain submit, copied under the hostile id.
    assert _run(aws, "submit", "ocr", "--payload", "{}", "--id", "plain").exit_code == 0
    table = f"{aws.prefix}-jobs"
    item = ddb_client.get_item(TableName=table, Key={"job_id": {"S": "plain"}})["Item"]
    ddb_client.put_item(TableName=table, Item={**item, "job_id": {"S": job_id}})
    cancelled = _run(aws, "jobs", "cancel", job_id, "--reason", reason)
    assert cancelled.exit_code == 0, cancelled.output
    assert_no_raw_controls(cancelled.output)
    assert cancelled.stdout.count("\n") == 1

    for args in (
        ("jobs", "list"),
        ("jobs", "show", job_id),
        ("jobs", "timeline", job_id, "--no-intents"),
        ("jobs", "cancel", job_id),  # nothing to do: says so with the reason
        ("jobs", "show", job_id + "x"),  # not found: the error line names the id
    ):
        result = _run(aws, *args)
        assert_no_raw_controls(result.output)
        assert "\\x1b]0;owned\\x07" in result.output, (args, result.output)
    shown = _run(aws, "jobs", "show", job_id).stdout
    # A reason's line break is shown, not obeyed: no forged `state:` line.
    assert [line for line in shown.splitlines() if line.startswith("state:")] == [
        "state: cancelled"
    ]

    # JSON output stays exact JSON: the text round-trips unchanged.
    data = json.loads(_run(aws, "jobs", "show", job_id, "--json").stdout)
    assert data["job_id"] == job_id and reason in data["reason"]


@pytest.mark.integration
def test_dlq_show_and_list_show_a_planted_body_id_and_reason_with_controls_visible(
    aws: AwsTestEnv, sqs_client: Any
) -> None:
    assert _run(aws, "tables", "create").exit_code == 0
    assert _run(aws, "queue", "create").exit_code == 0
    dlq_url = sqs_client.get_queue_url(QueueName=f"{aws.prefix}-jobs-dlq")["QueueUrl"]
    # SQS bodies take CR and C1 raw; ESC and BEL arrive JSON-escaped and come out raw
    # once parsed.
    job_id = "j\u001b]0;owned\u0007"
    body = json.dumps({"job_id": job_id, "job_class": "ocr", "send_id": "s1", "x": "\r\x9b\u202e"})
    mid = sqs_client.send_message(
        QueueUrl=dlq_url,
        MessageBody=body,
        MessageAttributes={
            "sqs_lease_reason": {"DataType": "String", "StringValue": "bad\r\x9b2Jstate: ok"}
        },
    )["MessageId"]
    # Such a job id is no job id (poison: never looked up by it); found by message id.
    shown = _run(aws, "dlq", "show", mid)
    assert shown.exit_code == 0, shown.output
    assert_no_raw_controls(shown.output)
    # The body is shown as JSON, whose escapes keep the ESC and BEL inert.
    assert "\\u001b]0;owned\\u0007" in shown.stdout and "\\x9b" in shown.stdout
    listed = _run(aws, "dlq", "list")
    assert listed.exit_code == 0, listed.output
    assert_no_raw_controls(listed.output)
    assert "bad\\r\\x9b2Jstate: ok" in listed.stdout  # the planted reason, visible
    as_json = json.loads(_run(aws, "dlq", "show", mid, "--json").stdout)
    assert as_json["messages"][0]["body"] == body
