"""Every branch of the intent flows (``effect_flow``, ``resolve_flow``), driven by hand.

No AWS, no network: :class:`EffectScript` plays the driver. It answers the
DynamoDB/SQS calls from a script and runs the flow's ``Invoke`` instructions
(lease check, tool, reconciliation check) itself, like the sync driver does. The
real ``IntentTable`` and ``JobTable`` build the request parameters, so the
conditions checked here are the ones sent to DynamoDB.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

import pytest
from core_harness import (
    TABLE,
    WORKER,
    Responder,
    Script,
    assert_fenced,
    condition_equalities,
    condition_failed,
    decode,
    err,
    job_item,
    ok,
    table,
    unreachable,
    update_removes,
)

from sqs_lease._core.calls import Call, Emit, Err, ErrorKind, Flow, Invoke, Ok, Outcome, Sleep
from sqs_lease._core.effectflow import HELD_WAITS, MAX_REPEATS, effect_flow
from sqs_lease._core.endings import EndKind, ending_for
from sqs_lease._core.intents import (
    LOG_LIMIT,
    CheckAnswer,
    EffectResult,
    EffectSpec,
    IntentState,
    IntentView,
    ToolResult,
    Verdict,
    default_key,
    start_id_for,
)
from sqs_lease._core.intentwrites import RETRY_WAITS, TRANSIENT_TRIES
from sqs_lease._core.records import JobState
from sqs_lease._core.resolving import Resolution
from sqs_lease._core.retention import OwnStarts, first_start_stamp, first_started_by
from sqs_lease._errors import (
    FenceRefused,
    IntentAmbiguous,
    IntentBusy,
    IntentPayloadMismatch,
    LeaseLost,
    OwnershipUnknown,
    PermanentError,
    ToolNotApplied,
    ToolOutcomeUnknown,
    TransientError,
)
from sqs_lease._schema.intent_requests import IntentTable
from sqs_lease._schema.models import IntentRecord
from sqs_lease._schema.views import intent_view_of

T = TypeVar("T")

WALL = 1_700_000_500.0
INTENTS = "intents-test"
ATTEMPTS = "attempts-test"
JOB = "job-1"
KEY = default_key(JOB, "main", "charge", "payments", None)
SECRET = "s3cr3t-memo-7f2c"
PAYLOAD = json.dumps({"amount": 100, "invoice": "inv-1", "memo": SECRET}, sort_keys=True)
HASH = "hash-pay-1"
INVOKE_SENT, INVOKE_RECEIVED = 10.0, 10.25


# =========================================================================== the driver


class EffectScript(Script):
    """:class:`Script` whose ``Invoke`` outcomes carry driver timings, as the sync driver's do.

    The tool's duration in ``tool_request_finished`` comes from them.
    """

    def __init__(
        self, answers: Responder | Iterable[Outcome] = (), *, mono: Mono | None = None
    ) -> None:
        super().__init__(answers)
        self.invoked: list[Invoke] = []
        self.mono = mono  # None: every Invoke stamped INVOKE_SENT, INVOKE_RECEIVED

    def _invoke(self, inv: Invoke) -> Outcome:
        sent = INVOKE_SENT if self.mono is None else self.mono()
        try:
            value = inv.fn()
        except Exception as exc:
            received = INVOKE_RECEIVED if self.mono is None else self.mono()
            return Err(
                ErrorKind.RAISED, type(exc).__name__, "", str(exc), None, (), sent, received, exc
            )
        received = INVOKE_RECEIVED if self.mono is None else self.mono()
        return Ok({"value": value}, sent, received)

    def run(self, flow: Flow[T]) -> T:
        try:
            instruction = next(flow)
            while True:
                self.trace.append(instruction)
                answer: Outcome | None
                if isinstance(instruction, Call):
                    self.calls.append(instruction)
                    answer = self._answer(instruction)
                elif isinstance(instruction, Invoke):
                    self.invoked.append(instruction)
                    answer = self._invoke(instruction)
                elif isinstance(instruction, Sleep):
                    self.sleeps.append(instruction.seconds)
                    answer = Ok({})
                else:
                    self.events.append(instruction)
                    answer = None
                instruction = flow.send(answer)
        except StopIteration as stop:
            result: T = stop.value
        if self._queue:
            raise AssertionError(f"flow ended with {len(self._queue)} scripted outcome(s) unused")
        return result

    @property
    def invokes(self) -> list[str]:
        """The caller code the flow ran (the wall clock's readings left out)."""
        return [i.what for i in self.invoked if i.what != "wall_clock"]

    @property
    def kinds(self) -> list[str]:
        out: list[str] = []
        for i in self.trace:
            if isinstance(i, Call):
                out.append(f"call:{i.op}")
            elif isinstance(i, Invoke):
                out.append(f"invoke:{i.what}")
            elif isinstance(i, Sleep):
                out.append("sleep")
            elif isinstance(i, Emit):
                out.append(f"emit:{i.event}")
        return out


class Tool:
    """A tool function: answers (or raises) from a list, the last one repeating."""

    def __init__(self, *outcomes: Any) -> None:
        self.outcomes = list(outcomes) or [ToolResult({"charge_id": "ch_1"}, "ch_1")]
        self.calls = 0

    def __call__(self) -> Any:
        self.calls += 1
        out = self.outcomes[min(self.calls, len(self.outcomes)) - 1]
        if isinstance(out, BaseException):
            raise out
        return out


class Check:
    """A reconciliation check: answers from a list (the last repeating), records the views."""

    def __init__(self, *outcomes: Any) -> None:
        self._tool = Tool(*outcomes)
        self.views: list[IntentView] = []

    @property
    def calls(self) -> int:
        return self._tool.calls

    def __call__(self, view: IntentView) -> Any:
        self.views.append(view)
        return self._tool()


class LeaseCheck:
    """The local lease check: raises ``exc`` from its ``fail_from``-th call on."""

    def __init__(self, exc: BaseException | None = None, *, fail_from: int = 1) -> None:
        self.exc = exc
        self.fail_from = fail_from
        self.calls = 0

    def __call__(self) -> None:
        self.calls += 1
        if self.exc is not None and self.calls >= self.fail_from:
            raise self.exc


# =========================================================================== builders


def itable() -> IntentTable:
    return IntentTable(INTENTS, ATTEMPTS)


def spec(
    tool: Callable[[], Any] | None = None,
    *,
    check: Callable[[IntentView], CheckAnswer] | None = None,
    lease_check: Callable[[], None] | None = None,
    may_record: Callable[[], bool] | None = None,
    payload_hash: str = HASH,
    log_bodies: bool = False,
    key_retention_seconds: float | None = 86_400.0,
    job_id: str = JOB,
    key: str = KEY,
) -> EffectSpec:
    return EffectSpec(
        key=key,
        job_id=job_id,
        stage="main",
        action="charge",
        target="payments",
        payload_json=PAYLOAD,
        payload_hash=payload_hash,
        tool=tool or Tool(),
        check=check,
        lease_check=lease_check,
        may_record=may_record,
        log_bodies=log_bodies,
        key_retention_seconds=key_retention_seconds,
    )


def intent_item(
    state: IntentState,
    *,
    attempts: int = 0,
    payload_hash: str = HASH,
    response: str | None = None,
    external_id: str | None = None,
    reason: str | None = None,
    last_token: int = 0,
    job_id: str = JOB,
    start_id: str | None = None,
    first_started_at: float | None = None,
    first_started_by: str | None = None,
) -> dict[str, Any]:
    """A low-level intent item, serialised by the real pynamodb model (``first_started_by``:
    the worker whose clock stamped ``first_started_at``, as the start writes it)."""
    record = IntentRecord(
        intent_key=KEY,
        job_id=job_id,
        stage="main",
        action="charge",
        target="payments",
        state=state.value,
        payload=PAYLOAD,
        payload_hash=payload_hash,
        attempts=attempts,
        last_token=last_token,
        external_id=external_id,
        response=response,
        reason=reason,
        created_at=WALL - 100,
        updated_at=WALL - 50,
        start_id=start_id,
        first_started_at=first_started_at,
        first_start=(
            first_start_stamp(first_started_at, first_started_by)
            if first_started_at is not None and first_started_by is not None
            else None
        ),
    )
    item: dict[str, Any] = record.serialize()
    return item


def cancelled(*codes: str) -> Err:
    return Err(
        ErrorKind.TRANSACTION_CANCELLED,
        code="TransactionCanceledException",
        message="Transaction cancelled",
        reasons=tuple({"Code": c} for c in codes),
    )


class Mono:
    """The driver's lease clock (monotonic): it moves only when a test moves it."""

    def __init__(self, start: float = 1_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now


class Wall:
    """A wall clock that moves one second at every reading, so that each write's
    time tells which reading it took (the core must read it before every write)."""

    def __init__(self, start: float = WALL) -> None:
        self.now = start - 1.0
        self.readings: list[float] = []

    def __call__(self) -> float:
        self.now += 1.0
        self.readings.append(self.now)
        return self.now


def run_effect(
    script: EffectScript,
    s: EffectSpec,
    *,
    token: int = 7,
    wall: Wall | None = None,
    job_id: str = JOB,
    flow_id: str = "flow-1",
    own_starts: OwnStarts | None = None,
) -> EffectResult:
    return script.run(
        effect_flow(
            itable(),
            table(),
            spec=s,
            token=token,
            worker_id=WORKER,
            wall_clock=wall or Wall(),
            flow_id=flow_id,
            own_starts=own_starts,
        )
    )


def started_here(started_at: float = WALL - 60, mono: float = INVOKE_SENT - 60) -> OwnStarts:
    """This process's memory of its own first start of KEY (at wall ``started_at``, on
    its lease clock at ``mono``): an intent it stamped, read back by a later flow."""
    starts = OwnStarts()
    starts.remember(KEY, started_at, mono)
    return starts


def sets(params: Mapping[str, Any]) -> dict[str, Any]:
    """``attribute -> decoded value`` of an UpdateExpression's SET clause.

    ``if_not_exists(a, :v)`` decodes to ``:v`` (the value written when ``a`` is absent).
    """
    names: Mapping[str, str] = params.get("ExpressionAttributeNames", {})
    values: Mapping[str, Any] = params.get("ExpressionAttributeValues", {})
    expression = str(params["UpdateExpression"])
    found: dict[str, Any] = {}
    pattern = r"(#\w+) = (?:if_not_exists \(#\w+, (:\w+)\)|(:\w+))"
    for name, default, value in re.findall(pattern, expression):
        found[names[name]] = decode(values[default or value])
    return found


def item_values(item: Mapping[str, Any]) -> dict[str, Any]:
    return {k: decode(v) for k, v in item.items()}


def transact(c: Call) -> list[Mapping[str, Any]]:
    assert (c.service, c.op) == ("dynamodb", "TransactWriteItems")
    items: list[Mapping[str, Any]] = list(c.params["TransactItems"])
    return items


def only(entry: Mapping[str, Any], kind: str) -> Mapping[str, Any]:
    assert list(entry) == [kind], entry
    params: Mapping[str, Any] = entry[kind]
    return params


def key_of(params: Mapping[str, Any]) -> dict[str, Any]:
    return item_values(params["Key"])


def assert_start(
    c: Call,
    *,
    token: int,
    expected: IntentState,
    attempts: int,
    worker: str = WORKER,
    at: float | None = None,
) -> None:
    """The start transaction: fence on the job, the intent as seen, the attempt logged."""
    items = transact(c)
    repeat = expected is IntentState.IN_PROGRESS and attempts > 0
    assert len(items) == (4 if repeat else 3)
    if repeat:
        # The earlier attempt is closed with the check's verdict in the same transaction.
        closed = only(items[3], "Update")
        assert closed["TableName"] == ATTEMPTS
        assert key_of(closed) == {"intent_key": KEY, "attempt": attempts}
        assert sets(closed)["outcome"] == "not_applied_by_check"
    fence = only(items[0], "ConditionCheck")
    assert fence["TableName"] == TABLE
    assert key_of(fence) == {"job_id": JOB}
    assert_fenced(fence, token=token)
    assert condition_equalities(fence) == {"token": token, "state": "running"}

    intent = only(items[1], "Update")
    assert intent["TableName"] == INTENTS
    assert key_of(intent) == {"intent_key": KEY}
    assert condition_equalities(intent) == {
        "state": expected.value,
        "attempts": attempts,
        "job_id": JOB,
    }
    assert " OR " not in str(intent["ConditionExpression"])
    written = sets(intent)
    assert written["state"] == "in_progress"
    assert written["attempts"] == attempts + 1
    assert written["last_token"] == token
    assert "first_started_at" in written
    assert written["start_id"].startswith(f"{JOB}|{token}|{attempts + 1}|{worker}|")

    put = only(items[2], "Put")
    assert put["TableName"] == ATTEMPTS
    assert "attribute_not_exists" in str(put["ConditionExpression"])
    assert item_values(put["Item"]) == {
        "intent_key": KEY,
        "attempt": attempts + 1,
        "job_id": JOB,
        "token": token,
        "worker": worker,
        "tool": "payments",
        "action": "charge",
        "payload_hash": HASH,
        "started_at": at if at is not None else item_values(put["Item"])["started_at"],
        "outcome": "started",
        "success": "completed",  # what the target's success means, kept per attempt
    }
    assert written["updated_at"] == item_values(put["Item"])["started_at"]


def assert_confirm(
    c: Call,
    *,
    attempt: int,
    external_id: str | None,
    reconciled: bool,
    response: Any,
    at: float | None = None,
) -> None:
    items = transact(c)
    intent = only(items[0], "Update")
    assert intent["TableName"] == INTENTS
    assert key_of(intent) == {"intent_key": KEY}
    assert condition_equalities(intent) == {"state": "in_progress", "attempts": attempt}
    written = sets(intent)
    assert written["state"] == "confirmed"
    assert written["reconciled"] is reconciled
    assert json.loads(written["response"]) == response
    assert written.get("external_id") == external_id
    assert len(items) == 2
    att = only(items[1], "Update")
    assert att["TableName"] == ATTEMPTS
    assert key_of(att) == {"intent_key": KEY, "attempt": attempt}
    att_sets = sets(att)
    assert att_sets["outcome"] == ("confirmed_by_check" if reconciled else "ok")
    assert att_sets["ended_at"] == (at if at is not None else written["confirmed_at"])
    assert written["confirmed_at"] == written["updated_at"] == att_sets["ended_at"]
    assert att_sets.get("external_id") == external_id


def no_payload_in(events: Sequence[Emit]) -> None:
    text = json.dumps([[e.event, dict(e.fields)] for e in events], default=str)
    assert SECRET not in text
    assert PAYLOAD not in text


# =========================================================================== the driver itself


def test_effect_script_runs_invokes_and_refuses_leftovers() -> None:
    s = EffectScript([ok(), ok(), ok(), ok()])
    with pytest.raises(AssertionError, match="1 scripted outcome"):
        run_effect(s, spec())
    assert s.invokes == ["tool"]


def test_default_key_is_job_stage_action_target_and_version() -> None:
    assert default_key("j", "main", "charge", "payments", None) == "j:main:charge:payments"
    assert default_key("j", "draft", "mail", "smtp", "2") == "j:draft:mail:smtp:v2"


# =========================================================================== fresh effect


def test_fresh_effect_prepares_starts_fenced_calls_the_tool_once_and_confirms() -> None:
    tool = Tool(ToolResult({"charge_id": "ch_1", "amount": 100}, "ch_1"))
    lc = LeaseCheck()
    s = EffectScript([ok(), ok(), ok()])

    wall = Wall()
    res = run_effect(s, spec(tool, lease_check=lc), token=7, wall=wall)

    assert res == EffectResult({"charge_id": "ch_1", "amount": 100}, "ch_1", False, False, KEY)
    # Each write carries its own reading of the wall clock.
    prepared_at, started_at, confirmed_at = wall.readings
    assert (prepared_at, started_at, confirmed_at) == (WALL, WALL + 1, WALL + 2)
    assert item_values(s.calls[0].params["Item"])["created_at"] == prepared_at
    assert s.kinds == [
        "invoke:lease_check",
        "invoke:wall_clock",
        "call:PutItem",
        "emit:intent_prepared",
        "invoke:lease_check",
        "invoke:wall_clock",
        "call:TransactWriteItems",
        "emit:intent_started",
        "emit:tool_request_started",
        "invoke:tool",
        "emit:tool_request_finished",
        "invoke:wall_clock",
        "call:TransactWriteItems",
        "emit:intent_confirmed",
    ]
    assert (tool.calls, lc.calls) == (1, 2)

    prepare = s.calls[0].params
    assert prepare["TableName"] == INTENTS
    assert prepare["ReturnValuesOnConditionCheckFailure"] == "ALL_OLD"
    assert re.fullmatch(r"attribute_not_exists \(#\w+\)", str(prepare["ConditionExpression"]))
    assert list(prepare["ExpressionAttributeNames"].values()) == ["intent_key"]
    stored = item_values(prepare["Item"])
    assert {k: stored[k] for k in ("intent_key", "job_id", "state", "attempts")} == {
        "intent_key": KEY,
        "job_id": JOB,
        "state": "prepared",
        "attempts": 0,
    }
    assert (stored["payload"], stored["payload_hash"]) == (PAYLOAD, HASH)

    assert_start(s.calls[1], token=7, expected=IntentState.PREPARED, attempts=0, at=started_at)
    assert_confirm(
        s.calls[2],
        attempt=1,
        external_id="ch_1",
        reconciled=False,
        response={"charge_id": "ch_1", "amount": 100},
        at=confirmed_at,
    )
    # The attempt log keeps no response body unless the target opted in.
    assert "response" not in sets(only(transact(s.calls[2])[1], "Update"))

    prepared = s.event("intent_prepared")
    assert (prepared["key"], prepared["payload_hash"], prepared["token"]) == (KEY, HASH, 7)
    started = s.event("intent_started")
    assert (started["attempt"], started["token"], started["payload_hash"]) == (1, 7, HASH)
    finished = s.event("tool_request_finished")
    assert (finished["duration"], finished["external_id"]) == (0.25, "ch_1")
    confirmed = s.event("intent_confirmed")
    assert (confirmed["external_id"], confirmed["reconciled"], confirmed["attempt"]) == (
        "ch_1",
        False,
        1,
    )
    no_payload_in(s.events)


@pytest.mark.parametrize(
    ("value", "response", "external_id"),
    [
        ({"id": "x", "ok": True}, {"id": "x", "ok": True}, None),
        ("plain", {"value": "plain"}, None),
        (ToolResult({"a": 1}), {"a": 1}, None),
    ],
)
def test_tool_return_values_become_the_stored_response(
    value: Any, response: dict[str, Any], external_id: str | None
) -> None:
    s = EffectScript([ok(), ok(), ok()])
    res = run_effect(s, spec(Tool(value)))
    assert (res.response, res.external_id, res.replayed) == (response, external_id, False)
    assert json.loads(sets(only(transact(s.calls[2])[0], "Update"))["response"]) == response


def test_log_bodies_stores_a_bounded_response_in_the_attempt_log() -> None:
    big = {"blob": "x" * (3 * LOG_LIMIT)}
    s = EffectScript([ok(), ok(), ok()])
    run_effect(s, spec(Tool(ToolResult(big, "ch")), log_bodies=True))
    att = sets(only(transact(s.calls[2])[1], "Update"))
    logged = json.loads(att["response"])
    assert logged["truncated"] is True
    assert len(att["response"]) <= LOG_LIMIT
    # The intent keeps the whole (smaller than its own limit) response.
    assert json.loads(sets(only(transact(s.calls[2])[0], "Update"))["response"]) == big


def test_prepare_unanswered_is_ownership_unknown_and_nothing_runs() -> None:
    tool, lc = Tool(), LeaseCheck()
    s = EffectScript([unreachable()])
    with pytest.raises(OwnershipUnknown, match="prepare intent"):
        run_effect(s, spec(tool, lease_check=lc))
    assert (s.ops, s.invokes, tool.calls, lc.calls) == (
        ["dynamodb.PutItem"],
        ["lease_check"],
        0,
        1,
    )


def test_prepare_condition_failed_without_item_is_ownership_unknown() -> None:
    s = EffectScript([condition_failed(None)])
    with pytest.raises(OwnershipUnknown):
        run_effect(s, spec())
    assert s.invokes == []


# =========================================================================== existing intents


@pytest.mark.parametrize("state", list(IntentState))
def test_same_key_other_payload_is_refused_without_calling_the_tool(state: IntentState) -> None:
    tool, lc = Tool(), LeaseCheck()
    stored = "hash-other-payload"
    s = EffectScript([condition_failed(intent_item(state, attempts=1, payload_hash=stored))])
    with pytest.raises(IntentPayloadMismatch, match=stored[:12]):
        run_effect(s, spec(tool, lease_check=lc))
    assert s.ops == ["dynamodb.PutItem"]
    assert (s.invokes, tool.calls) == (["lease_check"], 0)
    refused = s.event("intent_refused")
    assert (refused["reason"], refused["payload_hash"], refused["stored_hash"]) == (
        "payload_mismatch",
        HASH,
        stored,
    )
    assert "intent_started" not in s.event_names()


def test_confirmed_intent_replays_the_stored_response_without_start_or_tool() -> None:
    tool, lc = Tool(), LeaseCheck()
    item = intent_item(
        IntentState.CONFIRMED,
        attempts=1,
        response='{"charge_id":"ch_9","amount":100}',
        external_id="ch_9",
    )
    s = EffectScript([condition_failed(item)])
    res = run_effect(s, spec(tool, lease_check=lc), token=4)
    assert res == EffectResult({"charge_id": "ch_9", "amount": 100}, "ch_9", True, False, KEY)
    assert s.ops == ["dynamodb.PutItem"]
    assert (s.invokes, tool.calls) == (["lease_check"], 0)
    replayed = s.event("intent_replayed")
    assert (replayed["key"], replayed["external_id"], replayed["token"]) == (KEY, "ch_9", 4)
    assert "intent_prepared" not in s.event_names()


def test_ambiguous_intent_raises_intent_ambiguous_and_touches_nothing() -> None:
    tool = Tool()
    s = EffectScript([condition_failed(intent_item(IntentState.AMBIGUOUS, attempts=1))])
    with pytest.raises(IntentAmbiguous, match="waits for an operator"):
        run_effect(s, spec(tool, check=Check(CheckAnswer(Verdict.CONFIRMED))))
    assert (s.ops, s.invokes, tool.calls) == (["dynamodb.PutItem"], [], 0)


def test_abandoned_intent_is_a_permanent_error_with_the_operators_reason() -> None:
    tool = Tool()
    item = intent_item(IntentState.ABANDONED, attempts=1, reason="customer refunded by hand")
    s = EffectScript([condition_failed(item)])
    with pytest.raises(PermanentError, match="customer refunded by hand") as caught:
        run_effect(s, spec(tool))
    assert caught.value.code == "intent_abandoned"
    assert (s.ops, s.invokes, tool.calls) == (["dynamodb.PutItem"], [], 0)


def test_prepared_intent_left_by_an_earlier_attempt_starts_from_its_attempt_count() -> None:
    check = Check(CheckAnswer(Verdict.CONFIRMED, "never"))
    s = EffectScript([condition_failed(intent_item(IntentState.PREPARED, attempts=2)), ok(), ok()])
    res = run_effect(s, spec(check=check), token=9)
    assert (res.replayed, res.reconciled, check.calls) == (False, False, 0)
    assert_start(s.calls[1], token=9, expected=IntentState.PREPARED, attempts=2)
    assert_confirm(
        s.calls[2], attempt=3, external_id="ch_1", reconciled=False, response={"charge_id": "ch_1"}
    )


# =========================================================================== reconciliation


def test_in_progress_confirmed_by_the_check_is_confirmed_without_calling_the_tool() -> None:
    tool, lc = Tool(), LeaseCheck()
    check = Check(CheckAnswer(Verdict.CONFIRMED, "ch_5", {"charge_id": "ch_5"}, "found it"))
    s = EffectScript([condition_failed(intent_item(IntentState.IN_PROGRESS, attempts=2)), ok()])
    res = run_effect(s, spec(tool, check=check, lease_check=lc), token=3)
    assert res == EffectResult({"charge_id": "ch_5"}, "ch_5", False, True, KEY)
    assert s.ops == ["dynamodb.PutItem", "dynamodb.TransactWriteItems"]
    assert (s.invokes, tool.calls, check.calls) == (["lease_check", "check"], 0, 1)
    assert_confirm(
        s.calls[1], attempt=2, external_id="ch_5", reconciled=True, response={"charge_id": "ch_5"}
    )
    rec = s.event("intent_reconciled")
    assert (rec["verdict"], rec["external_id"], rec["attempt"], rec["token"]) == (
        "confirmed",
        "ch_5",
        2,
        3,
    )
    assert s.event("intent_confirmed")["reconciled"] is True
    assert "intent_started" not in s.event_names()


def test_in_progress_not_applied_repeats_with_the_same_key_and_payload() -> None:
    tool, lc = Tool(ToolResult({"charge_id": "ch_2"}, "ch_2")), LeaseCheck()
    check = Check(CheckAnswer(Verdict.NOT_APPLIED, detail="no such key"))
    # This process made the first start (a minute ago on its lease clock) under the
    # job's earlier token: the repeat is inside the target's key retention.
    item = intent_item(
        IntentState.IN_PROGRESS,
        attempts=1,
        last_token=1,
        first_started_at=WALL - 60,
        first_started_by=WORKER,
    )
    s = EffectScript([condition_failed(item), ok(), ok()])
    the_spec = spec(tool, check=check, lease_check=lc)
    res = run_effect(s, the_spec, token=2, own_starts=started_here())
    assert res == EffectResult({"charge_id": "ch_2"}, "ch_2", False, False, KEY)
    assert s.invokes == ["lease_check", "check", "lease_check", "tool"]
    tool_invokes = [i for i in s.invoked if i.what == "tool"]
    assert tool_invokes[-1].fn is the_spec.tool  # the very same call (same key, same payload)
    assert tool.calls == 1
    assert_start(s.calls[1], token=2, expected=IntentState.IN_PROGRESS, attempts=1)
    assert_confirm(
        s.calls[2], attempt=2, external_id="ch_2", reconciled=False, response={"charge_id": "ch_2"}
    )
    assert s.event("intent_reconciled")["verdict"] == "not_applied"
    assert s.event("intent_started")["attempt"] == 2


def _assert_marked_ambiguous(s: EffectScript, *, attempts: int, detail: str) -> None:
    mark = s.calls_to("UpdateItem")
    assert len(mark) == 1
    params = mark[0].params
    assert params["TableName"] == INTENTS
    assert key_of(params) == {"intent_key": KEY}
    assert condition_equalities(params) == {"state": "in_progress", "attempts": attempts}
    written = sets(params)
    assert written["state"] == "ambiguous"
    assert detail in written["reason"]
    assert "cannot tell whether charge at payments applied" in written["reason"]
    amb = s.event("intent_ambiguous")
    assert (amb["key"], amb["attempt"], amb["target"]) == (KEY, attempts, "payments")
    assert detail in amb["reason"]


@pytest.mark.parametrize(
    ("check", "invokes", "detail"),
    [
        (Check(CheckAnswer(Verdict.CANNOT_TELL, detail="ledger offline")), ["check"], "ledger"),
        (None, [], "no check registered"),
        (Check(RuntimeError("boom")), ["check"], "check raised RuntimeError"),
        (Check({"verdict": "confirmed"}), ["check"], "check returned no CheckAnswer"),
    ],
    ids=["cannot_tell", "no_check", "check_raises", "check_returns_junk"],
)
def test_in_progress_that_nobody_can_tell_turns_ambiguous_without_calling_the_tool(
    check: Check | None, invokes: list[str], detail: str
) -> None:
    tool, lc = Tool(), LeaseCheck()
    s = EffectScript([condition_failed(intent_item(IntentState.IN_PROGRESS, attempts=1)), ok()])
    with pytest.raises(IntentAmbiguous, match="cannot tell"):
        run_effect(s, spec(tool, check=check, lease_check=lc), token=2)
    assert s.ops == ["dynamodb.PutItem", "dynamodb.UpdateItem"]
    # The lease is checked before the intent is written, and again before it is marked.
    assert (s.invokes, tool.calls, lc.calls) == (["lease_check", *invokes, "lease_check"], 0, 2)
    _assert_marked_ambiguous(s, attempts=1, detail=detail)
    assert s.event("intent_reconciled")["verdict"] == "cannot_tell"


def test_mark_ambiguous_condition_failed_still_stops_the_effect() -> None:
    s = EffectScript(
        [
            condition_failed(intent_item(IntentState.IN_PROGRESS, attempts=1)),
            condition_failed(intent_item(IntentState.AMBIGUOUS, attempts=1)),
        ]
    )
    with pytest.raises(IntentAmbiguous):
        run_effect(s, spec(check=Check(CheckAnswer(Verdict.CANNOT_TELL))))


def test_mark_ambiguous_finding_the_intent_confirmed_replays_instead_of_parking() -> None:
    # W2 reconciles W1's in-progress intent; the target cannot tell, and meanwhile W1's
    # late confirm lands. The mark's condition fails and DynamoDB returns the item: it
    # is confirmed, with W1's response. Nothing is ambiguous any more.
    late = intent_item(
        IntentState.CONFIRMED, attempts=1, response='{"charge_id":"ch_late"}', external_id="ch_late"
    )
    tool = Tool()
    s = EffectScript(
        [condition_failed(intent_item(IntentState.IN_PROGRESS, attempts=1)), condition_failed(late)]
    )
    res = run_effect(s, spec(tool, check=Check(CheckAnswer(Verdict.CANNOT_TELL))))
    assert (res.response, res.external_id, res.replayed) == (
        {"charge_id": "ch_late"},
        "ch_late",
        True,
    )
    assert tool.calls == 0
    assert "intent_ambiguous" not in s.event_names()


def test_mark_ambiguous_unanswered_is_ownership_unknown() -> None:
    s = EffectScript(
        [condition_failed(intent_item(IntentState.IN_PROGRESS, attempts=1)), unreachable()]
    )
    with pytest.raises(OwnershipUnknown, match="mark intent ambiguous"):
        run_effect(s, spec(check=Check(CheckAnswer(Verdict.CANNOT_TELL))))
    assert "intent_ambiguous" not in s.event_names()


# =========================================================================== refused starts


@pytest.mark.parametrize(
    ("codes", "reason", "message"),
    [
        (("ConditionalCheckFailed", "None", "None"), "token_moved", "no longer current"),
        ((), "token_moved", "no longer current"),
        (("None", "ConditionalCheckFailed", "None"), "intent_moved", "changed under us"),
    ],
    ids=["job_fence", "no_reasons", "intent_moved"],
)
def test_start_cancelled_is_lease_lost_and_the_tool_never_runs(
    codes: tuple[str, ...], reason: str, message: str
) -> None:
    tool = Tool()
    intent_moved = reason == "intent_moved"
    # When the job is still ours the flow reads the intent: another attempt's start.
    reread = [ok({"Item": intent_item(IntentState.IN_PROGRESS, attempts=1, last_token=9)})]
    s = EffectScript([ok(), cancelled(*codes), *(reread if intent_moved else [])])
    with pytest.raises(LeaseLost, match=message):
        run_effect(s, spec(tool, lease_check=LeaseCheck()), token=5)
    expected_ops = ["dynamodb.PutItem", "dynamodb.TransactWriteItems"]
    assert s.ops == expected_ops + (["dynamodb.GetItem"] if intent_moved else [])
    assert (s.invokes, tool.calls) == (["lease_check", "lease_check"], 0)
    refused = s.event("intent_start_refused")
    assert (refused["reason"], refused["token"], refused["key"]) == (reason, 5, KEY)
    assert "intent_started" not in s.event_names()
    assert "tool_request_started" not in s.event_names()


def test_a_retried_start_that_had_applied_is_recognised_as_our_own() -> None:
    # The SDK retried a start whose answer was lost: the retry fails the intent's
    # condition, but the intent shows our attempt and our token, so we go on.
    tool = Tool()
    s = EffectScript(
        [
            ok(),
            cancelled("None", "ConditionalCheckFailed", "ConditionalCheckFailed"),
            ok(
                {
                    "Item": intent_item(
                        IntentState.IN_PROGRESS,
                        attempts=1,
                        last_token=5,
                        start_id=start_id_for(JOB, 5, 1, WORKER, "flow-1"),
                    )
                }
            ),
            ok(),
        ]
    )
    res = run_effect(s, spec(tool), token=5, flow_id="flow-1")
    assert tool.calls == 1 and res.external_id == "ch_1"
    assert "intent_start_refused" not in s.event_names()


def test_start_transactions_carry_a_stable_request_token() -> None:
    first, second = EffectScript([ok(), ok(), ok()]), EffectScript([ok(), ok(), ok()])
    run_effect(first, spec(), token=5)
    run_effect(second, spec(), token=5)
    tokens = [c.params["ClientRequestToken"] for c in first.calls_to("TransactWriteItems")]
    assert len(tokens) == 2 and len(set(tokens)) == 2 and all(len(t) <= 36 for t in tokens)
    assert tokens == [c.params["ClientRequestToken"] for c in second.calls_to("TransactWriteItems")]


@pytest.mark.parametrize(
    "failure",
    [
        unreachable(),
        err(ErrorKind.SERVER, "InternalServerError"),
        err(ErrorKind.THROTTLED, "ThrottlingException"),
    ],
    ids=["unreachable", "server", "throttled"],
)
def test_start_unanswered_is_ownership_unknown_and_the_tool_never_runs(failure: Err) -> None:
    tool = Tool()
    s = EffectScript([ok(), failure])
    with pytest.raises(OwnershipUnknown, match="start intent"):
        run_effect(s, spec(tool))
    assert (s.invokes, tool.calls) == ([], 0)
    assert "intent_start_refused" not in s.event_names()
    assert "intent_started" not in s.event_names()


def test_lease_check_raising_starts_nothing() -> None:
    tool = Tool()
    lost = OwnershipUnknown("ownership not confirmed for 9.5 s")
    lc = LeaseCheck(lost, fail_from=2)
    s = EffectScript([ok()])
    with pytest.raises(OwnershipUnknown) as caught:
        run_effect(s, spec(tool, lease_check=lc))
    assert caught.value is lost
    assert s.ops == ["dynamodb.PutItem"]  # no start transaction
    assert (s.invokes, tool.calls) == (["lease_check", "lease_check"], 0)


class Unconfirmed:
    """A lease whose heartbeat could not confirm ownership on the looks ``looks``
    (1-based), and that stays open (``may_record``) for ``open_for`` looks at it."""

    def __init__(self, looks: set[int], open_for: int = 1_000) -> None:
        self.looks, self.open_for = looks, open_for
        self.checks = self.records = 0

    def check(self) -> None:
        self.checks += 1
        if self.checks in self.looks:
            raise OwnershipUnknown("ownership unconfirmed (dynamodb: ReadTimeoutError)")

    def may_record(self) -> bool:
        self.records += 1
        return self.records <= self.open_for


def test_an_unconfirmed_lease_with_reserve_is_waited_for_then_the_effect_runs_once() -> None:
    # DESIGN: while ownership is unknown start nothing, keep trying while the lease
    # has reserve; giving up at once wasted the attempt (soak seed 401269).
    tool = Tool(ToolResult({"ok": True}, "ch_1"))
    lease = Unconfirmed({2, 3})  # the prepare's look passes, the start's first two fail
    s = EffectScript([ok(), ok(), ok()])
    res = run_effect(s, spec(tool, lease_check=lease.check, may_record=lease.may_record))
    assert res.external_id == "ch_1" and tool.calls == 1
    assert s.ops == [
        "dynamodb.PutItem",
        "dynamodb.TransactWriteItems",  # the start, after the waits
        "dynamodb.TransactWriteItems",  # the confirm
    ]
    assert s.event("ownership_wait")["key"] == KEY  # journaled once, not per look
    assert len(s.sleeps) == 2 and all(0 < w <= 1.0 for w in s.sleeps)
    # Nothing was sent while the lease was unconfirmed: the start follows the last look.
    assert s.kinds.index("call:TransactWriteItems") > s.kinds.index("emit:ownership_wait")


def test_an_unconfirmed_lease_whose_reserve_runs_out_starts_nothing() -> None:
    tool = Tool()
    lease = Unconfirmed(set(range(2, 100)), open_for=3)
    s = EffectScript([ok()])
    with pytest.raises(OwnershipUnknown, match="unconfirmed"):
        run_effect(s, spec(tool, lease_check=lease.check, may_record=lease.may_record))
    assert s.ops == ["dynamodb.PutItem"] and tool.calls == 0  # no start, no call
    assert len(s.sleeps) == 3


def test_a_lost_lease_is_not_waited_for() -> None:
    tool = Tool()
    lost = LeaseLost("job j token 1: lease lost (token moved)")
    s = EffectScript([ok()])
    with pytest.raises(LeaseLost):
        run_effect(
            s, spec(tool, lease_check=LeaseCheck(lost, fail_from=2), may_record=lambda: True)
        )
    assert (s.ops, s.sleeps, tool.calls) == (["dynamodb.PutItem"], [], 0)
    assert "ownership_wait" not in s.event_names()


# =========================================================================== tool failures


@pytest.mark.parametrize(
    "exc",
    [
        ToolNotApplied("connection refused", code="refused"),
        ToolNotApplied("HTTP 422", code="http_422", retry=False),
    ],
    ids=["never_sent", "refused_by_the_target"],
)
def test_tool_not_applied_reopens_the_intent_and_reraises(exc: Exception) -> None:
    check = Check(CheckAnswer(Verdict.CONFIRMED))
    s = EffectScript([ok(), ok(), ok()])
    with pytest.raises(type(exc)) as caught:
        run_effect(s, spec(Tool(exc), check=check))
    assert caught.value is exc
    assert (s.invokes, check.calls) == (["tool"], 0)
    items = transact(s.calls[2])
    assert len(items) == 2
    att = only(items[0], "Update")
    assert (att["TableName"], key_of(att)) == (ATTEMPTS, {"intent_key": KEY, "attempt": 1})
    att_sets = sets(att)
    assert att_sets["outcome"] == "not_applied"
    assert att_sets["error"].startswith("ToolNotApplied")
    reopen = only(items[1], "Update")
    assert (reopen["TableName"], key_of(reopen)) == (INTENTS, {"intent_key": KEY})
    assert condition_equalities(reopen) == {"state": "in_progress", "attempts": 1}
    assert sets(reopen)["state"] == "prepared"
    failed = s.event("tool_request_failed")
    assert (failed["outcome_unknown"], failed["error_code"]) == (False, "ToolNotApplied")
    assert "intent_confirmed" not in s.event_names()


@pytest.mark.parametrize(
    "exc",
    [
        ValueError("card declined"),
        KeyError("charge_id"),  # a bug in the code that read a success response
        TransientError("503 from target", code="http_503"),
        PermanentError("unexpected body", code="bad_body"),
        ConnectionResetError("reset by peer"),
    ],
    ids=["plain", "bug_reading_success", "transient", "permanent", "reset"],
)
def test_a_tool_error_that_is_not_typed_not_applied_is_outcome_unknown_and_reconciled(
    exc: Exception,
) -> None:
    # Issue 7.2: it used to reopen the intent, and the next attempt repeated a call
    # the target had applied. Now the target's check decides.
    check = Check(CheckAnswer(Verdict.CONFIRMED, "ch_7", {"charge_id": "ch_7"}))
    tool = Tool(exc)
    s = EffectScript([ok(), ok(), ok(), ok()])
    res = run_effect(s, spec(tool, check=check))
    assert (res.external_id, res.reconciled, tool.calls, check.calls) == ("ch_7", True, 1, 1)
    failed_items = transact(s.calls[2])
    assert len(failed_items) == 1  # no reopen
    assert sets(only(failed_items[0], "Update"))["outcome"] == "unknown"
    assert s.event("tool_request_failed")["outcome_unknown"] is True
    assert_confirm(
        s.calls[3], attempt=1, external_id="ch_7", reconciled=True, response={"charge_id": "ch_7"}
    )


def test_a_tool_error_with_no_check_parks_instead_of_repeating() -> None:
    tool = Tool(ValueError("bad json in a 200 response"))
    s = EffectScript([ok(), ok(), ok(), ok()])
    with pytest.raises(IntentAmbiguous, match="no check registered"):
        run_effect(s, spec(tool))
    assert tool.calls == 1
    _assert_marked_ambiguous(s, attempts=1, detail="no check registered")


def test_a_tool_stopped_by_the_lease_leaves_the_intent_for_the_next_owner() -> None:
    # A 412 from the receiver (or ctx.check() raising inside the tool): stop now. No
    # reopen by an owner that may no longer act; the next owner reconciles.
    exc = LeaseLost("the receiver rejected fencing token 7")
    check = Check(CheckAnswer(Verdict.CONFIRMED))
    s = EffectScript([ok(), ok(), ok()])
    with pytest.raises(LeaseLost) as caught:
        run_effect(s, spec(Tool(exc), check=check))
    assert caught.value is exc
    assert check.calls == 0
    items = transact(s.calls[2])
    assert len(items) == 1
    assert sets(only(items[0], "Update"))["outcome"] == "unknown"


def test_a_fence_refusal_is_a_lease_loss_told_as_not_applied() -> None:
    # The receiver's 412 proves the call was not applied: the journal must not tell an
    # operator it may have been (the event used to say outcome_unknown: true). The
    # intent still stays for the next owner, who may act (this one may not).
    exc = FenceRefused("the receiver rejected fencing token 7")
    s = EffectScript([ok(), ok(), ok()])
    with pytest.raises(LeaseLost) as caught:
        run_effect(s, spec(Tool(exc), check=Check(CheckAnswer(Verdict.CONFIRMED))))
    assert caught.value is exc
    failed = s.event("tool_request_failed")
    assert (failed["outcome_unknown"], failed["error_code"]) == (False, "FenceRefused")
    assert len(transact(s.calls[2])) == 1  # no reopen by a fenced-out owner


def test_a_fence_refusal_after_the_lease_lapsed_stays_lease_lost_and_writes_nothing_more() -> None:
    # The before-send pause (issue 26): the start landed, the process paused, the lease
    # lapsed, then the receiver refused the late call. The refusal proves another
    # owner; the lease check before the failed call's record (now refused: reserve
    # spent) must not turn it into OwnershipUnknown, nor wait for a verdict.
    exc = LeaseLost("the receiver rejected fencing token 7")
    lease = LeaseCheck(OwnershipUnknown("lease reserve spent"), fail_from=3)
    s = EffectScript([ok(), ok()])
    with pytest.raises(LeaseLost) as caught:
        run_effect(s, spec(Tool(exc), lease_check=lease, may_record=lambda: False))
    assert caught.value is exc
    assert [c.op for c in s.calls] == ["PutItem", "TransactWriteItems"]  # no record after
    assert s.sleeps == []
    assert s.event("tool_request_failed")["error_code"] == "LeaseLost"


@pytest.mark.parametrize(
    "exc",
    [ToolOutcomeUnknown("read timed out", code="timeout"), TimeoutError("timed out")],
    ids=["tool_outcome_unknown", "timeout"],
)
def test_tool_outcome_unknown_logs_the_attempt_and_reconciles(exc: Exception) -> None:
    tool = Tool(exc)
    check = Check(CheckAnswer(Verdict.CONFIRMED, "ch_7", {"charge_id": "ch_7"}))
    s = EffectScript([ok(), ok(), ok(), ok()])
    res = run_effect(s, spec(tool, check=check, lease_check=LeaseCheck()))
    assert res == EffectResult({"charge_id": "ch_7"}, "ch_7", False, True, KEY)
    # The lease is checked before the attempt's failure is written too.
    assert s.invokes == ["lease_check", "lease_check", "tool", "lease_check", "check"]
    assert tool.calls == 1
    failed_items = transact(s.calls[2])
    assert len(failed_items) == 1  # no reopen: it may have applied
    att = sets(only(failed_items[0], "Update"))
    assert att["outcome"] == "unknown"
    assert s.event("tool_request_failed")["outcome_unknown"] is True
    assert_confirm(
        s.calls[3], attempt=1, external_id="ch_7", reconciled=True, response={"charge_id": "ch_7"}
    )


def test_tool_outcome_unknown_that_nobody_can_tell_is_ambiguous() -> None:
    tool = Tool(ToolOutcomeUnknown("reset after send"))
    s = EffectScript([ok(), ok(), ok(), ok()])
    with pytest.raises(IntentAmbiguous):
        run_effect(s, spec(tool, check=Check(CheckAnswer(Verdict.CANNOT_TELL, detail="?"))))
    assert tool.calls == 1
    _assert_marked_ambiguous(s, attempts=1, detail="?")


@pytest.mark.parametrize(
    ("look", "before"),
    [(3, "the failed attempt's record"), (4, "the mark")],
    ids=["attempt_record", "mark_ambiguous"],
)
def test_an_unconfirmed_lease_after_an_unknown_outcome_is_waited_for_then_marked(
    look: int, before: str
) -> None:
    # Soak seed 777674 (I8): after a tool's unknown outcome, the heartbeat's visibility
    # change timed out just before the intent was marked ambiguous; the mark's lease
    # check read "unconfirmed" and the attempt gave itself up with 17 s of lease left.
    # Every intent write of an attempt waits for the verdict while the lease has
    # reserve (as prepare and start do since seed 401269), not only those before a call.
    lease = Unconfirmed({look})  # looks: prepare 1, start 2, record 3, mark 4
    tool = Tool(ToolOutcomeUnknown("reset after send"))
    check = Check(CheckAnswer(Verdict.CANNOT_TELL, detail="ledger offline"))
    s = EffectScript([ok(), ok(), ok(), ok()])
    with pytest.raises(IntentAmbiguous):
        run_effect(s, spec(tool, check=check, lease_check=lease.check, may_record=lease.may_record))
    assert tool.calls == 1 and lease.checks == 5, before
    _assert_marked_ambiguous(s, attempts=1, detail="ledger offline")
    assert s.event("ownership_wait")["key"] == KEY
    assert len(s.sleeps) == 1
    # Nothing was written while the lease was unconfirmed: the write follows the wait.
    writes = [i for i, k in enumerate(s.kinds) if k.startswith("call:")]
    waited = s.kinds.index("emit:ownership_wait")
    assert len([i for i in writes if i > waited]) == (2 if look == 3 else 1)


def test_an_unconfirmed_lease_whose_reserve_runs_out_before_the_mark_marks_nothing() -> None:
    lease = Unconfirmed(set(range(4, 100)), open_for=2)
    tool = Tool(ToolOutcomeUnknown("reset after send"))
    s = EffectScript([ok(), ok(), ok()])
    with pytest.raises(OwnershipUnknown, match="unconfirmed"):
        run_effect(
            s,
            spec(
                tool,
                check=Check(CheckAnswer(Verdict.CANNOT_TELL)),
                lease_check=lease.check,
                may_record=lease.may_record,
            ),
        )
    assert s.ops == ["dynamodb.PutItem"] + ["dynamodb.TransactWriteItems"] * 2  # no mark
    assert "intent_ambiguous" not in s.event_names() and len(s.sleeps) == 2


def _shape(c: Call) -> list[tuple[str, str, Any, str]]:
    """A transaction's items without their values: kind, table, key, condition."""
    return [
        (kind, str(p["TableName"]), p["Key"], str(p.get("ConditionExpression")))
        for item in transact(c)
        for kind, p in item.items()
    ]


@pytest.mark.parametrize(
    ("exc", "reopen"),
    [
        (ToolNotApplied("connection refused", code="refused"), True),
        (ToolOutcomeUnknown("reset after send"), False),
    ],
    ids=["not_applied", "outcome_unknown"],
)
@pytest.mark.parametrize("reason", ["ThrottlingError", "TransactionConflict"])
def test_a_failed_attempts_record_cancelled_for_a_transient_reason_is_retried(
    exc: Exception, reopen: bool, reason: str
) -> None:
    # Soak seed 777674: the record of a failed call (and, for "certainly not applied",
    # the reopen of the intent) was cancelled for ThrottlingError and its answer was
    # dropped. Nothing applied: a dropped reopen leaves the intent in progress, and
    # the next owner must ask the check what this attempt knew for certain. Retried
    # while the lease holds, as a start's or a confirm's transient cancel is.
    check = Check(CheckAnswer(Verdict.CANNOT_TELL))
    s = EffectScript([ok(), ok(), cancelled(reason), ok(), *([] if reopen else [ok()])])
    with pytest.raises(type(exc) if reopen else IntentAmbiguous):
        run_effect(s, spec(Tool(exc), check=check, lease_check=LeaseCheck()))
    first, again = s.calls[2], s.calls[3]
    assert _shape(first) == _shape(again)  # the same write (its own time aside)
    assert len(transact(again)) == (2 if reopen else 1)
    assert sets(only(transact(again)[0], "Update"))["outcome"] == (
        "not_applied" if reopen else "unknown"
    )
    retried = s.event("intent_write_retried")
    assert (retried["op"], retried["reasons"], retried["key"]) == ("attempt_failed", [reason], KEY)
    assert s.sleeps == [retried["wait"]] and retried["wait"] > 0
    # The lease is looked at before each try.
    assert s.invokes.count("lease_check") == (4 if reopen else 5)


def test_a_failed_attempts_record_is_not_retried_past_the_lease() -> None:
    lease = Unconfirmed(set(range(4, 100)), open_for=1)
    exc = ToolNotApplied("connection refused", code="refused")
    s = EffectScript([ok(), ok(), cancelled("ThrottlingError")])
    with pytest.raises(OwnershipUnknown):
        run_effect(s, spec(Tool(exc), lease_check=lease.check, may_record=lease.may_record))
    assert s.ops == ["dynamodb.PutItem"] + ["dynamodb.TransactWriteItems"] * 2  # no second try


def _all_ok(call: Call) -> Outcome:
    return ok()


def test_not_applied_repeats_are_bounded_then_transient() -> None:
    tool = Tool(ToolOutcomeUnknown("timeout"))
    check = Check(CheckAnswer(Verdict.NOT_APPLIED))
    s = EffectScript(_all_ok)
    with pytest.raises(TransientError, match=f"not applied after {MAX_REPEATS} repeats") as caught:
        run_effect(s, spec(tool, check=check), token=3)
    assert caught.value.code == "repeats"
    # The first call, then one repeat per "not applied" up to the bound.
    assert tool.calls == 1 + MAX_REPEATS
    assert check.calls == MAX_REPEATS + 1
    starts = [c for c in s.calls_to("TransactWriteItems") if "ConditionCheck" in transact(c)[0]]
    assert len(starts) == 1 + MAX_REPEATS
    for n, c in enumerate(starts):
        expected = IntentState.PREPARED if n == 0 else IntentState.IN_PROGRESS
        assert_start(c, token=3, expected=expected, attempts=n)
    assert "intent_confirmed" not in s.event_names()


def test_not_applied_repeats_after_a_takeover_are_bounded_too() -> None:
    tool = Tool(ToolOutcomeUnknown("timeout"))
    check = Check(CheckAnswer(Verdict.NOT_APPLIED))
    first = [True]

    def answer(call: Call) -> Outcome:
        if first[0]:
            first[0] = False
            return condition_failed(
                intent_item(
                    IntentState.IN_PROGRESS,
                    attempts=1,
                    first_started_at=WALL - 60,
                    first_started_by=WORKER,
                )
            )
        return ok()

    s = EffectScript(answer)
    with pytest.raises(TransientError):
        run_effect(s, spec(tool, check=check), own_starts=started_here())
    assert tool.calls == MAX_REPEATS
    assert check.calls == MAX_REPEATS + 1


@pytest.mark.parametrize(
    "failure",
    [unreachable(), cancelled("ConditionalCheckFailed", "None")],
    ids=["unreachable", "cancelled"],
)
def test_confirm_failing_is_ownership_unknown_and_journaled(failure: Err) -> None:
    tool = Tool()
    still_open = ok({"Item": intent_item(IntentState.IN_PROGRESS, attempts=1)})
    s = EffectScript(
        [
            ok(),
            ok(),
            failure,
            *([still_open] if failure.kind is ErrorKind.TRANSACTION_CANCELLED else []),
        ]
    )
    with pytest.raises(OwnershipUnknown, match="confirm intent"):
        run_effect(s, spec(tool))
    assert tool.calls == 1
    unknown = s.event("ownership_unknown")
    assert (unknown["stage"], unknown["key"], unknown["job_id"]) == ("intent_confirm", KEY, JOB)
    assert unknown["error_code"] == (failure.code or failure.kind.value)
    assert "intent_confirmed" not in s.event_names()


def test_a_retried_confirm_that_had_applied_returns_the_stored_result() -> None:
    tool = Tool()
    done = intent_item(
        IntentState.CONFIRMED, attempts=1, response='{"charge_id":"ch_1"}', external_id="ch_1"
    )
    s = EffectScript([ok(), ok(), cancelled("ConditionalCheckFailed", "None"), ok({"Item": done})])
    res = run_effect(s, spec(tool))
    assert (res.external_id, dict(res.response), tool.calls) == ("ch_1", {"charge_id": "ch_1"}, 1)
    assert s.event("intent_confirmed")["already"] is True
    assert "ownership_unknown" not in s.event_names()


def _late_item(state: IntentState, attempts: int = 1, **extra: Any) -> dict[str, Any]:
    item = intent_item(state, attempts=attempts, **extra)
    if state is IntentState.AMBIGUOUS:
        item["attention"] = {"S": "ambiguous"}
    return item


def _condition(c: Call) -> str:
    """The intent update's condition of a confirm transaction, names and values filled in."""
    upd = c.params["TransactItems"][0]["Update"]
    text = str(upd["ConditionExpression"])
    for ph, name in sorted(upd["ExpressionAttributeNames"].items(), key=lambda x: -len(x[0])):
        text = text.replace(ph, name)
    for ph, value in sorted(upd["ExpressionAttributeValues"].items(), key=lambda x: -len(x[0])):
        text = text.replace(ph, str(next(iter(value.values()))))
    return text


@pytest.mark.parametrize("seen", [IntentState.AMBIGUOUS, IntentState.PREPARED])
def test_a_late_answer_confirms_an_intent_parked_or_reopened_at_its_own_attempt(
    seen: IntentState,
) -> None:
    """Soak seed 1808311: the confirm is refused because the next owner parked the
    intent (ambiguous) or an operator's retry reopened it (prepared), and no later
    attempt started: the known outcome confirms it, conditioned on exactly that."""
    tool = Tool()
    s = EffectScript(
        [
            ok(),
            ok(),
            cancelled("ConditionalCheckFailed", "None"),
            ok({"Item": _late_item(seen)}),
            ok(),
        ]
    )
    res = run_effect(s, spec(tool))
    assert (res.external_id, res.replayed, tool.calls) == ("ch_1", False, 1)
    first, late = s.calls_to("TransactWriteItems")[1:]
    assert _condition(first) == "(state = in_progress AND attempts = 1)"
    assert _condition(late) == f"(state = {seen.value} AND attempts = 1)"
    assert late.params["ClientRequestToken"] != first.params["ClientRequestToken"]
    update = late.params["TransactItems"][0]["Update"]["UpdateExpression"]
    assert "REMOVE" in update  # out of the operators' ambiguous index
    ev = s.event("intent_confirmed")
    assert (ev["late"], ev["attempt"], ev["token"]) == (seen.value, 1, 7)
    assert "ownership_unknown" not in s.event_names()


def test_a_late_answer_read_again_when_the_first_read_is_unanswered() -> None:
    s = EffectScript(
        [
            ok(),
            ok(),
            cancelled("ConditionalCheckFailed", "None"),
            unreachable(),
            ok({"Item": _late_item(IntentState.AMBIGUOUS)}),
            ok(),
        ]
    )
    res = run_effect(s, spec(Tool()))
    assert res.external_id == "ch_1"
    assert s.event("intent_confirmed")["late"] == "ambiguous"


@pytest.mark.parametrize(
    "now",
    [
        _late_item(IntentState.IN_PROGRESS, attempts=2),  # a later attempt started
        _late_item(IntentState.ABANDONED),
        _late_item(IntentState.SUPERSEDED),
    ],
    ids=["later_attempt", "abandoned", "superseded"],
)
def test_a_late_answer_the_intent_moved_past_is_kept_in_its_attempt_log(
    now: dict[str, Any],
) -> None:
    """A later attempt started, or an operator abandoned the intent or approved a new
    operation: the intent is left as decided; the answer goes to the attempt's own
    log (``ok_late``) and out as ``effect_applied_late``."""
    s = EffectScript(
        [ok(), ok(), cancelled("ConditionalCheckFailed", "None"), ok({"Item": now}), ok()]
    )
    with pytest.raises(OwnershipUnknown, match="confirm intent"):
        run_effect(s, spec(Tool()))
    (log,) = s.calls_to("UpdateItem")
    assert log.params["TableName"] == itable().attempts_table
    assert log.params["Key"]["attempt"] == {"N": "1"}
    assert "ok_late" in {v.get("S") for v in log.params["ExpressionAttributeValues"].values()}
    late = s.event("effect_applied_late")
    assert (late["attempt"], late["intent_state"], late["external_id"]) == (
        1,
        now["state"]["S"],
        "ch_1",
    )
    assert "intent_confirmed" not in s.event_names()


def test_a_late_answer_whose_intent_moved_again_is_read_again() -> None:
    """The late write's own condition fails (the operator's resolve landed between the
    read and the write): read again, and settle on what is there now."""
    s = EffectScript(
        [
            ok(),
            ok(),
            cancelled("ConditionalCheckFailed", "None"),
            ok({"Item": _late_item(IntentState.AMBIGUOUS)}),
            cancelled("ConditionalCheckFailed", "None"),
            ok({"Item": _late_item(IntentState.PREPARED)}),
            ok(),
        ]
    )
    run_effect(s, spec(Tool()))
    assert s.event("intent_confirmed")["late"] == "prepared"


def test_confirm_after_a_confirming_check_failing_is_ownership_unknown() -> None:
    check = Check(CheckAnswer(Verdict.CONFIRMED, "ch"))
    s = EffectScript(
        [condition_failed(intent_item(IntentState.IN_PROGRESS, attempts=1)), unreachable()]
    )
    with pytest.raises(OwnershipUnknown):
        run_effect(s, spec(check=check))
    assert s.event("ownership_unknown")["stage"] == "intent_confirm"


# =========================================================================== shared keys (7.1)

OTHER_JOB = "job-other"


def _other_jobs(state: IntentState, **kw: Any) -> dict[str, Any]:
    """The intent as another job (same business key, same payload) left it."""
    return intent_item(state, job_id=OTHER_JOB, **kw)


def test_a_job_meeting_another_jobs_prepared_intent_never_calls_the_target_and_replays() -> None:
    # Two jobs, one business key (`payment:{invoice}:capture`), both on token 1. The
    # other job prepared the intent, and starts it while this job is about to. The
    # old flow took the refused start for its own (same attempt number, same token:
    # every job's first token is 1) and called the target: a second charge recorded
    # nowhere. Now this job waits for the holder, then replays its confirmation.
    tool, check = Tool(), Check(CheckAnswer(Verdict.NOT_APPLIED))
    confirmed = _other_jobs(
        IntentState.CONFIRMED,
        attempts=1,
        last_token=1,
        response='{"charge_id":"ch_A"}',
        external_id="ch_A",
    )

    def answer(c: Call) -> Outcome:
        if c.op == "PutItem":
            held = _other_jobs(IntentState.PREPARED) if not s.sleeps else confirmed
            return condition_failed(held)
        if c.op == "TransactWriteItems":
            return cancelled("None", "ConditionalCheckFailed", "None")
        if c.op == "GetItem" and c.params["TableName"] == TABLE:  # the holder: running
            return ok({"Item": job_item(OTHER_JOB, token=1)})
        if c.op == "GetItem":  # what the old flow read: attempt 1, token 1, as its own
            return ok({"Item": _other_jobs(IntentState.IN_PROGRESS, attempts=1, last_token=1)})
        raise AssertionError(c.op)

    s = EffectScript(answer)
    res = run_effect(s, spec(tool, check=check, lease_check=LeaseCheck()), token=1)
    assert tool.calls == 0
    assert check.calls == 0  # another job's call may be in flight: not ours to check
    assert (res.external_id, res.replayed) == ("ch_A", True)
    # The holder's record is read (a prepared intent of a job that ended for good
    # changes hands); it runs, so this job waits.
    assert s.ops == ["dynamodb.PutItem", "dynamodb.GetItem", "dynamodb.PutItem"]
    assert s.sleeps == [HELD_WAITS[0]]
    held = s.event("intent_held_elsewhere")
    assert (held["holder"], held["holder_state"], held["wait"]) == (OTHER_JOB, "prepared", 1.0)
    assert s.event("intent_replayed")["intent_job"] == OTHER_JOB


def test_another_jobs_in_progress_intent_is_waited_for_not_reconciled() -> None:
    tool, check = Tool(), Check(CheckAnswer(Verdict.NOT_APPLIED))
    answers = [
        condition_failed(_other_jobs(IntentState.IN_PROGRESS, attempts=1, last_token=1)),
        condition_failed(_other_jobs(IntentState.IN_PROGRESS, attempts=1, last_token=1)),
        condition_failed(
            _other_jobs(IntentState.CONFIRMED, attempts=1, response='{"id":"x"}', external_id="x")
        ),
    ]
    s = EffectScript(answers)
    res = run_effect(s, spec(tool, check=check), token=1)
    assert (tool.calls, check.calls, res.replayed, res.external_id) == (0, 0, True, "x")
    assert s.sleeps == list(HELD_WAITS[:2])
    assert "intent_reconciled" not in s.event_names()


def test_waiting_for_another_job_is_bounded_then_parks_naming_that_job() -> None:
    tool = Tool()
    s = EffectScript(
        lambda c: condition_failed(_other_jobs(IntentState.IN_PROGRESS, attempts=2, last_token=4))
    )
    with pytest.raises(IntentBusy, match=OTHER_JOB) as caught:
        run_effect(s, spec(tool, check=Check(CheckAnswer(Verdict.NOT_APPLIED))), token=1)
    assert caught.value.holder == OTHER_JOB
    assert tool.calls == 0
    assert s.sleeps == list(HELD_WAITS)  # no attempt spent: waits, not retries
    assert s.ops == ["dynamodb.PutItem"] * (len(HELD_WAITS) + 1)
    assert s.events_named("intent_held_elsewhere")[-1]["wait"] is None
    end = ending_for(caught.value)
    assert (end.kind, end.code) == (EndKind.PARK, "intent_busy")
    assert OTHER_JOB in end.reason


def _holder_answer(holder_state: JobState | None, intent: IntentState) -> Callable[[Call], Outcome]:
    """Another job prepared the shared key and is now ``holder_state`` (None: no record)."""
    taken = intent_item(intent, job_id=JOB, attempts=0)

    def answer(c: Call) -> Outcome:
        if c.op == "PutItem":
            return condition_failed(_other_jobs(intent))
        if c.op == "GetItem":
            if holder_state is None:
                return ok({})
            return ok({"Item": job_item(OTHER_JOB, state=holder_state, token=2)})
        if c.op == "UpdateItem":
            return ok({"Attributes": taken})
        if c.op == "TransactWriteItems":
            return ok({})
        raise AssertionError(c.op)

    return answer


@pytest.mark.parametrize("holder", [JobState.FAILED, JobState.SUCCEEDED, None])
def test_a_prepared_intent_whose_holder_ended_for_good_is_taken_over_and_run(
    holder: JobState | None,
) -> None:
    # A shared key (`payment:{invoice}:capture`) prepared by a job that then failed
    # for good (or succeeded without the call, or was deleted): nothing of it can be
    # in flight (prepared: never started) and its holder can never start it (the
    # start is fenced on the holder's record being running). The old flow made the
    # next job wait ~60 s and park with IntentBusy, for a key nobody would release.
    tool = Tool()
    s = EffectScript(_holder_answer(holder, IntentState.PREPARED))
    res = run_effect(s, spec(tool, lease_check=LeaseCheck()), token=1)
    assert tool.calls == 1 and res.replayed is False
    assert s.sleeps == []
    assert s.ops[:4] == [
        "dynamodb.PutItem",
        "dynamodb.GetItem",
        "dynamodb.UpdateItem",
        "dynamodb.TransactWriteItems",
    ]
    got = s.calls[1].params
    assert (got["TableName"], got["Key"], got["ConsistentRead"]) == (
        TABLE,
        {"job_id": {"S": OTHER_JOB}},
        True,
    )
    take = s.calls[2].params
    # Exactly that holder, still prepared, at the attempt count seen.
    assert condition_equalities(take) == {"job_id": OTHER_JOB, "state": "prepared", "attempts": 0}
    assert sets(take)["job_id"] == JOB
    ev = s.event("intent_taken_over")
    assert (ev["holder"], ev["holder_state"]) == (OTHER_JOB, holder.value if holder else "missing")
    assert "intent_held_elsewhere" not in s.event_names()


def test_a_take_over_with_an_unconfirmed_lease_waits_for_the_verdict() -> None:
    # The take-over is an intent write of the attempt like the others (seed 777674's
    # class): an unanswered heartbeat just before it is waited for, not given up.
    lease = Unconfirmed({2})  # looks: prepare 1, take-over 2 and 3, start 4
    tool = Tool()
    s = EffectScript(_holder_answer(JobState.FAILED, IntentState.PREPARED))
    res = run_effect(s, spec(tool, lease_check=lease.check, may_record=lease.may_record), token=1)
    assert tool.calls == 1 and res.replayed is False
    assert s.event("intent_taken_over")["holder"] == OTHER_JOB
    assert s.kinds.index("call:UpdateItem") > s.kinds.index("emit:ownership_wait")
    assert len(s.sleeps) == 1 and lease.checks == 4


@pytest.mark.parametrize("holder", [JobState.RUNNING, JobState.QUEUED, JobState.PARKED])
def test_a_prepared_intent_whose_holder_may_still_act_is_waited_for(holder: JobState) -> None:
    tool = Tool()
    s = EffectScript(_holder_answer(holder, IntentState.PREPARED))
    with pytest.raises(IntentBusy):
        run_effect(s, spec(tool), token=1)
    assert tool.calls == 0 and "dynamodb.UpdateItem" not in s.ops
    assert s.sleeps == list(HELD_WAITS)


def test_an_in_progress_intent_of_a_failed_holder_is_never_taken_over() -> None:
    # It may have applied: the holder's reconciliation or an operator decides.
    tool = Tool()
    s = EffectScript(_holder_answer(JobState.FAILED, IntentState.IN_PROGRESS))
    with pytest.raises(IntentBusy):
        run_effect(s, spec(tool), token=1)
    assert tool.calls == 0
    assert "dynamodb.UpdateItem" not in s.ops and "dynamodb.GetItem" not in s.ops


def test_a_take_over_that_another_job_won_first_is_waited_for() -> None:
    tool = Tool()
    rival = intent_item(IntentState.PREPARED, job_id="job-third")
    answers: list[Outcome] = [
        condition_failed(_other_jobs(IntentState.PREPARED)),
        ok({"Item": job_item(OTHER_JOB, state=JobState.FAILED, token=2)}),
        condition_failed(rival),
    ]
    answers += [condition_failed(rival), ok({"Item": job_item("job-third")})] * len(HELD_WAITS)
    s = EffectScript(answers)
    with pytest.raises(IntentBusy, match="job-third"):
        run_effect(s, spec(tool), token=1)
    assert tool.calls == 0 and s.sleeps == list(HELD_WAITS)


def test_another_job_with_another_payload_under_the_key_is_a_payload_mismatch() -> None:
    tool = Tool()
    s = EffectScript(
        [condition_failed(_other_jobs(IntentState.IN_PROGRESS, attempts=1, payload_hash="h-b"))]
    )
    with pytest.raises(IntentPayloadMismatch):
        run_effect(s, spec(tool), token=1)
    assert (tool.calls, s.sleeps) == (0, [])


def test_a_refused_start_is_ours_only_if_the_intent_carries_this_starts_id() -> None:
    # Same job, same attempt number, same token: still not ours unless the start id
    # is this very start's (here another flow of this owner started it).
    tool = Tool()
    someone_else = intent_item(
        IntentState.IN_PROGRESS,
        attempts=1,
        last_token=5,
        start_id=start_id_for(JOB, 5, 1, WORKER, "another-flow"),
    )
    s = EffectScript(
        [ok(), cancelled("None", "ConditionalCheckFailed", "None"), ok({"Item": someone_else})]
    )
    with pytest.raises(LeaseLost, match="changed under us"):
        run_effect(s, spec(tool), token=5, flow_id="this-flow")
    assert tool.calls == 0
    assert s.event("intent_start_refused")["reason"] == "intent_moved"


def test_a_refused_start_finding_the_intent_confirmed_replays_it() -> None:
    tool = Tool()
    done = intent_item(
        IntentState.CONFIRMED, attempts=2, response='{"charge_id":"ch_L"}', external_id="ch_L"
    )
    s = EffectScript(
        [ok(), cancelled("None", "ConditionalCheckFailed", "None"), ok({"Item": done})]
    )
    res = run_effect(s, spec(tool), token=5)
    assert (tool.calls, res.replayed, res.external_id) == (0, True, "ch_L")


# ========================================================================== request tokens (14.7)


def _tokens(s: EffectScript) -> list[str]:
    return [str(c.params["ClientRequestToken"]) for c in s.calls_to("TransactWriteItems")]


def test_request_tokens_differ_between_two_jobs_sharing_a_key_on_the_same_token() -> None:
    a, b = EffectScript([ok(), ok(), ok()]), EffectScript([ok(), ok(), ok()])
    run_effect(a, spec(), token=1, flow_id="f")
    run_effect(b, spec(job_id=OTHER_JOB), token=1, flow_id="f")
    assert all(len(t) <= 36 for t in _tokens(a) + _tokens(b))
    assert not set(_tokens(a)) & set(_tokens(b))


def test_request_tokens_name_the_table() -> None:
    one = itable().start(
        spec(),
        jobs=table(),
        token=1,
        worker_id=WORKER,
        expected=IntentState.PREPARED,
        attempts=0,
        wall_now=WALL,
        start_id="s",
    )
    other = IntentTable("intents-elsewhere", ATTEMPTS).start(
        spec(),
        jobs=table(),
        token=1,
        worker_id=WORKER,
        expected=IntentState.PREPARED,
        attempts=0,
        wall_now=WALL,
        start_id="s",
    )
    assert one.params["ClientRequestToken"] != other.params["ClientRequestToken"]


def test_a_late_owners_confirm_and_the_new_owners_reconciling_confirm_have_own_tokens() -> None:
    def confirm(token: int, reconciled: bool) -> str:
        c = itable().confirm(
            KEY,
            attempt=1,
            response_json="{}",
            external_id="x",
            wall_now=WALL,
            log_response="",
            reconciled=reconciled,
            job_id=JOB,
            token=token,
        )
        return str(c.params["ClientRequestToken"])

    assert len({confirm(1, False), confirm(2, True), confirm(2, False)}) == 3


def test_a_retried_start_carries_a_new_request_token_but_the_same_start_id() -> None:
    s = EffectScript([ok(), cancelled("ThrottlingError", "None", "None"), ok(), ok()])
    run_effect(s, spec(), token=3)
    first, second = s.calls_to("TransactWriteItems")[:2]
    assert first.params["ClientRequestToken"] != second.params["ClientRequestToken"]
    assert (
        sets(only(transact(first)[1], "Update"))["start_id"]
        == sets(only(transact(second)[1], "Update"))["start_id"]
    )


# ==================================================================== cancellation reasons (7.5)


@pytest.mark.parametrize(
    "codes",
    [
        ("ThrottlingError", "None", "None"),
        ("None", "TransactionConflict", "None"),
        ("None", "None", "ProvisionedThroughputExceeded"),
    ],
    ids=["throttled_job_check", "conflict_on_intent", "capacity_on_attempt_log"],
)
def test_a_start_cancelled_for_a_transient_reason_is_retried_not_a_lost_lease(
    codes: tuple[str, ...],
) -> None:
    tool = Tool()
    s = EffectScript([ok(), cancelled(*codes), cancelled(*codes), ok(), ok()])
    res = run_effect(s, spec(tool, lease_check=LeaseCheck()), token=3)
    assert (tool.calls, res.external_id) == (1, "ch_1")
    assert s.sleeps == list(RETRY_WAITS[:2])
    assert "intent_start_refused" not in s.event_names()
    retried = s.events_named("intent_write_retried")
    assert [(r["op"], r["reasons"]) for r in retried] == [("start", list(codes))] * 2
    assert s.event("intent_started")["attempt"] == 1  # no attempt spent


def test_a_start_cancelled_transiently_is_retried_past_its_schedule_up_to_the_hang_guard() -> None:
    # The schedule's last pause repeats while the lease holds (here it always does),
    # so only the hang guard ends it (soak seed 206454 gave up after the schedule).
    tool = Tool()
    s = EffectScript(
        lambda c: ok() if c.op == "PutItem" else cancelled("ThrottlingError", "None", "None")
    )
    with pytest.raises(OwnershipUnknown, match="ThrottlingError"):
        run_effect(s, spec(tool), token=3)
    assert tool.calls == 0
    tail = [RETRY_WAITS[-1]] * (TRANSIENT_TRIES - 1 - len(RETRY_WAITS))
    assert s.sleeps == list(RETRY_WAITS) + tail
    assert ending_for(OwnershipUnknown("x")).kind is EndKind.ABANDON  # not a counted attempt


def test_a_confirm_cancelled_for_a_transient_reason_is_retried_so_the_outcome_is_kept() -> None:
    tool = Tool()
    s = EffectScript([ok(), ok(), cancelled("TransactionConflict", "None"), ok()])
    res = run_effect(s, spec(tool, lease_check=LeaseCheck()), token=3)
    assert (tool.calls, res.external_id, res.replayed) == (1, "ch_1", False)
    assert s.sleeps == [RETRY_WAITS[0]]
    assert "ownership_unknown" not in s.event_names()
    assert s.event("intent_confirmed")["external_id"] == "ch_1"


def test_a_transiently_cancelled_confirm_is_retried_only_while_the_lease_lasts() -> None:
    tool = Tool()
    lc = LeaseCheck(LeaseLost("token moved"), fail_from=3)  # prepare, start pass
    s = EffectScript([ok(), ok(), cancelled("ThrottlingError", "None")])
    with pytest.raises(OwnershipUnknown, match="confirm intent"):
        run_effect(s, spec(tool, lease_check=lc), token=3)
    assert s.sleeps == []
    assert s.event("ownership_unknown")["stage"] == "intent_confirm"


# =========================================================================== wall times (7.9)


def test_a_failed_attempt_and_its_reconciliation_carry_their_own_times() -> None:
    tool = Tool(ToolOutcomeUnknown("reset"))
    check = Check(CheckAnswer(Verdict.CONFIRMED, "ch_3", {"charge_id": "ch_3"}))
    wall = Wall()
    s = EffectScript([ok(), ok(), ok(), ok()])
    run_effect(s, spec(tool, check=check), wall=wall)
    prepared_at, started_at, failed_at, confirmed_at = wall.readings
    assert item_values(s.calls[0].params["Item"])["created_at"] == prepared_at
    assert item_values(only(transact(s.calls[1])[2], "Put")["Item"])["started_at"] == started_at
    assert sets(only(transact(s.calls[2])[0], "Update"))["ended_at"] == failed_at
    assert_confirm(
        s.calls[3],
        attempt=1,
        external_id="ch_3",
        reconciled=True,
        response={"charge_id": "ch_3"},
        at=confirmed_at,
    )
    assert prepared_at < started_at < failed_at < confirmed_at


WHO, WHY = "alice@ops", "bank statement shows the capture"


@pytest.mark.parametrize("resolution", [Resolution.CONFIRMED, Resolution.RETRY])
def test_a_resolved_intent_drops_the_stale_cannot_tell_reason(resolution: Resolution) -> None:
    c = itable().resolve(
        KEY, resolution=resolution, external_id="x", who=WHO, why=WHY, wall_now=WALL
    )
    assert "reason" in update_removes(c.params)
    assert "reason" not in sets(c.params)


def test_an_abandoned_intent_keeps_the_operators_reason() -> None:
    c = itable().resolve(
        KEY, resolution=Resolution.ABANDON, external_id=None, who=WHO, why=WHY, wall_now=WALL
    )
    assert sets(c.params)["reason"] == WHY
    assert "reason" not in update_removes(c.params)


# =========================================================================== lease first (7.13)


def test_a_worker_whose_lease_lapsed_writes_no_intent() -> None:
    tool = Tool()
    lost = LeaseLost("lease lapsed while the process was frozen")
    s = EffectScript([])
    with pytest.raises(LeaseLost) as caught:
        run_effect(s, spec(tool, lease_check=LeaseCheck(lost)))
    assert caught.value is lost
    assert (s.ops, tool.calls) == ([], 0)
    assert "intent_prepared" not in s.event_names()


def test_a_tool_failure_after_the_lease_lapsed_is_not_written() -> None:
    lost = OwnershipUnknown("reserve spent")
    tool = Tool(ToolNotApplied("refused"))
    s = EffectScript([ok(), ok()])
    with pytest.raises(OwnershipUnknown):
        run_effect(s, spec(tool, lease_check=LeaseCheck(lost, fail_from=3)))
    assert s.ops == ["dynamodb.PutItem", "dynamodb.TransactWriteItems"]  # no attempt_failed


def test_no_intent_is_marked_ambiguous_after_the_lease_lapsed() -> None:
    lost = LeaseLost("token moved")
    s = EffectScript([condition_failed(intent_item(IntentState.IN_PROGRESS, attempts=1))])
    with pytest.raises(LeaseLost):
        run_effect(
            s,
            spec(
                check=Check(CheckAnswer(Verdict.CANNOT_TELL)),
                lease_check=LeaseCheck(lost, fail_from=2),
            ),
        )
    assert s.ops == ["dynamodb.PutItem"]
    assert "intent_ambiguous" not in s.event_names()


def test_a_known_outcome_is_confirmed_even_when_the_lease_lapsed_during_the_call() -> None:
    # The effect happened: recording that true fact (no job condition) beats leaving
    # the next owner to ask the target, or parking the job for an operator.
    lc = LeaseCheck(LeaseLost("token moved"), fail_from=3)
    s = EffectScript([ok(), ok(), ok()])
    res = run_effect(s, spec(Tool(), lease_check=lc))
    assert res.external_id == "ch_1"
    assert lc.calls == 2  # prepare and start only
    assert s.event("intent_confirmed")["external_id"] == "ch_1"


# =========================================================================== key retention (7.2)


@pytest.mark.parametrize(
    ("retention", "first_started", "why"),
    [
        (3600.0, WALL - 7200, "past the 3600 s"),
        (None, WALL - 10, "keeps no idempotency keys"),
    ],
    ids=["past_retention", "no_retention"],
)
def test_no_automatic_repeat_once_the_targets_key_no_longer_protects_it(
    retention: float | None, first_started: float, why: str
) -> None:
    tool = Tool()
    check = Check(CheckAnswer(Verdict.NOT_APPLIED, detail="no such key"))
    item = intent_item(IntentState.IN_PROGRESS, attempts=1, first_started_at=first_started)
    s = EffectScript([condition_failed(item), ok()])
    with pytest.raises(IntentAmbiguous, match=why):
        run_effect(s, spec(tool, check=check, key_retention_seconds=retention))
    assert tool.calls == 0
    written = sets(s.calls_to("UpdateItem")[0].params)
    assert written["state"] == "ambiguous" and why in written["reason"]
    assert s.event("intent_reconciled")["verdict"] == "not_applied"


def test_a_repeat_inside_the_retention_on_the_starters_lease_clock_goes_ahead() -> None:
    tool = Tool()
    check = Check(CheckAnswer(Verdict.NOT_APPLIED))
    item = intent_item(
        IntentState.IN_PROGRESS, attempts=1, first_started_at=WALL - 60, first_started_by=WORKER
    )
    s = EffectScript([condition_failed(item), ok(), ok()])
    res = run_effect(
        s, spec(tool, check=check, key_retention_seconds=3600.0), own_starts=started_here()
    )
    assert (tool.calls, res.external_id) == (1, "ch_1")


@pytest.mark.parametrize(
    "memory",
    [OwnStarts(), started_here(started_at=WALL - 61)],
    ids=["restarted_process", "another_first_start"],
)
def test_a_repeat_by_the_same_worker_id_without_its_lease_clock_reading_parks(
    memory: OwnStarts,
) -> None:
    # The stamp names this worker, but this process did not time that start (a
    # restart under the same worker id, or a first start it does not remember): only
    # a wall clock read twice, across a possible step, would age the key. It parks.
    tool = Tool()
    check = Check(CheckAnswer(Verdict.NOT_APPLIED))
    item = intent_item(
        IntentState.IN_PROGRESS, attempts=1, first_started_at=WALL - 60, first_started_by=WORKER
    )
    s = EffectScript([condition_failed(item), ok()])
    with pytest.raises(IntentAmbiguous, match="comparing two machines' clocks"):
        run_effect(s, spec(tool, check=check, key_retention_seconds=3600.0), own_starts=memory)
    assert tool.calls == 0


def _stepping_tool(mono: Mono, wall: Wall, *, lasts: float, wall_step: float) -> Tool:
    """A tool call that lasts ``lasts`` seconds of the lease clock, during which NTP
    steps the wall clock by ``wall_step``, and whose outcome is unknown."""

    class Stepping(Tool):
        def __call__(self) -> Any:
            mono.now += lasts
            wall.now += lasts + wall_step
            return super().__call__()

    return Stepping(ToolOutcomeUnknown("read timed out"), ToolResult({"charge_id": "ch_2"}, "ch_2"))


def test_a_repeat_past_the_retention_parks_though_the_wall_clock_stepped_back() -> None:
    # Soak seed 1041578: the call took 120 s, past the target's 60 s key retention,
    # so the target forgot the key and its check says "not applied". Meanwhile this
    # worker's wall clock was stepped back 10 minutes: by its two wall readings the
    # first start was moments ago. A repeat would apply the effect twice: it parks.
    mono, wall = Mono(), Wall()
    tool = _stepping_tool(mono, wall, lasts=120.0, wall_step=-600.0)
    check = Check(CheckAnswer(Verdict.NOT_APPLIED, detail="no such key"))
    s = EffectScript([ok(), ok(), ok(), ok()], mono=mono)  # prepare, start, failed, ambiguous
    with pytest.raises(IntentAmbiguous, match="past the 60 s"):
        run_effect(s, spec(tool, check=check, key_retention_seconds=60.0), wall=wall)
    assert tool.calls == 1  # never repeated
    assert sets(s.calls_to("UpdateItem")[-1].params)["state"] == "ambiguous"


def test_a_repeat_inside_the_retention_goes_ahead_though_the_wall_clock_jumped() -> None:
    # The mirror: 5 s on the lease clock, while the wall clock jumped an hour ahead.
    mono, wall = Mono(), Wall()
    tool = _stepping_tool(mono, wall, lasts=5.0, wall_step=3600.0)
    check = Check(CheckAnswer(Verdict.NOT_APPLIED, detail="no such key"))
    s = EffectScript([ok(), ok(), ok(), ok(), ok()], mono=mono)  # ..., failed, start, confirm
    res = run_effect(s, spec(tool, check=check, key_retention_seconds=60.0), wall=wall)
    assert (tool.calls, res.external_id) == (2, "ch_2")


@pytest.mark.parametrize(("write_lasts", "sent"), [(120.0, False), (20.0, True)])
def test_a_repeat_is_judged_at_its_send_not_only_at_the_check(
    write_lasts: float, sent: bool
) -> None:
    # Soak seed 1593876: the check said "not applied" 5 s after the first start, inside
    # the 60 s retention; then the process starved during the repeat's start write (a
    # Lambda's CPU share), and the request went out long after the target could have
    # forgotten the key, while the first, late in the network, may still land. The
    # repeat is judged again at its send: past the window, never sent, parked.
    mono, wall = Mono(), Wall()
    tool = _stepping_tool(mono, wall, lasts=5.0, wall_step=0.0)
    check = Check(CheckAnswer(Verdict.NOT_APPLIED, detail="no such key"))
    starts = 0

    def answer(c: Call) -> Outcome:
        nonlocal starts
        if c.op == "TransactWriteItems" and any(
            "ConditionCheck" in item for item in c.params["TransactItems"]
        ):
            starts += 1
            if starts == 2:  # the repeat's start: the process is paused in it
                mono.now += write_lasts
                wall.now += write_lasts
        return ok()

    s = EffectScript(answer, mono=mono)
    flow_spec = spec(tool, check=check, key_retention_seconds=60.0)
    if sent:
        res = run_effect(s, flow_spec, wall=wall)
        assert (tool.calls, res.external_id) == (2, "ch_2")
        return
    with pytest.raises(IntentAmbiguous, match="started but not sent: its first attempt"):
        run_effect(s, flow_spec, wall=wall)
    assert (starts, tool.calls) == (2, 1)  # the repeat was started, never sent
    parked = s.calls_to("UpdateItem")[-1].params
    assert sets(parked)["state"] == "ambiguous"
    # conditioned on the repeat's own attempt (2), the start that was never sent
    assert "attempts" in parked["ExpressionAttributeNames"].values()
    assert {"N": "2"} in parked["ExpressionAttributeValues"].values()
    assert s.event("intent_ambiguous")["attempt"] == 2


def test_a_later_flow_of_the_same_process_ages_its_first_start_on_the_lease_clock() -> None:
    # The first flow starts the intent and its call is cut off (the attempt ends with
    # the intent in progress); 120 s later on the lease clock a new attempt in the
    # same process meets it. Its wall clock was stepped back 10 minutes meanwhile.
    mono, wall, memory = Mono(), Wall(), OwnStarts()
    first = EffectScript([ok(), ok(), ok()], mono=mono)  # prepare, start, the stopped call
    with pytest.raises(LeaseLost):
        run_effect(first, spec(Tool(LeaseLost("token moved"))), wall=wall, own_starts=memory)
    stamped = sets(first.calls_to("TransactWriteItems")[0].params["TransactItems"][1]["Update"])
    mono.now += 120.0
    wall.now += 120.0 - 600.0
    item = intent_item(
        IntentState.IN_PROGRESS,
        attempts=1,
        first_started_at=stamped["first_started_at"],
        first_started_by=WORKER,
    )
    tool = Tool()
    check = Check(CheckAnswer(Verdict.NOT_APPLIED, detail="no such key"))
    s = EffectScript([condition_failed(item), ok()], mono=mono)
    with pytest.raises(IntentAmbiguous, match="past the 60 s"):
        run_effect(
            s, spec(tool, check=check, key_retention_seconds=60.0), wall=wall, own_starts=memory
        )
    assert tool.calls == 0
    # The same memory, inside the window: the repeat goes ahead.
    mono.now -= 100.0
    s = EffectScript([condition_failed(item), ok(), ok()], mono=mono)
    res = run_effect(
        s, spec(tool, check=check, key_retention_seconds=60.0), wall=wall, own_starts=memory
    )
    assert (tool.calls, res.external_id) == (1, "ch_1")


@pytest.mark.parametrize("starter", ["w-2", None], ids=["another_worker", "unknown"])
def test_key_retention_timed_by_another_machines_clock_parks_instead_of_repeating(
    starter: str | None,
) -> None:
    # The key was first started two hours ago by the starter's clock; this worker's
    # wall clock lags by 1 h 59 min, so by its own reading the start was a minute ago,
    # inside the target's hour. Comparing the two would repeat a payment the target
    # already forgot the key of: the repeat is not proven safe, so the job parks.
    tool = Tool()
    check = Check(CheckAnswer(Verdict.NOT_APPLIED, detail="no such key"))
    item = intent_item(
        IntentState.IN_PROGRESS, attempts=1, first_started_at=WALL - 60, first_started_by=starter
    )
    s = EffectScript([condition_failed(item), ok()])
    with pytest.raises(IntentAmbiguous, match="comparing two machines' clocks"):
        run_effect(s, spec(tool, check=check, key_retention_seconds=3600.0))
    assert tool.calls == 0  # never repeated
    written = sets(s.calls_to("UpdateItem")[0].params)
    assert written["state"] == "ambiguous"


def test_the_start_stamps_whose_clock_timed_the_first_start() -> None:
    tool = Tool()
    s = EffectScript([ok(), ok(), ok()])
    run_effect(s, spec(tool))
    (start,) = s.calls_to("TransactWriteItems")[:1]
    text = json.dumps(start.params)
    assert f"|{WORKER}" in text  # first_start: "<wall time>|<worker id>", if not set yet
    view = intent_view_of(
        intent_item(IntentState.IN_PROGRESS, first_started_at=WALL, first_started_by="w-9")
    )
    assert view.first_started_by == "w-9"
    assert first_started_by(first_start_stamp(WALL, "w-9"), WALL + 1) is None  # not one write


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        (ToolNotApplied("refused", code="refused"), EndKind.RETRY),
        (ToolNotApplied("HTTP 422", code="http_422", retry=False), EndKind.FAIL),
        (IntentBusy("held by job-a", holder="job-a"), EndKind.PARK),
    ],
    ids=["not_applied_retry", "not_applied_rejected", "busy"],
)
def test_the_new_intent_errors_end_the_attempt_as_documented(exc: Exception, kind: EndKind) -> None:
    end = ending_for(exc)
    assert end.kind is kind
    assert str(exc) in end.reason


