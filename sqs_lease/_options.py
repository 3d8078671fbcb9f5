"""WorkerOptions: how a worker shell runs, validated once, the same bounds for every shell.

The thread worker, the async worker and the Lambda shell take one
:class:`WorkerOptions` (or keywords that build one); the container entry point
(``sqs_lease.service.WorkerEnv``) reads the same options from ``SQS_LEASE_*``
variables and builds one too. Each field's bound lives here only: a bad value is a
:class:`~sqs_lease.OptionError` naming the field and the fix, whichever shell was
given it. Where the options come from and which wins: docs/operations.md,
"Configuration".
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ModelWrapValidatorHandler,
    ValidationError,
    model_validator,
)

from ._aws import Timeouts
from ._core.claiming import UNKNOWN_CLASS_RECEIVES
from ._core.deploy import SHUTDOWN_GRACE_SECONDS
from ._core.messages import UNSENT_GRACE_SECONDS
from ._core.receiving import RECEIVE_WINDOW_MAX
from ._core.sweeps import SCHEDULED_SWEEP_PAGE
from ._errors import OptionError

__all__ = ["SHELL_DEFAULT_CONCURRENCY", "THREAD_CONCURRENCY_MAX", "Shell", "WorkerOptions"]

Shell = Literal["thread", "async", "lambda"]

MAX_CONCURRENCY = 100_000
THREAD_CONCURRENCY_MAX = 1000
"""The thread worker runs a thread per job: past this many, use the async worker."""
SHELL_DEFAULT_CONCURRENCY: dict[Shell, int] = {"thread": 4, "async": 1000, "lambda": 1}
MAX_VISIBILITY = 43_200  # SQS's longest visibility timeout (12 h)

# What a shell decides itself, and why: such an option given with another value is
# refused (never ignored); the shell runs with the value here (None: the default).
_SHELL_OWN: dict[Shell, dict[str, tuple[Any, str]]] = {
    "thread": {
        "threads": (16, "the async worker's pool for plain handlers: use AsyncWorker"),
        "max_loop_lag": (None, "for the async worker: use AsyncWorker (or --async)"),
    },
    "async": {},
    "lambda": {
        "concurrency": (
            1,
            "one record at a time; the event source mapping's batch size and the "
            "function's concurrency decide how many run",
        ),
        "threads": (16, "the async worker's pool for plain handlers"),
        "max_loop_lag": (None, "for the async worker"),
        "receive_wait": (0, "the event source mapping receives"),
        "receive_window": (0.0, "set the mapping's MaximumBatchingWindowInSeconds"),
        "sweep_interval": (None, "the consumer sweeps nothing: schedule sweeper(app)"),
        "sweep_limit": (
            SCHEDULED_SWEEP_PAGE,
            "the scheduled sweep pages through the unsent index itself",
        ),
    },
}


def _fix(text: str) -> Any:
    return {"fix": text}


class WorkerOptions(BaseModel):
    """How a worker shell runs: frozen, validated once, the same bounds for every shell.

    ``Worker(app, settings, options)``, ``AsyncWorker(...)`` and the Lambda
    ``handler(app, options=...)`` take one; their keywords
    (``Worker(app, settings, concurrency=8)``) build one. Times are seconds. An option
    a shell cannot honour (``max_loop_lag`` for the thread worker) is refused when
    given, not ignored.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    worker_id: str | None = Field(
        default=None,
        min_length=1,
        max_length=200,
        description="this worker's name in records and logs; None: host-pid-random",
        json_schema_extra=_fix("give 1..200 characters, or None for host-pid-random"),
    )
    concurrency: int | None = Field(
        default=None,
        ge=1,
        le=MAX_CONCURRENCY,
        description="jobs held at once; None: the shell's default (thread 4, async 1000, "
        f"Lambda 1); the thread worker takes at most {THREAD_CONCURRENCY_MAX}",
        json_schema_extra=_fix(f"choose 1..{MAX_CONCURRENCY} jobs held at once"),
    )
    threads: int = Field(
        default=16,
        ge=1,
        le=1000,
        description="async worker: threads that run plain (non-async) handlers",
        json_schema_extra=_fix("choose 1..1000 threads for plain (non-async) handlers"),
    )
    max_loop_lag: float | None = Field(
        default=None,
        gt=0,
        description="async worker: seconds a handler's step may hold the event loop "
        "before its job loses its lease; None: 1 s, lowered to what every class survives",
        json_schema_extra=_fix("give seconds > 0, or None for the default"),
    )
    receive_wait: int = Field(
        default=2,
        ge=0,
        le=20,
        description="long-poll seconds of each ReceiveMessage",
        json_schema_extra=_fix("SQS long polls 0..20 s"),
    )
    receive_window: float = Field(
        default=0.0,
        ge=0,
        le=RECEIVE_WINDOW_MAX,
        description="batching window: seconds to wait after a receive that came back "
        "short, so messages that trickle in are received 10 at a time; 0: off",
        json_schema_extra=_fix(
            f"give 0 (off) .. {RECEIVE_WINDOW_MAX:g} seconds to wait after a short receive, "
            "so a batch gathers"
        ),
    )
    receive_visibility: int | None = Field(
        default=None,
        ge=1,
        le=MAX_VISIBILITY,
        description="a message's first lease at receive (s); None: the shortest lease "
        "among the app's classes",
        json_schema_extra=_fix(
            f"give 1..{MAX_VISIBILITY} seconds (SQS's visibility), or None for the "
            "shortest lease of the app's classes"
        ),
    )
    shutdown_grace: float = Field(
        default=SHUTDOWN_GRACE_SECONDS,
        ge=0,
        description="seconds running handlers get after a stop before their jobs are released",
        json_schema_extra=_fix("give seconds >= 0"),
    )
    timeouts: Timeouts | None = Field(
        default=None,
        description="AWS client timeouts; None: a read timeout within the tightest "
        "heartbeat (0.5..5 s)",
        json_schema_extra=_fix("give a sqs_lease._aws.Timeouts, or None"),
    )
    tick: float = Field(
        default=0.1,
        gt=0,
        le=1.0,
        description="seconds between the heartbeat's and the stop check's wake-ups",
        json_schema_extra=_fix("give 0 < tick <= 1 second: a beat is late by up to a tick"),
    )
    sweep_interval: float | None = Field(
        default=60.0,
        gt=0,
        description="seconds between sweeps for jobs stranded without a message (each "
        "also reconciles one receive of the DLQ); None: off",
        json_schema_extra=_fix("give seconds > 0, or None to turn the stranded-record sweep off"),
    )
    sweep_grace: float = Field(
        default=UNSENT_GRACE_SECONDS,
        ge=0,
        description="sweep only jobs without a sent message for this many seconds",
        json_schema_extra=_fix("give seconds >= 0"),
    )
    sweep_limit: int = Field(
        default=25,
        ge=1,
        le=1000,
        description="records per sweep",
        json_schema_extra=_fix("choose 1..1000 records per sweep"),
    )
    unknown_class_receives: int = Field(
        default=UNKNOWN_CLASS_RECEIVES,
        ge=1,
        le=1000,
        description="receives of a message of a job class this app does not know before "
        "it goes to the DLQ",
        json_schema_extra=_fix(
            "choose 1..1000 receives before a message of an unknown job class goes to the DLQ"
        ),
    )

    @model_validator(mode="wrap")
    @classmethod
    def _typed_error(cls, data: Any, handler: ModelWrapValidatorHandler[WorkerOptions]) -> Any:
        # Every way in (keywords, model_validate) refuses a bad value with OptionError.
        try:
            return handler(data)
        except ValidationError as exc:
            raise _option_error(exc, data) from None

    @classmethod
    def of(cls, options: WorkerOptions | None = None, **keywords: Any) -> WorkerOptions:
        """``options`` with ``keywords`` on top (what a shell's keywords build): the one
        place a shell's options are validated."""
        if options is None:
            return cls(**keywords)
        if not keywords:
            return options
        given = {name: getattr(options, name) for name in options.model_fields_set}
        return cls(**{**given, **keywords})

    def for_shell(self, shell: Shell) -> WorkerOptions:
        """These options checked against what ``shell`` decides itself (an option the
        shell has no use for, given with another value, is refused), with the shell's
        own values and its default concurrency filled in. Checking twice is harmless."""
        own = _SHELL_OWN[shell]
        for name, (value, why) in own.items():
            if name in self.model_fields_set and getattr(self, name) != value:
                raise OptionError(
                    name, getattr(self, name), f"not an option of the {shell} shell: {why}"
                )
        concurrency = self.concurrency or SHELL_DEFAULT_CONCURRENCY[shell]
        if shell == "thread" and concurrency > THREAD_CONCURRENCY_MAX:
            raise OptionError(
                "concurrency",
                concurrency,
                f"the thread worker runs a thread per job: choose 1..{THREAD_CONCURRENCY_MAX}, "
                "or use AsyncWorker for more",
            )
        values = {"concurrency": concurrency, **{n: v for n, (v, _) in own.items()}}
        if all(getattr(self, n) == v for n, v in values.items()):
            return self
        return _with(self, **values)


