"""The worker's sweep runs: one bounded stranded-record sweep
(``sweep_once_flow``, over :func:`~sqs_lease._core.sweeping.sweep_flow`) with a
reconciling DLQ receive (:func:`~sqs_lease._core.deadletter.reconcile_dlq_flow`), the
paging sweep of a time budget (``sweep_pages_flow``, the Lambda shell's scheduled
sweep), when the first sweep runs, and the queue's redrive bound (``redrive_rules``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from .calls import Emit, Flow
from .deadletter import DlqReport, DlqVerdict, reconcile_dlq_flow
from .deploy import redrive_too_tight
from .env import AttemptEnv, now_of
from .messages import SQS_BATCH
from .sweeping import StrandedVerdict, SweepReport, sweep_flow
from .texts import outside_text


def first_sweep_wait(interval: float, rand: float) -> float:
    """The wait before a worker's first stranded sweep: a random part of the interval
    spreads the sweeps of workers started together."""
    return interval * (0.5 + 0.5 * rand)


DLQ_SWEEP_RECEIVES = 1
"""DLQ receives (up to 10 messages each) a worker's periodic sweep reconciles: one per
sweep keeps its cost a few calls a minute; ``sqs-lease dlq list --reconcile`` walks
the whole DLQ."""


SWEEP_PAGE_SECONDS = 10.0
"""What a sweep with a time budget (the Lambda shell's scheduled sweep) keeps for one
more page: a query and its re-sends, or one DLQ receive of 10 messages and their
parks. A stranded page after the first starts only while two of these are left (one
for the DLQ's first receive), a DLQ receive after the first while one is left."""

SWEEP_MAX_PAGES = 1000
"""The bound on a paging sweep's stranded pages (its time budget ends it sooner)."""

SCHEDULED_SWEEP_PAGE = 100
"""Stranded records per page of a scheduled sweep (the Lambda shell's)."""

SCHEDULED_DLQ_RECEIVES = 100
"""The bound on a scheduled sweep's DLQ receives (1,000 messages, each held for the
reconciliation's hold, then given back); its time budget ends it sooner."""


@dataclass(frozen=True)
class SweepRun:
    """What one sweep did: stranded records found and sent again over ``pages``
    pages (``more``: it stopped before the index's end: time, the page bound, or a
    failure), and what its DLQ reconciliation parked."""

    resent: int = 0
    found: int = 0
    pages: int = 0
    more: bool = False
    dlq_looked: int = 0
    dlq_parked: int = 0
    dlq_more: bool = False
    failed: tuple[str, ...] = ()  # the events of the parts that failed


def sweep_once_flow(
    env: AttemptEnv,
    *,
    older_than: float,
    limit: int,
    send_id_prefix: str,
) -> Flow[int]:
    """A worker's periodic sweep, the one for every worker shell (sync, async, the
    simulator's): one bounded page of ``limit`` stranded records; how many were sent
    again. Never raises: a failed sweep is journaled (``stranded_sweep_failed``) and
    the next one tries.

    With a DLQ it then reconciles :data:`DLQ_SWEEP_RECEIVES` receives of it (up to 10
    messages each): a job whose current message SQS moved there is parked
    (``job_dead_lettered``), so no record waits ``queued`` or ``running`` for a
    message nothing will run; a failure is journaled (``dlq_reconcile_failed``)."""
    run = yield from sweep_pages_flow(
        env,
        older_than=older_than,
        limit=limit,
        send_id_prefix=send_id_prefix,
        dlq_receives=DLQ_SWEEP_RECEIVES,
    )
    return run.resent


def sweep_pages_flow(
    env: AttemptEnv,
    *,
    older_than: float,
    limit: int,
    send_id_prefix: str,
    dlq_receives: int = 0,
    until: float | None = None,
) -> Flow[SweepRun]:
    """The sweep every shell runs: stranded records, then the DLQ. Never raises.

    ``until`` None: one page of ``limit`` stranded records and ``dlq_receives``
    receives of the DLQ (a worker's periodic sweep, :func:`sweep_once_flow`).
    ``until`` (lease clock, when the caller's time ends: a scheduled Lambda sweep):
    page on through the ``unsent`` index to its end (each page after the last one's
    ``LastEvaluatedKey``, so records it cannot send do not hide the rest), then up
    to ``dlq_receives`` DLQ receives, while :data:`SWEEP_PAGE_SECONDS` allow. The
    first page and the first DLQ receive always run, as a worker's sweep does."""
    resent = found = pages = 0
    more = False
    failed: list[str] = []
    start: Mapping[str, Any] | None = None
    try:
        for page in range(1 if until is None else SWEEP_MAX_PAGES):
            now = yield from now_of(env)
            if until is not None and page > 0 and now.mono + 2 * SWEEP_PAGE_SECONDS > until:
                break  # out of time: more stays as the last page said
            report: SweepReport = yield from sweep_flow(
                env.table,
                queue_url=env.queue_url,
                wall_now=now.wall,
                older_than=older_than,
                limit=limit,
                # Unique per page: a page's new send ids are PREFIX.N.
                send_id_prefix=send_id_prefix if page == 0 else f"{send_id_prefix}p{page}",
                interactive_url=env.interactive_url,
                start_key=start,
            )
            pages += 1
            found += len(report.jobs)
            sent = sum(1 for j in report.jobs if j.verdict is StrandedVerdict.RESENT)
            resent += sent
            env.tally("stranded_resent", sent)
            more, start = report.more, report.next_key
            if start is None:
                break
    except Exception as exc:  # the sweep must never stop the worker
        more = True
        failed.append("stranded_sweep_failed")
        yield Emit(
            "stranded_sweep_failed",
            {"error_code": type(exc).__name__, "reason": outside_text(str(exc))[:300]},
        )
    run = SweepRun(resent=resent, found=found, pages=pages, more=more)
    if dlq_receives > 0 and env.dlq_url:
        receive_until = None if until is None else until - SWEEP_PAGE_SECONDS
        dlq = yield from _reconcile_dlq_once(env, env.dlq_url, dlq_receives, receive_until)
        if dlq is None:
            failed.append("dlq_reconcile_failed")
        else:
            run = replace(
                run,
                dlq_looked=len(dlq.findings),
                dlq_parked=dlq.count(DlqVerdict.PARKED),
                dlq_more=dlq.more,
            )
    return replace(run, failed=tuple(failed))


def _reconcile_dlq_once(
    env: AttemptEnv, dlq_url: str, receives: int, receive_until: float | None = None
) -> Flow[DlqReport | None]:
    try:
        now = yield from now_of(env)
        dlq: DlqReport = yield from reconcile_dlq_flow(
            env.table,
            dlq_url=dlq_url,
            wall_now=now.wall,
            limit=receives * SQS_BATCH,
            receives=receives,
            wait_seconds=0,
            by="sweep",
            receive_until=receive_until,
        )
    except Exception as exc:  # the sweep must never stop the worker
        yield Emit(
            "dlq_reconcile_failed",
            {"error_code": type(exc).__name__, "reason": outside_text(str(exc))[:300]},
        )
        return None
    env.tally("dlq_parked", dlq.count(DlqVerdict.PARKED))
    return dlq


# ----------------------------------------------------------------------------- startup


def redrive_rules(
    max_receives: int | None, most_attempts: int, unknown_class_receives: int
) -> tuple[int, Emit | None]:
    """The queue's redrive against the classes' attempts, at startup: the receives an
    unknown class may have before our DLQ copy, and the warning for a redrive so
    tight that it can move a live job's message to the DLQ."""
    warning: Emit | None = None
    if max_receives is not None and redrive_too_tight(max_receives, most_attempts):
        # Receives that end in no claim (unanswered claims, duplicates) count too:
        # a redrive this tight can move a live job's message to the DLQ and leave
        # its record without a message (found by the simulation, tight_redrive).
        warning = Emit(
            "redrive_too_tight",
            {
                "max_receive_count": max_receives,
                "max_attempts": most_attempts,
                "fix": "raise the queue's maxReceiveCount well above max_attempts "
                "(sqs-lease queue create --max-receives N)",
            },
        )
    # Our DLQ copy (with the reason) must come before SQS's own redrive (without).
    bound = (
        unknown_class_receives
        if max_receives is None
        else max(1, min(unknown_class_receives, max_receives - 1))
    )
    return bound, warning


__all__ = [
    "DLQ_SWEEP_RECEIVES",
    "SCHEDULED_DLQ_RECEIVES",
    "SCHEDULED_SWEEP_PAGE",
    "SWEEP_MAX_PAGES",
    "SWEEP_PAGE_SECONDS",
    "SweepRun",
    "first_sweep_wait",
    "redrive_rules",
    "sweep_once_flow",
    "sweep_pages_flow",
]
