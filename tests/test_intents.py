"""Intents end to end: real moto server, real Workers, the example fenced receiver.

W1 (a worker that loses its lease in the middle of an effect) is simulated
in-process and deterministically: the test claims the job itself (token 1, a
1 s lease), runs the first half of the effect (prepare + fenced start) and,
depending on the case, applies the charge at the receiver with W1's token. Then
it stops, and the message's visibility lapses. W2 and W3 are real
:class:`sqs_lease.Worker` threads; operators decide with ``sqs-lease intents
resolve``. Tables and the receiver service are shared by the module (each test
has its own queue, job ids and invoices); the four takeover cases share one W2
run. Every log line (INFO and up) is captured, and none may carry the payload.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import socket
import socketserver
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pytest
from click.testing import CliRunner
from pydantic import BaseModel
from worker_helpers import HANG_GUARD, ROOMY, SHELLS

from examples import receiver_service as service
from sqs_lease import (
    App,
    CheckAnswer,
    EffectCall,
    IntentBusy,
    IntentState,
    IntentView,
    JobContext,
    JobState,
    Journal,
    LeaseLost,
    OwnershipUnknown,
    Producer,
    Settings,
    ToolNotApplied,
    ToolResult,
    Verdict,
    Worker,
    create_queue,
    create_tables,
)
from sqs_lease._aws import SyncDriver
from sqs_lease._core.calls import Err, ErrorKind, Flow, Ok, call
from sqs_lease._core.claiming import Claimed, claim_flow
from sqs_lease._core.effectflow import effect_flow
from sqs_lease._core.intents import EffectResult, EffectSpec
from sqs_lease._core.intentwrites import RETRY_WAITS, EffectCtx, confirm_intent
from sqs_lease._core.messages import Delivery, receive_flow
from sqs_lease._core.resolving import Resolution
from sqs_lease._jobs import canonical_json, payload_hash
from sqs_lease._journal import LOGGER_NAME
from sqs_lease._schema.intent_requests import IntentTable
from sqs_lease._schema.job_requests import JobTable
from sqs_lease._schema.models import AttemptRecord, IntentRecord
from sqs_lease._schema.views import intent_view_of, view_of
from sqs_lease.cli import cli
from sqs_lease.effects import http_json
from sqs_lease.receiver import FencedReceiver, create_receiver_tables

if TYPE_CHECKING:
    from types_boto3_dynamodb import DynamoDBClient
    from types_boto3_sqs import SQSClient

# One xdist worker runs this file (`make test` uses --dist loadgroup): the module
# fixtures (the receiver service, the takeover scenario) are built once.
pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("intents")]

SECRET = f"memo-secret-{uuid.uuid4().hex}"
"""Travels in every job and effect payload; must never reach a log line."""

FAST: dict[str, Any] = {**ROOMY, "backoff_base_seconds": 0.0}
"""The real workers' lease (W2, W3): no test here is about their lease lapsing (W1's
lapse is the test's own claim), and tokens are counted exactly, so a lease no busy
machine lapses (a 4 s one lapsed beside two CPU hogs and added a takeover); retries
come back at once."""
W1 = "w1-lost"
CANNOT_TELL_DETAIL = "ledger export is a day behind"
WAIT = HANG_GUARD
"""A hang guard for every wait here, never a timing check (20 s ran out beside two CPU
hogs); a wait that succeeds returns as soon as its state is reached."""


# =========================================================================== logs


class LogCapture(logging.Handler):
    """Every log record at INFO and above: journal events parsed, all text kept."""

    def __init__(self) -> None:
        super().__init__(level=logging.INFO)
        self.setFormatter(logging.Formatter("%(name)s %(levelname)s %(message)s"))
        self._lines: list[str] = []
        self._events: list[dict[str, Any]] = []
        self._mutex = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        text = self.format(record)
        event = json.loads(record.getMessage()) if record.name == LOGGER_NAME else None
        with self._mutex:
            self._lines.append(text)
            if event is not None:
                self._events.append(event)

    def add_output(self, text: str) -> None:
        """Output of a CLI run: its JSON lines are journal events too."""
        events = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
        with self._mutex:
            self._lines.append(text)
            self._events.extend(events)

    def text(self) -> str:
        with self._mutex:
            return "\n".join(self._lines)

    def events(self, name: str | None = None, **match: Any) -> list[dict[str, Any]]:
        with self._mutex:
            snapshot = list(self._events)
        return [
            e
            for e in snapshot
            if (name is None or e["event"] == name) and all(e.get(k) == v for k, v in match.items())
        ]

    def names(self, **match: Any) -> list[str]:
        return [str(e["event"]) for e in self.events(**match)]

    def one(self, name: str, **match: Any) -> dict[str, Any]:
        found = self.events(name, **match)
        assert len(found) == 1, f"expected one {name} {match}, got {self.names()}"
        return found[0]


@contextmanager
def capture_logs() -> Iterator[LogCapture]:
    """Capture every log record (INFO+) for the block; then no line may hold the secret."""
    cap = LogCapture()
    root, journal = logging.getLogger(), logging.getLogger(LOGGER_NAME)
    levels = (root.level, journal.level)
    root.setLevel(logging.INFO)
    journal.setLevel(logging.INFO)
    root.addHandler(cap)
    direct = not journal.propagate  # the CLI may have cut the journal off the root
    if direct:
        journal.addHandler(cap)
    try:
        yield cap
    finally:
        root.removeHandler(cap)
        if direct:
            journal.removeHandler(cap)
        root.setLevel(levels[0])
        journal.setLevel(levels[1])
    assert cap.events(), "no journal event captured: the capture is broken"
    assert SECRET not in cap.text(), "a payload reached the logs"


@pytest.fixture
def logs() -> Iterator[LogCapture]:
    with capture_logs() as cap:
        yield cap


INTENT_EVENTS = (
    "intent_prepared",
    "intent_started",
    "intent_confirmed",
    "intent_replayed",
    "intent_reconciled",
    "intent_ambiguous",
    "intent_refused",
    "intent_resolved",
    "intent_start_refused",
)


def assert_journal_clean(logs: LogCapture, *expected: str) -> None:
    """The named intent events were journaled; no line carries the payload."""
    names = set(logs.names())
    assert set(expected) <= names, f"missing {set(expected) - names}"
    for event in logs.events():
        if event["event"] in INTENT_EVENTS:
            assert not {"payload", "payload_json", "body"} & set(event), event
    assert SECRET not in logs.text()


def test_the_log_capture_would_see_a_leaked_payload() -> None:
    # Without this, "the secret is in no log line" could pass with a broken capture.
    with pytest.raises(AssertionError, match="a payload reached the logs"), capture_logs():
        Journal(include_bodies=True).write("leak", {"payload": SECRET})
    with pytest.raises(AssertionError, match="a payload reached the logs"), capture_logs():
        Journal().write("note", {})
        logging.getLogger("some.library").warning("request body %s", SECRET)


# =========================================================================== environment


@dataclass
class Env:
    settings: Settings
    queue_url: str
    url: str
    ddb: DynamoDBClient
    sqs: SQSClient
    driver: SyncDriver
    jobs: JobTable
    intents: IntentTable
    receiver: FencedReceiver

    # ---------------------------------------------------------------- records

    def job(self, job_id: str) -> dict[str, Any]:
        item = self.ddb.get_item(
            TableName=self.settings.jobs_table, Key={"job_id": {"S": job_id}}, ConsistentRead=True
        ).get("Item")
        assert item is not None, f"no job {job_id}"
        return dict(item)

    def job_state(self, job_id: str) -> JobState:
        return view_of(self.job(job_id)).state

    def intent_item(self, key: str) -> dict[str, Any] | None:
        item = self.ddb.get_item(
            TableName=self.settings.intents_table,
            Key={"intent_key": {"S": key}},
            ConsistentRead=True,
        ).get("Item")
        return None if item is None else dict(item)

    def intent(self, key: str) -> IntentView:
        item = self.intent_item(key)
        assert item is not None, f"no intent {key}"
        return intent_view_of(item)

    def intent_record(self, key: str) -> IntentRecord:
        item = self.intent_item(key)
        assert item is not None, f"no intent {key}"
        record: IntentRecord = IntentRecord.from_raw_data(item)
        return record

    def attempts(self, key: str) -> list[AttemptRecord]:
        out = self.ddb.query(
            TableName=self.settings.attempts_table,
            KeyConditionExpression="intent_key = :k",
            ExpressionAttributeValues={":k": {"S": key}},
            ConsistentRead=True,
        )
        return [AttemptRecord.from_raw_data(dict(i)) for i in out["Items"]]

    def ledger(self) -> list[dict[str, Any]]:
        with urllib.request.urlopen(f"{self.url}/ledger", timeout=10) as resp:
            rows: list[dict[str, Any]] = json.loads(resp.read())["rows"]
        return rows

    def queue_depth(self) -> int:
        attrs = self.sqs.get_queue_attributes(
            QueueUrl=self.queue_url,
            AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
        )["Attributes"]
        return sum(int(v) for v in attrs.values())

    def wait_job(self, job_id: str, *states: JobState, timeout: float = WAIT) -> JobState:
        deadline = time.monotonic() + timeout
        while True:
            state = self.job_state(job_id)
            if state in states:
                return state
            if time.monotonic() > deadline:
                raise AssertionError(f"job {job_id} is {state}, not {states}, after {timeout} s")
            time.sleep(0.1)


@dataclass(frozen=True)
class Shared:
    """Tables, the receiver service and clients, made once for the module (they cost
    seconds per test); every test brings its own queue, job ids and invoices."""

    settings: Settings
    url: str
    driver: SyncDriver
    receiver: FencedReceiver


@pytest.fixture(scope="module")
def shared(moto_endpoint: str) -> Iterator[Shared]:
    prefix = f"t{uuid.uuid4().hex[:10]}"
    settings = Settings(endpoint_url=moto_endpoint, prefix=prefix)
    create_tables(settings)
    create_receiver_tables(settings, prefix=prefix)
    service.create_ledger_table(settings, prefix)
    server, url = service.serve(
        settings, prefix, unsigned_fences=True
    )  # loopback test receiver, unsigned knowingly
    try:
        yield Shared(
            settings=settings,
            url=url,
            driver=SyncDriver(settings, Journal(worker_id="test-driver")),
            receiver=FencedReceiver(settings, prefix=prefix),
        )
    finally:
        server.shutdown()
        server.server_close()


def new_env(shared: Shared, ddb: DynamoDBClient, sqs: SQSClient) -> Env:
    """The shared tables and receiver, with a queue of its own."""
    base = shared.settings
    settings = base.model_copy(update={"queue_name": f"{base.prefix}-q{uuid.uuid4().hex[:8]}"})
    queue, _ = create_queue(settings, visibility=30)
    return Env(
        settings=settings,
        queue_url=queue,
        url=shared.url,
        ddb=ddb,
        sqs=sqs,
        driver=shared.driver,
        jobs=JobTable(settings.jobs_table),
        intents=IntentTable(settings.intents_table, settings.attempts_table),
        receiver=shared.receiver,
    )


@pytest.fixture
def env(shared: Shared, ddb_client: DynamoDBClient, sqs_client: SQSClient, logs: LogCapture) -> Env:
    return new_env(shared, ddb_client, sqs_client)


# =========================================================================== the app


class ChargePayload(BaseModel):
    invoice: str
    amount: int
    memo: str


def effect_payload(p: ChargePayload) -> dict[str, Any]:
    return {"invoice": p.invoice, "amount": p.amount, "memo": p.memo}


def charge_key(invoice: str) -> str:
    """The business key, built in code from the source event."""
    return f"payment:{invoice}:capture"


def charge(call: EffectCall, base_url: str) -> ToolResult:
    """POST /charge: 201 -> the charge id; 412 -> LeaseLost; 409/5xx -> outcome unknown."""
    return http_json(call, f"{base_url}/charge", id_field="charge_id")


@dataclass
class Charger:
    """The tool: POST /charge with the fence headers; counts and keeps every call."""

    url: str
    calls: list[EffectCall] = field(default_factory=list)
    before: Callable[[EffectCall], None] | None = None
    _mutex: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, call: EffectCall) -> ToolResult:
        with self._mutex:
            self.calls.append(call)
        if self.before is not None:
            self.before(call)
        return charge(call, self.url)


Check = Callable[[IntentView], CheckAnswer]


def ledger_check(env: Env, seen: list[IntentView]) -> Check:
    """The target's own answer: the ledger row for the key, or certainly none."""

    def check(view: IntentView) -> CheckAnswer:
        seen.append(view)
        for row in env.ledger():
            if row["idem_key"] == view.key:
                response = {k: row[k] for k in ("charge_id", "invoice", "amount")}
                return CheckAnswer(Verdict.CONFIRMED, str(row["charge_id"]), response, "ledger")
        return CheckAnswer(Verdict.NOT_APPLIED, detail="no ledger row for the key")

    return check


