"""What DynamoDB carries per second: a fleet's throughput model (off in drawn worlds).

DynamoDB bills and limits by capacity units, per second:

- a write is ``ceil(size / 1 KB)`` write units, ``size`` the larger of the item before
  and after (a delete: the item before); a write in a transaction costs twice, and so
  does a ``ConditionCheck``, billed as a write of the item it reads;
- a read is ``ceil(size / 4 KB)`` read units, half for an eventually consistent read;
  a Query adds up the sizes of the items it reads and bills them at once;
- each partition carries at most 1,000 write units and 3,000 read units a second, so
  one key (a hot item, or one key value of a global secondary index) is limited to
  that; a write that would take an index key's partition past it is throttled on
  the base table (an index's back-pressure);
- an on-demand table starts with a warm throughput (a new table: 4,000 write units
  and 12,000 read units a second) and may double it at most every 30 minutes, up to
  the account's table quota (40,000 of each by default).

A request that would take any of its partitions or its table past the second's
limit is refused with ``ProvisionedThroughputExceededException`` (a transaction:
``TransactionCanceledException`` with ``ThrottlingError`` on the item) and nothing
applies. What it consumes is counted when it applies (its real size, after the
update). Figures in ``docs/scale.md`` come from AWS's published limits.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..._schema.create_table import NEW_TABLE_READS, NEW_TABLE_WRITES

Item = dict[str, Any]

KB = 1024


@dataclass(frozen=True)
class Limits:
    """DynamoDB's per-second limits for one table (AWS's published figures)."""

    warm_write: float = float(NEW_TABLE_WRITES)  # a new on-demand table
    warm_read: float = float(NEW_TABLE_READS)
    quota_write: float = 40_000.0  # the account's per-table quota (default)
    quota_read: float = 40_000.0
    partition_write: float = 1_000.0
    partition_read: float = 3_000.0
    doubling: float = 1_800.0  # an on-demand table may double its peak this often


@dataclass
class _Table:
    write: float
    read: float
    since: float = 0.0  # when the current warm throughput was reached
    peak_write: float = 0.0  # the busiest second since then
    peak_read: float = 0.0


@dataclass
class Throttled:
    """A request the model refused: which limit it met."""

    scope: str  # "table" | "key" | "index"
    what: str  # the table, key or index key named


@dataclass
class Throughput:
    """Per-second consumption against :class:`Limits`, for every table of a world."""

    limits: Limits = field(default_factory=Limits)
    second: int = -1
    used: dict[tuple[str, ...], float] = field(default_factory=dict)
    tables: dict[str, _Table] = field(default_factory=dict)
    # Figures a fleet reports: units consumed, requests throttled (by scope), the
    # busiest second per table, and each table's warm throughput over time.
    consumed: dict[str, float] = field(default_factory=dict)
    throttled: dict[str, int] = field(default_factory=dict)
    hot: dict[str, float] = field(default_factory=dict)  # the busiest second per bucket kind
    warmed: list[tuple[float, str, float, float]] = field(default_factory=list)

    def _tick(self, now: float) -> None:
        s = int(now)
        if s == self.second:
            return
        self.fold()
        for name, t in self.tables.items():
            if now - t.since >= self.limits.doubling:
                self._warm(name, t, now)
        self.second = s
        self.used = {}

    def fold(self) -> None:
        """Count the current second in the peaks (each second's, once it is over; the
        report's, at the end of a run)."""
        for name, t in self.tables.items():
            t.peak_write = max(t.peak_write, self.used.get(("w", name), 0.0))
            t.peak_read = max(t.peak_read, self.used.get(("r", name), 0.0))
        for k, v in self.used.items():
            kind = k[0] + ":" + ("table" if len(k) == 2 else "key" if len(k) == 3 else "index")
            if v > self.hot.get(kind, 0.0):
                self.hot[kind] = v

    def _warm(self, name: str, t: _Table, now: float) -> None:
        """On-demand scaling: a table that ran at half its throughput or more may
        double it (never past the quota), once per ``doubling``."""
        lim = self.limits
        w, r = t.write, t.read
        if t.peak_write >= t.write / 2:
            t.write = min(lim.quota_write, 2 * t.write)
        if t.peak_read >= t.read / 2:
            t.read = min(lim.quota_read, 2 * t.read)
        t.since, t.peak_write, t.peak_read = now, 0.0, 0.0
        if (t.write, t.read) != (w, r):
            self.warmed.append((round(now, 3), name, t.write, t.read))

    def table(self, name: str) -> _Table:
        t = self.tables.get(name)
        if t is None:
            t = self.tables[name] = _Table(self.limits.warm_write, self.limits.warm_read)
        return t

    def admit(
        self, now: float, charges: Sequence[tuple[tuple[str, ...], float]]
    ) -> Throttled | None:
        """Whether every bucket can take its charge this second (nothing is charged)."""
        self._tick(now)
        for bucket, units in charges:
            if self.used.get(bucket, 0.0) + units > self._limit(bucket):
                scope = "table" if len(bucket) == 2 else "key" if len(bucket) == 3 else "index"
                self.throttled[scope] = self.throttled.get(scope, 0) + 1
                return Throttled(scope, "/".join(bucket[1:]))
        return None

    def charge(self, now: float, charges: Sequence[tuple[tuple[str, ...], float]]) -> None:
        self._tick(now)
        for bucket, units in charges:
            self.used[bucket] = self.used.get(bucket, 0.0) + units
            if len(bucket) == 2:
                k = bucket[0] + ":" + bucket[1]
                self.consumed[k] = self.consumed.get(k, 0.0) + units

    def _limit(self, bucket: tuple[str, ...]) -> float:
        kind = bucket[0]
        if len(bucket) == 2:
            t = self.table(bucket[1])
            return t.write if kind == "w" else t.read
        return self.limits.partition_write if kind == "w" else self.limits.partition_read


def size(item: Mapping[str, Any] | None) -> int:
    """DynamoDB's item size, near enough: names and values in UTF-8 (the simulated
    table's 400 KB check uses it too)."""
    total = 0
    for name, value in (item or {}).items():
        total += len(name.encode("utf-8"))
        for kind, v in value.items():
            total += len(v.encode("utf-8")) if kind in ("S", "N") else len(json.dumps(v))
    return total


def write_units(old_size: int, new_size: int) -> float:
    """A write's units: the larger of the item's sizes before and after, in 1 KB steps."""
    return float(max(1, math.ceil(max(old_size, new_size) / KB)))


def read_units(nbytes: int, consistent: bool) -> float:
    units = float(max(1, math.ceil(nbytes / (4 * KB))))
    return units if consistent else units / 2
