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
    # Stamped further ahead of this sweeper's clock than the grace (a writer's clock
    # ahead): stamped again on this clock, so a sweep sends it once the grace passes.
    RESTAMPED = "restamped"
    WOULD_RESTAMP = "would_restamp"  # a dry run: it would be stamped again
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

    No decision compares two machines' clocks for long: an entry stamped more than
    ``older_than`` ahead of this sweeper's wall clock was written by a clock ahead
    of it, and would look young until this clock passed the stamp (hours, for a
    clock hours ahead). Its age cannot be told, so it is stamped again on this
    clock (a conditional write on the stamp seen) and a sweep sends it once the
    grace has passed on one clock. Such entries sort last: the pages read past the
    young ones to the index's end, or, when a run's first page does not reach it,
    one query of the entries ahead (:func:`_restamp_ahead`).
    """
    found: list[Stranded] = []
    acted = 0  # entries that count against the limit
    seq = 0  # entries read: the new send ids' numbers
    start: Mapping[str, Any] | None = start_key
    more = False
    last: Mapping[str, Any] | None = None  # the last entry read: where a stop resumes
    due_before = wall_now - older_than
    ahead: list[Mapping[str, Any]] = []  # entries stamped past wall_now + older_than
    past_due = False  # a young entry was read: no entry after it is due
    for _page in range(SWEEP_PAGES):
        out = yield from call(req.unsent_query(limit=limit, start=start))
        if isinstance(out, Err):
            if out.kind is ErrorKind.INVALID and "index" in out.message.lower():
                raise ResourceMissing(
                    f"stranded sweep: the jobs table has no {'unsent'!r} index ({out.message}); "
                    "run `sqs-lease tables create` (it adds the index to an existing table)"
                )
            raise fail_call("stranded sweep: query the unsent index", out)
        start = out.response.get("LastEvaluatedKey") or None
        for item in out.response.get("Items", []):
            since = _stamp(item)
            if since is not None and since > due_before:
                past_due = True  # (the index is in stamp order: all after are young too)
                if since > wall_now + older_than:
                    ahead.append(item)
                continue
            if acted >= limit:
                more = True
                continue  # not acted on: the page is read on only for entries ahead
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
        if past_due or start is None:
            break
    else:
        more = start is not None
    next_key = _index_key(last) if more and last is not None else (start if more else None)
    if start_key is None or ahead:
        # The entries ahead this run read, and, when it did not read to the index's
        # end, those it could not reach (one query, on a run's first page only).
        found += yield from _restamp_ahead(
            req,
            ahead,
            wall_now=wall_now,
            older_than=older_than,
            limit=limit,
            dry_run=dry_run,
            query=start_key is None and start is not None,
        )
    report = SweepReport(tuple(found), more=more, next_key=next_key)
    if found:
        tallied = (
            StrandedVerdict.RESENT,
            StrandedVerdict.MOVED,
            StrandedVerdict.CLEARED,
            StrandedVerdict.RESTAMPED,
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


def _stamp(item: Mapping[str, Any]) -> float | None:
    """An index entry's ``unsent_since`` (its sort key), None if it has none readable."""
    try:
        return float(item["unsent_since"]["N"])
    except (KeyError, TypeError, ValueError):
        return None


def _restamp_ahead(
    req: JobRequests,
    seen_ahead: list[Mapping[str, Any]],
    *,
    wall_now: float,
    older_than: float,
    limit: int,
    dry_run: bool,
    query: bool,
) -> Flow[list[Stranded]]:
    """Entries stamped more than ``older_than`` ahead of ``wall_now`` (those read, and
    with ``query`` those a query of the index's far end finds), stamped again on this
    clock, at most ``limit``. Never raises: a failed query is journaled and the next
    sweep looks again; a refused restamp means the entry moved on."""
    items = list(seen_ahead)
    if query:
        out = yield from call(req.unsent_ahead_query(newer_than=wall_now + older_than, limit=limit))
        if isinstance(out, Err):
            yield from emit(
                "unsent_restamp_failed", error_code=out.code or out.kind.value, reason=out.message
            )
        else:
            known = {_index_key(i).get("job_id", {}).get("S") for i in items}
            items += [i for i in out.response.get("Items", []) if i["job_id"]["S"] not in known]
    done: list[Stranded] = []
    for item in items[:limit]:
        try:
            seen = req.parse(item)
        except RecordUnreadable as exc:
            done.append((yield from _unreadable_stranded(exc)))
            continue
        if not awaits_send(seen):
            # A dead entry would take a place in every such page: out of the index.
            cleared = None if dry_run else (yield from _clear_entry(req, seen, 0.0, wall_now))
            if isinstance(cleared, Stranded):
                done.append(cleared)
            if not isinstance(cleared, JobView):
                continue
            seen = cleared  # it waits after all (the index's copy was behind)
        if seen.unsent_since is None or seen.unsent_since <= wall_now + older_than:
            continue  # stamped again since: a sweep finds it when it is due
        ahead = round(seen.unsent_since - wall_now, 3)
        verdict = StrandedVerdict.WOULD_RESTAMP if dry_run else StrandedVerdict.RESTAMPED
        if not dry_run:
            stamped = yield from call(
                req.restamp_unsent(
                    seen.job_id,
                    seen_send_id=seen.send_id,
                    seen_since=seen.unsent_since,
                    wall_now=wall_now,
                )
            )
            if isinstance(stamped, Err):
                if stamped.kind is ErrorKind.CONDITION_FAILED:
                    continue  # sent, claimed or taken over since the index saw it
                verdict = StrandedVerdict.FAILED
                why = f"stamping it again: {stamped.code or stamped.kind}: {stamped.message}"
                done.append(
                    Stranded(seen.job_id, seen.job_class, -ahead, verdict, seen.send_id, why)
                )
                continue
            yield from emit(
                "unsent_restamped", job_id=seen.job_id, send_id=seen.send_id, ahead_by=ahead
            )
        done.append(Stranded(seen.job_id, seen.job_class, -ahead, verdict, seen.send_id))
    return done


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