def cannot_tell(seen: list[IntentView]) -> Check:
    def check(view: IntentView) -> CheckAnswer:
        seen.append(view)
        return CheckAnswer(Verdict.CANNOT_TELL, detail=CANNOT_TELL_DETAIL)

    return check


Handler = Callable[[JobContext[Any], ChargePayload], Any]


def one_charge(charger: Charger) -> Handler:
    def handle(ctx: JobContext[Any], p: ChargePayload) -> dict[str, Any]:
        r = ctx.effect("charge", "payments", effect_payload(p), charger, key=charge_key(p.invoice))
        return {"charge_id": r.external_id, "replayed": r.replayed, "reconciled": r.reconciled}

    return handle


def make_app(handler: Handler, check: Check | None) -> App:
    app = App()
    app.target("payments", check=check, key_retention_seconds=86_400)
    app.job("charge", payload=ChargePayload, **FAST)(handler)
    return app


def submit(env: Env, app: App, invoice: str, amount: int = 100) -> tuple[str, ChargePayload]:
    payload = ChargePayload(invoice=invoice, amount=amount, memo=SECRET)
    job_id = f"job-{invoice}"
    Producer(env.settings, app, driver=env.driver).submit("charge", payload, job_id=job_id)
    return job_id, payload


@pytest.fixture(scope="module", params=sorted(SHELLS, reverse=True))
def shell(request: pytest.FixtureRequest) -> Any:
    """Each worker shell in turn: the thread worker and the async worker."""
    return SHELLS[request.param]


def build(env: Env, app: App, name: str, shell: Any = Worker) -> Future[Any]:
    """Construct a Worker in the background (eight boto3 clients and four calls: seconds
    on a loaded machine), so that it overlaps with W1's part of the test."""
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"build-{name}")
    try:
        return pool.submit(
            shell,
            app,
            env.settings,
            worker_id=f"{name}-{env.settings.queue}",
            concurrency=4,
            receive_wait=1,
            shutdown_grace=5.0,
        )
    finally:
        pool.shutdown(wait=False)


@contextmanager
def running(built: Future[Any]) -> Iterator[Any]:
    """Run a real Worker in a thread for the block; stop (and join) it at the end."""
    worker = built.result(timeout=WAIT)
    errors: list[BaseException] = []

    def main() -> None:
        try:
            worker.run()
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    thread = threading.Thread(target=main, name=f"runner-{worker.worker_id}", daemon=True)
    thread.start()
    try:
        yield worker
    finally:
        worker.stop()
        thread.join(WAIT)
    assert not thread.is_alive(), f"worker {worker.worker_id} did not stop"
    assert not errors, errors


# =========================================================================== W1, by hand


def receive_one(env: Env, *, visibility: int) -> Delivery:
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        batch = env.driver.run(
            receive_flow(
                queue_url=env.queue_url, max_messages=1, wait_seconds=1, visibility=visibility
            )
        )
        for item in batch:
            assert isinstance(item, Delivery), item
            return item
    raise AssertionError("no message to receive")


def receive_all(env: Env, n: int, *, visibility: int) -> dict[str, Delivery]:
    """Receive ``n`` messages (any order); by job id."""
    got: dict[str, Delivery] = {}
    while len(got) < n:
        d = receive_one(env, visibility=visibility)
        got[d.job_id] = d
    return got


def claim(
    env: Env,
    delivery: Delivery,
    *,
    lease_seconds: int,
    worker_id: str = W1,
    take_from: int | None = None,
) -> Claimed:
    out = env.driver.run(
        claim_flow(
            env.jobs,
            queue_url=env.queue_url,
            delivery=delivery,
            worker_id=worker_id,
            wall_now=time.time(),
            lease_seconds=lease_seconds,
            max_attempts=5,
            nonce="n-1",
            take_from=take_from,
        )
    )
    assert isinstance(out, Claimed), out
    return out


