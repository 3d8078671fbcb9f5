"""The fenced receiver kit against a real moto server over HTTP."""

from __future__ import annotations

import http.client
import importlib.util
import json
import os
import subprocess
import sys
import threading
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from conftest import AwsTestEnv
from worker_helpers import HANG_GUARD

from sqs_lease import ConfigError, EffectCall
from sqs_lease._aws import make_client
from sqs_lease._config import Settings
from sqs_lease.effects import fence_headers
from sqs_lease.receiver import (
    DEFAULT_MARK_RETENTION,
    DEFAULT_RECORD_RETENTION,
    MAX_TOKEN,
    MIN_MARK_RETENTION,
    EffectResult,
    Fence,
    FencedReceiver,
    FenceError,
    Reply,
    RetryableEffectError,
    create_receiver_tables,
    parse_fence,
    payload_hash,
)

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]
SERVICE_PATH = ROOT / "examples" / "receiver_service.py"


def _load_service() -> ModuleType:
    # examples/ is not a package; load the example by path so it is tested as users run it.
    spec = importlib.util.spec_from_file_location("receiver_service", SERVICE_PATH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


service = _load_service()


class Counter:
    """An effect that counts its runs."""

    def __init__(self, result: EffectResult | None = None) -> None:
        self.calls = 0
        self.result = result or EffectResult(200, {"ok": True}, external_id="ext-1")

    def __call__(self) -> EffectResult:
        self.calls += 1
        return self.result


@pytest.fixture
def settings(aws: AwsTestEnv) -> Settings:
    s = Settings(endpoint_url=aws.endpoint_url, prefix=aws.prefix)
    create_receiver_tables(s)
    return s


@pytest.fixture
def rcv(settings: Settings) -> FencedReceiver:
    return FencedReceiver(settings)


def key() -> str:
    return f"k-{uuid.uuid4().hex}"


PAYLOAD = {"amount": 10, "to": "acct-1"}


def test_create_tables_is_idempotent(settings: Settings) -> None:
    names = create_receiver_tables(settings)
    assert names == [f"{settings.prefix}-fences", f"{settings.prefix}-idempotency"]
    ddb = make_client(settings, "dynamodb")
    # DescribeTable, not ListTables: the latter pages at 100 names, and the shared
    # test server holds more tables than that.
    for name in names:
        assert ddb.describe_table(TableName=name)["Table"]["TableName"] == name
    assert create_receiver_tables(settings) == names  # idempotent


def test_payload_hash_is_canonical() -> None:
    assert payload_hash({"a": 1, "b": [1, 2]}) == payload_hash({"b": [1, 2], "a": 1})
    assert payload_hash(b'{"a":1}') == payload_hash('{"a":1}') == payload_hash({"a": 1})
    assert payload_hash({"a": 1}) != payload_hash({"a": 2})


def test_first_apply_runs_effect_and_sets_mark(rcv: FencedReceiver) -> None:
    effect = Counter()
    k = key()
    reply = rcv.apply("acct-1", 3, k, PAYLOAD, effect)
    assert reply == Reply(200, {"ok": True}, replayed=False, external_id="ext-1")
    assert effect.calls == 1
    assert rcv.highest("acct-1") == 3
    rec = rcv.record(k)
    assert rec is not None and rec.state == "done" and int(rec.token) == 3


def test_stale_token_rejected_even_with_new_key(rcv: FencedReceiver) -> None:
    rcv.apply("acct-1", 5, key(), PAYLOAD, Counter())
    effect = Counter()
    k = key()
    reply = rcv.apply("acct-1", 4, k, PAYLOAD, effect)
    assert reply == Reply(412, {"error": "stale_token", "highest": 5})
    assert effect.calls == 0
    assert rcv.record(k) is None  # the cancelled transaction left no record behind
    assert rcv.highest("acct-1") == 5


def test_equal_token_accepted_for_two_keys(rcv: FencedReceiver) -> None:
    effect = Counter()
    assert rcv.apply("acct-1", 7, key(), PAYLOAD, effect).status == 200
    assert rcv.apply("acct-1", 7, key(), PAYLOAD, effect).status == 200
    assert effect.calls == 2
    assert rcv.highest("acct-1") == 7


def test_higher_token_raises_mark_per_resource(rcv: FencedReceiver) -> None:
    rcv.apply("acct-1", 1, key(), PAYLOAD, Counter())
    assert rcv.apply("acct-1", 9, key(), PAYLOAD, Counter()).status == 200
    assert rcv.highest("acct-1") == 9
    # Marks are per resource: a low token elsewhere is fine.
    assert rcv.apply("acct-2", 1, key(), PAYLOAD, Counter()).status == 200
    assert rcv.apply("acct-1", 8, key(), PAYLOAD, Counter()).status == 412


def test_repeated_key_replays_without_running_effect(rcv: FencedReceiver) -> None:
    effect = Counter(EffectResult(201, {"id": "pay_1", "n": [1, 2]}, external_id="pay_1"))
    k = key()
    first = rcv.apply("job-1", 2, k, PAYLOAD, effect)
    # Same key from the same owner, from a new owner (higher token), from another job: replays.
    again = rcv.apply("job-1", 2, k, PAYLOAD, effect)
    newer = rcv.apply("job-1", 3, k, PAYLOAD, effect)
    other_job = rcv.apply("job-2", 1, k, PAYLOAD, effect)
    assert effect.calls == 1
    assert first == Reply(201, {"id": "pay_1", "n": [1, 2]}, external_id="pay_1")
    replay = Reply(201, first.body, replayed=True, external_id="pay_1")
    assert again == newer == other_job == replay


def test_stored_error_is_replayed(rcv: FencedReceiver) -> None:
    calls = 0

    def boom() -> EffectResult:
        nonlocal calls
        calls += 1
        raise RuntimeError("card network said no")

    k = key()
    first = rcv.apply("acct-1", 1, k, PAYLOAD, boom)
    assert first == Reply(500, {"error": "effect_failed", "type": "RuntimeError"})
    again = rcv.apply("acct-1", 1, k, PAYLOAD, boom)
    assert again == Reply(500, first.body, replayed=True)
    assert calls == 1


def test_effect_error_status_replayed_exactly(rcv: FencedReceiver) -> None:
    effect = Counter(EffectResult(402, {"error": "card_declined"}))
    k = key()
    assert rcv.apply("acct-1", 1, k, PAYLOAD, effect) == Reply(402, {"error": "card_declined"})
    replay = rcv.apply("acct-1", 1, k, PAYLOAD, effect)
    assert (replay.status, replay.body, replay.replayed) == (402, {"error": "card_declined"}, True)
    assert effect.calls == 1


def test_fencing_beats_replay(rcv: FencedReceiver) -> None:
    k = key()
    effect = Counter()
    rcv.apply("acct-1", 3, k, PAYLOAD, effect)
    rcv.apply("acct-1", 4, key(), PAYLOAD, effect)
    # The stale worker's retry of its own completed key gets no stored response.
    assert rcv.apply("acct-1", 3, k, PAYLOAD, effect).body == {
        "error": "stale_token",
        "highest": 4,
    }
    assert rcv.apply("acct-1", 4, k, PAYLOAD, effect).replayed
    assert effect.calls == 2


def test_in_flight_key_answers_409(rcv: FencedReceiver) -> None:
    started, release = threading.Event(), threading.Event()
    results: list[Reply] = []
    k = key()

    def slow() -> EffectResult:
        started.set()
        assert release.wait(HANG_GUARD)
        return EffectResult(200, {"slow": True})

    t = threading.Thread(target=lambda: results.append(rcv.apply("acct-1", 1, k, PAYLOAD, slow)))
    t.start()
    try:
        assert started.wait(HANG_GUARD)
        effect = Counter()
        second = rcv.apply("acct-1", 1, k, PAYLOAD, effect)
        assert second == Reply(
            409, {"error": "in_flight", "message": "request with this key is in flight"}
        )
        assert effect.calls == 0
    finally:
        release.set()
        t.join(20)
    assert results == [Reply(200, {"slow": True})]
    assert rcv.apply("acct-1", 1, k, PAYLOAD, Counter()) == Reply(
        200, {"slow": True}, replayed=True
    )


def test_changed_payload_is_422(rcv: FencedReceiver) -> None:
    k = key()
    effect = Counter()
    rcv.apply("acct-1", 1, k, PAYLOAD, effect)
    reply = rcv.apply("acct-1", 1, k, {**PAYLOAD, "amount": 11}, effect)
    assert reply.status == 422
    assert reply.body["message"] == "idempotency key reused with a different payload"
    assert effect.calls == 1


def test_retryable_effect_error_clears_the_key(rcv: FencedReceiver) -> None:
    k = key()

    def not_applied() -> EffectResult:
        raise RetryableEffectError("upstream down, nothing sent")

    reply = rcv.apply("acct-1", 1, k, PAYLOAD, not_applied)
    assert reply.status == 503 and reply.body["error"] == "effect_not_applied"
    assert rcv.record(k) is None
    effect = Counter()
    assert rcv.apply("acct-1", 1, k, PAYLOAD, effect) == Reply(
        200, {"ok": True}, external_id="ext-1"
    )
    assert effect.calls == 1


def test_release_frees_a_stuck_in_flight_key(rcv: FencedReceiver) -> None:
    k = key()
    started, release = threading.Event(), threading.Event()

    def slow() -> EffectResult:
        started.set()
        release.wait(HANG_GUARD)
        return EffectResult(200, {})

    t = threading.Thread(target=rcv.apply, args=("acct-1", 1, k, PAYLOAD, slow))
    t.start()
    try:
        assert started.wait(HANG_GUARD)
        assert rcv.release(k) is True
        assert rcv.record(k) is None
    finally:
        release.set()
        t.join(20)
    assert rcv.release(k) is False  # nothing in flight any more


class LostFirstAnswer:
    """A client whose first transaction answer is lost: the SDK retries a committed call."""

    def __init__(self, client: Any) -> None:
        self._client = client

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    def transact_write_items(self, **params: Any) -> Any:
        self._client.transact_write_items(**params)
        return self._client.transact_write_items(**params)


def test_own_commit_with_lost_answer_is_recognised(settings: Settings) -> None:
    rcv = FencedReceiver(settings, client=LostFirstAnswer(make_client(settings, "dynamodb")))
    effect = Counter()
    assert rcv.apply("acct-1", 1, key(), PAYLOAD, effect).status == 200
    assert effect.calls == 1
    ledger = service.create_ledger_table(settings, settings.prefix)
    k = key()
    reply = rcv.apply_with_write(
        "acct-1", 1, k, PAYLOAD, _ledger_put(ledger, k, 1), EffectResult(201, {"c": 1})
    )
    assert reply == Reply(201, {"c": 1})


# --- apply_with_write ----------------------------------------------------------------


def _ledger_put(table: str, k: str, token: int) -> dict[str, Any]:
    row = service.LedgerEntry(
        idem_key=k,
        charge_id=f"ch_{k}",
        invoice="inv-1",
        amount=5,
        scope="job-1",
        token=token,
        applied_at=1.0,
    )
    put: dict[str, Any] = service.put_entry(
        row, table, service.LedgerEntry.idem_key.does_not_exist()
    )
    return put


@pytest.fixture
def ledger(settings: Settings) -> str:
    name: str = service.create_ledger_table(settings, settings.prefix)
    return name


def _row(settings: Settings, table: str, k: str) -> Mapping[str, Any] | None:
    ddb = make_client(settings, "dynamodb")
    item: Mapping[str, Any] | None = ddb.get_item(
        TableName=table, Key={"idem_key": {"S": k}}, ConsistentRead=True
    ).get("Item")
    return item


def test_apply_with_write_commits_mark_record_and_row_together(
    settings: Settings, rcv: FencedReceiver, ledger: str
) -> None:
    k = key()
    resp = EffectResult(201, {"charge_id": "ch_1"}, external_id="ch_1")
    reply = rcv.apply_with_write("invoice:1", 4, k, PAYLOAD, _ledger_put(ledger, k, 4), resp)
    assert reply == Reply(201, {"charge_id": "ch_1"}, external_id="ch_1")
    assert rcv.highest("invoice:1") == 4
    rec = rcv.record(k)
    assert rec is not None and rec.state == "done" and rec.external_id == "ch_1"
    row = _row(settings, ledger, k)
    assert row is not None and row["token"] == {"N": "4"}
    # A repeat replays and writes nothing new.
    again = rcv.apply_with_write("invoice:1", 4, k, PAYLOAD, _ledger_put(ledger, k, 4), resp)
    assert again == Reply(201, {"charge_id": "ch_1"}, replayed=True, external_id="ch_1")


def test_apply_with_write_stale_token_leaves_no_row(
    settings: Settings, rcv: FencedReceiver, ledger: str
) -> None:
    rcv.apply_with_write(
        "invoice:1", 6, key(), PAYLOAD, _ledger_put(ledger, key(), 6), EffectResult()
    )
    k = key()
    reply = rcv.apply_with_write(
        "invoice:1", 5, k, PAYLOAD, _ledger_put(ledger, k, 5), EffectResult(201, {})
    )
    assert reply == Reply(412, {"error": "stale_token", "highest": 6})
    assert _row(settings, ledger, k) is None
    assert rcv.record(k) is None


def test_apply_with_write_own_condition_failure_commits_nothing_but_the_mark(
    settings: Settings, rcv: FencedReceiver, ledger: str
) -> None:
    k = key()
    make_client(settings, "dynamodb").put_item(**_ledger_put(ledger, k, 0)["Put"])
    reply = rcv.apply_with_write("job-9", 2, k, PAYLOAD, _ledger_put(ledger, k, 2), EffectResult())
    assert reply.status == 409 and reply.body["error"] == "write_condition_failed"
    assert rcv.record(k) is None  # nothing of the effect committed
    # A newer owner's request raises the mark whatever the answer (issue 14, item 3).
    assert rcv.highest("job-9") == 2


def test_apply_with_write_rejects_a_malformed_write(rcv: FencedReceiver) -> None:
    with pytest.raises(ValueError, match="TransactWriteItems"):
        rcv.apply_with_write("r", 1, key(), PAYLOAD, {"Get": {}}, EffectResult())


def test_bad_arguments(rcv: FencedReceiver) -> None:
    with pytest.raises(ValueError, match="token"):
        rcv.apply("r", -1, key(), PAYLOAD, Counter())
    with pytest.raises(ValueError, match="idempotency key"):
        rcv.apply("r", 1, "", PAYLOAD, Counter())


# --- the example HTTP service ------------------------------------------------------------


def _http(
    url: str, method: str = "GET", body: Any = None, headers: Mapping[str, str] | None = None
) -> tuple[int, Mapping[str, str], Any]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers=dict(headers or {}))
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, dict(resp.headers), json.loads(resp.read())
    except urllib.error.HTTPError as err:
        with err:
            return err.code, dict(err.headers), json.loads(err.read())


