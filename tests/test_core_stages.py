"""Durable stages in the core, driven by hand: a stage ending is checkpoint (fenced),
next message, delete; each stage has its own rules; bad continuations fail the job.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import replace
from typing import Any

import pytest
from core_harness import (
    TABLE,
    Script,
    assert_fenced,
    condition_equalities,
    condition_failed,
    delivery,
    err,
    job_item,
    ok,
    update_sets,
)
from test_core_attempt import MONO, WALL, Rules, Shell

from sqs_lease._core.attempt import attempt_flow
from sqs_lease._core.calls import Call, Err, ErrorKind, Invoke, Outcome
from sqs_lease._core.deletes import DeleteBatch
from sqs_lease._core.env import HandlerRun
from sqs_lease._core.fencing import FinishOutcome
from sqs_lease._core.fifo import deduplication_id, message_group_id
from sqs_lease._core.lease import Drop
from sqs_lease._core.messages import Delivery, message_body, parse_message
from sqs_lease._core.records import JobState
from sqs_lease._core.rounds import heartbeat_round_flow
from sqs_lease._core.stages import (
    MESSAGE_CAP_SECONDS,
    NextStage,
    cap_budget,
    continuation_send_id,
    retry_failed_flow,
    stage_results,
)
from sqs_lease._core.timeline import TimelineKind, decode
from sqs_lease._errors import PayloadError, RetryRefused
from sqs_lease._schema.job_requests import JobTable
from sqs_lease._schema.views import view_of

T = JobTable("jobs")
QUEUE = "https://sqs.test/123/work"


class RenderRules(Rules):
    """The second stage's own class: another lease, and its own input model."""

    lease_seconds = 120

    def validate_payload(self, payload_json: str) -> Any:
        data = json.loads(payload_json)
        if "rows_key" not in data:
            raise PayloadError("payload field 'rows_key': Field required")
        return data


def _staged_shell(handler: Any, stages: dict[str, Rules] | None = None) -> Shell:
    shell = Shell(handler)
    known = stages if stages is not None else {"fetch": Rules(), "render": RenderRules()}
    shell.env.stage_rules_of = lambda job_class, stage: known.get(stage)
    return shell


def _claimed(stage: str = "fetch", token: int = 4, **extra: str) -> Outcome:
    item = job_item(state=JobState.QUEUED, owner=None, token=token, attempt=0, stage=stage)
    for name, text in extra.items():
        item[name] = {"S": text}
    return ok({"Attributes": item}, sent_at=MONO, received_at=MONO)


def _staged_delivery(stage: str = "fetch", send_id: str = "send-1") -> Delivery:
    # A receive lease too short to keep (``first_beat_reserve``): the claim sets the
    # stage's own lease with a visibility change, which these tests script and check.
    return replace(delivery(send_id=send_id, visibility=1), stage=stage)


def _run(shell: Shell, answers: list[Outcome], item: Delivery) -> Script:
    s = Script(answers)
    end = s.run(attempt_flow(shell.env, item))
    s.end, s.result = end, end.fin  # type: ignore[attr-defined]
    return s


def test_a_message_keeps_the_stage_it_was_sent_for() -> None:
    body = message_body("j", "report", stage="render", send_id="s-1")
    got = parse_message({"MessageId": "m", "ReceiptHandle": "rh", "Body": body}, 1.0, 30)
    assert isinstance(got, Delivery)
    assert (got.stage, got.send_id) == ("render", "s-1")


