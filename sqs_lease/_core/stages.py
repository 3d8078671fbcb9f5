"""Durable stages: how one stage of a job ends and the next begins (commit and continue).

A staged job is one job record and one fencing token; its stages follow one
another on that record. A handler ends its stage by returning
:class:`NextStage`; the attempt flow then runs :func:`continue_flow`:

1. **checkpoint** - one UpdateItem fenced on the job's token (like a commit):
   the stage log gains the ending stage (its result, token, attempt, duration),
   the record moves to the next stage (``queued``, attempt 0, the stage's
   input) and names a new send id as its one current message, *unsent*;
2. **next message** - SendMessage naming the job, the next stage and that send
   id, then the record is marked sent (``send_job_message``, as at submit);
3. **delete** the current message (in the worker's delete batch on a standard
   queue; at once on a FIFO queue, where it holds the job's group).

A crash between any two steps neither loses nor repeats a stage:

- before 1: nothing was committed; the message comes back and the stage runs
  again (its effects are intents keyed by job id + stage: replayed, not repeated);
- between 1 and 2: the record waits without a sent message in the sparse
  ``unsent`` index; every worker's stranded-record sweep sends it after its
  grace (the same sweep that covers a producer that died after its put). The
  continuation is recovered by the sweep, not recorded as an intent: the record
  itself is the intent (its send id names the one message allowed to claim it);
- between 2 and 3 (a failed delete, or a batch not yet sent): the old message
  comes back, names the old send id, claims nothing (a stray) and is deleted;
- a second message for the next stage (a sweep racing a slow sender) carries a
  retired send id: a stray too. A committed stage is never claimed again.

The token keeps rising across stages (every claim adds one, the checkpoint adds
none), so a stale owner of stage 1 is fenced out once stage 1 was taken over or
stage 2 claimed; a fenced receiver's scope is the job id for all its stages.

The core reads no clock and knows no app: the caller passes the next stage's
rules (None: the job has no such stage) and validates its input.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from .._errors import RecordUnreadable
from .calls import Err, ErrorKind, Flow, Ok, call, emit
from .endwrites import EndRequest, end_attempt, fail_instead
from .fencing import Finish, FinishOutcome, delete_message
from .fifo import is_fifo
from .inputs import NAME_RULE, loads, valid_name
from .limits import record_problem
from .messages import MESSAGE_CAP_SECONDS, cap_budget, fail_call
from .records import GroupRequests, JobRequests, JobState, JobView, is_cancelled
from .sending import SendVerdict, send_record_message
from .sending import send_job_message as _send
from .sweeping import home_queue

STAGE_NAME = NAME_RULE
"""What a stage name may be: it is part of the idempotency keys of the stage's effects
(the one rule for class and stage names, ``inputs.NAME_RULE``)."""


def valid_stage_name(name: object) -> bool:
    """Whether ``name`` can name a stage (:data:`STAGE_NAME`)."""
    return valid_name(name)


def plain_data(value: Any) -> Any:
    """A handler's value as JSON data: a pydantic model (or anything with its
    ``model_dump``) dumped in JSON mode, anything else as it is. The one place a
    result becomes data, for every shell (the core does not import pydantic)."""
    dump = getattr(value, "model_dump", None)
    return dump(mode="json") if callable(dump) else value


@dataclass(frozen=True)
class NextStage:
    """What a handler returns to end its stage and start the next one.

    ``return NextStage("render", {"file": key})``: the record moves to stage
    ``name`` with ``payload`` as that stage's input (validated by its payload
    model), and a new message is sent for it. ``result`` is the ending stage's own
    checkpoint, which later stages read (``ctx.results[stage]``); None keeps the
    ``payload`` as the checkpoint. Both must be JSON (a pydantic model is dumped);
    keep them small (references to stored data, not the data: they share the job
    record's 400 KB with the payload).
    """

    name: str
    payload: Any = field(default_factory=dict)
    result: Any = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "payload", plain_data(self.payload))
        object.__setattr__(self, "result", plain_data(self.result))

    @property
    def checkpoint(self) -> Any:
        """What the ending stage leaves for later stages."""
        return self.payload if self.result is None else self.result


@dataclass(frozen=True)
class StageEntry:
    """One committed stage as the job record keeps it (its checkpoint)."""

    stage: str
    result: Any
    token: int
    attempt: int
    duration: float
    finished_at: float
    worker: str

    def as_json(self) -> dict[str, Any]:
        return {
            "stage": self.stage,
            "result": self.result,
            "token": self.token,
            "attempt": self.attempt,
            "duration": self.duration,
            "finished_at": self.finished_at,
            "worker": self.worker,
        }


def stage_log(job: JobView) -> list[StageEntry]:
    """The committed stages of a job, in order (empty for a job of one stage)."""
    if not job.stage_log:
        return []
    out: list[StageEntry] = []
    try:
        for e in loads(job.stage_log):
            out.append(
                StageEntry(
                    stage=str(e["stage"]),
                    result=e.get("result"),
                    token=int(e.get("token", 0)),
                    attempt=int(e.get("attempt", 0)),
                    duration=float(e.get("duration", 0.0)),
                    finished_at=float(e.get("finished_at", 0.0)),
                    worker=str(e.get("worker", "")),
                )
            )
    except (ValueError, TypeError, KeyError, AttributeError, OverflowError) as exc:
        raise RecordUnreadable(
            f"job record {job.job_id!r}: its stage log cannot be read by this version "
            f"({type(exc).__name__}); fix the record by hand or run a version that knows it",
            job.job_id,
        ) from None
    return out


def stage_results(job: JobView) -> dict[str, Any]:
    """What the earlier stages left (stage name -> checkpoint), for ``ctx.results``."""
    return {e.stage: e.result for e in stage_log(job)}


def stage_input_json(job: JobView) -> str:
    """The JSON the current stage's handler gets: the input its predecessor gave it,
    or, for the first stage (and a job of one stage), the job's payload."""
    return job.stage_input if job.stage_input is not None else (job.payload_json or "")


def continuation_send_id(token: int, next_stage: str) -> str:
    """The send id of the next stage's message: unique per job, since one token ends
    at most one stage (the checkpoint leaves ``running``)."""
    return f"stage.{token}.{next_stage}"


def refused_next(job: JobView, nxt: NextStage, known: bool) -> str | None:
    """Why the job cannot go on to ``nxt`` (None: it can).

    A stage runs once per job: going back to a committed stage (or the current
    one) would reuse its idempotency keys and replay its effects instead of
    running them, so it is refused.
    """
    if not valid_stage_name(nxt.name):
        return f"NextStage name {nxt.name!r}: a stage name is {STAGE_NAME}"
    if not known:
        return (
            f"NextStage({nxt.name!r}): job class {job.job_class!r} has no stage {nxt.name!r}; "
            "declare it with @job.stage(...)"
        )
    done = [e.stage for e in stage_log(job)]
    if nxt.name == job.stage or nxt.name in done:
        return (
            f"NextStage({nxt.name!r}): stage {nxt.name!r} already ran for job {job.job_id!r} "
            f"(stages so far: {', '.join([*done, job.stage or '?'])}); a stage runs once per job"
        )
    return None


@dataclass(frozen=True)
class CappedRules:
    """A class's lease rules with the stage budget a message's age leaves (see
    :func:`cap_budget`); everything else is the class's own."""

    rules: Any  # a LeaseRules
    stage_budget_seconds: float
    capped: bool = True  # read by ``new_lease``: reaching this budget is the cap's doing

    @property
    def lease_seconds(self) -> int:
        return int(self.rules.lease_seconds)

    @property
    def heartbeat_seconds(self) -> float:
        return float(self.rules.heartbeat_seconds)

    @property
    def jitter_seconds(self) -> float:
        return float(self.rules.jitter_seconds)

    @property
    def progress_timeout_seconds(self) -> float | None:
        value = self.rules.progress_timeout_seconds
        return None if value is None else float(value)

    @property
    def max_attempts(self) -> int:
        return int(self.rules.max_attempts)

    @property
    def backoff_base_seconds(self) -> float:
        return float(self.rules.backoff_base_seconds)

    @property
    def backoff_max_seconds(self) -> float:
        return float(self.rules.backoff_max_seconds)


@dataclass(frozen=True)
class Continued:
    """How ending a stage went: the checkpoint write, and the next message's send."""

    fin: Finish
    sent: bool = False  # the next stage's message is out (else the sweep sends it)


def continue_flow(
    req: JobRequests, end: EndRequest, *, nxt: NextStage, input_json: str, duration: float
) -> Flow[Continued]:
    """End the current stage and start ``nxt`` (checkpoint, next message, delete).

    With ``end.defer_delete`` the stage's message joins the worker's delete batch
    (``Finish.delete_pending``), as a commit's does: should it come back first, it
    names a retired send id, claims nothing and is deleted then. Not on a FIFO
    queue: there it holds the job's group until it goes, and the next stage's
    message waits behind it, so it is deleted at once.

    ``input_json`` is ``nxt.payload`` as canonical JSON, already validated by the
    caller against the next stage's payload model. A checkpoint refused by the
    fence (the token moved on) is ``result_rejected`` and nothing is sent.
    """
    job = end.job
    entry = StageEntry(
        stage=job.stage_name,
        result=nxt.checkpoint,
        token=job.token,
        attempt=job.attempt,
        duration=round(duration, 3),
        finished_at=end.wall_now,
        worker=end.worker_id,
    )
    log = [e.as_json() for e in stage_log(job)] + [entry.as_json()]
    log_json = json.dumps(log, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    problem = record_problem(
        job.job_id, payload=job.payload_json, stage_log=log_json, stage_input=input_json
    )
    if problem is not None:
        problem += ": return references to stored data in NextStage, not the data"
        failing = replace(end, defer_delete=False)  # a stage's fail deletes at once
        return Continued((yield from fail_instead(req, failing, problem, "stage_too_large")))
    send_id = continuation_send_id(job.token, nxt.name)
    fin = yield from end_attempt(
        req,
        end,
        lambda write_id: req.advance_stage(
            job.job_id,
            job.token,
            end.worker_id,
            stage=entry.stage,
            next_stage=nxt.name,
            stage_input=input_json,
            stage_log=log_json,
            send_id=send_id,
            wall_now=end.wall_now,
            write_id=write_id,
        ),
        applied=JobState.QUEUED,
        stage="stage",
        delete=False,
    )
    if fin.outcome is not FinishOutcome.DONE:
        return Continued(fin)
    yield from emit(
        "stage_committed",
        job_id=job.job_id,
        job_class=job.job_class,
        stage=entry.stage,
        next_stage=nxt.name,
        token=job.token,
        attempt=job.attempt,
        duration=entry.duration,
    )
    # The queue this message came from (priorities): the next stage keeps the job's
    # priority. A continuation the sweep has to send goes to the default queue.
    sent = yield from _send(
        req,
        queue_url=end.home,
        job_id=job.job_id,
        job_class=job.job_class,
        send_id=send_id,
        wall_now=end.wall_now,
        stage=nxt.name,
        # FIFO: the job's group (else its id), so the next stage keeps its place in
        # its session's order; it is received once this message is deleted below.
        group=job.group,
    )
    # Sent or not, this message's work is done: a failed send leaves the record in
    # the unsent index (the sweep sends it); this message would only be a stray.
    fin = yield from _retire(end, fin)
    return Continued(fin, sent.verdict is not SendVerdict.FAILED)


def _retire(end: EndRequest, fin: Finish) -> Flow[Finish]:
    """The received message, retired by the write that named the job's new one: deleted
    at once (``Finish.deleted``: SQS took the delete), or in the worker's batch
    (``end.defer_delete``) but never on a FIFO queue, where it holds the job's group
    until it goes."""
    if end.defer_delete and not is_fifo(end.home):
        return replace(fin, delete_pending=True)
    out = yield from delete_message(end.home, end.delivery.receipt_handle)
    return replace(fin, deleted=isinstance(out, Ok))


def cap_send_id(token: int) -> str:
    """The send id of the new message a job gets when its message reached SQS's cap:
    unique per job, since one token resends at most once (the write leaves running)."""
    return f"cap.{token}"


def resend_flow(req: JobRequests, end: EndRequest, *, reason: str) -> Flow[Finish]:
    """The job goes on under a new message: its message used up SQS's 12-hour cap (the
    budget left was none, or SQS refused an extension). Fenced on the attempt's token
    like a release: back to queued at its stage, the attempt given back (the cap is
    the message's age, not the job's failure), a new send id; then the new message
    (a failed send leaves the record in the unsent index for the sweep) and the old
    message's delete (should it come back first, it is a stray)."""
    job = end.job
    send_id = cap_send_id(job.token)
    fin = yield from end_attempt(
        req,
        end,
        lambda write_id: req.resend(
            job.job_id,
            job.token,
            end.worker_id,
            send_id=send_id,
            reason=reason,
            wall_now=end.wall_now,
            write_id=write_id,
        ),
        applied=JobState.QUEUED,
        stage="resend",
        delete=False,
    )
    if fin.outcome is not FinishOutcome.DONE:
        return fin
    sent = yield from send_record_message(
        req, job, queue_url=end.home, send_id=send_id, wall_now=end.wall_now
    )
    yield from emit(
        "job_resent",
        job_id=job.job_id,
        token=job.token,
        stage=job.stage,
        send_id=send_id,
        sent=sent.verdict is not SendVerdict.FAILED,
        reason="message_cap",
    )
    return (yield from _retire(end, fin))


class RetryVerdict(StrEnum):
    """What an operator's retry did (``sqs-lease jobs retry --json`` prints the value)."""

    RETRIED = "retried"  # failed -> queued at its stage, message sent
    RESUMED = "resumed"  # it was parked: resumed (as ``jobs resume``)
    RESENT = "resent"  # it was queued without a sent message: sent now
    NOTHING_TO_DO = "nothing_to_do"  # running, queued and sent, or succeeded


@dataclass(frozen=True)
class Retried:
    """What an operator's retry did: ``retried`` (failed -> queued at its stage, message
    sent), ``resumed``/``resent`` (it was parked, or queued without a sent message: as
    ``jobs resume``), ``nothing_to_do`` (running, queued and sent, or succeeded)."""

    job_id: str
    verdict: RetryVerdict
    state: JobState
    stage: str | None
    note: str
    send_id: str | None = None
    message_id: str | None = None
    kept: tuple[str, ...] = ()  # the committed stages, kept as they are

    def __post_init__(self) -> None:
        object.__setattr__(self, "verdict", RetryVerdict(self.verdict))


def retry_failed_flow(
    req: JobRequests,
    *,
    queue_url: str,
    job_id: str,
    wall_now: float,
    send_id: str,
    stage: str | None = None,
    interactive_url: str | None = None,
    groups: GroupRequests | None = None,
) -> Flow[Retried]:
    """Run a failed or parked job again from where it ended (``sqs-lease jobs retry``).

    A staged job goes on at its failed stage: the stages committed before it keep
    their checkpoints and are not run again (their effects were applied; a stage
    runs once per job), the failed stage gets its input and a fresh count of
    attempts, and its intents replay what it already did. ``stage`` (optional) must
    name that stage: a committed stage, or one the job has not reached, is refused
    (:class:`~sqs_lease.RetryRefused`). The write is conditional on the state and
    token read, so a second retry of the same failure (or one racing a worker) is
    refused: it reports ``nothing_to_do``. A cancelled job is refused (submit again).
    A parked job, or one queued without a sent message, is resumed as by
    ``jobs resume`` (safe to repeat). A job of a cancelled group (agent session) is
    refused, however it ended (``groups.cancelled_group_flow``; ``groups`` reads it).
    """
    from .._errors import JobNotFound, RetryRefused
    from .groups import cancelled_group_flow
    from .resuming import ResumeVerdict, resume_flow

    got = yield from call(req.get(job_id))
    if isinstance(got, Err):
        raise fail_call(f"retry job {job_id!r}: read its record", got)
    item = got.response.get("Item")
    if not item:
        raise JobNotFound(f"no job {job_id!r}")
    job = req.parse(item)
    done = tuple(e.stage for e in stage_log(job))
    if stage is not None and stage != job.stage:
        if stage in done:
            why = (
                f"stage {stage!r} of job {job_id!r} is committed (its checkpoint is kept and a "
                f"stage runs once per job); the job is at stage {job.stage!r}: retry that one"
            )
        else:
            why = (
                f"job {job_id!r} is at stage {job.stage!r}, not {stage!r}"
                + (f" (committed: {', '.join(done)})" if done else "")
                + f"; retry with --stage {job.stage}"
                if job.stage is not None
                else f"job {job_id!r} has no stages; leave --stage out"
            )
        raise RetryRefused(why)
    if is_cancelled(job):
        raise RetryRefused(
            f"job {job_id!r} was cancelled ({job.reason}); a cancelled job is not retried: "
            "submit it again under a new id"
        )
    if job.state is not JobState.SUCCEEDED and (
        marker := (yield from cancelled_group_flow(groups, job))
    ):
        raise RetryRefused(
            f"job {job_id!r} is in group {marker.group!r}, cancelled ({marker.reason}); a "
            "cancelled session's jobs are not run again: submit it again under a new id "
            "in a new group"
        )
    if job.state is JobState.PARKED or (job.state is JobState.QUEUED and not job.message_sent):
        resumed = yield from resume_flow(
            req,
            queue_url=queue_url,
            job_id=job_id,
            wall_now=wall_now,
            send_id=send_id,
            interactive_url=interactive_url,
        )
        verdict = (
            RetryVerdict.NOTHING_TO_DO
            if resumed.verdict is ResumeVerdict.NOT_PARKED
            else RetryVerdict(resumed.verdict.value)
        )
        return Retried(
            job_id,
            verdict,
            resumed.state,
            job.stage,
            resumed.note,
            resumed.send_id,
            resumed.message_id,
            done,
        )
    if job.state is not JobState.FAILED:
        return Retried(
            job_id,
            RetryVerdict.NOTHING_TO_DO,
            job.state,
            job.stage,
            f"job is {job.state.value}, not failed",
        )
    where = f"stage {job.stage}" if job.stage is not None else "the job"
    out = yield from call(
        req.retry_failed(job_id, job.token, send_id, wall_now, f"retry of {where}")
    )
    if isinstance(out, Err):
        if out.kind is not ErrorKind.CONDITION_FAILED:
            raise fail_call(f"retry job {job_id!r}", out)
        now = req.parse(out.item) if out.item is not None else job
        return Retried(
            job_id,
            RetryVerdict.NOTHING_TO_DO,
            now.state,
            now.stage,
            f"job is {now.state.value} at token {now.token}: another retry (or a worker) "
            "changed it since it was read",
        )
    yield from emit("job_retried", job_id=job_id, stage=job.stage, token=job.token, send_id=send_id)
    sent = yield from send_record_message(
        req,
        job,  # its stage is the failed one: retry_failed is conditioned on its token
        queue_url=home_queue(job, queue_url, interactive_url),  # the job's own queue
        send_id=send_id,
        wall_now=wall_now,
    )
    if sent.verdict is SendVerdict.FAILED:
        assert sent.error is not None
        raise fail_call(
            f"job {job_id!r} is queued again at {where}, but its message was not sent: run "
            f"`sqs-lease jobs resume {job_id}`, or a worker's stranded sweep sends it; send",
            sent.error,
        )
    kept = f"; committed stages kept: {', '.join(done)}" if done else ""
    return Retried(
        job_id,
        RetryVerdict.RETRIED,
        JobState.QUEUED,
        job.stage,
        f"queued again at {where} with its full attempts{kept}",
        send_id,
        sent.message_id,
        done,
    )


def stage_rows(job: JobView) -> list[dict[str, Any]]:
    """The stages of a job for people (``jobs show``): the committed ones from the
    log, then the current one with the record's state and attempt."""
    rows: list[dict[str, Any]] = [
        {
            "stage": e.stage,
            "state": JobState.SUCCEEDED.value,
            "attempts": e.attempt,
            "token": e.token,
            "duration": e.duration,
            "result": e.result,
        }
        for e in stage_log(job)
    ]
    if job.stage is not None:
        rows.append(
            {
                "stage": job.stage,
                "state": job.state.value,
                "attempts": job.attempt,
                "token": job.token,
                "duration": None,
                "result": None,
            }
        )
    return rows


__all__ = [
    "MESSAGE_CAP_SECONDS",
    "STAGE_NAME",
    "CappedRules",
    "Continued",
    "NextStage",
    "Retried",
    "RetryVerdict",
    "StageEntry",
    "cap_budget",
    "cap_send_id",
    "continuation_send_id",
    "continue_flow",
    "plain_data",
    "refused_next",
    "resend_flow",
    "retry_failed_flow",
    "stage_input_json",
    "stage_log",
    "stage_results",
    "stage_rows",
    "valid_stage_name",
]
