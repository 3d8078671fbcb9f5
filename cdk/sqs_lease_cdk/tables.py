"""The toolkit's DynamoDB tables, their keys and indexes taken from the library's models."""

from __future__ import annotations

from typing import Any

from aws_cdk import RemovalPolicy
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_iam as iam
from constructs import Construct

from sqs_lease import ConfigError, Settings, WarmThroughput
from sqs_lease._core.liveness import LIVENESS_PREFIX
from sqs_lease.deploy import (
    GC_TTL_ATTRIBUTE,
    LIVENESS_RESOURCE,
    PERMISSIONS,
    UNSENT_INDEX,
    UNSENT_INDEX_RESOURCE,
    model_attributes,
    submit_requests,
    table_params,
)

from ._common import allow, settings_for

_TYPES = {
    "S": dynamodb.AttributeType.STRING,
    "N": dynamodb.AttributeType.NUMBER,
    "B": dynamodb.AttributeType.BINARY,
}
_PROJECTIONS = {
    "ALL": dynamodb.ProjectionType.ALL,
    "KEYS_ONLY": dynamodb.ProjectionType.KEYS_ONLY,
    "INCLUDE": dynamodb.ProjectionType.INCLUDE,
}

_TABLE_ROLES = ("jobs", "intents", "attempts", "groups", "slots")

# The actions come from the library's one list (``sqs_lease.deploy.PERMISSIONS``),
# which a test checks against every call the code makes.
WORKER_TABLE_ACTIONS: dict[str, tuple[str, ...]] = {
    r: a for r, a in PERMISSIONS["worker"].items() if r in _TABLE_ROLES
}
"""What a worker calls on each table (TransactWriteItems is authorised per item
action); and Query on the jobs table's ``unsent`` index, PutItem on ``worker#`` keys."""

SWEEPER_JOBS_ACTIONS: tuple[str, ...] = PERMISSIONS["sweeper"]["jobs"]
"""What the Lambda consumer's scheduled sweep calls on the jobs table (and Query on
its ``unsent`` index only)."""

PRODUCER_TABLE_ACTIONS: dict[str, tuple[str, ...]] = {
    r: a for r, a in PERMISSIONS["producer"].items() if r in _TABLE_ROLES
}
"""What a producer calls on each table; each action is granted on the attributes
submit's requests name only (``sqs_lease.deploy.submit_requests``)."""

# An UpdateItem may read back only what it wrote (the IAM guide's rule for an
# attribute-limited write): never ALL_OLD / ALL_NEW, the whole record.
_WRITE_RETURNS = ("NONE", "UPDATED_OLD", "UPDATED_NEW")