def spec_for(job_id: str, p: ChargePayload, tool: Callable[[], Any] | None = None) -> EffectSpec:
    """The spec ``ctx.effect`` builds for this payload (same key, same canonical payload)."""
    text = canonical_json(effect_payload(p))

    def never() -> Any:
        raise AssertionError("W1's tool is called by hand, never by a flow")

    return EffectSpec(
        key=charge_key(p.invoice),
        job_id=job_id,
        stage="main",
        action="charge",
        target="payments",
        payload_json=text,
        payload_hash=payload_hash(text),
        tool=tool or never,
        key_retention_seconds=86_400,  # as ctx.effect would take it from the target
    )


def prepare_and_start(env: Env, spec: EffectSpec, token: int) -> Flow[None]:
    """The first half of ``effect_flow``: the intent written, then started fenced."""
    prepared = yield from call(env.intents.prepare(spec, time.time()))
    assert isinstance(prepared, Ok), prepared
    started = yield from call(
        env.intents.start(
            spec,
            jobs=env.jobs,
            token=token,
            worker_id=W1,
            expected=IntentState.PREPARED,
            attempts=0,
            wall_now=time.time(),
        )
    )
    assert isinstance(started, Ok), started


@dataclass(frozen=True)
class Lost:
    """What W1 left behind when it stopped."""

    claim: Claimed
    spec: EffectSpec
    call: EffectCall
    applied: ToolResult | None


def w1_starts_then_stops(
    env: Env, job_id: str, p: ChargePayload, *, applies: bool, delivery: Delivery | None = None
) -> Lost:
    """W1 claims (token 1, lease 1 s), starts the effect, maybe applies it, then stops."""
    delivery = delivery or receive_one(env, visibility=2)
    assert delivery.job_id == job_id
    claimed = claim(env, delivery, lease_seconds=1)
    assert claimed.token == 1
    spec = spec_for(job_id, p)
    env.driver.run(prepare_and_start(env, spec, claimed.token))
    ec = EffectCall(spec.key, claimed.token, job_id, "charge", "payments", effect_payload(p))
    applied = charge(ec, env.url) if applies else None
    if applied is not None:
        assert applied.response["_status"] == 201
    # W1 now stops: no confirm, no commit, no heartbeat. Its 1 s lease lapses.
    intent = env.intent(spec.key)
    assert (intent.state, intent.attempts, intent.last_token) == (IntentState.IN_PROGRESS, 1, 1)
    return Lost(claimed, spec, ec, applied)


def rows_for(env: Env, invoice: str) -> list[dict[str, Any]]:
    return [r for r in env.ledger() if r["invoice"] == invoice]


def result_of(env: Env, job_id: str) -> Any:
    text = env.job(job_id).get("result", {}).get("S")
    return None if text is None else json.loads(text)


def invoice_id() -> str:
    return f"inv-{uuid.uuid4().hex[:12]}"


def intent_names(logs: LogCapture, key: str) -> list[str]:
    return [n for n in logs.names(key=key) if n.startswith("intent_")]


# =========================================================================== 1. transitions


def test_effect_goes_prepared_in_progress_confirmed_with_every_attempt_logged(
    env: Env, logs: LogCapture, shell: Any
) -> None:
    charger = Charger(env.url)
    in_tool: list[tuple[int, IntentView, dict[int, AttemptRecord]]] = []
    in_handler: list[tuple[int, int, IntentView | None]] = []

    def before(ec: EffectCall) -> None:
        # Inside the tool call: the intent is in_progress and this attempt is logged.
        in_tool.append(
            (ec.token, env.intent(ec.key), {int(a.attempt): a for a in env.attempts(ec.key)})
        )
        if len(in_tool) == 1:
            raise ToolNotApplied("target busy: certainly not applied", code="http_429")

    charger.before = before
    inner = one_charge(charger)

    def handler(ctx: JobContext[Any], p: ChargePayload) -> Any:
        item = env.intent_item(charge_key(p.invoice))
        in_handler.append((ctx.attempt, ctx.token, None if item is None else intent_view_of(item)))
        return inner(ctx, p)

    app = make_app(handler, ledger_check(env, []))
    invoice = invoice_id()
    job_id, p = submit(env, app, invoice)
    key = charge_key(invoice)
    digest = payload_hash(canonical_json(effect_payload(p)))
    t0 = time.time()
    with running(build(env, app, "w", shell)) as worker:
        assert env.wait_job(job_id, JobState.SUCCEEDED, JobState.FAILED) is JobState.SUCCEEDED
    t1 = time.time()

    # Before the first effect there is no intent; after the failed first try the
    # intent is back to prepared (attempt count kept) for the second attempt.
    assert [(a, t) for a, t, _ in in_handler] == [(1, 1), (2, 2)]
    assert in_handler[0][2] is None
    reopened = in_handler[1][2]
    assert reopened is not None
    assert (reopened.state, reopened.attempts, reopened.last_token) == (IntentState.PREPARED, 1, 1)
    assert (reopened.payload_hash, reopened.payload_json) == (
        digest,
        canonical_json(effect_payload(p)),
    )

    # In the tool: in_progress, started under the calling token, attempt logged "started".
    assert [t for t, _, _ in in_tool] == [1, 2]
    for n, (token, intent, atts) in enumerate(in_tool, start=1):
        assert (intent.state, intent.attempts, intent.last_token) == (
            IntentState.IN_PROGRESS,
            n,
            token,
        )
        now = atts[n]
        assert (now.outcome, int(now.token)) == ("started", token)
        assert getattr(now, "ended_at", None) is None
    failed_then = in_tool[1][2][1]
    assert failed_then.outcome == "not_applied" and failed_then.ended_at is not None
    assert "ToolNotApplied" in str(failed_then.error)

    intent = env.intent(key)
    assert (intent.state, intent.attempts, intent.last_token) == (IntentState.CONFIRMED, 2, 2)
    assert (intent.job_id, intent.action, intent.target) == (job_id, "charge", "payments")
    assert intent.payload_hash == digest
    charged = rows_for(env, invoice)
    assert len(charged) == 1 and charged[0]["token"] == 2
    assert intent.external_id == charged[0]["charge_id"]
    assert json.loads(intent.response_json or "{}")["charge_id"] == charged[0]["charge_id"]
    record = env.intent_record(key)
    assert record.reconciled is False
    assert t0 <= record.first_started_at < record.confirmed_at <= t1

    attempts = env.attempts(key)
    assert [int(a.attempt) for a in attempts] == [1, 2]
    for a, token, outcome in zip(attempts, (1, 2), ("not_applied", "ok"), strict=True):
        assert (a.intent_key, a.job_id, a.tool, a.action) == (key, job_id, "payments", "charge")
        assert (int(a.token), a.worker, a.payload_hash, a.outcome) == (
            token,
            worker.worker_id,
            digest,
            outcome,
        )
        assert t0 <= a.started_at < a.ended_at <= t1  # each write has its own time
    assert attempts[1].external_id == charged[0]["charge_id"]
    assert attempts[0].external_id is None
    assert [c.token for c in charger.calls] == [1, 2]
    assert {c.key for c in charger.calls} == {key}

    assert intent_names(logs, key) == [
        "intent_prepared",
        "intent_started",
        "intent_started",
        "intent_confirmed",
    ]
    assert logs.one("intent_prepared", key=key)["payload_hash"] == digest
    started = logs.events("intent_started", key=key)
    assert [(e["attempt"], e["token"]) for e in started] == [(1, 1), (2, 2)]
    assert logs.one("intent_confirmed", key=key)["external_id"] == charged[0]["charge_id"]
    assert logs.one("tool_request_failed", key=key)["outcome_unknown"] is False
    assert result_of(env, job_id)["charge_id"] == charged[0]["charge_id"]
    assert_journal_clean(logs, "intent_prepared", "intent_started", "intent_confirmed")


