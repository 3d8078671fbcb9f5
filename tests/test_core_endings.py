"""How an attempt ends, from what its handler returned or raised (one decision, both shells)."""

from __future__ import annotations

import pytest

from sqs_lease import (
    ConfigError,
    FenceRefused,
    IntentAmbiguous,
    IntentPayloadMismatch,
    JobCancelled,
    JobClassError,
    LeaseLost,
    LimitExceeded,
    OwnershipUnknown,
    PayloadError,
    PermanentError,
    ToolNotApplied,
    ToolOutcomeUnknown,
    TransientError,
    WorkerShuttingDown,
)
from sqs_lease._core.endings import Ending, EndKind, ending_for, stopped_ending
from sqs_lease._core.lease import Stop
from sqs_lease._core.limits import ERROR_TEXT_LIMIT
from sqs_lease.testing import StaleFence


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (None, Ending(EndKind.COMMIT)),
        (LeaseLost("token moved"), Ending(EndKind.ABANDON, "token moved", "LeaseLost")),
        (JobCancelled("stop"), Ending(EndKind.ABANDON, "stop", "JobCancelled")),
        # a receiver's 412 (and the testing kit's StaleFence): a lease loss, told as one
        (FenceRefused("412"), Ending(EndKind.ABANDON, "412", "LeaseLost")),
        (StaleFence("412"), Ending(EndKind.ABANDON, "412", "LeaseLost")),
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


@pytest.mark.parametrize(
    ("error", "kind", "reason"),
    [
        (PermanentError("cannot do SECRET-note"), EndKind.FAIL, "cannot do <payload>"),
        (
            ToolOutcomeUnknown("timed out (SECRET-note)"),
            EndKind.PARK,
            "tool outcome unknown: timed out (<payload>)",
        ),
        (TransientError("busy with SECRET-note"), EndKind.RETRY, "busy with <payload>"),
        (ToolNotApplied("refused SECRET-note", retry=False), EndKind.FAIL, "refused <payload>"),
    ],
)
def test_a_handler_signal_quoting_the_payload_keeps_its_message_without_the_payload(
    error: BaseException, kind: EndKind, reason: str
) -> None:
    # The reason goes to the record and to the journal (job_failed, job_parked,
    # job_retry_scheduled), which must never carry a payload.
    end = ending_for(error, '{"note":"SECRET-note","n":1}')
    assert (end.kind, end.reason) == (kind, reason)


def test_a_handler_error_message_is_bounded() -> None:
    end = ending_for(RuntimeError("x" * 10_000))
    assert len(end.reason) == ERROR_TEXT_LIMIT
    assert end.reason.startswith("RuntimeError: xxx") and end.reason.endswith("…")


def test_a_whole_payload_quoted_in_an_error_is_taken_out() -> None:
    payload = '{"n":1}'
    end = ending_for(KeyError(f"bad input {payload}"), payload)
    assert end.reason == "KeyError: 'bad input <payload>'"


# --------------------------------------------------------------------------- told to stop

_ALL_STOPS = [Stop.SHUTDOWN, Stop.LEASE_LOST, Stop.CANCELLED, Stop.LET_GO]


@pytest.mark.parametrize(
    "error",
    [None, WorkerShuttingDown("stop"), TransientError("503"), ValueError("x"), LeaseLost("l")],
)
def test_an_attempt_the_worker_stopped_goes_back_to_the_queue_whatever_the_handler_did(
    error: BaseException | None,
) -> None:
    # A partial result returned after the shutdown is not committed, and the attempt
    # is not spent: the worker, not the job, stopped it.
    end = stopped_ending(ending_for(error), Stop.SHUTDOWN)
    assert end == Ending(EndKind.RELEASE, "shutdown: the worker stopped the attempt", "released")


@pytest.mark.parametrize("stop", [Stop.LEASE_LOST, Stop.CANCELLED, Stop.LET_GO])
def test_a_result_returned_after_a_lost_cancelled_or_dropped_lease_is_discarded(
    stop: Stop,
) -> None:
    end = stopped_ending(ending_for(None), stop)
    assert end.kind is EndKind.ABANDON
    assert end.code == "result_discarded"
    assert stop.value in end.reason


@pytest.mark.parametrize("stop", _ALL_STOPS)
@pytest.mark.parametrize(
    "error",
    [ToolOutcomeUnknown("timeout", code="t"), IntentAmbiguous("?"), PermanentError("declined")],
)
def test_a_park_or_a_failure_stands_after_any_stop(stop: Stop, error: BaseException) -> None:
    # They are facts about the outside world or the job: releasing a job whose call's
    # outcome is unknown would repeat that call blindly.
    assert stopped_ending(ending_for(error), stop) == ending_for(error)


@pytest.mark.parametrize("stop", [Stop.LEASE_LOST, Stop.CANCELLED, Stop.LET_GO])
@pytest.mark.parametrize("error", [LeaseLost("moved"), TransientError("503")])
def test_other_endings_after_a_lost_lease_stand_and_stay_fenced(
    stop: Stop, error: BaseException
) -> None:
    assert stopped_ending(ending_for(error), stop) == ending_for(error)


@pytest.mark.parametrize("error", [None, ValueError("x"), PermanentError("p")])
def test_without_a_stop_the_ending_is_unchanged(error: BaseException | None) -> None:
    assert stopped_ending(ending_for(error), None) == ending_for(error)
