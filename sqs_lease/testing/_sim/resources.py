"""The run's fixed resources: its tables, queues and job classes, and the clock's epoch.

Every world has the same names (a schedule reads the same whatever the seed); the
fifo world renames the queues (``fifo.queue_urls``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import BaseModel
from pynamodb.models import Model

from ..._jobs import JobClass
from ..._schema.create_table import create_table_params
from ..._schema.models import AttemptRecord, GroupRecord, IntentRecord, JobRecord
from .ddb import IndexSpec, TableSpec

if TYPE_CHECKING:
    from .plan import RunPlan

JOBS = "sim-jobs"
INTENTS = "sim-intents"
GROUPS = "sim-groups"
ATTEMPTS = "sim-attempts"
QUEUE = "https://sqs.sim.local/000000000000/sim-work"
DLQ = "https://sqs.sim.local/000000000000/sim-work-dlq"
JOB_CLASS = "sim"
JOB_CLASS_V2 = "sim-v2"  # mixed_versions: the class the old app version does not know
EPOCH_S = 1_767_225_600.0


class SimPayload(BaseModel):
    n: int


def sim_job_class(name: str, p: RunPlan) -> JobClass:
    """A job class of the run: its timings and retry policy are the plan's."""
    return JobClass(
        name=name,
        payload_model=SimPayload,
        lease_seconds=p.lease,
        heartbeat_seconds=p.heartbeat,
        jitter_seconds=p.jitter,
        missed_heartbeats=3,
        effect_timeout_seconds=p.tool_http_timeout,
        progress_timeout_seconds=p.progress_timeout,
        stage_budget_seconds=p.stage_budget,
        max_attempts=p.max_attempts,
        backoff_base_seconds=p.backoff_base,
        backoff_max_seconds=p.backoff_max,
    )


def model_table_spec(model: type[Model], name: str) -> TableSpec:
    """A simulated table as the real one is created (``create_table_params``): the
    model's keys and every global secondary index with its projection."""
    params = create_table_params(model, name)
    hash_key, range_key = _keys(params["KeySchema"])
    indexes = []
    for index in params.get("GlobalSecondaryIndexes", ()):
        ih, ir = _keys(index["KeySchema"])
        projection = index["Projection"]
        kind = projection["ProjectionType"]
        projects = None if kind == "ALL" else tuple(projection.get("NonKeyAttributes", ()))
        indexes.append(IndexSpec(index["IndexName"], ih, ir, projects))
    return TableSpec(name, hash_key, range_key, tuple(indexes))


def _keys(schema: list[dict[str, str]]) -> tuple[str, str | None]:
    by_type = {k["KeyType"]: k["AttributeName"] for k in schema}
    return by_type["HASH"], by_type.get("RANGE")


def jobs_table_spec(name: str = JOBS) -> TableSpec:
    """The jobs table as created: the sparse ``unsent`` index the stranded sweep
    queries, the ``group`` index a group cancel queries, ``attention`` and ``workers``."""
    return model_table_spec(JobRecord, name)


def table_specs() -> list[TableSpec]:
    """Every table of a world, each with the indexes the real one has."""
    return [
        jobs_table_spec(),
        model_table_spec(IntentRecord, INTENTS),
        model_table_spec(AttemptRecord, ATTEMPTS),
        model_table_spec(GroupRecord, GROUPS),
    ]
