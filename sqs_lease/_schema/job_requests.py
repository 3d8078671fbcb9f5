"""The job table's requests: ``JobTable`` implements the core's ``JobRequests``.

Every write on a job record (submit, send, claim, the fenced end writes, an
operator's cancel, resume and retry, the liveness record) is spelled here from the
models, so every driver (sync, async, simulation) sends the same requests."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Unpack

from pynamodb.expressions.condition import Condition
from pynamodb.expressions.update import Action

from .._core.calls import Call
from .._core.limits import REJECTED_CONTENT_LIMIT
from .._core.liveness import LIVENESS_KEEP_SECONDS, Liveness, held_json, liveness_key
from .._core.records import (
    CANCELLED_CODE,
    DEAD_LETTERED_CODE,
    UNDELIVERED_CODE,
    JobState,
    JobView,
    NewJob,
    UnheldPark,
)
from .._core.status import JobStatus
from .._core.timeline import TimelineKind as TK
from .._core.timeline import event
from .expressions import item_request, key_query, serialize
from .models import GC_TTL, GROUP_INDEX, UNSENT_BUCKET, UNSENT_INDEX, JobRecord
from .views import status_of, view_of


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


def _why(reason: str, error_code: str) -> list[Action]:
    return [R.reason.set(reason), R.error_code.set(error_code)]


@dataclass(frozen=True)
class _Attempt:
    """The attempt an end write is for (fenced on its token)."""

    job_id: str
    token: int
    worker_id: str
    wall_now: float
    write_id: str


def _current(send_id: str | None) -> Condition:
    # The message is the job's current one. A message without a send id (an older
    # producer) is current only on a record no current sender ever touched.
    cond: Condition = (
        (R.send_id.does_not_exist() & R.unsent.does_not_exist())
        if send_id is None
        else R.send_id == send_id
    )
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
        params = item_request(
            self.table,
            _key(job_id),
            condition,
            actions,
            ReturnValues=returns,
            ReturnValuesOnConditionCheckFailure="ALL_OLD",
        )
        return Call("dynamodb", "UpdateItem", params)

    def _end(
        self,
        attempt: _Attempt,
        *,
        state: JobState,
        changes: Sequence[Action],
        kind: TK,
        detail: str | None = None,
        stage: str | None = None,
        finished: bool = False,
        clear_reason: bool = False,
        then: Sequence[Action] = (),
    ) -> Call:
        # An attempt's end write, one update: fenced on its token, the id a retried
        # write recognises its own by, the lease's end and the timeline's event.
        wall_now, token, worker_id = attempt.wall_now, attempt.token, attempt.worker_id
        return self._update(
            attempt.job_id,
            _mine(token, worker_id),
            [
                R.state.set(state.value),
                R.write_id.set(attempt.write_id),
                *changes,
                R.updated_at.set(wall_now),
                *([R.finished_at.set(wall_now)] if finished else []),
                R.lease_deadline.remove(),
                *([R.reason.remove(), R.error_code.remove()] if clear_reason else []),
                _log(
                    event(kind, wall_now, owner=worker_id, token=token, detail=detail, stage=stage)
                ),
                *then,
            ],
        )

    def put_new(self, **job: Unpack[NewJob]) -> Call:
        return Call("dynamodb", "PutItem", self._new_record(job, group=None))

    def put_new_item(self, *, group: str, **job: Unpack[NewJob]) -> dict[str, Any]:
        """The same new record, in a group, as a TransactWriteItems entry."""
        return {"Put": self._new_record(job, group=group)}

    def _new_record(self, job: NewJob, *, group: str | None) -> dict[str, Any]:
        wall_now = job["wall_now"]
        priority = job.get("priority")
        record = JobRecord(
            job_id=job["job_id"],
            job_class=job["job_class"],
            state=JobState.QUEUED.value,
            token=0,
            attempt=0,
            payload=job["payload_json"],
            payload_hash=job["payload_hash"],
            message_sent=False,
            send_id=job["send_id"],
            unsent=UNSENT_BUCKET,
            unsent_since=wall_now,
            stage=job.get("stage"),
            created_at=wall_now,
            updated_at=wall_now,
            group_id=group,
            timeline=[event(TK.SUBMITTED, wall_now)],
            tenant=job.get("tenant"),
            priority=priority if priority != "batch" else None,
        )
        params: dict[str, Any] = {
            "TableName": self.table,
            "Item": record.serialize(),
            "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
        }
        params.update(serialize(R.job_id.does_not_exist()))
        return params

    def group_query(self, group: str, start: Mapping[str, Any] | None) -> Call:
        """One page of the group's jobs from the ``group`` index, oldest first."""
        params = key_query(self.table, "group_id", group, index=GROUP_INDEX)
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
        claimable: Condition = (
            R.state == JobState.QUEUED.value
            if take_from is None
            else (R.state == JobState.QUEUED.value)
            | ((R.state == _RUNNING) & (R.token == take_from))
        )
        return self._update(
            job_id,
            claimable & (R.job_class == job_class) & _current(send_id),
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

    def unsent_query(self, *, limit: int, start: Mapping[str, Any] | None = None) -> Call:
        """Records without a sent message, oldest stamp first; ``start``: the page after
        the one that returned it (``LastEvaluatedKey``). No cut on the stamp: the
        caller judges each entry's age on its own clock, entries ahead of it too."""
        params: dict[str, Any] = {
            "TableName": self.table,
            "IndexName": UNSENT_INDEX,
            "KeyConditionExpression": "#u = :u",
            "ExpressionAttributeNames": {"#u": "unsent"},
            "ExpressionAttributeValues": {":u": {"S": UNSENT_BUCKET}},
            "ScanIndexForward": True,
            "Limit": limit,
        }
        if start:
            params["ExclusiveStartKey"] = dict(start)
        return Call("dynamodb", "Query", params)

    def unsent_ahead_query(self, *, newer_than: float, limit: int) -> Call:
        """Records without a sent message stamped after ``newer_than`` (wall): entries a
        clock ahead of the caller's wrote, which ``unsent_query`` does not return yet."""
        params: dict[str, Any] = {
            "TableName": self.table,
            "IndexName": UNSENT_INDEX,
            "KeyConditionExpression": "#u = :u AND #t > :t",
            "ExpressionAttributeNames": {"#u": "unsent", "#t": "unsent_since"},
            "ExpressionAttributeValues": {
                ":u": {"S": UNSENT_BUCKET},
                ":t": {"N": repr(float(newer_than))},
            },
            "ScanIndexForward": True,
            "Limit": limit,
        }
        return Call("dynamodb", "Query", params)

    def restamp_unsent(
        self, job_id: str, *, seen_send_id: str | None, seen_since: float, wall_now: float
    ) -> Call:
        # Only the entry as the caller saw it (the same send id and stamp, still
        # waiting): a sender that moved on since wins, and the restamp is refused.
        seen: Condition = (
            R.send_id.does_not_exist() if seen_send_id is None else R.send_id == seen_send_id
        )
        cond: Condition = _waiting() & seen & (R.unsent_since == seen_since)
        return self._update(job_id, cond, [R.unsent_since.set(wall_now)])

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
        return self._end(
            _Attempt(job_id, token, worker_id, wall_now, write_id),
            state=JobState.SUCCEEDED,
            changes=[R.result.set(result_json)],
            kind=TK.COMMITTED,
            finished=True,
            clear_reason=True,
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
        return self._end(
            _Attempt(job_id, token, worker_id, wall_now, write_id),
            state=JobState.QUEUED,
            changes=[
                R.stage.set(next_stage),
                R.stage_input.set(stage_input),
                R.stages.set(stage_log),
                *_NEW_STAGE,
                R.attempt.set(0),
                R.granted_attempts.remove(),
                R.resumed_at_attempt.remove(),
                R.send_id.set(send_id),
                *_awaits_send(wall_now),
            ],
            kind=TK.STAGE_DONE,
            stage=stage,
            detail=f"next: {next_stage}",
            clear_reason=True,
        )

    def end_in_error(
        self,
        job_id: str,
        token: int,
        worker_id: str,
        reason: str,
        error_code: str,
        wall_now: float,
        *,
        write_id: str,
        retry: bool,
    ) -> Call:
        # A retry keeps the owner recorded, for people; a retried write recognises its
        # own by ``write_id``. A failure is finished and listed in the attention index.
        attempt = _Attempt(job_id, token, worker_id, wall_now, write_id)
        why = _why(reason, error_code)
        if retry:
            return self._end(
                attempt, state=JobState.QUEUED, changes=why, kind=TK.RETRY, detail=error_code
            )
        return self._end(
            attempt,
            state=JobState.FAILED,
            changes=[R.attention.set(JobState.FAILED.value), *why],
            kind=TK.FAILED,
            detail=error_code,
            finished=True,
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
        return self._end(
            _Attempt(job_id, token, worker_id, wall_now, write_id),
            state=JobState.QUEUED,
            changes=[
                *([] if charged else [R.attempt.set(R.attempt - 1)]),
                *([R.late_handbacks.add(1)] if late else []),
                *_why(reason, "released"),
            ],
            kind=TK.RELEASED,
            detail=reason,
            then=[] if resend_id is None else [R.send_id.set(resend_id), *_awaits_send(wall_now)],
        )

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
        return self._end(
            _Attempt(job_id, token, worker_id, wall_now, write_id),
            state=JobState.QUEUED,
            changes=[
                R.attempt.set(R.attempt - 1),
                *_why(reason, "message_cap"),
                R.send_id.set(send_id),
                *_awaits_send(wall_now),
            ],
            kind=TK.RELEASED,
            detail=reason,
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
        return self._end(
            _Attempt(job_id, token, worker_id, wall_now, write_id),
            state=JobState.PARKED,
            changes=[R.attention.set(JobState.PARKED.value), *_why(reason, "parked")],
            kind=TK.PARKED,
            detail=reason,
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

    def park_undelivered(self, job_id: str, **park: Unpack[UnheldPark]) -> Call:
        # Not an owner's write: a worker that cannot run the class parks the job
        # whose current message it is about to move to the DLQ. Only that message
        # (its send id) and the record's own class may do it, and only while the
        # job is queued or running: the move ends whatever lease the message
        # carried, and the park says so instead of leaving `running` behind. The
        # token moves on (as a cancel's does), so a lapsed owner that comes back
        # reads "lost", never "finished by my own write".
        return self._park_unheld(job_id, park, UNDELIVERED_CODE, TK.UNDELIVERABLE, _NOT_WAITING)

    def park_dead_lettered(self, job_id: str, **park: Unpack[UnheldPark]) -> Call:
        # The same park for a message SQS moved to the DLQ itself (its receives ran
        # out): a DLQ reconciliation found it there. That message was sent, so the
        # record leaves the unsent index too.
        return self._park_unheld(job_id, park, DEAD_LETTERED_CODE, TK.DEAD_LETTERED, _SENT)

    def _park_unheld(
        self, job_id: str, park: UnheldPark, error_code: str, kind: TK, sent: list[Action]
    ) -> Call:
        wall_now = park["wall_now"]
        return self._update(
            job_id,
            R.job_id.exists()
            & R.state.is_in(JobState.QUEUED.value, _RUNNING)
            & (R.job_class == park["job_class"])
            & _current(park["send_id"]),
            [
                R.state.set(JobState.PARKED.value),
                R.attention.set(JobState.PARKED.value),
                R.token.set(R.token + 1),
                R.reason.set(park["reason"]),
                R.error_code.set(error_code),
                R.updated_at.set(wall_now),
                R.lease_deadline.remove(),
                *sent,
                _log(event(kind, wall_now, detail=park["reason"])),
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
        params.update(serialize(R.job_id.does_not_exist() | (R.kind == "liveness")))
        return Call("dynamodb", "PutItem", params)

    def cancel(self, job_id: str, reason: str, wall_now: float) -> Call:
        # Moving the token on fences the current owner out at its next heartbeat.
        return self._update(
            job_id,
            R.job_id.exists() & R.state.is_in(JobState.QUEUED.value, _RUNNING, "parked"),
            [
                R.state.set(JobState.CANCELLED.value),
                R.attention.set(JobState.CANCELLED.value),
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
        params = item_request(
            self.table,
            _key(job_id),
            condition,
            actions,
            ReturnValuesOnConditionCheckFailure="ALL_OLD",
        )
        return {"Update": params}

    def fence_check(self, job_id: str, token: int) -> dict[str, Any]:
        """A TransactWriteItems entry: the job is running under exactly this token."""
        cond: Condition = (R.token == token) & (R.state == _RUNNING)
        return {"ConditionCheck": item_request(self.table, _key(job_id), cond)}

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

    def parse_status(self, item: Mapping[str, Any]) -> JobStatus:
        return status_of(item)