@pytest.fixture
def service_url(settings: Settings) -> Iterator[str]:
    service.create_ledger_table(settings, settings.prefix)
    # Unsigned knowingly: these tests pin the wire format with hand-written headers.
    server, url = service.serve(settings, settings.prefix, 0, unsigned_fences=True)
    try:
        yield str(url)
    finally:
        server.shutdown()
        server.server_close()


def _fence(k: str, token: int, scope: str = "job-1") -> dict[str, str]:
    # Spelled out, not fence_headers(): the test pins the wire format itself.
    return {"Idempotency-Key": k, "X-Execution-Fence-Scope": scope, "X-Execution-Fence": str(token)}


def test_service_charges_once_per_key(service_url: str) -> None:
    charge = {"invoice": "inv-7", "amount": 1200}
    k = key()
    s1, h1, b1 = _http(f"{service_url}/charge", "POST", charge, _fence(k, 3))
    s2, h2, b2 = _http(f"{service_url}/charge", "POST", charge, _fence(k, 3))
    assert (s1, s2) == (201, 201)
    assert b1 == b2 and b1["invoice"] == "inv-7" and b1["charge_id"].startswith("ch_")
    assert "Idempotent-Replayed" not in h1 and h2["Idempotent-Replayed"] == "true"
    status, _, ledger = _http(f"{service_url}/ledger")
    assert status == 200
    rows = [
        (r["idem_key"], r["invoice"], r["amount"], r["scope"], r["token"]) for r in ledger["rows"]
    ]
    assert rows == [(k, "inv-7", 1200, "job-1", 3)]