def test_same_key_with_another_payload_is_refused_and_the_target_called_once(
    env: Env, logs: LogCapture, shell: Any
) -> None:
    charger = Charger(env.url)

    def handler(ctx: JobContext[Any], p: ChargePayload) -> Any:
        k = charge_key(p.invoice)
        ctx.effect("charge", "payments", effect_payload(p), charger, key=k)
        changed = {**effect_payload(p), "amount": p.amount + 1}
        ctx.effect("charge", "payments", changed, charger, key=k)
        return {"unreachable": True}

    app = make_app(handler, ledger_check(env, []))
    invoice = invoice_id()
    job_id, p = submit(env, app, invoice)
    key = charge_key(invoice)
    with running(build(env, app, "w", shell)):
        assert env.wait_job(job_id, JobState.SUCCEEDED, JobState.FAILED) is JobState.FAILED

    job = view_of(env.job(job_id))
    assert job.error_code == "intent_payload_mismatch"
    assert key in (job.reason or "")
    assert job.attempt == 1  # refused at once, never retried
    assert len(charger.calls) == 1
    assert len(rows_for(env, invoice)) == 1
    intent = env.intent(key)
    assert intent.state is IntentState.CONFIRMED
    assert intent.payload_hash == payload_hash(canonical_json(effect_payload(p)))
    refused = logs.one("intent_refused", key=key)
    assert refused["reason"] == "payload_mismatch"
    assert refused["stored_hash"] == intent.payload_hash != refused["payload_hash"]
    assert logs.one("job_failed", job_id=job_id)["error_code"] == "intent_payload_mismatch"
    assert_journal_clean(logs, "intent_refused")


def test_a_confirmed_intent_replays_without_calling_the_target(
    env: Env, logs: LogCapture, shell: Any
) -> None:
    charger = Charger(env.url)

    def handler(ctx: JobContext[Any], p: ChargePayload) -> Any:
        k = charge_key(p.invoice)
        first = ctx.effect("charge", "payments", effect_payload(p), charger, key=k)
        second = ctx.effect("charge", "payments", effect_payload(p), charger, key=k)
        return {
            "ids": [first.external_id, second.external_id],
            "replayed": [first.replayed, second.replayed],
            "responses_equal": dict(first.response) == dict(second.response),
        }

    app = make_app(handler, ledger_check(env, []))
    invoice = invoice_id()
    job_id, _ = submit(env, app, invoice)
    key = charge_key(invoice)
    with running(build(env, app, "w", shell)):
        assert env.wait_job(job_id, JobState.SUCCEEDED, JobState.FAILED) is JobState.SUCCEEDED

    assert len(charger.calls) == 1
    charged = rows_for(env, invoice)
    assert len(charged) == 1
    result = result_of(env, job_id)
    assert result["ids"] == [charged[0]["charge_id"]] * 2
    assert result["replayed"] == [False, True]
    assert result["responses_equal"] is True
    assert intent_names(logs, key) == [
        "intent_prepared",
        "intent_started",
        "intent_confirmed",
        "intent_replayed",
    ]
    assert logs.one("intent_replayed", key=key)["external_id"] == charged[0]["charge_id"]
    assert len(env.attempts(key)) == 1
    assert_journal_clean(logs, "intent_replayed")


# =========================================================================== 2. takeover


def late_confirm(env: Env, key: str, applied: ToolResult) -> Flow[None]:
    """W1's own confirm, arriving late (confirm is not fenced: it records what happened)."""
    out = yield from call(
        env.intents.confirm(
            key,
            attempt=1,
            response_json=canonical_json(dict(applied.response)),
            external_id=applied.external_id,
            wall_now=time.time(),
            log_response="",
            reconciled=False,
        )
    )
    assert isinstance(out, Ok), out


@dataclass(frozen=True)
class Case:
    job_id: str
    payload: ChargePayload
    lost: Lost
    final: JobState

    @property
    def key(self) -> str:
        return self.lost.spec.key


@dataclass(frozen=True)
class Takeover:
    """One run of W2 over four jobs, each left by W1 in the middle of its effect."""

    env: Env
    logs: LogCapture
    w2: str
    charger: Charger
    seen: list[IntentView]
    cases: dict[str, Case]

    def calls_for(self, case: Case) -> list[EffectCall]:
        return [c for c in self.charger.calls if c.key == case.key]

    def checked(self, case: Case) -> int:
        return sum(1 for v in self.seen if v.key == case.key)


# W1 applied the charge before it stopped? And what the target's check answers.
TAKEOVER_CASES = {
    "confirmed": True,  # the ledger has W1's row: CONFIRMED
    "not_applied": False,  # no ledger row: NOT_APPLIED
    "cannot_tell": True,  # CANNOT_TELL
    "late_confirm": True,  # CANNOT_TELL, while W1's late confirm lands
}


@pytest.fixture(scope="module")
def takeover(
    shared: Shared, ddb_client: DynamoDBClient, sqs_client: SQSClient, shell: Any
) -> Iterator[Takeover]:
    """W1 (by hand) claims each job (token 1), starts its effect, maybe applies it at
    the receiver, and stops; its 1 s lease lapses. Then a real Worker W2 takes over."""
    with capture_logs() as logs:
        env = new_env(shared, ddb_client, sqs_client)
        charger, seen = Charger(env.url), list[IntentView]()
        case_of: dict[str, str] = {}
        lost_by_key: dict[str, Lost] = {}
        ledger = ledger_check(env, [])

        def check(view: IntentView) -> CheckAnswer:
            seen.append(view)
            case = case_of[view.key]
            if case == "late_confirm":
                applied = lost_by_key[view.key].applied
                assert applied is not None
                env.driver.run(late_confirm(env, view.key, applied))
            if case in ("cannot_tell", "late_confirm"):
                return CheckAnswer(Verdict.CANNOT_TELL, detail=CANNOT_TELL_DETAIL)
            return ledger(view)

        app = make_app(one_charge(charger), check)
        w2_built = build(env, app, "w2", shell)  # while W1 works
        submitted = {name: submit(env, app, invoice_id()) for name in TAKEOVER_CASES}
        deliveries = receive_all(env, len(submitted), visibility=10)
        lost: dict[str, Lost] = {}
        for name, (job_id, p) in submitted.items():
            case_of[charge_key(p.invoice)] = name
            lost[name] = w1_starts_then_stops(
                env, job_id, p, applies=TAKEOVER_CASES[name], delivery=deliveries[job_id]
            )
            lost_by_key[lost[name].spec.key] = lost[name]
        with running(w2_built) as w2:
            final = {
                name: env.wait_job(job_id, JobState.SUCCEEDED, JobState.FAILED, JobState.PARKED)
                for name, (job_id, _) in submitted.items()
            }
    cases = {
        name: Case(job_id, p, lost[name], final[name]) for name, (job_id, p) in submitted.items()
    }
    yield Takeover(env, logs, w2.worker_id, charger, seen, cases)


def test_takeover_check_confirms_w1s_charge_and_w2_never_calls_the_target(
    takeover: Takeover,
) -> None:
    t, case = takeover, takeover.cases["confirmed"]
    env, logs = t.env, t.logs
    assert case.final is JobState.SUCCEEDED
    assert case.lost.applied is not None
    charge_id = case.lost.applied.external_id
    assert charge_id

    assert t.calls_for(case) == []  # W2 never called the target
    assert t.checked(case) == 1
    intent = env.intent(case.key)
    assert (intent.state, intent.external_id, intent.attempts, intent.last_token) == (
        IntentState.CONFIRMED,
        charge_id,
        1,
        1,
    )
    assert env.intent_record(case.key).reconciled is True
    (attempt,) = env.attempts(case.key)
    assert (int(attempt.token), attempt.worker, attempt.outcome, attempt.external_id) == (
        1,
        W1,
        "confirmed_by_check",
        charge_id,
    )
    assert attempt.ended_at is not None
    charged = rows_for(env, case.payload.invoice)
    assert [(r["charge_id"], r["token"]) for r in charged] == [(charge_id, 1)]
    assert result_of(env, case.job_id) == {
        "charge_id": charge_id,
        "replayed": False,
        "reconciled": True,
    }
    job = view_of(env.job(case.job_id))
    assert (job.token, job.attempt, job.owner) == (2, 2, t.w2)
    rec = logs.one("intent_reconciled", key=case.key)
    assert (rec["verdict"], rec["token"]) == ("confirmed", 2)
    assert logs.one("intent_confirmed", key=case.key)["reconciled"] is True
    assert logs.one("job_reclaimed", job_id=case.job_id)["previous_owner"] == W1
    assert "intent_started" not in logs.names(key=case.key, token=2)


