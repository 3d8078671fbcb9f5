"""The fifo world (issue 26, ``sqs_lease/testing/_sim/fifo.py``): the simulated SQS keeps FIFO as
AWS documents it, a seed with the feature off runs as before, and the world catches
the defects of issue 26 it draws (each as a mutation at a pinned seed), while the real
protocol passes the same seeds.
"""

from __future__ import annotations

from typing import Any

import pytest

from simtools import run_seed
from simtools.catch import world
from simtools.cli import replay_command
from simtools.mutations import FIFO_MUTATIONS, UNCAUGHT, VARIANTS, WORLDS, applied
from sqs_lease._core.calls import Err, Ok
from sqs_lease.testing._sim import fifo
from sqs_lease.testing._sim.chaos import Chaos
from sqs_lease.testing._sim.invariants import I4, I10, I18
from sqs_lease.testing._sim.plan import PASSING_FEATURES, WIDE_FEATURES, draw_plan, serial_bound
from sqs_lease.testing._sim.sqs import SimSQS, SqsBehaviour

Q = "https://sqs.sim.local/000000000000/q.fifo"

# --------------------------------------------------------------------------- the SQS


def _sqs() -> SimSQS:
    sqs = SimSQS(Chaos(1), SqsBehaviour(duplicate=1.0))
    sqs.create_queue(Q, visibility=30)
    return sqs


def _send(sqs: SimSQS, body: str, group: str, dedup: str, now: float, **more: Any) -> Any:
    params = {
        "QueueUrl": Q,
        "MessageBody": body,
        "MessageGroupId": group,
        "MessageDeduplicationId": dedup,
        **more,
    }
    return sqs.handle("SendMessage", params, now)


def _receive(sqs: SimSQS, now: float, want: int = 10) -> list[str]:
    out = sqs.handle("ReceiveMessage", {"QueueUrl": Q, "MaxNumberOfMessages": want}, now)
    assert isinstance(out, Ok)
    return [m["Body"] for m in out.response.get("Messages", [])]


def _delete(sqs: SimSQS, body: str, now: float) -> None:
    [m] = [m for m in sqs.live(Q) if m.body == body]
    assert m.handle is not None
    out = sqs.handle("DeleteMessage", {"QueueUrl": Q, "ReceiptHandle": m.handle}, now)
    assert isinstance(out, Ok)


def test_a_fifo_send_needs_its_group_and_deduplication_id_and_takes_no_delay() -> None:
    sqs = _sqs()
    missing = sqs.handle("SendMessage", {"QueueUrl": Q, "MessageBody": "b"}, 0.0)
    assert isinstance(missing, Err) and missing.code == "MissingParameter"
    no_dedup = sqs.handle(
        "SendMessage", {"QueueUrl": Q, "MessageBody": "b", "MessageGroupId": "g"}, 0.0
    )
    assert isinstance(no_dedup, Err) and no_dedup.code == "InvalidParameterValue"
    delayed = _send(sqs, "b", "g", "d", 0.0, DelaySeconds=5)
    assert isinstance(delayed, Err) and "DelaySeconds" in delayed.message
    assert sqs.live(Q) == []


def test_a_duplicate_deduplication_id_is_answered_success_and_dropped_for_five_minutes() -> None:
    sqs = _sqs()
    first = _send(sqs, "a", "g1", "same", 0.0)
    assert isinstance(first, Ok)
    [a] = _receive(sqs, 1.0)
    _delete(sqs, a, 2.0)  # tracked even after the message was received and deleted
    again = _send(sqs, "b", "g2", "same", 299.0)  # another group, the same id: dropped
    assert isinstance(again, Ok) and again.response["MessageId"] == first.response["MessageId"]
    assert sqs.live(Q) == []
    later = _send(sqs, "c", "g2", "same", 300.5)  # past the interval: a new message
    assert isinstance(later, Ok) and [m.body for m in sqs.live(Q)] == ["c"]


