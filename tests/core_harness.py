"""Drive the protocol core's flows by hand: no AWS, no moto, no network, no clock.

:class:`Script` plays the driver. For every :class:`Call` a flow yields it asks a
responder (``Call -> Outcome``) or pops the next scripted outcome; it records the
calls, the :class:`Emit` events and the :class:`Sleep` seconds, and returns the
flow's result. The rest are small helpers to build DynamoDB items and outcomes and
to read the low-level request parameters that ``JobTable`` builds.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from sqs_lease._core.calls import (
    Call,
    Emit,
    Err,
    ErrorKind,
    Flow,
    Instruction,
    Invoke,
    Ok,
    Outcome,
    Sleep,
)
from sqs_lease._core.lease import Drop, LeaseEvent, LeaseStatus, LocalLease
from sqs_lease._core.messages import Delivery
from sqs_lease._core.records import JobState, JobView
from sqs_lease._schema.job_requests import JobTable
from sqs_lease._schema.models import JobRecord

T = TypeVar("T")
Responder = Callable[[Call], Outcome]

TABLE = "jobs-test"
QUEUE = "https://sqs.test/123/work"
DLQ = "https://sqs.test/123/work-dlq"
WORKER = "w-1"
OTHER = "w-2"
NONCE = "n-1"  # the attempt's nonce the tests' flows are given (``nonce="n-1"``)


class Script:
    """A hand-driven driver: answers calls from a responder or a list of outcomes."""

    def __init__(self, answers: Responder | Iterable[Outcome] = ()) -> None:
        self._responder: Responder | None = None
        self._queue: deque[Outcome] = deque()
        if callable(answers):
            self._responder = answers
        else:
            self._queue.extend(answers)
        self.calls: list[Call] = []
        self.events: list[Emit] = []
        self.sleeps: list[float] = []
        self.invoked: list[Invoke] = []
        self.trace: list[Instruction] = []

    def then(self, *answers: Outcome) -> Script:
        """Script more outcomes, after those already scripted."""
        self._queue.extend(answers)
        return self

    def _answer(self, instruction: Call) -> Outcome:
        if self._responder is not None:
            return self._responder(instruction)
        if not self._queue:
            raise AssertionError(
                f"unscripted call {instruction.service}.{instruction.op} "
                f"(call #{len(self.calls)}): the flow made more calls than scripted"
            )
        return self._queue.popleft()

    def run(self, flow: Flow[T]) -> T:
        """Run ``flow`` to its end and return its result (exceptions propagate)."""
        try:
            instruction = next(flow)
            while True:
                self.trace.append(instruction)
                answer: Outcome | None
                if isinstance(instruction, Call):
                    self.calls.append(instruction)
                    answer = self._answer(instruction)
                elif isinstance(instruction, Sleep):
                    self.sleeps.append(instruction.seconds)
                    answer = Ok({})  # what the sync driver sends back for a sleep
                elif isinstance(instruction, Emit):
                    self.events.append(instruction)
                    answer = None
                else:
                    # Invoke: run the caller's code as the drivers do.
                    self.invoked.append(instruction)
                    try:
                        answer = Ok({"value": instruction.fn()})
                    except Exception as exc:
                        answer = Err(ErrorKind.RAISED, type(exc).__name__, "", str(exc), exc=exc)
                instruction = flow.send(answer)
        except StopIteration as stop:
            result: T = stop.value
        if self._queue:
            raise AssertionError(
                f"flow ended with {len(self._queue)} scripted outcome(s) unused: "
                f"{list(self._queue)!r}"
            )
        return result

    # ------------------------------------------------------------------ reading the record

    @property
    def ops(self) -> list[str]:
        """``service.Op`` of every call, in order."""
        return [f"{c.service}.{c.op}" for c in self.calls]

    @property
    def kinds(self) -> list[str]:
        """``call:Op`` / ``sleep`` / ``emit:event`` for every instruction, in order."""
        out: list[str] = []
        for i in self.trace:
            if isinstance(i, Call):
                out.append(f"call:{i.op}")
            elif isinstance(i, Sleep):
                out.append("sleep")
            elif isinstance(i, Invoke):
                out.append(f"invoke:{i.what}")
            else:
                out.append(f"emit:{i.event}")
        return out

    def event_names(self) -> list[str]:
        return [e.event for e in self.events]

    def events_named(self, name: str) -> list[Mapping[str, Any]]:
        return [e.fields for e in self.events if e.event == name]

    def event(self, name: str) -> Mapping[str, Any]:
        """The fields of the one event called ``name`` (fails unless exactly one)."""
        found = self.events_named(name)
        assert len(found) == 1, f"expected one {name!r} event, got {self.event_names()}"
        return found[0]

    def calls_to(self, op: str) -> list[Call]:
        return [c for c in self.calls if c.op == op]


# ---------------------------------------------------------------------- outcomes


def ok(
    response: Mapping[str, Any] | None = None, sent_at: float = 0.0, received_at: float = 0.0
) -> Ok:
    return Ok(dict(response or {}), sent_at, received_at)


def err(kind: ErrorKind, code: str = "", item: Mapping[str, Any] | None = None, **kw: Any) -> Err:
    return Err(kind, code=code, item=item, **kw)


def unreachable() -> Err:
    return Err(ErrorKind.UNREACHABLE, code="EndpointConnectionError", message="no route")


def condition_failed(item: Mapping[str, Any] | None) -> Err:
    return Err(
        ErrorKind.CONDITION_FAILED,
        code="ConditionalCheckFailedException",
        message="The conditional request failed",
        item=item,
    )


# ---------------------------------------------------------------------- records


def job_item(
    job_id: str = "job-1",
    *,
    job_class: str = "ocr",
    state: JobState | str = JobState.RUNNING,
    owner: str | None = WORKER,
    token: int = 1,
    attempt: int = 1,
    payload_hash: str = "hash-aaa",
    message_sent: bool = True,
    reason: str | None = None,
    error_code: str | None = None,
    stage: str | None = None,
    send_id: str | None = "send-1",
    unsent_since: float | None = None,
    granted_attempts: int | None = None,
    resumed_at_attempt: int | None = None,
    write_id: str | None = None,
) -> dict[str, Any]:
    """A low-level DynamoDB item for one job, serialised by the real pynamodb model.

    ``unsent_since`` set means the record's message is not known to be sent (the
    sparse index's attributes are present and ``message_sent`` is false)."""
    record = JobRecord(
        job_id=job_id,
        job_class=job_class,
        state=str(state),
        owner=owner,
        token=token,
        attempt=attempt,
        payload='{"page": 1}',
        payload_hash=payload_hash,
        message_sent=message_sent,
        stage=stage,
        reason=reason,
        error_code=error_code,
        created_at=1_700_000_000,
        updated_at=1_700_000_000,
        send_id=send_id,
        granted_attempts=granted_attempts,
        resumed_at_attempt=resumed_at_attempt,
        write_id=write_id,
    )
    if unsent_since is not None:
        record.message_sent = False
        record.unsent = "unsent"
        record.unsent_since = unsent_since
    item: dict[str, Any] = record.serialize()
    return item


