"""The receiver kit against hostile input (issue 32): no request can raise out, store, or leak.

In process, without a server: the WSGI app is called directly, with a stand-in
receiver that records every call (a write for a refused request is a defect),
and with a real :class:`FencedReceiver` over a DynamoDB client that fails on
purpose. The moto tests of the same rules are in tests/test_receiver.py.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import sys
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any, cast

import botocore.exceptions
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sqs_lease import ConfigError
from sqs_lease._config import Settings
from sqs_lease._journal import Journal
from sqs_lease.effects import fence_headers
from sqs_lease.receiver import (
    MAX_JSON_DEPTH,
    EffectResult,
    Fence,
    FencedReceiver,
    FenceError,
    HttpRequest,
    Plan,
    Reply,
    fenced_wsgi_app,
    parse_json_body,
    payload_hash,
)

ROOT = Path(__file__).resolve().parents[1]
SECRET = b"a-secret-of-at-least-sixteen-bytes"
CHARGE = {"invoice": "inv-1", "amount": 5}


def _load_service() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "receiver_service_hostile", ROOT / "examples" / "receiver_service.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


service = _load_service()


class Recorder:
    """Stands in for FencedReceiver: records every call; writes answer 201."""

    def __init__(self, highest: int | None = None) -> None:
        self.journal = Journal()
        self.calls: list[str] = []
        self.mark = highest

    def apply(self, scope: str, token: int, key: str, payload: Any, effect: Any) -> Reply:
        self.calls.append("apply")
        payload_hash(payload)  # the real receiver hashes what the key promises: must not raise
        return Reply(201, {"ok": True})

    def apply_with_write(
        self, scope: str, token: int, key: str, payload: Any, write: Any, response: Any
    ) -> Reply:
        self.calls.append("apply_with_write")
        payload_hash(payload)
        return Reply(201, {"ok": True})

    def raise_mark(self, scope: str, token: int) -> Reply | None:
        self.calls.append("raise_mark")
        return None

    def check_mark(self, scope: str, token: int) -> Reply | None:
        self.calls.append("check_mark")
        if self.mark is not None and token < self.mark:
            return Reply(412, {"error": "stale_token", "highest": self.mark})
        return None

    @property
    def writes(self) -> list[str]:
        return [c for c in self.calls if c != "check_mark"]


def _app(
    rcv: Any, handler: Callable[[HttpRequest, Fence], Plan] | None = None, **kw: Any
) -> Callable[..., Iterable[bytes]]:
    return fenced_wsgi_app(
        cast(FencedReceiver, rcv), handler or service._charge_plan("t-ledger"), **kw
    )


def call(
    app: Callable[..., Iterable[bytes]],
    headers: Mapping[str, str] | Iterable[tuple[str, str]],
    body: bytes,
    *,
    environ: Mapping[str, Any] | None = None,
) -> tuple[int, dict[str, str], Any]:
    """One request through a WSGI app; headers become HTTP_* keys as a WSGI server makes them."""
    env: dict[str, Any] = {
        "REQUEST_METHOD": "POST",
        "PATH_INFO": "/charge",
        "QUERY_STRING": "",
        "CONTENT_TYPE": "application/json",
        "CONTENT_LENGTH": str(len(body)),
        "wsgi.input": io.BytesIO(body),
    }
    pairs = headers.items() if isinstance(headers, Mapping) else headers
    for name, value in pairs:
        k = "HTTP_" + name.upper().replace("-", "_")
        env[k] = f"{env[k]},{value}" if k in env else value  # how wsgiref joins repeats
    env.update(environ or {})
    seen: dict[str, Any] = {}

    def start_response(status: str, hdrs: list[tuple[str, str]], exc_info: Any = None) -> Any:
        seen["status"], seen["headers"] = int(status.split()[0]), dict(hdrs)

    raw = b"".join(app(env, start_response))
    return seen["status"], seen["headers"], json.loads(raw)


def signed(key: str = "k-1", scope: str = "job-1", token: int = 1) -> dict[str, str]:
    return fence_headers(key, scope, token, secret=SECRET)


def unsigned(key: str = "k-1", scope: str = "job-1", token: int = 1) -> dict[str, str]:
    return fence_headers(key, scope, token)


# --- item 1: the parser ---------------------------------------------------------------------

HOSTILE_BODIES: list[tuple[str, bytes]] = [
    ("deep_list", b"[" * 2000),
    ("deep_list_closed", b"[" * 2000 + b"]" * 2000),
    ("deep_object", b'{"a":' * 2000 + b"1" + b"}" * 2000),
    ("deep_in_value", b'{"invoice":' + b"[" * 5000 + b"]" * 5000 + b',"amount":1}'),
    ("huge_int", b'{"invoice":"i","amount":' + b"9" * 5000 + b"}"),
    ("huge_exponent", b'{"invoice":"i","amount":1e999999}'),
    ("nan", b'{"invoice":"i","amount":NaN}'),
    ("infinity", b'{"invoice":"i","amount":-Infinity}'),
    ("invalid_utf8", b'{"invoice":"\xff\xfe","amount":1}'),
    ("utf8_surrogate", b'{"invoice":"\xed\xa0\x80","amount":1}'),
    ("lone_surrogate_escape", b'{"invoice":"\\ud800","amount":1}'),
    ("lone_low_surrogate_key", b'{"\\udc00":1,"invoice":"i","amount":1}'),
    ("utf16", '{"invoice":"i","amount":1}'.encode("utf-16")),
    ("nul_raw", b'{"invoice":"i\x00","amount":1}'),
    ("bom", b'\xef\xbb\xbf{"invoice":"i","amount":1}'),
]


@pytest.mark.parametrize(("name", "body"), HOSTILE_BODIES, ids=[n for n, _ in HOSTILE_BODIES])
def test_parse_json_body_refuses_hostile_bodies_with_a_value_error(name: str, body: bytes) -> None:
    with pytest.raises(ValueError) as err:
        parse_json_body(body)
    assert str(err.value)


def test_parse_json_body_keeps_what_json_allows() -> None:
    assert parse_json_body(b'{"invoice":"i\\u0000","amount":1}') == {
        "invoice": "i\x00",
        "amount": 1,
    }
    assert parse_json_body('{"a":"\\ud83d\\ude00 ü"}'.encode()) == {"a": "\U0001f600 ü"}
    nested = b"[" * MAX_JSON_DEPTH + b"]" * MAX_JSON_DEPTH
    assert parse_json_body(nested) is not None
    with pytest.raises(ValueError, match="nest"):
        parse_json_body(b"[" + nested + b"]")
    assert parse_json_body(b"") is None  # an empty body is JSON null, as before
    # Brackets inside strings are text, not nesting.
    assert parse_json_body(b'["' + b"[" * 5000 + b'"]') == ["[" * 5000]


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=200, deadline=None)
@given(json_values)
def test_property_every_json_value_round_trips(value: Any) -> None:
    text = json.dumps(value, ensure_ascii=False)
    try:
        text.encode()
    except UnicodeEncodeError:  # hypothesis drew a lone surrogate: refused, never raised
        with pytest.raises(ValueError):
            parse_json_body(json.dumps(value).encode())
        return
    assert parse_json_body(text.encode()) == value
    assert parse_json_body(json.dumps(value).encode()) == value


def _nest(depth: int, inner: bytes) -> bytes:
    return b"[" * depth + inner + b"]" * depth


hostile_bytes = st.one_of(
    st.binary(max_size=2000),
    st.integers(1, 20000).map(lambda n: b"[" * n),
    st.integers(1, 20000).map(lambda n: b'{"a":' * n),
    st.tuples(st.integers(0, 3000), st.sampled_from([b"1", b'"x"', b"{}"])).map(
        lambda t: _nest(*t)
    ),
    st.integers(1, 10000).map(lambda n: b"1" * n),
    st.integers(1, 10000).map(lambda n: b"1e" + b"9" * n),
    st.sampled_from([b"NaN", b"Infinity", b"-Infinity", b"1e400", b"-1e400"]),
    st.text().map(lambda t: json.dumps(t).encode()),  # escaped: lone surrogates as \udXXX
    st.text().map(lambda t: t.encode("utf-8", "surrogatepass")),
    st.integers(0, 300_000).map(lambda n: b'"' + b"x" * n + b'"'),
    st.lists(st.sampled_from([b"[", b"]", b"{", b"}", b'"', b"\\", b":", b",", b"\x00", b"1"])).map(
        b"".join
    ),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hostile_bytes)
def test_property_parse_json_body_answers_or_raises_value_error(body: bytes) -> None:
    try:
        value = parse_json_body(body)
    except ValueError:
        return
    # What it returns is storable: valid UTF-8 text once dumped, within the nesting bound.
    json.dumps(value, ensure_ascii=False).encode()
    json.loads(json.dumps(value))


# --- item 1: the app never raises, answers 4xx, stores nothing ----------------------------


@pytest.mark.parametrize(("name", "body"), HOSTILE_BODIES, ids=[n for n, _ in HOSTILE_BODIES])
def test_a_hostile_body_is_a_400_and_stores_nothing(name: str, body: bytes) -> None:
    rcv = Recorder()
    status, _, answer = call(_app(rcv, fence_secrets=[SECRET]), signed(), body)
    assert status == 400, answer
    assert answer["error"] == "invalid_request"
    assert rcv.writes == []


header_text = st.text(st.characters(max_codepoint=255), max_size=300)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    body=hostile_bytes | st.just(json.dumps(CHARGE).encode()),
    key=header_text | st.just("k-1"),
    scope=header_text | st.just("job-1"),
    token=header_text | st.just("1") | st.just(str(2**63 - 1)),
    sign=st.booleans(),
)
def test_property_no_request_raises_out_or_stores_when_refused(
    body: bytes, key: str, scope: str, token: str, sign: bool
) -> None:
    rcv = Recorder()
    headers = {"Idempotency-Key": key, "X-Execution-Fence-Scope": scope, "X-Execution-Fence": token}
    if sign:
        with contextlib.suppress(ValueError, FenceError):  # not every drawn fence can be signed
            headers = fence_headers(key, scope, int(token), secret=SECRET)
    status, _, answer = call(_app(rcv, fence_secrets=[SECRET]), headers, body)
    assert status in (201, 400, 403, 413), answer
    if status != 201:
        assert rcv.writes == [], (status, answer)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    body=hostile_bytes
    | json_values.map(lambda v: json.dumps(v).encode())
    | st.builds(
        lambda invoice, amount: json.dumps({"invoice": invoice, "amount": amount}).encode(),
        st.text(max_size=300) | st.integers() | st.none(),
        st.integers() | st.floats() | st.text(max_size=5),
    )
)
def test_property_a_signed_request_with_any_body_is_stored_only_when_valid(body: bytes) -> None:
    rcv = Recorder()
    status, _, answer = call(_app(rcv, fence_secrets=[SECRET]), signed(), body)
    if status == 201:
        assert rcv.writes == ["apply_with_write"]
        invoice, amount = service._charge(HttpRequest("POST", "/charge", "", {}, body))
        assert invoice and amount > 0
    else:
        assert (status, answer["error"]) == (400, "invalid_request")
        assert rcv.writes == []


@pytest.mark.parametrize(
    ("header", "value"),
    [
        ("Idempotency-Key", "k\x00-1"),
        ("Idempotency-Key", "k\x1b]0;owned\x07"),
        ("Idempotency-Key", "k\r\nX-Injected: 1"),
        ("Idempotency-Key", "k\x7f"),
        ("Idempotency-Key", "k\x9b31m"),
        ("Idempotency-Key", "inv%E2%80%AEcod"),  # a bidi override, percent-encoded
        ("Idempotency-Key", "inv%E2%80%8B1"),  # a zero-width space
        ("X-Execution-Fence-Scope", "job%00"),
        ("X-Execution-Fence-Scope", "job%1B%5B2J"),
        ("X-Execution-Fence-Scope", "job%0D%0Astate%3A%20succeeded"),
        ("X-Execution-Fence-Scope", "job%C2%9B"),
        ("X-Execution-Fence-Scope", "job%E2%80%A8"),
    ],
)
def test_control_characters_in_the_key_or_decoded_scope_are_a_400(header: str, value: str) -> None:
    rcv = Recorder()
    headers = {**unsigned(), header: value}
    status, _, answer = call(_app(rcv, unsigned_fences=True), headers, json.dumps(CHARGE).encode())
    assert (status, answer["error"], answer["header"]) == (400, "invalid_header", header)
    assert rcv.calls == []


@pytest.mark.parametrize(
    "bad", ["job\x00", "job\x1b[2J", "job\r\n", "j\u2028", "inv\u202ecod", "k\u200b1"]
)
def test_apply_refuses_a_control_character_in_scope_or_key(bad: str) -> None:
    rcv = FencedReceiver(Settings(prefix="x"), client=object())
    with pytest.raises(FenceError, match="control"):
        rcv.apply(bad, 1, "k", {}, lambda: EffectResult())
    with pytest.raises(FenceError, match="control"):
        rcv.apply("job", 1, bad, {}, lambda: EffectResult())


@pytest.mark.parametrize(
    "header", ["Idempotency-Key", "X-Execution-Fence-Scope", "X-Execution-Fence"]
)
def test_a_header_sent_twice_or_with_its_underscore_twin_is_refused(header: str) -> None:
    # wsgiref (and others) turn X-Execution-Fence and X_Execution_Fence into one
    # HTTP_X_EXECUTION_FENCE and join the values with ",": the receiver cannot tell
    # which was meant, so it refuses both.
    rcv = Recorder()
    twin = header.replace("-", "_")
    first = unsigned()[header]
    headers = [*unsigned().items(), (twin, first + "9")]
    status, _, answer = call(_app(rcv, unsigned_fences=True), headers, json.dumps(CHARGE).encode())
    assert (status, answer["error"], answer["header"]) == (400, "ambiguous_header", header)
    assert rcv.calls == []


def test_a_negative_content_length_is_a_400() -> None:
    rcv = Recorder()
    status, _, answer = call(
        _app(rcv, fence_secrets=[SECRET]), signed(), b"", environ={"CONTENT_LENGTH": "-5"}
    )
    assert (status, answer["header"]) == (400, "Content-Length")


def test_a_handler_that_raises_is_a_generic_500_and_stores_nothing() -> None:
    rcv = Recorder()

    def broken(req: HttpRequest, fence: Fence) -> Plan:
        raise KeyError("secret internal detail")

    status, _, answer = call(_app(rcv, broken, fence_secrets=[SECRET]), signed(), b"{}")
    assert status == 500 and answer == {"error": "internal_error"}
    assert rcv.writes == []


# --- item 2: signed fences by default; a refused request raises no mark -----------------------


def test_the_app_refuses_to_start_without_a_secret_or_an_explicit_opt_out() -> None:
    with pytest.raises(ConfigError, match=r"fence_secrets.*unsigned_fences=True"):
        _app(Recorder())
    with pytest.raises(ConfigError, match="both"):
        _app(Recorder(), fence_secrets=[SECRET], unsigned_fences=True)
    with pytest.raises(ConfigError, match="16 bytes"):
        _app(Recorder(), fence_secrets=[b"short"])
    _app(Recorder(), unsigned_fences=True)  # knowingly: fine


def test_an_unsigned_request_is_refused_by_default() -> None:
    rcv = Recorder()
    app = _app(rcv, fence_secrets=[SECRET])
    status, _, answer = call(app, unsigned(token=2**63 - 1), json.dumps(CHARGE).encode())
    assert (status, answer["header"]) == (400, "X-Execution-Fence-Signature")
    forged = fence_headers("k-1", "job-1", 2**63 - 1, secret=b"a-guess-at-the-secret-value")
    assert call(app, forged, json.dumps(CHARGE).encode())[0] == 403
    assert rcv.calls == []


def test_a_request_that_fails_validation_raises_no_mark_but_a_stale_one_still_gets_412() -> None:
    rcv = Recorder(highest=5)
    app = _app(rcv, fence_secrets=[SECRET])
    bad = json.dumps({"invoice": "", "amount": 1}).encode()
    status, _, answer = call(app, signed(token=2**63 - 1), bad)
    assert (status, answer["error"]) == (400, "invalid_request")
    assert rcv.writes == [] and rcv.calls == ["check_mark"]
    assert call(app, signed(token=4), bad)[:1] == (412,)  # an older owner learns it lost
    assert rcv.writes == []


# --- item 5: the store's trouble is logged, not told; permanent trouble is not "retry" ----------

ARN = "arn:aws:iam::123456789012:role/receiver-secret-role"
ENDPOINT = "https://dynamodb.eu-west-1.amazonaws.com/secret-path"


class FailingClient:
    """A DynamoDB client whose every write fails with ``exc``."""

    def __init__(self, exc: Exception) -> None:
        self.exc = exc

    def transact_write_items(self, **_: Any) -> Any:
        raise self.exc

    def update_item(self, **_: Any) -> Any:
        raise self.exc

    def get_item(self, **_: Any) -> Any:
        return {}

    def delete_item(self, **_: Any) -> Any:
        raise self.exc


def _client_error(code: str, message: str, status: int = 400) -> botocore.exceptions.ClientError:
    response: Any = {
        "Error": {"Code": code, "Message": message},
        "ResponseMetadata": {"HTTPStatusCode": status},
    }
    return botocore.exceptions.ClientError(response, "TransactWriteItems")


@pytest.mark.parametrize(
    ("exc", "status", "error"),
    [
        (
            _client_error("AccessDeniedException", f"User: {ARN} is not authorized"),
            422,
            "receiver_misconfigured",
        ),
        (
            _client_error("ValidationException", f"Item size too large for {ARN}"),
            422,
            "request_not_storable",
        ),
        (
            _client_error("ResourceNotFoundException", f"Requested resource not found {ARN}"),
            422,
            "receiver_misconfigured",
        ),
        (
            botocore.exceptions.EndpointConnectionError(endpoint_url=ENDPOINT),
            503,
            "receiver_unavailable",
        ),
        (_client_error("ThrottlingException", f"slow down {ARN}"), 503, "receiver_unavailable"),
        (
            _client_error("InternalServerError", f"oops at {ENDPOINT}", 500),
            503,
            "receiver_unavailable",
        ),
    ],
)
def test_store_failures_answer_a_code_and_a_generic_message(
    exc: Exception, status: int, error: str, caplog: pytest.LogCaptureFixture
) -> None:
    rcv = FencedReceiver(Settings(prefix="x"), client=FailingClient(exc))
    app = fenced_wsgi_app(rcv, service._charge_plan("t-ledger"), fence_secrets=[SECRET])
    got, headers, answer = call(app, signed(), json.dumps(CHARGE).encode())
    assert (got, answer["error"]) == (status, error)
    text = json.dumps(answer)
    for secret_text in ("arn:", "123456789012", "amazonaws", "secret-path", "http"):
        assert secret_text not in text
    assert ("Retry-After" in headers) == (status == 503)
    assert ("retry with the same key" if status == 503 else "nothing was applied") in answer[
        "message"
    ]
    # The operator's log has the detail the caller is not told.
    logged = " ".join(r.getMessage() for r in caplog.records)
    assert ARN in logged or ENDPOINT in logged or "table missing" in logged


def test_an_effect_whose_response_cannot_be_stored_is_a_500_not_a_retry() -> None:
    class StoreFailsAfter(FailingClient):
        def transact_write_items(self, **_: Any) -> Any:
            return {}

    exc = _client_error("AccessDeniedException", f"User: {ARN} is not authorized")
    rcv = FencedReceiver(Settings(prefix="x"), client=StoreFailsAfter(exc))

    def plan(req: HttpRequest, fence: Fence) -> Plan:
        return lambda: EffectResult(201, {"ok": True})

    got, headers, answer = call(fenced_wsgi_app(rcv, plan, fence_secrets=[SECRET]), signed(), b"{}")
    assert (got, answer["error"]) == (500, "effect_outcome_unknown")
    assert "Retry-After" not in headers and "arn:" not in json.dumps(answer)
