"""Fenced receivers: the service side of a side effect sent by an sqs-lease worker.

A worker calls a receiver with an ``Idempotency-Key`` and its fencing token
(``X-Execution-Fence``). The receiver keeps, per resource, the highest token it
accepted (a *fence mark*, never TTL-deleted) and, per key, an *idempotency
record* holding the stored response. Two tables, ``{prefix}-fences`` and
``{prefix}-idempotency``, defined by the pynamodb models below.

Decision order for ``FencedReceiver.apply`` / ``apply_with_write``:

1. **Fence first.** A token lower than the resource's mark is answered
   ``412 {"error": "stale_token", "highest": N}``, even when its key is new and
   even when its key is already done. Fencing beats replay: a stale worker has
   lost the job, so it gets no stored response either (the new owner does).
   Equal tokens are accepted (one owner may send several keys); a higher token
   is accepted and raises the mark.
2. **Then the key.** An existing record with another payload hash is
   ``422``; one still ``in_flight`` is ``409``; one ``done`` is replayed
   exactly (status and body, errors included), ``replayed=True``, and the
   effect does not run.
3. **Otherwise** one ``TransactWriteItems`` raises the mark (condition
   ``attribute_not_exists(resource) OR token <= :t``) and creates the record
   (condition ``attribute_not_exists(idem_key)``). The transaction is tried
   first; only when it is cancelled are the mark and the record read (strongly
   consistent) to choose the answer in the order above, so the happy path is
   one call. Reading rather than trusting ``CancellationReasons`` keeps the
   answer right whichever reasons a DynamoDB implementation reports.

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
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any, Final, TypeAlias
from wsgiref.types import StartResponse, WSGIApplication, WSGIEnvironment

from pynamodb.attributes import NumberAttribute, UnicodeAttribute
from pynamodb.expressions.condition import Condition
from pynamodb.models import Model

from ._aws import classify, make_client
from ._config import Settings
from ._core.calls import Err, ErrorKind
from ._errors import AwsCallFailed, AwsUnavailable, ResourceMissing, SqsLeaseError
from ._journal import Journal
from ._schema import _params, create_table_params

__all__ = [
    "AtomicWrite",
    "EffectResult",
    "Fence",
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
    "payload_hash",
    "put_entry",
    "receiver_table_names",
]

_log = logging.getLogger(__name__)

IN_FLIGHT: Final = "in_flight"
DONE: Final = "done"
MAX_KEY_LENGTH: Final = 255


class FenceMark(Model):
    """Per resource, the highest fencing token accepted. Never TTL-deleted:
    forgetting a mark would let a stale worker through again."""

    class Meta:
        table_name = "sqs-lease-fences"

    resource = UnicodeAttribute(hash_key=True)
    token = NumberAttribute()
    updated_at = NumberAttribute()


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
    resource = UnicodeAttribute()
    token = NumberAttribute()
    request_id = UnicodeAttribute()  # which apply() wrote it: recognises our own late commit
    created_at = NumberAttribute()
    updated_at = NumberAttribute()


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


def receiver_table_names(prefix: str) -> tuple[str, str]:
    """``({prefix}-fences, {prefix}-idempotency)``."""
    return f"{prefix}-fences", f"{prefix}-idempotency"


def ensure_table(settings: Settings, model: type[Model], table: str) -> str:
    """Create ``table`` from a pynamodb model's keys (on demand) unless it exists; wait for it."""
    ddb = make_client(settings, "dynamodb")
    with contextlib.suppress(ddb.exceptions.ResourceInUseException):  # exists: fine
        ddb.create_table(**create_table_params(model, table))
    ddb.get_waiter("table_exists").wait(TableName=table, WaiterConfig={"Delay": 1})
    return table


