"""Whether an attempt deleted its message is the attempt's own answer (issue 28), driven
by hand (no AWS).

A Lambda record succeeds exactly when the attempt's flows deleted its message (it is
then left out of ``batchItemFailures``). The Lambda flow used to learn it by watching
the attempt's instructions for a DeleteMessage of the record's receipt handle that SQS
answered with success. Now every flow that deletes a message says so in its value
(``Finish.deleted``, ``NotClaimed.deleted``, ``poison_flow``, the slot wait) and
``attempt_flow`` returns it (``AttemptEnd.deleted``), which ``record_flow`` reads.

Each path that deletes is played twice, SQS taking the delete and refusing it: the
answer is the delete's, and it agrees with the old reading of the calls made.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import pytest
from core_harness import (
    QUEUE,
    Script,
    condition_failed,
    delivery,
    err,
    job_item,
    ok,
)
from test_core_attempt import MONO, WALL, Rules, Shell

from sqs_lease._core.attempt import AttemptEnd, attempt_flow
from sqs_lease._core.calls import Call, ErrorKind, Ok, Outcome
from sqs_lease._core.deletes import DeleteBatch
from sqs_lease._core.env import HandlerRun, SlotEnv
from sqs_lease._core.eventsource import GroupStop
from sqs_lease._core.fencing import FinishOutcome
from sqs_lease._core.invocation import record_flow
from sqs_lease._core.messages import Delivery, Poison
from sqs_lease._core.records import CANCELLED_CODE, JobState
from sqs_lease._core.stages import MESSAGE_CAP_SECONDS, NextStage
from sqs_lease._errors import (
    JobCancelled,
    PayloadError,
    PermanentError,
    ToolOutcomeUnknown,
    TransientError,
)
from sqs_lease._schema.slot_requests import SlotTable

FIFO = "https://sqs.test/123/work.fifo"
REFUSED = err(ErrorKind.INVALID, "ReceiptHandleIsInvalid")
DONE = FinishOutcome.DONE


def _queued(**kw: Any) -> Outcome:
    """The claim's answer: it landed (ALL_OLD, the record queued before it)."""
    item = job_item(state=JobState.QUEUED, owner=None, token=4, attempt=0)
    item.update(kw.pop("item", {}))
    return ok({"Attributes": {**item, **kw}})


def _found(**kw: Any) -> Outcome:
    """The claim's condition failed: ALL_OLD shows the record as it is."""
    return condition_failed(job_item(**kw))


@dataclass
class AWS:
    """SQS and DynamoDB for one attempt: the claim answered with ``claim``, every other
    write applied, every send taken, the delete answered with ``delete``; the calls
    and their answers kept."""

    claim: Outcome
    delete: Outcome
    writes: Outcome | None = None
    slots_read: Outcome | None = None
    log: list[tuple[Call, Outcome]] = field(default_factory=list)

    def __call__(self, c: Call) -> Outcome:
        answer = self._answer(c)
        self.log.append((c, answer))
        return answer

    def _answer(self, c: Call) -> Outcome:
        if c.op == "DeleteMessage":
            return self.delete
        if c.op == "UpdateItem" and not any(x.op == "UpdateItem" for x, _ in self.log):
            return self.claim
        if c.op in ("UpdateItem", "TransactWriteItems"):
            return self.writes if self.writes is not None else ok()
        if c.op == "BatchGetItem" and self.slots_read is not None:
            return self.slots_read
        if c.op == "SendMessage":
            return ok({"MessageId": "m-new"})
        if c.op.endswith("Batch"):
            return ok({"Successful": [{"Id": "0"}]})
        return ok(sent_at=MONO, received_at=MONO)  # a Lambda record's take: its lease

    def sniffed(self, receipt_handle: str) -> bool:
        """The old reading: a DeleteMessage of this handle that SQS answered Ok."""
        return any(
            c.op == "DeleteMessage"
            and c.params.get("ReceiptHandle") == receipt_handle
            and isinstance(a, Ok)
            for c, a in self.log
        )

    def deletes(self) -> int:
        return sum(1 for c, _ in self.log if c.op == "DeleteMessage")


def _raising(exc: Exception) -> Callable[[HandlerRun], Any]:
    def handler(run: HandlerRun) -> Any:
        raise exc

    return handler


