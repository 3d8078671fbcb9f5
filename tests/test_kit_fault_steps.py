"""``Faults.lose_next_response`` names the protocol's steps, not DynamoDB's operations
(issue 29): ``claim``, ``heartbeat``, ``effect_start``, ``effect_confirm``, ``commit``,
``delete``.

The steps are read from the calls' parameters, so each is checked two ways: against
the requests the toolkit builds (every write that shares a step's operation and must
not be taken for it), and with a real worker on the embedded emulator, where the
call lost is the step named and the job still ends with its effect applied once.
"""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel

from sqs_lease import App, ConfigError, JobContext
from sqs_lease._core.calls import Call
from sqs_lease._core.intents import EffectSpec, IntentState
from sqs_lease._schema.intent_requests import IntentTable
from sqs_lease._schema.job_requests import JobTable
from sqs_lease.testing import (
    FAULT_STEPS,
    SHORT_LEASE,
    Faults,
    FencedTarget,
    LeaseEnv,
    assert_every_job_terminal_or_parked,
    assert_no_effect_applied_twice,
)
from sqs_lease.testing import _steps_of as steps_of

TABLES = ("p-jobs", "p-intents")
JOBS = JobTable("p-jobs")
INTENTS = IntentTable("p-intents", "p-attempts")


def _spec() -> EffectSpec:
    return EffectSpec(
        key="k",
        job_id="j",
        stage="main",
        action="capture",
        target="payments",
        payload_json="{}",
        payload_hash="h",
        tool=lambda: None,
    )


def _batch(op: str, visibility: int | None) -> Call:
    entry: dict[str, Any] = {"Id": "0", "ReceiptHandle": "r"}
    if visibility is not None:
        entry["VisibilityTimeout"] = visibility
    return Call("sqs", op, {"QueueUrl": "q", "Entries": [entry]})


END = {"token": 1, "worker_id": "w", "wall_now": 10.0, "write_id": "x"}

STEP_CALLS: dict[str, list[Call]] = {
    "claim": [
        JOBS.claim("j", "w", 10.0, 30, job_class="c", send_id="s"),
        JOBS.claim("j", "w", 10.0, 30, job_class="c", send_id=None, take_from=1),
    ],
    "commit": [
        JOBS.commit("j", result_json="{}", **END),  # type: ignore[arg-type]
        JOBS.advance_stage(
            "j",
            stage="a",
            next_stage="b",
            stage_input="{}",
            stage_log="{}",
            send_id="s2",
            **END,  # type: ignore[arg-type]
        ),
    ],
    "effect_start": [
        INTENTS.start(
            _spec(),
            jobs=JOBS,
            token=1,
            worker_id="w",
            expected=IntentState.PREPARED,
            attempts=0,
            wall_now=10.0,
        )
    ],
    "effect_confirm": [
        INTENTS.confirm(
            "k",
            attempt=1,
            response_json="{}",
            external_id="e",
            wall_now=10.0,
            log_response="",
            reconciled=reconciled,
        )
        for reconciled in (False, True)
    ],
    "heartbeat": [_batch("ChangeMessageVisibilityBatch", 30)],
    "delete": [
        Call("sqs", "DeleteMessage", {"QueueUrl": "q", "ReceiptHandle": "r"}),
        _batch("DeleteMessageBatch", None),
    ],
}

# Calls of the same operations that are none of the steps.
OTHER_CALLS: list[Call] = [
    JOBS.end_in_error("j", reason="r", error_code="e", retry=True, **END),  # type: ignore[arg-type]
    JOBS.end_in_error("j", reason="r", error_code="e", retry=False, **END),  # type: ignore[arg-type]
    JOBS.release("j", reason="r", **END),  # type: ignore[arg-type]
    JOBS.park("j", reason="r", **END),  # type: ignore[arg-type]
    JOBS.save_progress("j", 1, "{}", 10.0),
    JOBS.take_send("j", seen_send_id="s", new_send_id="s2", wall_now=10.0),
    JOBS.mark_sent("j", "s", 10.0),
    JOBS.cancel("j", "r", 10.0),
    JOBS.unpark("j", "s", 10.0),
    INTENTS.attempt_failed("k", attempt=1, outcome="o", error="e", wall_now=10.0, reopen=True),
    INTENTS.mark_ambiguous("k", attempts=1, reason="r", wall_now=10.0),
    INTENTS.prepare(_spec(), 10.0),
    _batch("ChangeMessageVisibilityBatch", 0),  # a hand-back: visible at once
    Call("sqs", "ChangeMessageVisibility", {"QueueUrl": "q", "ReceiptHandle": "r"}),
    Call("dynamodb", "BatchGetItem", {"RequestItems": {}}),
]


