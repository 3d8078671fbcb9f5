"""The slots table's requests: ``SlotTable`` implements the core's ``SlotRequests``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pynamodb.expressions.condition import Condition
from pynamodb.expressions.update import Action

from .._core.calls import Call
from .._core.slots import SlotView
from .expressions import item_request
from .models import SlotRecord
from .views import slot_view_of

S = SlotRecord


@dataclass(frozen=True)
class SlotTable:
    """Implements the core's ``SlotRequests`` for one slots table."""

    table: str

    def read(self, keys: Sequence[str]) -> Call:
        return Call(
            "dynamodb",
            "BatchGetItem",
            {
                "RequestItems": {
                    self.table: {
                        "Keys": [{"slot": {"S": k}} for k in keys],
                        "ConsistentRead": True,
                    }
                }
            },
        )

    def items(self, response: Mapping[str, Any]) -> list[Mapping[str, Any]]:
        return list((response.get("Responses") or {}).get(self.table, []))

    def parse(self, item: Mapping[str, Any]) -> SlotView:
        return slot_view_of(item)

    def _update(self, key: str, condition: Condition, update: list[Action]) -> Call:
        return Call(
            "dynamodb",
            "UpdateItem",
            item_request(self.table, {"slot": {"S": key}}, condition, update),
        )

    def take(
        self,
        key: str,
        *,
        seen_version: int,
        job_id: str,
        token: int,
        worker_id: str,
        wall_now: float,
    ) -> Call:
        # The fence: the take lands only on the version this taker read, so of two
        # takers of one slot exactly one wins.
        cond: Condition = (
            S.slot.does_not_exist() if seen_version == 0 else S.version == seen_version
        )
        return self._update(
            key,
            cond,
            [
                S.version.set(seen_version + 1),
                S.job_id.set(job_id),
                S.token.set(token),
                S.owner.set(worker_id),
                S.taken_at.set(wall_now),
                S.updated_at.set(wall_now),
            ],
        )

    def give_back(self, key: str, *, job_id: str, token: int, wall_now: float) -> Call:
        return self._update(
            key,
            (S.job_id == job_id) & (S.token == token),
            [
                S.version.add(1),
                S.job_id.remove(),
                S.token.remove(),
                S.owner.remove(),
                S.taken_at.remove(),
                S.updated_at.set(wall_now),
            ],
        )