def test_a_group_is_received_in_order_and_held_while_one_of_it_is_in_flight() -> None:
    sqs = _sqs()
    for i, (body, group) in enumerate([("a1", "a"), ("b1", "b"), ("a2", "a"), ("a3", "a")]):
        assert isinstance(_send(sqs, body, group, f"d{i}", 0.0), Ok)
    # One message a call (the workers'): a group's head, never a later message.
    assert _receive(sqs, 1.0, want=1) in (["a1"], ["b1"])
    sqs = _sqs()
    for i, (body, group) in enumerate([("a1", "a"), ("b1", "b"), ("a2", "a"), ("a3", "a")]):
        assert isinstance(_send(sqs, body, group, f"d{i}", 0.0), Ok)
    # A batch (a Lambda mapping's): each group's messages in order behind its head.
    got = _receive(sqs, 1.0)
    assert sorted(got) == ["a1", "a2", "a3", "b1"]
    assert [b for b in got if b.startswith("a")] == ["a1", "a2", "a3"]
    assert _receive(sqs, 2.0) == []  # every group in flight: nothing, no copies
    _delete(sqs, "a1", 3.0)
    assert _receive(sqs, 4.0) == []  # a2 and a3 still in flight hold group a
    # each lapsed (30 s): back in the order sent, group by group
    again = _receive(sqs, 40.0)
    assert sorted(again) == ["a2", "a3", "b1"]
    assert [b for b in again if b.startswith("a")] == ["a2", "a3"]


# --------------------------------------------------------------------------- the plan


def test_fifo_is_a_passing_widened_feature_drawn_from_its_own_stream() -> None:
    assert "fifo" in WIDE_FEATURES and "fifo" in PASSING_FEATURES
    drawn = [s for s in range(200) if draw_plan(Chaos(s)).fifo is not None]
    assert 20 < len(drawn) < 90  # about one run in four
    without = frozenset(WIDE_FEATURES) - {"fifo"}
    for seed in range(60):
        on, off = draw_plan(Chaos(seed)), draw_plan(Chaos(seed), features=without)
        if on.fifo is None:
            assert on == off, seed  # the feature off: the seed draws what it drew


def test_a_seed_without_the_fifo_world_runs_byte_for_byte_as_before() -> None:
    without = frozenset(WIDE_FEATURES) - {"fifo"}
    seed = next(s for s in range(100) if draw_plan(Chaos(s)).fifo is None)
    a, b = run_seed(seed, trace=True), run_seed(seed, trace=True, features=without)
    assert a.render_log() == b.render_log()


def test_the_fifo_world_draws_sessions_stages_hints_and_resubmits() -> None:
    plans = [p for p in (draw_plan(Chaos(s)) for s in range(300)) if p.fifo is not None]
    assert any(p.fifo and p.fifo.sessions for p in plans)
    assert any(p.fifo and p.fifo.resubmits for p in plans)
    assert any(p.fifo and not p.fifo.interleave for p in plans)
    assert any(p.fifo and p.fifo.hints for p in plans)
    assert sum(1 for p in plans if "staged" in p.wide.features) > len(plans) // 2
    for p in plans:
        assert p.sqs.duplicate == 0.0  # FIFO: exactly-once, no duplicate copies
        assert p.fifo is not None
        for job_id in p.fifo.sessions:
            jp = next(j for j in p.job_plans if j.job_id == job_id)
            # without interleave_stages, a job of several stages goes in no session
            assert p.fifo.interleave or len(jp.stages) < 2


# --------------------------------------------------------------------------- mutations

# The first seed of each fifo mutation's search that catches it (``python -m simtools
# mutations`` prints them), with the invariant it is expected to break there.
CAUGHT_AT: dict[str, tuple[int, str]] = {
    "dedup_per_send_only": (13, I10),  # defect 1: another job's continuation dropped
    "takeover_sends_first_stage": (154, I4),  # defect 6: a resubmit's send names fetch
    "continuation_leaves_session": (17, fifo.I22),  # defect 9: a stage skips its session
    "checkpoint_keeps_hint": (13, I18),  # defect 5: notify starts with upload's hint
}


def test_every_fifo_mutation_is_registered_in_the_fifo_world() -> None:
    assert set(CAUGHT_AT) == set(FIFO_MUTATIONS)
    for name in CAUGHT_AT:
        assert name in VARIANTS and name not in UNCAUGHT
        assert WORLDS[name] == frozenset({"fifo"})


