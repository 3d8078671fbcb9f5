"""Settings: where AWS is and what the resources are called."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ._errors import ConfigError

Service = Literal["sqs", "dynamodb"]
"""The two AWS services the toolkit talks to (boto3's service names)."""

SERVICES: tuple[Service, ...] = ("sqs", "dynamodb")

_SERVICE_NAMES: dict[str, str] = {"sqs": "SQS", "dynamodb": "DynamoDB"}
# boto3's own convention: AWS_ENDPOINT_URL_<SERVICE ID>, upper case.
_SERVICE_ENV: dict[Service, str] = {
    "sqs": "AWS_ENDPOINT_URL_SQS",
    "dynamodb": "AWS_ENDPOINT_URL_DYNAMODB",
}
_LOCAL_HOSTS = ("localhost", "::1")
FIFO_SUFFIX = ".fifo"
_QUEUE_NAME = re.compile(r"^[A-Za-z0-9_-]{1,80}$")  # SQS's rule, less a FIFO queue's suffix
_QUEUE_NAME_LIMIT = 80  # characters, a FIFO queue's ".fifo" included

ENV_VARIABLES: tuple[tuple[str, str, str], ...] = (
    ("AWS_ENDPOINT_URL", "unset (AWS)", "endpoint of both services (the local emulator's URL)"),
    ("AWS_ENDPOINT_URL_SQS", "unset", "SQS endpoint, wins over `AWS_ENDPOINT_URL`"),
    ("AWS_ENDPOINT_URL_DYNAMODB", "unset", "DynamoDB endpoint, wins over `AWS_ENDPOINT_URL`"),
    (
        "AWS_IGNORE_CONFIGURED_ENDPOINT_URLS",
        "unset",
        "`true`: ignore the three endpoint variables (as boto3 does)",
    ),
    ("AWS_REGION", "us-east-1", "the region (ECS sets it)"),
    ("AWS_DEFAULT_REGION", "unset", "the region, when `AWS_REGION` is unset"),
    ("SQS_LEASE_PREFIX", "sqs-lease", "prefix of the tables and the queue"),
    ("SQS_LEASE_QUEUE", "PREFIX-jobs", "the job queue's name"),
    (
        "SQS_LEASE_FIFO",
        "false",
        "`true`: FIFO queues (the names end in `.fifo`; default `PREFIX-jobs.fifo`)",
    ),
)
"""Every variable :meth:`Settings.from_env` reads: (name, default, meaning). Credentials
come from boto3's own chain (the task role in ECS). A test checks this against the code."""


def layered(code: Mapping[str, Any], environment: Mapping[str, Any]) -> dict[str, Any]:
    """The one precedence rule of every setting (``Settings``, the worker's
    ``WorkerEnv`` and so its ``WorkerOptions``): a value given in code (an argument, a
    command-line option; ``None`` means not given) wins over the environment's, which
    wins over the model's default (a name in neither is left to it). docs/operations.md,
    "Configuration", says it for users."""
    return {**environment, **{k: v for k, v in code.items() if v is not None}}


def is_local_url(url: str | None) -> bool:
    """Whether ``url`` points at this machine (loopback): the local emulator, never AWS."""
    if not url:
        return False
    host = (urlsplit(url).hostname or "").lower()
    return host in _LOCAL_HOSTS or host.startswith("127.")


class Settings(BaseModel):
    """Where to find AWS and the toolkit's resources.

    The same code runs against the local emulator or real AWS; only these change.
    ``endpoint_url`` applies to both services; ``sqs_endpoint_url`` and
    ``dynamodb_endpoint_url`` override it for one service (e.g. SQS on one
    emulator, DynamoDB on another). A service with no endpoint is real AWS (the
    default credential chain and region). Use :meth:`endpoint_for` to read the
    endpoint a service actually gets.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    endpoint_url: str | None = None
    sqs_endpoint_url: str | None = None
    dynamodb_endpoint_url: str | None = None
    region: str = "us-east-1"
    prefix: str = Field(default="sqs-lease", pattern=r"^[A-Za-z0-9_.-]{1,60}$")
    queue_name: str | None = None
    fifo: bool = False
    """FIFO queues: the job queue and its DLQ (both names end in ``.fifo``)."""

    @field_validator("endpoint_url", "sqs_endpoint_url", "dynamodb_endpoint_url")
    @classmethod
    def _endpoint(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith(("http://", "https://")):
            raise ValueError("must start with http:// or https://")
        return v or None

    @model_validator(mode="after")
    def _queue_names(self) -> Settings:
        # ConfigError, not ValueError: pydantic lets it through as it is, naming the field.
        name = self.queue
        field = "queue_name" if self.queue_name is not None else "prefix"
        if self.queue_name is not None and name.endswith(FIFO_SUFFIX) != self.fifo:
            raise ConfigError(
                f"queue_name={name!r} with fifo={self.fifo}: a FIFO queue's name ends in "
                f"{FIFO_SUFFIX!r} and only a FIFO queue's does; fix the name, or set "
                f"fifo={not self.fifo} (SQS_LEASE_FIFO={str(not self.fifo).lower()})"
            )
        for what, full in (("queue", name), ("dead-letter queue", self.dlq)):
            base = full.removesuffix(FIFO_SUFFIX) if self.fifo else full
            if not _QUEUE_NAME.match(base) or len(full) > _QUEUE_NAME_LIMIT:
                raise ConfigError(
                    f"{field}={getattr(self, field)!r} makes the {what} name {full!r}, which "
                    f"SQS refuses: 1-{_QUEUE_NAME_LIMIT} characters (a FIFO queue's "
                    f"{FIFO_SUFFIX!r} included) of letters, digits, - and _; "
                    + (
                        "shorten or fix queue_name"
                        if field == "queue_name"
                        else "choose another prefix, or set queue_name"
                    )
                )
        return self

    def endpoint_for(self, service: str) -> str | None:
        """The endpoint ``service`` (boto3's name) talks to: its own if set, else
        ``endpoint_url``; ``None`` means AWS's public endpoint for the region."""
        own = {"sqs": self.sqs_endpoint_url, "dynamodb": self.dynamodb_endpoint_url}.get(service)
        return own or self.endpoint_url

    def is_local_for(self, service: str) -> bool:
        """Whether ``service`` talks to an emulator on this machine (loopback)."""
        return is_local_url(self.endpoint_for(service))

    def describe_endpoint(self, service: str) -> str:
        """``service`` and where it is, for error messages: ``SQS at http://...``."""
        url = self.endpoint_for(service)
        where = url or f"AWS's public endpoint in {self.region} (no endpoint set)"
        return f"{_SERVICE_NAMES.get(service, service)} at {where}"

    def describe_endpoints(self) -> str:
        """Both services' endpoints in one phrase, for messages about either."""
        sqs, ddb = self.endpoint_for("sqs"), self.endpoint_for("dynamodb")
        if sqs == ddb:
            where = sqs or f"AWS's public endpoints in {self.region} (no endpoint set)"
            return f"SQS and DynamoDB at {where}"
        return f"{self.describe_endpoint('sqs')}, {self.describe_endpoint('dynamodb')}"

    @property
    def jobs_table(self) -> str:
        return f"{self.prefix}-jobs"

    @property
    def intents_table(self) -> str:
        return f"{self.prefix}-intents"

    @property
    def attempts_table(self) -> str:
        return f"{self.prefix}-attempts"

    @property
    def groups_table(self) -> str:
        return f"{self.prefix}-groups"

    @property
    def slots_table(self) -> str:
        return f"{self.prefix}-slots"

    @property
    def queue(self) -> str:
        """The job queue's name: ``queue_name``, else ``PREFIX-jobs`` (``.fifo`` added
        for a FIFO queue)."""
        if self.queue_name:
            return self.queue_name
        return f"{self.prefix}-jobs" + (FIFO_SUFFIX if self.fifo else "")

    @property
    def interactive_queue(self) -> str:
        """The queue of interactive jobs (priorities): the job queue's name +
        ``-interactive`` (before ``.fifo`` on a FIFO queue: SQS requires the suffix)."""
        if self.fifo:
            return f"{self.queue.removesuffix(FIFO_SUFFIX)}-interactive{FIFO_SUFFIX}"
        return f"{self.queue}-interactive"

    @property
    def dlq(self) -> str:
        """The dead-letter queue's name: the queue's with ``-dlq``; a FIFO queue's DLQ
        is FIFO too (SQS requires it), so its name ends in ``-dlq.fifo``."""
        if self.fifo:
            return f"{self.queue.removesuffix(FIFO_SUFFIX)}-dlq{FIFO_SUFFIX}"
        return f"{self.queue}-dlq"

    @property
    def is_local(self) -> bool:
        """Whether both services talk to emulators on this machine."""
        return all(self.is_local_for(s) for s in SERVICES)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """Read ``AWS_ENDPOINT_URL``, ``AWS_ENDPOINT_URL_SQS``,
        ``AWS_ENDPOINT_URL_DYNAMODB`` (boto3's names), ``AWS_REGION``/
        ``AWS_DEFAULT_REGION``, ``SQS_LEASE_PREFIX``, ``SQS_LEASE_QUEUE`` and
        ``SQS_LEASE_FIFO``.

        Explicit overrides win over the environment, and a service's own endpoint
        wins over the general one at the same level: an explicit ``endpoint_url``
        therefore also replaces the service endpoints found in the environment
        (as boto3's ``endpoint_url=`` does). ``AWS_IGNORE_CONFIGURED_ENDPOINT_URLS=true``
        makes boto3 ignore the endpoint variables, and so does this.
        """
        e = os.environ if env is None else env
        ignore = (e.get("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS") or "").lower() == "true"
        values: dict[str, Any] = {
            "region": e.get("AWS_REGION") or e.get("AWS_DEFAULT_REGION") or "us-east-1",
            "prefix": e.get("SQS_LEASE_PREFIX") or "sqs-lease",
            "queue_name": e.get("SQS_LEASE_QUEUE") or None,
            "fifo": e.get("SQS_LEASE_FIFO") or False,
        }
        if not ignore:
            values["endpoint_url"] = e.get("AWS_ENDPOINT_URL") or None
            for service, name in _SERVICE_ENV.items():
                values[f"{service}_endpoint_url"] = e.get(name) or None
        if overrides.get("endpoint_url") is not None:
            for service in SERVICES:
                values.pop(f"{service}_endpoint_url", None)
        try:
            return cls(**layered(overrides, values))
        except ValidationError as exc:
            first = exc.errors()[0]
            field = ".".join(str(p) for p in first["loc"])
            raise ConfigError(
                f"setting {field!r}: {first['msg']} (got {first.get('input')!r}); "
                "fix the option or the environment variable"
            ) from None
