"""Table schema (pynamodb models) and the DynamoDB requests the core sends.

The models are the one definition of each table. Their condition and update
expressions are serialised here into low-level request parameters, so every
driver (sync, async, simulation) sends the same requests. Table names are
chosen at run time (settings), so the models' ``Meta.table_name`` is only a default.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pynamodb.attributes import (
    BooleanAttribute,
    ListAttribute,
    NumberAttribute,
    UnicodeAttribute,
)
from pynamodb.expressions.condition import Condition
from pynamodb.expressions.update import Action, Update
from pynamodb.indexes import GlobalSecondaryIndex, IncludeProjection, KeysOnlyProjection
from pynamodb.models import Model

from ._core.calls import Call
from ._core.intents import EffectSpec, IntentState, IntentView, success_meaning
from ._core.limits import REJECTED_CONTENT_LIMIT
from ._core.liveness import LIVENESS_KEEP_SECONDS, Liveness, held_json, liveness_key
from ._core.records import (
    CANCELLED_CODE,
    DEAD_LETTERED_CODE,
    UNDELIVERED_CODE,
    GroupView,
    JobRequests,
    JobState,
    JobView,
)
from ._core.resolving import Resolution, successor_key
from ._core.retention import first_start_stamp, first_started_by
from ._core.slots import SlotView
from ._core.timeline import TimelineKind as TK
from ._core.timeline import event
from ._errors import RecordUnreadable

GC_TTL = "gc_expires_at"  # = deploy.GC_TTL_ATTRIBUTE (deploy imports this module)
UNSENT_INDEX = "unsent"
UNSENT_BUCKET = "unsent"


class UnsentIndex(GlobalSecondaryIndex["JobRecord"]):  # type: ignore[no-untyped-call]
    """Sparse index of records whose current message is not known to be sent.

    Only such records carry ``unsent``/``unsent_since``, so the index holds just
    them (a stranded-record sweep queries it, oldest first, and never scans the
    table). One hash value: the index is small by construction.
    """

    class Meta:
        index_name = UNSENT_INDEX
        projection = IncludeProjection(["job_class", "state", "send_id", "message_sent"])

    unsent = UnicodeAttribute(hash_key=True)
    unsent_since = NumberAttribute(range_key=True)


GROUP_INDEX = "group"


class GroupIndex(GlobalSecondaryIndex["JobRecord"]):  # type: ignore[no-untyped-call]
    """Sparse index of the jobs of a group (an agent session), oldest first.

    Only jobs submitted with a group carry ``group_id``, so a group cancel finds
    its jobs by one Query per page, never a scan. DynamoDB's index is eventually
    consistent: the group's marker counts its jobs, so a cancel knows how many the
    index must show (:func:`sqs_lease._core.groups.cancel_group_flow`).
    """

    class Meta:
        index_name = GROUP_INDEX
        projection = IncludeProjection(["job_class", "state", "error_code"])

    group_id = UnicodeAttribute(hash_key=True)
    created_at = NumberAttribute(range_key=True)


JOB_LIST_FIELDS = (
    "job_id",
    "job_class",
    "state",
    "owner",
    "token",
    "attempt",
    "payload_hash",
    "reason",
    "error_code",
    "stage",
    "created_at",
    "updated_at",
    "finished_at",
    "lease_deadline",
)
"""What ``jobs list`` shows of a record (heartbeat age is the owner's liveness record's:
``jobs show``). The ``attention`` index projects exactly
these, so a listing from the index shows what one from the table shows."""

INTENT_LIST_FIELDS = (
    "intent_key",
    "job_id",
    "stage",
    "action",
    "target",
    "state",
    "attempts",
    "last_token",
    "external_id",
    "reason",
    "resolution",
    "created_at",
    "updated_at",
)
"""What ``intents list`` shows of an intent (never its payload or response); the
``ambiguous`` index projects exactly these."""


def _non_keys(fields: tuple[str, ...], *keys: str) -> list[str]:
    # DynamoDB always projects the table's and the index's keys, and refuses them in
    # NonKeyAttributes.
    return [f for f in fields if f not in keys]


ATTENTION_INDEX = "attention"
WORKERS_INDEX = "workers"
ATTENTION_STATES = (JobState.PARKED.value, JobState.FAILED.value)
"""Job states an operator lists (``jobs list --state``) from the sparse ``attention``
index: only records in them carry ``attention``."""


class AttentionIndex(GlobalSecondaryIndex["JobRecord"]):  # type: ignore[no-untyped-call]
    """Sparse index of the jobs that need a person: parked and failed, newest first.

    Only a write that parks or fails a job sets ``attention`` (to the state); a
    resume removes it. A job that succeeds never enters it, so the index costs
    no write on the common path, and ``jobs list --state parked`` is one Query per
    page however many records the table holds.
    """

    class Meta:
        index_name = ATTENTION_INDEX
        projection = IncludeProjection(_non_keys(JOB_LIST_FIELDS, "job_id", "updated_at"))

    attention = UnicodeAttribute(hash_key=True)
    updated_at = NumberAttribute(range_key=True)


class WorkersIndex(GlobalSecondaryIndex["JobRecord"]):  # type: ignore[no-untyped-call]
    """Sparse, keys-only index of the workers' liveness records (``kind = liveness``).

    ``jobs list --state running`` finds the running jobs through it: every live
    worker's liveness record lists the jobs it holds. Keys only and a key that
    never changes, so a worker's rewrite of its record each round writes nothing
    to the index.
    """

    class Meta:
        index_name = WORKERS_INDEX
        projection = KeysOnlyProjection()

    kind = UnicodeAttribute(hash_key=True)


class JobRecord(Model):
    """One job: its ownership order (token), state, payload and result."""

    class Meta:
        table_name = "sqs-lease-jobs"

    job_id = UnicodeAttribute(hash_key=True)
    job_class = UnicodeAttribute()
    state = UnicodeAttribute()
    owner = UnicodeAttribute(null=True)
    token = NumberAttribute(default=0)
    attempt = NumberAttribute(default=0)
    payload = UnicodeAttribute()  # JSON text, immutable after submit
    payload_hash = UnicodeAttribute()
    message_sent = BooleanAttribute(default=False)
    # The job's current message: written conditionally by the one sender that won
    # the right to send, carried in the message body, checked by the claim.
    send_id = UnicodeAttribute(null=True)
    # Present only while the current message is not known to be sent (sparse index).
    unsent = UnicodeAttribute(null=True)
    unsent_since = NumberAttribute(null=True)
    # Attempts an operator granted beyond the class's max_attempts (resume, resolve).
    granted_attempts = NumberAttribute(null=True)
    # The attempt count at an operator's last resume: the attempt it starts is allowed.
    resumed_at_attempt = NumberAttribute(null=True)
    stage = UnicodeAttribute(null=True)  # a staged job's current stage
    stage_input = UnicodeAttribute(null=True)  # JSON: the current stage's input (NextStage)
    stages = UnicodeAttribute(null=True)  # JSON list: checkpoints of the committed stages
    result = UnicodeAttribute(null=True)  # JSON text
    reason = UnicodeAttribute(null=True)
    error_code = UnicodeAttribute(null=True)
    created_at = NumberAttribute()
    updated_at = NumberAttribute()
    finished_at = NumberAttribute(null=True)
    # Advisory only (for people and metrics); no decision reads them.
    lease_deadline = NumberAttribute(null=True)
    last_heartbeat = NumberAttribute(null=True)
    # The last result whose commit was rejected (a fenced-out attempt's), for people:
    # its hash and size always, its content only where the class opts in (bounded).
    rejected_count = NumberAttribute(null=True)
    rejected_token = NumberAttribute(null=True)
    rejected_by = UnicodeAttribute(null=True)
    rejected_at = NumberAttribute(null=True)
    rejected_hash = UnicodeAttribute(null=True)
    rejected_size = NumberAttribute(null=True)
    rejected_result = UnicodeAttribute(null=True)
    # The agent session (or run) the producer submitted it in; never from a payload.
    group_id = UnicodeAttribute(null=True)
    # Ownership events (compact JSON each, _core/timeline.py), appended by the write
    # that makes the change; bounded (TIMELINE_LIMIT). For people; no decision reads it.
    timeline = ListAttribute(of=UnicodeAttribute, null=True)
    # The last progress details a handler reported (JSON, PROGRESS_LIMIT), the token
    # that saved them and when: a resume hint for the next owner, fenced like a commit.
    progress = UnicodeAttribute(null=True)
    progress_token = NumberAttribute(null=True)
    progress_at = NumberAttribute(null=True)
    # Late hand-backs of the current stage (the worker's own heartbeat let the lease
    # run out): from timing.LATE_HANDBACK_LIMIT on, a late hand-back is charged.
    late_handbacks = NumberAttribute(null=True)
    # Whose job it is (a user, an account), set by the producer: its own slot pool.
    tenant = UnicodeAttribute(null=True)
    # "interactive" for a job submitted to the interactive queue (absent: batch): a
    # re-send (sweep, resume, retry) goes back to the queue the job was submitted to
    priority = UnicodeAttribute(null=True)

    # The end write that last took the record out of running: ``<nonce>:<what>``, the
    # nonce the attempt's own (its shell draws it; it is on no record before the end
    # write), set in the same fenced update. A retried end write whose first try's
    # answer was lost recognises its own write by it, never by state, token and owner,
    # which anyone able to write the record could copy.
    write_id = UnicodeAttribute(null=True)

    # Present (= the state) only while the job is parked or failed (sparse index).
    attention = UnicodeAttribute(null=True)
    # "liveness" on a worker's liveness record (_core/liveness.py); absent on jobs.
    kind = UnicodeAttribute(null=True)

    unsent_index = UnsentIndex()
    group_index = GroupIndex()
    attention_index = AttentionIndex()
    workers_index = WorkersIndex()


class GroupRecord(Model):
    """One group (agent session): how many job records it holds, and its cancel.

    Every submit to the group counts itself here in the same transaction that
    writes its job record, conditioned on the group not being cancelled; a cancel
    sets ``cancelled_at``. DynamoDB orders the two: a submit lands before the
    cancel (and is counted, so the cancel waits to see it in the index) or is
    refused.
    """

    class Meta:
        table_name = "sqs-lease-groups"

    group_id = UnicodeAttribute(hash_key=True)
    jobs = NumberAttribute(default=0)
    created_at = NumberAttribute(null=True)
    updated_at = NumberAttribute(null=True)
    cancelled_at = NumberAttribute(null=True)
    reason = UnicodeAttribute(null=True)


class SlotRecord(Model):
    """One slot of a fleet-wide concurrency limit (a job class's, or a tenant's).

    ``slot`` is ``POOL#i`` (``class:NAME#0``, ``tenant:ID#3``). A slot is a lease
    with a token: ``version`` rises at every take and give-back (a take is
    conditioned on the version it read), and the holder is a job and that job's
    fencing token; it is held while that job's record is running under that token
    (``sqs_lease._core.slots``). Never TTL-deleted: a removed record is a free slot.
    """

    class Meta:
        table_name = "sqs-lease-slots"

    slot = UnicodeAttribute(hash_key=True)
    version = NumberAttribute(default=0)
    job_id = UnicodeAttribute(null=True)
    token = NumberAttribute(null=True)
    owner = UnicodeAttribute(null=True)
    taken_at = NumberAttribute(null=True)
    updated_at = NumberAttribute(null=True)


def _params(
    condition: Condition | None = None, update: Sequence[Action] | None = None
) -> dict[str, Any]:
    """Serialise pynamodb expressions into UpdateItem/PutItem parameters."""
    names: dict[str, str] = {}
    values: dict[str, Any] = {}
    out: dict[str, Any] = {}
    if update:
        out["UpdateExpression"] = Update(*update).serialize(names, values)
    if condition is not None:
        out["ConditionExpression"] = condition.serialize(names, values)
    if names:
        out["ExpressionAttributeNames"] = {v: k for k, v in names.items()}
    if values:
        out["ExpressionAttributeValues"] = values
    return out


def _clip(text: str, limit: int) -> str:
    data = text.encode("utf-8")
    if len(data) <= limit:
        return text
    return data[:limit].decode("utf-8", "ignore")


def _key(job_id: str) -> dict[str, Any]:
    return {"job_id": {"S": job_id}}


R = JobRecord
_RUNNING = JobState.RUNNING.value


def _log(text: str) -> Action:
    # Appended in the write that makes the change, so the timeline costs no request.
    # if_not_exists: records written before the timeline existed start one here.
    return R.timeline.set((R.timeline | []).append([text]))


def _mine(token: int, worker_id: str) -> Condition:
    # The fence: a write for an attempt lands only while that attempt's token is
    # current and the job is running. The token alone decides; the owner is not
    # part of it, because one worker id can hold two claims of one job (a
    # duplicate delivery to two of its threads) and only the token tells them apart.
    del worker_id
    cond: Condition = (R.token == token) & (R.state == _RUNNING)
    return cond


# The unsent index's one rule (``records.awaits_send``): a record is in it exactly
# while it is queued and its current message is not known sent. A write that gives
# the record a new unsent message puts it in (``_awaits_send``; the new record of
# ``put_new`` is written so too); a write that sends, claims, parks or ends a
# record that may be waiting takes it out (``_SENT``, ``_NOT_WAITING``). A running
# record is never in it (its claim took it out), so an owner's fenced writes need
# neither. A cancel or a park that left a record in it (issue 26) hid every
# stranded job behind it from the sweep.
_NOT_WAITING: list[Action] = [R.unsent.remove(), R.unsent_since.remove()]
_SENT: list[Action] = [R.message_sent.set(True), *_NOT_WAITING]


def _awaits_send(wall_now: float) -> list[Action]:
    return [
        R.message_sent.set(False),
        R.unsent.set(UNSENT_BUCKET),
        R.unsent_since.set(wall_now),
    ]


# A progress hint (``ctx.progress``) is the resume hint of the stage that saved it:
# the write that moves a record to its next stage clears it with its checkpoint, so
# the next stage's claim (whose ALL_OLD ``ctx.last_progress`` is read from) finds
# none (issue 26 defect 5: a hint "all done" made the next stage skip its work).
# Every other write keeps it: a takeover, a retry, a release or a resend of the
# same stage resumes from it. A stale owner of the stage before cannot write it
# again: ``save_progress`` is fenced on its token.
_NEW_STAGE: list[Action] = [
    R.progress.remove(),
    R.progress_token.remove(),
    R.progress_at.remove(),
    R.late_handbacks.remove(),
]


def _waiting() -> Condition:
    cond: Condition = (R.state == JobState.QUEUED.value) & (R.message_sent == False)  # noqa: E712
    return cond


def _unpark(send_id: str, wall_now: float) -> tuple[Condition, list[Action]]:
    # An operator's decision grants the attempt it starts (granted_attempts + 1), so
    # a job parked on its last attempt runs again instead of failing at its claim.
    # The new send id makes the resume's message the job's one current message.
    return (
        R.state == JobState.PARKED.value,
        [
            R.state.set(JobState.QUEUED.value),
            R.attention.remove(),
            R.reason.set("resumed after an operator's decision"),
            R.error_code.remove(),
            R.granted_attempts.add(1),
            R.resumed_at_attempt.set(R.attempt | 0),
            R.send_id.set(send_id),
            *_awaits_send(wall_now),
            R.updated_at.set(wall_now),
        ],
    )


@dataclass(frozen=True)
class JobTable:
    """Implements the core's ``JobRequests`` for one job table."""

    table: str

    def _update(
        self,
        job_id: str,
        condition: Condition,
        actions: Sequence[Action],
        returns: str = "NONE",
    ) -> Call:
        params: dict[str, Any] = {
            "TableName": self.table,
            "Key": _key(job_id),
            "ReturnValues": returns,
            "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
        }
        params.update(_params(condition, actions))
        return Call("dynamodb", "UpdateItem", params)

    def put_new(
        self,
        *,
        job_id: str,
        job_class: str,
        payload_json: str,
        payload_hash: str,
        wall_now: float,
        send_id: str,
        stage: str | None = None,
        tenant: str | None = None,
        priority: str | None = None,
    ) -> Call:
        params = self._put_new_params(
            job_id,
            job_class,
            payload_json,
            payload_hash,
            wall_now,
            send_id,
            stage,
            None,
            tenant,
            priority,
        )
        return Call("dynamodb", "PutItem", params)

    def put_new_item(
        self,
        *,
        job_id: str,
        job_class: str,
        payload_json: str,
        payload_hash: str,
        wall_now: float,
        send_id: str,
        group: str,
        stage: str | None = None,
        tenant: str | None = None,
        priority: str | None = None,
    ) -> dict[str, Any]:
        """The same new record, in a group, as a TransactWriteItems entry."""
        params = self._put_new_params(
            job_id,
            job_class,
            payload_json,
            payload_hash,
            wall_now,
            send_id,
            stage,
            group,
            tenant,
            priority,
        )
        return {"Put": params}

    def _put_new_params(
        self,
        job_id: str,
        job_class: str,
        payload_json: str,
        payload_hash: str,
        wall_now: float,
        send_id: str,
        stage: str | None,
        group: str | None,
        tenant: str | None = None,
        priority: str | None = None,
    ) -> dict[str, Any]:
        record = JobRecord(
            job_id=job_id,
            job_class=job_class,
            state=JobState.QUEUED.value,
            token=0,
            attempt=0,
            payload=payload_json,
            payload_hash=payload_hash,
            message_sent=False,
            send_id=send_id,
            unsent=UNSENT_BUCKET,
            unsent_since=wall_now,
            stage=stage,
            created_at=wall_now,
            updated_at=wall_now,
            group_id=group,
            timeline=[event(TK.SUBMITTED, wall_now)],
            tenant=tenant,
            priority=priority if priority != "batch" else None,
        )
        params: dict[str, Any] = {
            "TableName": self.table,
            "Item": record.serialize(),
            "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
        }
        params.update(_params(R.job_id.does_not_exist()))
        return params

    def group_query(self, group: str, start: Mapping[str, Any] | None) -> Call:
        """One page of the group's jobs from the ``group`` index, oldest first."""
        params: dict[str, Any] = {
            "TableName": self.table,
            "IndexName": GROUP_INDEX,
            "KeyConditionExpression": "#g = :g",
            "ExpressionAttributeNames": {"#g": "group_id"},
            "ExpressionAttributeValues": {":g": {"S": group}},
            "ScanIndexForward": True,
        }
        if start:
            params["ExclusiveStartKey"] = dict(start)
        return Call("dynamodb", "Query", params)

    def mark_sent(self, job_id: str, send_id: str, wall_now: float) -> Call:
        # Only the sender of the current message may say it is out: a sender whose
        # right was taken over meanwhile fails here and learns so from ALL_OLD.
        return self._update(job_id, R.send_id == send_id, _SENT)

    def take_send(
        self,
        job_id: str,
        *,
        seen_send_id: str | None,
        new_send_id: str,
        wall_now: float,
        read_back: bool = True,
        retire: bool = False,
    ) -> Call:
        # One decision among every would-be sender (resubmits, resume, sweep, repair):
        # the record is queued without a sent message and its send id is still the
        # one the sender saw. The new id retires every older message of the job.
        # ``retire``: the seen message was received and not started (sent or not, as
        # the record knows it): queued under that send id is the whole condition.
        seen: Condition = (
            R.send_id.does_not_exist() if seen_send_id is None else R.send_id == seen_send_id
        )
        state: Condition = R.state == JobState.QUEUED.value if retire else _waiting()
        return self._update(
            job_id,
            state & seen,
            [R.send_id.set(new_send_id), *_awaits_send(wall_now), R.updated_at.set(wall_now)],
            returns="ALL_NEW" if read_back else "NONE",
        )

    def leave_unsent(self, job_id: str, wall_now: float) -> Call:
        # Only an entry whose record no longer waits for its message (written so by
        # an older version): the condition reads the record itself, never the
        # index's eventually consistent copy of it.
        del wall_now  # the record's own history is untouched: nothing happened to it
        cond: Condition = R.unsent.exists() & ~_waiting()
        return self._update(job_id, cond, _NOT_WAITING)

    def release_send(self, job_id: str, send_id: str, wall_now: float) -> Call:
        # A send that certainly or possibly failed gives its right back at once, so
        # the next resume or resubmit need not wait for the grace period. A message
        # of the released id that did get out is then a stray (send_id differs).
        cond: Condition = (R.send_id == send_id) & (R.message_sent == False)  # noqa: E712
        return self._update(job_id, cond, [R.send_id.remove(), R.updated_at.set(wall_now)])

    def claim(
        self,
        job_id: str,
        worker_id: str,
        wall_now: float,
        lease_seconds: int,
        *,
        job_class: str,
        send_id: str | None,
        take_from: int | None = None,
    ) -> Call:
        # Only a queued record, or one running under the token its claimer judged
        # dead (``take_from``, ``_core/duplicates.py``): a claim never takes a job
        # from an owner it has not first watched for a heartbeat.
        #
        # The class is the record's and the message must be the job's current one:
        # both are part of the claim's own condition, so a stray duplicate or a
        # message naming another class claims nothing (ALL_OLD says which). A
        # message without a send id (an older producer) claims only a record no
        # current sender ever touched. The class equality also fails on a missing
        # item (a comparison with an absent attribute is false), so the claim never
        # creates a record and needs no attribute_exists(job_id) of its own.
        #
        # Kept to what the protocol and people need: the emulator's cost of a write
        # grows with its expression (moto re-parses and re-validates it per request;
        # BENCHMARKS.md, benchmark 2). ADD increments like SET x = x + 1 on the
        # record's numbers (put_new writes both 0) in a smaller expression. No
        # last_heartbeat: it would equal updated_at, and heartbeat age comes from the
        # worker's liveness record.
        current: Condition = (
            (R.send_id.does_not_exist() & R.unsent.does_not_exist())
            if send_id is None
            else R.send_id == send_id
        )
        claimable: Condition = (
            R.state == JobState.QUEUED.value
            if take_from is None
            else (R.state == JobState.QUEUED.value)
            | ((R.state == _RUNNING) & (R.token == take_from))
        )
        return self._update(
            job_id,
            claimable & (R.job_class == job_class) & current,
            [
                R.state.set(_RUNNING),
                R.owner.set(worker_id),
                R.token.add(1),
                R.attempt.add(1),
                R.updated_at.set(wall_now),
                R.lease_deadline.set(wall_now + lease_seconds),
                # A delivered message was sent, whatever its sender got to record.
                *_SENT,
                # DynamoDB computes the new token here: the event cannot hold it
                # (timeline.with_tokens numbers it from the record's token).
                _log(event(TK.CLAIMED, wall_now, owner=worker_id)),
            ],
            returns="ALL_OLD",
        )

    def unsent_query(
        self, *, older_than: float, limit: int, start: Mapping[str, Any] | None = None
    ) -> Call:
        """Records without a sent message since ``older_than`` (wall), oldest first;
        ``start``: the page after the one that returned it (``LastEvaluatedKey``)."""
        params: dict[str, Any] = {
            "TableName": self.table,
            "IndexName": UNSENT_INDEX,
            "KeyConditionExpression": "#u = :u AND #t <= :t",
            "ExpressionAttributeNames": {"#u": "unsent", "#t": "unsent_since"},
            "ExpressionAttributeValues": {
                ":u": {"S": UNSENT_BUCKET},
                ":t": {"N": repr(float(older_than))},
            },
            "ScanIndexForward": True,
            "Limit": limit,
        }
        if start:
            params["ExclusiveStartKey"] = dict(start)
        return Call("dynamodb", "Query", params)

    def commit(
        self,
        job_id: str,
        token: int,
        worker_id: str,
        result_json: str,
        wall_now: float,
        *,
        write_id: str,
    ) -> Call:
        return self._update(
            job_id,
            _mine(token, worker_id),
            [
                R.state.set(JobState.SUCCEEDED.value),
                R.write_id.set(write_id),
                R.result.set(result_json),
                R.updated_at.set(wall_now),
                R.finished_at.set(wall_now),
                R.lease_deadline.remove(),
                R.reason.remove(),
                R.error_code.remove(),
                _log(event(TK.COMMITTED, wall_now, owner=worker_id, token=token)),
            ],
        )

    def advance_stage(
        self,
        job_id: str,
        token: int,
        worker_id: str,
        *,
        stage: str,
        next_stage: str,
        stage_input: str,
        stage_log: str,
        send_id: str,
        wall_now: float,
        write_id: str,
    ) -> Call:
        # Fenced like a commit. The stage log is written whole: only the holder of
        # the current token writes it, and it read the log with its claim (ALL_OLD).
        # The owner stays (the worker that ended the stage), for people; a retried
        # write whose first try applied is recognised as its own by ``write_id``.
        return self._update(
            job_id,
            _mine(token, worker_id),
            [
                R.state.set(JobState.QUEUED.value),
                R.write_id.set(write_id),
                R.stage.set(next_stage),
                R.stage_input.set(stage_input),
                R.stages.set(stage_log),
                *_NEW_STAGE,
                R.attempt.set(0),
                R.granted_attempts.remove(),
                R.resumed_at_attempt.remove(),
                R.send_id.set(send_id),
                *_awaits_send(wall_now),
                R.updated_at.set(wall_now),
                R.lease_deadline.remove(),
                R.reason.remove(),
                R.error_code.remove(),
                _log(
                    event(
                        TK.STAGE_DONE,
                        wall_now,
                        owner=worker_id,
                        token=token,
                        stage=stage,
                        detail=f"next: {next_stage}",
                    )
                ),
            ],
        )

    def finish_failed(
        self,
        job_id: str,
        token: int,
        worker_id: str,
        reason: str,
        error_code: str,
        wall_now: float,
        *,
        write_id: str,
    ) -> Call:
        return self._update(
            job_id,
            _mine(token, worker_id),
            [
                R.state.set(JobState.FAILED.value),
                R.write_id.set(write_id),
                R.attention.set(JobState.FAILED.value),
                R.reason.set(reason),
                R.error_code.set(error_code),
                R.updated_at.set(wall_now),
                R.finished_at.set(wall_now),
                R.lease_deadline.remove(),
                _log(event(TK.FAILED, wall_now, owner=worker_id, token=token, detail=error_code)),
            ],
        )

    def requeue(
        self,
        job_id: str,
        token: int,
        worker_id: str,
        reason: str,
        error_code: str,
        wall_now: float,
        *,
        write_id: str,
    ) -> Call:
        # The owner stays recorded, for people; a retried requeue recognises its own
        # write by ``write_id``.
        return self._update(
            job_id,
            _mine(token, worker_id),
            [
                R.state.set(JobState.QUEUED.value),
                R.write_id.set(write_id),
                R.reason.set(reason),
                R.error_code.set(error_code),
                R.updated_at.set(wall_now),
                R.lease_deadline.remove(),
                _log(event(TK.RETRY, wall_now, owner=worker_id, token=token, detail=error_code)),
            ],
        )

    def release(
        self,
        job_id: str,
        token: int,
        worker_id: str,
        reason: str,
        wall_now: float,
        *,
        write_id: str,
        resend_id: str | None = None,
        late: bool = False,
        charged: bool = False,
    ) -> Call:
        # The worker, not the job, stopped this attempt (shutdown, a wait for a slot):
        # back to queued and the attempt the claim counted is given back. ``late``: a
        # late hand-back, counted on the record; ``charged``: the attempt is kept
        # (timing.late_charged decided the job, not the worker, is the likely cause). With a
        # resend id (a slot wait, ``_core/slots.py`` rule 4) the received message is
        # retired in the same write, as a stage's checkpoint retires its message: the
        # record names the fresh message's send id and is unsent (the sweep's to
        # send, should its sender die) until that message is out.
        actions: list[Action] = [
            R.state.set(JobState.QUEUED.value),
            R.write_id.set(write_id),
            *([] if charged else [R.attempt.set(R.attempt - 1)]),
            *([R.late_handbacks.add(1)] if late else []),
            R.reason.set(reason),
            R.error_code.set("released"),
            R.updated_at.set(wall_now),
            R.lease_deadline.remove(),
            _log(event(TK.RELEASED, wall_now, owner=worker_id, token=token, detail=reason)),
        ]
        if resend_id is not None:
            actions += [R.send_id.set(resend_id), *_awaits_send(wall_now)]
        return self._update(job_id, _mine(token, worker_id), actions)

    def resend(
        self,
        job_id: str,
        token: int,
        worker_id: str,
        *,
        send_id: str,
        reason: str,
        wall_now: float,
        write_id: str,
    ) -> Call:
        # A release that also retires the message: the old one reached SQS's cap, so
        # the job's next attempt needs a message of its own (a stray, should the old
        # one come back). The owner stays so a retried write recognises its own.
        return self._update(
            job_id,
            _mine(token, worker_id),
            [
                R.state.set(JobState.QUEUED.value),
                R.write_id.set(write_id),
                R.attempt.set(R.attempt - 1),
                R.reason.set(reason),
                R.error_code.set("message_cap"),
                R.send_id.set(send_id),
                *_awaits_send(wall_now),
                R.updated_at.set(wall_now),
                R.lease_deadline.remove(),
                _log(event(TK.RELEASED, wall_now, owner=worker_id, token=token, detail=reason)),
            ],
        )

    def park(
        self,
        job_id: str,
        token: int,
        worker_id: str,
        reason: str,
        wall_now: float,
        *,
        write_id: str,
    ) -> Call:
        return self._update(
            job_id,
            _mine(token, worker_id),
            [
                R.state.set(JobState.PARKED.value),
                R.write_id.set(write_id),
                R.attention.set(JobState.PARKED.value),
                R.reason.set(reason),
                R.error_code.set("parked"),
                R.updated_at.set(wall_now),
                R.lease_deadline.remove(),
                _log(event(TK.PARKED, wall_now, owner=worker_id, token=token, detail=reason)),
            ],
        )

    def keep_rejected(
        self,
        job_id: str,
        token: int,
        worker_id: str,
        result_json: str,
        wall_now: float,
        *,
        keep_content: bool,
    ) -> Call:
        # Not fenced on purpose: it records a fact about a stale attempt and touches
        # nothing the protocol reads (state, token, owner, result stay as they are).
        data = result_json.encode("utf-8")
        actions: list[Action] = [
            R.rejected_count.add(1),
            R.rejected_token.set(token),
            R.rejected_by.set(worker_id),
            R.rejected_at.set(wall_now),
            R.rejected_hash.set(hashlib.sha256(data).hexdigest()),
            R.rejected_size.set(len(data)),
            # The refused commit could not append (its condition failed): this write,
            # sent after the refusal anyway, carries its event.
            _log(event(TK.REFUSED, wall_now, owner=worker_id, token=token, stage="commit")),
        ]
        if keep_content:
            actions.append(R.rejected_result.set(_clip(result_json, REJECTED_CONTENT_LIMIT)))
        else:
            actions.append(R.rejected_result.remove())
        return self._update(job_id, R.job_id.exists(), actions)

    def park_undelivered(
        self,
        job_id: str,
        *,
        job_class: str,
        send_id: str | None,
        reason: str,
        wall_now: float,
    ) -> Call:
        # Not an owner's write: a worker that cannot run the class parks the job
        # whose current message it is about to move to the DLQ. Only that message
        # (its send id) and the record's own class may do it, and only while the
        # job is queued or running: the move ends whatever lease the message
        # carried, and the park says so instead of leaving `running` behind. The
        # token moves on (as a cancel's does), so a lapsed owner that comes back
        # reads "lost", never "finished by my own write".
        return self._park_unheld(
            job_id,
            job_class=job_class,
            send_id=send_id,
            reason=reason,
            wall_now=wall_now,
            error_code=UNDELIVERED_CODE,
            kind=TK.UNDELIVERABLE,
            sent=_NOT_WAITING,
        )

    def park_dead_lettered(
        self,
        job_id: str,
        *,
        job_class: str,
        send_id: str | None,
        reason: str,
        wall_now: float,
    ) -> Call:
        # The same park for a message SQS moved to the DLQ itself (its receives ran
        # out): a DLQ reconciliation found it there. That message was sent, so the
        # record leaves the unsent index too.
        return self._park_unheld(
            job_id,
            job_class=job_class,
            send_id=send_id,
            reason=reason,
            wall_now=wall_now,
            error_code=DEAD_LETTERED_CODE,
            kind=TK.DEAD_LETTERED,
            sent=_SENT,
        )

    def _park_unheld(
        self,
        job_id: str,
        *,
        job_class: str,
        send_id: str | None,
        reason: str,
        wall_now: float,
        error_code: str,
        kind: TK,
        sent: list[Action],
    ) -> Call:
        current: Condition = (
            (R.send_id.does_not_exist() & R.unsent.does_not_exist())
            if send_id is None
            else R.send_id == send_id
        )
        return self._update(
            job_id,
            R.job_id.exists()
            & R.state.is_in(JobState.QUEUED.value, _RUNNING)
            & (R.job_class == job_class)
            & current,
            [
                R.state.set(JobState.PARKED.value),
                R.attention.set(JobState.PARKED.value),
                R.token.set(R.token + 1),
                R.reason.set(reason),
                R.error_code.set(error_code),
                R.updated_at.set(wall_now),
                R.lease_deadline.remove(),
                *sent,
                _log(event(kind, wall_now, detail=reason)),
            ],
            returns="ALL_OLD",
        )

    def save_progress(self, job_id: str, token: int, details_json: str, wall_now: float) -> Call:
        return self._update(
            job_id,
            _mine(token, ""),
            [
                R.progress.set(details_json),
                R.progress_token.set(token),
                R.progress_at.set(wall_now),
            ],
        )

    def trim_timeline(self, job_id: str, token: int, drop: int) -> Call:
        # The one write the timeline adds (once per TIMELINE_TRIM events): fenced,
        # so only the owner that read the length trims, and only once.
        return self._update(job_id, _mine(token, ""), [R.timeline[i].remove() for i in range(drop)])

    def liveness(self, part: Liveness) -> Call:
        # Advisory, never a fence: its only condition keeps it off a job record that
        # holds its key (job ids under ``worker#`` are refused at submit and read as
        # poison, but a record written past those rules must not be replaced). It has
        # no ``state``, so no job index holds it; GC_TTL is for the table's TTL.
        item = {
            "job_id": {"S": liveness_key(part.worker_id, part.part)},
            "kind": {"S": "liveness"},
            "owner": {"S": part.worker_id},
            "beat_at": {"N": repr(round(part.beat_at, 3))},
            "round_seconds": {"N": repr(round(part.round_seconds, 3))},
            "part": {"N": str(part.part)},
            "parts": {"N": str(part.parts)},
            "held": {"S": held_json(part.held)},
            "beats": {"N": str(part.beats)},
            # The tables' garbage-collection TTL attribute (deploy.GC_TTL_ATTRIBUTE).
            GC_TTL: {"N": str(int(part.beat_at + LIVENESS_KEEP_SECONDS))},
        }
        params = {"TableName": self.table, "Item": item}
        params.update(_params(R.job_id.does_not_exist() | (R.kind == "liveness")))
        return Call("dynamodb", "PutItem", params)

    def cancel(self, job_id: str, reason: str, wall_now: float) -> Call:
        # Moving the token on fences the current owner out at its next heartbeat.
        return self._update(
            job_id,
            R.job_id.exists() & R.state.is_in(JobState.QUEUED.value, _RUNNING, "parked"),
            [
                R.state.set(JobState.FAILED.value),
                R.attention.set(JobState.FAILED.value),
                R.token.set(R.token + 1),
                R.reason.set(f"cancelled: {reason}"),
                R.error_code.set(CANCELLED_CODE),
                R.updated_at.set(wall_now),
                R.finished_at.set(wall_now),
                R.lease_deadline.remove(),
                *_NOT_WAITING,
                _log(event(TK.CANCELLED, wall_now, detail=reason)),
            ],
            returns="ALL_NEW",
        )

    def unpark(self, job_id: str, send_id: str, wall_now: float) -> Call:
        condition, actions = _unpark(send_id, wall_now)
        actions.append(_log(event(TK.RESUMED, wall_now)))
        return self._update(job_id, condition, actions, returns="ALL_NEW")

    def retry_failed(
        self, job_id: str, token: int, send_id: str, wall_now: float, detail: str
    ) -> Call:
        # On the state and the token the operator read: two retries of one failure (two
        # operators, a command run twice) cannot both re-enqueue it.
        condition = (R.state == JobState.FAILED.value) & (R.token == token)
        actions: list[Action] = [
            R.state.set(JobState.QUEUED.value),
            R.reason.set("retried by an operator"),
            R.error_code.remove(),
            R.finished_at.remove(),
            R.attempt.set(0),
            R.granted_attempts.remove(),
            R.resumed_at_attempt.remove(),
            R.late_handbacks.remove(),
            R.send_id.set(send_id),
            *_awaits_send(wall_now),
            R.updated_at.set(wall_now),
            _log(event(TK.RESUMED, wall_now, token=token, detail=detail)),
        ]
        return self._update(job_id, condition, actions, returns="ALL_NEW")

    def unpark_item(self, job_id: str, send_id: str, wall_now: float) -> dict[str, Any]:
        """The same unpark as a TransactWriteItems entry (an operator's resolution)."""
        condition, actions = _unpark(send_id, wall_now)
        actions.append(_log(event(TK.RESOLVED, wall_now)))
        params: dict[str, Any] = {
            "TableName": self.table,
            "Key": _key(job_id),
            "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
        }
        params.update(_params(condition, actions))
        return {"Update": params}

    def fence_check(self, job_id: str, token: int) -> dict[str, Any]:
        """A TransactWriteItems entry: the job is running under exactly this token."""
        params: dict[str, Any] = {"TableName": self.table, "Key": _key(job_id)}
        cond: Condition = (R.token == token) & (R.state == _RUNNING)
        params.update(_params(cond))
        return {"ConditionCheck": params}

    def get(self, job_id: str) -> Call:
        return Call(
            "dynamodb",
            "GetItem",
            {"TableName": self.table, "Key": _key(job_id), "ConsistentRead": True},
        )

    def batch_get(self, job_ids: Sequence[str]) -> Call:
        return Call(
            "dynamodb",
            "BatchGetItem",
            {
                "RequestItems": {
                    self.table: {
                        "Keys": [_key(j) for j in job_ids],
                        "ConsistentRead": True,
                        "ProjectionExpression": "#i, #c, #s, #o, #t, #a, #h, #e, #r, #w",
                        "ExpressionAttributeNames": {
                            "#i": "job_id",
                            "#c": "job_class",
                            "#s": "state",
                            "#o": "owner",
                            "#t": "token",
                            "#a": "attempt",
                            "#h": "payload_hash",
                            "#e": "error_code",
                            "#r": "reason",
                            "#w": "write_id",
                        },
                    }
                }
            },
        )

    def batch_get_retry(self, unprocessed: Mapping[str, Any]) -> Call:
        return Call("dynamodb", "BatchGetItem", {"RequestItems": dict(unprocessed)})

    def batch_items(self, response: Mapping[str, Any]) -> list[Mapping[str, Any]]:
        return list((response.get("Responses") or {}).get(self.table, []))

    def parse(self, item: Mapping[str, Any]) -> JobView:
        return view_of(item)


