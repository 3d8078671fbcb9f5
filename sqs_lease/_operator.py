"""The operator's reads: one job or intent, lists of them, workers' liveness records.

What ``sqs-lease jobs`` and ``sqs-lease intents`` show, read here so the command
line never talks to DynamoDB itself. Lists are bounded (``limit``, one item past it
read to know whether more exist) and never a full Scan unless the caller asked for
a state no index holds: parked and failed jobs come from the sparse ``attention``
index, running ones from the workers' liveness records (``workers`` index),
ambiguous intents from the ``ambiguous`` index. Advisory reads (liveness, lists)
are eventually consistent; one job or intent is read consistently.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from ._aws import SyncDriver, make_client
from ._config import Settings
from ._core.intents import IntentState
from ._core.liveness import LIVENESS_PREFIX, Liveness, liveness_key, liveness_of
from ._core.records import JobState
from ._core.resolving import Resolution, Resolved, resolve_flow
from ._core.timeline import IntentAttemptFacts, IntentFacts
from ._journal import Journal
from ._producer import new_send_id
from ._resources import interactive_queue_url, queue_url
from ._schema.expressions import key_query
from ._schema.intent_requests import IntentTable
from ._schema.job_requests import JobTable
from ._schema.models import (
    AMBIGUOUS_INDEX,
    ATTENTION_INDEX,
    ATTENTION_STATES,
    INTENT_LIST_FIELDS,
    JOB_LIST_FIELDS,
    WORKERS_INDEX,
    AttemptRecord,
    IntentRecord,
    JobRecord,
)
from ._schema.views import record_of

__all__ = [
    "INDEXED_JOB_STATES",
    "TIMELINE_INTENTS",
    "attempts_of",
    "intent_facts",
    "intent_filter_indexed",
    "list_intents",
    "list_jobs",
    "read_intent",
    "read_job",
    "resolve_intent",
    "workers_liveness",
]

INDEXED_JOB_STATES = (*ATTENTION_STATES, JobState.RUNNING.value)
"""Job states an index holds: listing any other state reads the whole table."""

TIMELINE_INTENTS = 200
"""Intents of one job a timeline reads at most (the caller says when more exist)."""

# Read besides, for a job's timeline (still never payloads or responses).
_INTENT_TIMELINE_FIELDS = ("confirmed_at", "reconciled")
_BATCH_TRIES = 5  # UnprocessedKeys: a few more tries, then show what came


def _ddb(settings: Settings) -> Any:
    return make_client(settings, "dynamodb")


def read_job(settings: Settings, job_id: str) -> dict[str, Any] | None:
    """The job's record as stored (a consistent read), or None."""
    item: dict[str, Any] | None = (
        _ddb(settings)
        .get_item(TableName=settings.jobs_table, Key={"job_id": {"S": job_id}}, ConsistentRead=True)
        .get("Item")
    )
    return item or None


def read_intent(settings: Settings, key: str) -> IntentRecord | None:
    """The intent as stored (a consistent read), or None."""
    item = (
        _ddb(settings)
        .get_item(
            TableName=settings.intents_table, Key={"intent_key": {"S": key}}, ConsistentRead=True
        )
        .get("Item")
    )
    return _intent_of(item) if item else None


def _intent_of(item: Mapping[str, Any]) -> IntentRecord:
    rec: IntentRecord = IntentRecord.from_raw_data(dict(item))
    return rec


def _attempt_of(item: Mapping[str, Any]) -> AttemptRecord:
    rec: AttemptRecord = AttemptRecord.from_raw_data(dict(item))
    return rec


def _batch_get(ddb: Any, want: dict[str, Any], table: str) -> list[dict[str, Any]]:
    """Every item of one BatchGetItem request (up to 100 keys), retrying the
    unprocessed keys a few times; what still did not come is left out."""
    found: list[dict[str, Any]] = []
    for _ in range(_BATCH_TRIES):
        page = ddb.batch_get_item(RequestItems=want)
        found.extend(page.get("Responses", {}).get(table, []))
        want = page.get("UnprocessedKeys") or {}
        if not want:
            break
    return found


def workers_liveness(settings: Settings, owners: Iterable[str]) -> dict[str, list[Liveness]]:
    """The liveness records (every part) of these workers, read in BatchGetItem calls of
    100 keys (eventually consistent: advisory data, half the read cost)."""
    ddb = _ddb(settings)
    table = settings.jobs_table
    found: dict[str, list[Liveness]] = {}

    def read(keys: list[str]) -> None:
        for i in range(0, len(keys), 100):
            want = {table: {"Keys": [{"job_id": {"S": k}} for k in keys[i : i + 100]]}}
            for item in _batch_get(ddb, want, table):
                live = liveness_of(item)
                if live is not None:
                    found.setdefault(live.worker_id, []).append(live)

    read(sorted({liveness_key(o) for o in owners}))
    more = [liveness_key(w, n) for w, parts in found.items() for n in range(1, parts[0].parts)]
    read(more)
    return found