def test_takeover_check_says_not_applied_but_w2_cannot_time_the_key_so_it_parks(
    takeover: Takeover,
) -> None:
    # Issue 26 defect 4: W1's clock timed the key's first start. Whether the target
    # still keeps the key (86,400 s) could be told only by comparing W1's clock with
    # W2's, and a lagging clock would repeat a payment whose key the target forgot:
    # W2 repeats nothing and parks the job as ambiguous for an operator, who retries
    # it (`intents resolve --retry`) once they have looked.
    t, case = takeover, takeover.cases["not_applied"]
    env, logs = t.env, t.logs
    assert case.final is JobState.PARKED
    assert t.checked(case) == 1
    assert t.calls_for(case) == []  # never repeated
    assert rows_for(env, case.payload.invoice) == []  # nothing charged
    intent = env.intent(case.key)
    assert (intent.state, intent.attempts, intent.last_token) == (IntentState.AMBIGUOUS, 1, 1)
    assert "comparing two machines' clocks" in (intent.reason or "")
    assert "intent_started" not in logs.names(key=case.key, token=2)
    assert logs.one("job_parked", job_id=case.job_id)["token"] == 2

    # W1 comes back with its old token. W2 called nothing, so no newer token reached
    # the receiver: W1's late call applies, once (the job stays parked; the target's
    # check now says applied, which the operator's resolve confirms). Never twice.
    charge(case.lost.call, env.url)
    assert [r["token"] for r in rows_for(env, case.payload.invoice)] == [1]


def test_takeover_nobody_can_tell_so_the_intent_is_ambiguous_and_the_job_parked(
    takeover: Takeover,
) -> None:
    t, case = takeover, takeover.cases["cannot_tell"]
    env, logs = t.env, t.logs
    assert case.final is JobState.PARKED
    assert t.calls_for(case) == []
    assert t.checked(case) == 1
    intent = env.intent(case.key)
    assert (intent.state, intent.attempts, intent.last_token) == (IntentState.AMBIGUOUS, 1, 1)
    assert "cannot tell" in (intent.reason or "")
    assert CANNOT_TELL_DETAIL in (intent.reason or "")
    job = view_of(env.job(case.job_id))
    assert job.error_code == "parked"
    assert CANNOT_TELL_DETAIL in (job.reason or "")
    assert case.key in (job.reason or "")
    # What an operator needs is kept: the payload, the attempt, W1's charge at the target.
    assert intent.payload_json == case.lost.spec.payload_json
    (attempt,) = env.attempts(case.key)
    assert (int(attempt.token), attempt.outcome) == (1, "started")
    assert len(rows_for(env, case.payload.invoice)) == 1  # W1's charge, untouched
    amb = logs.one("intent_ambiguous", key=case.key)
    assert (amb["token"], amb["attempt"]) == (2, 1)
    assert logs.one("job_parked", job_id=case.job_id)["token"] == 2


def test_takeover_parks_nothing_more_and_leaves_no_message(takeover: Takeover) -> None:
    parked = [c.job_id for c in takeover.cases.values() if c.final is JobState.PARKED]
    assert takeover.cases["cannot_tell"].job_id in parked
    assert takeover.cases["not_applied"].job_id in parked  # the one-clock rule
    assert takeover.env.queue_depth() == 0  # done or parked: every message is gone
    for job_id in parked:
        assert takeover.env.job_state(job_id) is JobState.PARKED
    assert_journal_clean(takeover.logs, "intent_reconciled", "intent_confirmed", "intent_ambiguous")


def test_w1s_late_confirm_during_w2s_check_is_replayed_not_parked(takeover: Takeover) -> None:
    t, case = takeover, takeover.cases["late_confirm"]
    intent = t.env.intent(case.key)
    assert intent.state is IntentState.CONFIRMED  # nothing is ambiguous
    assert t.calls_for(case) == []
    # Expected: W2 replays W1's confirmed charge. Today: parked, and not resolvable.
    assert case.final is JobState.SUCCEEDED, view_of(t.env.job(case.job_id)).reason
    assert result_of(t.env, case.job_id)["charge_id"] == intent.external_id


# =========================================================================== 3. receiver fence


def test_receiver_rejects_a_stale_token_with_a_new_key_and_accepts_an_equal_one_twice(
    env: Env, logs: LogCapture
) -> None:
    invoice = invoice_id()
    body = {"invoice": invoice, "amount": 5, "memo": SECRET}
    url = f"{env.url}/charge"

    def post(e: EffectCall) -> ToolResult:
        return http_json(e, url, id_field="charge_id")

    def ec(key: str, token: int) -> EffectCall:
        return EffectCall(key, token, f"job-{invoice}", "charge", "payments", body)

    first = post(ec(f"{invoice}:a", 5))
    second = post(ec(f"{invoice}:b", 5))  # equal token, another key: accepted
    assert first.response["_status"] == second.response["_status"] == 201
    assert first.external_id and second.external_id and first.external_id != second.external_id

    with pytest.raises(LeaseLost, match="fencing token 4"):
        post(ec(f"{invoice}:c", 4))  # stale token, brand-new key
    with pytest.raises(LeaseLost):
        post(ec(f"{invoice}:a", 4))  # stale token, known key: no replay either

    rows = rows_for(env, invoice)
    assert sorted((r["idem_key"], r["token"]) for r in rows) == [
        (f"{invoice}:a", 5),
        (f"{invoice}:b", 5),
    ]
    assert env.receiver.highest(f"job-{invoice}") == 5  # the fence's scope is the job
    assert env.receiver.record(f"{invoice}:c") is None
    assert logs.events("fence_rejected", idem_key=f"{invoice}:c")


# =========================================================================== 4. token moved


def test_the_intent_cannot_start_once_the_jobs_token_moved_on(env: Env, logs: LogCapture) -> None:
    app = make_app(one_charge(Charger(env.url)), None)
    invoice = invoice_id()
    job_id, p = submit(env, app, invoice)
    delivery = receive_one(env, visibility=30)
    first = claim(env, delivery, lease_seconds=30)
    assert first.token == 1

    calls: list[int] = []

    def tool_for(token: int) -> Callable[[], Any]:
        def tool() -> Any:
            calls.append(token)
            key = charge_key(invoice)
            return charge(
                EffectCall(key, token, job_id, "charge", "payments", effect_payload(p)), env.url
            )

        return tool

    spec = spec_for(job_id, p)
    env.driver.run(prepare_only(env, spec))  # written while token 1 was current
    # A take-over, as the duplicate rule makes it once it found the first owner gone.
    second = claim(env, delivery, lease_seconds=30, worker_id="w-second", take_from=first.token)
    assert second.token == 2

    # The raw start transaction under token 1: cancelled by the job's fence (entry 0).
    raw = env.driver.execute(
        env.intents.start(
            spec,
            jobs=env.jobs,
            token=1,
            worker_id=W1,
            expected=IntentState.PREPARED,
            attempts=0,
            wall_now=time.time(),
        )
    )
    assert isinstance(raw, Err) and raw.kind is ErrorKind.TRANSACTION_CANCELLED, raw
    assert [r.get("Code") for r in raw.reasons][:1] == ["ConditionalCheckFailed"], raw.reasons

    # The whole effect flow under token 1: LeaseLost, nothing started, the tool never runs.
    stale = spec_for(job_id, p, tool_for(1))
    with pytest.raises(LeaseLost, match="no longer current"):
        env.driver.run(
            effect_flow(
                env.intents, env.jobs, spec=stale, token=1, worker_id=W1, wall_clock=time.time
            )
        )
    intent = env.intent(spec.key)
    assert (intent.state, intent.attempts, intent.last_token) == (IntentState.PREPARED, 0, 0)
    assert env.attempts(spec.key) == []
    assert env.intent_record(spec.key).first_started_at is None
    assert calls == []
    assert rows_for(env, invoice) == []
    refused = logs.one("intent_start_refused", key=spec.key)
    assert (refused["token"], refused["reason"]) == (1, "token_moved")

    # The current token starts it (the refusal was the fence, not a broken request).
    done = env.driver.run(
        effect_flow(
            env.intents,
            env.jobs,
            spec=spec_for(job_id, p, tool_for(2)),
            token=2,
            worker_id="w-second",
            wall_clock=time.time,
        )
    )
    assert calls == [2]
    assert done.external_id == rows_for(env, invoice)[0]["charge_id"]
    intent = env.intent(spec.key)
    assert (intent.state, intent.attempts, intent.last_token) == (IntentState.CONFIRMED, 1, 2)
    (attempt,) = env.attempts(spec.key)
    assert (int(attempt.token), attempt.outcome) == (2, "ok")
    assert_journal_clean(logs, "intent_start_refused")


