"""How an attempt ends, from what its handler returned or raised (one decision, both shells)."""

from __future__ import annotations

import pytest

from sqs_lease import (
    ConfigError,
    IntentAmbiguous,
    IntentPayloadMismatch,
    JobCancelled,
    JobClassError,
    LeaseLost,
    LimitExceeded,
    OwnershipUnknown,
    PayloadError,
    PermanentError,
    ToolOutcomeUnknown,
    TransientError,
)
from sqs_lease._core.endings import Ending, EndKind, ending_for
from sqs_lease._core.limits import ERROR_TEXT_LIMIT


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (None, Ending(EndKind.COMMIT)),
        (LeaseLost("token moved"), Ending(EndKind.ABANDON, "token moved", "LeaseLost")),
        (JobCancelled("stop"), Ending(EndKind.ABANDON, "stop", "JobCancelled")),
        (OwnershipUnknown("no answer"), Ending(EndKind.ABANDON, "no answer", "OwnershipUnknown")),
        (
            IntentPayloadMismatch("changed"),
            Ending(EndKind.FAIL, "changed", "intent_payload_mismatch"),
        ),
        (IntentAmbiguous("cannot tell"), Ending(EndKind.PARK, "cannot tell", "intent_ambiguous")),
        (
            ToolOutcomeUnknown("timeout", code="t"),
            Ending(EndKind.PARK, "tool outcome unknown: timeout", "t"),
        ),
        (PermanentError("declined", code="card"), Ending(EndKind.FAIL, "declined", "card")),
        (TransientError("503", code="upstream"), Ending(EndKind.RETRY, "503", "upstream")),
        # An arbitrary exception keeps its type and message (the payload is taken out).
        (
            ValueError("card 4111-1111"),
            Ending(EndKind.RETRY, "ValueError: card 4111-1111", "ValueError"),
        ),
        (ValueError(), Ending(EndKind.RETRY, "ValueError", "ValueError")),
        # Configuration and input errors are permanent: no retry can fix them.
        (
            ConfigError("target 'psp' is not declared"),
            Ending(EndKind.FAIL, "ConfigError: target 'psp' is not declared", "ConfigError"),
        ),
        (
            JobClassError("lease too short"),
            Ending(EndKind.FAIL, "JobClassError: lease too short", "JobClassError"),
        ),
        (
            PayloadError("field 'n'"),
            Ending(EndKind.FAIL, "PayloadError: field 'n'", "PayloadError"),
        ),
        (
            LimitExceeded("intent key is 3000 bytes"),
            Ending(EndKind.FAIL, "LimitExceeded: intent key is 3000 bytes", "LimitExceeded"),
        ),
    ],
)
def test_each_handler_outcome_has_one_ending(error: BaseException | None, expected: Ending) -> None:
    assert ending_for(error) == expected


def test_a_handler_error_keeps_type_and_message_with_the_payload_taken_out() -> None:
    payload = '{"card":"4111-1111-1111-1111","note":"SECRET-note","n":1}'
    error = ValueError("could not parse note 'SECRET-note' for card 4111-1111-1111-1111 (n=1)")
    end = ending_for(error, payload)
    assert (end.kind, end.code) == (EndKind.RETRY, "ValueError")
    assert end.reason == "ValueError: could not parse note '<payload>' for card <payload> (n=1)"


def test_a_handler_error_message_is_bounded() -> None:
    end = ending_for(RuntimeError("x" * 10_000))
    assert len(end.reason) == ERROR_TEXT_LIMIT
    assert end.reason.startswith("RuntimeError: xxx") and end.reason.endswith("…")


def test_a_whole_payload_quoted_in_an_error_is_taken_out() -> None:
    payload = '{"n":1}'
    end = ending_for(KeyError(f"bad input {payload}"), payload)
    assert end.reason == "KeyError: 'bad input <payload>'"