def list_jobs(settings: Settings, state: str | None, limit: int) -> tuple[list[JobRecord], bool]:
    """Up to ``limit`` job records, oldest first, and whether more exist. A state of
    :data:`INDEXED_JOB_STATES` reads its index; no state one bounded page of the
    table; any other state a filtered Scan of the whole table (the caller decides
    whether to allow it)."""
    ddb = _ddb(settings)
    names = {f"#f{i}": name for i, name in enumerate(JOB_LIST_FIELDS)}
    projection = {"ProjectionExpression": ", ".join(names), "ExpressionAttributeNames": names}
    if state in ATTENTION_STATES:
        newest_first = key_query(
            settings.jobs_table, "attention", state, index=ATTENTION_INDEX, forward=False
        )
        items, more = _bounded(ddb.query, newest_first, limit)
        found = [record_of(item) for item in items]
    elif state == JobState.RUNNING.value:
        found, more = _running_jobs(settings, ddb, projection, limit)
    else:
        params: dict[str, Any] = {"TableName": settings.jobs_table, **projection}
        if state:
            params["FilterExpression"] = "#st = :st"
            params["ExpressionAttributeNames"] = {**names, "#st": "state"}
            params["ExpressionAttributeValues"] = {":st": {"S": state}}
        else:
            # Not the workers' liveness records.
            params["FilterExpression"] = "attribute_exists(#st)"
            params["ExpressionAttributeNames"] = {**names, "#st": "state"}
        items, more = _scan_items(ddb, params, limit)
        found = [record_of(item) for item in items]
    found.sort(key=lambda r: (r.created_at or 0, r.job_id))
    return found, more


def _bounded(
    read: Callable[..., Any], params: dict[str, Any], limit: int, *, page_floor: int = 1
) -> tuple[list[dict[str, Any]], bool]:
    """Up to ``limit`` items of a Query or Scan (``read``), following its pages, and
    whether more exist (one item past the limit is read to know it for sure). A page
    asks for what is still missing, at least ``page_floor`` (a filtered Scan's Limit
    counts the items read before the filter)."""
    params = dict(params)
    found: list[dict[str, Any]] = []
    want = limit + 1
    while len(found) < want:
        page = read(**params, Limit=max(want - len(found), page_floor))
        found.extend(page.get("Items", []))
        start = page.get("LastEvaluatedKey")
        if not start:
            break
        params["ExclusiveStartKey"] = start
    return found[:limit], len(found) > limit