G = GroupRecord


@dataclass(frozen=True)
class GroupTable:
    """Implements the core's ``GroupRequests`` for one group table."""

    table: str

    def count_job(self, group: str, wall_now: float) -> dict[str, Any]:
        params: dict[str, Any] = {
            "TableName": self.table,
            "Key": {"group_id": {"S": group}},
            "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
        }
        params.update(
            _params(
                G.cancelled_at.does_not_exist(),
                [
                    G.jobs.add(1),
                    G.created_at.set(G.created_at | wall_now),
                    G.updated_at.set(wall_now),
                ],
            )
        )
        return {"Update": params}

    def cancel(self, group: str, reason: str, wall_now: float) -> Call:
        # The first cancel's time and reason stay: a repeated cancel (to finish one
        # that stopped half-way) changes nothing but its own report.
        params: dict[str, Any] = {
            "TableName": self.table,
            "Key": {"group_id": {"S": group}},
            "ReturnValues": "ALL_NEW",
        }
        params.update(
            _params(
                None,
                [
                    G.cancelled_at.set(G.cancelled_at | wall_now),
                    G.reason.set(G.reason | reason),
                    G.created_at.set(G.created_at | wall_now),
                    G.updated_at.set(wall_now),
                ],
            )
        )
        return Call("dynamodb", "UpdateItem", params)

    def get(self, group: str) -> Call:
        return Call(
            "dynamodb",
            "GetItem",
            {"TableName": self.table, "Key": {"group_id": {"S": group}}, "ConsistentRead": True},
        )

    def parse(self, item: Mapping[str, Any]) -> GroupView:
        def n(name: str) -> float | None:
            v = item.get(name)
            return None if v is None or "NULL" in v else float(v["N"])

        reason = item.get("reason")
        return GroupView(
            group=str(item.get("group_id", {}).get("S", "")),
            jobs=int(n("jobs") or 0),
            cancelled_at=n("cancelled_at"),
            reason=None if reason is None or "NULL" in reason else str(reason["S"]),
        )