def test_fifo_mutations_are_undone_on_exit() -> None:
    from sqs_lease._core import sending, stages, sweeping
    from sqs_lease._schema import job_requests as _schema

    def state() -> tuple[object, ...]:
        return (
            sending.__dict__["deduplication_id"],
            (sending.send_record_message, sweeping.__dict__["send_record_message"]),
            stages.__dict__["_send"],
            list(_schema.__dict__["_NEW_STAGE"]),
        )

    before = state()
    for name in FIFO_MUTATIONS:
        with applied(name):
            assert state() != before, name
    assert state() == before


@pytest.mark.parametrize("name", sorted(CAUGHT_AT))
def test_fifo_mutation_is_caught_at_its_pinned_seed_and_the_protocol_passes_it(
    name: str,
) -> None:
    seed, expected = CAUGHT_AT[name]
    features = world(name)
    assert draw_plan(Chaos(seed), features=features).fifo is not None, "not a fifo seed"
    result = run_seed(seed, mutation=name, features=features)
    assert not result.ok, f"{name} was not caught at seed {seed}"
    first = result.violations[0]
    assert first.name == expected, (
        f"{name} broke {first.name} first (seed {seed}): {first.message}; "
        f"replay: {replay_command(seed, name, features=features)}"
    )
    assert run_seed(seed, features=features).ok, (
        f"the unmutated protocol fails seed {seed}: {replay_command(seed, None, features=features)}"
    )


def test_a_fifo_message_names_its_group_as_aws_does() -> None:
    # The Lambda mapping hands a FIFO record over with its group: the core's
    # ``message_group`` reads it for the batch's group stop.
    sqs = _sqs()
    assert isinstance(_send(sqs, "a1", "session-7", "d0", 0.0), Ok)
    out = sqs.handle(
        "ReceiveMessage",
        {"QueueUrl": Q, "MaxNumberOfMessages": 10, "MessageSystemAttributeNames": ["All"]},
        1.0,
    )
    assert isinstance(out, Ok)
    [m] = out.response["Messages"]
    assert m["Attributes"]["MessageGroupId"] == "session-7"


def test_soak_seed_1510739_a_leftover_copy_of_an_ended_job_does_not_hold_its_session() -> None:
    """Soak seed 1510739 (fresh range 1,500,000 on f9432d7; the checker's error): a
    Lambda batch of four from the FIFO queue (before the operator set its size to one)
    held job-000 and job-004 of session-0 behind a record that ran 51 s; their
    visibility lapsed and another poller received both again. The first environment ran
    job-000 to its commit and deleted its message under the handle SQS had replaced,
    which SQS answers with success and does not apply; then it claimed job-004. I22
    called that out of order because job-000's leftover copy was still on the queue,
    though job-000 had ended: the copy is deleted by its claim and runs nothing. The
    order a session promises is its jobs' (docs/operations.md), so the checker now
    counts an earlier message only while it can still run its job (``FifoWorld._runs``:
    the record not ended or parked, and that message its current send)."""
    result = run_seed(1510739, trace=True)
    assert result.ok, result.violations
    stale = [e for e in result.log if e[2] == "lambda_fifo_batch_too_large" and e[3]["records"] > 1]
    assert stale, "the seed no longer draws its case"
    committed = [
        e[0] for e in result.log if e[2] == "result_committed" and e[3]["job_id"] == "job-000"
    ]
    claimed = [e[0] for e in result.log if e[2] == "job_claimed" and e[3]["job_id"] == "job-004"]
    assert committed and claimed and min(committed) < min(claimed)  # the jobs' order held


def test_soak_seed_1607424_a_groups_long_jobs_in_a_row_fit_the_drain() -> None:
    """Fresh range 1,600,000 on bace364 (I4, the simulator's error): three long jobs
    (11.7 h an attempt, over their 11.75 h stage budget) in one session of a FIFO queue
    ran one after another, each sent again for the 12-hour cap behind the others; the
    third's last attempt was still running, its heartbeats landing, when the drain's
    bound (each job counted as if it had a worker of its own) ended the run. The bound
    now counts the largest group's jobs in a row (``plan.serial_bound``, the rule the
    Lambda world's pollers use too). Replay: python -m simtools replay --seed 1607424"""
    plan = draw_plan(Chaos(1607424))
    assert plan.fifo is not None and len(set(plan.fifo.sessions.values())) == 1
    assert plan.max_time >= serial_bound(plan, len(plan.fifo.sessions))
    result = run_seed(1607424)
    assert result.ok, result.violations[0].message