class StrictRules(Rules):
    def validate_payload(self, payload_json: str) -> Any:
        raise PayloadError("payload: field 'pages' is required")


def _staged(shell: Shell) -> None:
    shell.env.stage_rules_of = lambda job_class, stage: Rules()


def _limited(shell: Shell) -> None:
    # One slot per class, and the slots table unreadable: the job waits for a slot.
    shell.env.slots = SlotEnv(SlotTable("slots-test"), lambda c: 1, lambda t: None)


def _unknown(shell: Shell) -> None:
    shell.env.rules_of = lambda name: None


@dataclass(frozen=True)
class Path:
    """One way an attempt deletes its message."""

    claim: Outcome
    handler: Callable[[HandlerRun], Any] = lambda run: {"text": "ok"}
    item: Delivery | Poison | None = None
    setup: Callable[[Shell], None] | None = None
    rules: Rules | None = None
    slots_read: Outcome | None = None
    fin: FinishOutcome | None = None  # the end write the attempt reports (None: none)


CAPPED = replace(delivery(receive_count=2), first_received_wall=WALL - MESSAGE_CAP_SECONDS + 30.0)

DELETING: dict[str, Path] = {
    "commit": Path(_queued(), fin=DONE),
    "fail": Path(_queued(), _raising(PermanentError("no page", code="no_page")), fin=DONE),
    "park": Path(_queued(), _raising(ToolOutcomeUnknown("timed out", code="t")), fin=DONE),
    "fail_bad_result": Path(_queued(), lambda run: {"x": object()}, fin=DONE),
    "fail_instead_too_large": Path(
        _queued(), lambda run: {"x": "a" * 500_000}, fin=FinishOutcome.FAILED
    ),
    "invalid_payload": Path(_queued(), rules=StrictRules(), fin=DONE),
    "stage_handed_on": Path(
        _queued(), lambda run: NextStage("render", {"page": 2}), setup=_staged, fin=DONE
    ),
    "resent_at_the_cap": Path(_queued(), item=CAPPED, fin=DONE),
    "slot_wait": Path(_queued(), setup=_limited, slots_read=err(ErrorKind.UNREACHABLE, "x")),
    "poison": Path(_queued(), item=Poison("m-1", "rh-1", "not JSON", None, "garbage")),
    "claim_finds_it_done": Path(_found(state=JobState.SUCCEEDED, token=7)),
    "claim_finds_it_cancelled": Path(
        _found(state=JobState.FAILED, error_code=CANCELLED_CODE, token=7)
    ),
    "claim_finds_it_parked": Path(_found(state=JobState.PARKED, token=7)),
    "claim_finds_a_stray": Path(_found(state=JobState.QUEUED, owner=None, send_id="send-2")),
    "claim_finds_no_record": Path(condition_failed(None)),
    "claim_finds_another_class": Path(_found(state=JobState.QUEUED, job_class="other")),
    "claim_finds_attempts_spent": Path(_queued(item=job_item(attempt=3, state="queued"))),
    "claim_refused_as_invalid": Path(err(ErrorKind.VALIDATION, "ValidationException")),
    "unknown_class_at_its_bound": Path(_queued(), item=delivery(receive_count=5), setup=_unknown),
}


def _play(
    path: Path, delete: Outcome, *, deletes: DeleteBatch | None = None
) -> tuple[AttemptEnd, AWS, Shell]:
    shell = Shell(path.handler)
    if path.rules is not None:
        shell.rules = path.rules
    if path.setup is not None:
        path.setup(shell)
    shell.env.deletes = deletes
    aws = AWS(path.claim, delete, slots_read=path.slots_read)
    end = Script(aws).run(attempt_flow(shell.env, path.item or delivery()))
    return end, aws, shell


@pytest.mark.parametrize("taken", [True, False], ids=["sqs_took_it", "sqs_refused_it"])
@pytest.mark.parametrize("name", sorted(DELETING))
def test_an_attempt_that_deletes_its_message_says_whether_sqs_took_the_delete(
    name: str, taken: bool
) -> None:
    path = DELETING[name]
    end, aws, _ = _play(path, ok() if taken else REFUSED)
    assert aws.deletes() == 1, "the path deletes its message once"
    assert end.deleted is taken
    assert end.deleted is aws.sniffed("rh-1")  # what reading the calls made told
    if path.fin is None:
        assert end.fin is None
    else:
        assert end.fin is not None and end.fin.outcome is path.fin
        assert end.fin.deleted is taken


