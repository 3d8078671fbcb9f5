"""How an attempt ends, decided from what its handler returned or raised.

Both worker shells (threads, and the simulator's tasks) ask this one function,
then run the flow it names; the classification is written once.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from .._errors import (
    ConfigError,
    FenceRefused,
    HandlerSignal,
    IntentAmbiguous,
    IntentBusy,
    IntentPayloadMismatch,
    LeaseError,
    LimitExceeded,
    PayloadError,
    PermanentError,
    ToolNotApplied,
    ToolOutcomeUnknown,
    TransientError,
)
from .lease import Stop
from .limits import CODE_LIMIT, ERROR_TEXT_LIMIT, bounded
from .texts import message_of

_PERMANENT_TYPES: tuple[type[BaseException], ...] = (ConfigError, PayloadError, LimitExceeded)
"""Raised in a handler, these are configuration or input errors (an undeclared target,
a mistyped option, a payload or key over a limit): no retry can fix them."""


class EndKind(StrEnum):
    COMMIT = "commit"  # the handler returned: commit its result, fenced
    ABANDON = "abandon"  # it stopped on a lease check: write nothing, let the message return
    FAIL = "fail"  # retrying cannot help
    PARK = "park"  # nobody can tell whether an effect applied: wait for an operator
    RETRY = "retry"  # try again later, with backoff, counted
    RELEASE = "release"  # the worker stopped it: back to queued at once, attempt not spent


@dataclass(frozen=True)
class Ending:
    kind: EndKind
    reason: str = ""
    code: str = ""

    def __post_init__(self) -> None:
        # A handler's own code (PermanentError(code=...)) is kept on the record: bounded
        # like every other text the record holds (limits.RECORD_ROOM counts on it).
        object.__setattr__(self, "code", bounded(self.code, CODE_LIMIT))


def error_text(error: BaseException, payload_json: str | None = None) -> str:
    """``Type: message`` of an exception, bounded, as it may be kept.

    Exception messages often quote their input (``could not parse note 'x'``) or
    the URL they called; the message is kept for the operator (on the record, in
    the journal, in ``jobs show``) as :func:`~sqs_lease._core.texts.message_of`
    leaves it (URLs cut to scheme and host, the payload's text as ``<payload>``,
    a validation error without its input values), cut to ``ERROR_TEXT_LIMIT``.
    """
    message = message_of(error, payload_json)
    text = f"{type(error).__name__}: {message}" if message else type(error).__name__
    return bounded(text, ERROR_TEXT_LIMIT)


def _signal_text(error: HandlerSignal, payload_json: str | None) -> str:
    # A handler's own signal keeps its message as written (no type prefix), but its
    # author may quote the payload (f"cannot charge {p.card}") or a URL: those are
    # taken out too, since the reason goes to the record and the journal.
    return bounded(message_of(error, payload_json), ERROR_TEXT_LIMIT)


def ending_for(error: BaseException | None, payload_json: str | None = None) -> Ending:
    """The end of an attempt whose handler raised ``error`` (None: it returned).

    ``payload_json`` is the job's payload, taken out of any exception text kept.
    """
    if error is None:
        return Ending(EndKind.COMMIT)
    if isinstance(error, LeaseError):
        # The code is one of the documented four (LeaseLost, JobCancelled,
        # OwnershipUnknown, AttemptTimedOut...): a finer kind of loss (a fence refusal)
        # is told as the loss it is, so an operator's filter on the code still holds.
        code = "LeaseLost" if isinstance(error, FenceRefused) else type(error).__name__
        return Ending(EndKind.ABANDON, str(error), code)
    if isinstance(error, IntentPayloadMismatch):
        return Ending(EndKind.FAIL, str(error), "intent_payload_mismatch")
    if isinstance(error, IntentAmbiguous):
        return Ending(EndKind.PARK, str(error), "intent_ambiguous")
    if isinstance(error, IntentBusy):
        return Ending(EndKind.PARK, str(error), "intent_busy")
    if isinstance(error, ToolNotApplied) and not error.retry:
        return Ending(EndKind.FAIL, _signal_text(error, payload_json), error.code)
    if isinstance(error, ToolOutcomeUnknown):
        text = _signal_text(error, payload_json)
        return Ending(EndKind.PARK, f"tool outcome unknown: {text}", error.code)
    if isinstance(error, PermanentError):
        return Ending(EndKind.FAIL, _signal_text(error, payload_json), error.code)
    if isinstance(error, _PERMANENT_TYPES):
        return Ending(EndKind.FAIL, error_text(error, payload_json), type(error).__name__)
    if isinstance(error, HandlerSignal):
        code = error.code if isinstance(error, TransientError) else type(error).__name__
        return Ending(EndKind.RETRY, _signal_text(error, payload_json), code)
    return Ending(EndKind.RETRY, error_text(error, payload_json), type(error).__name__)


def stopped_ending(end: Ending, stop: Stop | None) -> Ending:
    """How an attempt ends when it was told to stop (``stop``) before its handler ended.

    ``end`` is what :func:`ending_for` decided from the handler's return or
    exception. A handler told to stop may return a partial result (its waits
    were cut short): nothing returned after a stop is committed as success.

    - Shutdown (the worker, not the job, stopped it): the job goes back to
      queued at once and the attempt is not spent, whatever the handler did,
      except a park or a failure, which are facts about the outside world or
      the job and stand.
    - Lease lost, cancelled, or let go (watchdog, spent reserve): a returned
      result is discarded (``result_discarded``); other endings stand, and their
      fenced writes are refused where the token moved on.
    """
    if stop is None or end.kind in (EndKind.PARK, EndKind.FAIL):
        return end
    if stop is Stop.SHUTDOWN:
        return Ending(EndKind.RELEASE, "shutdown: the worker stopped the attempt", "released")
    if end.kind is EndKind.COMMIT:
        return Ending(
            EndKind.ABANDON,
            f"the handler returned after the attempt was stopped ({stop.value})",
            "result_discarded",
        )
    return end