def _with(options: WorkerOptions, **values: Any) -> WorkerOptions:
    # A shell's own facts (its default concurrency): validated like any option.
    given = {name: getattr(options, name) for name in options.model_fields_set}
    return WorkerOptions(**{**given, **values})


def _option_error(exc: ValidationError, data: Any) -> OptionError:
    first = exc.errors()[0]
    name = str(first["loc"][0]) if first["loc"] else ""
    fields = WorkerOptions.model_fields
    if first["type"] == "extra_forbidden":
        close = difflib.get_close_matches(name, list(fields), n=1, cutoff=0.6)
        hint = f"did you mean {close[0]}?" if close else f"the options: {', '.join(fields)}"
        return OptionError(name, first.get("input"), f"no such worker option; {hint}")
    value = data.get(name) if isinstance(data, Mapping) else first.get("input")
    extra = fields[name].json_schema_extra if name in fields else None
    fix = str(extra["fix"]) if isinstance(extra, dict) else ""
    problem = fix if _is_bound(first["type"], value) else f"{first['msg']}; {fix}"
    return OptionError(name, value, problem)


def _is_bound(kind: str, value: Any) -> bool:
    """A value of the right type out of its range: the fix says it all."""
    if kind.startswith(("greater_than", "less_than", "string_too", "finite_number")):
        return True
    return isinstance(value, float) and math.isnan(value)
