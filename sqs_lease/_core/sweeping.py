"""The stranded sweep: records whose message was never sent, found through the
``unsent`` index and sent (or cleared) by the sweep.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from .._errors import (
    RecordUnreadable,
    ResourceMissing,
)
from .calls import Err, ErrorKind, Flow, Ok, call, emit
from .messages import fail_call
from .records import (
    JobRequests,
    JobView,
    awaits_send,
)
from .sending import SendVerdict, send_record_message

# --------------------------------------------------------------------------- stranded


class StrandedVerdict(StrEnum):
    """What the sweep did with one record found without a sent message (``jobs sweep``
    prints the value)."""

    RESENT = "resent"  # its send taken over and its message sent
    WOULD_RESEND = "would_resend"  # a dry run: it would be sent
    MOVED = "moved"  # sent, claimed or taken over by another sender since the index saw it
    CLEARED = "cleared"  # it no longer waits for a message: taken out of the index
    FAILED = "failed"  # not sent (or not cleared): the next sweep tries again


@dataclass(frozen=True)
class Stranded:
    """One record found without a sent message, and what the sweep did with it.

    ``cleared``: the index still listed a record that no longer waits for its message
    (ended or parked by a write of an older version); the sweep took it out."""

    job_id: str
    job_class: str
    unsent_for: float  # seconds, by the sweeper's wall clock
    verdict: StrandedVerdict
    send_id: str | None = None  # the new send (resent) or the one found (otherwise)
    detail: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "verdict", StrandedVerdict(self.verdict))


@dataclass(frozen=True)
class SweepReport:
    jobs: tuple[Stranded, ...]
    more: bool  # the limit or the page bound was reached: more stranded records may wait
    # Where a next run may start (a query's LastEvaluatedKey, or the last entry this
    # run read when it stopped at its limit; None: the index was read to its end). A
    # record left in the index (moved, failed, unreadable) is behind it, so a sweep
    # that pages on (a Lambda deployment's scheduled sweep) reaches what follows.
    next_key: Mapping[str, Any] | None = None


SWEEP_PAGES = 10
"""Pages of the ``unsent`` index one sweep reads at most. Entries it cannot act on
(a record this version cannot read; an entry it clears) do not count against its
``limit``: it reads on past them, so they never hide a stranded job behind them,
within this bound on one run's reads."""


def _index_key(item: Mapping[str, Any]) -> dict[str, Any]:
    """An ``unsent`` index entry's keys: a query's ExclusiveStartKey after it."""
    return {k: item[k] for k in ("job_id", "unsent", "unsent_since") if k in item}


def home_queue(job: JobView, queue_url: str, interactive_url: str | None) -> str:
    """The queue a job's re-sent message goes to (a sweep, a resume, a retry): the one
    it was submitted to, so an interactive job keeps its priority. Without the
    interactive queue's address the default queue (the job still runs, at batch
    priority)."""
    if job.priority == "interactive" and interactive_url:
        return interactive_url
    return queue_url


def sweep_flow(
    req: JobRequests,
    *,
    queue_url: str,
    wall_now: float,
    older_than: float,
    limit: int,
    send_id_prefix: str,
    dry_run: bool = False,
    interactive_url: str | None = None,
    start_key: Mapping[str, Any] | None = None,
) -> Flow[SweepReport]:
    """Find records left without a sent message for ``older_than`` seconds and send
    them again, at most ``limit`` per run, oldest first (from ``start_key``, an
    earlier page's ``next_key``, when given).

    The records come from the sparse ``unsent`` index (Query pages, never a Scan).
    Each re-send first takes the right to send (a conditional write of a new send
    id, so concurrent sweepers and resubmitters send it once), which also retires
    any message an earlier sender did get out. ``send_id_prefix`` must be unique
    to this run (the shell makes it); the new ids are ``PREFIX.N``.

    The sweep makes progress past what it cannot act on: an entry whose record no
    longer waits for its message (``records.awaits_send``; left by an older
    version's cancel or park) is taken out of the index, and neither it nor a
    record this version cannot read counts against ``limit``: the sweep reads the
    next page instead (at most :data:`SWEEP_PAGES`).
    """
    found: list[Stranded] = []
    acted = 0  # entries that count against the limit
    seq = 0  # entries read: the new send ids' numbers
    start: Mapping[str, Any] | None = start_key
    more = False
    last: Mapping[str, Any] | None = None  # the last entry read: where a stop resumes
    for _page in range(SWEEP_PAGES):
        out = yield from call(
            req.unsent_query(older_than=wall_now - older_than, limit=limit, start=start)
        )
        if isinstance(out, Err):
            if out.kind is ErrorKind.INVALID and "index" in out.message.lower():
                raise ResourceMissing(
                    f"stranded sweep: the jobs table has no {'unsent'!r} index ({out.message}); "
                    "run `sqs-lease tables create` (it adds the index to an existing table)"
                )
            raise fail_call("stranded sweep: query the unsent index", out)
        start = out.response.get("LastEvaluatedKey") or None
        for item in out.response.get("Items", []):
            if acted >= limit:
                more = True
                break
            n, seq = seq, seq + 1
            last = item
            entry, counted = yield from _sweep_one(
                req,
                item,
                new_id=f"{send_id_prefix}.{n}",
                queue_url=queue_url,
                wall_now=wall_now,
                dry_run=dry_run,
                interactive_url=interactive_url,
            )
            if entry is not None:
                found.append(entry)
            acted += counted
        if acted >= limit:
            more = True  # (as a full page did: more may wait, a next run looks)
            break
        if start is None:
            break
    else:
        more = start is not None
    next_key = _index_key(last) if more and last is not None else (start if more else None)
    report = SweepReport(tuple(found), more=more, next_key=next_key)
    if found:
        tallied = (
            StrandedVerdict.RESENT,
            StrandedVerdict.MOVED,
            StrandedVerdict.CLEARED,
            StrandedVerdict.FAILED,
        )
        counts = {v.value: sum(1 for j in found if j.verdict is v) for v in tallied}
        yield from emit(
            "stranded_swept",
            found=len(found),
            dry_run=dry_run,
            more=report.more,
            **counts,
        )
    return report