def test_the_simulator_answers_the_wall_clock_with_its_virtual_time() -> None:
    from sqs_lease.testing._sim.resources import ATTEMPTS as SIM_ATTEMPTS
    from sqs_lease.testing._sim.resources import EPOCH_S
    from sqs_lease.testing._sim.world import World

    world = World(11)
    world.run()
    done = [
        item_values(item)
        for item in world.ddb.items[SIM_ATTEMPTS].values()
        if item["outcome"]["S"] == "ok"
    ]
    assert done
    for attempt in done:
        # Virtual wall time (the simulated epoch plus seconds), never this machine's
        # clock; one worker's start and end of a call are two readings, not one.
        assert EPOCH_S - 3600 < attempt["started_at"] < EPOCH_S + 86_400
        assert attempt["started_at"] < attempt["ended_at"]


def test_the_targets_success_meaning_is_stored_on_intent_and_attempt_and_given_to_its_check() -> (
    None
):
    from dataclasses import replace

    tool = Tool(ToolOutcomeUnknown("read timed out", code="timeout"))
    check = Check(CheckAnswer(Verdict.CONFIRMED, "ch_7", {"charge_id": "ch_7"}))
    accepted = replace(spec(tool, check=check, lease_check=LeaseCheck()), success="accepted")
    s = EffectScript([ok(), ok(), ok(), ok()])
    run_effect(s, accepted)
    assert s.calls[0].params["Item"]["success"] == {"S": "accepted"}  # the intent
    attempt_put = [i for i in transact(s.calls[1]) if "Put" in i]
    assert attempt_put[0]["Put"]["Item"]["success"] == {"S": "accepted"}  # the attempt
    assert [v.success for v in check.views] == ["accepted"]


