"""Creating and finding the queue and tables (idempotent)."""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

from ._aws import classify, endpoint_of, make_client
from ._config import Settings
from ._core.calls import ErrorKind
from ._core.deploy import REDRIVE_BACKSTOP
from ._core.inputs import loads as _loads
from ._errors import AwsCallFailed, AwsUnavailable, ResourceMissing

if TYPE_CHECKING:
    from ._schema.create_table import WarmThroughput

DEFAULT_MAX_RECEIVES = REDRIVE_BACKSTOP
"""Redrive backstop (``_core.deploy``): set well above any job class's ``max_attempts``."""


def _call(client: Any, op: str, *, missing: tuple[str, str] | None = None, **params: Any) -> Any:
    """Call ``op`` (boto3's method name) on ``client``; a failure becomes the package's
    typed error, naming the API operation (``GetQueueUrl``, as AWS's docs and
    CloudTrail name it).

    ``missing``: what the call names and the command that creates it; a resource the
    call finds absent then raises ResourceMissing saying so, not AwsCallFailed."""
    try:
        return getattr(client, op)(**params)
    except Exception as exc:
        where = endpoint_of(client)
        err = classify(exc, 0.0, 0.0, where=where)
        if missing is not None and err.kind is ErrorKind.NOT_FOUND:
            what, fix = missing
            raise ResourceMissing(
                f"{what} does not exist on {where}: if the region and endpoint are the "
                "ones you meant (--region, AWS_REGION / AWS_DEFAULT_REGION, --endpoint-url, "
                f"AWS_ENDPOINT_URL), run `{fix}`; else fix them first"
            ) from None
        api = client.meta.method_to_api_mapping.get(op, op)
        if err.kind is ErrorKind.UNREACHABLE:
            raise AwsUnavailable(f"{api}: {where} did not answer ({err.code})") from None
        raise AwsCallFailed(f"{api} on {where}: {err.code}: {err.message}", err.code) from None


def create_tables(settings: Settings, warm: WarmThroughput | None = None) -> list[str]:
    """Create the toolkit's tables if missing (an existing one gets the indexes this
    version queries); return their names. ``warm``: each table's and index's warm
    throughput, raised where it is lower (a table being created or updated is waited
    for; DynamoDB bills a warm throughput's increase once)."""
    # Imported here: a worker's (or a Lambda function's) start never creates tables.
    from .deploy import TABLE_MODELS, table_names

    ddb = make_client(settings, "dynamodb")
    names = table_names(settings)
    wanted = [(model, names[role]) for role, model in TABLE_MODELS.items()]
    for model, name in wanted:
        # DescribeTable, not ListTables: the latter pages at 100 names, and a table
        # missed there would never get the indexes added below.
        described = _describe(ddb, name)
        if described is None:
            try:
                _call(ddb, "create_table", **_create_params(model, name, warm))
            except AwsCallFailed as exc:
                if exc.code != "ResourceInUseException":
                    raise
            ddb.get_waiter("table_exists").wait(TableName=name, WaiterConfig={"Delay": 1})
            described = _describe(ddb, name)  # (another `tables create` made it first)
        else:
            _add_missing_indexes(ddb, model, name, described)
        if warm is not None and described is not None:
            _raise_warm(ddb, name, warm)
    return [name for _, name in wanted]


def _create_params(
    model: type[Any], name: str, warm: WarmThroughput | None = None
) -> dict[str, Any]:
    from ._schema.create_table import create_table_params

    return create_table_params(model, name, warm)


def _raise_warm(ddb: Any, name: str, warm: WarmThroughput) -> None:
    """Raise the table's and each index's warm throughput where it is lower, one
    UpdateTable at a time (DynamoDB takes one change of a table at once)."""
    table = _describe(ddb, name) or {}
    want = warm.param(table.get("WarmThroughput"))
    if want:
        _update_when_active(ddb, name, WarmThroughput=want)
    for index in table.get("GlobalSecondaryIndexes", []):
        want = warm.param(index.get("WarmThroughput"))
        if want:
            update = {"Update": {"IndexName": index["IndexName"], "WarmThroughput": want}}
            _update_when_active(ddb, name, GlobalSecondaryIndexUpdates=[update])


