"""Fenced receivers: the service side of a side effect sent by an sqs-lease worker.

A worker calls a receiver with an ``Idempotency-Key`` and its fence: the scope
(``X-Execution-Fence-Scope``, the job id) and the token
(``X-Execution-Fence``), signed (``X-Execution-Fence-Signature``; required by
:func:`fenced_wsgi_app` unless it runs with ``unsigned_fences=True``); the wire
format is in ``sqs_lease._fence`` and docs/protocol.md. A token orders the
owners of ONE job (every job's first token is 1), so the receiver keeps, per
scope, the highest token it admitted (a *fence mark*) and, per key, an
*idempotency record* holding the stored response; both carry a TTL
(``mark_retention``, ``record_retention``: docs/security.md). Duplicates
across jobs (two jobs capturing one invoice) are the key's business, never the
fence's. Two tables, ``{prefix}-fences`` (key ``scope``) and
``{prefix}-idempotency``, defined by the pynamodb models below.

Decision order for ``FencedReceiver.apply`` / ``apply_with_write``:

1. **Fence first.** A token lower than its scope's mark is answered
   ``412 {"error": "stale_token", "highest": N}``, even when its key is new and
   even when its key is already done. Fencing beats replay: a stale worker has
   lost the job, so it gets no stored response either (the new owner does).
   Equal tokens are accepted (one owner may send several keys). A higher
   token raises the mark *whatever the answer that follows* (a replay, 409,
   422, the effect's own failure or its write's failed condition), in one
   conditional write that also reads the mark, so an older owner of the job
   is refused from then on, under any key. A request refused before this
   point (a bad or unsigned fence, a body the handler refuses) only reads the
   mark (:meth:`FencedReceiver.check_mark`) and stores nothing.
2. **Then the key.** An existing record with another payload hash is
   ``422``; one still ``in_flight`` is ``409``; one ``done`` is replayed
   exactly (status and body, errors included), ``replayed=True``, and the
   effect does not run.
3. **Otherwise** one ``TransactWriteItems`` raises the mark (condition
   ``attribute_not_exists(scope) OR token <= :t``) and creates the record
   (condition ``attribute_not_exists(idem_key)``). The transaction is tried
   first; only when it is cancelled is the mark raised on its own (the same
   condition, returning the old mark when it fails) and the record read
   (strongly consistent) to choose the answer in the order above, so the happy
   path is one call. Reading rather than trusting ``CancellationReasons``
   keeps the answer right whichever reasons a DynamoDB implementation reports.

Two forms:

- ``apply_with_write`` (preferred when the effect is a DynamoDB write): the
  mark, the record (directly ``done`` with its response) and the effect's own
  write commit in ONE transaction. A stale token can never leave an effect
  behind, and no ``in_flight`` state exists to get stuck.
- ``apply`` runs an arbitrary ``effect()`` after the transaction, with the
  record ``in_flight``, then stores its result (``in_flight -> done``). The
  fence check and the effect are then not atomic: an effect admitted at token
  t still runs if t+1 arrives while it executes. An effect that raises stores
  a 500 response that later replays (as Stripe does: errors are replayed),
  except :class:`RetryableEffectError` ("not applied, safe to retry"), which
  deletes the record so the same key may be tried again. A process that dies
  mid-effect leaves the key ``in_flight`` (409) until an operator, who can tell
  whether the effect applied, calls :meth:`FencedReceiver.release`.

A commit whose answer was lost (and retried by the SDK) is recognised by the
record's ``request_id``, so the receiver never answers 409 to itself.

The fence orders owners; the signature (``fence_secrets``) proves a holder of
the shared secret issued it. Neither says who the caller is, nor binds the
body: a service on a network also authenticates its callers (mTLS, IAM, a
bearer token). What the kit trusts and how to run it on the internet:
docs/security.md.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any, Final, TypeAlias
from wsgiref.types import StartResponse, WSGIApplication, WSGIEnvironment

from pynamodb.attributes import NumberAttribute, UnicodeAttribute
from pynamodb.expressions.condition import Condition
from pynamodb.models import Model

from ._aws import classify, make_client
from ._config import Settings
from ._core import inputs
from ._core.calls import Err, ErrorKind
from ._errors import (
    AwsCallFailed,
    AwsUnavailable,
    ConfigError,
    FenceError,
    ResourceMissing,
    SqsLeaseError,
)
from ._fence import (
    FENCE_SCOPE,
    FENCE_SIGNATURE,
    FENCE_TOKEN,
    IDEMPOTENCY_KEY,
    MAX_TOKEN,
    Fence,
    check_key,
    check_scope,
    check_token,
    parse_fence,
    refuse_hidden,
)
from ._journal import Journal
from ._schema.create_table import create_table_params
from ._schema.expressions import serialize
from ._schema.models import GC_TTL

__all__ = [
    "DEFAULT_MARK_RETENTION",
    "DEFAULT_RECORD_RETENTION",
    "FENCE_SCOPE",
    "FENCE_SIGNATURE",
    "FENCE_TOKEN",
    "IDEMPOTENCY_KEY",
    "MAX_JSON_DEPTH",
    "MAX_TOKEN",
    "MIN_MARK_RETENTION",
    "MIN_RECORD_RETENTION",
    "AtomicWrite",
    "EffectNotStored",
    "EffectResult",
    "Fence",
    "FenceError",
    "FenceMark",
    "FencedReceiver",
    "HttpRequest",
    "IdempotencyRecord",
    "Plan",
    "Reply",
    "RetryableEffectError",
    "create_receiver_tables",
    "ensure_table",
    "fenced_wsgi_app",
    "parse_fence",
    "parse_json_body",
    "payload_hash",
    "put_entry",
    "receiver_table_names",
]

_log = logging.getLogger(__name__)

IN_FLIGHT: Final = "in_flight"
DONE: Final = "done"

DAY: Final = 86_400.0
MIN_MARK_RETENTION: Final = 28 * DAY
"""The shortest ``mark_retention``: 14 days, the longest SQS keeps a message, twice
(in its queue, then in its dead-letter queue). A job's owner can only hold a
message SQS still keeps, so no owner of a job whose scope was silent that long
can still be running; a parked job resumed later gets a higher token anyway."""
DEFAULT_MARK_RETENTION: Final = 90 * DAY
MIN_RECORD_RETENTION: Final = DAY
"""The shortest ``record_retention``: the key retention a worker assumes for a
target that declares none (``key_retention_seconds``, docs/operations.md)."""
DEFAULT_RECORD_RETENTION: Final = 30 * DAY


class FenceMark(Model):
    """Per scope (a job id), the highest fencing token seen.

    ``gc_expires_at`` (the table's TTL attribute) is ``mark_retention`` after the
    last request the mark admitted: garbage collection of scopes no owner can
    still use, never logic (see :data:`MIN_MARK_RETENTION`)."""

    class Meta:
        table_name = "sqs-lease-fences"

    scope = UnicodeAttribute(hash_key=True)
    token = NumberAttribute()
    updated_at = NumberAttribute()
    gc_expires_at = NumberAttribute(null=True, attr_name=GC_TTL)


class IdempotencyRecord(Model):
    """Per idempotency key, the request's hash, state and stored response."""

    class Meta:
        table_name = "sqs-lease-idempotency"

    idem_key = UnicodeAttribute(hash_key=True)
    payload_hash = UnicodeAttribute()
    state = UnicodeAttribute()  # in_flight | done
    status = NumberAttribute(null=True)  # HTTP status of the stored response
    response = UnicodeAttribute(null=True)  # JSON text of the stored body
    external_id = UnicodeAttribute(null=True)
    scope = UnicodeAttribute()  # the fence of the request that created it (forensics)
    token = NumberAttribute()
    request_id = UnicodeAttribute()  # which apply() wrote it: recognises our own late commit
    created_at = NumberAttribute()
    updated_at = NumberAttribute()
    # The table's TTL attribute: record_retention after the record's last write.
    gc_expires_at = NumberAttribute(null=True, attr_name=GC_TTL)


_F = FenceMark
_I = IdempotencyRecord


@dataclass(frozen=True)
class Reply:
    """What the receiver answers; ``body`` is JSON-ready."""

    status: int
    body: Mapping[str, Any]
    replayed: bool = False
    external_id: str | None = None


@dataclass(frozen=True)
class EffectResult:
    """What an effect produced: the response to store and replay."""

    status: int = 200
    body: Mapping[str, Any] = field(default_factory=dict)
    external_id: str | None = None


class RetryableEffectError(SqsLeaseError):
    """Raised by an effect that certainly did NOT apply: the key is freed for a retry."""

    def __init__(self, message: str, *, status: int = 503) -> None:
        super().__init__(message)
        self.status = status


class EffectNotStored(SqsLeaseError):
    """``apply`` ran the effect (or was told it did not apply) but could not store
    the outcome: the key stays ``in_flight`` (409) until an operator, who can tell
    whether the effect applied, calls :meth:`FencedReceiver.release`. The fenced
    WSGI app answers 500 ``effect_outcome_unknown``: never "retry", since a retry
    would only meet the 409."""


def receiver_table_names(prefix: str) -> tuple[str, str]:
    """``({prefix}-fences, {prefix}-idempotency)``."""
    return f"{prefix}-fences", f"{prefix}-idempotency"


def ensure_table(settings: Settings, model: type[Model], table: str) -> str:
    """Create ``table`` from a pynamodb model's keys (on demand) unless it exists; wait for it.

    An existing table with other keys is a ``ConfigError`` naming both (e.g. a
    fences table from a version that kept marks per resource, not per scope).
    """
    ddb = make_client(settings, "dynamodb")
    params = create_table_params(model, table)
    with contextlib.suppress(ddb.exceptions.ResourceInUseException):  # exists: fine
        ddb.create_table(**params)
    ddb.get_waiter("table_exists").wait(TableName=table, WaiterConfig={"Delay": 1})
    have = ddb.describe_table(TableName=table)["Table"]["KeySchema"]
    want = params["KeySchema"]
    if sorted(map(_key_text, have)) != sorted(map(_key_text, want)):
        raise ConfigError(
            f"table {table!r} has key {[_key_text(k) for k in have]}, "
            f"{model.__name__} needs {[_key_text(k) for k in want]}: "
            "use another prefix, or delete the table and create it again"
        )
    return table


def _key_text(k: Mapping[str, str]) -> str:
    return f"{k['AttributeName']} ({k['KeyType']})"


def create_receiver_tables(settings: Settings, *, prefix: str | None = None) -> list[str]:
    """Create the fence and idempotency tables (existing ones are fine); returns their names.

    Both get TTL on ``gc_expires_at`` (turned on where it is off), so marks and
    records of scopes and keys no caller can still use are deleted: see
    ``mark_retention`` and ``record_retention`` of :class:`FencedReceiver`.
    """
    fences, idem = receiver_table_names(prefix or settings.prefix)
    names = [
        ensure_table(settings, FenceMark, fences),
        ensure_table(settings, IdempotencyRecord, idem),
    ]
    ddb = make_client(settings, "dynamodb")
    for name in names:
        ttl = ddb.describe_time_to_live(TableName=name).get("TimeToLiveDescription", {})
        if ttl.get("TimeToLiveStatus") not in ("ENABLED", "ENABLING"):
            ddb.update_time_to_live(
                TableName=name,
                TimeToLiveSpecification={"Enabled": True, "AttributeName": GC_TTL},
            )
    return names


def put_entry(item: Model, table: str, condition: Condition | None = None) -> dict[str, Any]:
    """A ``TransactWriteItems`` Put entry for a model instance (for ``apply_with_write``)."""
    put: dict[str, Any] = {"TableName": table, "Item": item.serialize()}
    put.update(serialize(condition))
    return {"Put": put}


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def payload_hash(payload: Mapping[str, Any] | bytes | str) -> str:
    """sha256 hex of canonical JSON (sorted keys, no spaces) or of the raw bytes/text."""
    if isinstance(payload, bytes):
        raw = payload
    elif isinstance(payload, str):
        raw = payload.encode("utf-8", "surrogatepass")
    else:
        # surrogatepass: a caller's lone surrogate is hashed, never an exception.
        raw = _canonical(payload).encode("utf-8", "surrogatepass")
    return hashlib.sha256(raw).hexdigest()


_MISMATCH = Reply(
    422,
    {
        "error": "idempotency_key_reused",
        "message": "idempotency key reused with a different payload",
    },
)
_IN_FLIGHT = Reply(409, {"error": "in_flight", "message": "request with this key is in flight"})
_WRITE_REJECTED = Reply(
    409, {"error": "write_condition_failed", "message": "the effect's own write condition failed"}
)
_WRITE_OPS = frozenset({"Put", "Update", "Delete", "ConditionCheck"})
# Reasons a cancelled transaction may carry that the read-and-decide path understands.
_KNOWN_REASONS = frozenset(
    {"None", "ConditionalCheckFailed", "TransactionConflict", "ThrottlingError"}
)


# Outcomes of reading after a cancelled transaction (besides a Reply):
_OURS = object()  # it committed for this very call; only its first answer was lost
_RETRY = object()  # nothing decisive (a conflict, or the key was freed meanwhile): try again


def _aws_error(err: Err, what: str) -> SqsLeaseError:
    if err.kind is ErrorKind.NOT_FOUND:
        return ResourceMissing(f"{what}: table missing; create it with create_receiver_tables()")
    if err.unknown:
        return AwsUnavailable(f"{what}: DynamoDB did not answer ({err.code}: {err.message})")
    return AwsCallFailed(f"{what}: {err.code}: {err.message}", err.code)


class FencedReceiver:
    """Applies effects at most once per idempotency key, never for a stale token of its scope."""

    def __init__(
        self,
        settings: Settings,
        *,
        prefix: str | None = None,
        journal: Journal | None = None,
        client: Any = None,
        clock: Callable[[], float] = time.time,
        max_attempts: int = 5,
        mark_retention: float | None = DEFAULT_MARK_RETENTION,
        record_retention: float | None = DEFAULT_RECORD_RETENTION,
    ) -> None:
        """``mark_retention`` (seconds, at least :data:`MIN_MARK_RETENTION`; None:
        never) keeps a scope's mark that long after the last request it admitted;
        ``record_retention`` (at least :data:`MIN_RECORD_RETENTION`; None: never)
        keeps an idempotency record that long after its last write: declare it as
        the target's ``key_retention_seconds`` on the calling side. Both set the
        tables' TTL attribute; DynamoDB deletes within about two days after it."""
        _check_retention("mark_retention", mark_retention, MIN_MARK_RETENTION)
        _check_retention("record_retention", record_retention, MIN_RECORD_RETENTION)
        self.fences_table, self.idempotency_table = receiver_table_names(prefix or settings.prefix)
        self.client: Any = client if client is not None else make_client(settings, "dynamodb")
        self.journal = journal or Journal()
        self._clock = clock
        self._max_attempts = max_attempts
        self.mark_retention = mark_retention
        self.record_retention = record_retention

    # --- the two forms ---------------------------------------------------------------

    def apply(
        self,
        scope: str,
        token: int,
        idem_key: str,
        payload: Mapping[str, Any] | bytes | str,
        effect: Callable[[], EffectResult],
    ) -> Reply:
        """Admit (fence + key), run ``effect()``, store and return its response.

        ``scope`` is the fence's scope (the calling job's id), ``token`` its
        fencing token; ``payload`` is what the key promises (leave the scope
        and token out of it: another owner or job retrying the key must get
        the replay).
        """
        _check(scope, token, idem_key)
        digest, request_id, now = payload_hash(payload), uuid.uuid4().hex, self._clock()
        record = self._record(scope, token, idem_key, digest, request_id, now, state=IN_FLIGHT)
        try:
            admitted = self._admit(record, [])
        except AwsUnavailable:
            # The transaction may have committed: free our own record, or the key would
            # answer 409 forever although no effect ran. Best effort; DynamoDB is flaky now.
            self._delete_in_flight(idem_key, request_id, quiet=True)
            raise
        if isinstance(admitted, Reply):
            return admitted
        event = "effect_applied"
        try:
            result = effect()
        except RetryableEffectError as exc:
            with _not_stored(f"freeing {idem_key!r} after its effect said it did not apply"):
                self._delete_in_flight(idem_key, request_id)
            self.journal("effect_retryable", scope=scope, token=token, idem_key=idem_key)
            return Reply(exc.status, {"error": "effect_not_applied", "message": str(exc)})
        except Exception as exc:
            # Stored and replayed like a success (Stripe's rule): the effect may have
            # half-applied, so a retry under the same key must not run it again.
            _log.exception("effect for %s failed", idem_key)
            result = EffectResult(500, {"error": "effect_failed", "type": type(exc).__name__})
            event = "effect_failed"
        body_json = _canonical(dict(result.body))
        with _not_stored(f"storing the response for {idem_key!r} (effect ran)"):
            self._finish(idem_key, request_id, result, body_json)
        self.journal(event, scope=scope, token=token, idem_key=idem_key)
        return Reply(result.status, inputs.loads(body_json), external_id=result.external_id)

    def apply_with_write(
        self,
        scope: str,
        token: int,
        idem_key: str,
        payload: Mapping[str, Any] | bytes | str,
        write: Mapping[str, Any],
        response: EffectResult,
    ) -> Reply:
        """Commit the mark, the ``done`` record and ``write`` (a TransactWriteItems entry) at once.

        If ``write``'s own condition fails, nothing of the effect commits and the
        answer is ``409 write_condition_failed`` (not stored: a retry is evaluated
        afresh); a higher token still raises the scope's mark.
        """
        _check(scope, token, idem_key)
        if not isinstance(write, Mapping) or len(write) != 1 or not set(write) <= _WRITE_OPS:
            raise ValueError(
                f"write must be one TransactWriteItems entry, one of {sorted(_WRITE_OPS)}"
            )
        digest, request_id, now = payload_hash(payload), uuid.uuid4().hex, self._clock()
        body_json = _canonical(dict(response.body))
        record = self._record(scope, token, idem_key, digest, request_id, now, state=DONE)
        record.status = response.status
        record.response = body_json
        record.external_id = response.external_id
        admitted = self._admit(record, [dict(write)])
        if isinstance(admitted, Reply):
            return admitted
        self.journal("effect_applied", scope=scope, token=token, idem_key=idem_key)
        return Reply(response.status, inputs.loads(body_json), external_id=response.external_id)

    def raise_mark(self, scope: str, token: int) -> Reply | None:
        """Fence only: raise ``scope``'s mark to ``token`` unless it is lower.

        One conditional write that also reads the mark, so nothing can slip in
        between. None when the token is current (equal or higher: the mark is
        now at least ``token``), else the ``412 stale_token`` reply. Only for a
        request that passed authentication and validation but is answered without
        :meth:`apply`; a refused request must not raise a mark (use
        :meth:`check_mark`), or a stranger could fence a job out.
        """
        _check_scope(scope)
        check_token(token)
        return self._raise_mark(scope, token, None)

    def check_mark(self, scope: str, token: int) -> Reply | None:
        """Fence check only, writing nothing: the ``412 stale_token`` reply when
        ``token`` is below ``scope``'s mark, else None.

        For answers that store nothing (a 400 for a body that fails validation): an
        older owner still learns it lost the job, and a stranger's request leaves
        no mark (a mark rises only with a request that passed validation).
        """
        _check_scope(scope)
        check_token(token)
        highest = self.highest(scope)
        if highest is None or token >= highest:
            return None
        self.journal("fence_rejected", scope=scope, token=token, highest=highest)
        return Reply(412, {"error": "stale_token", "highest": highest})

    # --- reads and operator tools -----------------------------------------------------

    def highest(self, scope: str) -> int | None:
        """The scope's fence mark (None when no token of it was ever seen)."""
        found = self.mark(scope)
        return None if found is None else int(found.token)

    def mark(self, scope: str) -> FenceMark | None:
        """The scope's mark item (token, ``updated_at``, ``gc_expires_at``), if any."""
        item = self._get(self.fences_table, {"scope": {"S": scope}})
        return None if item is None else FenceMark.from_raw_data(item)

    def reset_mark(self, scope: str, *, expect: int, to: int | None) -> bool:
        """Operator tool: set ``scope``'s mark to ``to`` (None: delete it), only if it is
        still ``expect`` (the value the operator read); False if it moved meanwhile.

        For a mark a caller raised that no owner of the job holds (e.g. a stranger's
        token 2**63-1 while fences were unsigned): the job's own owners get 412 until
        it is lowered. Set it to the job's current token (``sqs-lease jobs show``),
        never lower: every owner below the new mark is admitted again.
        """
        _check_scope(scope)
        check_token(expect)
        if to is not None:
            check_token(to)
        key = {"scope": {"S": scope}}
        params: dict[str, Any] = {"TableName": self.fences_table, "Key": key}
        if to is None:
            params.update(serialize(_F.token == expect))
            call = self.client.delete_item
        else:
            params.update(serialize(_F.token == expect, self._mark_actions(to, self._clock())))
            call = self.client.update_item
        try:
            call(**params)
        except Exception as exc:
            err = classify(exc, 0.0, 0.0)
            if err.kind is ErrorKind.CONDITION_FAILED:
                return False
            raise _aws_error(err, f"resetting the fence mark of {scope!r}") from None
        self.journal("fence_mark_reset", scope=scope, old=expect, new=to)
        return True

    def record(self, idem_key: str) -> IdempotencyRecord | None:
        """The idempotency record for a key, if any."""
        item = self._get(self.idempotency_table, {"idem_key": {"S": idem_key}})
        return None if item is None else IdempotencyRecord.from_raw_data(item)

    def release(self, idem_key: str) -> bool:
        """Operator tool: delete a key stuck ``in_flight`` (its process died mid-effect).

        Only for someone who has checked that the effect did not apply (or
        accepts a repeat): the next request with the key runs the effect again.
        """
        return self._delete_in_flight(idem_key, None)

    # --- internals --------------------------------------------------------------------

    def _record(
        self,
        scope: str,
        token: int,
        idem_key: str,
        digest: str,
        request_id: str,
        now: float,
        *,
        state: str,
    ) -> IdempotencyRecord:
        return IdempotencyRecord(
            idem_key=idem_key,
            payload_hash=digest,
            state=state,
            scope=scope,
            token=token,
            request_id=request_id,
            created_at=now,
            updated_at=now,
            gc_expires_at=_expiry(now, self.record_retention),
        )

    def _mark_actions(self, token: int, now: float) -> list[Any]:
        actions = [_F.token.set(token), _F.updated_at.set(now)]
        expires = _expiry(now, self.mark_retention)
        if expires is not None:
            actions.append(_F.gc_expires_at.set(expires))
        return actions

    def _mark_update(self, scope: str, token: int, now: float) -> dict[str, Any]:
        """UpdateItem parameters: the scope's mark to ``token`` unless it is higher already."""
        update: dict[str, Any] = {"TableName": self.fences_table, "Key": {"scope": {"S": scope}}}
        update.update(
            serialize(
                _F.scope.does_not_exist() | (_F.token <= token),
                self._mark_actions(token, now),
            )
        )
        return update

    def _raise_mark(self, scope: str, token: int, idem_key: str | None) -> Reply | None:
        params = self._mark_update(scope, token, self._clock())
        params["ReturnValuesOnConditionCheckFailure"] = "ALL_OLD"
        try:
            self.client.update_item(**params)
            return None
        except Exception as exc:
            err = classify(exc, 0.0, 0.0)
        if err.kind is not ErrorKind.CONDITION_FAILED:
            raise _aws_error(err, f"raising the fence mark of {scope!r}")
        old = err.item or {}
        highest = int(old["token"]["N"]) if "token" in old else None
        if highest is None:  # no ALL_OLD from this DynamoDB: read it (it only rises)
            highest = self.highest(scope)
        where = {} if idem_key is None else {"idem_key": idem_key}
        self.journal("fence_rejected", scope=scope, token=token, highest=highest, **where)
        return Reply(412, {"error": "stale_token", "highest": highest})

    def _admit(self, record: IdempotencyRecord, extra: Sequence[Mapping[str, Any]]) -> Reply | None:
        """Run the transaction; None when it committed for this call, else the answer."""
        scope, token = str(record.scope), int(record.token)
        put: dict[str, Any] = {"TableName": self.idempotency_table, "Item": record.serialize()}
        put.update(serialize(_I.idem_key.does_not_exist()))
        items: list[Mapping[str, Any]] = [
            {"Update": self._mark_update(scope, token, record.updated_at)},
            {"Put": put},
            *extra,
        ]
        for attempt in range(self._max_attempts):
            # botocore fills ClientRequestToken per call and keeps it across its own
            # retries, so AWS itself dedups a retried commit; request_id covers the rest.
            try:
                self.client.transact_write_items(TransactItems=items)
                return None
            except Exception as exc:
                err = classify(exc, 0.0, 0.0)
            if err.kind is not ErrorKind.TRANSACTION_CANCELLED:
                raise _aws_error(err, "fenced transaction")
            codes = [str(r.get("Code") or "None") for r in err.reasons]
            unknown = [c for c in codes if c not in _KNOWN_REASONS]
            if unknown:
                raise AwsCallFailed(f"fenced transaction cancelled: {codes}", unknown[0])
            write_failed = len(codes) > 2 and "ConditionalCheckFailed" in codes[2:]
            decision = self._decide(record, write_failed)
            if decision is _OURS:
                return None
            if isinstance(decision, Reply):
                return decision
            time.sleep(min(0.05 * 2**attempt, 0.5))  # conflict or a key freed meanwhile
        raise AwsCallFailed(
            f"fenced transaction for {record.idem_key!r} kept conflicting", "TransactionConflict"
        )

    def _decide(self, mine: IdempotencyRecord, write_failed: bool) -> Reply | object:
        """After a cancelled transaction: fence first (raising the mark), then the key."""
        token = int(mine.token)
        stale = self._raise_mark(str(mine.scope), token, str(mine.idem_key))
        if stale is not None:
            return stale
        found = self.record(str(mine.idem_key))
        if found is None:
            return _WRITE_REJECTED if write_failed else _RETRY
        if found.request_id == mine.request_id:
            return _OURS
        if found.payload_hash != mine.payload_hash:
            self.journal("idempotency_mismatch", idem_key=mine.idem_key)
            return _MISMATCH
        if found.state != DONE:
            self.journal("idempotency_in_flight", idem_key=mine.idem_key)
            return _IN_FLIGHT
        self.journal("idempotency_replayed", idem_key=mine.idem_key, token=token)
        return Reply(
            int(found.status or 500),
            inputs.loads(found.response or "{}"),
            replayed=True,
            external_id=found.external_id,
        )

    def _finish(self, idem_key: str, request_id: str, result: EffectResult, body_json: str) -> None:
        now = self._clock()
        expires = _expiry(now, self.record_retention)
        params: dict[str, Any] = {
            "TableName": self.idempotency_table,
            "Key": {"idem_key": {"S": idem_key}},
            "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
        }
        params.update(
            serialize(
                (_I.state == IN_FLIGHT) & (_I.request_id == request_id),
                [
                    _I.state.set(DONE),
                    _I.status.set(result.status),
                    _I.response.set(body_json),
                    _I.updated_at.set(now),
                    *([_I.external_id.set(result.external_id)] if result.external_id else []),
                    *([_I.gc_expires_at.set(expires)] if expires is not None else []),
                ],
            )
        )
        try:
            self.client.update_item(**params)
            return
        except Exception as exc:
            err = classify(exc, 0.0, 0.0)
        if err.kind is not ErrorKind.CONDITION_FAILED:
            # The effect ran but its response is not stored: the key stays in_flight (409)
            # until an operator decides; say so loudly.
            raise _aws_error(err, f"storing the response for {idem_key!r} (effect applied)")
        old = err.item or {}
        if (
            old.get("state", {}).get("S") == DONE
            and old.get("request_id", {}).get("S") == request_id
        ):
            return  # our own update, retried after a lost answer
        self.journal("idempotency_record_lost", idem_key=idem_key)

    def _delete_in_flight(
        self, idem_key: str, request_id: str | None, *, quiet: bool = False
    ) -> bool:
        cond = _I.state == IN_FLIGHT
        if request_id is not None:
            cond = cond & (_I.request_id == request_id)
        params: dict[str, Any] = {
            "TableName": self.idempotency_table,
            "Key": {"idem_key": {"S": idem_key}},
        }
        params.update(serialize(cond))
        try:
            self.client.delete_item(**params)
            return True
        except Exception as exc:
            if quiet:
                return False
            err = classify(exc, 0.0, 0.0)
        if err.kind is ErrorKind.CONDITION_FAILED:
            return False
        raise _aws_error(err, f"releasing {idem_key!r}")

    def _get(self, table: str, key: Mapping[str, Any]) -> dict[str, Any] | None:
        try:
            resp = self.client.get_item(TableName=table, Key=dict(key), ConsistentRead=True)
        except Exception as exc:
            raise _aws_error(classify(exc, 0.0, 0.0), f"reading {table}") from None
        item: dict[str, Any] | None = resp.get("Item")
        return item


def _check(scope: str, token: int, idem_key: str) -> None:
    _check_scope(scope)
    check_token(token)
    check_key(idem_key)


def _check_scope(scope: str) -> str:
    return refuse_hidden(check_scope(scope), FENCE_SCOPE, "scope")


def _check_retention(name: str, value: float | None, least: float) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= least:
        raise ConfigError(
            f"{name} must be at least {least / DAY:g} days ({least:g} s), or None "
            f"(never expire), got {value!r}"
        )


def _expiry(now: float, retention: float | None) -> int | None:
    return None if retention is None else int(now + retention)


@contextlib.contextmanager
def _not_stored(what: str) -> Iterator[None]:
    try:
        yield
    except SqsLeaseError as exc:
        raise EffectNotStored(f"{what}: {exc}") from exc


# --- WSGI glue ------------------------------------------------------------------------

MAX_JSON_DEPTH: Final = inputs.JSON_DEPTH_LIMIT
"""The deepest nesting of arrays and objects a request body may have."""
MAX_JSON_INT_DIGITS: Final = inputs.INT_DIGITS_LIMIT
"""The most digits of a JSON integer (Python's own default, whatever the process sets)."""


def parse_json_body(raw: bytes) -> Any:
    """A request body as JSON (an empty body is None), or ``ValueError`` saying why not.

    The package's one JSON reader in its strict form (``inputs.loads(strict=True)``),
    so that nothing a caller sends can raise anything else or yield a value that cannot
    be hashed, stored or sent on: UTF-8 only (no BOM, no UTF-16/32), at most
    :data:`MAX_JSON_DEPTH` levels of nesting (a deeper body raised ``RecursionError``),
    no ``NaN``/``Infinity`` and no number that is not a finite float, integers of at
    most :data:`MAX_JSON_INT_DIGITS` digits, and no lone surrogate (``"\\ud800"``
    decodes to text no UTF-8 encoder accepts). ``"\\u0000"`` is valid JSON and kept.
    """
    if not raw:
        return None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"body is not UTF-8 (byte {exc.start})") from None
    try:
        return inputs.loads(text, strict=True)
    except ValueError as exc:
        raise ValueError(f"body: {exc}") from None


