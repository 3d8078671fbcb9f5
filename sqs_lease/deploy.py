"""What a deployment needs from the library: table definitions and the deployment rules.

Public, for infrastructure code (the CDK constructs in ``cdk/``, or your own):
the tables' keys and indexes come from the pynamodb models the library itself
uses, and the queue and consumer numbers from the rules the worker checks.
"""

from __future__ import annotations

from typing import Any

from pynamodb.models import Model

from ._config import Settings
from ._core.deploy import (
    ECS_MAX_STOP_TIMEOUT,
    LAMBDA_MAX_TIMEOUT,
    LAMBDA_VISIBILITY_FACTOR,
    REDRIVE_BACKSTOP,
    SHUTDOWN_GRACE_SECONDS,
    SHUTDOWN_RELEASE_MARGIN,
    SQS_MAX_RECEIVE_COUNT,
    check_lambda_timing,
    ecs_stop_timeout,
    lambda_visibility_floor,
    max_receive_count_for,
    queue_visibility_for,
    redrive_too_tight,
)
from ._schema import UNSENT_INDEX as UNSENT_INDEX  # the index the stranded sweep queries
from ._schema import (
    AttemptRecord,
    GroupRecord,
    IntentRecord,
    JobRecord,
    SlotRecord,
    create_table_params,
)

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


def table_params(settings: Settings) -> dict[str, dict[str, Any]]:
    """CreateTable parameters of the toolkit's tables, by role (``jobs``, ``intents``,
    ``attempts``): names from ``settings``, keys and indexes from the models."""
    names = table_names(settings)
    return {role: create_table_params(model, names[role]) for role, model in TABLE_MODELS.items()}


def model_attributes(role: str) -> frozenset[str]:
    """The attribute names the library's model of table ``role`` has."""
    return frozenset(TABLE_MODELS[role].get_attributes())


__all__ = [
    "ECS_MAX_STOP_TIMEOUT",
    "GC_TTL_ATTRIBUTE",
    "LAMBDA_MAX_TIMEOUT",
    "LAMBDA_VISIBILITY_FACTOR",
    "REDRIVE_BACKSTOP",
    "SHUTDOWN_GRACE_SECONDS",
    "SHUTDOWN_RELEASE_MARGIN",
    "SQS_MAX_RECEIVE_COUNT",
    "TABLE_MODELS",
    "UNSENT_INDEX",
    "check_lambda_timing",
    "ecs_stop_timeout",
    "lambda_visibility_floor",
    "max_receive_count_for",
    "model_attributes",
    "queue_visibility_for",
    "redrive_too_tight",
    "table_names",
    "table_params",
]
