"""The target-calling helpers map a transport's answer to the intent protocol's three outcomes."""

from __future__ import annotations

import dataclasses
import json
import socket
import socketserver
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import boto3
import pytest

from sqs_lease import EffectCall, FenceRefused, LeaseLost, ToolNotApplied, ToolOutcomeUnknown
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
        self.send_header("X-Request-Id", "req-42")
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
    assert sent["headers"]["X-Execution-Fence-Scope"] == "job-1"  # tokens are ordered per job
    assert sent["body"] == {"amount": 5}


def test_the_targets_request_id_header_comes_back_with_the_result(target: str) -> None:
    call = EffectCall("k-rid", 3, "job-1", "capture", "payments", {"amount": 5})
    result = http_json(call, f"{target}/201", id_field="id")
    assert result.request_id == "req-42"


@pytest.mark.parametrize(
    ("status", "error", "retry"),
    [
        (412, FenceRefused, None),  # fenced out: certainly not applied for this token
        (409, ToolOutcomeUnknown, None),  # the same key is in flight: cannot tell yet
        (500, ToolOutcomeUnknown, None),
        (503, ToolOutcomeUnknown, None),
        (429, ToolNotApplied, True),  # the target refused it for now
        (400, ToolNotApplied, False),  # the target rejected it for good
        (422, ToolNotApplied, False),
    ],
)
def test_status_codes_map_to_the_three_outcomes(
    target: str, status: int, error: type[Exception], retry: bool | None
) -> None:
    with pytest.raises(error) as caught:
        http_json(CALL, f"{target}/{status}")
    if retry is not None:
        assert isinstance(caught.value, ToolNotApplied) and caught.value.retry is retry
    if status == 412:  # a lease loss for the attempt, whatever catches LeaseLost
        assert isinstance(caught.value, LeaseLost)


def test_a_timeout_after_sending_is_outcome_unknown(target: str) -> None:
    with pytest.raises(ToolOutcomeUnknown):
        http_json(CALL, target + "/slow", timeout=0.3)


def test_the_effect_calls_timeout_is_the_socket_timeout_unless_one_is_given(target: str) -> None:
    # /slow answers after 1.5 s: past a 0.3 s effect timeout, well inside the default.
    short = dataclasses.replace(CALL, timeout=0.3)
    with pytest.raises(ToolOutcomeUnknown):
        http_json(short, target + "/slow")
    assert CALL.timeout == 60.0
    assert http_json(CALL, target + "/slow").external_id == "ch_9"
    assert http_json(short, target + "/slow", timeout=30).external_id == "ch_9"


def test_a_refused_connection_sent_nothing_so_it_is_not_applied() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(ToolNotApplied) as caught:
        http_json(CALL, f"http://127.0.0.1:{port}/charge", timeout=2)
    assert (caught.value.code, caught.value.retry) == ("refused", True)


def test_a_name_that_does_not_resolve_sent_nothing_so_it_is_not_applied() -> None:
    # .invalid never resolves (RFC 2606): the lookup fails before any connection.
    with pytest.raises(ToolNotApplied) as caught:
        http_json(CALL, "http://no-such-target.invalid/charge", timeout=2)
    assert caught.value.code == "dns"


# ----------------------------------------------------------------- answers cut short


class _RawServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


def _read_request(conn: socket.socket) -> bytes:
    """Read one whole HTTP request (headers and Content-Length body)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    while len(body) < length:
        chunk = conn.recv(65536)
        if not chunk:
            break
        body += chunk
    return head + b"\r\n\r\n" + body


def _serve_raw(answer: Callable[[socket.socket], None]) -> tuple[_RawServer, str, list[bytes]]:
    """A target on 127.0.0.1 that reads each request whole (the effect may apply) and
    then answers with ``answer`` (which may cut the response or the connection)."""
    seen: list[bytes] = []

    class Handler(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            conn: socket.socket = self.request
            seen.append(_read_request(conn))
            answer(conn)

    server = _RawServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/charge", seen


def _half_a_response(conn: socket.socket) -> None:
    body = json.dumps({"id": "ch_half", "ok": True}).encode()
    head = (
        "HTTP/1.1 201 Created\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode()
    conn.sendall(head + body[: len(body) // 2])
    conn.shutdown(socket.SHUT_RDWR)


def _drop_the_connection(conn: socket.socket) -> None:
    conn.shutdown(socket.SHUT_RDWR)


def _reset_the_connection(conn: socket.socket) -> None:
    # SO_LINGER 0: close sends a RST instead of a FIN.
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    conn.close()


def _garbage_status_line(conn: socket.socket) -> None:
    conn.sendall(b"HTTP/1.1 abc what\r\n\r\n")
    conn.shutdown(socket.SHUT_RDWR)


@pytest.mark.parametrize(
    "answer",
    [_half_a_response, _drop_the_connection, _reset_the_connection, _garbage_status_line],
    ids=["response_cut_in_half", "dropped_after_reading", "reset_after_reading", "bad_status"],
)
def test_a_failure_after_the_request_was_sent_is_outcome_unknown(
    answer: Callable[[socket.socket], None],
) -> None:
    # Issue 7.2: these escaped as plain exceptions (IncompleteRead, RemoteDisconnected,
    # BadStatusLine...), which the effect flow took for "not applied" and repeated.
    server, url, seen = _serve_raw(answer)
    try:
        with pytest.raises(ToolOutcomeUnknown):
            http_json(CALL, url, timeout=10)
    finally:
        server.shutdown()
        server.server_close()
    assert len(seen) == 1 and b"Idempotency-Key: payment:INV-1:capture" in seen[0]


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
    assert inside["X-Execution-Fence-Scope"] == "job-1"
    assert "X-Execution-Fence-Signature" not in inside
    assert "Idempotency-Key" not in after and "X-Execution-Fence" not in after
    with botocore_fence(client, CALL, secret=b"k"), pytest.raises(RuntimeError):
        client.list_queues()
    signed = captured[-1]
    assert (
        signed["X-Execution-Fence-Signature"]
        == CALL.signed_headers(b"k")["X-Execution-Fence-Signature"]
    )


def test_the_scope_header_is_the_job_id_percent_encoded() -> None:
    call = EffectCall("k", 3, "orders/ä 1", "capture", "payments", {})
    assert call.headers == {
        "Idempotency-Key": "k",
        "X-Execution-Fence-Scope": "orders%2F%C3%A4%201",
        "X-Execution-Fence": "3",
    }
    assert set(call.signed_headers(b"s")) == {*call.headers, "X-Execution-Fence-Signature"}
