"""Stored items read into the core's views (jobs, intents, groups, slots) and records."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .._core.intents import IntentState, IntentView, success_meaning
from .._core.records import GroupView, JobState, JobView
from .._core.retention import first_started_by
from .._core.slots import SlotView
from .._core.status import JobStatus, decode_result
from .._errors import RecordUnreadable
from .models import JobRecord


@dataclass(frozen=True)
class _Attrs:
    """A low-level item's attributes by type; an absent or NULL attribute reads None."""

    item: Mapping[str, Any]

    def _raw(self, name: str, kind: str) -> Any:
        v = self.item.get(name)
        return None if v is None or "NULL" in v else v[kind]

    def text(self, name: str) -> str | None:
        v = self._raw(name, "S")
        return None if v is None else str(v)

    def whole(self, name: str) -> int | None:
        v = self._raw(name, "N")
        return None if v is None else int(v)

    def count(self, name: str) -> int:
        return self.whole(name) or 0

    def number(self, name: str) -> float | None:
        v = self._raw(name, "N")
        return None if v is None else float(v)


def view_of(item: Mapping[str, Any]) -> JobView:
    """Read a low-level item (possibly projected) into the core's view.

    Raises :class:`RecordUnreadable` (naming the job where its id can be read) for a
    record this version cannot read: an unknown state, a value of the wrong type.
    """
    a = _Attrs(item)

    job_id = ""
    try:
        job_id = a.text("job_id") or ""
        sent = item.get("message_sent")
        return JobView(
            job_id=job_id,
            job_class=a.text("job_class") or "",
            state=JobState(a.text("state") or JobState.QUEUED.value),
            token=a.count("token"),
            attempt=a.count("attempt"),
            owner=a.text("owner"),
            payload_hash=a.text("payload_hash") or "",
            message_sent=True if sent is None else bool(sent.get("BOOL", False)),
            reason=a.text("reason"),
            error_code=a.text("error_code"),
            stage=a.text("stage"),
            payload_json=a.text("payload"),
            send_id=a.text("send_id"),
            unsent_since=a.number("unsent_since"),
            granted_attempts=a.count("granted_attempts"),
            resumed_at_attempt=a.count("resumed_at_attempt")
            if "resumed_at_attempt" in item
            else None,
            group=a.text("group_id"),
            timeline_length=len((item.get("timeline") or {}).get("L") or ()),
            progress_json=a.text("progress"),
            tenant=a.text("tenant"),
            priority=a.text("priority"),
            stage_input=a.text("stage_input"),
            stage_log=a.text("stages"),
            write_id=a.text("write_id"),
            late_handbacks=a.count("late_handbacks"),
        )
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        detail = f"{type(exc).__name__}: {exc}"[:300]
        raise RecordUnreadable(
            f"job record {job_id or '<no readable job_id>'!r} cannot be read by this version "
            f"({detail}); fix the record by hand or run a version that knows it",
            job_id,
        ) from None


def status_of(item: Mapping[str, Any]) -> JobStatus:
    """Read a job item into its caller's status (``Producer.status``); the record's
    unreadable states and values raise :class:`RecordUnreadable`, as ``view_of``."""
    view = view_of(item)
    a = _Attrs(item)
    try:
        result = decode_result(a.text("result")) if view.state is JobState.SUCCEEDED else None
    except ValueError as exc:
        raise RecordUnreadable(
            f"job record {view.job_id!r}: its result is not JSON ({exc}); fix the record by hand",
            view.job_id,
        ) from None
    return JobStatus(
        job_id=view.job_id,
        job_class=view.job_class,
        state=view.state,
        stage=view.stage,
        attempt=view.attempt,
        token=view.token,
        result=result,
        reason=view.reason,
        error_code=view.error_code,
        created_at=a.number("created_at"),
        updated_at=a.number("updated_at"),
        finished_at=a.number("finished_at"),
        group=view.group,
        tenant=view.tenant,
    )


def record_of(item: Mapping[str, Any]) -> JobRecord:
    """Full record (for the CLI and tests)."""
    rec: JobRecord = JobRecord.from_raw_data(dict(item))
    return rec


def intent_view_of(item: Mapping[str, Any]) -> IntentView:
    """Read an intent item into the core's view."""
    a = _Attrs(item)
    return IntentView(
        key=a.text("intent_key") or "",
        job_id=a.text("job_id") or "",
        action=a.text("action") or "",
        target=a.text("target") or "",
        state=IntentState(a.text("state") or IntentState.PREPARED.value),
        payload_hash=a.text("payload_hash") or "",
        attempts=a.count("attempts"),
        payload_json=a.text("payload"),
        response_json=a.text("response"),
        external_id=a.text("external_id"),
        last_token=a.count("last_token"),
        reason=a.text("reason"),
        start_id=a.text("start_id"),
        first_started_at=a.number("first_started_at"),
        first_started_by=first_started_by(a.text("first_start"), a.number("first_started_at")),
        resolution=a.text("resolution"),
        resolved_by=a.text("resolved_by"),
        confirmed_late=a.text("confirmed_late"),
        success=success_meaning(a.text("success")),
        successor=a.text("successor"),
        predecessor=a.text("predecessor"),
    )


def group_view_of(item: Mapping[str, Any]) -> GroupView:
    """Read a group's marker item into the core's view."""
    a = _Attrs(item)
    return GroupView(
        group=a.text("group_id") or "",
        jobs=int(a.number("jobs") or 0),
        cancelled_at=a.number("cancelled_at"),
        reason=a.text("reason"),
    )


def slot_view_of(item: Mapping[str, Any]) -> SlotView:
    """Read a slot item into the core's view."""
    a = _Attrs(item)
    return SlotView(
        key=a.text("slot") or "",
        version=a.count("version"),
        job_id=a.text("job_id"),
        token=a.whole("token"),
        owner=a.text("owner"),
    )
