"""The group table's requests: ``GroupTable`` implements the core's ``GroupRequests``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .._core.calls import Call
from .._core.records import (
    GroupView,
)
from .expressions import item_request
from .models import GroupRecord
from .views import group_view_of

G = GroupRecord


def _key(group: str) -> dict[str, Any]:
    return {"group_id": {"S": group}}


@dataclass(frozen=True)
class GroupTable:
    """Implements the core's ``GroupRequests`` for one group table."""

    table: str

    def count_job(self, group: str, wall_now: float) -> dict[str, Any]:
        params = item_request(
            self.table,
            _key(group),
            G.cancelled_at.does_not_exist(),
            [G.jobs.add(1), G.created_at.set(G.created_at | wall_now), G.updated_at.set(wall_now)],
            ReturnValuesOnConditionCheckFailure="ALL_OLD",
        )
        return {"Update": params}

    def cancel(self, group: str, reason: str, wall_now: float) -> Call:
        # The first cancel's time and reason stay: a repeated cancel (to finish one
        # that stopped half-way) changes nothing but its own report.
        params = item_request(
            self.table,
            _key(group),
            None,
            [
                G.cancelled_at.set(G.cancelled_at | wall_now),
                G.reason.set(G.reason | reason),
                G.created_at.set(G.created_at | wall_now),
                G.updated_at.set(wall_now),
            ],
            ReturnValues="ALL_NEW",
        )
        return Call("dynamodb", "UpdateItem", params)

    def get(self, group: str) -> Call:
        return Call(
            "dynamodb",
            "GetItem",
            {"TableName": self.table, "Key": _key(group), "ConsistentRead": True},
        )

    def parse(self, item: Mapping[str, Any]) -> GroupView:
        return group_view_of(item)