S = SlotRecord


@dataclass(frozen=True)
class SlotTable:
    """Implements the core's ``SlotRequests`` for one slots table."""

    table: str

    def read(self, keys: Sequence[str]) -> Call:
        return Call(
            "dynamodb",
            "BatchGetItem",
            {
                "RequestItems": {
                    self.table: {
                        "Keys": [{"slot": {"S": k}} for k in keys],
                        "ConsistentRead": True,
                    }
                }
            },
        )

    def items(self, response: Mapping[str, Any]) -> list[Mapping[str, Any]]:
        return list((response.get("Responses") or {}).get(self.table, []))

    def parse(self, item: Mapping[str, Any]) -> SlotView:
        def n(name: str) -> int | None:
            v = item.get(name)
            return None if v is None or "NULL" in v else int(v["N"])

        def s(name: str) -> str | None:
            v = item.get(name)
            return None if v is None or "NULL" in v else str(v["S"])

        return SlotView(
            key=s("slot") or "",
            version=n("version") or 0,
            job_id=s("job_id"),
            token=n("token"),
            owner=s("owner"),
        )

    def _update(self, key: str, condition: Condition, update: list[Action]) -> Call:
        params: dict[str, Any] = {"TableName": self.table, "Key": {"slot": {"S": key}}}
        params.update(_params(condition, update))
        return Call("dynamodb", "UpdateItem", params)

    def take(
        self,
        key: str,
        *,
        seen_version: int,
        job_id: str,
        token: int,
        worker_id: str,
        wall_now: float,
    ) -> Call:
        # The fence: the take lands only on the version this taker read, so of two
        # takers of one slot exactly one wins.
        cond: Condition = (
            S.slot.does_not_exist() if seen_version == 0 else S.version == seen_version
        )
        return self._update(
            key,
            cond,
            [
                S.version.set(seen_version + 1),
                S.job_id.set(job_id),
                S.token.set(token),
                S.owner.set(worker_id),
                S.taken_at.set(wall_now),
                S.updated_at.set(wall_now),
            ],
        )

    def give_back(self, key: str, *, job_id: str, token: int, wall_now: float) -> Call:
        return self._update(
            key,
            (S.job_id == job_id) & (S.token == token),
            [
                S.version.add(1),
                S.job_id.remove(),
                S.token.remove(),
                S.owner.remove(),
                S.taken_at.remove(),
                S.updated_at.set(wall_now),
            ],
        )