@dataclass(frozen=True)
class HttpRequest:
    """The parts of a WSGI request a handler needs; ``headers`` have lower-case names."""

    method: str
    path: str
    query: str
    headers: Mapping[str, str]
    body: bytes

    def header(self, name: str) -> str | None:
        return self.headers.get(name.lower())

    def json(self) -> Any:
        """The body parsed by :func:`parse_json_body`; ValueError (only) when it is not
        JSON the receiver accepts (an empty body is None)."""
        return parse_json_body(self.body)


@dataclass(frozen=True)
class AtomicWrite:
    """A handler's plan for ``apply_with_write``: the effect's write and the response to store."""

    write: Mapping[str, Any]
    response: EffectResult


Plan: TypeAlias = Reply | AtomicWrite | Callable[[], EffectResult]
"""What a handler returns: a Reply (answered now, not stored: e.g. a 400 for a bad
body), an AtomicWrite, or an effect to run under ``apply``."""

REPLAYED: Final = "Idempotent-Replayed"


def _respond(
    start_response: StartResponse, reply: Reply, extra: Iterable[tuple[str, str]] = ()
) -> list[bytes]:
    body = json.dumps(dict(reply.body), separators=(",", ":"), default=str).encode()
    try:
        phrase = HTTPStatus(reply.status).phrase
    except ValueError:
        phrase = "Unknown"
    headers = [("Content-Type", "application/json"), ("Content-Length", str(len(body)))]
    if reply.replayed:
        headers.append((REPLAYED, "true"))
    start_response(f"{reply.status} {phrase}", [*headers, *extra])
    return [body]


