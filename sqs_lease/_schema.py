"""Table schema (pynamodb models) and the DynamoDB requests the core sends.

The models are the one definition of each table. Their condition and update
expressions are serialised here into low-level request parameters, so every
driver (sync, async, simulation) sends the same requests. Table names are
chosen at run time (settings), so the models' ``Meta.table_name`` is only a default.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pynamodb.attributes import (
    BooleanAttribute,
    NumberAttribute,
    UnicodeAttribute,
)
from pynamodb.expressions.condition import Condition
from pynamodb.expressions.update import Action, Update
from pynamodb.models import Model

from ._core.calls import Call
from ._core.records import JobState, JobView


class JobRecord(Model):
    """One job: its ownership order (token), state, payload and result."""

    class Meta:
        table_name = "sqs-lease-jobs"

    job_id = UnicodeAttribute(hash_key=True)
    job_class = UnicodeAttribute()
    state = UnicodeAttribute()
    owner = UnicodeAttribute(null=True)
    token = NumberAttribute(default=0)
    attempt = NumberAttribute(default=0)
    payload = UnicodeAttribute()  # JSON text, immutable after submit
    payload_hash = UnicodeAttribute()
    message_sent = BooleanAttribute(default=False)
    stage = UnicodeAttribute(null=True)
    result = UnicodeAttribute(null=True)  # JSON text
    reason = UnicodeAttribute(null=True)
    error_code = UnicodeAttribute(null=True)
    created_at = NumberAttribute()
    updated_at = NumberAttribute()
    finished_at = NumberAttribute(null=True)
    # Advisory only (for people and metrics); no decision reads them.
    lease_deadline = NumberAttribute(null=True)
    last_heartbeat = NumberAttribute(null=True)


def _params(
    condition: Condition | None = None, update: Sequence[Action] | None = None
) -> dict[str, Any]:
    """Serialise pynamodb expressions into UpdateItem/PutItem parameters."""
    names: dict[str, str] = {}
    values: dict[str, Any] = {}
    out: dict[str, Any] = {}
    if update:
        out["UpdateExpression"] = Update(*update).serialize(names, values)
    if condition is not None:
        out["ConditionExpression"] = condition.serialize(names, values)
    if names:
        out["ExpressionAttributeNames"] = {v: k for k, v in names.items()}
    if values:
        out["ExpressionAttributeValues"] = values
    return out


def _key(job_id: str) -> dict[str, Any]:
    return {"job_id": {"S": job_id}}


R = JobRecord
_RUNNING = JobState.RUNNING.value


def _mine(token: int, worker_id: str) -> Condition:
    # The fence: a write for an attempt lands only while that attempt's token is
    # current and the job is running. The token alone decides; the owner is not
    # part of it, because one worker id can hold two claims of one job (a
    # duplicate delivery to two of its threads) and only the token tells them apart.
    del worker_id
    cond: Condition = (R.token == token) & (R.state == _RUNNING)
    return cond


@dataclass(frozen=True)
class JobTable:
    """Implements the core's ``JobRequests`` for one job table."""

    table: str

    def _update(
        self,
        job_id: str,
        condition: Condition,
        actions: Sequence[Action],
        returns: str = "NONE",
    ) -> Call:
        params: dict[str, Any] = {
            "TableName": self.table,
            "Key": _key(job_id),
            "ReturnValues": returns,
            "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
        }
        params.update(_params(condition, actions))
        return Call("dynamodb", "UpdateItem", params)

    def put_new(
        self,
        *,
        job_id: str,
        job_class: str,
        payload_json: str,
        payload_hash: str,
        wall_now: float,
        stage: str | None = None,
    ) -> Call:
        record = JobRecord(
            job_id=job_id,
            job_class=job_class,
            state=JobState.QUEUED.value,
            token=0,
            attempt=0,
            payload=payload_json,
            payload_hash=payload_hash,
            message_sent=False,
            stage=stage,
            created_at=wall_now,
            updated_at=wall_now,
        )
        params: dict[str, Any] = {
            "TableName": self.table,
            "Item": record.serialize(),
            "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
        }
        params.update(_params(R.job_id.does_not_exist()))
        return Call("dynamodb", "PutItem", params)

    def mark_sent(self, job_id: str, wall_now: float) -> Call:
        return self._update(job_id, R.job_id.exists(), [R.message_sent.set(True)])

    def claim(self, job_id: str, worker_id: str, wall_now: float, lease_seconds: int) -> Call:
        return self._update(
            job_id,
            R.job_id.exists() & R.state.is_in(JobState.QUEUED.value, _RUNNING),
            [
                R.state.set(_RUNNING),
                R.owner.set(worker_id),
                R.token.set(R.token + 1),
                R.attempt.set(R.attempt + 1),
                R.updated_at.set(wall_now),
                R.lease_deadline.set(wall_now + lease_seconds),
                R.last_heartbeat.set(wall_now),
            ],
            returns="ALL_OLD",
        )

    def commit(
        self, job_id: str, token: int, worker_id: str, result_json: str, wall_now: float
    ) -> Call:
        return self._update(
            job_id,
            _mine(token, worker_id),
            [
                R.state.set(JobState.SUCCEEDED.value),
                R.result.set(result_json),
                R.updated_at.set(wall_now),
                R.finished_at.set(wall_now),
                R.reason.remove(),
                R.error_code.remove(),
            ],
        )

    def finish_failed(
        self,
        job_id: str,
        token: int,
        worker_id: str,
        reason: str,
        error_code: str,
        wall_now: float,
    ) -> Call:
        return self._update(
            job_id,
            _mine(token, worker_id),
            [
                R.state.set(JobState.FAILED.value),
                R.reason.set(reason),
                R.error_code.set(error_code),
                R.updated_at.set(wall_now),
                R.finished_at.set(wall_now),
            ],
        )

    def requeue(
        self, job_id: str, token: int, worker_id: str, reason: str, error_code: str, wall_now: float
    ) -> Call:
        # The owner stays recorded: a retried requeue recognises its own write by it.
        return self._update(
            job_id,
            _mine(token, worker_id),
            [
                R.state.set(JobState.QUEUED.value),
                R.reason.set(reason),
                R.error_code.set(error_code),
                R.updated_at.set(wall_now),
                R.lease_deadline.remove(),
            ],
        )

    def park(self, job_id: str, token: int, worker_id: str, reason: str, wall_now: float) -> Call:
        return self._update(
            job_id,
            _mine(token, worker_id),
            [
                R.state.set(JobState.PARKED.value),
                R.reason.set(reason),
                R.error_code.set("parked"),
                R.updated_at.set(wall_now),
                R.lease_deadline.remove(),
            ],
        )

    def advise(
        self, job_id: str, token: int, worker_id: str, wall_now: float, lease_seconds: int
    ) -> Call:
        return self._update(
            job_id,
            _mine(token, worker_id),
            [R.last_heartbeat.set(wall_now), R.lease_deadline.set(wall_now + lease_seconds)],
        )

    def cancel(self, job_id: str, reason: str, wall_now: float) -> Call:
        # Moving the token on fences the current owner out at its next heartbeat.
        return self._update(
            job_id,
            R.job_id.exists() & R.state.is_in(JobState.QUEUED.value, _RUNNING, "parked"),
            [
                R.state.set(JobState.FAILED.value),
                R.token.set(R.token + 1),
                R.reason.set(f"cancelled: {reason}"),
                R.error_code.set("cancelled"),
                R.updated_at.set(wall_now),
                R.finished_at.set(wall_now),
            ],
            returns="ALL_NEW",
        )

    def get(self, job_id: str) -> Call:
        return Call(
            "dynamodb",
            "GetItem",
            {"TableName": self.table, "Key": _key(job_id), "ConsistentRead": True},
        )

    def batch_get(self, job_ids: Sequence[str]) -> Call:
        return Call(
            "dynamodb",
            "BatchGetItem",
            {
                "RequestItems": {
                    self.table: {
                        "Keys": [_key(j) for j in job_ids],
                        "ConsistentRead": True,
                        "ProjectionExpression": "#i, #c, #s, #o, #t, #a, #h, #e, #r",
                        "ExpressionAttributeNames": {
                            "#i": "job_id",
                            "#c": "job_class",
                            "#s": "state",
                            "#o": "owner",
                            "#t": "token",
                            "#a": "attempt",
                            "#h": "payload_hash",
                            "#e": "error_code",
                            "#r": "reason",
                        },
                    }
                }
            },
        )

    def batch_get_retry(self, unprocessed: Mapping[str, Any]) -> Call:
        return Call("dynamodb", "BatchGetItem", {"RequestItems": dict(unprocessed)})

    def batch_items(self, response: Mapping[str, Any]) -> list[Mapping[str, Any]]:
        return list((response.get("Responses") or {}).get(self.table, []))

    def parse(self, item: Mapping[str, Any]) -> JobView:
        return view_of(item)