def test_service_fences_and_validates(service_url: str) -> None:
    url = f"{service_url}/charge"
    charge = {"invoice": "inv-8", "amount": 5}
    assert _http(url, "POST", charge, _fence(key(), 10))[0] == 201
    stale = _http(url, "POST", charge, _fence(key(), 9))
    assert stale[0] == 412 and stale[2] == {"error": "stale_token", "highest": 10}
    k = key()
    assert _http(url, "POST", charge, _fence(k, 10))[0] == 201
    assert _http(url, "POST", {**charge, "amount": 6}, _fence(k, 10))[0] == 422
    # Another job has its own mark.
    assert (
        _http(url, "POST", {"invoice": "inv-9", "amount": 5}, _fence(key(), 1, "job-2"))[0] == 201
    )

    status, _, body = _http(url, "POST", charge, {"X-Execution-Fence": "10"})
    assert status == 400 and body["header"] == "Idempotency-Key"
    assert "Idempotency-Key" in body["message"]
    status, _, body = _http(
        url, "POST", charge, {"Idempotency-Key": key(), "X-Execution-Fence-Scope": "job-1"}
    )
    assert status == 400 and body["header"] == "X-Execution-Fence"
    status, _, body = _http(url, "POST", charge, {**_fence(key(), 10), "X-Execution-Fence": "x"})
    assert status == 400 and body["error"] == "invalid_header"
    status, _, body = _http(url, "POST", {"invoice": "inv-8", "amount": -1}, _fence(key(), 10))
    assert status == 400 and body["error"] == "invalid_request"

    _, _, ledger = _http(f"{service_url}/ledger")
    assert len(ledger["rows"]) == 3


