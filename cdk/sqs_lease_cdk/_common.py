"""Shared by the constructs: settings from props, job classes, the one grant helper."""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence

from aws_cdk import aws_iam as iam

from sqs_lease import App, ConfigError, JobClass, Settings

# jsii prints an end-of-life banner for Node 20 on every start; the runtime is
# still supported by this jsii release, and the banner drowns test output.
os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")


def settings_for(prefix: str, queue_name: str | None = None, fifo: bool = False) -> Settings:
    """The library's own settings for these names (the worker finds resources by them);
    a bad prefix or queue name, or a name that disagrees with ``fifo``, is a
    ``ConfigError`` naming the field."""
    return Settings.from_env({}, prefix=prefix, queue_name=queue_name, fifo=fifo)


def lease_rules_of(job_classes: App | Iterable[JobClass]) -> tuple[tuple[str, JobClass], ...]:
    """Every lease rule set the queue's jobs run under, named (``App.lease_rules``: each
    class, each stage of a staged job as ``job/stage``, each tool of a planned job), or
    the classes given by their own names; refuses none or a non-class. A stage's lease,
    budget and attempts may differ from its job's: a rule read from the top-level
    classes only misses them (as the worker's rules once did: issue 26 defect 10)."""
    if isinstance(job_classes, App):
        found = tuple(job_classes.lease_rules())
    else:
        found = tuple((getattr(c, "name", repr(c)), c) for c in job_classes)
    if not found:
        raise ConfigError(
            "job_classes: none given; pass the App (or its JobClass objects) whose jobs "
            "this queue carries: the visibility and redrive follow from them"
        )
    for _, c in found:
        if not isinstance(c, JobClass):
            raise ConfigError(f"job_classes: {c!r} is not a sqs_lease.JobClass")
    return found


def job_classes_of(job_classes: App | Iterable[JobClass]) -> tuple[JobClass, ...]:
    """The job classes of an ``App`` (every stage's and tool's own included), or the
    classes given; refuses none or a non-class."""
    return tuple(c for _, c in lease_rules_of(job_classes))


def allow(grantee: iam.IGrantable, actions: Sequence[str], resources: Sequence[str]) -> iam.Grant:
    """Grant exactly ``actions`` on exactly ``resources`` (no wildcard resource)."""
    return iam.Grant.add_to_principal(
        grantee=grantee, actions=list(actions), resource_arns=list(resources)
    )
