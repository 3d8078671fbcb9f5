"""Messages: the body format, parsing a received message, the receive flow, and the
batch and queue helpers the other flows share.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from .._errors import (
    AwsCallFailed,
    ResourceMissing,
    SqsLeaseError,
)
from . import inputs
from .calls import Call, Err, ErrorKind, Flow, call, emit
from .fifo import (
    is_fifo,
)
from .lease import LocalLease
from .timing import CAP_MARGIN, SQS_MAX_VISIBILITY

SQS_BATCH = 10
DDB_BATCH_GET = 100
COMMIT_TRIES = 3
BATCH_GET_TRIES = 3
MESSAGE_VERSION = 1
UNSENT_GRACE_SECONDS = 60.0
"""How long a record may stay without a sent message before another sender (a
resubmission, a worker's stranded sweep) takes the right to send over. Taking over
is always safe (the new send id turns any older message into a stray); the grace
only spares a duplicate send while the first sender is still at work. It compares
the record's ``unsent_since`` (the first sender's wall clock) with the taker's:
clock skew shifts only when a take-over happens, never what is correct, and the
sweep bounds the shift: a stamp more than the grace ahead of its clock is stamped
again on it (``sweeping.sweep_flow``)."""


def receive_batch(queue_url: str) -> int:
    """The most messages one receive asks for: 10 (SQS's bound), 1 from a FIFO queue
    (:func:`receive_flow` says why). The receive and every shell's pacing read it."""
    return 1 if is_fifo(queue_url) else SQS_BATCH


def chunks(seq: Sequence[Any], n: int) -> Iterator[Sequence[Any]]:
    for i in range(0, len(seq), n):
        yield seq[i : i + n]


Q = TypeVar("Q")


def by_queue(
    items: Sequence[Q], default: str, queue_of: Callable[[Q], str]
) -> Iterator[tuple[str, Sequence[Any]]]:
    """Batches of at most 10 on one queue each (a worker serving several queues holds
    messages of each), in the order the queues first appear."""
    queues: dict[str, list[Q]] = {}
    for item in items:
        queues.setdefault(queue_of(item) or default, []).append(item)
    for queue, on_it in queues.items():
        for chunk in chunks(on_it, SQS_BATCH):
            yield queue, chunk


def lease_queue(lease: LocalLease) -> str:
    return lease.queue_url


def fail_call(what: str, err: Err) -> SqsLeaseError:
    if err.kind is ErrorKind.NOT_FOUND:
        fix = (
            "run `sqs-lease queue create`"
            if "Queue" in err.code or "Queue" in err.query_code
            else "run `sqs-lease tables create`"
        )
        return ResourceMissing(f"{what}: {err.code or 'not found'}: {err.message}; {fix}")
    return AwsCallFailed(f"{what} failed: {err.code or err.kind}: {err.message}", err.code)


# --------------------------------------------------------------------------- messages


@dataclass(frozen=True)
class Delivery:
    """A received SQS message that names a job (the right to try, not ownership)."""

    message_id: str
    receipt_handle: str
    job_id: str
    job_class: str
    receive_count: int
    received_at: float  # monotonic, taken before ReceiveMessage was sent
    visibility: int  # the visibility the receive granted
    send_id: str | None = None  # which send of the job this is (None: an older producer)
    body: str = ""  # the original bytes, kept for a DLQ copy should it prove poison
    queue_url: str = ""  # the queue it came from (priorities); "": the flow's queue_url
    stage: str | None = None  # the stage the message was sent for (None: a job of one stage)
    # SQS's wall times (seconds) of the send and of the first receive, where it said:
    # the 12-hour cap counts from the first receive (AWS) or the send (moto).
    sent_wall: float | None = None
    first_received_wall: float | None = None


@dataclass(frozen=True)
class Poison:
    """A message that can never be processed; the reason says why."""

    message_id: str
    receipt_handle: str
    reason: str
    job_id: str | None = None
    body: str = ""  # kept so the DLQ copy carries the original bytes
    queue_url: str = ""  # the queue it came from; "": the flow's queue_url


def message_body(
    job_id: str, job_class: str, stage: str | None = None, send_id: str | None = None
) -> str:
    """The job's message: what to claim, and which send of it this is (``send_id``)."""
    body: dict[str, Any] = {"v": MESSAGE_VERSION, "job_id": job_id, "job_class": job_class}
    if stage is not None:
        body["stage"] = stage
    if send_id is not None:
        body["send_id"] = send_id
    return json.dumps(body, separators=(",", ":"), sort_keys=True)


def on_queue(item: Delivery | Poison, default: str) -> str:
    """The queue a message lives on: the one it was received from, else ``default``."""
    return item.queue_url or default


def parse_message(
    message: Mapping[str, Any], received_at: float, visibility: int, queue_url: str = ""
) -> Delivery | Poison:
    """Turn one ReceiveMessage entry into a delivery, or say why it is poison
    (``queue_url``: the queue it was received from, when a worker serves several).

    Total: whatever anyone sent, this returns; nothing raises out of it into a
    worker's receive loop, a Lambda batch or an operator's DLQ command."""
    try:
        item = _parse_message(message, received_at, visibility)
    except Exception as exc:  # a reader's defect must cost one message, never the worker
        item = Poison(
            _text(message, "MessageId"),
            _text(message, "ReceiptHandle"),
            f"message could not be read ({type(exc).__name__})",
            body=_text(message, "Body"),
        )
    return replace(item, queue_url=queue_url) if queue_url else item


def _text(message: Any, key: str) -> str:
    value = message.get(key, "") if isinstance(message, Mapping) else ""
    return value if isinstance(value, str) else ""


def _parse_message(
    message: Mapping[str, Any], received_at: float, visibility: int
) -> Delivery | Poison:
    mid = _text(message, "MessageId")
    handle = _text(message, "ReceiptHandle")
    raw = _text(message, "Body")
    try:
        body = inputs.loads(raw)
    except ValueError:
        return Poison(mid, handle, "message body is not JSON", body=raw)
    if not isinstance(body, dict):
        return Poison(mid, handle, "message body is not a JSON object", body=raw)
    job_id, job_class = body.get("job_id"), body.get("job_class")
    if not isinstance(job_id, str) or not job_id:
        return Poison(mid, handle, "message names no job_id", body=raw)
    if (why := inputs.job_id_problem(job_id)) is not None:
        # Never carried into a request or a journal line: the id is not one.
        return Poison(mid, handle, f"message job_id is not a job id: {why}", body=raw)
    if not isinstance(job_class, str) or not job_class:
        return Poison(mid, handle, "message names no job_class", job_id, raw)
    if (why := inputs.name_problem("job class", job_class)) is not None:
        # No worker of any version can serve it: poison now, not a deferral.
        return Poison(mid, handle, f"message job_class is not a class name: {why}", job_id, raw)
    send_id = body.get("send_id")
    if send_id is not None and (not isinstance(send_id, str) or not send_id):
        return Poison(mid, handle, "message send_id is not a non-empty string", job_id, raw)
    if send_id is not None and (why := inputs.send_id_problem(send_id)) is not None:
        return Poison(mid, handle, f"message send_id is not a send id: {why}", job_id, raw)
    stage = body.get("stage")
    if stage is not None and (not isinstance(stage, str) or not stage):
        return Poison(mid, handle, "message stage is not a non-empty string", job_id, raw)
    if stage is not None and (why := inputs.name_problem("stage", stage)) is not None:
        return Poison(mid, handle, f"message stage is not a stage name: {why}", job_id, raw)
    attrs = message.get("Attributes")
    attrs = attrs if isinstance(attrs, Mapping) else {}
    return Delivery(
        mid,
        handle,
        job_id,
        job_class,
        _count(attrs.get("ApproximateReceiveCount")),
        received_at,
        visibility,
        send_id,
        raw,
        stage=stage,
        sent_wall=_epoch(attrs.get("SentTimestamp")),
        first_received_wall=_epoch(attrs.get("ApproximateFirstReceiveTimestamp")),
    )


def _count(text: Any) -> int:
    """ApproximateReceiveCount (SQS's own, as text); 1 where it is missing or garbled."""
    try:
        return max(1, int(text)) if text is not None else 1
    except (TypeError, ValueError, OverflowError):
        return 1


def _epoch(millis: Any) -> float | None:
    """An SQS timestamp attribute (epoch milliseconds, as text) in seconds, or None."""
    try:
        return int(millis) / 1000.0 if millis is not None else None
    except (TypeError, ValueError, OverflowError):
        return None


def receive_flow(
    *,
    queue_url: str,
    max_messages: int,
    wait_seconds: int,
    visibility: int,
    tag_queue: bool = False,
) -> Flow[list[Delivery | Poison]]:
    """Long-poll one batch; each message's local lease counts from before the request.
    ``tag_queue``: each message names the queue it came from (a worker serving several).

    From a FIFO queue one message at a time: a batch may hold several messages of one
    group, which the worker would run side by side, out of their order; received one
    by one, the next of a group comes only once the one before it is gone (SQS holds
    a group while one of its messages is in flight), and no message is received
    and handed back to wait (each receive would count towards the redrive)."""
    most = max(1, min(receive_batch(queue_url), max_messages))
    out = yield from call(
        Call(
            "sqs",
            "ReceiveMessage",
            {
                "QueueUrl": queue_url,
                "MaxNumberOfMessages": most,
                "WaitTimeSeconds": wait_seconds,
                "VisibilityTimeout": visibility,
                "MessageSystemAttributeNames": [
                    "ApproximateReceiveCount",
                    "SentTimestamp",
                    "ApproximateFirstReceiveTimestamp",
                ],
            },
        )
    )
    if isinstance(out, Err):
        if out.kind is ErrorKind.NOT_FOUND:
            raise fail_call(f"receive from {queue_url}", out)
        yield from emit("receive_failed", error_code=out.code or out.kind.value)
        return []
    return [
        parse_message(m, out.sent_at, visibility, queue_url if tag_queue else "")
        for m in out.response.get("Messages", [])
    ]


MESSAGE_CAP_SECONDS = SQS_MAX_VISIBILITY - CAP_MARGIN
"""How long one message may be held in all, counted from its receive: SQS allows a
received message a total visibility of 12 hours (AWS's ChangeMessageVisibility
reference; moto counts from the send instead, a quirk nothing here relies on). The
margin covers the seconds between SQS's receive and our stamp, a Lambda mapping's
batching window, and a few minutes of skew where a re-received message's first
receive (SQS's clock) is compared with the worker's wall clock (:func:`cap_budget`)."""


def cap_budget(delivery: Delivery, budget: float, wall_now: float) -> float:
    """The budget an attempt on this message may have: its stage budget, less what the
    message has already used of SQS's 12-hour cap (:data:`MESSAGE_CAP_SECONDS`).

    The cap counts from the receive, never from the send: a message that waited hours
    (or days) in a backlog before its first receive has its whole cap. The attempt's
    own stage deadline counts from its receive on the lease clock (``new_lease``), one
    clock. Only a message received before (``receive_count > 1``: an earlier attempt,
    a retry's backoff) may have used part of it; its ``ApproximateFirstReceiveTimestamp``
    is SQS's clock and ``wall_now`` the worker's, so that one comparison may only
    *shorten* a budget, and a budget it cuts to nothing ends in a new message for the
    job (``Drop.MESSAGE_CAP``: uncharged, and the new message's first receive is this
    worker's own), never in a failed job. A first receive (or no timestamp) is the
    whole budget: a wrong clock can then cost one hand-back, never a loop of them."""
    first = delivery.first_received_wall
    if delivery.receive_count <= 1 or first is None:
        return budget
    used = max(0.0, wall_now - first)
    return max(0.0, min(budget, MESSAGE_CAP_SECONDS - used))


def cap_visibility(delivery: Delivery, lease_seconds: int, wall_now: float) -> int:
    """The visibility a take or a claim may ask for this message: a lease, never past
    what :func:`cap_budget` leaves of its 12-hour cap (SQS refuses a change past it),
    at least 1 s. The one rule of the Lambda take and the claim."""
    left = int(cap_budget(delivery, float(lease_seconds), wall_now))
    return max(1, min(lease_seconds, left))