# --- fence scope (issue 7, item 3) -----------------------------------------------------------


def test_a_fresh_job_is_not_fenced_out_by_another_jobs_higher_token(rcv: FencedReceiver) -> None:
    # Job A's fifth owner charged invoice 1; job B's first attempt charges it too.
    assert rcv.apply("job-A", 5, key(), {"invoice": "inv-1"}, Counter()).status == 200
    assert rcv.apply("job-B", 1, key(), {"invoice": "inv-1"}, Counter()).status == 200
    assert (rcv.highest("job-A"), rcv.highest("job-B")) == (5, 1)


def test_a_stale_owner_is_refused_although_another_job_holds_its_token(
    rcv: FencedReceiver,
) -> None:
    assert rcv.apply("job-A", 4, key(), {"invoice": "inv-1"}, Counter()).status == 200
    assert rcv.apply("job-B", 3, key(), {"invoice": "inv-2"}, Counter()).status == 200
    effect = Counter()
    reply = rcv.apply("job-A", 3, key(), {"invoice": "inv-2"}, effect)
    assert reply == Reply(412, {"error": "stale_token", "highest": 4})
    assert effect.calls == 0


def test_service_lets_two_jobs_on_one_invoice_share_the_key_not_the_fence(service_url: str) -> None:
    """Two jobs capture one invoice under the documented business key: one charge, one replay."""
    url = f"{service_url}/charge"
    charge = {"invoice": "inv-shared", "amount": 700}
    k = f"payment:inv-shared:capture:{uuid.uuid4().hex}"
    a = _http(url, "POST", charge, _fence(k, 5, "job-A"))  # job A after four takeovers
    b = _http(url, "POST", charge, _fence(k, 1, "job-B"))  # job B's first attempt
    assert (a[0], b[0]) == (201, 201)
    assert b[2] == a[2] and b[1]["Idempotent-Replayed"] == "true"
    # Another key of job B on the same invoice is applied: the fence never compared A and B.
    assert _http(url, "POST", {**charge, "amount": 1}, _fence(key(), 1, "job-B"))[0] == 201
    _, _, ledger = _http(f"{service_url}/ledger")
    assert sorted((r["scope"], r["token"]) for r in ledger["rows"]) == [("job-A", 5), ("job-B", 1)]


def test_service_refuses_a_stale_owner_on_an_invoice_another_job_fenced_equal(
    service_url: str,
) -> None:
    url = f"{service_url}/charge"
    assert (
        _http(url, "POST", {"invoice": "inv-a", "amount": 1}, _fence(key(), 4, "job-A"))[0] == 201
    )
    assert (
        _http(url, "POST", {"invoice": "inv-b", "amount": 1}, _fence(key(), 3, "job-B"))[0] == 201
    )
    stale = _http(url, "POST", {"invoice": "inv-b", "amount": 2}, _fence(key(), 3, "job-A"))
    assert stale[0] == 412 and stale[2] == {"error": "stale_token", "highest": 4}
    _, _, ledger = _http(f"{service_url}/ledger")
    assert len(ledger["rows"]) == 2


def test_service_percent_decodes_the_scope(service_url: str, rcv: FencedReceiver) -> None:
    scope = "bestellung/ä 7"
    headers = fence_headers(key(), scope, 2)
    assert headers["X-Execution-Fence-Scope"] == "bestellung%2F%C3%A4%207"
    assert (
        _http(f"{service_url}/charge", "POST", {"invoice": "i-u", "amount": 1}, headers)[0] == 201
    )
    assert rcv.highest(scope) == 2


# --- header input (issue 7, item 4) ------------------------------------------------------------

BAD_TOKENS: list[tuple[str, bytes]] = [
    ("huge", b"1" + b"0" * 100),
    ("2**63", str(2**63).encode()),
    ("arabic_indic_one", "\u0661".encode()),
    ("superscript_two_latin1", b"\xb2"),
    ("fullwidth_one", "\uff11".encode()),
    ("plus", b"+5"),
    ("minus", b"-5"),
    ("inner_space", b"5 5"),
    ("hex", b"0x10"),
    ("exponent", b"1e3"),
    ("float", b"5.0"),
    ("leading_zero", b"007"),
    ("empty", b""),
]


def _raw_post(url: str, headers: list[tuple[str, bytes]], body: Any) -> tuple[int, Any]:
    """POST with header values sent as raw bytes (urllib would refuse non-latin-1 text)."""
    parts = urllib.parse.urlsplit(url)
    data = json.dumps(body).encode()
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=10)
    try:
        conn.putrequest("POST", parts.path)
        conn.putheader("Content-Type", "application/json")
        conn.putheader("Content-Length", str(len(data)))
        for name, value in headers:
            conn.putheader(name, value)
        conn.endheaders(data)
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