def prepare_only(env: Env, spec: EffectSpec) -> Flow[None]:
    prepared = yield from call(env.intents.prepare(spec, time.time()))
    assert isinstance(prepared, Ok), prepared


# =========================================================================== 5. resolution


def resolve_with_cli(env: Env, logs: LogCapture, key: str, *args: str) -> str:
    """``sqs-lease intents resolve KEY ...``; its journal lines join the captured logs."""
    journal = logging.getLogger(LOGGER_NAME)
    saved = (list(journal.handlers), journal.level, journal.propagate)
    assert env.settings.endpoint_url is not None
    try:
        result = CliRunner().invoke(
            cli,
            [
                "--endpoint-url",
                env.settings.endpoint_url,
                "--prefix",
                env.settings.prefix,
                "--queue",
                env.settings.queue,
                "intents",
                "resolve",
                key,
                *args,
            ],
        )
    finally:
        # The CLI binds the journal to the runner's stderr; give it back to the test.
        journal.handlers[:] = saved[0]
        journal.setLevel(saved[1])
        journal.propagate = saved[2]
    logs.add_output(result.stdout)
    logs.add_output(result.stderr)
    assert result.exit_code == 0, (result.output, result.stderr, result.exception)
    return result.stdout


OPERATOR, WHY = "ops@example.com", "checked the bank's settlement report"


def test_operator_resolutions_requeue_parked_jobs_and_a_worker_finishes_them(
    env: Env, logs: LogCapture, shell: Any
) -> None:
    """One parked job per decision, all parked by W2 and finished by W3 (to save time)."""
    charger, seen = Charger(env.url), list[IntentView]()
    app = make_app(one_charge(charger), cannot_tell(seen))
    w2_built = build(env, app, "w2", shell)  # while W1 works
    w3_built = build(env, app, "w3", shell)
    jobs: dict[Resolution, tuple[str, ChargePayload]] = {
        r: submit(env, app, invoice_id()) for r in Resolution
    }
    deliveries = receive_all(env, len(jobs), visibility=10)
    lost: dict[Resolution, Lost] = {}
    for r, (job_id, p) in jobs.items():
        # CONFIRMED: W1's charge went through (the operator finds it); otherwise it did not.
        lost[r] = w1_starts_then_stops(
            env, job_id, p, applies=r is Resolution.CONFIRMED, delivery=deliveries[job_id]
        )
    with running(w2_built):
        for job_id, _ in jobs.values():
            assert env.wait_job(job_id, JobState.PARKED, JobState.SUCCEEDED) is JobState.PARKED
    assert {v.key for v in seen} == {x.spec.key for x in lost.values()}
    assert charger.calls == []
    for x in lost.values():
        assert env.intent(x.spec.key).state is IntentState.AMBIGUOUS

    confirmed = lost[Resolution.CONFIRMED].applied
    assert confirmed is not None and confirmed.external_id
    external = confirmed.external_id
    decisions = {
        Resolution.CONFIRMED: (IntentState.CONFIRMED, ["--confirmed", external]),
        Resolution.RETRY: (IntentState.PREPARED, ["--retry"]),
        Resolution.ABANDON: (IntentState.ABANDONED, ["--abandon"]),
        Resolution.NEW_OPERATION: (IntentState.SUPERSEDED, ["--new-operation"]),
    }
    for r, (state, args) in decisions.items():
        job_id, key = jobs[r][0], lost[r].spec.key
        before = time.time()
        out = resolve_with_cli(env, logs, key, *args, "--reason", WHY, "--who", OPERATOR)
        successor = f"\tsuccessor {key}~op2" if r is Resolution.NEW_OPERATION else ""
        assert out == (
            f"{key}\t{state.value}{successor}\tjob {job_id} re-enqueued (one attempt granted)\n"
        )
        job = view_of(env.job(job_id))
        assert (job.state, job.error_code, job.message_sent) == (JobState.QUEUED, None, True)
        record = env.intent_record(key)
        assert (record.state, record.resolution, record.resolved_by) == (
            state.value,
            r.value,
            OPERATOR,
        )
        assert record.resolution_reason == WHY
        assert before <= record.resolved_at <= time.time()
        ev = logs.one("intent_resolved", key=key)
        assert (ev["resolution"], ev["who"], ev["reason"], ev["job_id"]) == (
            r.value,
            OPERATOR,
            WHY,
            job_id,
        )
        assert logs.one("job_resumed", job_id=job_id)
    assert env.queue_depth() == len(jobs)  # each decision sent its job's message again

    with running(w3_built) as w3:
        final = {
            r: env.wait_job(j, JobState.SUCCEEDED, JobState.FAILED) for r, (j, _) in jobs.items()
        }
    assert len(seen) == len(jobs)  # only W2 asked the target: nobody reconciles a decision
    assert env.queue_depth() == 0

    # CONFIRMED: the effect replays the operator's answer; the target is not called.
    job_id, key = jobs[Resolution.CONFIRMED][0], lost[Resolution.CONFIRMED].spec.key
    assert final[Resolution.CONFIRMED] is JobState.SUCCEEDED
    assert [c for c in charger.calls if c.key == key] == []
    intent = env.intent(key)
    assert (intent.state, intent.external_id) == (IntentState.CONFIRMED, external)
    assert result_of(env, job_id) == {"charge_id": external, "replayed": True, "reconciled": False}
    assert [
        (r["charge_id"], r["token"]) for r in rows_for(env, jobs[Resolution.CONFIRMED][1].invoice)
    ] == [(external, 1)]
    assert logs.one("intent_replayed", key=key)["token"] == 3
    assert intent_names(logs, key)[-2:] == ["intent_resolved", "intent_replayed"]

    # RETRY: repeated by W3 with the same key and payload; one charge, W3's token.
    (job_id, p), key = jobs[Resolution.RETRY], lost[Resolution.RETRY].spec.key
    assert final[Resolution.RETRY] is JobState.SUCCEEDED
    assert [(c.key, c.token, dict(c.payload)) for c in charger.calls if c.key == key] == [
        (key, 3, effect_payload(p))
    ]
    rows = rows_for(env, p.invoice)
    assert [r["token"] for r in rows] == [3]
    intent = env.intent(key)
    assert (intent.state, intent.attempts, intent.last_token) == (IntentState.CONFIRMED, 2, 3)
    assert intent.external_id == rows[0]["charge_id"]
    a1, a2 = env.attempts(key)
    assert (int(a1.token), a1.outcome) == (1, "started")
    assert (int(a2.token), a2.worker, a2.outcome) == (3, w3.worker_id, "ok")
    assert intent_names(logs, key)[-3:] == ["intent_resolved", "intent_started", "intent_confirmed"]

    # ABANDON: the job ends failed at the effect, with the operator's reason.
    (job_id, p), key = jobs[Resolution.ABANDON], lost[Resolution.ABANDON].spec.key
    assert final[Resolution.ABANDON] is JobState.FAILED
    failed = view_of(env.job(job_id))
    assert failed.error_code == "intent_abandoned"
    assert WHY in (failed.reason or "")
    assert env.intent(key).state is IntentState.ABANDONED
    assert rows_for(env, p.invoice) == []
    assert logs.one("job_failed", job_id=job_id)["error_code"] == "intent_abandoned"
    assert_journal_clean(
        logs, "intent_ambiguous", "intent_resolved", "intent_replayed", "intent_confirmed"
    )

    # NEW_OPERATION: the job goes on under the successor key, a new operation with
    # the same payload; the old intent stays superseded, the new one names it.
    (job_id, p), key = jobs[Resolution.NEW_OPERATION], lost[Resolution.NEW_OPERATION].spec.key
    assert final[Resolution.NEW_OPERATION] is JobState.SUCCEEDED
    new_key = f"{key}~op2"
    assert [(c.key, c.token) for c in charger.calls if c.key in (key, new_key)] == [(new_key, 3)]
    assert env.intent(key).state is IntentState.SUPERSEDED
    new_intent = env.intent_record(new_key)
    assert (new_intent.state, new_intent.predecessor) == ("confirmed", key)
    assert logs.one("intent_successor_followed", key=key)["successor"] == new_key


