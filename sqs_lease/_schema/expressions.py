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


def item_request(
    table: str,
    key: dict[str, Any],
    condition: Condition | None = None,
    update: Sequence[Action] | None = None,
    **options: Any,
) -> dict[str, Any]:
    """The parameters of a request on one item (UpdateItem, a transaction's Update or
    ConditionCheck): its table and key, ``options`` (ReturnValues...), the expressions."""
    params: dict[str, Any] = {"TableName": table, "Key": key, **options}
    params.update(serialize(condition, update))
    return params


def key_query(
    table: str,
    attribute: str,
    value: str,
    *,
    index: str | None = None,
    forward: bool = True,
    **options: Any,
) -> dict[str, Any]:
    """A Query's parameters for the items whose hash key ``attribute`` (of the table,
    or of ``index``) is ``value``; ``forward``: the range key ascending."""
    return {
        "TableName": table,
        **({} if index is None else {"IndexName": index}),
        "KeyConditionExpression": "#k = :k",
        "ExpressionAttributeNames": {"#k": attribute},
        "ExpressionAttributeValues": {":k": {"S": value}},
        "ScanIndexForward": forward,
        **options,
    }