def job_view(
    job_id: str = "job-1",
    *,
    job_class: str = "ocr",
    token: int = 2,
    attempt: int = 2,
    owner: str | None = WORKER,
    payload_hash: str = "hash-aaa",
) -> JobView:
    """A claimed job as the worker holds it after ``claim_flow``."""
    return JobView(
        job_id=job_id,
        job_class=job_class,
        state=JobState.RUNNING,
        token=token,
        attempt=attempt,
        owner=owner,
        payload_hash=payload_hash,
    )


def delivery(
    job_id: str = "job-1",
    *,
    job_class: str = "ocr",
    receipt_handle: str = "rh-1",
    received_at: float = 1000.0,
    visibility: int = 30,
    receive_count: int = 1,
    send_id: str | None = "send-1",
) -> Delivery:
    return Delivery(
        message_id=f"m-{job_id}",
        receipt_handle=receipt_handle,
        job_id=job_id,
        job_class=job_class,
        receive_count=receive_count,
        received_at=received_at,
        visibility=visibility,
        send_id=send_id,
        body=f'{{"job_id":"{job_id}","job_class":"{job_class}","send_id":"{send_id}","v":1}}',
    )


def local_lease(
    job_id: str = "job-1",
    *,
    token: int = 2,
    receipt_handle: str | None = None,
    lease_seconds: int = 60,
    heartbeat_seconds: float = 10.0,
    jitter_seconds: float = 5.0,
    deadline: float = 1060.0,
    started_at: float = 1000.0,
    stage_deadline: float = 10_000.0,
    progress_timeout: float | None = None,
    last_progress: float = 1000.0,
    next_beat: float = 1010.0,
    nonce: str = NONCE,
) -> LocalLease:
    return LocalLease(
        job_id=job_id,
        token=token,
        receipt_handle=receipt_handle or f"rh-{job_id}",
        lease_seconds=lease_seconds,
        heartbeat_seconds=heartbeat_seconds,
        jitter_seconds=jitter_seconds,
        deadline=deadline,
        started_at=started_at,
        stage_deadline=stage_deadline,
        progress_timeout=progress_timeout,
        last_progress=last_progress,
        next_beat=next_beat,
        nonce=nonce,
    )


def table() -> JobTable:
    return JobTable(TABLE)


# ---------------------------------------------------------------------- request parameters


