"""The heartbeat: extending the held leases' visibility, the verdict of each beat,
and how a lost lease is recorded on the local lease.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from .._errors import (
    RecordUnreadable,
)
from .calls import Call, Emit, Err, ErrorKind, Flow, Ok, Outcome, Sleep, call, emit, sqs_code_is
from .fencing import Finish, FinishOutcome, own_end_write
from .lease import OPEN, Action, Drop, LeaseEvent, LocalLease
from .messages import BATCH_GET_TRIES, DDB_BATCH_GET, by_queue, chunks, lease_queue
from .records import (
    JobRequests,
    JobState,
    JobView,
    is_cancelled,
)

# --------------------------------------------------------------------------- heartbeat


class BeatStatus(StrEnum):
    """The heartbeat's verdict on one job."""

    OK = "ok"  # extended, and the record says this attempt still owns the job
    LOST = "lost"  # the token, owner or state moved on: the lease is gone
    CANCELLED = "cancelled"  # an operator cancelled the job
    UNKNOWN = "unknown"  # no answer: keep the old deadline, try again soon
    DONE = "done"  # this attempt already ended itself: nothing to extend, nothing lost
    # SQS refused the extension (InvalidParameterValue: its 12-hour cap, or a handle
    # it no longer takes) while the record still runs under this attempt's token:
    # nobody else took the job, so it goes on under a new message, uncharged.
    CAPPED = "capped"


@dataclass(frozen=True)
class Beat:
    """The heartbeat's verdict on one job (a :class:`BeatStatus`)."""

    job_id: str
    status: BeatStatus
    deadline: float | None = None  # new local deadline when ok
    reason: str = ""
    request_id: str = ""  # of the call that left ownership unknown, where it has one

    def __post_init__(self) -> None:
        object.__setattr__(self, "status", BeatStatus(self.status))


@dataclass(frozen=True)
class HeartbeatReport:
    beats: dict[str, Beat] = field(default_factory=dict)
    calls: int = 0
    progress_saved: dict[str, str] = field(default_factory=dict)  # job id -> details saved


_LEASE_GONE_CODES = ("ReceiptHandleIsInvalid", "MessageNotInflight", "InvalidParameterValue")


