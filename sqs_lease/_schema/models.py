"""The pynamodb models: the one definition of each table, its keys and its indexes.

Table names are chosen at run time (settings), so each model's ``Meta.table_name``
is only a default. What the core reads of an item is :mod:`.views`; the requests
built from these models are the ``*_requests`` modules."""

from __future__ import annotations

from pynamodb.attributes import (
    BooleanAttribute,
    ListAttribute,
    NumberAttribute,
    UnicodeAttribute,
)
from pynamodb.indexes import GlobalSecondaryIndex, IncludeProjection, KeysOnlyProjection
from pynamodb.models import Model

from .._core.records import (
    JobState,
)

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
ATTENTION_STATES = (JobState.PARKED.value, JobState.FAILED.value, JobState.CANCELLED.value)
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
    # The open state (ambiguous, or prepared by an operator's retry) an attempt's own
    # answer found when it confirmed the intent late: its call applied after the
    # intent had left in_progress, and before any later attempt started.
    confirmed_late = UnicodeAttribute(null=True)
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
    # | ok_late (the attempt's call applied, its answer came after a later attempt
    # started or an operator settled the intent otherwise: the intent was left as it
    # was; ``effect_applied_late``) (``failed``: versions before the not-applied rule)
    outcome = UnicodeAttribute()
    error = UnicodeAttribute(null=True)
    external_id = UnicodeAttribute(null=True)
    response = UnicodeAttribute(null=True)  # bounded; only when bodies are opted in
    success = UnicodeAttribute(null=True)  # what the target's success meant for this attempt
