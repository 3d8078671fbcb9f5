"""``sqs-lease jobs list|show|timeline|cancel|resume|retry|repair``: jobs from the
command line (reads in :mod:`sqs_lease._operator`, decisions in :class:`Producer`)."""

from __future__ import annotations

import dataclasses
import getpass
import json
import socket
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeGuard

import click

from ._cli_out import (
    EXIT_ERROR,
    EXIT_NOT_FOUND,
    emit_json,
    fail,
    field,
    iso,
    json_option,
    json_or_text,
    limit_note,
    noop,
    note,
    reason_cell,
    row,
    seconds,
    settings_of,
    table,
)
from ._core.cancelling import CancelVerdict
from ._core.liveness import Liveness
from ._core.messages import UNSENT_GRACE_SECONDS
from ._core.records import TERMINAL_STATES, JobState
from ._core.resuming import ResumeVerdict
from ._core.stages import RetryVerdict, stage_rows
from ._core.sweeping import StrandedVerdict
from ._core.texts import visible
from ._core.timeline import IntentFacts
from ._journal import read_journal
from ._operator import (
    INDEXED_JOB_STATES,
    TIMELINE_INTENTS,
    intent_facts,
    list_jobs,
    read_job,
    workers_liveness,
)
from ._producer import Producer
from ._resources import check_table
from ._schema.models import JOB_LIST_FIELDS, JobRecord
from ._schema.views import record_of, view_of
from ._timeline_view import render_html, render_text, timeline_of

__all__ = ["jobs"]

_TIME_FIELDS = (
    "created_at",
    "updated_at",
    "finished_at",
    "lease_deadline",
    "last_heartbeat",
    "rejected_at",
)


def _job_item(ctx: click.Context, job_id: str) -> dict[str, Any]:
    """The job's record as stored (a consistent read), or exit "not found"."""
    settings = settings_of(ctx)
    check_table(settings)
    item = read_job(settings, job_id)
    if item is None:
        fail(f"no job {job_id!r}", EXIT_NOT_FOUND)
    return item


@dataclasses.dataclass(frozen=True)
class _Alive:
    """What a running job's worker says of it: lease left, heartbeat age, and how known."""

    lease_left: float | None = None  # seconds (JSON numbers; "9.6s" for people)
    heartbeat_age: float | None = None
    liveness: str | None = None  # None: not running; else where the figures came from
    last_heartbeat: float | None = None  # the owner's last round (epoch seconds)

    def cell(self, value: float | None) -> str:
        return "-" if value is None else seconds(value)


def _alive(rec: JobRecord, now: float, live: dict[str, list[Liveness]]) -> _Alive:
    # Advisory only: the lease is SQS's visibility, arbitrated by SQS's clock. The
    # figures come from the owner's liveness record (one write per worker per round).
    if rec.state != "running" or not rec.owner:
        return _Alive()
    parts = live.get(rec.owner)
    if not parts:
        return _Alive(
            liveness=f"none found for worker {rec.owner!r} (not yet written, the worker "
            "stopped long ago, or an older version): lease left and heartbeat age unknown"
        )
    beat_at = max(p.beat_at for p in parts)
    held = next((h for p in parts if (h := p.find(rec.job_id)) is not None), None)
    age = round(now - beat_at, 1)
    if held is None or held.token != rec.token:
        mine = "does not list this job" if held is None else f"lists token {held.token}"
        return _Alive(
            heartbeat_age=age,
            liveness=f"worker {rec.owner!r} beat {seconds(age)} ago; its liveness record "
            f"{mine} (token {rec.token}): lease left unknown",
            last_heartbeat=beat_at,
        )
    round_s = max(p.round_seconds for p in parts)
    return _Alive(
        round(held.lease_deadline - now, 1),
        age,
        f"worker {rec.owner!r}, round of {round_s:.2f}s",
        beat_at,
    )


def _fields(
    rec: JobRecord, now: float, names: Sequence[str], live: dict[str, list[Liveness]]
) -> dict[str, Any]:
    out: dict[str, Any] = {name: getattr(rec, name, None) for name in names}
    alive = _alive(rec, now, live)
    out["lease_left"] = alive.lease_left
    out["heartbeat_age"] = alive.heartbeat_age
    if alive.last_heartbeat is not None:  # one name per fact: the age is of this beat
        out["last_heartbeat"] = alive.last_heartbeat
    if alive.liveness is not None:
        out["liveness"] = alive.liveness
    return out


@click.group()
def jobs() -> None:
    """Inspect and cancel jobs."""