def test_a_stage_ending_checkpoints_fenced_then_sends_the_next_stage_then_deletes() -> None:
    def fetch(run: HandlerRun) -> Any:
        return NextStage("render", {"rows_key": "s3://b/rows"}, result={"rows": 3})

    shell = _staged_shell(fetch)
    answers = [_claimed(), ok(sent_at=MONO), ok(), ok({"MessageId": "m-2"}), ok(), ok()]
    s = _run(shell, answers, _staged_delivery())
    assert [c.op for c in s.calls] == [
        "UpdateItem",  # claim (token 5)
        "ChangeMessageVisibility",
        "UpdateItem",  # checkpoint, fenced on token 5
        "SendMessage",  # the next stage's message
        "UpdateItem",  # marked sent
        "DeleteMessage",  # the current message, last
    ]
    assert s.result.outcome is FinishOutcome.DONE  # type: ignore[attr-defined]
    checkpoint = s.calls[2].params
    assert_fenced(checkpoint, token=5)
    sets = update_sets(checkpoint)
    send_id = continuation_send_id(5, "render")
    assert sets["stage"] == "'render'" and sets["send_id"] == repr(send_id)
    assert sets["stage_input"] == repr('{"rows_key":"s3://b/rows"}')
    assert sets["attempt"] == "0" and sets["state"] == "'queued'"
    assert sets["message_sent"] == "False"  # until the send is recorded: the sweep's to find
    (entry,) = json.loads(eval(sets["stages"]))
    assert (entry["stage"], entry["result"], entry["token"]) == ("fetch", {"rows": 3}, 5)
    body = json.loads(s.calls[3].params["MessageBody"])
    assert (body["stage"], body["send_id"], body["job_id"]) == ("render", send_id, "job-1")
    done = s.event("stage_committed")
    assert (done["stage"], done["next_stage"], done["token"]) == ("fetch", "render", 5)
    assert shell.counts == Counter(claimed=1, committed=1)


def _fetch_ends(run: HandlerRun) -> Any:
    return NextStage("render", {"rows_key": "s3://b/rows"}, result={"rows": 3})


def _after_claim() -> list[Outcome]:
    """CMV, checkpoint, next stage's message, marked sent, delete."""
    return [ok(sent_at=MONO), ok(), ok({"MessageId": "m-2"}), ok(), ok()]


def test_a_stage_checkpoint_appends_a_stage_done_event_to_the_timeline_in_the_same_write() -> None:
    shell = _staged_shell(_fetch_ends)
    s = _run(shell, [_claimed(), *_after_claim()], _staged_delivery())
    checkpoint = s.calls[2].params
    assert_fenced(checkpoint, token=5)
    appended = update_sets(checkpoint)["timeline"]
    (text,) = re.findall(r"'(\{[^']*\})'", appended)
    ev = decode(text)
    assert ev is not None
    assert (ev.kind, ev.stage, ev.token, ev.owner) == (
        TimelineKind.STAGE_DONE,
        "fetch",
        5,
        shell.env.worker_id,
    )
    assert ev.detail == "next: render"


def test_on_a_fifo_queue_the_next_stage_goes_in_the_jobs_group_deduplicated_per_job_and_send() -> (
    None
):
    shell = _staged_shell(_fetch_ends)
    shell.env.queue_url = "https://sqs.test/123/work.fifo"
    s = _run(shell, [_claimed(group_id="agent-7"), *_after_claim()], _staged_delivery())
    send = s.calls[3]
    assert send.op == "SendMessage" and send.params["QueueUrl"].endswith(".fifo")
    assert send.params["MessageGroupId"] == message_group_id("job-1", "agent-7")
    assert send.params["MessageDeduplicationId"] == deduplication_id(
        "job-1", continuation_send_id(5, "render")
    )


def test_two_jobs_ending_the_same_stage_at_the_same_token_send_different_deduplication_ids() -> (
    None
):
    # Issue 26 defect 1: the continuation's send id (`stage.{token}.{next}`) is the
    # same for every job at that token and stage; as the FIFO deduplication id it made
    # SQS drop the second job's next-stage message, and its record said "sent".
    sends = []
    for job_id in ("job-1", "job-2"):
        shell = _staged_shell(_fetch_ends)
        shell.env.queue_url = "https://sqs.test/123/work.fifo"
        claimed = _claimed()
        assert not isinstance(claimed, Err)
        claimed.response["Attributes"]["job_id"] = {"S": job_id}
        item = replace(_staged_delivery(), job_id=job_id)
        s = _run(shell, [claimed, *_after_claim()], item)
        (send,) = s.calls_to("SendMessage")
        assert json.loads(send.params["MessageBody"])["job_id"] == job_id
        sends.append(send.params)
    assert sends[0]["MessageDeduplicationId"] != sends[1]["MessageDeduplicationId"]


