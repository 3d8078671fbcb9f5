"""``sqs-lease receiver mark show|reset``: a fenced receiver's marks from the command line
(the work is in :class:`sqs_lease.receiver.FencedReceiver`)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, NoReturn

import click

from ._cli_out import EXIT_ERROR, EXIT_NOT_FOUND, emit_json, fail, json_option
from ._config import Settings
from ._fence import MAX_TOKEN
from .receiver import FencedReceiver


def _receiver(ctx: click.Context, prefix: str | None) -> FencedReceiver:
    settings = ctx.find_root().obj
    assert isinstance(settings, Settings)
    return FencedReceiver(settings, prefix=prefix)


def _iso(ts: float | None) -> str | None:
    return None if ts is None else datetime.fromtimestamp(float(ts), UTC).isoformat()


def _missing(scope: str, rcv: FencedReceiver) -> NoReturn:
    fail(
        f"no fence mark for scope {scope!r} in {rcv.fences_table}",
        EXIT_NOT_FOUND,
        kind="mark_not_found",
    )


_PREFIX = click.option(
    "--receiver-prefix",
    default=None,
    help="The receiver's table prefix ({prefix}-fences); default: the global --prefix.",
)


@click.group()
def receiver() -> None:
    """Operate a fenced receiver (sqs_lease.receiver): its fence marks."""


@receiver.group()
def mark() -> None:
    """A scope's (job's) fence mark: the highest token the receiver accepted for it."""


@mark.command("show")
@click.argument("scope")
@_PREFIX
@json_option('{"scope", "mark", "updated_at", "expires_at"}; none: the error object, exit 1.')
@click.pass_context
def mark_show(ctx: click.Context, scope: str, receiver_prefix: str | None, as_json: bool) -> None:
    """Show SCOPE's (a job id's) fence mark. Exit 1 when it has none."""
    rcv = _receiver(ctx, receiver_prefix)
    found = rcv.mark(scope)
    if found is None:
        _missing(scope, rcv)
    out: dict[str, Any] = {
        "scope": scope,
        "mark": int(found.token),
        "updated_at": _iso(found.updated_at),
        "expires_at": _iso(found.gc_expires_at),
    }
    if as_json:
        emit_json(out)
        return
    for name, value in out.items():
        click.echo(f"{name}: {'never' if value is None else value}")


@mark.command("reset")
@click.argument("scope")
@click.option(
    "--expect",
    type=click.IntRange(0, MAX_TOKEN),
    required=True,
    help="The mark `mark show` printed: the reset applies only if it is still this.",
)
@click.option(
    "--to",
    "to",
    type=click.IntRange(0, MAX_TOKEN),
    default=None,
    help="The new mark: the job's current token (sqs-lease jobs show), never lower.",
)
@click.option("--delete", is_flag=True, help="Delete the mark instead (the next request sets it).")
@_PREFIX
@json_option('{"scope", "old", "new"} ("new": null when deleted).')
@click.pass_context
def mark_reset(
    ctx: click.Context,
    scope: str,
    expect: int,
    to: int | None,
    delete: bool,
    receiver_prefix: str | None,
    as_json: bool,
) -> None:
    """Set SCOPE's fence mark to --to (or --delete it), if it is still --expect.

    For a mark no owner of the job holds (a caller raised it while fences were
    unsigned, or with a leaked secret): until it is lowered, every owner of the
    job is answered 412. Lowering it admits every owner at or above the new
    mark, so set it to the job's current token. Exit 1 when there is no mark,
    2 when it is no longer --expect (run `mark show` again).
    """
    if (to is None) == (not delete):
        raise click.UsageError("give --to TOKEN or --delete (one of them)")
    rcv = _receiver(ctx, receiver_prefix)
    if rcv.reset_mark(scope, expect=expect, to=to):
        if as_json:
            emit_json({"scope": scope, "old": expect, "new": to})
        else:
            click.echo(f"scope {scope!r}: mark {expect} -> {'deleted' if to is None else to}")
        return
    now = rcv.highest(scope)
    if now is None:
        _missing(scope, rcv)
    fail(
        f"the mark of scope {scope!r} is {now}, not {expect}: nothing changed "
        "(run `sqs-lease receiver mark show` again)",
        EXIT_ERROR,
        kind="mark_changed",
    )