@jobs.command("list")
@click.option(
    "--state",
    type=click.Choice([s.value for s in JobState]),
    default=None,
)
@click.option("--limit", type=click.IntRange(1), default=50, show_default=True)
@click.option(
    "--scan",
    is_flag=True,
    help="Allow a filtered table Scan for a state no index holds (queued, succeeded).",
)
@json_option("One JSON object per line.")
@click.pass_context
def jobs_list(ctx: click.Context, state: str | None, limit: int, scan: bool, as_json: bool) -> None:
    """List jobs; the whole reason, wrapped on a terminal.

    Parked, failed and cancelled jobs come from an index (newest first), running ones from the
    workers' liveness records, no --state from one bounded page of the table; queued
    and succeeded need --scan (no index holds them). When --limit cut the list, a
    note on stderr says so.
    """
    settings = settings_of(ctx)
    check_table(settings)
    if state is not None and state not in INDEXED_JOB_STATES and not scan:
        fail(
            f"jobs list --state {state}: no index holds {state} jobs, so listing them reads "
            "the whole table (a Scan: about 0.5 read units per 4 KB of every record); add "
            "--scan to run it anyway, or list an indexed state "
            f"({', '.join(INDEXED_JOB_STATES)}); `jobs show ID` reads one job",
            EXIT_ERROR,
        )
    records, more = list_jobs(settings, state, limit)
    owners = {r.owner for r in records if r.state == JobState.RUNNING and r.owner}
    live = workers_liveness(settings, owners) if owners else {}
    now = time.time()
    if more:
        limit_note("jobs", limit, "--state")
    if as_json:
        for rec in records:
            click.echo(json.dumps(_fields(rec, now, JOB_LIST_FIELDS, live), default=str))
        return
    rows = [["JOB ID", "CLASS", "STATE", "OWNER", "TOKEN", "ATT", "LEASE", "BEAT", "REASON"]]
    for rec in records:
        alive = _alive(rec, now, live)
        rows.append(
            [
                rec.job_id,
                rec.job_class or "-",
                rec.state or "-",
                rec.owner or "-",
                str(rec.token),
                str(rec.attempt),
                alive.cell(alive.lease_left),
                alive.cell(alive.heartbeat_age),
                reason_cell(rec.reason),
            ]
        )
    click.echo(table(rows))


@jobs.command("timeline")
@click.argument("job_id")
@click.option(
    "--html",
    "html_path",
    type=click.Path(dir_okay=False, writable=True, path_type=Path),
    default=None,
    help="Also write a self-contained page (inline SVG) to FILE, to share in an incident.",
)
@click.option(
    "--journal",
    "journals",
    multiple=True,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="A worker's journal file (JSON lines): adds its lease-lost and ownership-unknown"
    " events for the job. Repeatable.",
)
@click.option(
    "--intents/--no-intents",
    "with_intents",
    default=True,
    show_default=True,
    help="Add the job's intent transitions, read from the intents and attempts tables"
    " (a filtered scan of the intents table: --no-intents skips it on a large one).",
)
@json_option("One JSON object: job_id, state, token, events[].")
@click.pass_context
def jobs_timeline(
    ctx: click.Context,
    job_id: str,
    html_path: Path | None,
    journals: tuple[Path, ...],
    with_intents: bool,
    as_json: bool,
) -> None:
    """Draw who held a job when: owners as lanes, tokens, gaps, refused writes marked.

    The events are kept on the job record by the writes that made them; a refused
    commit rides on the stale worker's record of its rejected result. Lease lost and
    ownership unknown show as the next owner's takeover, and in full with --journal.
    Intent transitions (prepared, started, confirmed, unknown, reconciled) come from
    the intents' own records: their keys and tools, never payloads.
    """
    item = _job_item(ctx, job_id)
    facts: list[IntentFacts] = []
    if with_intents:
        facts, more = intent_facts(settings_of(ctx), job_id)
        if more:
            limit_note("intents of the job", TIMELINE_INTENTS, "--no-intents")
    tl = timeline_of(item, read_journal(*journals), facts)
    if html_path is not None:
        html_path.write_text(render_html(tl), encoding="utf-8")
        note(f"wrote {html_path}")
    if as_json:
        emit_json(tl.as_json())
        return
    click.echo(render_text(tl))


