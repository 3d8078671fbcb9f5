"""``sqs-lease intents list|show|resolve``: side-effect intents from the command line
(the reads and the decision are in :mod:`sqs_lease._operator`)."""

from __future__ import annotations

import getpass
import json
import socket
import time
from typing import Any

import click

from ._cli_out import (
    EXIT_ERROR,
    EXIT_NOT_FOUND,
    age,
    emit_json,
    fail,
    field,
    iso,
    json_option,
    json_or_text,
    limit_note,
    noop,
    reason_cell,
    row,
    seconds,
    settings_of,
    table,
)
from ._config import Settings
from ._core.intents import IntentState
from ._core.resolving import Resolution
from ._core.retention import Unprotected, repeat_unprotected
from ._errors import IntentNotAmbiguous
from ._journal import configure_stderr
from ._operator import attempts_of, intent_filter_indexed, list_intents, read_intent, resolve_intent
from ._resources import check_table
from ._schema.models import INTENT_LIST_FIELDS, AttemptRecord, IntentRecord

__all__ = ["intents"]

_INTENT_TIME_FIELDS = (
    "created_at",
    "updated_at",
    "first_started_at",
    "confirmed_at",
    "resolved_at",
)
_RESOLUTION_FIELDS = ("resolution", "resolved_by", "resolved_at", "resolution_reason")
_ATTEMPT_FIELDS = (
    "attempt",
    "token",
    "worker",
    "tool",
    "action",
    "payload_hash",
    "started_at",
    "ended_at",
    "duration",
    "outcome",
    "success",
    "error",
    "external_id",
    "response",
)


def _intent_row(rec: IntentRecord, now: float) -> dict[str, Any]:
    out: dict[str, Any] = {name: getattr(rec, name, None) for name in INTENT_LIST_FIELDS}
    out["updated_age"] = age(now, rec.updated_at)
    return out


@click.group()
def intents() -> None:
    """Inspect side-effect intents and resolve ambiguous ones."""


@intents.command("list")
@click.option("--state", type=click.Choice([s.value for s in IntentState]), default=None)
@click.option("--job", "job_id", default=None, help="Only this job's intents.")
@click.option("--limit", type=click.IntRange(1), default=50, show_default=True)
@click.option(
    "--scan", is_flag=True, help="Allow a filtered table Scan for a filter no index holds."
)
@json_option("One JSON object per line.")
@click.pass_context
def intents_list(
    ctx: click.Context,
    state: str | None,
    job_id: str | None,
    limit: int,
    scan: bool,
    as_json: bool,
) -> None:
    """List intents (never payloads): ambiguous ones from an index, no filter from one
    bounded page; other filters need --scan. A note says when --limit cut the list."""
    settings = settings_of(ctx)
    check_table(settings)
    if not (scan or intent_filter_indexed(state, job_id)):
        what = " ".join(
            part
            for part in (f"--state {state}" if state else "", f"--job {job_id}" if job_id else "")
            if part
        )
        fail(
            f"intents list {what}: no index holds this filter, so listing reads the whole "
            "intents table (a Scan); add --scan to run it anyway, or list --state ambiguous "
            "(indexed); `jobs timeline JOB_ID` and `intents show KEY` read one job or intent",
            EXIT_ERROR,
        )
    records, more = list_intents(settings, state, job_id, limit)
    now = time.time()
    if more:
        limit_note("intents", limit, "--state or --job")
    if as_json:
        for rec in records:
            click.echo(json.dumps(_intent_row(rec, now), default=str))
        return
    rows = [
        [
            "KEY",
            "JOB",
            "ACTION",
            "TARGET",
            "STATE",
            "ATT",
            "TOKEN",
            "EXTERNAL ID",
            "UPDATED",
            "REASON",
        ]
    ]
    for rec in records:
        rows.append(
            [
                rec.intent_key,
                rec.job_id or "-",
                rec.action or "-",
                rec.target or "-",
                rec.state or "-",
                str(rec.attempts),
                str(rec.last_token),
                rec.external_id or "-",
                age(now, rec.updated_at),
                reason_cell(rec.reason),
            ]
        )
    click.echo(table(rows))