def _pages(read: Callable[..., Any], params: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every page of a Query (``read``): bounded by what it reads, each page moves
    the start key on."""
    params = dict(params)
    while True:
        page: dict[str, Any] = read(**params)
        yield page
        start = page.get("LastEvaluatedKey")
        if not start:
            return
        params["ExclusiveStartKey"] = start


def _running_jobs(
    settings: Settings, ddb: Any, projection: dict[str, Any], limit: int
) -> tuple[list[JobRecord], bool]:
    """Running jobs: what the workers' liveness records say they hold (found through
    the keys-only ``workers`` index), each read from its record (eventually
    consistent) and kept only if it still says running."""
    workers: list[str] = []
    liveness = key_query(settings.jobs_table, "kind", "liveness", index=WORKERS_INDEX)
    for page in _pages(ddb.query, liveness):
        for item in page.get("Items", []):
            key = item["job_id"]["S"].removeprefix(LIVENESS_PREFIX)
            if "#" not in key:  # part 0 names the worker; workers_liveness reads the rest
                workers.append(key)
    live = workers_liveness(settings, workers) if workers else {}
    held = sorted({h.job_id for parts in live.values() for p in parts for h in p.held})
    table = settings.jobs_table
    found: list[JobRecord] = []
    for i in range(0, len(held), 100):
        want = {table: {"Keys": [{"job_id": {"S": j}} for j in held[i : i + 100]], **projection}}
        for item in _batch_get(ddb, want, table):
            rec = record_of(item)
            if rec.state == JobState.RUNNING.value:
                found.append(rec)
        if len(found) > limit:
            break
    found.sort(key=lambda r: (r.created_at or 0, r.job_id))
    return found[:limit], len(found) > limit


def _scan_items(ddb: Any, params: dict[str, Any], limit: int) -> tuple[list[dict[str, Any]], bool]:
    """Up to ``limit`` items of a (maybe filtered) Scan and whether more exist: a
    filtered one reads wider pages."""
    return _bounded(ddb.scan, params, limit, page_floor=100 if "FilterExpression" in params else 1)


def intent_filter_indexed(state: str | None, job_id: str | None) -> bool:
    """Whether :func:`list_intents` reads an index (or one page) for this filter,
    not the whole intents table."""
    return state == IntentState.AMBIGUOUS.value or not (state or job_id)


def list_intents(
    settings: Settings, state: str | None, job_id: str | None, limit: int
) -> tuple[list[IntentRecord], bool]:
    """Up to ``limit`` intents, oldest first, and whether more exist (never payloads
    or responses): ambiguous ones from the sparse ``ambiguous`` index, none filtered
    from one bounded page of the table, any other filter from a filtered Scan of the
    whole table (see :func:`intent_filter_indexed`)."""
    ddb = _ddb(settings)
    if state == IntentState.AMBIGUOUS.value:
        params_q = key_query(
            settings.intents_table, "attention", state, index=AMBIGUOUS_INDEX, forward=False
        )
        if job_id:
            params_q["FilterExpression"] = "#job = :job"
            params_q["ExpressionAttributeNames"]["#job"] = "job_id"
            params_q["ExpressionAttributeValues"][":job"] = {"S": job_id}
        items, more = _bounded(ddb.query, params_q, limit)
        found = [_intent_of(item) for item in items]
        found.sort(key=lambda r: (r.created_at or 0, r.intent_key))
        return found, more
    fields = INTENT_LIST_FIELDS + _INTENT_TIMELINE_FIELDS
    names = {f"#f{i}": name for i, name in enumerate(fields)}
    params: dict[str, Any] = {
        "TableName": settings.intents_table,
        # Never read payloads or responses just to list intents.
        "ProjectionExpression": ", ".join(names),
        "ExpressionAttributeNames": names,
    }
    filters: list[str] = []
    values: dict[str, Any] = {}
    if state:
        filters.append("#st = :st")
        names["#st"] = "state"
        values[":st"] = {"S": state}
    if job_id:
        filters.append("#job = :job")
        names["#job"] = "job_id"
        values[":job"] = {"S": job_id}
    if filters:
        params["FilterExpression"] = " AND ".join(filters)
        params["ExpressionAttributeValues"] = values
    items, more = _scan_items(ddb, params, limit)
    found = [_intent_of(item) for item in items]
    found.sort(key=lambda r: (r.created_at or 0, r.intent_key))
    return found, more


def attempts_of(settings: Settings, key: str) -> list[AttemptRecord]:
    """Every attempt of one intent, in order (a consistent Query of its log)."""
    log = key_query(settings.attempts_table, "intent_key", key, ConsistentRead=True)
    return [
        _attempt_of(item)
        for page in _pages(_ddb(settings).query, log)
        for item in page.get("Items", [])
    ]


def intent_facts(settings: Settings, job_id: str) -> tuple[list[IntentFacts], bool]:
    """The job's intents (up to :data:`TIMELINE_INTENTS`) and their attempt logs, as
    the timeline reads them, and whether more intents exist."""
    records, more = list_intents(settings, None, job_id, TIMELINE_INTENTS)
    facts = [
        IntentFacts(
            key=rec.intent_key,
            target=rec.target,
            action=rec.action,
            state=rec.state,
            created_at=float(rec.created_at or 0),
            updated_at=float(rec.updated_at or 0),
            confirmed_at=None if rec.confirmed_at is None else float(rec.confirmed_at),
            reconciled=bool(rec.reconciled),
            attempts=tuple(
                IntentAttemptFacts(
                    attempt=int(a.attempt),
                    job_id=a.job_id,
                    token=int(a.token),
                    worker=a.worker,
                    started_at=float(a.started_at),
                    ended_at=None if a.ended_at is None else float(a.ended_at),
                    outcome=a.outcome,
                )
                for a in attempts_of(settings, rec.intent_key)
            ),
        )
        for rec in records
    ]
    return facts, more


def resolve_intent(
    settings: Settings,
    key: str,
    resolution: Resolution,
    *,
    external_id: str | None,
    who: str,
    why: str,
    attempt: int | None,
) -> Resolved:
    """Decide an ambiguous intent and re-enqueue its parked job (journaled).

    The job queue is looked up first: a missing queue must not strand the job with
    its intent decided and no message sent. Raises IntentNotAmbiguous when there is
    nothing to decide."""
    url = queue_url(settings)
    driver = SyncDriver(settings, Journal())
    return driver.run(
        resolve_flow(
            IntentTable(settings.intents_table, settings.attempts_table),
            JobTable(settings.jobs_table),
            queue_url=url,
            key=key,
            resolution=resolution,
            external_id=external_id,
            who=who,
            why=why,
            wall_now=time.time(),
            send_id=new_send_id(),
            # an interactive job goes back to its own queue
            interactive_url=interactive_queue_url(settings),
            attempt=attempt,
        )
    )