def heartbeat_flow(
    req: JobRequests,
    *,
    queue_url: str,
    leases: Sequence[LocalLease],
    worker_id: str,
    wall_now: float,
    still_held: Callable[[LocalLease], bool] | None = None,
) -> Flow[HeartbeatReport]:
    """Extend visibility (batches of 10), then confirm ownership (BatchGetItem of 100).

    Both must succeed for a local lease to move forward; the new deadline counts
    from before the visibility change was sent. No write per job: what people see
    (lease left, heartbeat age) comes from the worker's one liveness record per
    round (``_core/liveness.py``), written after the round.

    ``still_held``: asked as the verdicts are told; a lease the worker let go while
    the round was in flight (a watchdog's drop, a blocked event loop's) gets no
    ``heartbeat_ok`` or ``ownership_unknown`` after its ``lease_dropped``: its verdict
    is about an attempt that has ended (the book ignores it too).
    """
    beats: dict[str, Beat] = {}
    extended: dict[str, float] = {}
    gone: set[str] = set()
    refused: set[str] = set()  # InvalidParameterValue: the cap (or a handle SQS refuses)
    calls = 0
    # ``wall_now`` was read just before this round; the first call's send stamp is
    # the lease clock at about the same moment: the pair turns the monotonic
    # ``last_confirmed`` into a wall-clock time a person can read.
    mono_now: float | None = None
    by_id = {lease.job_id: lease for lease in leases}
    for queue, chunk in by_queue(leases, queue_url, lease_queue):
        entries = [
            {
                "Id": str(i),
                "ReceiptHandle": lease.receipt_handle,
                "VisibilityTimeout": lease.lease_seconds,
            }
            for i, lease in enumerate(chunk)
        ]
        out = yield from call(
            Call("sqs", "ChangeMessageVisibilityBatch", {"QueueUrl": queue, "Entries": entries})
        )
        calls += 1
        if mono_now is None:
            mono_now = out.sent_at
        answers: list[tuple[LocalLease, Outcome]] = []
        if isinstance(out, Err) and _refused_for_value(out):
            # The whole batch refused for one entry (moto raises its cap refusal so;
            # every entry we send is well formed): ask each alone, to know which.
            for lease in chunk:
                single = yield from call(set_visibility_call(queue, lease))
                calls += 1
                answers.append((lease, single))
        elif isinstance(out, Err):
            answers = [(lease, out) for lease in chunk]
        else:
            for ok in out.response.get("Successful", []):
                extended[chunk[int(ok["Id"])].job_id] = out.sent_at
            # Batch calls report per-entry failures on HTTP 200: always read Failed[].
            for bad in out.response.get("Failed", []):
                lease = chunk[int(bad["Id"])]
                code = str(bad.get("Code", ""))
                answers.append((lease, Err(ErrorKind.INVALID, code, sent_at=out.sent_at)))
        for lease, got in answers:
            if isinstance(got, Ok):
                extended[lease.job_id] = got.sent_at
                continue
            assert isinstance(got, Err)
            code = got.code or got.query_code
            if got is out:  # the whole call went unanswered or failed: keep trying
                why = got.code or got.kind
                beats[lease.job_id] = Beat(
                    lease.job_id, BeatStatus.UNKNOWN, reason=why, request_id=got.request_id
                )
            elif any(sqs_code_is(name, got.code, got.query_code) for name in _LEASE_GONE_CODES):
                beats[lease.job_id] = Beat(lease.job_id, BeatStatus.LOST, reason=f"sqs: {code}")
                gone.add(lease.job_id)
                if _refused_for_value(got):
                    refused.add(lease.job_id)
            else:
                beats[lease.job_id] = Beat(lease.job_id, BeatStatus.UNKNOWN, reason=f"sqs: {code}")
    # Jobs SQS calls gone are read too: a message our own commit just deleted is a
    # finished attempt, not a lost lease.
    pending = [job_id for job_id in by_id if job_id in extended or job_id in gone]
    seen: dict[str, JobView] = {}
    unreadable: dict[str, str] = {}
    for chunk in chunks(pending, DDB_BATCH_GET):
        out = yield from call(req.batch_get(chunk))
        calls += 1
        tries = 1
        while True:
            if isinstance(out, Err):
                break
            for item in req.batch_items(out.response):
                try:
                    view = req.parse(item)
                except RecordUnreadable as exc:
                    # One record this version cannot read affects only its own job.
                    if exc.job_id in by_id:
                        unreadable[exc.job_id] = str(exc)
                    continue
                seen[view.job_id] = view
            unprocessed = out.response.get("UnprocessedKeys") or {}
            if not unprocessed or tries >= BATCH_GET_TRIES:
                break
            yield Sleep(0.05 * tries)
            out = yield from call(req.batch_get_retry(unprocessed))
            calls += 1
            tries += 1
        for job_id in chunk:
            lease = by_id[job_id]
            found = seen.get(job_id)
            if job_id in unreadable:
                yield from emit(
                    "job_record_unreadable",
                    job_id=job_id,
                    token=lease.token,
                    stage="heartbeat",
                    reason=unreadable[job_id],
                )
                if job_id not in gone:
                    beats[job_id] = Beat(job_id, BeatStatus.UNKNOWN, reason="job record unreadable")
                continue
            if job_id in gone:
                if found is not None and _finished_by(lease, found):
                    beats[job_id] = Beat(job_id, BeatStatus.DONE, reason=f"job is {found.state}")
                elif job_id in refused and found is not None and _still_ours(lease, found):
                    beats[job_id] = Beat(job_id, BeatStatus.CAPPED, reason=beats[job_id].reason)
                continue
            if found is None:
                why = out.code or out.kind if isinstance(out, Err) else "not read"
                if isinstance(out, Ok) and not out.response.get("UnprocessedKeys"):
                    beats[job_id] = Beat(job_id, BeatStatus.LOST, reason="job record is gone")
                else:
                    rid = out.request_id if isinstance(out, Err) else ""
                    beats[job_id] = Beat(
                        job_id, BeatStatus.UNKNOWN, reason=f"dynamodb: {why}", request_id=rid
                    )
                continue
            beats[job_id] = _verdict(lease, found, worker_id, extended[job_id])
    saved: dict[str, str] = {}
    for lease in leases:
        # Progress details: a separate, only-when-changed write, fenced on the token,
        # at most one per job per round; a failed one is tried again next round.
        text, job_id = lease.progress, lease.job_id
        b = beats.get(job_id)
        if text is None or text == lease.progress_saved or b is None or b.status != BeatStatus.OK:
            continue
        out = yield from call(req.save_progress(job_id, lease.token, text, wall_now))
        calls += 1
        if isinstance(out, Ok):
            saved[job_id] = text
            yield from emit("progress_saved", job_id=job_id, token=lease.token, size=len(text))
        elif out.kind is ErrorKind.CONDITION_FAILED:
            # A stale token's details are refused, and say the lease is gone.
            try:
                now_view = req.parse(out.item) if out.item else None
            except RecordUnreadable:
                now_view = None
            beats[job_id] = (
                _verdict(lease, now_view, worker_id, extended[job_id])
                if now_view is not None
                else Beat(job_id, BeatStatus.LOST, reason="job record is gone")
            )
            yield from emit("progress_refused", job_id=job_id, token=lease.token)
    for job_id, beat in beats.items():
        lease = by_id[job_id]
        if still_held is not None and not still_held(lease):
            continue
        if beat.status is BeatStatus.OK:
            yield from emit(
                "heartbeat_ok",
                job_id=job_id,
                token=lease.token,
                lease_left=round((beat.deadline or 0.0) - extended[job_id], 3),
            )
        elif beat.status in (BeatStatus.DONE, BeatStatus.LOST, BeatStatus.CANCELLED):
            # done: this attempt already ended itself, nothing was lost. A loss is
            # journaled once per attempt where the lease changes (apply_beats, lose).
            continue
        else:
            yield from emit(
                "ownership_unknown",
                job_id=job_id,
                token=lease.token,
                reason=beat.reason,
                last_confirmed=lease.last_confirmed,
                last_confirmed_at=_wall_of(lease.last_confirmed, mono_now, wall_now),
                conservative_deadline=lease.conservative_deadline,
                request_id=beat.request_id or None,
            )
    return HeartbeatReport(beats, calls, saved)