def test_with_a_delete_batch_an_ended_stages_message_joins_it_on_a_standard_queue() -> None:
    # The floor of a stage boundary (issue 12): the ended stage's message goes in
    # the worker's delete batch like a commit's; should it come back first, it names
    # a retired send id and claims nothing.
    shell = _staged_shell(_fetch_ends)
    shell.env.deletes = DeleteBatch(window=0.25)
    s = _run(shell, [_claimed(), *_after_claim()[:-1]], _staged_delivery())
    assert [c.op for c in s.calls] == [
        "UpdateItem",  # claim
        "ChangeMessageVisibility",
        "UpdateItem",  # checkpoint
        "SendMessage",  # the next stage's message, before any delete
        "UpdateItem",  # marked sent
    ]
    assert s.result.outcome is FinishOutcome.DONE  # type: ignore[attr-defined]
    assert len(shell.env.deletes) == 1  # the current message, in the batch


def test_on_a_fifo_queue_an_ended_stages_message_is_deleted_at_once_even_with_a_batch() -> None:
    # It holds the job's group: the next stage's message waits until it goes.
    shell = _staged_shell(_fetch_ends)
    shell.env.deletes = DeleteBatch(window=0.25)
    shell.env.queue_url = "https://sqs.test/123/work.fifo"
    s = _run(shell, [_claimed(group_id="agent-7"), *_after_claim()], _staged_delivery())
    assert [c.op for c in s.calls][-2:] == ["UpdateItem", "DeleteMessage"]
    assert len(shell.env.deletes) == 0


def test_the_next_stage_goes_to_the_queue_the_stage_came_from_and_that_message_is_deleted() -> None:
    shell = _staged_shell(_fetch_ends)
    interactive = "https://sqs.test/123/work-interactive"
    item = replace(_staged_delivery(), queue_url=interactive)
    s = _run(shell, [_claimed(), *_after_claim()], item)
    assert [(c.op, c.params.get("QueueUrl")) for c in s.calls if c.service == "sqs"] == [
        ("ChangeMessageVisibility", interactive),
        ("SendMessage", interactive),  # the job keeps its priority
        ("DeleteMessage", interactive),
    ]


def test_a_later_stage_runs_on_its_input_with_its_own_class_and_reads_earlier_results() -> None:
    seen: list[HandlerRun] = []

    def render(run: HandlerRun) -> Any:
        seen.append(run)
        return {"url": "https://x/report"}

    log = json.dumps([{"stage": "fetch", "result": {"rows": 3}, "token": 5}])
    shell = _staged_shell(render)
    answers = [
        _claimed("render", token=5, stage_input='{"rows_key":"k"}', stages=log),
        ok(sent_at=MONO),
        ok(),
        ok(),
    ]
    s = _run(shell, answers, _staged_delivery("render", "stage.5.render"))
    assert s.calls[1].params["VisibilityTimeout"] == RenderRules.lease_seconds
    (run,) = seen
    assert run.payload == {"rows_key": "k"} and isinstance(run.rules, RenderRules)
    assert run.claim.token == 6  # the token keeps rising across stages
    assert stage_results(run.claim.job) == {"fetch": {"rows": 3}}
    assert s.result.outcome is FinishOutcome.DONE  # type: ignore[attr-defined]
    assert [c.op for c in s.calls][2:] == ["UpdateItem", "DeleteMessage"]  # the final commit


def test_a_next_stage_the_job_does_not_have_fails_the_job_naming_it() -> None:
    shell = _staged_shell(lambda run: NextStage("publsh", {}))
    s = _run(shell, [_claimed(), ok(sent_at=MONO), ok(), ok()], _staged_delivery())
    sets = update_sets(s.calls[2].params)
    assert sets["state"] == "'failed'" and sets["error_code"] == "'bad_next_stage'"
    assert "no stage 'publsh'" in sets["reason"]
    assert "SendMessage" not in [c.op for c in s.calls]


def test_a_next_stage_input_its_model_refuses_fails_the_job_naming_the_field() -> None:
    shell = _staged_shell(lambda run: NextStage("render", {"rows": 1}))
    s = _run(shell, [_claimed(), ok(sent_at=MONO), ok(), ok()], _staged_delivery())
    reason = update_sets(s.calls[2].params)["reason"]
    assert "NextStage('render')" in reason and "rows_key" in reason