@jobs.command("show")
@click.argument("job_id")
@click.option("--payload", "with_payload", is_flag=True, help="Also print the payload JSON.")
@click.option("--result", "with_result", is_flag=True, help="Also print the result JSON.")
@click.option(
    "--follow",
    is_flag=True,
    help="Watch the job instead: one line each time its state, stage, attempt, owner or "
    "progress changes, until it succeeds, fails or is parked (then the record as without "
    '--follow). A progress of {"done": N, "total": M} is drawn as a bar.',
)
@click.option(
    "--interval",
    type=click.FloatRange(0.2, 300.0),
    default=2.0,
    show_default=True,
    help="With --follow: seconds between reads (one consistent read each).",
)
@json_option("One JSON object (with --follow: one per change, then the record).")
@click.pass_context
def jobs_show(
    ctx: click.Context,
    job_id: str,
    with_payload: bool,
    with_result: bool,
    follow: bool,
    interval: float,
    as_json: bool,
) -> None:
    """Show one job record (the payload only with --payload).

    A running job's lease left and heartbeat age come from its owner's liveness
    record (written once per heartbeat round); ``liveness`` says where they came
    from, or that none was found.
    """
    if follow:
        _follow(ctx, job_id, interval, as_json)
    settings = settings_of(ctx)
    item = _job_item(ctx, job_id)
    rec = record_of(item)
    now = time.time()
    # A staged job's checkpoints and stage input are shown as its stages, not as JSON
    # text; the timeline is drawn by `jobs timeline`; `attention` is the state again
    # (the operators' index key): one name per fact.
    hidden = ("payload", "result", "timeline", "stages", "stage_input", "attention")
    names = [n for n in JobRecord.get_attributes() if n not in hidden]
    names.sort(key=lambda n: (n != "job_id", n))
    live = (
        workers_liveness(settings, [rec.owner])
        if rec.state == JobState.RUNNING and rec.owner
        else {}
    )
    data = _fields(rec, now, names, live)
    data["timeline_events"] = len(rec.timeline or ())  # drawn by `jobs timeline`
    rows = stage_rows(view_of(item))
    if rows:
        data["stages"] = rows
    if with_payload:
        data["payload"] = json_or_text(rec.payload)
    if with_result:
        data["result"] = json_or_text(rec.result)
    if as_json:
        click.echo(json.dumps(data, default=str))
        return
    for name, value in data.items():
        if name == "stages":
            click.echo("stages:")
            for row in value:
                took = "-" if row["duration"] is None else f"{row['duration']:g} s"
                result = "-" if row["result"] is None else _short_json(row["result"])
                field(
                    row["stage"],
                    f"{row['state']}, attempts {row['attempts']}, "
                    f"token {row['token']}, {took}, result {result}",
                    lead="  ",
                )
            continue
        if value is None and name not in _ALWAYS_SHOWN:
            continue  # an empty field says nothing to a person (JSON keeps it, as null)
        if name in ("lease_left", "heartbeat_age") and value is not None:
            value = seconds(value)
        if name in _TIME_FIELDS and value is not None:
            value = f"{value} ({iso(value)})"
        elif name in ("payload", "result") and value is not None:
            value = json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)
            field(name, value, ours=True)
            continue
        field(name, value)


def operator_name() -> str:
    """``user@host`` of whoever runs the command (what an audit of a cancel asks)."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no login name in this container
        user = "unknown-user"
    return f"{user}@{socket.gethostname() or 'unknown-host'}"


WATCHED = ("state", "stage", "attempt", "token", "owner", "progress", "error_code")
"""What ``jobs show --follow`` prints a line for when it changes."""


def _follow(ctx: click.Context, job_id: str, interval: float, as_json: bool) -> None:
    """Poll the job's record until it ends (or is parked); a line per change."""
    last: dict[str, Any] | None = None
    while True:
        rec = record_of(_job_item(ctx, job_id))
        now = time.time()
        seen = {name: getattr(rec, name, None) for name in WATCHED}
        if seen != last:
            if as_json:
                click.echo(json.dumps({"ts": round(now, 3), "job_id": job_id, **seen}, default=str))
            else:
                click.echo(follow_line(now, seen))
            last = seen
        if rec.state in (*TERMINAL_STATES, JobState.PARKED):
            return
        _pause(interval)


_pause = time.sleep  # (a test paces the follow by its pauses)


def follow_line(now: float, seen: dict[str, Any]) -> str:
    """One ``--follow`` line: the time, then each watched field that has a value."""
    clock = time.strftime("%H:%M:%S", time.localtime(now))
    parts = [clock] + [
        f"{name}={visible(str(value))}"
        for name, value in seen.items()
        if value is not None and name != "progress"
    ]
    bar = progress_bar(seen.get("progress"))
    if bar:
        parts.append(bar)
    elif seen.get("progress") is not None:
        parts.append(f"progress={visible(_short_json(json_or_text(seen['progress']), 60))}")
    return "  ".join(parts)


