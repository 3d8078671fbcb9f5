"""The core's vocabulary, each word decided in one place (issue 28, "strings where
h11 uses types").

Every way a delivery can go unclaimed is counted (the claim outcome ``unknown`` was
missing from the counted outcomes, so an unanswered claim was never counted in a
worker's stats); a cancel is recognised by one predicate, ``records.is_cancelled``
(it was ``error_code == "cancelled"`` spelled in four places)."""

from __future__ import annotations

import ast
import json
from collections import Counter
from dataclasses import replace
from pathlib import Path

from core_harness import Script, delivery, job_view, unreachable
from test_core_attempt import Shell

from sqs_lease._core.attempt import COMMIT_COUNTS, NOT_CLAIMED_COUNTS, attempt_flow
from sqs_lease._core.claiming import NotClaimedOutcome
from sqs_lease._core.fencing import FinishOutcome
from sqs_lease._core.records import CANCELLED_CODE, JobState, is_cancelled
from sqs_lease._shell import STAT_NAMES


def test_every_not_claimed_outcome_counts_in_a_worker_stat() -> None:
    outcomes = set(NotClaimedOutcome)
    assert outcomes - set(NOT_CLAIMED_COUNTS) == set()  # none left uncounted
    assert set(NOT_CLAIMED_COUNTS.values()) - STAT_NAMES == set()  # each a stat that exists
    assert set(COMMIT_COUNTS.values()) - STAT_NAMES == set()


def test_every_commit_outcome_counts_in_a_worker_stat() -> None:
    # A commit with no answer was counted under a name no stat had: silently dropped.
    assert set(COMMIT_COUNTS) == set(FinishOutcome)
    assert set(COMMIT_COUNTS.values()) <= STAT_NAMES


def test_an_unanswered_claim_counts_unanswered() -> None:
    shell = Shell()
    s = Script([unreachable()])
    s.run(attempt_flow(shell.env, delivery()))
    assert [c.op for c in s.calls] == ["UpdateItem"]  # the claim, unanswered: nothing more
    assert s.event("ownership_unknown")["stage"] == "claim"
    assert shell.counts == Counter(unanswered=1)


PACKAGE = Path(__file__).resolve().parent.parent / "sqs_lease"
# Left for later: files other work is changing right now (issue 28 items 3 and 4).
CANCEL_TEST_LEFT: set[str] = set()


def _spells_the_cancel_test(path: Path) -> list[int]:
    """Lines comparing an ``error_code`` with the cancel's code spelled out."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        names_code = any(
            (isinstance(s, ast.Attribute) and s.attr == "error_code")
            or (isinstance(s, ast.Call) and "error_code" in ast.unparse(s))
            for s in sides
        )
        spells = any(isinstance(s, ast.Constant) and s.value == CANCELLED_CODE for s in sides)
        if names_code and spells:
            found.append(node.lineno)
    return found


def test_a_cancel_is_recognised_by_one_predicate() -> None:
    spelled = {
        str(p.relative_to(PACKAGE)): lines
        for p in sorted(PACKAGE.rglob("*.py"))
        if "_sim" not in p.parts and (lines := _spells_the_cancel_test(p))
    }
    assert set(spelled) <= CANCEL_TEST_LEFT, spelled


def test_is_cancelled_is_the_cancelled_state_or_an_older_failed_record_with_its_code() -> None:
    running = job_view()
    assert is_cancelled(replace(running, state=JobState.CANCELLED, error_code=CANCELLED_CODE))
    assert JobState.CANCELLED.terminal
    # A record a version before the state cancelled: ``failed`` with the cancel's code.
    assert is_cancelled(replace(running, state=JobState.FAILED, error_code=CANCELLED_CODE))
    assert not is_cancelled(replace(running, state=JobState.FAILED, error_code="no_page"))
    assert not is_cancelled(replace(running, error_code=CANCELLED_CODE))


def test_verdicts_are_enums_whose_values_are_the_words_printed_before() -> None:
    # StrEnum: `--json` output and journal fields keep the same strings.
    from sqs_lease._core.cancelling import CancelVerdict
    from sqs_lease._core.sending import SendVerdict
    from sqs_lease._dlq import RedriveVerdict

    assert {v.value for v in CancelVerdict} == {"cancelled", "already_final"}
    assert {v.value for v in SendVerdict} == {"sent", "superseded", "failed"}
    assert {v.value for v in RedriveVerdict} == {
        "moved",
        "copied_not_deleted",
        "failed",
        "skipped",
        "would_move",
    }
    assert json.dumps({"verdict": CancelVerdict.ALREADY_FINAL}) == '{"verdict": "already_final"}'


def test_retry_stranded_and_claim_verdicts_keep_the_words_printed_before() -> None:
    # Literals before issue 28: `jobs retry --json`, `jobs sweep --json` and the
    # stranded_swept counts print these values.
    from sqs_lease._core.stages import RetryVerdict
    from sqs_lease._core.sweeping import StrandedVerdict

    assert {v.value for v in RetryVerdict} == {"retried", "resumed", "resent", "nothing_to_do"}
    assert {v.value for v in StrandedVerdict} == {
        "resent",
        "would_resend",
        "moved",
        "cleared",
        "failed",
        "restamped",  # soak seed 1469822: an entry stamped ahead of the sweeper's clock
        "would_restamp",
    }
    assert {v.value for v in NotClaimedOutcome} == {
        "done",
        "parked",
        "missing",
        "exhausted",
        "unknown",
        "class_mismatch",
        "stray",
        "running",
        "deferred",
        "unknown_class",
        "unreadable",
        "invalid",
    }
    assert json.dumps({"verdict": RetryVerdict.NOTHING_TO_DO}) == '{"verdict": "nothing_to_do"}'
    assert f"{StrandedVerdict.WOULD_RESEND}" == "would_resend"


def test_the_cli_says_a_line_for_every_verdict() -> None:
    # The CLI's tables are keyed by the enums: a new member without its line fails here,
    # not as a KeyError in an operator's `jobs repair` or `dlq redrive`.
    from sqs_lease._cli_dlq import _SAID, _VERDICT_SAID
    from sqs_lease._cli_jobs import _STRANDED_SAID
    from sqs_lease._core.deadletter import DlqVerdict
    from sqs_lease._core.sweeping import StrandedVerdict
    from sqs_lease._dlq import RedriveVerdict

    assert set(_STRANDED_SAID) == set(StrandedVerdict)
    assert set(_SAID) == set(RedriveVerdict)
    assert set(_VERDICT_SAID) == set(DlqVerdict)