def w1_answers_late(env: Env, lost: Lost) -> Flow[EffectResult]:
    """W1's own answer, long after its lease: the core's confirm of attempt 1."""
    assert lost.applied is not None
    ctx = EffectCtx(
        env.intents, env.jobs, lost.spec, lost.claim.token, W1, time.time, "late", RETRY_WAITS
    )
    return confirm_intent(ctx, 1, lost.applied.response, lost.applied.external_id, reconciled=False)


def test_a_late_answer_confirms_an_intent_parked_or_retried_and_is_kept_when_abandoned(
    env: Env, logs: LogCapture, shell: Any
) -> None:
    """Soak seed 1808311 on moto: W1's call applied, but its answer comes after W2
    parked the job ambiguous. Parked: the answer confirms the intent, and the
    operator's retry (judged before it) only resumes the job. Retried first: the
    answer confirms the reopened intent before any later attempt starts. Abandoned
    first: the intent stays as decided; the answer goes to attempt 1's log and out
    as ``effect_applied_late``. No case charges twice."""
    charger, seen = Charger(env.url), list[IntentView]()
    app = make_app(one_charge(charger), cannot_tell(seen))
    w2_built = build(env, app, "w2", shell)
    w3_built = build(env, app, "w3", shell)
    cases = ("parked", "retried", "abandoned")
    jobs = {c: submit(env, app, invoice_id()) for c in cases}
    deliveries = receive_all(env, len(jobs), visibility=10)
    lost = {
        c: w1_starts_then_stops(env, job_id, p, applies=True, delivery=deliveries[job_id])
        for c, (job_id, p) in jobs.items()
    }
    with running(w2_built):
        for job_id, _ in jobs.values():
            assert env.wait_job(job_id, JobState.PARKED, JobState.SUCCEEDED) is JobState.PARKED
    keys = {c: x.spec.key for c, x in lost.items()}
    charge_ids = {c: x.applied.external_id for c, x in lost.items() if x.applied is not None}

    # Parked: the answer confirms it; the retry judged before it resumes the job only.
    out = env.driver.run(w1_answers_late(env, lost["parked"]))
    assert (out.external_id, out.replayed) == (charge_ids["parked"], False)
    record = env.intent_record(keys["parked"])
    assert (record.state, record.confirmed_late) == ("confirmed", "ambiguous")
    assert record.attention is None  # out of the operators' ambiguous index
    (a1,) = env.attempts(keys["parked"])
    assert (a1.outcome, a1.external_id) == ("ok", charge_ids["parked"])
    said = resolve_with_cli(env, logs, keys["parked"], "--retry", "--attempt", "1")
    assert "already confirmed" in said and "the decision was not applied" in said, said
    assert env.intent_record(keys["parked"]).resolution is None
    assert env.job_state(jobs["parked"][0]) is JobState.QUEUED

    # Retried, then the answer: the reopened intent is confirmed at attempt 1.
    resolve_with_cli(env, logs, keys["retried"], "--retry", "--attempt", "1")
    assert env.intent(keys["retried"]).state is IntentState.PREPARED
    out = env.driver.run(w1_answers_late(env, lost["retried"]))
    assert out.external_id == charge_ids["retried"]
    record = env.intent_record(keys["retried"])
    assert (record.state, record.confirmed_late, record.resolution, int(record.attempts)) == (
        "confirmed",
        "prepared",
        "retry",
        1,
    )

    # Abandoned, then the answer: kept in attempt 1's log, the decision stands.
    resolve_with_cli(env, logs, keys["abandoned"], "--abandon", "--reason", WHY)
    with pytest.raises(OwnershipUnknown):
        env.driver.run(w1_answers_late(env, lost["abandoned"]))
    assert env.intent(keys["abandoned"]).state is IntentState.ABANDONED
    (a1,) = env.attempts(keys["abandoned"])
    assert (a1.outcome, a1.external_id) == ("ok_late", charge_ids["abandoned"])
    late = logs.one("effect_applied_late", key=keys["abandoned"])
    assert (late["attempt"], late["intent_state"], late["resolution"]) == (
        1,
        "abandoned",
        "abandon",
    )

    with running(w3_built):
        final = {
            c: env.wait_job(j, JobState.SUCCEEDED, JobState.FAILED) for c, (j, _) in jobs.items()
        }
    assert final == {
        "parked": JobState.SUCCEEDED,
        "retried": JobState.SUCCEEDED,
        "abandoned": JobState.FAILED,
    }
    assert charger.calls == []  # nobody but W1 ever called the target
    for c in ("parked", "retried"):
        assert result_of(env, jobs[c][0]) == {
            "charge_id": charge_ids[c],
            "replayed": True,
            "reconciled": False,
        }
    for c, (_, p) in jobs.items():
        assert [r["token"] for r in rows_for(env, p.invoice)] == [1], c
    late_confirms = [e for e in logs.events("intent_confirmed") if e.get("late")]
    assert sorted(e["late"] for e in late_confirms) == ["ambiguous", "prepared"]
    assert_journal_clean(logs, "intent_ambiguous", "effect_applied_late", "intent_resolved")


# ======================================================================= shared keys, cut answers


def claimed_jobs(env: Env, app: App, invoice: str, *names: str) -> dict[str, Claimed]:
    """Jobs (one per name) for one invoice, each claimed: all of them on token 1."""
    payload = ChargePayload(invoice=invoice, amount=100, memo=SECRET)
    producer = Producer(env.settings, app, driver=env.driver)
    for name in names:
        producer.submit("charge", payload, job_id=f"{name}-{invoice}")
    got = receive_all(env, len(names), visibility=30)
    return {jid: claim(env, d, lease_seconds=30) for jid, d in got.items()}


def test_two_jobs_sharing_a_business_key_charge_once(env: Env, logs: LogCapture) -> None:
    # Issue 7.1, on a real moto server: jobs A and B both capture invoice X under the
    # documented key `payment:{invoice}:capture`, both on token 1. A prepares and
    # starts; B must never call the target. The old flow took A's start (attempt 1,
    # token 1) for its own and charged again, recorded nowhere.
    app = make_app(one_charge(Charger(env.url)), None)
    invoice = invoice_id()
    jobs = claimed_jobs(env, app, invoice, "job-a", "job-b")
    job_a, job_b = f"job-a-{invoice}", f"job-b-{invoice}"
    assert {c.token for c in jobs.values()} == {1}
    p = ChargePayload(invoice=invoice, amount=100, memo=SECRET)
    spec_a = spec_for(job_a, p)
    ec_a = EffectCall(spec_a.key, 1, job_a, "charge", "payments", effect_payload(p))
    prepared = env.driver.execute(env.intents.prepare(spec_a, time.time()))
    assert isinstance(prepared, Ok), prepared

    a_steps: list[str] = []

    def advance_a() -> None:
        """A's next step, run whenever B pauses (its lease check, its waits)."""
        if not a_steps:
            started = env.driver.execute(
                env.intents.start(
                    spec_a,
                    jobs=env.jobs,
                    token=1,
                    worker_id="w-a",
                    expected=IntentState.PREPARED,
                    attempts=0,
                    wall_now=time.time(),
                    start_id="a-start",
                )
            )
            assert isinstance(started, Ok), started
            a_steps.append("started")
        elif len(a_steps) == 1:
            applied = charge(ec_a, env.url)
            done = env.driver.execute(
                env.intents.confirm(
                    spec_a.key,
                    attempt=1,
                    response_json=json.dumps(dict(applied.response)),
                    external_id=applied.external_id,
                    wall_now=time.time(),
                    log_response="",
                    reconciled=False,
                    job_id=job_a,
                    token=1,
                )
            )
            assert isinstance(done, Ok), done
            a_steps.append("confirmed")

    b_calls: list[EffectCall] = []

    def b_tool() -> Any:
        ec = EffectCall(spec_a.key, 1, job_b, "charge", "payments", effect_payload(p))
        b_calls.append(ec)
        return charge(ec, env.url)

    spec_b = dataclasses.replace(spec_for(job_b, p, b_tool), lease_check=advance_a)
    b_driver = SyncDriver(env.settings, Journal(worker_id="w-b"), sleep=lambda _s: advance_a())
    result = b_driver.run(
        effect_flow(
            env.intents,
            env.jobs,
            spec=spec_b,
            token=1,
            worker_id="w-b",
            wall_clock=time.time,
            flow_id=uuid.uuid4().hex,
            held_waits=(0.1, 0.1, 0.1),
        )
    )

    assert b_calls == []
    charged = rows_for(env, invoice)
    assert len(charged) == 1 and charged[0]["token"] == 1
    assert (result.replayed, result.external_id) == (True, charged[0]["charge_id"])
    intent = env.intent(spec_a.key)
    assert (intent.state, intent.job_id, intent.attempts) == (IntentState.CONFIRMED, job_a, 1)
    assert [a.job_id for a in env.attempts(spec_a.key)] == [job_a]
    held = logs.events("intent_held_elsewhere", key=spec_a.key)
    assert held and all(e["holder"] == job_a and e["job_id"] == job_b for e in held)
    assert logs.one("intent_replayed", key=spec_a.key)["intent_job"] == job_a


