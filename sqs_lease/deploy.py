"""What a deployment needs from the library: table definitions and the deployment rules.

Public, for infrastructure code (the CDK constructs in ``cdk/``, or your own):
the tables' keys and indexes come from the pynamodb models the library itself
uses, and the queue and consumer numbers from the rules the worker checks.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pynamodb.models import Model

from ._config import Settings
from ._core.deploy import (
    DLQ_RETENTION_SECONDS,
    ECS_MAX_STOP_TIMEOUT,
    LAMBDA_MAX_CONCURRENCY,
    LAMBDA_MAX_TIMEOUT,
    LAMBDA_VISIBILITY_FACTOR,
    LIVENESS_RESOURCE,
    PERMISSIONS,
    QUEUE_RETENTION_SECONDS,
    REDRIVE_BACKSTOP,
    SHUTDOWN_GRACE_SECONDS,
    SHUTDOWN_RELEASE_MARGIN,
    SQS_MAX_RECEIVE_COUNT,
    UNSENT_INDEX_RESOURCE,
    check_lambda_concurrency,
    check_lambda_fit,
    check_lambda_timing,
    duration_alarm_seconds,
    ecs_stop_timeout,
    lambda_visibility_floor,
    max_receive_count_for,
    queue_visibility_for,
    redrive_too_tight,
)
from ._schema.create_table import WarmThroughput, create_table_params
from ._schema.group_requests import GroupTable
from ._schema.job_requests import JobTable
from ._schema.models import UNSENT_INDEX as UNSENT_INDEX  # the index the stranded sweep queries
from ._schema.models import AttemptRecord, GroupRecord, IntentRecord, JobRecord, SlotRecord

GC_TTL_ATTRIBUTE = "gc_expires_at"
"""The attribute a table's TTL may be set on, as garbage collection only: no model
has it, so no decision of the library reads it (TTL deletes up to days late). An
operator who wants finished records collected writes it on them."""


TABLE_MODELS: dict[str, type[Model]] = {
    "jobs": JobRecord,
    "intents": IntentRecord,
    "attempts": AttemptRecord,
    "groups": GroupRecord,
    "slots": SlotRecord,
}
"""The pynamodb model of each table, by role: the one schema."""


def table_names(settings: Settings) -> dict[str, str]:
    """Each table's name under ``settings``, by role."""
    return {
        "jobs": settings.jobs_table,
        "intents": settings.intents_table,
        "attempts": settings.attempts_table,
        "groups": settings.groups_table,
        "slots": settings.slots_table,
    }


def table_params(
    settings: Settings, warm: WarmThroughput | None = None
) -> dict[str, dict[str, Any]]:
    """CreateTable parameters of the toolkit's tables, by role (``jobs``, ``intents``,
    ``attempts``): names from ``settings``, keys and indexes from the models;
    ``warm``: each table's and index's warm throughput."""
    names = table_names(settings)
    return {
        role: create_table_params(model, names[role], warm) for role, model in TABLE_MODELS.items()
    }


def model_attributes(role: str) -> frozenset[str]:
    """The attribute names the library's model of table ``role`` has."""
    return frozenset(TABLE_MODELS[role].get_attributes())


@dataclass(frozen=True)
class ProducerRequest:
    """One DynamoDB request ``Producer.submit`` can send: the IAM action that
    authorises it, the table's role, the request's parameters, and the top-level
    attribute names it reads, writes or conditions on (IAM's ``dynamodb:Attributes``)."""

    action: str
    role: str
    params: Mapping[str, Any]
    attributes: frozenset[str]
    return_values: str  # IAM's ``dynamodb:ReturnValues`` (NONE when not given)


def request_attributes(params: Mapping[str, Any]) -> frozenset[str]:
    """The top-level attribute names of one item request: its key, its item, and every
    name its expressions use (the library writes every name as a placeholder)."""
    names = set(params.get("Key", {})) | set(params.get("Item", {}))
    names |= {
        n.split(".")[0].split("[")[0] for n in params.get("ExpressionAttributeNames", {}).values()
    }
    return frozenset(names)