def view_of(item: Mapping[str, Any]) -> JobView:
    """Read a low-level item (possibly projected) into the core's view.

    Raises :class:`RecordUnreadable` (naming the job where its id can be read) for a
    record this version cannot read: an unknown state, a value of the wrong type.
    """

    def s(name: str) -> str | None:
        v = item.get(name)
        return None if v is None or "NULL" in v else str(v["S"])

    def n(name: str) -> int:
        v = item.get(name)
        return 0 if v is None or "NULL" in v else int(v["N"])

    def f(name: str) -> float | None:
        v = item.get(name)
        return None if v is None or "NULL" in v else float(v["N"])

    job_id = ""
    try:
        job_id = s("job_id") or ""
        sent = item.get("message_sent")
        return JobView(
            job_id=job_id,
            job_class=s("job_class") or "",
            state=JobState(s("state") or JobState.QUEUED.value),
            token=n("token"),
            attempt=n("attempt"),
            owner=s("owner"),
            payload_hash=s("payload_hash") or "",
            message_sent=True if sent is None else bool(sent.get("BOOL", False)),
            reason=s("reason"),
            error_code=s("error_code"),
            stage=s("stage"),
            payload_json=s("payload"),
            send_id=s("send_id"),
            unsent_since=f("unsent_since"),
            granted_attempts=n("granted_attempts"),
            resumed_at_attempt=n("resumed_at_attempt") if "resumed_at_attempt" in item else None,
            group=s("group_id"),
            timeline_length=len((item.get("timeline") or {}).get("L") or ()),
            progress_json=s("progress"),
            tenant=s("tenant"),
            priority=s("priority"),
            stage_input=s("stage_input"),
            stage_log=s("stages"),
            write_id=s("write_id"),
            late_handbacks=n("late_handbacks"),
        )
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        detail = f"{type(exc).__name__}: {exc}"[:300]
        raise RecordUnreadable(
            f"job record {job_id or '<no readable job_id>'!r} cannot be read by this version "
            f"({detail}); fix the record by hand or run a version that knows it",
            job_id,
        ) from None


