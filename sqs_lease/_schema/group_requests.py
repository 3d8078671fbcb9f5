"""The group table's requests: ``GroupTable`` implements the core's ``GroupRequests``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .._core.calls import Call
from .._core.records import (
    GroupView,
)
from .expressions import serialize
from .models import GroupRecord

G = GroupRecord


@dataclass(frozen=True)
class GroupTable:
    """Implements the core's ``GroupRequests`` for one group table."""

    table: str

    def count_job(self, group: str, wall_now: float) -> dict[str, Any]:
        params: dict[str, Any] = {
            "TableName": self.table,
            "Key": {"group_id": {"S": group}},
            "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
        }
        params.update(
            serialize(
                G.cancelled_at.does_not_exist(),
                [
                    G.jobs.add(1),
                    G.created_at.set(G.created_at | wall_now),
                    G.updated_at.set(wall_now),
                ],
            )
        )
        return {"Update": params}

    def cancel(self, group: str, reason: str, wall_now: float) -> Call:
        # The first cancel's time and reason stay: a repeated cancel (to finish one
        # that stopped half-way) changes nothing but its own report.
        params: dict[str, Any] = {
            "TableName": self.table,
            "Key": {"group_id": {"S": group}},
            "ReturnValues": "ALL_NEW",
        }
        params.update(
            serialize(
                None,
                [
                    G.cancelled_at.set(G.cancelled_at | wall_now),
                    G.reason.set(G.reason | reason),
                    G.created_at.set(G.created_at | wall_now),
                    G.updated_at.set(wall_now),
                ],
            )
        )
        return Call("dynamodb", "UpdateItem", params)

    def get(self, group: str) -> Call:
        return Call(
            "dynamodb",
            "GetItem",
            {"TableName": self.table, "Key": {"group_id": {"S": group}}, "ConsistentRead": True},
        )

    def parse(self, item: Mapping[str, Any]) -> GroupView:
        def n(name: str) -> float | None:
            v = item.get(name)
            return None if v is None or "NULL" in v else float(v["N"])

        reason = item.get("reason")
        return GroupView(
            group=str(item.get("group_id", {}).get("S", "")),
            jobs=int(n("jobs") or 0),
            cancelled_at=n("cancelled_at"),
            reason=None if reason is None or "NULL" in reason else str(reason["S"]),
        )
