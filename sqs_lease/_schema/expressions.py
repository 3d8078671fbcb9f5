"""pynamodb condition and update expressions serialised into request parameters."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pynamodb.expressions.condition import Condition
from pynamodb.expressions.update import Action, Update


def serialize(
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