class LeaseTables(Construct):
    """The jobs, intents, attempts, groups and slots tables.

    Keys, attribute types and global secondary indexes come from the library's
    pynamodb models (``sqs_lease.deploy.table_params``), the same definition
    ``sqs-lease tables create`` uses; names from the library's ``Settings`` for
    ``prefix``. On-demand billing, point-in-time recovery, deletion protection
    (on unless ``deletion_protection=False``), retained on stack deletion by
    default. TTL is set on ``ttl_attribute`` (``GC_TTL_ATTRIBUTE``), which no
    model has: it is garbage collection of records an operator marks, never logic.
    ``warm`` (``sqs_lease.WarmThroughput``): each table's and index's warm throughput,
    as ``sqs-lease tables create --warm-reads/--warm-writes`` sets it, for a launch
    past a new on-demand table's 4,000 write / 12,000 read units a second.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        prefix: str = "sqs-lease",
        deletion_protection: bool = True,
        removal_policy: RemovalPolicy = RemovalPolicy.RETAIN,
        ttl_attribute: str | None = GC_TTL_ATTRIBUTE,
        warm: WarmThroughput | None = None,
    ) -> None:
        settings = settings_for(prefix)
        params = table_params(settings, warm)
        if ttl_attribute is not None:
            for role in params:
                if ttl_attribute in model_attributes(role):
                    raise ConfigError(
                        f"ttl_attribute={ttl_attribute!r} is an attribute of the {role} "
                        "records: TTL there would delete live records; choose a name no "
                        "model uses (default: GC_TTL_ATTRIBUTE)"
                    )
        if removal_policy is RemovalPolicy.DESTROY and deletion_protection:
            raise ConfigError(
                "removal_policy=DESTROY with deletion_protection=True: the stack could "
                "never delete the tables; turn deletion_protection off for a throwaway stack"
            )
        super().__init__(scope, construct_id)
        self._settings = settings
        self._tables: dict[str, dynamodb.Table] = {}
        for role, p in params.items():
            self._tables[role] = _table(
                self, role, p, deletion_protection, removal_policy, ttl_attribute
            )

    @property
    def settings(self) -> Settings:
        """The library settings whose table names these are."""
        return self._settings

    @property
    def jobs(self) -> dynamodb.ITable:
        """The job records (ownership order, state, payload, result)."""
        return self._tables["jobs"]

    @property
    def intents(self) -> dynamodb.ITable:
        """The side-effect intents."""
        return self._tables["intents"]

    @property
    def attempts(self) -> dynamodb.ITable:
        """The effect attempts' log."""
        return self._tables["attempts"]

    @property
    def groups(self) -> dynamodb.ITable:
        """The agent sessions (groups): job counts and the cancelled marker."""
        return self._tables["groups"]

    @property
    def slots(self) -> dynamodb.ITable:
        """The slots of the fleet-wide concurrency limits (per job class, per tenant)."""
        return self._tables["slots"]

    def grant_worker(self, grantee: iam.IGrantable) -> None:
        """What a worker calls, per table, on that table (and its named indexes) only;
        and its liveness record: PutItem on the jobs table for ``worker#`` keys only
        (it never creates a job record)."""
        self._grant_listed(grantee, "worker")

    def grant_sweeper(self, grantee: iam.IGrantable) -> None:
        """What the scheduled sweep calls: the jobs table's ``unsent`` index (Query),
        the record's take and park (UpdateItem) and read (GetItem); the other tables'
        description only (the shell checks they exist at start)."""
        self._grant_listed(grantee, "sweeper")

    def _grant_listed(self, grantee: iam.IGrantable, who: str) -> None:
        """``PERMISSIONS[who]`` on these tables: each table's actions on that table
        only, Query on the ``unsent`` index only, the liveness PutItem on ``worker#``
        keys only (it never creates a job record)."""
        jobs = self._tables["jobs"].table_arn
        for resource, actions in PERMISSIONS[who].items():
            if resource == UNSENT_INDEX_RESOURCE:
                allow(grantee, actions, [f"{jobs}/index/{UNSENT_INDEX}"])
            elif resource == LIVENESS_RESOURCE:
                iam.Grant.add_to_principal(
                    grantee=grantee,
                    actions=list(actions),
                    resource_arns=[jobs],
                    conditions={
                        "ForAllValues:StringLike": {"dynamodb:LeadingKeys": [f"{LIVENESS_PREFIX}*"]}
                    },
                )
            elif resource in _TABLE_ROLES:
                allow(grantee, actions, [self._tables[resource].table_arn])

    def grant_producer(self, grantee: iam.IGrantable, *, job_ids: str | None = None) -> None:
        """What ``Producer.submit`` calls, and nothing more: per table and action, the
        attributes its requests name (``dynamodb:Attributes``, derived from the
        library's request builders) and no whole-record read back
        (``dynamodb:ReturnValues``). No GetItem: a producer reads no job record.

        ``job_ids``: an IAM ``StringLike`` pattern (``"orders-*"``) of the job ids this
        producer may write (``dynamodb:LeadingKeys``); without it, any job id. What
        IAM cannot stop is in cdk/README.md (a put over an existing record of an
        allowed id, the ``state`` a send write conditions on)."""
        if job_ids is not None and (not job_ids or job_ids == "*"):
            raise ConfigError(
                f"job_ids={job_ids!r}: give the pattern of this producer's own job ids "
                "(e.g. 'orders-*'), or leave it None for any job id"
            )
        wanted: dict[tuple[str, str], set[str]] = {}
        for r in submit_requests(self._settings):
            wanted.setdefault((r.role, r.action), set()).update(r.attributes)
        for (role, action), names in sorted(wanted.items()):
            conditions: dict[str, Any] = {
                "ForAllValues:StringEquals": {"dynamodb:Attributes": sorted(names)},
            }
            # IfExists: a transaction's item (a grouped submit) carries no ReturnValues.
            # PutItem knows NONE and ALL_OLD (the record it replaced): never that.
            returns = _WRITE_RETURNS if action == "dynamodb:UpdateItem" else ("NONE",)
            conditions["StringEqualsIfExists"] = {"dynamodb:ReturnValues": list(returns)}
            if job_ids is not None and role == "jobs":
                conditions["ForAllValues:StringLike"] = {"dynamodb:LeadingKeys": [job_ids]}
            iam.Grant.add_to_principal(
                grantee=grantee,
                actions=[action],
                resource_arns=[self._tables[role].table_arn],
                conditions=conditions,
            )


def _attr(defs: dict[str, str], name: str) -> dynamodb.Attribute:
    return dynamodb.Attribute(name=name, type=_TYPES[defs[name]])


def _table(
    scope: Construct,
    role: str,
    p: dict[str, Any],
    deletion_protection: bool,
    removal_policy: RemovalPolicy,
    ttl_attribute: str | None,
) -> dynamodb.Table:
    defs = {d["AttributeName"]: d["AttributeType"] for d in p["AttributeDefinitions"]}
    keys = {k["KeyType"]: k["AttributeName"] for k in p["KeySchema"]}
    table = dynamodb.Table(
        scope,
        role.capitalize(),
        table_name=p["TableName"],
        partition_key=_attr(defs, keys["HASH"]),
        sort_key=_attr(defs, keys["RANGE"]) if "RANGE" in keys else None,
        billing_mode=dynamodb.BillingMode.PAY_PER_REQUEST,
        point_in_time_recovery_specification=dynamodb.PointInTimeRecoverySpecification(
            point_in_time_recovery_enabled=True
        ),
        deletion_protection=deletion_protection,
        removal_policy=removal_policy,
        time_to_live_attribute=ttl_attribute,
        encryption=dynamodb.TableEncryption.AWS_MANAGED,
        warm_throughput=_warm(p.get("WarmThroughput")),
    )
    for index in p.get("GlobalSecondaryIndexes", []):
        ikeys = {k["KeyType"]: k["AttributeName"] for k in index["KeySchema"]}
        projection = index["Projection"]
        table.add_global_secondary_index(
            index_name=index["IndexName"],
            partition_key=_attr(defs, ikeys["HASH"]),
            sort_key=_attr(defs, ikeys["RANGE"]) if "RANGE" in ikeys else None,
            projection_type=_PROJECTIONS[projection["ProjectionType"]],
            non_key_attributes=projection.get("NonKeyAttributes"),
            warm_throughput=_warm(index.get("WarmThroughput")),
        )
    return table


def _warm(units: dict[str, int] | None) -> dynamodb.WarmThroughput | None:
    if not units:
        return None
    return dynamodb.WarmThroughput(
        read_units_per_second=units.get("ReadUnitsPerSecond"),
        write_units_per_second=units.get("WriteUnitsPerSecond"),
    )