KEEPING: dict[str, Path] = {
    "retry": Path(_queued(), _raising(TransientError("flaky", code="flaky"))),
    "abandon_after_a_cancel": Path(_queued(), _raising(JobCancelled("cancelled"))),
    "claim_unanswered": Path(err(ErrorKind.UNREACHABLE, "timeout")),
    "unknown_class_deferred": Path(_queued(), setup=_unknown),
    "commit_rejected": Path(_queued(), fin=FinishOutcome.REJECTED),
}


@pytest.mark.parametrize("name", sorted(KEEPING))
def test_an_attempt_that_keeps_its_message_never_says_it_deleted_it(name: str) -> None:
    path = KEEPING[name]
    moved = condition_failed(job_item(token=9, owner="w-2"))  # the token moved on
    shell = Shell(path.handler)
    if path.setup is not None:
        path.setup(shell)
    aws = AWS(path.claim, ok(), writes=moved if name == "commit_rejected" else None)
    end = Script(aws).run(attempt_flow(shell.env, delivery()))
    assert aws.deletes() == 0
    assert end.deleted is False and not aws.sniffed("rh-1")
    if path.fin is not None:
        assert end.fin is not None and end.fin.outcome is path.fin


def test_a_delete_left_to_the_workers_batch_is_not_yet_a_deleted_message() -> None:
    # A worker batches its deletes (``DeleteBatch``): the attempt queues the handle and
    # has deleted nothing when it ends; only a shell that deletes at once (Lambda's)
    # learns a deleted message from its attempt.
    end, aws, _ = _play(DELETING["commit"], ok(), deletes=DeleteBatch(window=60.0))
    assert aws.deletes() == 0
    assert end.fin is not None and end.fin.delete_pending and not end.deleted


# --------------------------------------------------------------------------- Lambda


def _record(queue_arn: str = "arn:aws:sqs:us-east-1:1:work") -> dict[str, Any]:
    return {
        "messageId": "m-job-1",
        "receiptHandle": "rh-1",
        "body": json.dumps({"v": 1, "job_id": "job-1", "job_class": "ocr", "send_id": "send-1"}),
        "attributes": {"ApproximateReceiveCount": "1", "MessageGroupId": "g-1"}
        if queue_arn.endswith(".fifo")
        else {"ApproximateReceiveCount": "1"},
        "eventSourceARN": queue_arn,
    }


@pytest.mark.parametrize("fifo", [False, True], ids=["standard", "fifo"])
@pytest.mark.parametrize("taken", [True, False], ids=["sqs_took_it", "sqs_refused_it"])
def test_a_lambda_record_is_done_exactly_when_its_attempt_deleted_its_message(
    fifo: bool, taken: bool
) -> None:
    shell = Shell()
    shell.env.queue_url = FIFO if fifo else QUEUE
    aws = AWS(_queued(), ok() if taken else REFUSED)
    groups = GroupStop()
    arn = "arn:aws:sqs:us-east-1:1:work" + (".fifo" if fifo else "")
    end = Script(aws).run(record_flow(shell.env, _record(arn), groups, lambda: 4_000_000))
    assert end is not None and end.done is taken and end.unstarted is None
    assert aws.log[0][0].op == "ChangeMessageVisibility"  # the take
    # A FIFO record that did not finish stops its group's later records.
    assert groups.blocked("g-1") is (fifo and not taken)


def test_a_lambda_record_whose_stage_is_handed_on_is_done_on_a_fifo_queue_too() -> None:
    # The stage's message is deleted at once on a FIFO queue (it holds the group): the
    # hand-off's own delete is the record's success.
    shell = Shell(lambda run: NextStage("render", {"page": 2}))
    _staged(shell)
    shell.env.queue_url = FIFO
    aws = AWS(_queued(), ok())
    end = Script(aws).run(
        record_flow(
            shell.env, _record("arn:aws:sqs:us-east-1:1:work.fifo"), GroupStop(), lambda: 4_000_000
        )
    )
    assert end is not None and end.done
    assert aws.log[-1][0].op == "DeleteMessage"
