"""CreateTable parameters derived from a model's keys and global secondary indexes."""

from __future__ import annotations

from typing import Any

from pynamodb.indexes import GlobalSecondaryIndex
from pynamodb.models import Model


def create_table_params(model: type[Model], table: str) -> dict[str, Any]:
    """CreateTable parameters for a model (on-demand billing), derived from its keys
    and its global secondary indexes."""
    keys: list[dict[str, str]] = []
    defs: list[dict[str, str]] = []
    for name, attr in model.get_attributes().items():
        if attr.is_hash_key or attr.is_range_key:
            keys.append({"AttributeName": name, "KeyType": "HASH" if attr.is_hash_key else "RANGE"})
            defs.append({"AttributeName": name, "AttributeType": attr.attr_type})
    keys.sort(key=lambda k: k["KeyType"] != "HASH")
    params: dict[str, Any] = {
        "TableName": table,
        "KeySchema": keys,
        "AttributeDefinitions": defs,
        "BillingMode": "PAY_PER_REQUEST",
    }
    indexes = [index_params(index) for index in _indexes(model)]
    for index in indexes:
        for d in index.pop("_defs"):
            if d not in defs:
                defs.append(d)
    if indexes:
        params["GlobalSecondaryIndexes"] = indexes
    return params


def _indexes(model: type[Model]) -> list[type[GlobalSecondaryIndex[Any]]]:
    found = {type(v) for v in vars(model).values() if isinstance(v, GlobalSecondaryIndex)}
    return sorted(found, key=lambda i: str(i.Meta.index_name))


def index_params(index: type[GlobalSecondaryIndex[Any]]) -> dict[str, Any]:
    """One GlobalSecondaryIndexes entry (with its key definitions under ``_defs``)."""
    keys: list[dict[str, str]] = []
    defs: list[dict[str, str]] = []
    for name, attr in index.Meta.attributes.items():
        if attr.is_hash_key or attr.is_range_key:
            keys.append({"AttributeName": name, "KeyType": "HASH" if attr.is_hash_key else "RANGE"})
            defs.append({"AttributeName": name, "AttributeType": attr.attr_type})
    keys.sort(key=lambda k: k["KeyType"] != "HASH")
    projection: dict[str, Any] = {"ProjectionType": index.Meta.projection.projection_type}
    if index.Meta.projection.non_key_attributes:
        projection["NonKeyAttributes"] = list(index.Meta.projection.non_key_attributes)
    return {
        "IndexName": index.Meta.index_name,
        "KeySchema": keys,
        "Projection": projection,
        "_defs": defs,
    }