def record_of(item: Mapping[str, Any]) -> JobRecord:
    """Full record (for the CLI and tests)."""
    rec: JobRecord = JobRecord.from_raw_data(dict(item))
    return rec


def create_table_params(model: type[Model], table: str) -> dict[str, Any]:
    """CreateTable parameters for a model (on-demand billing), derived from its keys
    and its global secondary indexes."""
    keys: list[dict[str, str]] = []
    defs: list[dict[str, str]] = []
    for name, attr in model.get_attributes().items():
        if attr.is_hash_key or attr.is_range_key:
            keys.append({"AttributeName": name, "KeyType": "HASH" if attr.is_hash_key else "RANGE"})
            defs.append({"AttributeName": name, "AttributeType": attr.attr_type})
    keys.sort(key=lambda k: k["KeyType"] != "HASH")
    params: dict[str, Any] = {
        "TableName": table,
        "KeySchema": keys,
        "AttributeDefinitions": defs,
        "BillingMode": "PAY_PER_REQUEST",
    }
    indexes = [index_params(index) for index in _indexes(model)]
    for index in indexes:
        for d in index.pop("_defs"):
            if d not in defs:
                defs.append(d)
    if indexes:
        params["GlobalSecondaryIndexes"] = indexes
    return params


def _indexes(model: type[Model]) -> list[type[GlobalSecondaryIndex[Any]]]:
    found = {type(v) for v in vars(model).values() if isinstance(v, GlobalSecondaryIndex)}
    return sorted(found, key=lambda i: str(i.Meta.index_name))


