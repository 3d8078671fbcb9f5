"""How an attempt ends, from what its handler returned or raised (one decision, both shells)."""

from __future__ import annotations

import pytest

from sqs_lease import (
    IntentAmbiguous,
    IntentPayloadMismatch,
    JobCancelled,
    LeaseLost,
    OwnershipUnknown,
    PermanentError,
    ToolOutcomeUnknown,
    TransientError,
)
from sqs_lease._core.endings import Ending, EndKind, ending_for


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
        # An arbitrary exception's text may quote the payload: only its type is kept.
        (ValueError("card 4111-1111"), Ending(EndKind.RETRY, "ValueError raised", "ValueError")),
    ],
)
def test_each_handler_outcome_has_one_ending(error: BaseException | None, expected: Ending) -> None:
    assert ending_for(error) == expected