@pytest.mark.parametrize("holder_end", ["failed", "cancelled"])
def test_a_shared_key_prepared_by_a_job_that_ended_for_good_is_taken_over_by_the_next(
    env: Env, logs: LogCapture, holder_end: str
) -> None:
    # Issue 7/14 follow-up, on a real moto server: job A prepared the shared key
    # `payment:{invoice}:capture` and then ended for good without starting it (failed
    # on another error, or cancelled). Job B needs the same capture. The old flow
    # made B wait for A (which never comes back) and park it with IntentBusy; now B
    # takes the prepared intent over (nothing of A's can be in flight, and A can never
    # start it: its start is fenced on its own record being running) and charges once.
    app = make_app(one_charge(Charger(env.url)), None)
    invoice = invoice_id()
    claimed_jobs(env, app, invoice, "job-a", "job-b")
    job_a, job_b = f"job-a-{invoice}", f"job-b-{invoice}"
    p = ChargePayload(invoice=invoice, amount=100, memo=SECRET)
    spec_a = spec_for(job_a, p)
    assert isinstance(env.driver.execute(env.intents.prepare(spec_a, time.time())), Ok)
    if holder_end == "failed":
        ended = env.jobs.end_in_error(
            job_a, 1, W1, "boom", "handler_error", time.time(), write_id="n-1:fail", retry=False
        )
    else:
        ended = env.jobs.cancel(job_a, "operator", time.time())
    assert isinstance(env.driver.execute(ended), Ok)

    b_calls: list[EffectCall] = []

    def b_tool() -> Any:
        ec = EffectCall(spec_a.key, 1, job_b, "charge", "payments", effect_payload(p))
        b_calls.append(ec)
        return charge(ec, env.url)

    result = env.driver.run(
        effect_flow(
            env.intents,
            env.jobs,
            spec=spec_for(job_b, p, b_tool),
            token=1,
            worker_id="w-b",
            wall_clock=time.time,
            flow_id=uuid.uuid4().hex,
            held_waits=(0.1, 0.1, 0.1),
        )
    )
    assert len(b_calls) == 1 and result.replayed is False
    charged = rows_for(env, invoice)
    assert len(charged) == 1 and result.external_id == charged[0]["charge_id"]
    intent = env.intent(spec_a.key)
    assert (intent.state, intent.job_id, intent.attempts) == (IntentState.CONFIRMED, job_b, 1)
    taken = logs.one("intent_taken_over", key=spec_a.key)
    assert (taken["holder"], taken["job_id"]) == (job_a, job_b)
    # A cancelled holder has ended for good, as a failed one has.
    assert taken["holder_state"] == holder_end


def test_a_shared_key_prepared_by_a_running_job_is_not_taken_over(
    env: Env, logs: LogCapture
) -> None:
    # The same, with A still running: B waits and parks with IntentBusy, A keeps it.
    app = make_app(one_charge(Charger(env.url)), None)
    invoice = invoice_id()
    claimed_jobs(env, app, invoice, "job-a", "job-b")
    job_a, job_b = f"job-a-{invoice}", f"job-b-{invoice}"
    p = ChargePayload(invoice=invoice, amount=100, memo=SECRET)
    spec_a = spec_for(job_a, p)
    assert isinstance(env.driver.execute(env.intents.prepare(spec_a, time.time())), Ok)
    with pytest.raises(IntentBusy, match=job_a):
        env.driver.run(
            effect_flow(
                env.intents,
                env.jobs,
                spec=spec_for(job_b, p),
                token=1,
                worker_id="w-b",
                wall_clock=time.time,
                flow_id=uuid.uuid4().hex,
                held_waits=(0.1, 0.1),
            )
        )
    assert rows_for(env, invoice) == []
    intent = env.intent(spec_a.key)
    assert (intent.state, intent.job_id) == (IntentState.PREPARED, job_a)
    assert logs.events("intent_taken_over", key=spec_a.key) == []


def test_another_job_cannot_start_an_intent_it_does_not_hold(env: Env) -> None:
    # The start transaction itself refuses a job that is not the intent's: even a
    # flow that skipped the wait could not run another job's effect.
    app = make_app(one_charge(Charger(env.url)), None)
    invoice = invoice_id()
    claimed_jobs(env, app, invoice, "job-a", "job-b")
    p = ChargePayload(invoice=invoice, amount=100, memo=SECRET)
    spec_a, spec_b = spec_for(f"job-a-{invoice}", p), spec_for(f"job-b-{invoice}", p)
    assert isinstance(env.driver.execute(env.intents.prepare(spec_a, time.time())), Ok)
    out = env.driver.execute(
        env.intents.start(
            spec_b,
            jobs=env.jobs,
            token=1,
            worker_id="w-b",
            expected=IntentState.PREPARED,
            attempts=0,
            wall_now=time.time(),
            start_id="b-start",
        )
    )
    assert isinstance(out, Err) and out.kind is ErrorKind.TRANSACTION_CANCELLED
    assert [r.get("Code") for r in out.reasons][:2] == ["None", "ConditionalCheckFailed"]
    assert env.intent(spec_a.key).state is IntentState.PREPARED


def test_a_response_cut_in_half_is_reconciled_never_repeated(env: Env, logs: LogCapture) -> None:
    # Issue 7.2: the target applies the charge and the connection dies halfway
    # through its answer. That was a plain IncompleteRead: the intent reopened and
    # the next attempt charged again. Now it is outcome unknown: the check confirms.
    applied: list[bytes] = []

    class CutHandler(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            conn: socket.socket = self.request
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                data += chunk
            applied.append(data)  # the effect applies here
            body = json.dumps({"charge_id": "ch_cut", "ok": True}).encode()
            head = (
                "HTTP/1.1 201 Created\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
            ).encode()
            conn.sendall(head + body[: len(body) // 2])
            conn.shutdown(socket.SHUT_RDWR)

    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), CutHandler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/charge"
    try:
        app = make_app(one_charge(Charger(env.url)), None)
        invoice = invoice_id()
        (claimed,) = claimed_jobs(env, app, invoice, "job").values()
        job_id = f"job-{invoice}"
        p = ChargePayload(invoice=invoice, amount=100, memo=SECRET)

        def tool() -> Any:
            ec = EffectCall(charge_key(invoice), claimed.token, job_id, "charge", "payments", {})
            return http_json(ec, url, id_field="charge_id", timeout=10)

        def check(view: IntentView) -> CheckAnswer:
            if applied:
                return CheckAnswer(Verdict.CONFIRMED, "ch_cut", {"charge_id": "ch_cut"}, "seen")
            return CheckAnswer(Verdict.NOT_APPLIED, detail="not seen")

        spec = dataclasses.replace(spec_for(job_id, p, tool), check=check)
        result = env.driver.run(
            effect_flow(
                env.intents,
                env.jobs,
                spec=spec,
                token=claimed.token,
                worker_id="w-cut",
                wall_clock=time.time,
                flow_id=uuid.uuid4().hex,
            )
        )
    finally:
        server.shutdown()
        server.server_close()

    assert len(applied) == 1
    assert (result.external_id, result.reconciled) == ("ch_cut", True)
    intent = env.intent(spec.key)
    assert (intent.state, intent.attempts) == (IntentState.CONFIRMED, 1)
    (attempt,) = env.attempts(spec.key)
    assert attempt.outcome == "confirmed_by_check"
    assert logs.one("tool_request_failed", key=spec.key)["outcome_unknown"] is True