def _bad(error: str, header: str, message: str) -> Reply:
    return Reply(400, {"error": error, "header": header, "message": message})


def _request(environ: WSGIEnvironment, max_body: int) -> HttpRequest | Reply:
    try:
        length = int(environ.get("CONTENT_LENGTH") or 0)
    except ValueError:
        return _bad("invalid_header", "Content-Length", "Content-Length is not an integer")
    if length < 0:
        return _bad("invalid_header", "Content-Length", "Content-Length is negative")
    if length > max_body:
        return Reply(413, {"error": "body_too_large", "limit": max_body})
    body = environ["wsgi.input"].read(length) if length > 0 else b""
    headers = {
        k[5:].replace("_", "-").lower(): str(v) for k, v in environ.items() if k.startswith("HTTP_")
    }
    if environ.get("CONTENT_TYPE"):
        headers["content-type"] = str(environ["CONTENT_TYPE"])
    return HttpRequest(
        method=str(environ.get("REQUEST_METHOD", "GET")).upper(),
        path=str(environ.get("PATH_INFO") or "/"),
        query=str(environ.get("QUERY_STRING") or ""),
        headers=headers,
        body=body,
    )


_FENCE_HEADERS: Final = (IDEMPOTENCY_KEY, FENCE_SCOPE, FENCE_TOKEN, FENCE_SIGNATURE)


