"""Simulated DynamoDB: tables of DynamoDB-JSON items, conditional writes applied in order.

Operations: PutItem, UpdateItem, DeleteItem, GetItem, BatchGetItem, Query (of a
sparse global secondary index: items without its keys are not in it; always
consistent here, where DynamoDB's index may lag) and TransactWriteItems
(ConditionCheck/Put/Update/Delete, all or nothing,
``TransactionCanceledException`` with per-item ``CancellationReasons``).
Conditions and updates are evaluated from the request's own expressions
(:mod:`sqs_lease.testing._sim.expr`), so a wrong expression in a request is caught.
``ReturnValues`` NONE/ALL_OLD/ALL_NEW/UPDATED_OLD/UPDATED_NEW and
``ReturnValuesOnConditionCheckFailure=ALL_OLD`` behave as in DynamoDB.

Faults (seeded, only while faults are on): ``UnprocessedKeys`` in BatchGetItem,
throttling (nothing applied), transactions cancelled for a transient reason
(``ThrottlingError``, ``TransactionConflict``, ``ProvisionedThroughputExceeded``
on one item, ``None`` on the others; nothing applied), and eventually
consistent reads (a read without ``ConsistentRead`` may see the previous version
of an item written in the last second). Each applied change of an item is
reported to ``on_write`` (the invariant checker listens there).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ..._core.calls import Err, ErrorKind, Ok, Outcome
from ..._core.limits import ITEM_LIMIT  # DynamoDB's item limit: the one constant
from .capacity import Throttled, Throughput, read_units, write_units
from .capacity import size as _item_size
from .chaos import Chaos
from .expr import ExpressionError, Expressions, Item, request_expressions, stored

Key = tuple[tuple[str, str, str], ...]
Charges = list[tuple[tuple[str, ...], float]]
WriteHook = Callable[[str, Key, "Item | None", "Item | None", Any], None]


@dataclass(frozen=True)
class IndexSpec:
    """A global secondary index: its keys, and the attributes it projects (None: all)."""

    name: str
    hash_key: str
    range_key: str | None = None
    projects: tuple[str, ...] | None = None


@dataclass(frozen=True)
class TableSpec:
    name: str
    hash_key: str
    range_key: str | None = None
    indexes: tuple[IndexSpec, ...] = ()


@dataclass
class DdbFaults:
    idempotent_tokens: bool = True  # ClientRequestToken honoured (AWS); moto ignores it
    unprocessed: float = 0.0  # per BatchGetItem call
    throttle: float = 0.0  # per call
    stale_read_window: float = 1.0  # seconds an eventually consistent read may lag
    # widened world (txn_transient): a TransactWriteItems cancelled for throttling or a
    # conflicting transaction on one of its items; nothing applied, reasons per item
    txn_transient: float = 0.0


TRANSIENT_REASONS = ("ThrottlingError", "TransactionConflict", "ProvisionedThroughputExceeded")
_TRANSIENT_MESSAGES = {
    "ThrottlingError": "Throughput exceeds the current capacity for one or more global "
    "secondary indexes. DynamoDB is automatically scaling your index so please try again "
    "shortly.",
    "TransactionConflict": "Transaction is ongoing for the item",
    "ProvisionedThroughputExceeded": "The level of configured provisioned throughput for the "
    "table was exceeded",
}


class _Invalid(Exception):
    pass


def _validation(msg: str) -> Err:
    return Err(ErrorKind.VALIDATION, "ValidationException", "", msg)


def _cancelled(reasons: Iterable[dict[str, Any]]) -> Err:
    """A cancelled transaction as DynamoDB answers it: one reason per item, in order,
    their codes repeated in the message."""
    every = tuple(reasons)
    codes = ", ".join(r["Code"] for r in every)
    return Err(
        ErrorKind.TRANSACTION_CANCELLED,
        "TransactionCanceledException",
        "",
        f"Transaction cancelled, please refer cancellation reasons for specific reasons [{codes}]",
        None,
        every,
    )


_TOO_LARGE = "Item size has exceeded the maximum allowed size"


def _diff_attrs(a: Item | None, b: Item | None) -> Item:
    a = a or {}
    b = b or {}
    return {k: v for k, v in a.items() if b.get(k) != v}


class SimDynamo:
    def __init__(
        self,
        tables: list[TableSpec],
        chaos: Chaos,
        faults: DdbFaults | None = None,
        on_write: WriteHook | None = None,
    ) -> None:
        self.specs = {t.name: t for t in tables}
        self.items: dict[str, dict[Key, Item]] = {t.name: {} for t in tables}
        self._prev: dict[str, dict[Key, tuple[Item | None, float]]] = {t.name: {} for t in tables}
        self.chaos = chaos
        self.faults = faults or DdbFaults()
        self.on_write = on_write
        self.now = 0.0
        self.calls: dict[str, int] = {}
        self._tokens: dict[str, tuple[str, float]] = {}
        # oversize: refuse items over 400 KB as DynamoDB does (off: no cost elsewhere)
        self.item_limit = False
        # A fleet (fleet.py): the throughput model (capacity.py; None: unlimited, as in
        # every drawn world), and indexes kept per key value so a Query reads its key's
        # items, not the whole table (a drawn world's Query scans, in table order).
        self.throughput: Throughput | None = None
        self.indexed = False
        # (table, index) -> index key value -> the table keys holding it
        self._members: dict[tuple[str, str], dict[str, dict[Key, None]]] = {}
        # (table, key) -> (the item, its size): sizes are the model's main cost
        self._sizes: dict[tuple[str, Key], tuple[Item, int]] = {}

    # ---------------------------------------------------------------- helpers

    def key_of(self, table: str, key: Mapping[str, Any], *, item: bool = False) -> Key:
        spec = self.specs.get(table)
        if spec is None:
            raise _Invalid("table")
        names = [spec.hash_key] + ([spec.range_key] if spec.range_key else [])
        if not item and set(key) != set(names):
            raise ExpressionError("The provided key element does not match the schema")
        out: list[tuple[str, str, str]] = []
        for n in names:
            av = key.get(n)
            if not isinstance(av, Mapping) or len(av) != 1:
                raise ExpressionError(
                    f"One or more parameter values were invalid: Missing the key {n} in the item"
                )
            t = next(iter(av))
            out.append((n, t, str(av[t])))
        return tuple(out)

    def key_dict(self, table: str, key: Key) -> Item:
        return {n: {t: v} for n, t, v in key}

    def get(self, table: str, key: Mapping[str, Any]) -> Item | None:
        """Direct read (no fault, no latency): for the checker and tests."""
        return self.items[table].get(self.key_of(table, key))

    def _read(self, table: str, k: Key, consistent: bool) -> Item | None:
        cur = self.items[table].get(k)
        if not consistent:
            prev = self._prev[table].get(k)
            if (
                prev is not None
                and self.now - prev[1] < self.faults.stale_read_window
                and self.chaos.roll("stale_read", 0.5)
            ):
                return prev[0]
        return cur

    def _write(self, table: str, k: Key, new: Item | None, origin: Any) -> None:
        old = self.items[table].get(k)
        self._prev[table][k] = (old, self.now)
        if new is None:
            self.items[table].pop(k, None)
        else:
            self.items[table][k] = new
        if self.indexed:
            self._index(table, k, old, new)
        if self.on_write is not None:
            self.on_write(table, k, old, new, origin)

    # ---------------------------------------------------------------- a fleet's model

    def _index(self, table: str, k: Key, old: Item | None, new: Item | None) -> None:
        for idx in self.specs[table].indexes:
            was, now = _index_value(idx, old), _index_value(idx, new)
            if was == now:
                continue
            members = self._members.setdefault((table, idx.name), {})
            if was is not None:
                members.get(was, {}).pop(k, None)
            if now is not None:
                members.setdefault(now, {})[k] = None

    def _write_charges(
        self, table: str, k: Key, old: Item | None, new: Item | None, factor: float = 1.0
    ) -> Charges:
        """The units a write consumes: the table, the item's partition, and each index
        key value's partition whose projected item changes (a moved key: a delete
        there and a put here)."""
        units = write_units(self._size(table, k, old), self._size(table, k, new)) * factor
        key = _key_text(k)
        charges: Charges = [(("w", table), units), (("w", table, key), units)]
        spec = self.specs[table]
        for idx in spec.indexes:
            was, now = _index_value(idx, old), _index_value(idx, new)
            p_old, p_new = _projected(spec, idx, old), _projected(spec, idx, new)
            if was == now:
                if now is not None and p_old != p_new:
                    charges.append(
                        (("w", table, idx.name, now), write_units(_sz(p_old), _sz(p_new)))
                    )
                continue
            if was is not None:
                charges.append((("w", table, idx.name, was), write_units(_sz(p_old), 0)))
            if now is not None:
                charges.append((("w", table, idx.name, now), write_units(0, _sz(p_new))))
        return charges

    def _size(self, table: str, k: Key, item: Item | None) -> int:
        if item is None:
            return 0
        seen = self._sizes.get((table, k))
        if seen is not None and seen[0] is item:
            return seen[1]
        n = _item_size(item)
        self._sizes[(table, k)] = (item, n)
        return n

    def _metered(self, charges: Charges) -> Throttled | None:
        """Admit ``charges`` (summed per bucket) or say which limit refuses them;
        admitted, they are consumed."""
        tp = self.throughput
        if tp is None:
            return None
        summed: dict[tuple[str, ...], float] = {}
        for bucket, units in charges:
            summed[bucket] = summed.get(bucket, 0.0) + units
        refused = tp.admit(self.now, list(summed.items()))
        if refused is None:
            tp.charge(self.now, list(summed.items()))
        return refused

    def _write_metered(self, table: str, k: Key, old: Item | None, new: Item | None) -> Err | None:
        if self.throughput is None:
            return None
        refused = self._metered(self._write_charges(table, k, old, new))
        return None if refused is None else _throttled(refused)

    def _read_metered(
        self, table: str, items: list[tuple[Key, Item | None]], consistent: bool
    ) -> Err | None:
        if self.throughput is None:
            return None
        charges: Charges = []
        for k, item in items:
            units = read_units(self._size(table, k, item), consistent)
            charges += [(("r", table), units), (("r", table, _key_text(k)), units)]
        refused = self._metered(charges)
        return None if refused is None else _throttled(refused)

    # ---------------------------------------------------------------- entry

    def handle(self, op: str, params: Mapping[str, Any], now: float, origin: Any = None) -> Outcome:
        self.now = now
        self.calls[op] = self.calls.get(op, 0) + 1
        if self.chaos.roll("ddb_throttle", self.faults.throttle):
            return Err(
                ErrorKind.THROTTLED,
                "ProvisionedThroughputExceededException",
                "",
                "The level of configured provisioned throughput for the table was exceeded",
            )
        fn = getattr(self, "_op_" + op, None)
        if fn is None:
            return _validation(f"unsupported operation {op}")
        try:
            result: Outcome = fn(params, origin)
        except ExpressionError as exc:
            return _validation(str(exc))
        except _Invalid:
            return Err(
                ErrorKind.NOT_FOUND,
                "ResourceNotFoundException",
                "",
                "Requested resource not found",
            )
        return result

    # ---------------------------------------------------------------- single-item writes

    def _cond_failed(self, params: Mapping[str, Any], old: Item | None) -> Err:
        want = params.get("ReturnValuesOnConditionCheckFailure", "NONE")
        item = dict(old) if (want == "ALL_OLD" and old is not None) else None
        return Err(
            ErrorKind.CONDITION_FAILED,
            "ConditionalCheckFailedException",
            "",
            "The conditional request failed",
            item,
        )

    def _returns(
        self, params: Mapping[str, Any], old: Item | None, new: Item | None
    ) -> dict[str, Any]:
        want = params.get("ReturnValues", "NONE")
        attrs: Item | None
        if want == "NONE":
            return {}
        if want == "ALL_OLD":
            attrs = old
        elif want == "ALL_NEW":
            attrs = new
        elif want == "UPDATED_OLD":
            attrs = _diff_attrs(old, new) or None
        elif want == "UPDATED_NEW":
            attrs = _diff_attrs(new, old) or None
        else:
            raise ExpressionError(f"ReturnValues {want} is not valid")
        return {"Attributes": dict(attrs)} if attrs else {}

    def _op_PutItem(self, params: Mapping[str, Any], origin: Any) -> Outcome:
        table = params["TableName"]
        item: Item = {k: stored(v) for k, v in params["Item"].items()}
        k = self.key_of(table, item, item=True)
        ex = request_expressions(params)
        if ex.update is not None or ex.projection is not None:
            raise ExpressionError("PutItem takes a ConditionExpression only")
        old = self.items[table].get(k)
        if not ex.check(old):
            return self._cond_failed(params, old)
        if params.get("ReturnValues", "NONE") not in ("NONE", "ALL_OLD"):
            raise ExpressionError("ReturnValues for PutItem must be NONE or ALL_OLD")
        if self.item_limit and _item_size(item) > ITEM_LIMIT:
            return _validation(_TOO_LARGE)
        refused = self._write_metered(table, k, old, item)
        if refused is not None:
            return refused
        self._write(table, k, item, origin)
        return Ok(self._returns(params, old, item))

    def _addressed(self, params: Mapping[str, Any]) -> tuple[str, Key, Expressions, Item | None]:
        """A keyed write's table, key and expressions, and the item the key holds now."""
        table = params["TableName"]
        k = self.key_of(table, params["Key"])
        ex = request_expressions(params)
        return table, k, ex, self.items[table].get(k)

    def _op_UpdateItem(self, params: Mapping[str, Any], origin: Any) -> Outcome:
        table, k, ex, old = self._addressed(params)
        if not ex.check(old):
            return self._cond_failed(params, old)
        new = ex.apply(old, self.key_dict(table, k))
        if self.item_limit and new is not None and _item_size(new) > ITEM_LIMIT:
            return _validation(_TOO_LARGE)  # nothing applied (AWS; moto applies part)
        refused = self._write_metered(table, k, old, new)
        if refused is not None:
            return refused
        self._write(table, k, new, origin)
        return Ok(self._returns(params, old, new))

    def _op_DeleteItem(self, params: Mapping[str, Any], origin: Any) -> Outcome:
        table, k, ex, old = self._addressed(params)
        if not ex.check(old):
            return self._cond_failed(params, old)
        if old is not None:
            refused = self._write_metered(table, k, old, None)
            if refused is not None:
                return refused
            self._write(table, k, None, origin)
        return Ok(self._returns(params, old, None))

    # ---------------------------------------------------------------- reads

    def _op_GetItem(self, params: Mapping[str, Any], origin: Any) -> Outcome:
        table = params["TableName"]
        k = self.key_of(table, params["Key"])
        ex = request_expressions(params)
        consistent = bool(params.get("ConsistentRead", False))
        refused = self._read_metered(table, [(k, self.items[table].get(k))], consistent)
        if refused is not None:
            return refused
        item = self._read(table, k, consistent)
        return Ok({"Item": ex.project(item)} if item is not None else {})

    def _op_BatchGetItem(self, params: Mapping[str, Any], origin: Any) -> Outcome:
        request: Mapping[str, Any] = params["RequestItems"]
        total = sum(len(v.get("Keys", [])) for v in request.values())
        if total > 100:
            raise ExpressionError("Too many items requested for the BatchGetItem call")
        if total == 0:
            raise ExpressionError("1 validation error detected: RequestItems must not be empty")
        responses: dict[str, list[Item]] = {}
        unprocessed: dict[str, dict[str, Any]] = {}
        cut = self.chaos.roll("ddb_unprocessed_keys", self.faults.unprocessed)
        for table, spec in request.items():
            ex = request_expressions(spec)
            keys = list(spec.get("Keys", []))
            seen: set[Key] = set()
            parsed = []
            for key in keys:
                k = self.key_of(table, key)
                if k in seen:
                    raise ExpressionError("Provided list of item keys contains duplicates")
                seen.add(k)
                parsed.append((key, k))
            skipped: list[Mapping[str, Any]] = []
            if cut:
                n = self.chaos.randint(1, len(parsed))
                skip = {i for i in self.chaos.sample(range(len(parsed)), n)}
                skipped = [parsed[i][0] for i in sorted(skip)]
                parsed = [p for i, p in enumerate(parsed) if i not in skip]
            out = responses.setdefault(table, [])
            consistent = bool(spec.get("ConsistentRead", False))
            if self.throughput is not None:
                # (a throttled batch: every key of it comes back unprocessed)
                held = [(k, self.items[table].get(k)) for _, k in parsed]
                if self._read_metered(table, held, consistent) is not None:
                    skipped = [key for key, _ in parsed] + skipped
                    parsed = []
            for _, k in parsed:
                item = self._read(table, k, consistent)
                if item is not None:
                    out.append(ex.project(item))
            if skipped:
                rest = {n: v for n, v in spec.items() if n != "Keys"}
                unprocessed[table] = {"Keys": skipped, **rest}
        return Ok({"Responses": responses, "UnprocessedKeys": unprocessed})

    def _op_Query(self, params: Mapping[str, Any], origin: Any) -> Outcome:
        table = params["TableName"]
        spec = self.specs.get(table)
        if spec is None:
            raise _Invalid("table")
        name = params.get("IndexName")
        index = next((i for i in spec.indexes if i.name == name), None)
        if name is None or index is None:
            raise ExpressionError(f"The table does not have the specified index: {name}")
        ex = request_expressions(params, condition_key="KeyConditionExpression")
        keys = [index.hash_key] + ([index.range_key] if index.range_key else [])
        found = [
            item
            for item in self._index_candidates(table, index, params)
            if all(k in item for k in keys) and ex.check(item)
        ]

        def order(item: Item) -> Any:
            if index.range_key is None:
                return 0
            t, v = next(iter(item[index.range_key].items()))
            return float(v) if t == "N" else v

        found.sort(key=order, reverse=not params.get("ScanIndexForward", True))
        start = params.get("ExclusiveStartKey")
        if start:
            # On from the page's last item (its index and table keys), as DynamoDB does.
            at = next(
                (n for n, i in enumerate(found) if all(i.get(k) == v for k, v in start.items())),
                None,
            )
            if at is not None:
                found = found[at + 1 :]
            else:  # that item has left the index since: on from its place in the order
                forward = params.get("ScanIndexForward", True)
                found = [i for i in found if (order(i) > order(start)) == forward]
        limit = params.get("Limit")
        page = found[: int(limit)] if limit else found
        if self.throughput is not None and page:
            # billed on the items read (an index's own partition; eventually consistent)
            value = _index_value(index, page[0]) or ""
            units = read_units(sum(_item_size(i) for i in page), False)
            refused = self._metered([(("r", table, index.name, value), units)])
            if refused is not None:
                return _throttled(refused)
        keep = None if index.projects is None else set(index.projects) | set(keys)
        if keep is not None:
            keep |= {spec.hash_key} | ({spec.range_key} if spec.range_key else set())
        out: dict[str, Any] = {
            "Items": [
                dict(i) if keep is None else {k: v for k, v in i.items() if k in keep} for i in page
            ],
            "Count": len(page),
        }
        if limit and len(found) > len(page):
            last = page[-1]
            out["LastEvaluatedKey"] = {k: last[k] for k in [*keys, spec.hash_key] if k in last}
        return Ok(out)

    def _index_candidates(
        self, table: str, index: IndexSpec, params: Mapping[str, Any]
    ) -> Iterable[Item]:
        """The items a Query may match: the whole table, or where the table is indexed,
        those under the index key values the request names."""
        if not self.indexed:
            return self.items[table].values()
        members = self._members.get((table, index.name), {})
        picked: dict[Key, None] = {}
        for av in dict(params.get("ExpressionAttributeValues") or {}).values():
            if isinstance(av, Mapping) and len(av) == 1:
                picked.update(members.get(str(next(iter(av.values()))), {}))
        items = self.items[table]
        return [items[k] for k in picked if k in items]

    # ---------------------------------------------------------------- transactions

    def _op_TransactWriteItems(self, params: Mapping[str, Any], origin: Any) -> Outcome:
        if self.chaos.roll_wide("ddb_txn_transient", self.faults.txn_transient):
            return self._transient_cancel(params)
        token = params.get("ClientRequestToken")
        if token and self.faults.idempotent_tokens:
            # Idempotent for 10 minutes, as in DynamoDB: a repeat of an applied request
            # succeeds without applying it again; another request under the token fails.
            digest = json.dumps(
                {k: v for k, v in params.items() if k != "ClientRequestToken"},
                sort_keys=True,
                default=str,
            )
            seen = self._tokens.get(str(token))
            if seen is not None and self.now - seen[1] < 600.0:
                if seen[0] != digest:
                    return Err(
                        ErrorKind.INVALID,
                        "IdempotentParameterMismatchException",
                        "",
                        "The request uses the same client token as a previous, but "
                        "non-identical request.",
                    )
                return Ok({})
            out = self._transact(params, origin)
            if isinstance(out, Ok):
                self._tokens[str(token)] = (digest, self.now)
            return out
        return self._transact(params, origin)

    def _transient_cancel(self, params: Mapping[str, Any]) -> Err:
        """Cancelled as DynamoDB cancels under contention: one item's reason is transient."""
        n = len(list(params.get("TransactItems", [])))
        which = self.chaos.wide.randrange(max(1, n))
        code = self.chaos.wide.choice(TRANSIENT_REASONS)
        return _cancelled(
            {"Code": code, "Message": _TRANSIENT_MESSAGES[code]} if i == which else {"Code": "None"}
            for i in range(n)
        )

    def _transact(self, params: Mapping[str, Any], origin: Any) -> Outcome:
        entries = list(params.get("TransactItems", []))
        if not entries or len(entries) > 100:
            raise ExpressionError("TransactItems must have 1..100 entries")
        plan: list[tuple[str, str, Key, Mapping[str, Any], Any]] = []
        targets: set[tuple[str, Key]] = set()
        for entry in entries:
            if len(entry) != 1:
                raise ExpressionError("Each TransactItem must name exactly one operation")
            kind, spec = next(iter(entry.items()))
            table = spec["TableName"]
            if kind == "Put":
                k = self.key_of(table, spec["Item"], item=True)
            elif kind in ("Update", "Delete", "ConditionCheck"):
                k = self.key_of(table, spec["Key"])
            else:
                raise ExpressionError(f"unknown transaction operation {kind}")
            if (table, k) in targets:
                raise ExpressionError(
                    "Transaction request cannot include multiple operations on one item"
                )
            targets.add((table, k))
            ex = request_expressions(spec)
            if kind == "ConditionCheck" and ex.condition is None:
                raise ExpressionError("ConditionCheck needs a ConditionExpression")
            plan.append((kind, table, k, spec, ex))
        reasons: list[dict[str, Any]] = []
        failed = False
        for _kind, table, k, spec, ex in plan:
            old = self.items[table].get(k)
            if ex.check(old):
                reasons.append({"Code": "None"})
            else:
                failed = True
                reason: dict[str, Any] = {
                    "Code": "ConditionalCheckFailed",
                    "Message": "The conditional request failed",
                }
                if spec.get("ReturnValuesOnConditionCheckFailure") == "ALL_OLD" and old:
                    reason["Item"] = dict(old)
                reasons.append(reason)
        if failed:
            return _cancelled(reasons)
        # All conditions hold: compute every new item first (an invalid update cancels
        # the whole transaction), then apply.
        writes: list[tuple[str, Key, Item | None]] = []
        charges: list[Charges] = []
        for kind, table, k, spec, ex in plan:
            old = self.items[table].get(k)
            if kind == "Put":
                writes.append((table, k, {n: stored(v) for n, v in spec["Item"].items()}))
            elif kind == "Update":
                writes.append((table, k, ex.apply(old, self.key_dict(table, k))))
            elif kind == "Delete":
                writes.append((table, k, None))
            if self.throughput is not None:  # each item billed twice, a check as a write
                new = old if kind == "ConditionCheck" else writes[-1][2]
                charges.append(self._write_charges(table, k, old, new, 2.0))
        if self.throughput is not None:
            refused = self._metered([c for entry in charges for c in entry])
            if refused is not None:
                return _throttled_cancel(refused, charges)
        for table, k, new in writes:
            self._write(table, k, new, origin)
        return Ok({})


