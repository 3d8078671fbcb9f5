"""Instructions a flow yields and the outcomes a driver sends back."""

from __future__ import annotations

from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Literal, TypeAlias, TypeVar

Service = Literal["sqs", "dynamodb"]


@dataclass(frozen=True)
class Call:
    """One AWS API call, described as data (low-level request parameters)."""

    service: Service
    op: str
    params: Mapping[str, Any]


@dataclass(frozen=True)
class Sleep:
    """Wait; drivers sleep on their own clock (the simulator advances a virtual one)."""

    seconds: float


@dataclass(frozen=True)
class Emit:
    """A journal event; the driver writes it (sync/async) or records it (simulator)."""

    event: str
    fields: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Invoke:
    """Run caller-supplied code (a tool call, a reconciliation check, a lease check).

    The core never calls it: the driver does, and answers ``Ok({"value": v})`` or
    ``Err(ErrorKind.RAISED, exc=...)``. The simulator substitutes its own.
    """

    what: str
    fn: Callable[[], Any]


Instruction: TypeAlias = Call | Sleep | Emit | Invoke


class ErrorKind(StrEnum):
    """How a driver classified a failed call; the flows react by kind, not by message."""

    CONDITION_FAILED = "condition_failed"
    TRANSACTION_CANCELLED = "transaction_cancelled"
    NOT_FOUND = "not_found"
    THROTTLED = "throttled"
    UNREACHABLE = "unreachable"
    INVALID = "invalid"  # refused for a reason that is not the job's (access, an unknown op)
    VALIDATION = "validation"  # this request can never succeed as sent (a size limit, a
    # malformed value, an attribute the update needs that the record lacks): permanent
    SERVER = "server"
    RAISED = "raised"  # an Invoke'd function raised ``exc``


@dataclass(frozen=True)
class Ok:
    """A call that answered. ``sent_at``/``received_at`` are the driver's monotonic clock."""

    response: Mapping[str, Any]
    sent_at: float = 0.0
    received_at: float = 0.0


@dataclass(frozen=True)
class Err:
    """A call that failed. ``item`` holds ALL_OLD on a failed condition."""

    kind: ErrorKind
    code: str = ""
    query_code: str = ""
    message: str = ""
    item: Mapping[str, Any] | None = None
    reasons: tuple[Mapping[str, Any], ...] = ()
    sent_at: float = 0.0
    received_at: float = 0.0
    exc: BaseException | None = None
    request_id: str = ""  # the service's id of the failed request (x-amzn-RequestId)

    @property
    def unknown(self) -> bool:
        """True when the call may or may not have been applied (no answer, or 5xx)."""
        return self.kind in (ErrorKind.UNREACHABLE, ErrorKind.SERVER, ErrorKind.THROTTLED)


Outcome: TypeAlias = Ok | Err


def raised(exc: BaseException, sent_at: float, received_at: float) -> Err:
    """The outcome of an Invoke'd function that raised (shared by every driver)."""
    return Err(
        ErrorKind.RAISED, type(exc).__name__, "", str(exc), None, (), sent_at, received_at, exc
    )


T = TypeVar("T")
Flow: TypeAlias = Generator[Instruction, Outcome | None, T]


# SQS answers in two spellings: the JSON protocol's code and the legacy query code
# (botocore exposes the latter as Error.QueryErrorCode). Match both, always.
_SQS_ALIASES: dict[str, frozenset[str]] = {
    "QueueDoesNotExist": frozenset(
        {"QueueDoesNotExist", "AWS.SimpleQueueService.NonExistentQueue"}
    ),
    "ReceiptHandleIsInvalid": frozenset({"ReceiptHandleIsInvalid", "InvalidReceiptHandle"}),
    "MessageNotInflight": frozenset(
        {"MessageNotInflight", "AWS.SimpleQueueService.MessageNotInflight"}
    ),
    "InvalidParameterValue": frozenset({"InvalidParameterValue", "InvalidParameterValueException"}),
    "BatchEntryIdsNotDistinct": frozenset(
        {"BatchEntryIdsNotDistinct", "AWS.SimpleQueueService.BatchEntryIdsNotDistinct"}
    ),
}


def sqs_code_is(name: str, *codes: str | None) -> bool:
    """True if any of ``codes`` is ``name`` in either SQS spelling."""
    aliases = _SQS_ALIASES.get(name, frozenset({name}))
    return any(c in aliases for c in codes if c)


def call(instruction: Call | Sleep | Invoke) -> Generator[Instruction, Outcome | None, Outcome]:
    """Yield one call and return its outcome (``yield from call(...)``)."""
    outcome = yield instruction
    if outcome is None:  # pragma: no cover - drivers always answer calls
        raise RuntimeError("driver sent no outcome for a call")
    return outcome


def emit(event: str, **fields: Any) -> Generator[Instruction, Outcome | None, None]:
    """Yield one journal event (``yield from emit(...)``)."""
    yield Emit(event, fields)


def ask(what: str, fn: Callable[[], Any]) -> Generator[Instruction, Outcome | None, Any]:
    """A value from the shell (its clock, a nonce, the time left): ``fn`` run by the
    driver as an :class:`Invoke`; what ``fn`` raised is raised here."""
    out = yield Invoke(what, fn)
    if isinstance(out, Err):
        if out.exc is not None:
            raise out.exc
        raise RuntimeError(f"{what} failed: {out.message}")  # pragma: no cover
    assert isinstance(out, Ok)
    return out.response["value"]