def _fence_of(req: HttpRequest, secrets: Sequence[bytes], journal: Journal) -> Fence | Reply:
    # A WSGI server hands over one HTTP_X_EXECUTION_FENCE for X-Execution-Fence and
    # X_Execution_Fence, sent once each or twice: wsgiref and gunicorn join the values
    # with ",", others keep one. No fence header's wire form has a ",", so one is a
    # second value the receiver cannot choose between: refused, never guessed.
    for name in _FENCE_HEADERS:
        if "," in req.headers.get(name.lower(), ""):
            journal("fence_header_rejected", header=name, problem="ambiguous_header")
            message = (
                f"{name} was sent more than once (or also spelled with underscores, which "
                "this server merges with it); send it once"
            )
            return Reply(400, {"error": "ambiguous_header", "header": name, "message": message})
    try:
        fence = parse_fence(req.headers, secrets=secrets)
        _check(fence.scope, fence.token, fence.idem_key)
        return fence
    except FenceError as exc:
        # Journaled without the header's value: it is the caller's text, possibly hostile.
        journal("fence_header_rejected", header=exc.header, problem=exc.problem)
        body = {"error": exc.problem, "header": exc.header, "message": exc.reason}
        return Reply(exc.status, body)


def _payload_of(req: HttpRequest) -> dict[str, Any]:
    # What the key promises: the same endpoint and body. JSON bodies are compared
    # canonically (whitespace and key order do not matter); others by bytes. Scope and
    # token are left out: another owner, or another job, retrying the key must get the
    # replay (duplicates across jobs are the key's business, not the fence's).
    payload: dict[str, Any] = {"method": req.method, "path": req.path, "query": req.query}
    try:
        payload["json"] = parse_json_body(req.body)
    except ValueError:
        payload["body_sha256"] = hashlib.sha256(req.body).hexdigest()
    return payload


