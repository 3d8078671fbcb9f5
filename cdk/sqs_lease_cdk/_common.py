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


def job_classes_of(job_classes: App | Iterable[JobClass]) -> tuple[JobClass, ...]:
    """The job classes of an ``App``, or the classes given; refuses none or a non-class."""
    if isinstance(job_classes, App):
        found = tuple(r.job_class for r in job_classes.classes.values())
    else:
        found = tuple(job_classes)
    if not found:
        raise ConfigError(
            "job_classes: none given; pass the App (or its JobClass objects) whose jobs "
            "this queue carries: the visibility and redrive follow from them"
        )
    for c in found:
        if not isinstance(c, JobClass):
            raise ConfigError(f"job_classes: {c!r} is not a sqs_lease.JobClass")
    return found


def allow(grantee: iam.IGrantable, actions: Sequence[str], resources: Sequence[str]) -> iam.Grant:
    """Grant exactly ``actions`` on exactly ``resources`` (no wildcard resource)."""
    return iam.Grant.add_to_principal(
        grantee=grantee, actions=list(actions), resource_arns=list(resources)
    )