def create_receiver_tables(settings: Settings, *, prefix: str | None = None) -> list[str]:
    """Create the fence and idempotency tables (existing ones are fine); returns their names."""
    fences, idem = receiver_table_names(prefix or settings.prefix)
    return [
        ensure_table(settings, FenceMark, fences),
        ensure_table(settings, IdempotencyRecord, idem),
    ]


def put_entry(item: Model, table: str, condition: Condition | None = None) -> dict[str, Any]:
    """A ``TransactWriteItems`` Put entry for a model instance (for ``apply_with_write``)."""
    put: dict[str, Any] = {"TableName": table, "Item": item.serialize()}
    put.update(_params(condition))
    return {"Put": put}


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def payload_hash(payload: Mapping[str, Any] | bytes | str) -> str:
    """sha256 hex of canonical JSON (sorted keys, no spaces) or of the raw bytes/text."""
    if isinstance(payload, bytes):
        raw = payload
    elif isinstance(payload, str):
        raw = payload.encode()
    else:
        raw = _canonical(payload).encode()
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
    """Applies effects at most once per idempotency key, and never for a stale token."""

    def __init__(
        self,
        settings: Settings,
        *,
        prefix: str | None = None,
        journal: Journal | None = None,
        client: Any = None,
        clock: Callable[[], float] = time.time,
        max_attempts: int = 5,
    ) -> None:
        self.fences_table, self.idempotency_table = receiver_table_names(prefix or settings.prefix)
        self.client: Any = client if client is not None else make_client(settings, "dynamodb")
        self.journal = journal or Journal()
        self._clock = clock
        self._max_attempts = max_attempts

    # --- the two forms ---------------------------------------------------------------

    def apply(
        self,
        resource: str,
        token: int,
        idem_key: str,
        payload: Mapping[str, Any] | bytes | str,
        effect: Callable[[], EffectResult],
    ) -> Reply:
        """Admit (fence + key), run ``effect()``, store and return its response."""
        _check(resource, token, idem_key)
        digest, request_id, now = payload_hash(payload), uuid.uuid4().hex, self._clock()
        record = self._record(resource, token, idem_key, digest, request_id, now, state=IN_FLIGHT)
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
            self._delete_in_flight(idem_key, request_id)
            self.journal("effect_retryable", resource=resource, token=token, idem_key=idem_key)
            return Reply(exc.status, {"error": "effect_not_applied", "message": str(exc)})
        except Exception as exc:
            # Stored and replayed like a success (Stripe's rule): the effect may have
            # half-applied, so a retry under the same key must not run it again.
            _log.exception("effect for %s failed", idem_key)
            result = EffectResult(500, {"error": "effect_failed", "type": type(exc).__name__})
            event = "effect_failed"
        body_json = _canonical(dict(result.body))
        self._finish(idem_key, request_id, result, body_json)
        self.journal(event, resource=resource, token=token, idem_key=idem_key)
        return Reply(result.status, json.loads(body_json), external_id=result.external_id)

    def apply_with_write(
        self,
        resource: str,
        token: int,
        idem_key: str,
        payload: Mapping[str, Any] | bytes | str,
        write: Mapping[str, Any],
        response: EffectResult,
    ) -> Reply:
        """Commit the mark, the ``done`` record and ``write`` (a TransactWriteItems entry) at once.

        If ``write``'s own condition fails, nothing commits and the answer is
        ``409 write_condition_failed`` (not stored: a retry is evaluated afresh).
        """
        _check(resource, token, idem_key)
        if not isinstance(write, Mapping) or len(write) != 1 or not set(write) <= _WRITE_OPS:
            raise ValueError(
                f"write must be one TransactWriteItems entry, one of {sorted(_WRITE_OPS)}"
            )
        digest, request_id, now = payload_hash(payload), uuid.uuid4().hex, self._clock()
        body_json = _canonical(dict(response.body))
        record = self._record(resource, token, idem_key, digest, request_id, now, state=DONE)
        record.status = response.status
        record.response = body_json
        record.external_id = response.external_id
        admitted = self._admit(record, [dict(write)])
        if isinstance(admitted, Reply):
            return admitted
        self.journal("effect_applied", resource=resource, token=token, idem_key=idem_key)
        return Reply(response.status, json.loads(body_json), external_id=response.external_id)

    # --- reads and operator tools -----------------------------------------------------

    def highest(self, resource: str) -> int | None:
        """The resource's fence mark (None when no token was ever accepted)."""
        item = self._get(self.fences_table, {"resource": {"S": resource}})
        return None if item is None else int(FenceMark.from_raw_data(item).token)

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
        resource: str,
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
            resource=resource,
            token=token,
            request_id=request_id,
            created_at=now,
            updated_at=now,
        )

    def _admit(self, record: IdempotencyRecord, extra: Sequence[Mapping[str, Any]]) -> Reply | None:
        """Run the transaction; None when it committed for this call, else the answer."""
        resource, token = str(record.resource), int(record.token)
        fence: dict[str, Any] = {
            "TableName": self.fences_table,
            "Key": {"resource": {"S": resource}},
        }
        fence.update(
            _params(
                _F.resource.does_not_exist() | (_F.token <= token),
                [_F.token.set(token), _F.updated_at.set(record.updated_at)],
            )
        )
        put: dict[str, Any] = {"TableName": self.idempotency_table, "Item": record.serialize()}
        put.update(_params(_I.idem_key.does_not_exist()))
        items = [{"Update": fence}, {"Put": put}, *extra]
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
        """After a cancelled transaction: fence first, then the key (see module doc)."""
        token = int(mine.token)
        highest = self.highest(str(mine.resource))
        if highest is not None and token < highest:
            self.journal(
                "fence_rejected",
                resource=mine.resource,
                token=token,
                highest=highest,
                idem_key=mine.idem_key,
            )
            return Reply(412, {"error": "stale_token", "highest": highest})
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
            json.loads(found.response or "{}"),
            replayed=True,
            external_id=found.external_id,
        )

    def _finish(self, idem_key: str, request_id: str, result: EffectResult, body_json: str) -> None:
        params: dict[str, Any] = {
            "TableName": self.idempotency_table,
            "Key": {"idem_key": {"S": idem_key}},
            "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
        }
        params.update(
            _params(
                (_I.state == IN_FLIGHT) & (_I.request_id == request_id),
                [
                    _I.state.set(DONE),
                    _I.status.set(result.status),
                    _I.response.set(body_json),
                    _I.updated_at.set(self._clock()),
                    *([_I.external_id.set(result.external_id)] if result.external_id else []),
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
        params.update(_params(cond))
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


def _check(resource: str, token: int, idem_key: str) -> None:
    if not resource:
        raise ValueError("resource must not be empty")
    if isinstance(token, bool) or not isinstance(token, int) or token < 0:
        raise ValueError(f"token must be a non-negative int, got {token!r}")
    if not idem_key or len(idem_key) > MAX_KEY_LENGTH:
        raise ValueError(f"idempotency key must be 1..{MAX_KEY_LENGTH} characters")


# --- WSGI glue ------------------------------------------------------------------------


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
        """The body parsed as JSON; raises ValueError when it is not JSON."""
        return json.loads(self.body or b"null")


@dataclass(frozen=True)
class Fence:
    """The fencing context of one request."""

    resource: str
    token: int
    idem_key: str


@dataclass(frozen=True)
class AtomicWrite:
    """A handler's plan for ``apply_with_write``: the effect's write and the response to store."""

    write: Mapping[str, Any]
    response: EffectResult


Plan: TypeAlias = Reply | AtomicWrite | Callable[[], EffectResult]
"""What a handler returns: a Reply (answered now, not stored: e.g. a 400 for a bad
body), an AtomicWrite, or an effect to run under ``apply``."""

IDEMPOTENCY_KEY: Final = "Idempotency-Key"
EXECUTION_FENCE: Final = "X-Execution-Fence"
FENCE_RESOURCE: Final = "X-Fence-Resource"
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


def _fence_of(req: HttpRequest, resource: Callable[[HttpRequest], str] | None) -> Fence | Reply:
    key = (req.header(IDEMPOTENCY_KEY) or "").strip()
    if not key:
        return _bad("missing_header", IDEMPOTENCY_KEY, f"header {IDEMPOTENCY_KEY} is required")
    if len(key) > MAX_KEY_LENGTH:
        return _bad("invalid_header", IDEMPOTENCY_KEY, f"at most {MAX_KEY_LENGTH} characters")
    raw_token = (req.header(EXECUTION_FENCE) or "").strip()
    if not raw_token:
        return _bad("missing_header", EXECUTION_FENCE, f"header {EXECUTION_FENCE} is required")
    if not raw_token.isdigit():
        return _bad("invalid_header", EXECUTION_FENCE, "must be a non-negative integer")
    if resource is None:
        res = (req.header(FENCE_RESOURCE) or "").strip()
        if not res:
            return _bad("missing_header", FENCE_RESOURCE, f"header {FENCE_RESOURCE} is required")
    else:
        try:
            res = resource(req)
        except (ValueError, KeyError, TypeError) as exc:
            return Reply(400, {"error": "invalid_request", "message": f"no fence resource: {exc}"})
    return Fence(resource=res, token=int(raw_token), idem_key=key)


def _payload_of(req: HttpRequest, fence: Fence) -> dict[str, Any]:
    # What the key promises: the same endpoint, resource and body. JSON bodies are
    # compared canonically (whitespace and key order do not matter); others by bytes.
    # The token is left out: a new owner retrying the key must get the replay.
    payload: dict[str, Any] = {
        "method": req.method,
        "path": req.path,
        "query": req.query,
        "resource": fence.resource,
    }
    try:
        payload["json"] = json.loads(req.body) if req.body else None
    except ValueError:
        payload["body_sha256"] = hashlib.sha256(req.body).hexdigest()
    return payload


def fenced_wsgi_app(
    receiver: FencedReceiver,
    handler: Callable[[HttpRequest, Fence], Plan],
    *,
    resource: Callable[[HttpRequest], str] | None = None,
    max_body: int = 1 << 20,
) -> WSGIApplication:
    """A WSGI app that fences every request it gets, then applies the handler's plan.

    Reads ``Idempotency-Key``, ``X-Execution-Fence`` (integer token) and the
    resource (``resource(request)`` if given, else header ``X-Fence-Resource``);
    a missing one is ``400 {"error": "missing_header", "header": NAME}``. The
    handler only *plans* (it must not act): it returns a :data:`Plan`. Replays
    carry ``Idempotent-Replayed: true``. When DynamoDB fails the answer is 503
    (retry with the same key: a committed request then replays).
    """

    def app(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        req = _request(environ, max_body)
        if isinstance(req, Reply):
            return _respond(start_response, req)
        fence = _fence_of(req, resource)
        if isinstance(fence, Reply):
            return _respond(start_response, fence)
        plan = handler(req, fence)
        if isinstance(plan, Reply):
            return _respond(start_response, plan)
        payload = _payload_of(req, fence)
        try:
            if isinstance(plan, AtomicWrite):
                reply = receiver.apply_with_write(
                    fence.resource, fence.token, fence.idem_key, payload, plan.write, plan.response
                )
            else:
                reply = receiver.apply(fence.resource, fence.token, fence.idem_key, payload, plan)
        except (AwsUnavailable, AwsCallFailed, ResourceMissing) as exc:
            _log.warning("receiver unavailable for %s: %s", fence.idem_key, exc)
            reply = Reply(503, {"error": "receiver_unavailable", "message": str(exc)})
            return _respond(start_response, reply, [("Retry-After", "1")])
        return _respond(start_response, reply)

    return app
