"""What the ``sqs-lease`` command line prints: exit statuses, ``--json``, tables
that wrap their last column, and notes on stderr.

Kept apart from :mod:`sqs_lease.cli` so commands added there (or in modules of
their own, like :mod:`sqs_lease._cli_dlq`) share one way of printing.

Human output shows text from outside (job ids, reasons, exception texts, DLQ
bodies) through :func:`~sqs_lease._core.texts.visible`: its control characters
are shown as escapes, never sent to the terminal. :func:`table`, :func:`row`,
:func:`field`, :func:`note`, :func:`noop` and :func:`fail_line` do it for their
cells; JSON output (:func:`emit_json`) stays exact JSON.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import textwrap
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any, NoReturn, TypeVar

import click

from ._config import Settings
from ._core.inputs import loads
from ._core.texts import visible, visible_lines

EXIT_OK = 0
"""The command did what it was asked."""
EXIT_NOT_FOUND = 1
"""The job, intent or message named does not exist; or some of a batch failed."""
EXIT_ERROR = 2
"""Bad usage or settings, AWS unreachable or refused, a request the protocol refuses."""
EXIT_NOOP = 3
"""Nothing to do: the job or intent is already final (or not parked, for resume)."""
EXIT_INTERRUPTED = 130
"""Ctrl-C outside a worker's run (128 + SIGINT, as shells report it)."""

F = TypeVar("F", bound=Callable[..., Any])

_MIN_WRAP = 24


_JSON_MODE = "sqs_lease.json"
"""``Context.meta`` key (shared by a command's whole context chain): ``--json`` was given."""

ERROR_CODES = {EXIT_NOT_FOUND: "not_found", EXIT_ERROR: "error", EXIT_NOOP: "nothing_to_do"}
"""The ``code`` of a JSON error by exit status, where the failure names no finer one."""


def _remember_json(ctx: click.Context, _param: click.Parameter, value: bool) -> bool:
    if value:
        ctx.meta[_JSON_MODE] = True
    return value


def json_option(
    help_text: str = "One JSON object (see docs/operations.md for its keys).",
) -> Callable[[F], F]:
    """The ``--json`` flag every command takes (parameter ``as_json``); it also puts
    the command's failures in JSON (:func:`fail`)."""
    return click.option("--json", "as_json", is_flag=True, help=help_text, callback=_remember_json)


def json_mode() -> bool:
    """Whether the running command was given ``--json``."""
    ctx = click.get_current_context(silent=True)
    return bool(ctx is not None and ctx.meta.get(_JSON_MODE))


def emit_json(value: Any) -> None:
    """One JSON document on one line of stdout (keys in their documented order)."""
    click.echo(json.dumps(value, default=str, ensure_ascii=False))


def note(text: str) -> None:
    """A remark for the person at the terminal, on stderr: stdout stays parseable."""
    click.echo(f"note: {visible(text)}", err=True)


def noop(text: str, *, as_json: bool, data: dict[str, Any]) -> NoReturn:
    """Say plainly that nothing was done, and exit with :data:`EXIT_NOOP`."""
    if as_json:
        emit_json(data)
    else:
        click.echo(f"nothing to do: {visible(text)}")
    raise click.exceptions.Exit(EXIT_NOOP)


def row(*cells: object) -> None:
    """One line of tab-separated cells, each shown with controls made visible (a tab
    or line break inside a cell cannot shift a column or forge a line)."""
    click.echo("\t".join(visible(c) for c in cells))


def field(name: str, value: object, *, lead: str = "", ours: bool = False) -> None:
    """One ``name: value`` line (``-`` for None), the value shown with controls made
    visible. ``ours``: the value's line breaks are the command's own (an indented
    JSON dump, whose strings' breaks JSON escaped) and stay line breaks."""
    if value is None:
        shown = "-"
    elif ours:
        shown = visible_lines(str(value))
    else:
        shown = visible(value)
    click.echo(f"{lead}{visible(name)}: {shown}")


def fail_line(message: str) -> str:
    """The ``error:`` line of a failed command: one line, controls made visible."""
    return f"error: {visible(' '.join(message.split()))}"


def fail(message: str, code: int, *, kind: str | None = None) -> NoReturn:
    """Print the ``error:`` line on stderr and exit with ``code``. Under ``--json``,
    stdout gets the failure as one JSON object too, ``{"error": message, "code": kind,
    "exit": code}``: ``kind`` names the failure (``job_not_found``, an AWS error code),
    else :data:`ERROR_CODES` names it by the exit status."""
    click.echo(fail_line(message), err=True)
    if json_mode():
        emit_json(
            {
                "error": " ".join(message.split()),
                "code": kind or ERROR_CODES.get(code, "error"),
                "exit": code,
            }
        )
    raise click.exceptions.Exit(code)


def settings_of(ctx: click.Context) -> Settings:
    """The :class:`Settings` the root group made from its options and the environment."""
    obj = ctx.find_root().obj
    assert isinstance(obj, Settings)
    return obj


def limit_note(what: str, limit: int, narrow: str) -> None:
    """Say on stderr that ``--limit`` cut a list, and how to see the rest."""
    note(
        f"--limit {limit} reached: more {what} exist and are not shown; raise --limit, "
        f"or narrow with {narrow}"
    )


def one_line(text: str) -> str:
    return " ".join(text.split())


def seconds(value: float) -> str:
    return f"{value:.1f}s"


def age(now: float, then: float | None) -> str:
    return "-" if then is None else seconds(now - then)


def iso(ts: float | None) -> str | None:
    return None if ts is None else datetime.fromtimestamp(ts, UTC).isoformat(timespec="seconds")


def reason_cell(text: str | None) -> str:
    """A reason for a table's last column: whole (the table wraps it on a terminal;
    ``--json`` has it verbatim)."""
    return one_line(text) if text else "-"


def json_or_text(text: str | None) -> Any:
    """A stored JSON text as its value, or the text itself where it is not JSON."""
    if text is None:
        return None
    try:
        return loads(text)
    except ValueError:
        return text


def terminal_width() -> int | None:
    """Columns to fit a table in: ``COLUMNS`` if set, the terminal's if stdout is
    one, else None (a pipe or a file gets every row on one line)."""
    env = os.environ.get("COLUMNS", "")
    if env.isdigit() and int(env) > 0:
        return int(env)
    try:
        if sys.stdout.isatty():
            return shutil.get_terminal_size().columns
    except (AttributeError, ValueError, OSError):  # a closed or replaced stream
        return None
    return None


def table(rows: Sequence[Sequence[str]], width: int | None = None) -> str:
    """Rows aligned in columns; the last column (a reason) wraps within ``width``
    (default :func:`terminal_width`) instead of being cut, its continuation lines
    indented under it. Without a width every row stays on one line, whole."""
    if not rows:
        return ""
    rows = [[visible(cell) for cell in r] for r in rows]
    width = terminal_width() if width is None else width
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lead = sum(widths[:-1]) + 2 * (len(widths) - 1)
    room = None if width is None else max(_MIN_WRAP, width - lead)
    lines: list[str] = []
    for r in rows:
        head = "  ".join(cell.ljust(w) for cell, w in zip(r[:-1], widths[:-1], strict=True))
        last = r[-1]
        parts = [last] if room is None or len(last) <= room else textwrap.wrap(last, room)
        for i, part in enumerate(parts or [""]):
            prefix = head if i == 0 else " " * len(head)
            lines.append(f"{prefix}  {part}".rstrip() if r[:-1] else part)
    return "\n".join(lines)