def _attempt_fields(rec: AttemptRecord) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in _ATTEMPT_FIELDS:
        if name == "duration":
            out[name] = (
                None
                if rec.ended_at is None or rec.started_at is None
                else round(rec.ended_at - rec.started_at, 3)
            )
        elif name == "response":
            out[name] = json_or_text(rec.response)
        else:
            out[name] = getattr(rec, name, None)
    return out


@intents.command("show")
@click.argument("key")
@click.option("--payload", "with_payload", is_flag=True, help="Also print the payload JSON.")
@click.option(
    "--response",
    "with_response",
    is_flag=True,
    help="Also print the response the target returned (kept on the intent for replays).",
)
@json_option("One JSON object.")
@click.pass_context
def intents_show(
    ctx: click.Context, key: str, with_payload: bool, with_response: bool, as_json: bool
) -> None:
    """Show one intent and every attempt of it.

    Bodies only on request: the payload with --payload, the target's response kept
    on the intent with --response. The attempt log holds a response only where the
    target logs bodies (``app.target(..., log_bodies=True)``)."""
    settings = settings_of(ctx)
    check_table(settings)
    rec = read_intent(settings, key)
    if rec is None:
        fail(f"no intent {key!r}", EXIT_NOT_FOUND)
    names = [
        n
        for n in IntentRecord.get_attributes()
        if n not in ("payload", "response") and n not in _RESOLUTION_FIELDS
    ]
    names.sort(key=lambda n: (n != "intent_key", n))
    intent: dict[str, Any] = {name: getattr(rec, name, None) for name in names}
    if with_response:
        intent["response"] = json_or_text(rec.response)
    if rec.resolution is not None:
        intent.update({name: getattr(rec, name, None) for name in _RESOLUTION_FIELDS})
    if with_payload:
        intent["payload"] = json_or_text(rec.payload)
    attempts = [_attempt_fields(a) for a in attempts_of(settings, key)]
    if as_json:
        click.echo(json.dumps({"intent": intent, "attempts": attempts}, default=str))
        return
    for name, value in intent.items():
        field(name, _show_value(name, value), ours=name in _BODIES)
    click.echo(f"attempt log: {len(attempts)}")
    for entry in attempts:
        for i, (name, value) in enumerate(entry.items()):
            if name == "response" and value is None:
                continue  # stored only when the target opts in to bodies
            lead = "- " if i == 0 else "  "
            field(name, _show_value(name, value, indent="  "), lead=lead, ours=name in _BODIES)


_BODIES = ("payload", "response")


def _show_value(name: str, value: Any, indent: str = "") -> str:
    if value is None:
        return "-"
    if name in _INTENT_TIME_FIELDS or name in ("started_at", "ended_at"):
        return f"{value} ({iso(value)})"
    if name == "duration":
        return seconds(value)
    if name in ("payload", "response"):
        text = json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)
        return text.replace("\n", "\n" + indent)
    return str(value)


def _default_who() -> str:
    try:
        user = getpass.getuser()
    except (OSError, KeyError):  # no login name in the environment or the password database
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


