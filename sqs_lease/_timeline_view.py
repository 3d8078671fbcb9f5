"""Drawing a job's timeline: owners as lanes, in the terminal and as a self-contained page.

What the events are and where they are kept: ``_core/timeline.py``. This module reads
them (the job record, and optionally workers' journal files) and draws them; it
decides nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from html import escape
from typing import Any

from ._core.texts import visible
from ._core.timeline import (
    IntentFacts,
    TimelineEvent,
    TimelineKind,
    attributed,
    from_intents,
    from_journal,
    from_record,
    merged,
)

RECORD_LANE = "(record)"
"""The lane of events no worker owns: submit, cancel, resume, resolve, undeliverable,
dead-lettered."""

GAP_SECONDS = 5.0
"""A pause between two events at least this long is drawn as a gap."""

_MARK = {
    TimelineKind.SUBMITTED: "o",
    TimelineKind.CLAIMED: "●",
    TimelineKind.COMMITTED: "✔",
    TimelineKind.STAGE_DONE: "✔",
    TimelineKind.REFUSED: "✘",
    TimelineKind.RETRY: "↺",
    TimelineKind.PARKED: "■",
    TimelineKind.UNDELIVERABLE: "■",
    TimelineKind.DEAD_LETTERED: "■",
    TimelineKind.FAILED: "✘",
    TimelineKind.RELEASED: "○",
    TimelineKind.CANCELLED: "⊘",
    TimelineKind.RESUMED: "▶",
    TimelineKind.RESOLVED: "▶",
    TimelineKind.LEASE_LOST: "x",
    TimelineKind.OWNERSHIP_UNKNOWN: "?",
    TimelineKind.LEASE_DROPPED: "x",
    TimelineKind.INTENT_PREPARED: "·",
    TimelineKind.INTENT_STARTED: "▷",
    TimelineKind.INTENT_CONFIRMED: "◆",
    TimelineKind.INTENT_UNKNOWN: "?",
    TimelineKind.INTENT_NOT_APPLIED: "◇",
    TimelineKind.INTENT_RECONCILED: "◈",
    TimelineKind.INTENT_AMBIGUOUS: "‼",
}
_COLOUR = {
    TimelineKind.CLAIMED: "#1f6feb",
    TimelineKind.COMMITTED: "#1a7f37",
    TimelineKind.STAGE_DONE: "#1a7f37",
    TimelineKind.REFUSED: "#cf222e",
    TimelineKind.FAILED: "#cf222e",
    TimelineKind.LEASE_LOST: "#cf222e",
    TimelineKind.OWNERSHIP_UNKNOWN: "#bf8700",
    TimelineKind.LEASE_DROPPED: "#cf222e",
    TimelineKind.PARKED: "#bf8700",
    TimelineKind.UNDELIVERABLE: "#bf8700",
    TimelineKind.DEAD_LETTERED: "#bf8700",
    TimelineKind.INTENT_STARTED: "#8250df",
    TimelineKind.INTENT_CONFIRMED: "#8250df",
    TimelineKind.INTENT_RECONCILED: "#8250df",
    TimelineKind.INTENT_UNKNOWN: "#bf8700",
    TimelineKind.INTENT_AMBIGUOUS: "#cf222e",
}
_ENDS_HOLD = frozenset(
    {
        TimelineKind.COMMITTED,
        TimelineKind.STAGE_DONE,
        TimelineKind.RETRY,
        TimelineKind.PARKED,
        TimelineKind.FAILED,
        TimelineKind.RELEASED,
        TimelineKind.LEASE_LOST,
        TimelineKind.LEASE_DROPPED,
    }
)


_ENDS_ALL = frozenset(
    {TimelineKind.CANCELLED, TimelineKind.UNDELIVERABLE, TimelineKind.DEAD_LETTERED}
)


@dataclass(frozen=True)
class Timeline:
    """One job's timeline as drawn: its record's state and token, and the events."""

    job_id: str
    state: str
    token: int
    events: tuple[TimelineEvent, ...]

    @property
    def lanes(self) -> list[str]:
        """Owners in the order they first appear; the record's own lane first."""
        out = [RECORD_LANE]
        for ev in self.events:
            lane = lane_of(ev)
            if lane not in out:
                out.append(lane)
        return out

    def as_json(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "state": self.state,
            "token": self.token,
            "events": [
                {
                    "kind": ev.kind.value,
                    "at": ev.at,
                    "at_utc": _utc(ev.at),
                    "owner": ev.owner,
                    "token": ev.token,
                    "detail": ev.detail,
                    "stage": ev.stage,
                    "source": ev.source,
                }
                for ev in self.events
            ],
        }