_RETRYABLE_CODES: Final = frozenset(
    {
        "TransactionConflict",
        "TransactionInProgressException",
        "ProvisionedThroughputExceeded",
        "ThrottlingError",
        "RequestLimitExceeded",
    }
)
_NOT_STORABLE_CODES: Final = frozenset(
    {"ValidationException", "ValidationError", "ItemCollectionSizeLimitExceeded"}
)


def _store_failure(exc: SqsLeaseError) -> tuple[Reply, list[tuple[str, str]]]:
    """The caller's answer when the store failed before any effect: a code and a
    generic message (the detail, with endpoint, account or role, is the operator's
    log). Only what may pass is "retry"; a request that can never be stored as the
    receiver stands is a 422, so no caller retries it forever."""
    if isinstance(exc, AwsUnavailable) or (
        isinstance(exc, AwsCallFailed) and exc.code in _RETRYABLE_CODES
    ):
        message = "the receiver's store did not answer; retry with the same key"
        return Reply(503, {"error": "receiver_unavailable", "message": message}), [
            ("Retry-After", "1")
        ]
    if isinstance(exc, AwsCallFailed) and exc.code in _NOT_STORABLE_CODES:
        message = "the receiver's store refused this request; nothing was applied"
        return Reply(422, {"error": "request_not_storable", "message": message}), []
    message = (
        "the receiver cannot store requests now; nothing was applied (its operator must fix it)"
    )
    return Reply(422, {"error": "receiver_misconfigured", "message": message}), []