def test_a_stage_that_already_ran_is_not_run_again() -> None:
    log = json.dumps([{"stage": "fetch", "result": None, "token": 5}])
    shell = _staged_shell(lambda run: NextStage("fetch", {}))
    answers = [
        _claimed("render", token=5, stage_input='{"rows_key":"k"}', stages=log),
        ok(sent_at=MONO),
    ]
    s = _run(shell, [*answers, ok(), ok()], _staged_delivery("render", "stage.5.render"))
    assert "already ran" in update_sets(s.calls[2].params)["reason"]


def test_a_checkpoint_refused_by_the_fence_sends_nothing_and_deletes_nothing() -> None:
    shell = _staged_shell(lambda run: NextStage("render", {"rows_key": "k"}))
    moved = condition_failed(job_item(token=9, owner="w-2", stage="fetch"))
    s = _run(shell, [_claimed(), ok(sent_at=MONO), moved], _staged_delivery())
    assert [c.op for c in s.calls] == ["UpdateItem", "ChangeMessageVisibility", "UpdateItem"]
    assert s.result.outcome is FinishOutcome.REJECTED  # type: ignore[attr-defined]
    assert s.event("result_rejected")["stage"] == "stage"
    assert s.event("heartbeat_lost")["detected_by"] == "commit"
    assert shell.counts == Counter(claimed=1, rejected=1)


def test_a_failed_send_leaves_the_record_to_the_sweep_and_still_deletes_the_message() -> None:
    shell = _staged_shell(lambda run: NextStage("render", {"rows_key": "k"}))
    down = err(ErrorKind.SERVER, "ServiceUnavailable")
    answers = [_claimed(), ok(sent_at=MONO), ok(), down, ok(), ok()]
    s = _run(shell, answers, _staged_delivery())
    assert [c.op for c in s.calls][3:] == ["SendMessage", "UpdateItem", "DeleteMessage"]
    assert s.event("job_send_failed")["released"] is True
    assert s.result.outcome is FinishOutcome.DONE  # type: ignore[attr-defined]


def _unreadable_item(**kw: Any) -> dict[str, Any]:
    item = job_item(**kw)
    item["state"] = {"S": "archived"}  # an outside writer's state (soak seed 7841)
    return item


def test_a_continuation_whose_record_turned_unreadable_is_superseded_and_the_stage_ends() -> None:
    """Soak seed 7841: the checkpoint applied and the next stage's message went out,
    then the write recording the send met a record an outside writer had given an
    unknown state. The record was read for the journal only: the send is superseded
    (the message a stray), the stage's message is still deleted, nothing crashes."""
    shell = _staged_shell(_fetch_ends)
    unreadable = condition_failed(_unreadable_item(token=6, owner="w-2", stage="render"))
    answers = [_claimed(), ok(sent_at=MONO), ok(), ok({"MessageId": "m-2"}), unreadable, ok()]
    s = _run(shell, answers, _staged_delivery())
    assert [c.op for c in s.calls][2:] == [
        "UpdateItem",  # checkpoint
        "SendMessage",
        "UpdateItem",  # marked sent: refused, the record unreadable
        "DeleteMessage",
    ]
    assert s.result.outcome is FinishOutcome.DONE  # type: ignore[attr-defined]
    bad = s.event("job_record_unreadable")
    assert (bad["job_id"], bad["stage"]) == ("job-1", "send") and "archived" in bad["reason"]
    assert s.event("job_send_superseded")["current_send_id"] is None


