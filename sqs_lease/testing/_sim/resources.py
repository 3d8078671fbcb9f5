"""The run's fixed resources: its tables, queues and job classes, and the clock's epoch.

Every world has the same names (a schedule reads the same whatever the seed); the
fifo world renames the queues (``fifo.queue_urls``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import BaseModel

from ..._jobs import JobClass
from ..._schema.models import GROUP_INDEX, UNSENT_INDEX, GroupIndex, UnsentIndex
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


def jobs_table_spec(name: str = JOBS) -> TableSpec:
    """The jobs table with the sparse ``unsent`` index the stranded sweep queries
    (as ``_schema.models.UnsentIndex``: keys ``unsent``/``unsent_since``, its projection)
    and the sparse ``group`` index a group cancel queries (``_schema.models.GroupIndex``)."""
    projects = UnsentIndex.Meta.projection.non_key_attributes
    unsent = IndexSpec(UNSENT_INDEX, "unsent", "unsent_since", tuple(projects or ()))
    in_group = GroupIndex.Meta.projection.non_key_attributes
    group = IndexSpec(GROUP_INDEX, "group_id", "created_at", tuple(in_group or ()))
    return TableSpec(name, "job_id", indexes=(unsent, group))