@pytest.mark.parametrize(("name", "raw"), BAD_TOKENS, ids=[n for n, _ in BAD_TOKENS])
def test_service_answers_400_to_a_malformed_token_and_stores_no_mark(
    service_url: str, rcv: FencedReceiver, name: str, raw: bytes
) -> None:
    scope, k = f"job-{name}", key()
    headers = [
        ("Idempotency-Key", k.encode()),
        ("X-Execution-Fence-Scope", scope.encode()),
        ("X-Execution-Fence", raw),
    ]
    status, body = _raw_post(f"{service_url}/charge", headers, {"invoice": "inv-x", "amount": 1})
    assert status == 400, body
    assert body["header"] == "X-Execution-Fence"
    assert body["error"] == ("missing_header" if not raw else "invalid_header")
    assert body["message"]
    assert rcv.highest(scope) is None and rcv.record(k) is None


@pytest.mark.parametrize(
    ("name", "raw"),
    [
        ("missing", None),
        ("empty", b""),
        ("utf8_bytes", "jöb".encode()),
        ("inner_space", b"job 1"),
        ("bad_percent_utf8", b"job%FF"),
        ("too_long", b"j" * 1025),
    ],
)
def test_service_answers_400_to_a_missing_or_malformed_scope_and_stores_no_mark(
    service_url: str, rcv: FencedReceiver, name: str, raw: bytes | None
) -> None:
    k = key()
    headers = [("Idempotency-Key", k.encode()), ("X-Execution-Fence", b"3")]
    if raw is not None:
        headers.append(("X-Execution-Fence-Scope", raw))
    status, body = _raw_post(f"{service_url}/charge", headers, {"invoice": "inv-x", "amount": 1})
    assert status == 400, body
    assert body["header"] == "X-Execution-Fence-Scope"
    assert body["error"] == ("missing_header" if not raw else "invalid_header")
    assert rcv.record(k) is None
    for scope in ("job 1", "jöb", "job%FF", "job\xff", "j" * 1025):
        assert rcv.highest(scope) is None


def test_service_answers_400_to_two_token_headers(service_url: str, rcv: FencedReceiver) -> None:
    k = key()
    headers = [
        ("Idempotency-Key", k.encode()),
        ("X-Execution-Fence-Scope", b"job-two-tokens"),
        ("X-Execution-Fence", b"5"),
        ("X-Execution-Fence", b"7"),
    ]
    status, body = _raw_post(f"{service_url}/charge", headers, {"invoice": "inv-x", "amount": 1})
    assert (status, body["header"]) == (400, "X-Execution-Fence")
    assert rcv.highest("job-two-tokens") is None and rcv.record(k) is None


def test_the_largest_token_is_accepted_and_one_more_is_not(rcv: FencedReceiver) -> None:
    assert rcv.apply("job-max", MAX_TOKEN, key(), PAYLOAD, Counter()).status == 200
    assert rcv.highest("job-max") == 2**63 - 1
    for bad in (2**63, 10**100, -1, True, 1.0, "1"):
        with pytest.raises(FenceError, match="X-Execution-Fence"):
            rcv.apply("job-big", bad, key(), PAYLOAD, Counter())  # type: ignore[arg-type]
    assert rcv.highest("job-big") is None


def test_parse_fence_reads_the_three_headers_case_insensitively() -> None:
    fence = parse_fence(
        {
            "idempotency-key": "k1",
            "x-execution-fence-scope": "job%2F1",
            "X-EXECUTION-FENCE": " 42\t",
        }
    )
    assert fence == Fence(scope="job/1", token=42, idem_key="k1")
    with pytest.raises(FenceError) as err:
        parse_fence({"Idempotency-Key": "k1", "X-Execution-Fence": "42"})
    assert (err.value.problem, err.value.header, err.value.status) == (
        "missing_header",
        "X-Execution-Fence-Scope",
        400,
    )


# --- signed fences (optional part of issue 7, item 4) ---------------------------------------

SECRET = b"s3cret-shared-by-caller-and-receiver"


def test_signed_fence_verifies_and_any_change_breaks_it() -> None:
    headers = fence_headers("k1", "job-1", 7, secret=SECRET)
    assert headers["X-Execution-Fence-Signature"].startswith("v1=")
    assert parse_fence(headers, secrets=[SECRET]) == Fence("job-1", 7, "k1")
    # Rotation: the new secret first, the old one still accepted.
    assert parse_fence(headers, secrets=[b"new", SECRET]).token == 7
    for name, value in [
        ("X-Execution-Fence", "8"),
        ("X-Execution-Fence-Scope", "job-2"),
        ("Idempotency-Key", "k2"),
    ]:
        with pytest.raises(FenceError) as err:
            parse_fence({**headers, name: value}, secrets=[SECRET])
        assert (err.value.problem, err.value.status) == ("fence_signature_mismatch", 403)
    with pytest.raises(FenceError, match="X-Execution-Fence-Signature"):
        parse_fence(fence_headers("k1", "job-1", 7), secrets=[SECRET])  # unsigned
    with pytest.raises(FenceError, match="64 lower-case hex"):
        parse_fence({**headers, "X-Execution-Fence-Signature": "v1=zz"}, secrets=[SECRET])


def test_effect_call_signs_what_the_receiver_verifies() -> None:
    call = EffectCall("payment:inv-1:capture", 3, "job/ü", "capture", "payments", {})
    assert parse_fence(call.headers) == Fence("job/ü", 3, "payment:inv-1:capture")
    assert parse_fence(call.signed_headers(SECRET), secrets=[SECRET]).scope == "job/ü"


