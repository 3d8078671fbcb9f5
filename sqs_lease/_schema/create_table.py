"""CreateTable parameters derived from a model's keys and global secondary indexes."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pynamodb.indexes import GlobalSecondaryIndex
from pynamodb.models import Model

from .._errors import ConfigError

NEW_TABLE_READS = 12_000
NEW_TABLE_WRITES = 4_000
"""A new on-demand table's warm throughput (read and write units a second), and the
least a warm throughput may be set to: AWS's published figures."""


@dataclass(frozen=True)
class WarmThroughput:
    """The read and write units a second a table (and each of its indexes) can take at
    once, set before a launch instead of waiting for on-demand scaling, which doubles a
    table's peak at most every 30 minutes (docs/scale.md). ``None``: leave as is."""

    reads: int | None = None
    writes: int | None = None

    def __post_init__(self) -> None:
        if self.reads is None and self.writes is None:
            raise ConfigError("WarmThroughput: set reads, writes or both")
        for field, value, least in (
            ("reads", self.reads, NEW_TABLE_READS),
            ("writes", self.writes, NEW_TABLE_WRITES),
        ):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise ConfigError(f"WarmThroughput.{field}: a whole number of units, not {value!r}")
            if value is not None and value < least:
                raise ConfigError(
                    f"WarmThroughput.{field}={value}: a new on-demand table already has "
                    f"{least:,}; set {least:,} or more, or leave it out"
                )

    def param(self, have: Mapping[str, Any] | None = None) -> dict[str, int]:
        """DynamoDB's ``WarmThroughput`` value. With ``have`` (as described): empty when
        nothing would rise (DynamoDB never lowers a warm throughput), else both units,
        each the higher of the two, so an update keeps what it does not raise."""
        units = (("ReadUnitsPerSecond", self.reads), ("WriteUnitsPerSecond", self.writes))
        if have is None:
            return {key: value for key, value in units if value is not None}
        out: dict[str, int] = {}
        rises = False
        for key, value in units:
            held = int(have.get(key, 0) or 0)
            if value is not None and value > held:
                out[key], rises = value, True
            elif held:
                out[key] = held
        return out if rises else {}


def create_table_params(
    model: type[Model], table: str, warm: WarmThroughput | None = None
) -> dict[str, Any]:
    """CreateTable parameters for a model (on-demand billing), derived from its keys
    and its global secondary indexes; ``warm``: the table's and each index's warm
    throughput."""
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
        if warm is not None:
            index["WarmThroughput"] = warm.param()
    if indexes:
        params["GlobalSecondaryIndexes"] = indexes
    if warm is not None:
        params["WarmThroughput"] = warm.param()
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