def _wall_of(mono: float, mono_now: float | None, wall_now: float) -> float | None:
    """A lease-clock time as wall-clock seconds (None: never confirmed, or no anchor)."""
    if mono_now is None or mono <= 0.0:
        return None
    return round(wall_now - (mono_now - mono), 3)


@dataclass(frozen=True)
class BeatOutcome:
    """What a heartbeat round changed: leases extended, handlers to cancel, and the
    ``heartbeat_lost`` events to journal (one per attempt, see :func:`lose`)."""

    extended: tuple[LocalLease, ...]
    cancel: tuple[LocalLease, ...]
    events: tuple[Emit, ...] = ()
    # Dropped as Drop.MESSAGE_CAP (SQS refused the extension, the job still ours): the
    # round gives each its new message (``rounds.watchdog_drops_flow``).
    capped: tuple[LocalLease, ...] = ()


class LossSource(StrEnum):
    """How an attempt learned that its lease is gone (the ``detected_by`` field)."""

    HEARTBEAT = "heartbeat"  # the heartbeat's ownership read (or its progress save)
    HANDLER = "handler"  # the handler raised LeaseLost: a fenced call of its own was refused
    COMMIT = "commit"  # a fenced end write was rejected: the token had moved
    FAIL = "fail"
    RETRY = "retry"
    PARK = "park"
    RELEASE = "release"  # the shutdown hand-back was rejected
    INTENT_START = "intent_start"  # the fenced intent start was refused: token moved
    OWN_CLAIM = "own_claim"  # this worker's own newer claim of the job superseded it
    CLAIM = "claim"  # a write right after the claim, before the lease was held


def lost_event(
    job_id: str, token: int, source: LossSource, reason: str, cancelled: bool = False
) -> Emit:
    """The one event for a lost lease: ``heartbeat_lost`` (its documented name, kept for
    alerting), whatever detected it."""
    return Emit(
        "heartbeat_lost",
        {
            "job_id": job_id,
            "token": token,
            "reason": reason,
            "cancelled": cancelled,
            "detected_by": source.value,
        },
    )


def lose(
    lease: LocalLease, source: LossSource, reason: str, *, cancelled: bool = False
) -> Emit | None:
    """The attempt learned that its lease is gone: mark it, and return the event to
    journal, or None when this attempt's loss is already known (once per attempt).

    Any status but lost/cancelled can learn it: a running handler (ok/unknown), one
    that returned (done) and meets a rejected commit, one the watchdog dropped
    (expired) whose late write finds the token moved.
    """
    event = LeaseEvent.CANCELLED if cancelled else LeaseEvent.LOST
    if lease.process(event, reason) is not Action.TELL_LOSS:
        return None
    return lost_event(lease.job_id, lease.token, source, reason, cancelled)


def gave_back(lease: LocalLease, reason: str) -> None:
    """This attempt handed its job back itself (a watchdog retry, a release): nothing
    it learns later is a lost lease, and nothing may be done for it any more."""
    lease.process(LeaseEvent.GAVE_BACK, reason)