def progress_bar(progress: Any, width: int = 20) -> str | None:
    """A bar for a progress hint that says how far: ``{"done": N, "total": M}``
    (numbers, M > 0); None for any other hint (it is shown as JSON)."""
    hint = json_or_text(progress) if isinstance(progress, str) else progress
    if not isinstance(hint, dict):
        return None
    done, total = hint.get("done"), hint.get("total")
    if not (_number(done) and _number(total)) or total <= 0:
        return None
    share = min(1.0, max(0.0, float(done) / float(total)))
    filled = round(share * width)
    return f"[{'#' * filled}{'-' * (width - filled)}] {share:.0%} ({done:g} of {total:g})"


def _number(value: Any) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool)


_ALWAYS_SHOWN = frozenset({"job_id", "state", "owner", "reason"})
"""Fields ``jobs show`` prints even empty (``-``): a person asks about them by name."""


def _short_json(value: Any, limit: int = 120) -> str:
    text = json.dumps(value, sort_keys=True, ensure_ascii=False)
    return text if len(text) <= limit else text[: limit - 3] + "..."


@jobs.command("cancel")
@click.argument("job_id", required=False)
@click.option("--group", default=None, help="Cancel every job of this agent session instead.")
@click.option(
    "--reason",
    default=None,
    help="Why, kept on the record. Default: who cancelled it and when "
    "('cancelled by USER@HOST at TIME with sqs-lease jobs cancel').",
)
@json_option()
@click.pass_context
def jobs_cancel(
    ctx: click.Context, job_id: str | None, group: str | None, reason: str | None, as_json: bool
) -> None:
    """End a job (or with --group, every open job of a session) failed (cancelled);
    owners lose their leases at their next heartbeat, and a cancelled session
    takes no new submits.

    A job already final (succeeded, failed or cancelled before) is left as it is:
    the command says "nothing to do" and exits 3.
    """
    if (job_id is None) == (group is None):
        raise click.UsageError("name a JOB_ID or --group ID (one of them)")
    if reason is None:
        reason = f"cancelled by {operator_name()} at {iso(time.time())} with sqs-lease jobs cancel"
    if group is not None:
        rep = Producer(settings_of(ctx)).cancel_group(group, reason)
        if as_json:
            emit_json(
                {
                    "group": rep.group,
                    "cancelled": list(rep.cancelled),
                    "finished": [{"job_id": j, "state": e} for j, e in rep.finished],
                    "jobs": rep.jobs,
                    "missing": rep.missing,
                    "reason": rep.reason,
                }
            )
        else:
            for jid in rep.cancelled:
                row(jid, "cancelled")
            for jid, ended in rep.finished:
                row(jid, f"already {ended}")
            click.echo(
                f"group {visible(rep.group)}: {len(rep.cancelled)} cancelled, "
                f"{len(rep.finished)} already finished, of {rep.jobs} submitted "
                f"({visible(rep.reason)})"
            )
        if rep.missing:
            fail(f"{rep.missing} job(s) of the group not yet in its index: run it again", 1)
        return
    done = Producer(settings_of(ctx)).cancel_job(job_id or "", reason)
    view = done.job
    data = {
        "job_id": view.job_id,
        "verdict": done.verdict.value,
        "state": view.state.value,
        "token": view.token,
        "error_code": view.error_code,
        "reason": view.reason,
    }
    if done.verdict is CancelVerdict.ALREADY_FINAL:
        why = f" ({view.reason})" if view.reason else ""
        noop(
            f"job {job_id!r} is already {view.state.value}{why}: not cancelled",
            as_json=as_json,
            data=data,
        )
    if as_json:
        emit_json(data)
        return
    row(view.job_id, view.state, f"token {view.token}", view.error_code or "-", view.reason or "-")


@jobs.command("resume")
@click.argument("job_id")
@json_option()
@click.pass_context
def jobs_resume(ctx: click.Context, job_id: str, as_json: bool) -> None:
    """Re-enqueue a parked job once you have decided (see docs/operations.md).

    The resume grants the attempt it starts (granted_attempts, shown by `jobs
    show`). Safe to repeat: a job left queued without a sent message is sent again.
    A job neither parked nor unsent is left alone: "nothing to do", exit 3.
    """
    resumed = Producer(settings_of(ctx)).resume(job_id)
    data = {
        "job_id": job_id,
        "verdict": resumed.verdict.value,
        "state": resumed.state.value,
        "note": resumed.note,
        "send_id": resumed.send_id,
        "message_id": resumed.message_id,
    }
    if resumed.verdict is ResumeVerdict.NOT_PARKED:
        noop(
            f"job {job_id!r} is {resumed.state.value}, not parked, and its message is sent: "
            "nothing to resume",
            as_json=as_json,
            data=data,
        )
    if as_json:
        emit_json(data)
        return
    row(job_id, "queued", resumed.note)