def lane_of(ev: TimelineEvent) -> str:
    return ev.owner or RECORD_LANE


def timeline_of(
    item: Mapping[str, Any],
    journal: Sequence[Mapping[str, Any]] = (),
    intents: Sequence[IntentFacts] = (),
) -> Timeline:
    """The timeline of a low-level job item, merged with journal lines about it and
    with the transitions of its intents (read from the intents and attempts tables)."""
    job_id = str(item.get("job_id", {}).get("S", ""))
    token = int(item.get("token", {}).get("N", "0"))
    stored = [str(v.get("S", "")) for v in (item.get("timeline") or {}).get("L") or ()]
    beside = [*from_journal(job_id, journal), *from_intents(job_id, intents)]
    events = attributed(merged(from_record(stored, token), beside))
    return Timeline(job_id, str(item.get("state", {}).get("S", "")), token, tuple(events))


def _utc(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds")


def _clock(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%H:%M:%S.%f")[:-3]


def describe(ev: TimelineEvent, previous_owner: str | None = None) -> str:
    """A short sentence for one event."""
    kind = ev.kind
    text = {
        TimelineKind.SUBMITTED: "submitted",
        TimelineKind.CLAIMED: "claimed",
        TimelineKind.COMMITTED: "committed",
        TimelineKind.STAGE_DONE: f"stage {ev.stage or '?'} done",
        TimelineKind.REFUSED: f"REFUSED {ev.stage or 'write'} (stale token)",
        TimelineKind.RETRY: "retry",
        TimelineKind.PARKED: "parked",
        TimelineKind.UNDELIVERABLE: "parked: undeliverable",
        TimelineKind.DEAD_LETTERED: "parked: message in the DLQ",
        TimelineKind.FAILED: "failed",
        TimelineKind.RELEASED: "released (shutdown)",
        TimelineKind.CANCELLED: "cancelled",
        TimelineKind.RESUMED: "resumed",
        TimelineKind.RESOLVED: "resolved by an operator",
        TimelineKind.LEASE_LOST: "lease lost",
        TimelineKind.OWNERSHIP_UNKNOWN: "ownership unknown",
        TimelineKind.LEASE_DROPPED: "let the lease go",
        TimelineKind.INTENT_PREPARED: "intent prepared",
        TimelineKind.INTENT_STARTED: "intent started",
        TimelineKind.INTENT_CONFIRMED: "intent confirmed",
        TimelineKind.INTENT_UNKNOWN: "intent outcome UNKNOWN",
        TimelineKind.INTENT_NOT_APPLIED: "intent not applied (reopened)",
        TimelineKind.INTENT_RECONCILED: "intent reconciled",
        TimelineKind.INTENT_AMBIGUOUS: "intent AMBIGUOUS",
    }[kind]
    if kind is TimelineKind.CLAIMED and previous_owner:
        text += f" (took over from {previous_owner})"
    if ev.detail:
        text += f": {ev.detail}"
    if ev.source == "journal":
        text += " [journal]"
    return text


def _annotated(tl: Timeline) -> list[tuple[TimelineEvent, str, bool]]:
    """Each event with its sentence and whether it is a takeover (a claim while
    another owner still held the job): the taken-from owner lost its lease there."""
    holder: str | None = None
    out: list[tuple[TimelineEvent, str, bool]] = []
    for ev in tl.events:
        took_from = None
        if ev.kind is TimelineKind.CLAIMED:
            took_from = holder if holder is not None and holder != ev.owner else None
            holder = ev.owner
        elif (ev.kind in _ENDS_HOLD and ev.owner == holder) or ev.kind in _ENDS_ALL:
            holder = None
        out.append((ev, describe(ev, took_from), took_from is not None))
    return out


def render_text(tl: Timeline, width: int = 26) -> str:
    """The timeline for a terminal: one column (lane) per owner, one row per event,
    the token on every row, gaps of :data:`GAP_SECONDS` or more shown, refused
    writes marked ✘ and in capitals. Job id, owners and details come from outside:
    shown with their control characters made visible."""
    lanes = tl.lanes
    cols = "".join(f"{visible(lane)[:width]:<{width}}" for lane in lanes)
    head = f"{'time (UTC)':<13} {'token':>5}  {cols}"
    lines = [
        f"job {visible(tl.job_id)}: {visible(tl.state)}, token {tl.token}, {len(tl.events)} events",
        head.rstrip(),
    ]
    holding: set[str] = set()
    last_at: float | None = None
    for ev, text, took_over in _annotated(tl):
        if last_at is not None and ev.at - last_at >= GAP_SECONDS:
            gap = "".join(f"{'│' if lane in holding else '':<{width}}" for lane in lanes)
            lines.append(f"{'':13} {'':>5}  {gap}".rstrip() + f"  … {ev.at - last_at:.1f} s")
        last_at = ev.at
        lane = lane_of(ev)
        if took_over:
            holding.clear()
        token = "-" if not ev.token else str(ev.token)
        row = f"{_clock(ev.at):<13} {token:>5}  "
        start = len(row)
        for col, name in enumerate(lanes):
            # The event's own cell may run past its column: what follows moves right.
            at = start + col * width
            row = row.ljust(at) if len(row) <= at else row + " "
            row += (
                f"{_MARK[ev.kind]} {visible(text)}"
                if name == lane
                else ("│" if name in holding else "")
            )
        lines.append(row.rstrip())
        if ev.kind is TimelineKind.CLAIMED and ev.owner:
            holding.add(ev.owner)
        elif ev.kind in _ENDS_HOLD and ev.owner:
            holding.discard(ev.owner)
        elif ev.kind in _ENDS_ALL:
            holding.clear()
    if not tl.events:
        lines.append("(no events on the record: it was written before the timeline existed)")
    lines.append(
        "legend: ● claim  ✔ commit/stage done  ✘ refused/failed  ↺ retry  ■ parked  "
        "x lease lost  │ held;  intents: · prepared  ▷ started  ◆ confirmed  ? unknown  "
        "◈ reconciled"
    )
    return "\n".join(lines)


def render_html(tl: Timeline) -> str:
    """A self-contained page (inline SVG and CSS, no scripts, no external assets)
    with the same events: one horizontal lane per owner, time left to right."""
    lanes = tl.lanes
    rows = _annotated(tl)
    left, lane_h, top, right = 170, 60, 40, 40
    n = max(1, len(rows) - 1)
    step = max(70, min(140, 900 // n))
    width = left + right + step * n
    height = top + lane_h * len(lanes) + 20
    svg: list[str] = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="timeline of {escape(tl.job_id)}">'
    ]
    y_of = {lane: top + lane_h * i + lane_h // 2 for i, lane in enumerate(lanes)}
    for lane, y in y_of.items():
        svg.append(
            f'<text x="8" y="{y + 4}" class="lane">{escape(lane)}</text>'
            f'<line x1="{left - 10}" y1="{y}" x2="{width - right + 10}" y2="{y}" class="axis"/>'
        )
    held: dict[str, float] = {}
    last_at: float | None = None
    for i, (ev, text, took_over) in enumerate(rows):
        x = left + step * i
        lane = lane_of(ev)
        y = y_of[lane]
        if took_over:
            for other, x0 in held.items():
                svg.append(_bar(x0, x, y_of[other], lost=True))
            held.clear()
        if ev.kind is TimelineKind.CLAIMED and ev.owner:
            held[lane] = x
        elif (ev.kind in _ENDS_HOLD and lane in held) or ev.kind in _ENDS_ALL:
            for other in [lane] if lane in held else list(held):
                svg.append(_bar(held.pop(other), x, y_of[other], lost=False))
        if last_at is not None and ev.at - last_at >= GAP_SECONDS:
            svg.append(
                f'<text x="{x - step // 2}" y="{top - 14}" class="gap">'
                f"… {ev.at - last_at:.1f} s</text>"
            )
        last_at = ev.at
        colour = _COLOUR.get(ev.kind, "#57606a")
        token = "" if not ev.token else f"t{ev.token}"
        svg.append(
            f'<g class="event" data-kind="{ev.kind.value}" data-owner="{escape(lane)}" '
            f'data-token="{ev.token or 0}" data-source="{ev.source}">'
            f"<title>{escape(_utc(ev.at))} {escape(lane)} token {ev.token or '-'}: "
            f"{escape(text)}</title>"
            + _glyph(ev.kind, x, y, colour)
            + f'<text x="{x}" y="{y - 14}" class="tok">{escape(token)}</text>'
            f'<text x="{x}" y="{y + 24}" class="lbl">{escape(ev.kind.value)}</text></g>'
        )
    for other, x0 in held.items():
        svg.append(_bar(x0, left + step * max(0, len(rows) - 1) + 20, y_of[other], lost=False))
    svg.append("</svg>")
    table = [
        "<table><thead><tr><th>#</th><th>time (UTC)</th><th>owner</th><th>token</th>"
        "<th>event</th></tr></thead><tbody>"
    ]
    for i, (ev, text, _) in enumerate(rows, 1):
        cls = ' class="refused"' if ev.kind is TimelineKind.REFUSED else ""
        table.append(
            f'<tr{cls} data-kind="{ev.kind.value}"><td>{i}</td><td>{escape(_utc(ev.at))}</td>'
            f"<td>{escape(lane_of(ev))}</td><td>{ev.token or '-'}</td><td>{escape(text)}</td></tr>"
        )
    table.append("</tbody></table>")
    title = f"sqs-lease timeline: {escape(tl.job_id)}"
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"/>'
        f"<title>{title}</title><style>{_CSS}</style></head><body>"
        f"<h1>{title}</h1><p>state <b>{escape(tl.state)}</b>, token <b>{tl.token}</b>, "
        f"{len(rows)} events. Bars: who held the job; a red bar ends where another owner "
        "took it over (the lease was lost). ✘: a write the fence refused.</p>"
        + "".join(svg)
        + "".join(table)
        + "</body></html>\n"
    )


def _bar(x0: float, x1: float, y: int, *, lost: bool) -> str:
    cls = "held lost" if lost else "held"
    return f'<line x1="{x0}" y1="{y}" x2="{x1}" y2="{y}" class="{cls}"/>'


def _glyph(kind: TimelineKind, x: int, y: int, colour: str) -> str:
    if kind in (
        TimelineKind.REFUSED,
        TimelineKind.FAILED,
        TimelineKind.LEASE_LOST,
        TimelineKind.LEASE_DROPPED,
    ):
        return (
            f'<path d="M{x - 7},{y - 7} L{x + 7},{y + 7} M{x + 7},{y - 7} L{x - 7},{y + 7}" '
            f'stroke="{colour}" stroke-width="3"/>'
        )
    return f'<circle cx="{x}" cy="{y}" r="7" fill="{colour}"/>'


_CSS = (
    "body{font:14px system-ui,sans-serif;margin:24px;color:#1f2328}"
    ".lane{font:12px monospace}.axis{stroke:#d0d7de;stroke-dasharray:4 4}"
    ".held{stroke:#1f6feb;stroke-width:6;stroke-opacity:.35}.lost{stroke:#cf222e}"
    ".tok{font:11px monospace;text-anchor:middle}.lbl{font:10px sans-serif;text-anchor:middle}"
    ".gap{font:11px sans-serif;fill:#57606a;text-anchor:middle}"
    "table{border-collapse:collapse;margin-top:16px}td,th{border:1px solid #d0d7de;"
    "padding:3px 8px;text-align:left}tr.refused{background:#ffebe9}"
)