def index_params(index: type[GlobalSecondaryIndex[Any]]) -> dict[str, Any]:
    """One GlobalSecondaryIndexes entry (with its key definitions under ``_defs``)."""
    keys: list[dict[str, str]] = []
    defs: list[dict[str, str]] = []
    for name, attr in index.Meta.attributes.items():
        if attr.is_hash_key or attr.is_range_key:
            keys.append({"AttributeName": name, "KeyType": "HASH" if attr.is_hash_key else "RANGE"})
            defs.append({"AttributeName": name, "AttributeType": attr.attr_type})
    keys.sort(key=lambda k: k["KeyType"] != "HASH")
    projection: dict[str, Any] = {"ProjectionType": index.Meta.projection.projection_type}
    if index.Meta.projection.non_key_attributes:
        projection["NonKeyAttributes"] = list(index.Meta.projection.non_key_attributes)
    return {
        "IndexName": index.Meta.index_name,
        "KeySchema": keys,
        "Projection": projection,
        "_defs": defs,
    }


# --------------------------------------------------------------------------- intents


AMBIGUOUS_INDEX = "ambiguous"


class AmbiguousIndex(GlobalSecondaryIndex["IntentRecord"]):  # type: ignore[no-untyped-call]
    """Sparse index of the intents an operator must decide (``ambiguous``), newest first.

    Only the write that marks an intent ambiguous sets ``attention``; an operator's
    resolution removes it. ``intents list --state ambiguous`` is one Query per page.
    """

    class Meta:
        index_name = AMBIGUOUS_INDEX
        projection = IncludeProjection(_non_keys(INTENT_LIST_FIELDS, "intent_key", "updated_at"))

    attention = UnicodeAttribute(hash_key=True)
    updated_at = NumberAttribute(range_key=True)