def test_service_with_a_secret_accepts_only_signed_fences(settings: Settings) -> None:
    service.create_ledger_table(settings, settings.prefix)
    rcv = FencedReceiver(settings)
    server, url = service.serve(settings, settings.prefix, 0, fence_secrets=[SECRET])
    try:
        charge = {"invoice": "inv-s", "amount": 3}
        unsigned = _http(f"{url}/charge", "POST", charge, _fence(key(), 2, "job-s"))
        assert unsigned[0] == 400 and unsigned[2]["header"] == "X-Execution-Fence-Signature"
        forged = {**fence_headers(key(), "job-s", 2, secret=b"guess"), "Content-Type": "x"}
        assert _http(f"{url}/charge", "POST", charge, forged)[0] == 403
        assert rcv.highest("job-s") is None  # neither left a mark
        signed = fence_headers(key(), "job-s", 2, secret=SECRET)
        assert _http(f"{url}/charge", "POST", charge, signed)[0] == 201
        assert rcv.highest("job-s") == 2
    finally:
        server.shutdown()
        server.server_close()


# --- the mark rises with every answer (issue 14, item 3) --------------------------------------


def test_a_replay_to_a_newer_owner_raises_the_mark(rcv: FencedReceiver) -> None:
    k = key()
    assert rcv.apply("job-1", 1, k, PAYLOAD, Counter()).status == 200
    assert rcv.apply("job-1", 2, k, PAYLOAD, Counter()).replayed
    assert rcv.highest("job-1") == 2
    effect = Counter()
    assert rcv.apply("job-1", 1, key(), PAYLOAD, effect).status == 412  # the old owner, new key
    assert effect.calls == 0


def test_a_422_to_a_newer_owner_raises_the_mark(rcv: FencedReceiver) -> None:
    k = key()
    assert rcv.apply("job-1", 1, k, PAYLOAD, Counter()).status == 200
    assert rcv.apply("job-1", 2, k, {**PAYLOAD, "amount": 99}, Counter()).status == 422
    assert rcv.highest("job-1") == 2
    assert rcv.apply("job-1", 1, key(), PAYLOAD, Counter()).status == 412


def test_a_409_to_a_newer_owner_raises_the_mark(rcv: FencedReceiver) -> None:
    started, release = threading.Event(), threading.Event()
    k = key()

    def slow() -> EffectResult:
        started.set()
        assert release.wait(HANG_GUARD)
        return EffectResult(200, {})

    t = threading.Thread(target=rcv.apply, args=("job-1", 1, k, PAYLOAD, slow))
    t.start()
    try:
        assert started.wait(HANG_GUARD)
        assert rcv.apply("job-1", 2, k, PAYLOAD, Counter()).status == 409
        assert rcv.highest("job-1") == 2
        effect = Counter()
        assert rcv.apply("job-1", 1, key(), PAYLOAD, effect).status == 412
        assert effect.calls == 0
    finally:
        release.set()
        t.join(20)


def test_an_effect_that_fails_for_a_newer_owner_has_raised_the_mark(rcv: FencedReceiver) -> None:
    def boom() -> EffectResult:
        raise RuntimeError("card network down")

    assert rcv.apply("job-f", 1, key(), PAYLOAD, Counter()).status == 200
    assert rcv.apply("job-f", 2, key(), PAYLOAD, boom).status == 500
    assert rcv.highest("job-f") == 2
    assert rcv.apply("job-f", 1, key(), PAYLOAD, Counter()).status == 412


def test_raise_mark_admits_equal_and_higher_and_refuses_lower(rcv: FencedReceiver) -> None:
    assert rcv.raise_mark("job-r", 3) is None
    assert rcv.raise_mark("job-r", 3) is None
    assert rcv.raise_mark("job-r", 2) == Reply(412, {"error": "stale_token", "highest": 3})
    assert rcv.highest("job-r") == 3


def test_service_replay_and_422_to_a_newer_owner_raise_the_mark_a_400_does_not(
    service_url: str, rcv: FencedReceiver
) -> None:
    url = f"{service_url}/charge"
    charge = {"invoice": "inv-r", "amount": 10}
    k = key()
    assert _http(url, "POST", charge, _fence(k, 1, "job-r1"))[0] == 201
    # Each answer below is not a success, yet each carries a newer token of its job.
    replay = _http(url, "POST", charge, _fence(k, 2, "job-r1"))
    assert replay[0] == 201 and replay[1]["Idempotent-Replayed"] == "true"
    assert rcv.highest("job-r1") == 2
    assert _http(url, "POST", {**charge, "amount": 11}, _fence(k, 3, "job-r1"))[0] == 422
    assert rcv.highest("job-r1") == 3
    # A body that fails validation stores nothing, so it raises no mark (issue 32,
    # item 2: else a stranger's 400 could fence a job out for good).
    assert _http(url, "POST", {"invoice": "", "amount": 1}, _fence(key(), 4, "job-r1"))[0] == 400
    assert rcv.highest("job-r1") == 3
    # The job's older owners are refused under any new key, and get no 400 either.
    for token in (1, 2):
        stale = _http(url, "POST", charge, _fence(key(), token, "job-r1"))
        assert stale[0] == 412 and stale[2]["highest"] == 3
    assert _http(url, "POST", {"invoice": "", "amount": 1}, _fence(key(), 2, "job-r1"))[0] == 412


# --- upgrading ------------------------------------------------------------------------------


