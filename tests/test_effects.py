"""The target-calling helpers map a transport's answer to the intent protocol's three outcomes."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import boto3
import pytest

from sqs_lease import EffectCall, LeaseLost, PermanentError, ToolOutcomeUnknown, TransientError
from sqs_lease.effects import botocore_fence, http_json

CALL = EffectCall("payment:INV-1:capture", 7, "job-1", "capture", "payments", {"amount": 5})


class _Target(BaseHTTPRequestHandler):
    seen: list[dict[str, Any]] = []  # noqa: RUF012 - shared on purpose: the test reads it

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", "0"))
        body = json.loads(self.rfile.read(length) or b"{}")
        _Target.seen.append({"path": self.path, "headers": dict(self.headers), "body": body})
        if self.path == "/slow":
            time.sleep(1.5)
        status = int(self.path.strip("/")) if self.path.strip("/").isdigit() else 201
        payload = json.dumps({"id": "ch_9", "ok": status < 300}).encode()
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


def test_success_sends_key_token_and_payload_and_returns_the_external_id(target: str) -> None:
    _Target.seen.clear()
    result = http_json(CALL, target + "/charge")
    assert result.external_id == "ch_9"
    assert result.response["_status"] == 201
    sent = _Target.seen[-1]
    assert sent["headers"]["Idempotency-Key"] == "payment:INV-1:capture"
    assert sent["headers"]["X-Execution-Fence"] == "7"
    assert sent["body"] == {"amount": 5}


@pytest.mark.parametrize(
    ("status", "error"),
    [
        (412, LeaseLost),  # fenced out: certainly not applied for this token
        (409, ToolOutcomeUnknown),  # the same key is in flight: cannot tell yet
        (500, ToolOutcomeUnknown),
        (503, ToolOutcomeUnknown),
        (429, TransientError),
        (400, PermanentError),
        (422, PermanentError),
    ],
)
def test_status_codes_map_to_the_three_outcomes(
    target: str, status: int, error: type[Exception]
) -> None:
    with pytest.raises(error):
        http_json(CALL, f"{target}/{status}")


def test_a_timeout_after_sending_is_outcome_unknown(target: str) -> None:
    with pytest.raises(ToolOutcomeUnknown):
        http_json(CALL, target + "/slow", timeout=0.3)


def test_a_refused_connection_sent_nothing_so_it_is_transient() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(TransientError):
        http_json(CALL, f"http://127.0.0.1:{port}/charge", timeout=2)


def test_botocore_fence_adds_headers_only_inside_the_block() -> None:
    client = boto3.client(
        "sqs",
        region_name="us-east-1",
        endpoint_url="http://127.0.0.1:9",
        aws_access_key_id="x",
        aws_secret_access_key="x",
    )
    captured: list[dict[str, str]] = []

    def capture(request: Any, **_: Any) -> Any:
        captured.append(
            {k: v.decode() if isinstance(v, bytes) else v for k, v in request.headers.items()}
        )
        raise RuntimeError("stop before the network")

    client.meta.events.register("before-send.*.*", capture)
    with botocore_fence(client, CALL), pytest.raises(RuntimeError):
        client.list_queues()
    with pytest.raises(RuntimeError):
        client.list_queues()
    inside, after = captured
    assert inside["Idempotency-Key"] == "payment:INV-1:capture"
    assert inside["X-Execution-Fence"] == "7"
    assert "Idempotency-Key" not in after and "X-Execution-Fence" not in after