@intents.command("resolve")
@click.argument("key")
@click.option(
    "--confirmed",
    "external_id",
    metavar="EXTERNAL_ID",
    default=None,
    help="The effect did apply; record the target's id for it.",
)
@click.option("--retry", is_flag=True, help="The effect did not apply; repeat it (same key).")
@click.option("--abandon", is_flag=True, help="Never do this effect; the job fails at it.")
@click.option(
    "--reason", default=None, help="Why (required with --abandon; default: resolved by operator)."
)
@click.option("--who", default=None, help="Who decides (default: USER@HOST).")
@click.option(
    "--force",
    is_flag=True,
    help="With --retry: repeat even where the target no longer protects the key.",
)
@click.option(
    "--new-operation",
    is_flag=True,
    help="Approve a new, separate operation under a derived key (needs --reason).",
)
@click.option(
    "--attempt",
    type=click.IntRange(min=1),
    default=None,
    help="The intent attempt you decided on (as `intents show` prints it): refused if "
    "the intent has moved on since. Give it when you run a resolve again.",
)
@json_option()
@click.pass_context
def intents_resolve(
    ctx: click.Context,
    key: str,
    external_id: str | None,
    retry: bool,
    abandon: bool,
    reason: str | None,
    who: str | None,
    force: bool,
    new_operation: bool,
    attempt: int | None,
    as_json: bool,
) -> None:
    """Decide an ambiguous intent; its parked job is re-enqueued (journaled on stderr).

    A decision is about one attempt's ambiguity: with --attempt N it is refused
    ("changed meanwhile") if the job ran again since and the intent is now at
    another attempt, so running the same command again never settles a newer
    ambiguity with an older judgement.

    --new-operation approves a new, separate operation: the intent becomes
    `superseded`, its successor key (KEY~op2) is recorded, and the job goes on
    under that key with the same payload (the target sees a new request).
    An intent already settled (confirmed or abandoned) whose job needs nothing more
    is left alone: "nothing to do", exit 3.
    """
    chosen = [external_id is not None, retry, abandon, new_operation]
    if sum(chosen) != 1:
        raise click.UsageError(
            "give exactly one of --confirmed EXTERNAL_ID, --retry, --abandon, --new-operation"
        )
    if new_operation and not (reason and reason.strip()):
        raise click.UsageError("--new-operation needs --reason TEXT (why a new operation)")
    if external_id is not None and not external_id.strip():
        raise click.UsageError("--confirmed needs the target's non-empty external id")
    if abandon and not (reason and reason.strip()):
        raise click.UsageError("--abandon needs --reason TEXT (why the effect is given up)")
    if external_id is not None:
        resolution = Resolution.CONFIRMED
    elif retry:
        resolution = Resolution.RETRY
    elif new_operation:
        resolution = Resolution.NEW_OPERATION
    else:
        resolution = Resolution.ABANDON
    settings = settings_of(ctx)
    check_table(settings)
    if retry and not force:
        _refuse_unprotected_retry(settings, key)
    configure_stderr()
    try:
        resolved = resolve_intent(
            settings,
            key,
            resolution,
            external_id=external_id,
            who=who or _default_who(),
            why=reason or "resolved by operator",
            attempt=attempt,
        )
    except IntentNotAmbiguous as exc:
        if not exc.final:
            raise  # prepared or in progress: a worker owns it, an error
        noop(
            f"intent {key!r} is already {exc.state} and its job needs nothing more: "
            "not resolved again",
            as_json=as_json,
            data={"key": key, "verdict": "already_final", "state": exc.state},
        )
    intent = resolved.intent
    state = intent.state.value
    if as_json:
        emit_json(
            {
                "key": intent.key,
                "verdict": "finished_earlier" if resolved.finished_earlier else "resolved",
                "state": state,
                "job_id": intent.job_id,
                "job_requeued": resolved.job_requeued,
                "note": resolved.note,
                "successor": intent.successor,
            }
        )
        return
    successor = [f"successor {intent.successor}"] if intent.successor else []
    row(intent.key, state, *successor, f"job {intent.job_id} {resolved.note}")


def _refuse_unprotected_retry(settings: Settings, key: str) -> None:
    """A repeat is protected only while the target still keeps the key: say so."""
    rec = read_intent(settings, key)
    if rec is None:
        return  # the resolve says "no intent" in its own words
    started = rec.first_started_at or rec.created_at
    # No age on one clock here (the operator's clock against the starting worker's):
    # the rule answers OTHER_CLOCK, or EXPIRED when the two walls say the window has
    # passed. It only guards a person's decision (--retry says they checked the
    # target): EXPIRED is refused; otherwise the person's word stands.
    why = repeat_unprotected(rec.key_retention, started, time.time())
    if why is Unprotected.NO_KEYS:
        raise click.UsageError(
            f"target {rec.target!r} does not keep idempotency keys: a repeat of {key!r} is "
            "not protected by the target; make sure it did not apply, then add --force"
        )
    if why is Unprotected.EXPIRED:
        raise click.UsageError(
            f"the first attempt of {key!r} is older than the {rec.key_retention:g} s the target "
            "keeps keys: a repeat is no longer protected; make sure it did not apply, then add "
            "--force"
        )