def _update_when_active(ddb: Any, name: str, **change: Any) -> None:
    ddb.get_waiter("table_exists").wait(TableName=name, WaiterConfig={"Delay": 1})
    _call(ddb, "update_table", TableName=name, **change)


def _describe(ddb: Any, name: str) -> dict[str, Any] | None:
    try:
        table: dict[str, Any] = _call(ddb, "describe_table", TableName=name)["Table"]
    except AwsCallFailed as exc:
        if exc.code == "ResourceNotFoundException":
            return None
        raise
    return table


def _add_missing_indexes(ddb: Any, model: type[Any], name: str, described: dict[str, Any]) -> None:
    """A table made by an earlier version gets the indexes this one queries, as this
    version defines them; DynamoDB backfills them. An index whose projection changed
    cannot be altered in place: it is deleted, and created anew once gone (a listing
    through it fails with a clear error meanwhile; the records are untouched)."""
    wanted = _create_params(model, name)
    indexes = wanted.get("GlobalSecondaryIndexes", [])
    if not indexes:
        return
    have = {i["IndexName"]: i for i in described.get("GlobalSecondaryIndexes", [])}
    for index in indexes:
        old = have.get(index["IndexName"])
        if old is not None and _same_projection(old.get("Projection", {}), index["Projection"]):
            continue
        if old is not None:
            _update_indexes(ddb, name, [], {"Delete": {"IndexName": index["IndexName"]}})
            _wait_index_gone(ddb, name, index["IndexName"])
        keys = {k["AttributeName"] for k in index["KeySchema"]}
        defs = [d for d in wanted["AttributeDefinitions"] if d["AttributeName"] in keys]
        _update_indexes(ddb, name, defs, {"Create": index})


def _same_projection(have: dict[str, Any], want: dict[str, Any]) -> bool:
    return have.get("ProjectionType") == want.get("ProjectionType") and sorted(
        have.get("NonKeyAttributes", [])
    ) == sorted(want.get("NonKeyAttributes", []))


def _update_indexes(
    ddb: Any, name: str, defs: list[dict[str, str]], update: dict[str, Any]
) -> None:
    with_defs: dict[str, Any] = {"AttributeDefinitions": defs} if defs else {}
    try:
        _call(
            ddb, "update_table", TableName=name, **with_defs, GlobalSecondaryIndexUpdates=[update]
        )
    except AwsCallFailed as exc:
        # Another `tables create` is changing it (one index change at a time).
        if exc.code not in ("ResourceInUseException", "LimitExceededException"):
            raise


_INDEX_DELETE_WAIT = 1800.0
"""DynamoDB takes minutes to delete an index of a large table; past this, give up."""


def _wait_index_gone(ddb: Any, name: str, index: str) -> None:
    deadline = time.monotonic() + _INDEX_DELETE_WAIT
    while True:
        described = _describe(ddb, name) or {}
        if all(i["IndexName"] != index for i in described.get("GlobalSecondaryIndexes", [])):
            return
        if time.monotonic() > deadline:
            raise AwsCallFailed(
                f"update_table on {name}: index {index} still being deleted after "
                f"{_INDEX_DELETE_WAIT:g} s; run `sqs-lease tables create` again later",
                "IndexDeleteTimeout",
            )
        time.sleep(2.0)


