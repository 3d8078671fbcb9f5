"""``sqs-lease dlq list|show|redrive|delete``: the dead-letter queue from the command line
(the work is in :mod:`sqs_lease._dlq`)."""

from __future__ import annotations

import json
import time
from typing import Any

import click

from ._cli_out import (
    EXIT_NOT_FOUND,
    emit_json,
    fail,
    field,
    json_option,
    note,
    row,
    settings_of,
    table,
)
from ._config import Settings
from ._core.deadletter import DlqFinding, DlqReport, DlqVerdict
from ._core.inputs import loads as _loads
from ._dlq import (
    DlqMessage,
    RedriveVerdict,
    age,
    approximate_depth,
    delete_from_dlq,
    dlq_url_of,
    find_in_dlq,
    peek_dlq,
    reconcile_dlq,
    redrive_dlq,
)


def _fields(msg: DlqMessage, *, body: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {
        "message_id": msg.message_id,
        # A worker's copy: the id its journal gave the message (message_poisoned).
        "source_message_id": msg.source_message_id,
        "job_id": msg.job_id,
        "job_class": msg.job_class,
        "send_id": msg.send_id,
        "reason": msg.reason,
        "receive_count": msg.receive_count,
        "sent_at": msg.sent_at,
        "is_job_message": msg.is_job_message,
    }
    if body:
        out["body"] = msg.body
    return out


@click.group()
def dlq() -> None:
    """Look at the dead-letter queue and move its messages back to the job queue."""


@dlq.command("list")
@click.option("--limit", type=click.IntRange(1, 1000), default=50, show_default=True)
@click.option(
    "--reconcile",
    is_flag=True,
    help="Also settle each message's job: park a job still queued or running on a "
    "message SQS moved here (its record says why); report finished jobs' messages.",
)
@click.option(
    "--delete-finished",
    is_flag=True,
    help="With --reconcile: delete the messages of jobs that have finished.",
)
@click.option("--dry-run", is_flag=True, help="With --reconcile: only say what it would do.")
@json_option("One JSON object per message, one per line (no bodies).")
@click.pass_context
def dlq_list(
    ctx: click.Context,
    limit: int,
    reconcile: bool,
    delete_finished: bool,
    dry_run: bool,
    as_json: bool,
) -> None:
    """List DLQ messages: the job each names and why it is there (never bodies).

    SQS shows a message only by receiving it: each is hidden for a moment while
    the list is made, and made visible again before the command ends. So RECEIVES
    (SQS's ApproximateReceiveCount) counts every receive: the job queue's, and each
    look at the DLQ, this one included.

    With --reconcile each message's job record is read too. A job still `queued` or
    `running` whose current message is here would wait forever (nothing runs a DLQ
    message): it is parked, with a reason naming the DLQ and the receive count, by a
    write that holds only while the record still names this message (a job re-sent
    since is left alone). Exit 1 if a park or delete failed.
    """
    settings = settings_of(ctx)
    if (delete_finished or dry_run) and not reconcile:
        raise click.UsageError("--delete-finished and --dry-run go with --reconcile")
    if reconcile:
        report = reconcile_dlq(
            settings, limit=limit, delete_finished=delete_finished, dry_run=dry_run
        )
        _reconciled(settings, report, limit, as_json)
        return
    found, more = peek_dlq(settings, limit=limit)
    if more:
        _, url = dlq_url_of(settings)
        note(
            f"--limit {limit} reached: the DLQ holds more (about "
            f"{approximate_depth(settings, url)} in all); raise --limit (up to 1000)"
        )
    if as_json:
        for msg in found:
            emit_json(_fields(msg))
        return
    now = time.time()
    rows = [["MESSAGE ID", "JOB", "CLASS", "AGE", "RECEIVES", "REASON"]]
    for msg in found:
        rows.append(
            [
                msg.message_id,
                msg.job_id or "-",
                msg.job_class or "-",
                age(msg.sent_at, now),
                str(msg.receive_count),
                msg.reason,
            ]
        )
    click.echo(table(rows))


_VERDICT_SAID = {
    DlqVerdict.PARKED: "job parked",
    DlqVerdict.WOULD_PARK: "would park the job",
    DlqVerdict.ALREADY_PARKED: "job already parked: left",
    DlqVerdict.FINISHED: "job finished: message left (--delete-finished deletes it)",
    DlqVerdict.DELETED: "job finished: message deleted",
    DlqVerdict.WOULD_DELETE: "job finished: would delete the message",
    DlqVerdict.SUPERSEDED: "job re-sent since: left",
    DlqVerdict.NO_RECORD: "no such job: left",
    DlqVerdict.CLASS_MISMATCH: "message names another class: left",
    DlqVerdict.NOT_A_JOB: "not a job message: left",
    DlqVerdict.UNREADABLE: "job record unreadable: left",
    DlqVerdict.FAILED: "FAILED",
}


def _finding_fields(f: DlqFinding) -> dict[str, Any]:
    m = f.message
    return {
        "message_id": m.message_id,
        "job_id": m.job_id,
        "job_class": m.job_class,
        "send_id": m.send_id,
        "reason": m.reason,
        "receive_count": m.receive_count,
        "sent_at": m.sent_wall,
        "is_job_message": f.verdict is not DlqVerdict.NOT_A_JOB,
        "verdict": f.verdict.value,
        "job_state": f.job_state.value if f.job_state is not None else None,
        "token": f.token,
        "detail": f.detail,
    }


def _reconciled(settings: Settings, report: DlqReport, limit: int, as_json: bool) -> None:
    if report.more:
        note(
            f"--limit {limit} reached: the DLQ holds more (about "
            f"{approximate_depth(settings, report.dlq_url)} in all); run again, or raise "
            "--limit (up to 1000)"
        )
    if as_json:
        for f in report.findings:
            emit_json(_finding_fields(f))
    else:
        now = time.time()
        rows = [["MESSAGE ID", "JOB", "CLASS", "AGE", "RECEIVES", "JOB STATE", "RECONCILED"]]
        for f in report.findings:
            said = _VERDICT_SAID[f.verdict]
            if f.detail and f.verdict is not DlqVerdict.PARKED:
                said += f" ({f.detail})"
            rows.append(
                [
                    f.message.message_id,
                    f.message.job_id or "-",
                    f.message.job_class or "-",
                    age(f.message.sent_wall, now),
                    str(f.message.receive_count),
                    f.job_state.value if f.job_state is not None else "-",
                    said,
                ]
            )
        click.echo(table(rows))
        c = report.count
        if any(
            f.verdict in (DlqVerdict.WOULD_PARK, DlqVerdict.WOULD_DELETE) for f in report.findings
        ):
            summary = (
                f"{len(report.findings)} messages: {c(DlqVerdict.WOULD_PARK)} jobs would be "
                f"parked, {c(DlqVerdict.WOULD_DELETE)} messages deleted (dry run: nothing changed)"
            )
        else:
            summary = (
                f"{len(report.findings)} messages: {c(DlqVerdict.PARKED)} jobs parked, "
                f"{c(DlqVerdict.DELETED)} messages deleted"
            )
            summary += f", {c(DlqVerdict.FAILED)} failed" if c(DlqVerdict.FAILED) else ""
        click.echo(summary)
    if report.count(DlqVerdict.FAILED):
        raise click.exceptions.Exit(EXIT_NOT_FOUND)


_scan_option = click.option(
    "--scan",
    type=click.IntRange(1, 10_000),
    default=1000,
    show_default=True,
    help="Look at up to this many DLQ messages to find it.",
)


@dlq.command("show")
@click.argument("ident", metavar="MESSAGE_ID|JOB_ID")
@_scan_option
@json_option('{"messages": [...]}, each with its body.')
@click.pass_context
def dlq_show(ctx: click.Context, ident: str, scan: int, as_json: bool) -> None:
    """Show the DLQ message with this message id, or every one naming this job id,
    with its body. Exit 1 when none is found."""
    found = find_in_dlq(settings_of(ctx), ident, scan=scan)
    if not found:
        fail(
            f"no DLQ message with message id or job id {ident!r} (in the first {scan} looked at)",
            EXIT_NOT_FOUND,
            kind="message_not_found",
        )
    if as_json:
        emit_json({"messages": [_fields(m, body=True) for m in found]})
        return
    for i, msg in enumerate(found):
        if i:
            click.echo("")
        for name, value in _fields(msg, body=True).items():
            field(name, _pretty(str(value)) if name == "body" else value)


def _pretty(body: str) -> str:
    try:
        return json.dumps(_loads(body), sort_keys=True, ensure_ascii=False)
    except ValueError:
        return body


_SAID = {
    RedriveVerdict.MOVED: "moved to the job queue",
    RedriveVerdict.WOULD_MOVE: "would move to the job queue",
    RedriveVerdict.COPIED_NOT_DELETED: "copied to the job queue; DLQ copy kept",
    RedriveVerdict.FAILED: "failed",
    RedriveVerdict.SKIPPED: "skipped",
}


@dlq.command("redrive")
@click.option(
    "--job",
    "job_ids",
    multiple=True,
    help="Only messages of this job (repeat for several); default: every job message.",
)
@click.option("--limit", type=click.IntRange(1, 1000), default=100, show_default=True)
@click.option("--dry-run", is_flag=True, help="Only list what would move.")
@json_option()
@click.pass_context
def dlq_redrive(
    ctx: click.Context, job_ids: tuple[str, ...], limit: int, dry_run: bool, as_json: bool
) -> None:
    """Move DLQ messages back to the job queue (after you fixed why they failed).

    Each message is sent to the job queue, then deleted from the DLQ only if that
    send succeeded: a message is never lost, at worst sent twice (harmless: a job
    claims once). Messages that name no job stay. Exit 1 if any move failed.
    """
    report = redrive_dlq(settings_of(ctx), job_ids=job_ids or None, limit=limit, dry_run=dry_run)
    failed = sum(1 for r in report.messages if r.verdict is RedriveVerdict.FAILED)
    if as_json:
        emit_json(
            {
                "queue": report.queue_url,
                "dlq": report.dlq_url,
                "dry_run": dry_run,
                "more": report.more,
                "messages": [
                    {
                        "message_id": r.message.message_id,
                        "job_id": r.message.job_id,
                        "verdict": r.verdict.value,
                        "detail": r.detail,
                        "new_message_id": r.new_message_id,
                    }
                    for r in report.messages
                ],
            }
        )
    else:
        for r in report.messages:
            said = _SAID[r.verdict] + (f": {r.detail}" if r.detail else "")
            row(r.message.message_id, r.message.job_id or "-", said)
        # The dry run counts what the real run would move, by the same verdicts: a
        # message that is not a job's is skipped by both.
        counts = {v: sum(1 for r in report.messages if r.verdict is v) for v in RedriveVerdict}
        skipped = counts[RedriveVerdict.SKIPPED]
        if dry_run:
            summary = f"{counts[RedriveVerdict.WOULD_MOVE]} would move"
        else:
            moved = counts[RedriveVerdict.MOVED] + counts[RedriveVerdict.COPIED_NOT_DELETED]
            summary = f"{moved} moved back to the job queue (sent, then deleted from the DLQ)"
            summary += f", {failed} failed" if failed else ""
        summary += f", {skipped} skipped (not job messages: left)" if skipped else ""
        click.echo(summary + (" (dry run: nothing sent)" if dry_run else ""))
    if report.more:
        note(f"--limit {limit} reached: the DLQ holds more; run again to move them")
    if failed:
        raise click.exceptions.Exit(EXIT_NOT_FOUND)


@dlq.command("delete")
@click.argument("ident", metavar="MESSAGE_ID|JOB_ID")
@_scan_option
@click.option("--yes", "-y", is_flag=True, help="Delete without asking.")
@json_option('{"deleted": [...], "failed": [...]}: message ids (with --yes, or answer y).')
@click.pass_context
def dlq_delete(ctx: click.Context, ident: str, scan: int, yes: bool, as_json: bool) -> None:
    """Delete the DLQ message with this message id, or every one naming this job id,
    for good (a message no job will ever need: junk, a test's leftovers). Shows what
    it found and asks first (on stderr) unless --yes. Exit 1 when none is found, when
    the answer is no, or when a delete failed."""

    def ask(found: list[DlqMessage]) -> bool:
        if yes:
            return True
        for msg in found:
            click.echo(f"{msg.message_id}  {msg.job_id or '-'}  {msg.reason}", err=True)
        return click.confirm(
            f"Delete {len(found)} DLQ message(s) for good?", default=False, err=True
        )

    found, done = delete_from_dlq(settings_of(ctx), ident, scan=scan, confirm=ask)
    if not found:
        fail(
            f"no DLQ message with message id or job id {ident!r} (in the first {scan} looked at)",
            EXIT_NOT_FOUND,
            kind="message_not_found",
        )
    if done is None:
        fail(
            "not confirmed: nothing deleted (the messages are back in the DLQ)",
            EXIT_NOT_FOUND,
            kind="not_confirmed",
        )
    failed = [d for d in done if d.error is not None]
    if as_json:
        emit_json(
            {
                "deleted": [d.message.message_id for d in done if d.error is None],
                "failed": [{"message_id": d.message.message_id, "error": d.error} for d in failed],
            }
        )
    else:
        for d in done:
            row(d.message.message_id, d.message.job_id or "-", d.error or "deleted")
    if failed:
        raise click.exceptions.Exit(EXIT_NOT_FOUND)