def view_of(item: Mapping[str, Any]) -> JobView:
    """Read a low-level item (possibly projected) into the core's view."""

    def s(name: str) -> str | None:
        v = item.get(name)
        return None if v is None or "NULL" in v else str(v["S"])

    def n(name: str) -> int:
        v = item.get(name)
        return 0 if v is None or "NULL" in v else int(v["N"])

    sent = item.get("message_sent")
    return JobView(
        job_id=s("job_id") or "",
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
    )


def record_of(item: Mapping[str, Any]) -> JobRecord:
    """Full record (for the CLI and tests)."""
    rec: JobRecord = JobRecord.from_raw_data(dict(item))
    return rec


def create_table_params(model: type[Model], table: str) -> dict[str, Any]:
    """CreateTable parameters for a model (on-demand billing), derived from its keys."""
    keys: list[dict[str, str]] = []
    defs: list[dict[str, str]] = []
    for name, attr in model.get_attributes().items():
        if attr.is_hash_key or attr.is_range_key:
            keys.append({"AttributeName": name, "KeyType": "HASH" if attr.is_hash_key else "RANGE"})
            defs.append({"AttributeName": name, "AttributeType": attr.attr_type})
    keys.sort(key=lambda k: k["KeyType"] != "HASH")
    return {
        "TableName": table,
        "KeySchema": keys,
        "AttributeDefinitions": defs,
        "BillingMode": "PAY_PER_REQUEST",
    }