def create_queue(
    settings: Settings,
    *,
    visibility: int = 30,
    max_receives: int = DEFAULT_MAX_RECEIVES,
    interactive: bool = False,
) -> tuple[str, str]:
    """Create the job queue with a dead-letter queue and redrive; return both URLs.

    With ``settings.fifo`` both are FIFO queues (SQS requires a FIFO queue's DLQ to be
    FIFO), without content-based deduplication: every message carries its send id
    as its deduplication id (``_core.fifo``).

    ``interactive``: also the interactive jobs' queue (priorities), with the same
    visibility and redrive to the same DLQ; workers serve it first when it exists."""
    sqs = make_client(settings, "sqs")
    # FifoQueue can only be given at creation; ContentBasedDeduplication is set again
    # on an existing queue like the other attributes.
    fifo = {"FifoQueue": "true"} if settings.fifo else {}
    dedup = {"ContentBasedDeduplication": "false"} if settings.fifo else {}
    dlq_url = _call(
        sqs,
        "create_queue",
        QueueName=settings.dlq,
        Attributes={"MessageRetentionPeriod": "1209600", **fifo},
    )["QueueUrl"]
    dlq_arn = _call(sqs, "get_queue_attributes", QueueUrl=dlq_url, AttributeNames=["QueueArn"])[
        "Attributes"
    ]["QueueArn"]
    redrive = json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": str(max_receives)})
    attrs = {"VisibilityTimeout": str(visibility), "RedrivePolicy": redrive, **dedup}
    try:
        url = _call(sqs, "create_queue", QueueName=settings.queue, Attributes={**attrs, **fifo})[
            "QueueUrl"
        ]
    except AwsCallFailed as exc:
        if "QueueAlreadyExists" not in exc.code and "QueueNameExists" not in exc.code:
            raise
        url = queue_url(settings)
        _call(sqs, "set_queue_attributes", QueueUrl=url, Attributes=attrs)
    if interactive:
        try:
            _call(
                sqs,
                "create_queue",
                QueueName=settings.interactive_queue,
                Attributes={**attrs, **fifo},
            )
        except AwsCallFailed as exc:
            if "QueueAlreadyExists" not in exc.code and "QueueNameExists" not in exc.code:
                raise
            fast = queue_url(settings, settings.interactive_queue)
            _call(sqs, "set_queue_attributes", QueueUrl=fast, Attributes=attrs)
    return url, dlq_url


def interactive_queue_url(settings: Settings) -> str | None:
    """The interactive jobs' queue URL, or None when it was not created (no priorities)."""
    try:
        return queue_url(settings, settings.interactive_queue)
    except ResourceMissing:
        return None


def queue_url(settings: Settings, name: str | None = None) -> str:
    """The job queue's URL, or ResourceMissing saying how to create it."""
    qname = name or settings.queue
    missing = (f"queue {qname!r}", "sqs-lease queue create")
    found = _call(make_client(settings, "sqs"), "get_queue_url", missing=missing, QueueName=qname)
    return str(found["QueueUrl"])


def redrive(settings: Settings, url: str) -> tuple[str | None, int | None]:
    """The DLQ URL and ``maxReceiveCount`` of the queue's redrive policy, if any."""
    sqs = make_client(settings, "sqs")
    attrs = _call(sqs, "get_queue_attributes", QueueUrl=url, AttributeNames=["RedrivePolicy"])
    policy = attrs.get("Attributes", {}).get("RedrivePolicy")
    if not policy:
        return None, None
    parsed = _loads(policy)
    arn = parsed["deadLetterTargetArn"]
    return queue_url(settings, arn.rsplit(":", 1)[-1]), int(parsed.get("maxReceiveCount", 0))


def check_table(settings: Settings) -> None:
    """Raise ResourceMissing (with the fix) if a table the worker needs is absent."""
    ddb = make_client(settings, "dynamodb")
    for table in (settings.jobs_table, settings.intents_table, settings.attempts_table):
        _check_one(ddb, table)


def check_slots_table(settings: Settings) -> None:
    """Raise ResourceMissing (with the fix) if the slots table (the app declares a
    concurrency limit) is absent."""
    _check_one(make_client(settings, "dynamodb"), settings.slots_table)


def _check_one(ddb: Any, table: str) -> None:
    _call(
        ddb,
        "describe_table",
        missing=(f"table {table!r}", "sqs-lease tables create"),
        TableName=table,
    )