def test_any_write_after_the_handler_that_meets_an_unreadable_record_rejects_the_attempt(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Whichever step of an ending reads a record this version cannot read, the
    attempt reports one loss and writes nothing more, keeping its message: the
    attempt-level rule (``attempt._unreadable_end``), not one guard per read."""
    from sqs_lease._core import stages
    from sqs_lease._errors import RecordUnreadable

    def unreadable_send(*args: Any, **kwargs: Any) -> Any:
        raise RecordUnreadable("job record 'job-1' cannot be read by this version")
        yield  # a flow

    monkeypatch.setattr(stages, "_send", unreadable_send)
    shell = _staged_shell(_fetch_ends)
    s = _run(shell, [_claimed(), ok(sent_at=MONO), ok()], _staged_delivery())
    assert [c.op for c in s.calls] == ["UpdateItem", "ChangeMessageVisibility", "UpdateItem"]
    fin = s.result  # type: ignore[attr-defined]
    assert (fin.outcome, fin.reason) == (FinishOutcome.REJECTED, "job record unreadable")
    bad = s.event("job_record_unreadable")
    assert (bad["stage"], bad["token"]) == ("end", 5)
    assert s.event("heartbeat_lost")["detected_by"] == "commit"


def test_the_checkpoint_is_read_back_from_the_record() -> None:
    item = job_item(stage="render")
    item["stages"] = {"S": json.dumps([{"stage": "fetch", "result": [1, 2], "token": 3}])}
    item["stage_input"] = {"S": '{"a":1}'}
    view = view_of(item)
    assert stage_results(view) == {"fetch": [1, 2]}
    assert view.stage_input == '{"a":1}'


# ----------------------------------------------------------------------------- the cap


def test_a_message_reads_when_sqs_sent_it_and_first_gave_it_out() -> None:
    body = message_body("j", "report", send_id="s-1")
    attrs = {"SentTimestamp": "1700000000000", "ApproximateFirstReceiveTimestamp": "1700000060500"}
    got = parse_message(
        {"MessageId": "m", "ReceiptHandle": "rh", "Body": body, "Attributes": attrs}, 1.0, 30
    )
    assert isinstance(got, Delivery)
    assert (got.sent_wall, got.first_received_wall) == (1_700_000_000.0, 1_700_000_060.5)


def test_an_attempt_on_a_message_received_before_gets_only_what_is_left_of_the_12_hour_cap() -> (
    None
):
    held: list[HandlerRun] = []

    def fetch(run: HandlerRun) -> Any:
        held.append(run)
        return {"done": True}

    shell = _staged_shell(fetch)
    # Received before (a retry's backoff): first received 11 h before now (WALL), sent
    # a day before; the cap (11.75 h) counts from the first receive, never the send.
    item = replace(
        _staged_delivery(),
        receive_count=2,
        sent_wall=WALL - 24 * 3600,
        first_received_wall=WALL - 11 * 3600,
    )
    s = _run(shell, [_claimed(), ok(sent_at=MONO), ok(), ok()], item)
    left = MESSAGE_CAP_SECONDS - 11 * 3600
    capped = s.event("stage_budget_capped")
    assert (capped["budget"], capped["class_budget"]) == (left, Rules.stage_budget_seconds)
    lease = held[0].held.lease
    assert lease.stage_deadline == item.received_at + left and lease.stage_capped


def test_a_budget_a_wall_clock_ahead_of_sqs_cut_runs_out_uncharged() -> None:
    # Issue 26 defect 4, the cap's comparison of two clocks (seeds 1041056...): SQS's
    # first receive against this worker's wall clock, here 4 h ahead, so the budget is
    # cut to 600 s where SQS's own clock would leave the class's whole hour. When the
    # cut runs out the job goes on under a new message, its attempt given back: a skew
    # can cost a hand-back, never a charged attempt (``stage_budget_exceeded``).
    shell = _staged_shell(lambda run: None)
    item = replace(
        _staged_delivery(),
        receive_count=2,
        first_received_wall=WALL - (MESSAGE_CAP_SECONDS - 600.0),  # 4 h of it the skew's
    )
    flow = attempt_flow(shell.env, item)
    answers = iter([_claimed(), ok(sent_at=MONO)])
    instr = next(flow)
    while not (isinstance(instr, Invoke) and instr.what == "handler"):
        out: Any = next(answers) if isinstance(instr, Call) else None
        if isinstance(instr, Invoke):
            out = ok({"value": instr.fn()})
        instr = flow.send(out)
    assert isinstance(instr.fn, HandlerRun)
    held = instr.fn.held
    assert held.lease.stage_capped
    assert held.lease.stage_deadline == item.received_at + 600.0

    def answer(c: Any) -> Outcome:  # every beat lands, the record still this attempt's
        if c.op == "ChangeMessageVisibilityBatch":
            return ok({"Successful": [{"Id": "0"}], "Failed": []}, sent_at=shell.mono)
        if c.op == "BatchGetItem":
            item = job_item(state=JobState.RUNNING, token=5, attempt=1, stage="fetch")
            return ok({"Responses": {TABLE: [item]}})
        return ok({"MessageId": "m-2"} if c.op == "SendMessage" else {})

    for _ in range(100):  # beats every H until one more lease no longer fits the cut
        shell.mono = held.lease.next_beat
        s = Script(answer)
        s.run(heartbeat_round_flow(shell.env))
        if held.lease.dropped is not None:
            break
    assert shell.mono < item.received_at + Rules.stage_budget_seconds - Rules.lease_seconds
    assert held.lease.dropped is Drop.MESSAGE_CAP
    assert s.event("lease_dropped")["reason"] == "message_cap"
    write = next(c for c in s.calls if c.op == "UpdateItem")
    names = {v: k for k, v in write.params["ExpressionAttributeNames"].items()}
    assert f"{names['attempt']} = {names['attempt']} - :" in write.params["UpdateExpression"]
    text = json.dumps(write.params)
    assert "message_cap" in text and "stage_budget_exceeded" not in text
    assert s.event("job_resent")["send_id"] == "cap.5"
    assert shell.counts["resent"] == 1 and shell.counts["retried"] == 0
    assert shell.counts["failed"] == 0


def test_a_message_that_waited_12_hours_in_the_backlog_gets_its_whole_stage_budget() -> None:
    held: list[HandlerRun] = []

    def fetch(run: HandlerRun) -> Any:
        held.append(run)
        return {"done": True}

    shell = _staged_shell(fetch)
    # Sent 12 h ago and received now for the first time: its cap begins now.
    item = replace(_staged_delivery(), sent_wall=WALL - 12 * 3600, first_received_wall=WALL - 0.2)
    s = _run(shell, [_claimed(), ok(sent_at=MONO), ok(), ok()], item)
    assert "stage_budget_capped" not in s.event_names()
    lease = held[0].held.lease
    assert lease.stage_deadline == item.received_at + Rules.stage_budget_seconds
    assert not lease.stage_capped
    assert s.result.outcome is FinishOutcome.DONE  # type: ignore[attr-defined]


def test_a_message_with_no_cap_left_is_not_run_and_goes_on_under_a_new_message() -> None:
    ran: list[HandlerRun] = []
    shell = _staged_shell(ran.append)
    item = replace(_staged_delivery(), receive_count=3, first_received_wall=WALL - 12 * 3600)
    answers = [_claimed(), ok(sent_at=MONO), ok(), ok({"MessageId": "m-2"}), ok(), ok()]
    s = _run(shell, answers, item)
    assert ran == []  # the handler never started
    assert [c.op for c in s.calls] == [
        "UpdateItem",  # the claim
        "ChangeMessageVisibility",  # the claim's own lease (the receive's was too short)
        "UpdateItem",  # fenced: queued, attempt given back, a new send id
        "SendMessage",
        "UpdateItem",  # marked sent
        "DeleteMessage",  # the old message
    ]
    resend = s.calls[2].params
    names = {v: k for k, v in resend["ExpressionAttributeNames"].items()}
    assert f"{names['attempt']} = {names['attempt']} - :" in resend["UpdateExpression"]
    values = json.dumps(resend["ExpressionAttributeValues"])
    assert "cap.5" in values and "message_cap" in values and '"5"' in values  # fenced on 5
    assert json.loads(s.calls[3].params["MessageBody"])["send_id"] == "cap.5"
    assert s.event("job_resent")["stage"] == "fetch"
    assert shell.counts["resent"] == 1 and shell.counts["failed"] == 0


def test_the_cap_counts_from_the_receive_never_from_the_send() -> None:
    # A first receive has the whole cap, however long ago it was sent (a backlog) and
    # whatever the worker's wall clock says: the stage deadline is on the lease clock.
    assert cap_budget(replace(delivery(), sent_wall=WALL - 13 * 3600), 3600.0, WALL) == 3600.0
    first = replace(delivery(), first_received_wall=WALL - 13 * 3600)
    assert cap_budget(first, 3600.0, WALL) == 3600.0
    assert cap_budget(delivery(), 3600.0, WALL) == 3600.0  # SQS said nothing: the class's own
    # Received before: what its first receive (SQS's clock) left, never below 0.
    again = replace(first, receive_count=2)
    assert cap_budget(again, 3600.0, WALL) == 0.0
    assert cap_budget(replace(again, first_received_wall=WALL - 60), 3600.0, WALL) == 3600.0
    assert cap_budget(
        replace(again, sent_wall=WALL - 60, first_received_wall=None), 60.0, WALL
    ) == (60.0)


# ----------------------------------------------------------------------------- retry


def _failed_render(token: int = 6) -> dict[str, Any]:
    item = job_item(
        state=JobState.FAILED,
        token=token,
        attempt=3,
        stage="render",
        reason="attempts exhausted (3 of 3); last error: renderer down",
        error_code="attempts_exhausted",
    )
    item["stages"] = {"S": json.dumps([{"stage": "fetch", "result": {"rows": 3}, "token": 5}])}
    return item


def test_a_retry_requeues_the_failed_stage_on_condition_of_its_state_and_token() -> None:
    s = Script(
        [ok({"Item": _failed_render()}), ok({"Attributes": {}}), ok({"MessageId": "m"}), ok()]
    )
    done = s.run(
        retry_failed_flow(T, queue_url=QUEUE, job_id="job-1", wall_now=WALL, send_id="r-1")
    )
    assert [c.op for c in s.calls] == ["GetItem", "UpdateItem", "SendMessage", "UpdateItem"]
    write = s.calls[1].params
    assert condition_equalities(write) == {"state": "failed", "token": 6}
    sets = update_sets(write)
    assert sets["state"] == "'queued'" and sets["attempt"] == "0" and sets["send_id"] == "'r-1'"
    assert "stages" not in sets and "stage" not in sets  # the checkpoints and stage are kept
    body = json.loads(s.calls[2].params["MessageBody"])
    assert (body["stage"], body["send_id"]) == ("render", "r-1")
    assert (done.verdict, done.stage, done.kept) == ("retried", "render", ("fetch",))
    assert s.event("job_retried")["stage"] == "render"


def test_a_second_retry_of_the_same_failure_is_refused_by_the_condition_and_sends_nothing() -> None:
    # Read failed at token 6; meanwhile another operator's retry ran and a worker claimed it.
    moved = job_item(state=JobState.RUNNING, token=7, stage="render")
    s = Script([ok({"Item": _failed_render()}), condition_failed(moved)])
    done = s.run(
        retry_failed_flow(T, queue_url=QUEUE, job_id="job-1", wall_now=WALL, send_id="r-2")
    )
    assert [c.op for c in s.calls] == ["GetItem", "UpdateItem"]
    assert (done.verdict, done.state) == ("nothing_to_do", JobState.RUNNING)


@pytest.mark.parametrize(
    ("stage", "says"),
    [("fetch", "stage 'fetch' of job 'job-1' is committed"), ("publish", "not 'publish'")],
)
def test_a_retry_naming_another_stage_than_the_failed_one_is_refused(stage: str, says: str) -> None:
    s = Script([ok({"Item": _failed_render()})])
    with pytest.raises(RetryRefused, match=says):
        s.run(
            retry_failed_flow(
                T, queue_url=QUEUE, job_id="job-1", wall_now=WALL, send_id="r", stage=stage
            )
        )
    assert [c.op for c in s.calls] == ["GetItem"]


def test_a_cancelled_job_is_not_retried() -> None:
    item = job_item(state=JobState.FAILED, error_code="cancelled", reason="operator")
    s = Script([ok({"Item": item})])
    with pytest.raises(RetryRefused, match="cancelled"):
        s.run(retry_failed_flow(T, queue_url=QUEUE, job_id="job-1", wall_now=WALL, send_id="r"))