def test_a_fences_table_keyed_per_resource_is_refused_with_the_fix(aws: AwsTestEnv) -> None:
    settings = Settings(endpoint_url=aws.endpoint_url, prefix=f"{aws.prefix}-old")
    ddb = make_client(settings, "dynamodb")
    ddb.create_table(
        TableName=f"{settings.prefix}-fences",
        KeySchema=[{"AttributeName": "resource", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "resource", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    with pytest.raises(ConfigError, match=r"resource \(HASH\).*scope \(HASH\).*delete the table"):
        create_receiver_tables(settings)


def test_service_health_and_unknown_route(service_url: str) -> None:
    status, _, body = _http(f"{service_url}/health")
    assert (status, body) == (200, {"ok": True})
    assert _http(f"{service_url}/nope")[0] == 404


def test_service_as_a_script_needs_a_secret_or_an_explicit_opt_out(aws: AwsTestEnv) -> None:
    args = [sys.executable, str(SERVICE_PATH), "--endpoint-url", aws.endpoint_url, "--port", "0"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SHORT": "too-short"}
    for extra in ([], ["--fence-secret-env", "UNSET_VAR_X"], ["--fence-secret-env", "SHORT"]):
        proc = subprocess.run(
            [*args, *extra], capture_output=True, text=True, env=env, timeout=HANG_GUARD
        )
        assert proc.returncode == 2, proc.stderr
        assert "--fence-secret-env" in proc.stderr or "16 bytes" in proc.stderr


def test_service_runs_as_a_script(aws: AwsTestEnv) -> None:
    proc = subprocess.Popen(
        [
            sys.executable,
            str(SERVICE_PATH),
            "--endpoint-url",
            aws.endpoint_url,
            "--prefix",
            aws.prefix,
            "--port",
            "0",
            "--fence-secret-env",
            "FENCE_SECRET",
            "--fence-secret-env",
            "FENCE_SECRET_OLD",  # a rotation: the new secret first, the old one kept
        ],
        stdout=subprocess.PIPE,
        text=True,
        env={
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "FENCE_SECRET": SECRET.decode(),
            "FENCE_SECRET_OLD": "the-old-secret-still-accepted",
        },
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        assert line.startswith("listening http://127.0.0.1:"), line
        url = line.split(" ", 1)[1]
        assert _http(f"{url}/health")[0] == 200
        charge = {"invoice": "i", "amount": 1}
        status, _, body = _http(f"{url}/charge", "POST", charge, _fence(key(), 1))
        assert status == 400 and body["header"] == "X-Execution-Fence-Signature"
        signed = fence_headers(key(), "job-1", 1, secret=SECRET)
        status, _, body = _http(f"{url}/charge", "POST", charge, signed)
        assert status == 201 and body["invoice"] == "i"
        old = fence_headers(key(), "job-1", 1, secret=b"the-old-secret-still-accepted")
        assert _http(f"{url}/charge", "POST", charge, old)[0] == 201
    finally:
        proc.terminate()
        proc.wait(10)


# --- strangers (issue 32, items 2 and 6) ----------------------------------------------------


def test_a_strangers_max_token_with_a_bad_body_leaves_no_mark(
    service_url: str, rcv: FencedReceiver
) -> None:
    # Unsigned (the fixture opts out knowingly): the 400 must still store nothing.
    url = f"{service_url}/charge"
    k = key()
    stranger = _http(url, "POST", {"invoice": 7}, _fence(k, MAX_TOKEN, "job-victim"))
    assert stranger[0] == 400 and stranger[2]["error"] == "invalid_request"
    assert rcv.highest("job-victim") is None and rcv.record(k) is None
    real = _http(url, "POST", {"invoice": "inv-v", "amount": 3}, _fence(key(), 1, "job-victim"))
    assert real[0] == 201
    assert rcv.highest("job-victim") == 1


@pytest.fixture
def signed_url(settings: Settings) -> Iterator[str]:
    service.create_ledger_table(settings, settings.prefix)
    server, url = service.serve(settings, settings.prefix, 0, fence_secrets=[SECRET])
    try:
        yield str(url)
    finally:
        server.shutdown()
        server.server_close()


def test_a_signed_receiver_gives_strangers_no_mark_and_no_business_key(
    signed_url: str, rcv: FencedReceiver
) -> None:
    url = f"{signed_url}/charge"
    squat = "payment:inv-guessable:capture:" + uuid.uuid4().hex
    charge = {"invoice": "inv-guessable", "amount": 100}
    for headers in (
        _fence(squat, MAX_TOKEN, "job-g"),  # no signature
        fence_headers(squat, "job-g", MAX_TOKEN, secret=b"a-guess-of-sixteen-bytes+"),
    ):
        status, _, body = _http(url, "POST", {**charge, "amount": 1}, headers)
        assert status in (400, 403), body
    assert rcv.highest("job-g") is None and rcv.record(squat) is None
    real = _http(url, "POST", charge, fence_headers(squat, "job-g", 1, secret=SECRET))
    assert real[0] == 201 and real[2]["amount"] == 100  # the job's own call, not a replay
    _, _, ledger = _http(f"{signed_url}/ledger")
    assert [r["amount"] for r in ledger["rows"] if r["idem_key"] == squat] == [100]


@pytest.mark.parametrize(
    ("header", "raw"),
    [("Idempotency-Key", b"k\x1b]0;owned\x07"), ("X-Execution-Fence-Scope", b"job%0D%0Ax")],
)
def test_service_refuses_control_characters_over_http(
    service_url: str, rcv: FencedReceiver, header: str, raw: bytes
) -> None:
    k = key()
    headers = dict(
        [
            ("Idempotency-Key", k.encode()),
            ("X-Execution-Fence-Scope", b"job-ctl"),
            ("X-Execution-Fence", b"1"),
        ]
    )
    headers[header] = raw
    status, body = _raw_post(
        f"{service_url}/charge", list(headers.items()), {"invoice": "i", "amount": 1}
    )
    assert (status, body["header"]) == (400, header)
    assert rcv.highest("job-ctl") is None and rcv.highest("job\r\nx") is None
    assert rcv.record(k) is None


def test_service_refuses_a_fence_header_with_its_underscore_twin(
    service_url: str, rcv: FencedReceiver
) -> None:
    k = key()
    headers = [
        ("Idempotency-Key", k.encode()),
        ("X-Execution-Fence-Scope", b"job-twin-a"),
        ("X_Execution_Fence_Scope", b"job-twin-b"),
        ("X-Execution-Fence", b"1"),
    ]
    status, body = _raw_post(f"{service_url}/charge", headers, {"invoice": "i", "amount": 1})
    assert (status, body["error"], body["header"]) == (
        400,
        "ambiguous_header",
        "X-Execution-Fence-Scope",
    )
    assert rcv.record(k) is None
    for scope in ("job-twin-a", "job-twin-b", "job-twin-a,job-twin-b"):
        assert rcv.highest(scope) is None


# --- retention (issue 32, item 6) ---------------------------------------------------------


def test_receiver_tables_have_ttl_and_items_carry_their_expiry(settings: Settings) -> None:
    ddb = make_client(settings, "dynamodb")
    for name in (f"{settings.prefix}-fences", f"{settings.prefix}-idempotency"):
        ttl = ddb.describe_time_to_live(TableName=name)["TimeToLiveDescription"]
        assert (ttl["TimeToLiveStatus"], ttl["AttributeName"]) == ("ENABLED", "gc_expires_at")
    now = 1_000_000.0
    rcv = FencedReceiver(settings, clock=lambda: now)
    k = key()
    assert rcv.apply("job-ttl", 2, k, PAYLOAD, Counter()).status == 200
    mark, rec = rcv.mark("job-ttl"), rcv.record(k)
    assert mark is not None and rec is not None
    assert mark.gc_expires_at == now + DEFAULT_MARK_RETENTION
    assert rec.gc_expires_at == now + DEFAULT_RECORD_RETENTION
    forever = FencedReceiver(settings, mark_retention=None, record_retention=None)
    k2 = key()
    assert forever.apply("job-ttl-forever", 1, k2, PAYLOAD, Counter()).status == 200
    assert forever.mark("job-ttl-forever").gc_expires_at is None  # type: ignore[union-attr]
    assert forever.record(k2).gc_expires_at is None  # type: ignore[union-attr]


def test_retention_below_the_bound_is_a_config_error(settings: Settings) -> None:
    with pytest.raises(ConfigError, match="mark_retention must be at least 28 days"):
        FencedReceiver(settings, mark_retention=MIN_MARK_RETENTION - 1)
    with pytest.raises(ConfigError, match="record_retention must be at least 1 days"):
        FencedReceiver(settings, record_retention=3600)


# --- the operator's mark reset (issue 32, item 2) --------------------------------------------


def test_reset_mark_is_conditional_on_the_value_read(rcv: FencedReceiver) -> None:
    assert rcv.raise_mark("job-reset", MAX_TOKEN) is None  # a stranger's, say
    assert rcv.apply("job-reset", 3, key(), PAYLOAD, Counter()).status == 412
    assert not rcv.reset_mark("job-reset", expect=5, to=2)  # it is not 5: nothing changes
    assert rcv.highest("job-reset") == MAX_TOKEN
    assert rcv.reset_mark("job-reset", expect=MAX_TOKEN, to=2)
    assert rcv.highest("job-reset") == 2
    assert rcv.apply("job-reset", 3, key(), PAYLOAD, Counter()).status == 200
    assert rcv.reset_mark("job-reset", expect=3, to=None)
    assert rcv.highest("job-reset") is None


def _cli(aws: AwsTestEnv, *args: str) -> Any:
    from click.testing import CliRunner

    from sqs_lease.cli import cli

    return CliRunner().invoke(
        cli, ["--endpoint-url", aws.endpoint_url, "--prefix", aws.prefix, "receiver", *args]
    )


def test_cli_receiver_mark_show_and_reset(aws: AwsTestEnv, rcv: FencedReceiver) -> None:
    scope = f"job-cli-{uuid.uuid4().hex[:6]}"
    missing = _cli(aws, "mark", "show", scope)
    assert missing.exit_code == 1 and "no fence mark" in missing.stderr
    assert missing.stdout == ""
    as_json = _cli(aws, "mark", "show", scope, "--json")
    assert as_json.exit_code == 1 and json.loads(as_json.stdout)["code"] == "mark_not_found"
    assert rcv.raise_mark(scope, MAX_TOKEN) is None
    shown = _cli(aws, "mark", "show", scope, "--json")
    assert shown.exit_code == 0, shown.output
    got = json.loads(shown.stdout)
    assert (got["scope"], got["mark"]) == (scope, MAX_TOKEN) and got["expires_at"]
    assert "mark: 9223372036854775807" in _cli(aws, "mark", "show", scope).stdout
    moved = _cli(aws, "mark", "reset", scope, "--expect", "5", "--to", "2")
    assert moved.exit_code == 2 and "nothing changed" in moved.stderr
    moved = _cli(aws, "mark", "reset", scope, "--expect", "5", "--to", "2", "--json")
    assert moved.exit_code == 2 and json.loads(moved.stdout)["code"] == "mark_changed"
    assert _cli(aws, "mark", "reset", scope, "--expect", str(MAX_TOKEN)).exit_code == 2  # usage
    done = _cli(aws, "mark", "reset", scope, "--expect", str(MAX_TOKEN), "--to", "2", "--json")
    assert done.exit_code == 0, done.output
    assert json.loads(done.stdout) == {"scope": scope, "old": MAX_TOKEN, "new": 2}
    assert rcv.highest(scope) == 2
    gone = _cli(aws, "mark", "reset", scope, "--expect", "2", "--delete")
    assert gone.exit_code == 0 and rcv.highest(scope) is None
    assert _cli(aws, "mark", "reset", scope, "--expect", "2", "--delete").exit_code == 1