@jobs.command("retry")
@click.argument("job_id")
@click.option(
    "--stage",
    default=None,
    help="The stage to retry: must be the job's failed (current) stage; a committed "
    "stage is refused (it runs once per job).",
)
@json_option()
@click.pass_context
def jobs_retry(ctx: click.Context, job_id: str, stage: str | None, as_json: bool) -> None:
    """Run a failed (or parked) job again from where it ended (see docs/stages.md).

    A staged job goes on at its failed stage with a fresh count of attempts; the
    stages committed before it keep their checkpoints and are not run again. The
    write is conditional on the state and token read: a second retry of the same
    failure does nothing ("nothing to do", exit 3). A cancelled job is refused.
    """
    retried = Producer(settings_of(ctx)).retry(job_id, stage)
    data = {
        "job_id": job_id,
        "verdict": retried.verdict.value,
        "state": retried.state.value,
        "stage": retried.stage,
        "committed_stages": list(retried.kept),
        "note": retried.note,
        "send_id": retried.send_id,
        "message_id": retried.message_id,
    }
    if retried.verdict is RetryVerdict.NOTHING_TO_DO:
        noop(f"job {job_id!r}: {retried.note}", as_json=as_json, data=data)
    if as_json:
        emit_json(data)
        return
    row(job_id, "queued", retried.note)


_STRANDED_SAID = {
    StrandedVerdict.RESENT: "sent again",
    StrandedVerdict.WOULD_RESEND: "would send again",
    StrandedVerdict.MOVED: "skipped: sent, claimed or taken over meanwhile",
    StrandedVerdict.CLEARED: "taken out of the unsent index: it no longer waits for a message",
    StrandedVerdict.RESTAMPED: "stamped ahead of this clock (a writer's clock ahead?): "
    "stamped again here, sent by a sweep after the grace",
    StrandedVerdict.WOULD_RESTAMP: "stamped ahead of this clock: would be stamped again here",
    StrandedVerdict.FAILED: "failed",  # and the detail
}


@jobs.command("repair")
@click.option(
    "--older-than",
    type=click.FloatRange(0),
    default=UNSENT_GRACE_SECONDS,
    show_default=True,
    help="Only records without a sent message for this many seconds.",
)
@click.option("--limit", type=click.IntRange(1, 1000), default=100, show_default=True)
@click.option("--dry-run", is_flag=True, help="Only list what would be sent again.")
@json_option()
@click.pass_context
def jobs_repair(
    ctx: click.Context, older_than: float, limit: int, dry_run: bool, as_json: bool
) -> None:
    """Send again jobs stranded without a message (a producer died between its
    write and its send, a resume whose send failed). Queries a sparse index."""
    settings = settings_of(ctx)
    check_table(settings)
    report = Producer(settings).repair(older_than=older_than, limit=limit, dry_run=dry_run)
    resent = sum(1 for j in report.jobs if j.verdict is StrandedVerdict.RESENT)
    failed = sum(1 for j in report.jobs if j.verdict is StrandedVerdict.FAILED)
    if as_json:
        emit_json(
            {
                "dry_run": dry_run,
                "more": report.more,
                "jobs": [
                    {
                        "job_id": j.job_id,
                        "job_class": j.job_class,
                        "unsent_for": round(j.unsent_for, 3),
                        "verdict": j.verdict.value,
                        "detail": j.detail,
                    }
                    for j in report.jobs
                ],
            }
        )
        if failed:
            raise click.exceptions.Exit(EXIT_NOT_FOUND)
        return
    for job in report.jobs:
        what = _STRANDED_SAID[job.verdict]
        if job.verdict is StrandedVerdict.FAILED:
            what += f": {job.detail}"
        row(job.job_id, job.job_class, f"unsent for {seconds(job.unsent_for)}", what)
    if dry_run:
        summary = f"{len(report.jobs)} stranded (dry run: nothing sent)"
    else:
        summary = f"{len(report.jobs)} stranded, {resent} sent again"
        summary += f", {failed} failed" if failed else ""
    if report.more:
        summary += f"; --limit {limit} reached: run again for more"
    click.echo(summary)
    if failed:
        raise click.exceptions.Exit(EXIT_NOT_FOUND)