class IntentRecord(Model):
    """What a side effect was meant to be: key, immutable payload, state, outcome."""

    class Meta:
        table_name = "sqs-lease-intents"

    intent_key = UnicodeAttribute(hash_key=True)
    job_id = UnicodeAttribute()
    stage = UnicodeAttribute()
    action = UnicodeAttribute()
    target = UnicodeAttribute()
    state = UnicodeAttribute()
    payload = UnicodeAttribute()  # the one immutable version a repeat must send again
    payload_hash = UnicodeAttribute()
    attempts = NumberAttribute(default=0)
    last_token = NumberAttribute(default=0)
    key_retention = NumberAttribute(null=True)  # seconds the target keeps the key; null: never
    # What the target's success means: accepted | completed | delivered (Target.success).
    success = UnicodeAttribute(null=True)
    external_id = UnicodeAttribute(null=True)
    response = UnicodeAttribute(null=True)
    reason = UnicodeAttribute(null=True)
    reconciled = BooleanAttribute(null=True)
    created_at = NumberAttribute()
    updated_at = NumberAttribute()
    first_started_at = NumberAttribute(null=True)
    # "<wall time>|<worker id>" of the first start, written once in one write: whose
    # wall clock stamped it (the key-retention rule compares it only with that clock).
    first_start = UnicodeAttribute(null=True)
    start_id = UnicodeAttribute(null=True)  # identity of the current start (start_id_for)
    confirmed_at = NumberAttribute(null=True)
    resolution = UnicodeAttribute(null=True)
    resolved_by = UnicodeAttribute(null=True)
    resolved_at = NumberAttribute(null=True)
    resolution_reason = UnicodeAttribute(null=True)
    # A new, separate operation an operator approved in this one's place, and back.
    successor = UnicodeAttribute(null=True)
    predecessor = UnicodeAttribute(null=True)
    # "ambiguous" only while the intent waits for an operator (sparse index).
    attention = UnicodeAttribute(null=True)

    ambiguous_index = AmbiguousIndex()


class AttemptRecord(Model):
    """What one attempt of an effect observed (apart from the intent)."""

    class Meta:
        table_name = "sqs-lease-attempts"

    intent_key = UnicodeAttribute(hash_key=True)
    attempt = NumberAttribute(range_key=True)
    job_id = UnicodeAttribute()
    token = NumberAttribute()
    worker = UnicodeAttribute()
    tool = UnicodeAttribute()
    action = UnicodeAttribute()
    payload_hash = UnicodeAttribute()
    started_at = NumberAttribute()
    ended_at = NumberAttribute(null=True)
    # started | ok | not_applied | unknown | confirmed_by_check | not_applied_by_check
    # (``failed``: written by versions before the not-applied rule)
    outcome = UnicodeAttribute()
    error = UnicodeAttribute(null=True)
    external_id = UnicodeAttribute(null=True)
    response = UnicodeAttribute(null=True)  # bounded; only when bodies are opted in
    success = UnicodeAttribute(null=True)  # what the target's success meant for this attempt


IR = IntentRecord
AR = AttemptRecord


def _ikey(key: str) -> dict[str, Any]:
    return {"intent_key": {"S": key}}


def _akey(key: str, attempt: int) -> dict[str, Any]:
    return {"intent_key": {"S": key}, "attempt": {"N": str(attempt)}}