def decode(value: Mapping[str, Any]) -> Any:
    """One low-level attribute value as a Python value (S, N, BOOL, NULL, L)."""
    if "S" in value:
        return value["S"]
    if "N" in value:
        text = str(value["N"])
        number = float(text)
        return int(number) if number.is_integer() and "." not in text else number
    if "BOOL" in value:
        return bool(value["BOOL"])
    if "NULL" in value:
        return None
    if "L" in value:
        return [decode(v) for v in value["L"]]
    raise AssertionError(f"unexpected attribute value {value!r}")


def _resolve(fragment: str, params: Mapping[str, Any]) -> str:
    names: Mapping[str, str] = params.get("ExpressionAttributeNames", {})
    values: Mapping[str, Any] = params.get("ExpressionAttributeValues", {})
    text = re.sub(r"#\w+", lambda m: names[m.group(0)], fragment)
    return re.sub(r":\w+", lambda m: repr(decode(values[m.group(0)])), text)


def condition_text(params: Mapping[str, Any]) -> str:
    """The ConditionExpression with names and values substituted in."""
    return _resolve(str(params["ConditionExpression"]), params)


def condition_equalities(params: Mapping[str, Any]) -> dict[str, Any]:
    """``attribute = value`` terms of the ConditionExpression, decoded."""
    names: Mapping[str, str] = params.get("ExpressionAttributeNames", {})
    values: Mapping[str, Any] = params.get("ExpressionAttributeValues", {})
    found: dict[str, Any] = {}
    for name, value in re.findall(r"(#\w+) = (:\w+)", str(params["ConditionExpression"])):
        found[names[name]] = decode(values[value])
    return found


def assert_fenced(params: Mapping[str, Any], *, token: int, worker_id: str = WORKER) -> None:
    """The write lands only while ``token`` is current and the job is running.

    The token (rising by one at every claim) is the fence, and ``state = running``
    keeps a finished or requeued record from being overwritten. DESIGN 3.5 also
    names the owner; if the condition carries it, it must be this worker.
    """
    text = condition_text(params)
    assert " OR " not in text and " NOT " not in text, text
    terms = condition_equalities(params)
    assert terms.get("token") == token, text
    assert terms.get("state") == JobState.RUNNING.value, text
    assert terms.get("owner", worker_id) == worker_id, text
    assert set(terms) <= {"token", "state", "owner"}, text


def _top_level(clause: str) -> list[str]:
    """A clause's comma-separated parts, commas inside function calls kept."""
    parts, depth, cur = [], 0, ""
    for ch in clause:
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            parts.append(cur.strip())
            cur = ""
        else:
            cur += ch
    return [*parts, cur.strip()] if cur.strip() else parts


def update_sets(params: Mapping[str, Any]) -> dict[str, str]:
    """``attribute -> resolved right-hand side`` of the UpdateExpression's SET clause."""
    expression = str(params["UpdateExpression"])
    match = re.search(r"SET (.*?)(?= REMOVE | ADD | DELETE |$)", expression)
    out: dict[str, str] = {}
    if match is None:
        return out
    for assignment in _top_level(match.group(1)):
        left, right = assignment.split(" = ", 1)
        out[_resolve(left, params)] = _resolve(right, params)
    return out


def update_adds(params: Mapping[str, Any]) -> dict[str, str]:
    """``attribute -> resolved operand`` of the UpdateExpression's ADD clause."""
    expression = str(params["UpdateExpression"])
    match = re.search(r"ADD (.*?)(?= SET | REMOVE | DELETE |$)", expression)
    if match is None:
        return {}
    out: dict[str, str] = {}
    for part in _top_level(match.group(1)):
        name, operand = part.split(" ", 1)
        out[_resolve(name, params)] = _resolve(operand, params)
    return out


def update_removes(params: Mapping[str, Any]) -> list[str]:
    """Attributes the UpdateExpression's REMOVE clause drops."""
    expression = str(params["UpdateExpression"])
    match = re.search(r"REMOVE (.*?)(?= SET | ADD | DELETE |$)", expression)
    if match is None:
        return []
    return [_resolve(part, params) for part in match.group(1).split(", ")]


_REACH = {
    LeaseStatus.OK: None,
    LeaseStatus.UNKNOWN: LeaseEvent.UNCONFIRMED,
    LeaseStatus.DONE: LeaseEvent.RETURNED,
    LeaseStatus.EXPIRED: LeaseEvent.DROPPED,
    LeaseStatus.LOST: LeaseEvent.LOST,
    LeaseStatus.CANCELLED: LeaseEvent.CANCELLED,
}


def put(lease: LocalLease, status: LeaseStatus, reason: str = "") -> None:
    """Move a fresh lease to ``status`` by the event that reaches it (its state has one
    writer, ``LocalLease.process``; an expired lease is a spent reserve)."""
    event = _REACH[status]
    if event is not None:
        lease.process(
            event, reason, why=Drop.RESERVE_SPENT if event is LeaseEvent.DROPPED else None
        )
    assert lease.status is status