def test_successor_keys_are_derived_and_count_up() -> None:
    from sqs_lease._core.resolving import successor_key

    assert successor_key("inv-7:capture") == "inv-7:capture~op2"
    assert successor_key("inv-7:capture~op2") == "inv-7:capture~op3"
    assert successor_key("~op9") == "~op9~op2"  # no base: not a successor mark


def test_a_superseded_intent_is_followed_to_its_successor_and_called_under_the_new_key() -> None:
    from dataclasses import replace

    from sqs_lease._core.resolving import successor_key

    old = intent_item(IntentState.SUPERSEDED, attempts=2, reason="new capture approved")
    old["successor"] = {"S": successor_key(KEY)}
    stale, fresh = Tool(), Tool()
    rekeyed: list[str] = []

    def rekey(new_key: str) -> Any:
        rekeyed.append(new_key)
        return fresh

    s = EffectScript([condition_failed(old), ok(), ok(), ok()])
    res = run_effect(s, replace(spec(stale), rekey=rekey))
    new_key = f"{KEY}~op2"
    assert res.key == new_key and res.external_id == "ch_1"
    assert (stale.calls, fresh.calls, rekeyed) == (0, 1, [new_key])
    prepared = s.calls[1].params["Item"]
    assert prepared["intent_key"] == {"S": new_key}
    assert prepared["predecessor"] == {"S": KEY}  # recorded as the old one's successor
    ev = s.event("intent_successor_followed")
    assert (ev["key"], ev["successor"]) == (KEY, new_key)


def test_a_superseded_intent_that_cannot_be_followed_is_a_permanent_error() -> None:
    old = intent_item(IntentState.SUPERSEDED, attempts=2)
    old["successor"] = {"S": f"{KEY}~op2"}
    s = EffectScript([condition_failed(old)])
    with pytest.raises(PermanentError, match="superseded by") as caught:
        run_effect(s, spec(Tool()))  # no rekey: e.g. a tool bound to the old key
    assert caught.value.code == "intent_superseded"