def test_every_step_is_named_and_described() -> None:
    assert set(STEP_CALLS) == set(FAULT_STEPS)
    assert all(FAULT_STEPS.values())


@pytest.mark.parametrize("step", sorted(STEP_CALLS))
def test_each_steps_requests_are_read_as_that_step(step: str) -> None:
    for c in STEP_CALLS[step]:
        assert steps_of(c, TABLES) == {step}, c.params


@pytest.mark.parametrize("c", OTHER_CALLS, ids=lambda c: c.op)
def test_a_write_of_a_steps_operation_that_is_not_the_step_is_none(c: Call) -> None:
    assert steps_of(c, TABLES) == set(), c.params


def test_another_apps_tables_are_not_this_workers_steps() -> None:
    other = ("q-jobs", "q-intents")
    for step in ("claim", "commit", "effect_start", "effect_confirm"):
        for c in STEP_CALLS[step]:
            assert steps_of(c, other) == set()


# --------------------------------------------------------------------------- on the emulator


class Charge(BaseModel):
    invoice: str
    amount: int


def test_an_unknown_name_is_refused_naming_the_steps(lease_env: LeaseEnv) -> None:
    app = App()

    @app.job("charge", payload=Charge)
    def charge(ctx: JobContext[Any], p: Charge) -> None:  # pragma: no cover - never run
        return None

    faults = Faults(lease_env.worker(app, "W"))
    with pytest.raises(ConfigError) as got:
        faults.lose_next_response("efect_confirm")
    text = str(got.value)
    assert "did you mean 'effect_confirm'?" in text
    assert all(step in text for step in FAULT_STEPS)
    faults.lose_next_response("TransactWriteItems")  # advanced: an operation's name
    faults.lose_next_response("DeleteMessageBatch")


@pytest.mark.parametrize("name", [*sorted(FAULT_STEPS), "UpdateItem"])
def test_a_lost_answer_of_each_step_still_ends_the_job_with_one_effect(
    lease_env: LeaseEnv, fenced_target: FencedTarget, name: str
) -> None:
    app = App()
    app.target("payments", check=fenced_target.check, key_retention_seconds=3600)
    faults: dict[str, Faults] = {}

    @app.job("charge", payload=Charge, **SHORT_LEASE)
    def charge(ctx: JobContext[Any], p: Charge) -> dict[str, Any]:
        done = ctx.effect("capture", "payments", p, fenced_target.call)
        while name == "heartbeat" and not faults["W"].lost:
            ctx.wait(0.05)  # hold the job until a heartbeat's answer is lost
        return {"charge": done.external_id}

    job_id = lease_env.submit(app, "charge", Charge(invoice="INV-1", amount=100))
    worker = lease_env.worker(app, "W")
    faults["W"] = Faults(worker)
    faults["W"].lose_next_response(name)
    with lease_env.running(worker):
        lease_env.wait_until_final(job_id)
        lease_env.wait_for(lambda: faults["W"].lost != [], what=f"a {name} answer lost")
    (lost,) = faults["W"].lost
    tables = (lease_env.settings.jobs_table, lease_env.settings.intents_table)
    if name in FAULT_STEPS:
        assert steps_of(lost, tables) == {name}
    else:
        assert lost.op == name
    assert_no_effect_applied_twice(fenced_target)
    assert_every_job_terminal_or_parked(lease_env, [job_id])
    record = lease_env.record(job_id)
    if name == "effect_start":
        # The start applied unseen, so no process timed its key on its own clock: the
        # check's "not applied" is not taken as proof that a repeat is still inside
        # the target's key retention, and the job may park for an operator instead.
        assert record.state.value in ("succeeded", "parked")
    else:
        assert record.state.value == "succeeded"
    assert len(fenced_target.ledger) == (record.state.value == "succeeded")
    if name == "claim":
        # The lost claim applied (token 1) and its worker never knew: the job's
        # redelivery took it over from that silent owner.
        assert record.token == 2