@dataclass(frozen=True)
class IntentTable:
    """Implements the core's ``IntentRequests``/``ResolveRequests``."""

    table: str
    attempts_table: str

    def _update_item(
        self, table: str, key: dict[str, Any], condition: Condition, actions: Sequence[Action]
    ) -> dict[str, Any]:
        params: dict[str, Any] = {"TableName": table, "Key": key}
        params.update(_params(condition, actions))
        return params

    def prepare(self, spec: EffectSpec, wall_now: float) -> Call:
        record = IntentRecord(
            intent_key=spec.key,
            job_id=spec.job_id,
            stage=spec.stage,
            action=spec.action,
            target=spec.target,
            state=IntentState.PREPARED.value,
            payload=spec.payload_json,
            payload_hash=spec.payload_hash,
            attempts=0,
            last_token=0,
            key_retention=spec.key_retention_seconds,
            success=spec.success,
            predecessor=spec.predecessor,
            created_at=wall_now,
            updated_at=wall_now,
        )
        params: dict[str, Any] = {
            "TableName": self.table,
            "Item": record.serialize(),
            "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
        }
        params.update(_params(IR.intent_key.does_not_exist()))
        return Call("dynamodb", "PutItem", params)

    def start(
        self,
        spec: EffectSpec,
        *,
        jobs: JobRequests,
        token: int,
        worker_id: str,
        expected: IntentState,
        attempts: int,
        wall_now: float,
        start_id: str = "",
        try_no: int = 0,
    ) -> Call:
        actions: list[Action] = [
            IR.state.set(IntentState.IN_PROGRESS.value),
            IR.attempts.set(attempts + 1),
            IR.last_token.set(token),
            IR.updated_at.set(wall_now),
            IR.first_started_at.set(IR.first_started_at | wall_now),
            IR.first_start.set(IR.first_start | first_start_stamp(wall_now, worker_id)),
        ]
        if start_id:
            actions.append(IR.start_id.set(start_id))
        intent = self._update_item(
            self.table,
            _ikey(spec.key),
            # Only the job that holds the key starts it: another job sharing the key
            # waits (its call may be in flight), so a start never lands for it.
            (IR.state == expected.value) & (IR.attempts == attempts) & (IR.job_id == spec.job_id),
            actions,
        )
        attempt = AttemptRecord(
            intent_key=spec.key,
            attempt=attempts + 1,
            job_id=spec.job_id,
            token=token,
            worker=worker_id,
            tool=spec.target,
            action=spec.action,
            payload_hash=spec.payload_hash,
            started_at=wall_now,
            outcome="started",
            success=spec.success,
        )
        put: dict[str, Any] = {"TableName": self.attempts_table, "Item": attempt.serialize()}
        put.update(_params(AR.intent_key.does_not_exist()))
        items: list[dict[str, Any]] = [
            dict(jobs.fence_check(spec.job_id, token)),
            {"Update": intent},
            {"Put": put},
        ]
        if expected is IntentState.IN_PROGRESS and attempts > 0:
            # A repeat after the check said "not applied": close the earlier
            # attempt with that verdict (its owner never saw its end).
            items.append(
                {
                    "Update": self._update_item(
                        self.attempts_table,
                        _akey(spec.key, attempts),
                        AR.intent_key.exists(),
                        [
                            AR.ended_at.set(AR.ended_at | wall_now),
                            AR.outcome.set("not_applied_by_check"),
                        ],
                    )
                }
            )
        # One transaction: the job is still ours (token), the intent is as we saw
        # it, and the attempt is logged; any of them failing starts nothing. The
        # request token (one owner's one write: table, job, token, start, try) makes
        # an SDK retry of an applied start a no-op on AWS, and no other owner's.
        return Call(
            "dynamodb",
            "TransactWriteItems",
            {
                "TransactItems": items,
                "ClientRequestToken": _request_token(
                    "start",
                    self.table,
                    spec.job_id,
                    spec.key,
                    attempts + 1,
                    token,
                    start_id,
                    try_no,
                ),
            },
        )

    def confirm(
        self,
        key: str,
        *,
        attempt: int,
        response_json: str,
        external_id: str | None,
        wall_now: float,
        log_response: str,
        reconciled: bool,
        job_id: str = "",
        token: int = 0,
        try_no: int = 0,
    ) -> Call:
        intent_actions: list[Action] = [
            IR.state.set(IntentState.CONFIRMED.value),
            IR.response.set(response_json),
            IR.updated_at.set(wall_now),
            IR.confirmed_at.set(wall_now),
            IR.reconciled.set(reconciled),
        ]
        attempt_actions: list[Action] = [
            AR.ended_at.set(AR.ended_at | wall_now),
            AR.outcome.set("confirmed_by_check" if reconciled else "ok"),
        ]
        if external_id:
            intent_actions.append(IR.external_id.set(external_id))
            attempt_actions.append(AR.external_id.set(external_id))
        if log_response:
            attempt_actions.append(AR.response.set(log_response))
        items = [
            {
                "Update": self._update_item(
                    self.table,
                    _ikey(key),
                    (IR.state == IntentState.IN_PROGRESS.value) & (IR.attempts == attempt),
                    intent_actions,
                )
            }
        ]
        if attempt > 0:
            items.append(
                {
                    "Update": self._update_item(
                        self.attempts_table,
                        _akey(key, attempt),
                        AR.intent_key.exists(),
                        attempt_actions,
                    )
                }
            )
        return Call(
            "dynamodb",
            "TransactWriteItems",
            {
                "TransactItems": items,
                # The fencing token is part of it: a late owner's confirm and the new
                # owner's reconciling confirm of one attempt are two writes.
                "ClientRequestToken": _request_token(
                    "confirm", self.table, job_id, key, attempt, token, reconciled, try_no
                ),
            },
        )

    def take_over(
        self, key: str, *, holder: str, job_id: str, attempts: int, reason: str, wall_now: float
    ) -> Call:
        # A prepared intent (never started, or reopened after a provable "not
        # applied") whose holder job has ended for good changes hands. Exactly that
        # holder, that state and that attempt count: anything else moved meanwhile.
        params = self._update_item(
            self.table,
            _ikey(key),
            (IR.job_id == holder)
            & (IR.state == IntentState.PREPARED.value)
            & (IR.attempts == attempts),
            [IR.job_id.set(job_id), IR.reason.set(reason), IR.updated_at.set(wall_now)],
        )
        params["ReturnValues"] = "ALL_NEW"
        params["ReturnValuesOnConditionCheckFailure"] = "ALL_OLD"
        return Call("dynamodb", "UpdateItem", params)

    def attempt_failed(
        self, key: str, *, attempt: int, outcome: str, error: str, wall_now: float, reopen: bool
    ) -> Call:
        items: list[dict[str, Any]] = [
            {
                "Update": self._update_item(
                    self.attempts_table,
                    _akey(key, attempt),
                    AR.intent_key.exists(),
                    [AR.ended_at.set(wall_now), AR.outcome.set(outcome), AR.error.set(error)],
                )
            }
        ]
        if reopen:
            items.append(
                {
                    "Update": self._update_item(
                        self.table,
                        _ikey(key),
                        (IR.state == IntentState.IN_PROGRESS.value) & (IR.attempts == attempt),
                        [IR.state.set(IntentState.PREPARED.value), IR.updated_at.set(wall_now)],
                    )
                }
            )
        return Call("dynamodb", "TransactWriteItems", {"TransactItems": items})

    def mark_ambiguous(self, key: str, *, attempts: int, reason: str, wall_now: float) -> Call:
        params = self._update_item(
            self.table,
            _ikey(key),
            (IR.state == IntentState.IN_PROGRESS.value) & (IR.attempts == attempts),
            [
                IR.state.set(IntentState.AMBIGUOUS.value),
                IR.attention.set(IntentState.AMBIGUOUS.value),
                IR.reason.set(reason),
                IR.updated_at.set(wall_now),
            ],
        )
        params["ReturnValuesOnConditionCheckFailure"] = "ALL_OLD"
        return Call("dynamodb", "UpdateItem", params)

    def _resolution(
        self,
        key: str,
        *,
        resolution: Resolution,
        external_id: str | None,
        who: str,
        why: str,
        wall_now: float,
        attempt: int | None,
    ) -> dict[str, Any]:
        actions: list[Action] = [
            IR.attention.remove(),  # decided: out of the ambiguous index
            IR.resolution.set(resolution.value),
            IR.resolved_by.set(who),
            IR.resolved_at.set(wall_now),
            IR.resolution_reason.set(why),
            IR.updated_at.set(wall_now),
        ]
        if resolution is Resolution.CONFIRMED:
            if external_id:
                actions.append(IR.external_id.set(external_id))
            actions += [
                IR.state.set(IntentState.CONFIRMED.value),
                IR.response.set(canonical({"external_id": external_id, "resolved_by": who})),
                IR.confirmed_at.set(wall_now),
            ]
        elif resolution is Resolution.RETRY:
            actions.append(IR.state.set(IntentState.PREPARED.value))
        elif resolution is Resolution.NEW_OPERATION:
            actions += [
                IR.state.set(IntentState.SUPERSEDED.value),
                IR.successor.set(successor_key(key)),
            ]
        if resolution not in (Resolution.ABANDON, Resolution.NEW_OPERATION):
            # The "cannot tell" reason is stale once an operator decided; the
            # attempt log and the resolution fields keep the history.
            actions.append(IR.reason.remove())
        elif resolution is Resolution.ABANDON:
            actions += [IR.state.set(IntentState.ABANDONED.value), IR.reason.set(why)]
        else:
            actions.append(IR.reason.set(why))
        condition = IR.state == IntentState.AMBIGUOUS.value
        if attempt is not None:
            # The decision is about this attempt's ambiguity, never a later one's.
            condition = condition & (IR.attempts == attempt)
        params = self._update_item(self.table, _ikey(key), condition, actions)
        params["ReturnValuesOnConditionCheckFailure"] = "ALL_OLD"
        return params

    def resolve(
        self,
        key: str,
        *,
        resolution: Resolution,
        external_id: str | None,
        who: str,
        why: str,
        wall_now: float,
        attempt: int | None = None,
    ) -> Call:
        params = self._resolution(
            key,
            resolution=resolution,
            external_id=external_id,
            who=who,
            why=why,
            wall_now=wall_now,
            attempt=attempt,
        )
        params["ReturnValues"] = "ALL_NEW"
        return Call("dynamodb", "UpdateItem", params)

    def resolve_and_unpark(
        self,
        key: str,
        *,
        resolution: Resolution,
        external_id: str | None,
        who: str,
        why: str,
        wall_now: float,
        jobs: JobRequests,
        job_id: str,
        send_id: str,
        attempt: int | None = None,
    ) -> Call:
        # One decision: the intent is settled and its parked job unparked, or neither.
        intent = self._resolution(
            key,
            resolution=resolution,
            external_id=external_id,
            who=who,
            why=why,
            wall_now=wall_now,
            attempt=attempt,
        )
        return Call(
            "dynamodb",
            "TransactWriteItems",
            {
                "TransactItems": [
                    {"Update": intent},
                    dict(jobs.unpark_item(job_id, send_id, wall_now)),
                ],
                "ClientRequestToken": _request_token("resolve", key, job_id, send_id),
            },
        )

    def get(self, key: str) -> Call:
        return Call(
            "dynamodb",
            "GetItem",
            {"TableName": self.table, "Key": _ikey(key), "ConsistentRead": True},
        )

    def parse(self, item: Mapping[str, Any]) -> IntentView:
        return intent_view_of(item)


def _request_token(*parts: object) -> str:
    """A TransactWriteItems ClientRequestToken (at most 36 characters), stable per step."""
    digest = hashlib.sha256("\x1f".join(str(p) for p in parts).encode()).hexdigest()
    return digest[:36]


def canonical(value: Any) -> str:
    import json

    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def intent_view_of(item: Mapping[str, Any]) -> IntentView:
    def s(name: str) -> str | None:
        v = item.get(name)
        return None if v is None or "NULL" in v else str(v["S"])

    def n(name: str) -> int:
        v = item.get(name)
        return 0 if v is None or "NULL" in v else int(v["N"])

    def f(name: str) -> float | None:
        v = item.get(name)
        return None if v is None or "NULL" in v else float(v["N"])

    return IntentView(
        key=s("intent_key") or "",
        job_id=s("job_id") or "",
        action=s("action") or "",
        target=s("target") or "",
        state=IntentState(s("state") or IntentState.PREPARED.value),
        payload_hash=s("payload_hash") or "",
        attempts=n("attempts"),
        payload_json=s("payload"),
        response_json=s("response"),
        external_id=s("external_id"),
        last_token=n("last_token"),
        reason=s("reason"),
        start_id=s("start_id"),
        first_started_at=f("first_started_at"),
        first_started_by=first_started_by(s("first_start"), f("first_started_at")),
        resolution=s("resolution"),
        resolved_by=s("resolved_by"),
        success=success_meaning(s("success")),
        successor=s("successor"),
        predecessor=s("predecessor"),
    )