# --------------------------------------------------------------------------- a fleet's model


def _sz(item: Item | None) -> int:
    return 0 if item is None else _item_size(item)


def _key_text(k: Key) -> str:
    return "|".join(v for _, _, v in k)


def _index_value(idx: IndexSpec, item: Item | None) -> str | None:
    """The item's index key value (None: the item is not in the sparse index)."""
    if item is None or idx.hash_key not in item:
        return None
    if idx.range_key is not None and idx.range_key not in item:
        return None
    return str(next(iter(item[idx.hash_key].values())))


def _projected(spec: TableSpec, idx: IndexSpec, item: Item | None) -> Item | None:
    if item is None or _index_value(idx, item) is None:
        return None
    if idx.projects is None:
        return item
    keep = {spec.hash_key, idx.hash_key, *idx.projects}
    keep |= {n for n in (spec.range_key, idx.range_key) if n}
    return {n: v for n, v in item.items() if n in keep}


_INDEX_THROTTLED = (
    "Throughput exceeds the current capacity for one or more global secondary indexes. "
    "DynamoDB is automatically scaling your index so please try again shortly."
)
_TABLE_THROTTLED = "The level of configured provisioned throughput for the table was exceeded"


def _throttled(t: Throttled) -> Err:
    message = _INDEX_THROTTLED if t.scope == "index" else _TABLE_THROTTLED
    return Err(ErrorKind.THROTTLED, "ProvisionedThroughputExceededException", "", message)


def _throttled_cancel(t: Throttled, charges: list[Charges]) -> Err:
    """A transaction the model refused: the first item that writes where the limit
    binds is cancelled ``ThrottlingError``, the others ``None``."""
    named = tuple(t.what.split("/"))
    which = next((i for i, entry in enumerate(charges) if any(b[1:] == named for b, _ in entry)), 0)
    return _cancelled(
        {"Code": "ThrottlingError", "Message": _TRANSIENT_MESSAGES["ThrottlingError"]}
        if i == which
        else {"Code": "None"}
        for i in range(len(charges))
    )
