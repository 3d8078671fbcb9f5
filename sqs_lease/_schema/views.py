"""Stored items read into the core's views (``JobView``, ``IntentView``) and records."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .._core.intents import (
    IntentState,
    IntentView,
    first_started_by,
    success_meaning,
)
from .._core.records import (
    JobState,
    JobView,
)
from .._errors import RecordUnreadable
from .models import JobRecord


def view_of(item: Mapping[str, Any]) -> JobView:
    """Read a low-level item (possibly projected) into the core's view.

    Raises :class:`RecordUnreadable` (naming the job where its id can be read) for a
    record this version cannot read: an unknown state, a value of the wrong type.
    """

    def s(name: str) -> str | None:
        v = item.get(name)
        return None if v is None or "NULL" in v else str(v["S"])

    def n(name: str) -> int:
        v = item.get(name)
        return 0 if v is None or "NULL" in v else int(v["N"])

    def f(name: str) -> float | None:
        v = item.get(name)
        return None if v is None or "NULL" in v else float(v["N"])

    job_id = ""
    try:
        job_id = s("job_id") or ""
        sent = item.get("message_sent")
        return JobView(
            job_id=job_id,
            job_class=s("job_class") or "",
            state=JobState(s("state") or JobState.QUEUED.value),
            token=n("token"),
            attempt=n("attempt"),
            owner=s("owner"),
            payload_hash=s("payload_hash") or "",
            message_sent=True if sent is None else bool(sent.get("BOOL", False)),
            reason=s("reason"),
            error_code=s("error_code"),
            stage=s("stage"),
            payload_json=s("payload"),
            send_id=s("send_id"),
            unsent_since=f("unsent_since"),
            granted_attempts=n("granted_attempts"),
            resumed_at_attempt=n("resumed_at_attempt") if "resumed_at_attempt" in item else None,
            group=s("group_id"),
            timeline_length=len((item.get("timeline") or {}).get("L") or ()),
            progress_json=s("progress"),
            tenant=s("tenant"),
            priority=s("priority"),
            stage_input=s("stage_input"),
            stage_log=s("stages"),
            write_id=s("write_id"),
            late_handbacks=n("late_handbacks"),
        )
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        detail = f"{type(exc).__name__}: {exc}"[:300]
        raise RecordUnreadable(
            f"job record {job_id or '<no readable job_id>'!r} cannot be read by this version "
            f"({detail}); fix the record by hand or run a version that knows it",
            job_id,
        ) from None


def record_of(item: Mapping[str, Any]) -> JobRecord:
    """Full record (for the CLI and tests)."""
    rec: JobRecord = JobRecord.from_raw_data(dict(item))
    return rec


def intent_view_of(item: Mapping[str, Any]) -> IntentView:
    def s(name: str) -> str | None:
        v = item.get(name)
        return None if v is None or "NULL" in v else str(v["S"])

    def n(name: str) -> int:
        v = item.get(name)
        return 0 if v is None or "NULL" in v else int(v["N"])

    def f(name: str) -> float | None:
        v = item.get(name)
        return None if v is None or "NULL" in v else float(v["N"])

    return IntentView(
        key=s("intent_key") or "",
        job_id=s("job_id") or "",
        action=s("action") or "",
        target=s("target") or "",
        state=IntentState(s("state") or IntentState.PREPARED.value),
        payload_hash=s("payload_hash") or "",
        attempts=n("attempts"),
        payload_json=s("payload"),
        response_json=s("response"),
        external_id=s("external_id"),
        last_token=n("last_token"),
        reason=s("reason"),
        start_id=s("start_id"),
        first_started_at=f("first_started_at"),
        first_started_by=first_started_by(s("first_start"), f("first_started_at")),
        resolution=s("resolution"),
        resolved_by=s("resolved_by"),
        success=success_meaning(s("success")),
        successor=s("successor"),
        predecessor=s("predecessor"),
    )