_INTERNAL = Reply(500, {"error": "internal_error"})
_NOT_STORED = Reply(
    500,
    {
        "error": "effect_outcome_unknown",
        "message": "the effect ran but its outcome was not stored; the receiver's operator decides",
    },
)
MIN_SECRET_BYTES: Final = 16


def fenced_wsgi_app(
    receiver: FencedReceiver,
    handler: Callable[[HttpRequest, Fence], Plan],
    *,
    max_body: int = 1 << 20,
    fence_secrets: Iterable[bytes] = (),
    unsigned_fences: bool = False,
) -> WSGIApplication:
    """A WSGI app that fences every request it gets, then applies the handler's plan.

    Reads ``Idempotency-Key``, ``X-Execution-Fence-Scope`` (the caller's job id,
    percent-encoded), ``X-Execution-Fence`` (its token: ASCII digits, at most
    2**63-1) and ``X-Execution-Fence-Signature``. Signed fences are the default:
    ``fence_secrets`` (the secrets the workers sign with, each at least 16 bytes;
    during a rotation the new one and the old one) is required unless
    ``unsigned_fences=True`` says, knowingly, that any caller that reaches the app
    may send any scope and token (authenticate callers before it then). A
    missing, malformed, repeated (``ambiguous_header``) or control-character
    header is ``400 {"error", "header", "message"}``, a signature that does not
    verify ``403 fence_signature_mismatch``, both before anything is read or
    stored.

    The handler only *plans* (it must not act): it returns a :data:`Plan`. A
    :class:`Reply` plan (e.g. a 400 for a body that fails validation) stores
    nothing and raises no mark; a stale token still gets 412 instead. Only a
    request that passed authentication and validation raises its scope's mark,
    in the same transaction as its record (and its write). Replays carry
    ``Idempotent-Replayed: true``. The store's failures are answered with a code
    and a generic message, never the store's own text: ``503
    receiver_unavailable`` (``Retry-After``: retry with the same key),
    ``422 request_not_storable`` or ``422 receiver_misconfigured`` (nothing was
    applied; retrying cannot help), ``500 effect_outcome_unknown`` (an effect ran
    and its outcome was not stored). A handler that raises is ``500
    internal_error`` with nothing stored; the detail is logged.
    """
    secrets = [bytes(s) for s in fence_secrets]
    if secrets and unsigned_fences:
        raise ConfigError(
            "fence_secrets and unsigned_fences=True are both set: choose one (signed "
            "fences with the secrets, or unsigned ones knowingly)"
        )
    if not secrets and not unsigned_fences:
        raise ConfigError(
            "fence_secrets: no secret configured. Signed fences are the default: pass "
            "fence_secrets=[secret] (the secret the workers sign with; docs/security.md), "
            "or unsigned_fences=True to accept unsigned fences knowingly (then anyone who "
            "reaches this app can raise a job's fence mark: authenticate callers first)"
        )
    if any(len(s) < MIN_SECRET_BYTES for s in secrets):
        raise ConfigError(
            f"fence_secrets: a secret must be at least {MIN_SECRET_BYTES} bytes "
            "(make one with: python -c 'import secrets; print(secrets.token_urlsafe(32))')"
        )
    if unsigned_fences:
        _log.warning(
            "fenced_wsgi_app: unsigned fences accepted (unsigned_fences=True): any caller "
            "that reaches this app can raise a job's fence mark"
        )

    def app(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        req = _request(environ, max_body)
        if isinstance(req, Reply):
            return _respond(start_response, req)
        fence = _fence_of(req, secrets, receiver.journal)
        if isinstance(fence, Reply):
            return _respond(start_response, fence)
        try:
            plan = handler(req, fence)
        except Exception:
            _log.exception("the handler failed for key %r (nothing stored)", fence.idem_key)
            return _respond(start_response, _INTERNAL)
        try:
            if isinstance(plan, Reply):
                # Refused by validation: stores nothing, so a stranger's token raises no
                # mark; an older owner still learns that it lost the job.
                reply = receiver.check_mark(fence.scope, fence.token) or plan
            elif isinstance(plan, AtomicWrite):
                reply = receiver.apply_with_write(
                    fence.scope,
                    fence.token,
                    fence.idem_key,
                    _payload_of(req),
                    plan.write,
                    plan.response,
                )
            else:
                reply = receiver.apply(
                    fence.scope, fence.token, fence.idem_key, _payload_of(req), plan
                )
        except EffectNotStored:
            _log.exception("effect outcome not stored for key %r", fence.idem_key)
            return _respond(start_response, _NOT_STORED)
        except (AwsUnavailable, AwsCallFailed, ResourceMissing) as exc:
            reply, extra = _store_failure(exc)
            _log.log(
                logging.WARNING if extra else logging.ERROR,
                "receiver store failed for key %r (answered %s %s): %s",
                fence.idem_key,
                reply.status,
                reply.body["error"],
                exc,
            )
            return _respond(start_response, reply, extra)
        except Exception:
            _log.exception("the receiver failed for key %r", fence.idem_key)
            return _respond(start_response, _INTERNAL)
        return _respond(start_response, reply)

    return app
