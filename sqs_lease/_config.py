"""Settings: where AWS is and what the resources are called."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ._errors import ConfigError


class Settings(BaseModel):
    """Where to find AWS and the toolkit's resources.

    The same code runs against the local emulator or real AWS; only these change.
    ``endpoint_url=None`` means real AWS (the default credential chain and region).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    endpoint_url: str | None = None
    region: str = "us-east-1"
    prefix: str = Field(default="sqs-lease", pattern=r"^[A-Za-z0-9_.-]{1,60}$")
    queue_name: str | None = None

    @field_validator("endpoint_url")
    @classmethod
    def _endpoint(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith(("http://", "https://")):
            raise ValueError("must start with http:// or https://")
        return v or None

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
    def queue(self) -> str:
        return self.queue_name or f"{self.prefix}-jobs"

    @property
    def dlq(self) -> str:
        return f"{self.queue}-dlq"

    @property
    def is_local(self) -> bool:
        host = (self.endpoint_url or "").split("//", 1)[-1]
        return host.startswith(("127.", "localhost", "[::1]"))

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """Read ``AWS_ENDPOINT_URL``, ``AWS_REGION``/``AWS_DEFAULT_REGION``,
        ``SQS_LEASE_PREFIX`` and ``SQS_LEASE_QUEUE``; explicit overrides win."""
        e = os.environ if env is None else env
        values: dict[str, Any] = {
            "endpoint_url": e.get("AWS_ENDPOINT_URL") or None,
            "region": e.get("AWS_REGION") or e.get("AWS_DEFAULT_REGION") or "us-east-1",
            "prefix": e.get("SQS_LEASE_PREFIX") or "sqs-lease",
            "queue_name": e.get("SQS_LEASE_QUEUE") or None,
        }
        values.update({k: v for k, v in overrides.items() if v is not None})
        try:
            return cls(**values)
        except ValidationError as exc:
            first = exc.errors()[0]
            field = ".".join(str(p) for p in first["loc"])
            raise ConfigError(
                f"setting {field!r}: {first['msg']} (got {first.get('input')!r}); "
                "fix the option or the environment variable"
            ) from None
