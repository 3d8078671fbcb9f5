"""The intent and attempt tables' requests: ``IntentTable`` implements the core's
``IntentRequests`` and ``ResolveRequests``."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Unpack

from pynamodb.expressions.update import Action

from .._core.calls import Call
from .._core.intents import EffectSpec, IntentState, IntentView
from .._core.records import (
    JobRequests,
)
from .._core.resolving import Decision, Resolution, successor_key
from .._core.retention import first_start_stamp
from .expressions import item_request, serialize
from .models import AttemptRecord, IntentRecord
from .views import intent_view_of

IR = IntentRecord
AR = AttemptRecord


def _ikey(key: str) -> dict[str, Any]:
    return {"intent_key": {"S": key}}


def _akey(key: str, attempt: int) -> dict[str, Any]:
    return {"intent_key": {"S": key}, "attempt": {"N": str(attempt)}}


@dataclass(frozen=True)
class IntentTable:
    """Implements the core's ``IntentRequests``/``ResolveRequests``."""

    table: str
    attempts_table: str

    def prepare(self, spec: EffectSpec, wall_now: float) -> Call:
        record = IntentRecord(
            intent_key=spec.key,
            job_id=spec.job_id,
            stage=spec.stage,
            action=spec.action,
            target=spec.target,
            state=IntentState.PREPARED.value,
            payload=spec.payload_json,
            payload_hash=spec.payload_hash,
            attempts=0,
            last_token=0,
            key_retention=spec.key_retention_seconds,
            success=spec.success,
            predecessor=spec.predecessor,
            created_at=wall_now,
            updated_at=wall_now,
        )
        params: dict[str, Any] = {
            "TableName": self.table,
            "Item": record.serialize(),
            "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
        }
        params.update(serialize(IR.intent_key.does_not_exist()))
        return Call("dynamodb", "PutItem", params)

    def start(
        self,
        spec: EffectSpec,
        *,
        jobs: JobRequests,
        token: int,
        worker_id: str,
        expected: IntentState,
        attempts: int,
        wall_now: float,
        start_id: str = "",
        try_no: int = 0,
    ) -> Call:
        actions: list[Action] = [
            IR.state.set(IntentState.IN_PROGRESS.value),
            IR.attempts.set(attempts + 1),
            IR.last_token.set(token),
            IR.updated_at.set(wall_now),
            IR.first_started_at.set(IR.first_started_at | wall_now),
            IR.first_start.set(IR.first_start | first_start_stamp(wall_now, worker_id)),
        ]
        if start_id:
            actions.append(IR.start_id.set(start_id))
        intent = item_request(
            self.table,
            _ikey(spec.key),
            # Only the job that holds the key starts it: another job sharing the key
            # waits (its call may be in flight), so a start never lands for it.
            (IR.state == expected.value) & (IR.attempts == attempts) & (IR.job_id == spec.job_id),
            actions,
        )
        attempt = AttemptRecord(
            intent_key=spec.key,
            attempt=attempts + 1,
            job_id=spec.job_id,
            token=token,
            worker=worker_id,
            tool=spec.target,
            action=spec.action,
            payload_hash=spec.payload_hash,
            started_at=wall_now,
            outcome="started",
            success=spec.success,
        )
        put: dict[str, Any] = {"TableName": self.attempts_table, "Item": attempt.serialize()}
        put.update(serialize(AR.intent_key.does_not_exist()))
        items: list[dict[str, Any]] = [
            dict(jobs.fence_check(spec.job_id, token)),
            {"Update": intent},
            {"Put": put},
        ]
        if expected is IntentState.IN_PROGRESS and attempts > 0:
            # A repeat after the check said "not applied": close the earlier
            # attempt with that verdict (its owner never saw its end).
            items.append(
                {
                    "Update": item_request(
                        self.attempts_table,
                        _akey(spec.key, attempts),
                        AR.intent_key.exists(),
                        [
                            AR.ended_at.set(AR.ended_at | wall_now),
                            AR.outcome.set("not_applied_by_check"),
                        ],
                    )
                }
            )
        # One transaction: the job is still ours (token), the intent is as we saw
        # it, and the attempt is logged; any of them failing starts nothing. The
        # request token (one owner's one write: table, job, token, start, try) makes
        # an SDK retry of an applied start a no-op on AWS, and no other owner's.
        return Call(
            "dynamodb",
            "TransactWriteItems",
            {
                "TransactItems": items,
                "ClientRequestToken": _request_token(
                    "start",
                    self.table,
                    spec.job_id,
                    spec.key,
                    attempts + 1,
                    token,
                    start_id,
                    try_no,
                ),
            },
        )

    def confirm(
        self,
        key: str,
        *,
        attempt: int,
        response_json: str,
        external_id: str | None,
        wall_now: float,
        log_response: str,
        reconciled: bool,
        job_id: str = "",
        token: int = 0,
        try_no: int = 0,
        seen: IntentState = IntentState.IN_PROGRESS,
    ) -> Call:
        intent_actions: list[Action] = [
            IR.state.set(IntentState.CONFIRMED.value),
            IR.response.set(response_json),
            IR.updated_at.set(wall_now),
            IR.confirmed_at.set(wall_now),
            IR.reconciled.set(reconciled),
        ]
        late = seen is not IntentState.IN_PROGRESS
        if late:
            # The attempt's own answer, after its intent left in_progress (parked
            # ambiguous, or reopened by an operator's retry) and before any later
            # attempt started: a fact, and out of the operators' ambiguous index.
            intent_actions += [IR.confirmed_late.set(seen.value), IR.attention.remove()]
        attempt_actions: list[Action] = [
            AR.ended_at.set(AR.ended_at | wall_now),
            AR.outcome.set("confirmed_by_check" if reconciled else "ok"),
        ]
        if external_id:
            intent_actions.append(IR.external_id.set(external_id))
            attempt_actions.append(AR.external_id.set(external_id))
        if log_response:
            attempt_actions.append(AR.response.set(log_response))
        items = [
            {
                "Update": item_request(
                    self.table,
                    _ikey(key),
                    (IR.state == seen.value) & (IR.attempts == attempt),
                    intent_actions,
                )
            }
        ]
        if attempt > 0:
            items.append(
                {
                    "Update": item_request(
                        self.attempts_table,
                        _akey(key, attempt),
                        AR.intent_key.exists(),
                        attempt_actions,
                    )
                }
            )
        return Call(
            "dynamodb",
            "TransactWriteItems",
            {
                "TransactItems": items,
                # The fencing token is part of it: a late owner's confirm and the new
                # owner's reconciling confirm of one attempt are two writes.
                "ClientRequestToken": _request_token(
                    *(("confirm_late", seen.value) if late else ("confirm",)),
                    self.table,
                    job_id,
                    key,
                    attempt,
                    token,
                    reconciled,
                    try_no,
                ),
            },
        )

    def applied_late(
        self,
        key: str,
        *,
        attempt: int,
        external_id: str | None,
        wall_now: float,
        log_response: str,
    ) -> Call:
        # Only the attempt's own log: the intent moved on (a later attempt started,
        # or an operator abandoned it or approved a new operation), and no write of
        # this attempt may change what those decided.
        actions: list[Action] = [
            AR.ended_at.set(AR.ended_at | wall_now),
            AR.outcome.set("ok_late"),
        ]
        if external_id:
            actions.append(AR.external_id.set(external_id))
        if log_response:
            actions.append(AR.response.set(log_response))
        params = item_request(
            self.attempts_table, _akey(key, attempt), AR.intent_key.exists(), actions
        )
        return Call("dynamodb", "UpdateItem", params)

    def take_over(
        self, key: str, *, holder: str, job_id: str, attempts: int, reason: str, wall_now: float
    ) -> Call:
        # A prepared intent (never started, or reopened after a provable "not
        # applied") whose holder job has ended for good changes hands. Exactly that
        # holder, that state and that attempt count: anything else moved meanwhile.
        params = item_request(
            self.table,
            _ikey(key),
            (IR.job_id == holder)
            & (IR.state == IntentState.PREPARED.value)
            & (IR.attempts == attempts),
            [IR.job_id.set(job_id), IR.reason.set(reason), IR.updated_at.set(wall_now)],
        )
        params["ReturnValues"] = "ALL_NEW"
        params["ReturnValuesOnConditionCheckFailure"] = "ALL_OLD"
        return Call("dynamodb", "UpdateItem", params)

    def attempt_failed(
        self, key: str, *, attempt: int, outcome: str, error: str, wall_now: float, reopen: bool
    ) -> Call:
        items: list[dict[str, Any]] = [
            {
                "Update": item_request(
                    self.attempts_table,
                    _akey(key, attempt),
                    AR.intent_key.exists(),
                    [AR.ended_at.set(wall_now), AR.outcome.set(outcome), AR.error.set(error)],
                )
            }
        ]
        if reopen:
            items.append(
                {
                    "Update": item_request(
                        self.table,
                        _ikey(key),
                        (IR.state == IntentState.IN_PROGRESS.value) & (IR.attempts == attempt),
                        [IR.state.set(IntentState.PREPARED.value), IR.updated_at.set(wall_now)],
                    )
                }
            )
        return Call("dynamodb", "TransactWriteItems", {"TransactItems": items})

    def mark_ambiguous(self, key: str, *, attempts: int, reason: str, wall_now: float) -> Call:
        params = item_request(
            self.table,
            _ikey(key),
            (IR.state == IntentState.IN_PROGRESS.value) & (IR.attempts == attempts),
            [
                IR.state.set(IntentState.AMBIGUOUS.value),
                IR.attention.set(IntentState.AMBIGUOUS.value),
                IR.reason.set(reason),
                IR.updated_at.set(wall_now),
            ],
        )
        params["ReturnValuesOnConditionCheckFailure"] = "ALL_OLD"
        return Call("dynamodb", "UpdateItem", params)

    def _resolution(self, key: str, decision: Decision) -> dict[str, Any]:
        resolution, external_id, who = (
            decision["resolution"],
            decision["external_id"],
            decision["who"],
        )
        why, wall_now, attempt = decision["why"], decision["wall_now"], decision.get("attempt")
        actions: list[Action] = [
            IR.attention.remove(),  # decided: out of the ambiguous index
            IR.resolution.set(resolution.value),
            IR.resolved_by.set(who),
            IR.resolved_at.set(wall_now),
            IR.resolution_reason.set(why),
            IR.updated_at.set(wall_now),
        ]
        if resolution is Resolution.CONFIRMED:
            if external_id:
                actions.append(IR.external_id.set(external_id))
            actions += [
                IR.state.set(IntentState.CONFIRMED.value),
                IR.response.set(canonical({"external_id": external_id, "resolved_by": who})),
                IR.confirmed_at.set(wall_now),
            ]
        elif resolution is Resolution.RETRY:
            actions.append(IR.state.set(IntentState.PREPARED.value))
        elif resolution is Resolution.NEW_OPERATION:
            actions += [
                IR.state.set(IntentState.SUPERSEDED.value),
                IR.successor.set(successor_key(key)),
            ]
        if resolution not in (Resolution.ABANDON, Resolution.NEW_OPERATION):
            # The "cannot tell" reason is stale once an operator decided; the
            # attempt log and the resolution fields keep the history.
            actions.append(IR.reason.remove())
        elif resolution is Resolution.ABANDON:
            actions += [IR.state.set(IntentState.ABANDONED.value), IR.reason.set(why)]
        else:
            actions.append(IR.reason.set(why))
        condition = IR.state == IntentState.AMBIGUOUS.value
        if attempt is not None:
            # The decision is about this attempt's ambiguity, never a later one's.
            condition = condition & (IR.attempts == attempt)
        params = item_request(self.table, _ikey(key), condition, actions)
        params["ReturnValuesOnConditionCheckFailure"] = "ALL_OLD"
        return params

    def resolve(self, key: str, **decision: Unpack[Decision]) -> Call:
        params = self._resolution(key, decision)
        params["ReturnValues"] = "ALL_NEW"
        return Call("dynamodb", "UpdateItem", params)

    def resolve_and_unpark(
        self,
        key: str,
        *,
        jobs: JobRequests,
        job_id: str,
        send_id: str,
        **decision: Unpack[Decision],
    ) -> Call:
        # One decision: the intent is settled and its parked job unparked, or neither.
        intent = self._resolution(key, decision)
        return Call(
            "dynamodb",
            "TransactWriteItems",
            {
                "TransactItems": [
                    {"Update": intent},
                    dict(jobs.unpark_item(job_id, send_id, decision["wall_now"])),
                ],
                "ClientRequestToken": _request_token("resolve", key, job_id, send_id),
            },
        )

    def get(self, key: str) -> Call:
        return Call(
            "dynamodb",
            "GetItem",
            {"TableName": self.table, "Key": _ikey(key), "ConsistentRead": True},
        )

    def parse(self, item: Mapping[str, Any]) -> IntentView:
        return intent_view_of(item)


def _request_token(*parts: object) -> str:
    """A TransactWriteItems ClientRequestToken (at most 36 characters), stable per step."""
    digest = hashlib.sha256("\x1f".join(str(p) for p in parts).encode()).hexdigest()
    return digest[:36]


def canonical(value: Any) -> str:
    import json

    return json.dumps(value, sort_keys=True, separators=(",", ":"))