def rejected_loss(fin: Finish) -> tuple[str, bool] | None:
    """For a rejected end write: the loss reason and whether it was a cancel."""
    if fin.outcome is not FinishOutcome.REJECTED:
        return None
    cur = fin.current
    cancelled = cur is not None and is_cancelled(cur)
    return fin.reason, cancelled


def apply_beats(
    leases: Sequence[LocalLease],
    report: HeartbeatReport,
    *,
    started: float,
) -> BeatOutcome:
    """Move each lease by its verdict (the shells call this; they decide nothing).

    ``started`` is the worker's monotonic time when the round began. A lease that
    finished or was dropped while the round was in flight is left alone; ``ok``
    moves the local deadline (counted from before the visibility change was sent);
    ``lost``/``cancelled`` stop the attempt; ``unknown`` keeps the old deadline and
    asks for another try soon, while the reserve lasts.
    """
    extended: list[LocalLease] = []
    cancel: list[LocalLease] = []
    capped: list[LocalLease] = []
    events: list[Emit] = []
    for lease in leases:
        beat = report.beats.get(lease.job_id)
        if beat is None or beat.status is BeatStatus.DONE:
            continue
        if lease.status not in OPEN:
            continue
        if beat.status is BeatStatus.OK and beat.deadline is not None:
            lease.process(LeaseEvent.CONFIRMED)
            lease.deadline = beat.deadline
            lease.last_confirmed = started
            lease.next_beat = started + lease.heartbeat_seconds
            if lease.job_id in report.progress_saved:
                lease.progress_saved = report.progress_saved[lease.job_id]
            extended.append(lease)
        elif beat.status is BeatStatus.CAPPED:
            lease.drop(Drop.MESSAGE_CAP)
            capped.append(lease)
            cancel.append(lease)
        elif beat.status in (BeatStatus.LOST, BeatStatus.CANCELLED):
            ev = lose(
                lease,
                LossSource.HEARTBEAT,
                beat.reason,
                cancelled=beat.status is BeatStatus.CANCELLED,
            )
            if ev is not None:
                events.append(ev)
            cancel.append(lease)
        else:
            lease.process(LeaseEvent.UNCONFIRMED, beat.reason)
            lease.next_beat = started + min(lease.heartbeat_seconds, 1.0)
    return BeatOutcome(tuple(extended), tuple(cancel), tuple(events), tuple(capped))


def _refused_for_value(err: Err) -> bool:
    """SQS refused a visibility change as InvalidParameterValue (its 12-hour cap)."""
    return sqs_code_is("InvalidParameterValue", err.code, err.query_code)


def set_visibility_call(queue_url: str, lease: LocalLease) -> Call:
    """One lease's extension alone (a batch SQS refused whole, to find the entry)."""
    return Call(
        "sqs",
        "ChangeMessageVisibility",
        {
            "QueueUrl": queue_url,
            "ReceiptHandle": lease.receipt_handle,
            "VisibilityTimeout": lease.lease_seconds,
        },
    )


def _still_ours(lease: LocalLease, view: JobView) -> bool:
    """The record still runs under this attempt's token (and was not cancelled)."""
    return view.token == lease.token and view.state is JobState.RUNNING


def _finished_by(lease: LocalLease, view: JobView) -> bool:
    """The record left `running` under this attempt's own token by the attempt's own
    end write (commit, fail, retry, park, stage, release): its write id says so.
    Cancel moves the token; any other writer that left it under the token (a
    producer's forged `succeeded`) took the lease, it did not end it."""
    return (
        view.token == lease.token
        and view.state is not JobState.RUNNING
        and own_end_write(view, lease.nonce)
    )


def _verdict(lease: LocalLease, view: JobView, worker_id: str, sent_at: float) -> Beat:
    if is_cancelled(view):
        return Beat(lease.job_id, BeatStatus.CANCELLED, reason=view.reason or "cancelled")
    if _finished_by(lease, view):
        return Beat(lease.job_id, BeatStatus.DONE, reason=f"job is {view.state}")
    if view.token != lease.token:
        return Beat(lease.job_id, BeatStatus.LOST, reason=f"token moved to {view.token}")
    if view.state is not JobState.RUNNING:
        return Beat(lease.job_id, BeatStatus.LOST, reason=f"job is {view.state}")
    if view.owner != worker_id:
        return Beat(lease.job_id, BeatStatus.LOST, reason=f"owner is {view.owner}")
    return Beat(lease.job_id, BeatStatus.OK, deadline=sent_at + lease.lease_seconds)