def _sweep_one(
    req: JobRequests,
    item: Mapping[str, Any],
    *,
    new_id: str,
    queue_url: str,
    wall_now: float,
    dry_run: bool,
    interactive_url: str | None,
) -> Flow[tuple[Stranded | None, int]]:
    """One entry of the unsent index: send its record again, or take a dead entry out.
    Returns what was done (None: a dead entry in a dry run, no stranded job) and
    whether it counts against the sweep's limit (1) or not (0: nothing could be
    done for a job, so the sweep reads on)."""
    try:
        seen = req.parse(item)
    except RecordUnreadable as exc:
        return (yield from _unreadable_stranded(exc)), 0
    age = round(wall_now - (seen.unsent_since or wall_now), 3)
    if not awaits_send(seen):
        # The index (projecting state and message_sent) shows a record that no longer
        # waits for its message: never sent again, and taken out so that it stops
        # taking a place in every sweep's page.
        if dry_run:
            return None, 0
        cleared = yield from _clear_entry(req, seen, age, wall_now)
        if isinstance(cleared, Stranded):
            return cleared, 0
        if cleared is None:
            return None, 0  # it had left the index already
        seen = cleared  # it waits after all (the index's copy was behind): send it
    if dry_run:
        return Stranded(
            seen.job_id, seen.job_class, age, StrandedVerdict.WOULD_RESEND, seen.send_id
        ), 1
    took = yield from call(
        req.take_send(seen.job_id, seen_send_id=seen.send_id, new_send_id=new_id, wall_now=wall_now)
    )
    if isinstance(took, Err):
        if took.kind is ErrorKind.CONDITION_FAILED:
            # Sent, claimed, or taken over by another sender since the index saw it.
            now = _parsed_or_none(req, took.item)
            if now is not None and now.unsent_since is not None and not awaits_send(now):
                cleared = yield from _clear_entry(req, now, age, wall_now)
                if isinstance(cleared, Stranded):
                    return cleared, 0
            return Stranded(
                seen.job_id, seen.job_class, age, StrandedVerdict.MOVED, seen.send_id
            ), 1
        why = f"{took.code or took.kind}: {took.message}"
        return Stranded(
            seen.job_id, seen.job_class, age, StrandedVerdict.FAILED, seen.send_id, why
        ), 1
    try:
        job = req.parse(took.response.get("Attributes", {}))
    except RecordUnreadable as exc:  # turned unreadable since the index saw it
        return (yield from _unreadable_stranded(exc)), 0
    yield from emit(
        "job_send_taken",
        job_id=job.job_id,
        send_id=new_id,
        previous_send_id=seen.send_id,
        unsent_for=age,
        by="sweep",
    )
    sent = yield from send_record_message(
        req,
        job,
        queue_url=home_queue(job, queue_url, interactive_url),
        send_id=new_id,
        wall_now=wall_now,
    )
    if sent.verdict is SendVerdict.FAILED:
        err = sent.error
        why = f"{err.code or err.kind}: {err.message}" if err else "send failed"
        return Stranded(job.job_id, job.job_class, age, StrandedVerdict.FAILED, new_id, why), 1
    return Stranded(job.job_id, job.job_class, age, StrandedVerdict.RESENT, new_id), 1


def _parsed_or_none(req: JobRequests, item: Mapping[str, Any] | None) -> JobView | None:
    if not item:
        return None
    try:
        return req.parse(item)
    except RecordUnreadable:
        return None


def _clear_entry(
    req: JobRequests, job: JobView, age: float, wall_now: float
) -> Flow[Stranded | JobView | None]:
    """Take a dead entry out of the index: what was done (``cleared``, or ``failed``:
    the next sweep tries again and reads past it meanwhile), else the record as it
    is when it was refused: one that waits for its message after all (the index's
    copy was behind, or a retry revived it: the caller sends it), or None (it left
    the index already)."""
    out = yield from call(req.leave_unsent(job.job_id, wall_now))
    if isinstance(out, Ok):
        yield from emit("unsent_entry_cleared", job_id=job.job_id, state=job.state.value)
        return Stranded(job.job_id, job.job_class, age, StrandedVerdict.CLEARED, job.send_id)
    if out.kind is not ErrorKind.CONDITION_FAILED:
        why = f"taking the entry out of the unsent index: {out.code or out.kind}: {out.message}"
        return Stranded(job.job_id, job.job_class, age, StrandedVerdict.FAILED, job.send_id, why)
    now = _parsed_or_none(req, out.item)
    return now if now is not None and awaits_send(now) else None


def _unreadable_stranded(exc: RecordUnreadable) -> Flow[Stranded]:
    """A stranded record this version cannot read is its own job's problem: the sweep
    reports it (``failed``, naming the record) and goes on with the others, as the
    heartbeat does with such a record in its round."""
    job_id = exc.job_id or "?"
    yield from emit("job_record_unreadable", job_id=job_id, stage="sweep", reason=str(exc))
    return Stranded(job_id, "?", 0.0, StrandedVerdict.FAILED, None, str(exc)[:300])