def submit_requests(settings: Settings) -> tuple[ProducerRequest, ...]:
    """Every DynamoDB request ``Producer.submit`` sends, built by the library's own
    request builders with every optional field set: a new record (alone, or as the
    ``Put`` of a grouped submit's transaction with its group's count), taking over a
    send left unsent, marking the message sent, giving the send back. What a
    producer role is granted is derived from these (``sqs_lease_cdk``), so the grant
    follows the library; IAM authorises a transaction per item action."""
    jobs, groups = JobTable(settings.jobs_table), GroupTable(settings.groups_table)
    new: dict[str, Any] = {
        "job_id": "j",
        "job_class": "c",
        "payload_json": "{}",
        "payload_hash": "h",
        "wall_now": 1.0,
        "send_id": "s",
        "stage": "st",
        "tenant": "t",
        "priority": "interactive",
    }
    calls: list[tuple[str, str, Mapping[str, Any]]] = [
        ("dynamodb:PutItem", "jobs", jobs.put_new(**new).params),
        ("dynamodb:PutItem", "jobs", jobs.put_new_item(**new, group="g")["Put"]),
        ("dynamodb:UpdateItem", "groups", groups.count_job("g", 1.0)["Update"]),
        (
            "dynamodb:UpdateItem",
            "jobs",
            jobs.take_send(
                "j", seen_send_id="s", new_send_id="s2", wall_now=1.0, read_back=False
            ).params,
        ),
        (
            "dynamodb:UpdateItem",
            "jobs",
            jobs.take_send(
                "j", seen_send_id=None, new_send_id="s2", wall_now=1.0, read_back=False
            ).params,
        ),
        ("dynamodb:UpdateItem", "jobs", jobs.mark_sent("j", "s", 1.0).params),
        ("dynamodb:UpdateItem", "jobs", jobs.release_send("j", "s", 1.0).params),
    ]
    return tuple(
        ProducerRequest(
            action,
            role,
            params,
            request_attributes(params),
            str(params.get("ReturnValues", "NONE")),
        )
        for action, role, params in calls
    )


__all__ = [
    "DLQ_RETENTION_SECONDS",
    "ECS_MAX_STOP_TIMEOUT",
    "GC_TTL_ATTRIBUTE",
    "LAMBDA_MAX_CONCURRENCY",
    "LAMBDA_MAX_TIMEOUT",
    "LAMBDA_VISIBILITY_FACTOR",
    "LIVENESS_RESOURCE",
    "PERMISSIONS",
    "QUEUE_RETENTION_SECONDS",
    "REDRIVE_BACKSTOP",
    "SHUTDOWN_GRACE_SECONDS",
    "SHUTDOWN_RELEASE_MARGIN",
    "SQS_MAX_RECEIVE_COUNT",
    "TABLE_MODELS",
    "UNSENT_INDEX",
    "UNSENT_INDEX_RESOURCE",
    "ProducerRequest",
    "check_lambda_concurrency",
    "check_lambda_fit",
    "check_lambda_timing",
    "duration_alarm_seconds",
    "ecs_stop_timeout",
    "lambda_visibility_floor",
    "max_receive_count_for",
    "model_attributes",
    "permissions_table",
    "queue_visibility_for",
    "redrive_too_tight",
    "request_attributes",
    "submit_requests",
    "table_names",
    "table_params",
]


_RESOURCE_LABELS = {
    "queue": "job queues `PREFIX-jobs`, `PREFIX-jobs-interactive`",
    "dlq": "DLQ `PREFIX-jobs-dlq`",
    "jobs": "table `PREFIX-jobs`",
    UNSENT_INDEX_RESOURCE: "index `PREFIX-jobs/index/unsent`",
    LIVENESS_RESOURCE: "table `PREFIX-jobs`, keys `worker#*` only (`dynamodb:LeadingKeys`)",
    "intents": "table `PREFIX-intents`",
    "attempts": "table `PREFIX-attempts`",
    "groups": "table `PREFIX-groups`",
    "slots": "table `PREFIX-slots`",
}


def permissions_table() -> str:
    """:data:`PERMISSIONS` as the README's markdown table (a test compares them)."""
    lines = ["| role | resource | actions |", "|---|---|---|"]
    for role, by_resource in PERMISSIONS.items():
        for resource, actions in by_resource.items():
            listed = ", ".join(f"`{a}`" for a in actions)
            lines.append(f"| {role} | {_RESOURCE_LABELS[resource]} | {listed} |")
    return "\n".join(lines) + "\n"
