"""Fleet-wide concurrency limits: each slot rule by hand, the flows with a scripted
driver, the attempt flow's hook, and the slot writes on a real moto server."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import replace
from typing import Any

import pytest
from conftest import AwsTestEnv
from core_harness import (
    QUEUE,
    WORKER,
    Script,
    condition_failed,
    delivery,
    job_item,
    job_view,
    ok,
    table,
    unreachable,
)
from pydantic import BaseModel
from test_core_attempt import MONO, Shell, _answers, _run

from sqs_lease import App, ConfigError, JobClassError
from sqs_lease._core.env import SlotEnv
from sqs_lease._core.fifo import deduplication_id
from sqs_lease._core.records import JobState
from sqs_lease._core.slots import (
    HeldSlot,
    Pool,
    SlotView,
    candidates,
    give_back_flow,
    holder_live,
    pools_for,
    take_slots_flow,
    wait_delay,
    wait_send_id,
    waits_of,
)
from sqs_lease._schema.slot_requests import SlotTable

SLOTS = SlotTable("slots-test")
FAST_QUEUE = "https://sqs.test/123/work-interactive"
FIFO_QUEUE = "https://sqs.test/123/work.fifo"


def _slot(key: str, version: int = 0, job: str | None = None, token: int | None = None) -> Any:
    item: dict[str, Any] = {"slot": {"S": key}, "version": {"N": str(version)}}
    if job is not None:
        item["job_id"] = {"S": job}
        item["token"] = {"N": str(token)}
        item["owner"] = {"S": "w-other"}
    return item


def _slots(*items: Any) -> Any:
    return ok({"Responses": {"slots-test": list(items)}})


def _jobs(*items: Any) -> Any:
    return ok({"Responses": {"jobs-test": list(items)}})


OURS = ok({"Item": job_item("job-1", token=5)})
"""Rule 7's read: the record still says running under the claim's token (5)."""


def _take(pools: list[Pool], answers: list[Any]) -> tuple[Script, Any]:
    s = Script(answers)
    grant = s.run(
        take_slots_flow(
            SLOTS, table(), pools=pools, job_id="job-1", token=5, worker_id=WORKER, wall_now=7.0
        )
    )
    return s, grant


# =========================================================================== the rules


def test_a_job_needs_its_classs_pool_then_its_tenants_always_in_that_order() -> None:
    assert pools_for("browse", 2, "acme", 1) == (Pool("class:browse", 2), Pool("tenant:acme", 1))
    assert pools_for("browse", None, "acme", 1) == (Pool("tenant:acme", 1),)
    assert pools_for("browse", 2, None, 1) == (Pool("class:browse", 2),)
    assert pools_for("browse", None, "acme", None) == ()
    assert Pool("class:b", 3).slot_keys() == ["class:b#0", "class:b#1", "class:b#2"]


def test_a_slot_is_held_only_while_its_holder_runs_under_the_token_it_names() -> None:
    held = SlotView("p#0", 3, "job-9", 4)
    running = job_view("job-9", token=4)
    assert holder_live(held, running)
    assert not holder_live(held, job_view("job-9", token=5))  # claimed again: token moved
    for state in (JobState.QUEUED, JobState.SUCCEEDED, JobState.FAILED, JobState.PARKED):
        view = job_view("job-9", token=4)
        assert not holder_live(held, type(view)(**{**view.__dict__, "state": state}))
    assert not holder_live(held, None)  # the record is gone
    assert not holder_live(SlotView("p#0", 4), running)  # given back


def test_free_slots_are_tried_first_stale_ones_after_and_live_or_unread_ones_never() -> None:
    free = SlotView("p#2", 2)
    live = SlotView("p#0", 3, "a", 1)
    stale = SlotView("p#1", 5, "b", 1)
    unread = SlotView("p#3", 1, "c", 1)
    holders = {"a": job_view("a", token=1), "b": job_view("b", token=2)}
    assert candidates([live, stale, free, unread], holders) == [free, stale]
    assert candidates([live, stale, free], None) == [free]  # holders not read: free only


def test_a_waiter_comes_back_sooner_the_longer_it_waited_and_an_interactive_one_sooner() -> None:
    # Rule 6: a newcomer's first wait is short; a second sends it to the back; from
    # there the delay falls with every wait, so the oldest waiter comes back most often.
    assert all(wait_delay(n, r) >= 1 for n in range(60) for r in (0.0, 0.5, 0.999))
    assert wait_delay(0, 0.0) == 1 and wait_delay(0, 0.999) == 2
    assert wait_delay(1, 0.0) == 15 and wait_delay(1, 0.999) == 30
    assert wait_delay(1, 0.0) > wait_delay(2, 0.0) > wait_delay(3, 0.0)
    assert wait_delay(3, 0.999) == wait_delay(50, 0.999) == 8  # the floor
    for n in range(1, 60):
        assert wait_delay(n + 1, 0.999) <= wait_delay(n, 0.0) * 2  # never grows with age
        assert wait_delay(n, 0.5, interactive=True) < wait_delay(n, 0.5)
    # An old batch waiter (4-8 s) never waits longer than a newcomer's second wait.
    assert wait_delay(10, 0.999) < wait_delay(1, 0.0)
    assert wait_delay(3, 0.0) < wait_delay(3, 1.0)  # jittered


def test_a_waits_count_travels_in_the_send_id_and_any_other_send_counts_none() -> None:
    assert wait_send_id(3, 17, "a.b") == "slotwait.3.17.a.b"  # a FIFO dedup id: per job
    assert waits_of(wait_send_id(3, 17, "a.b")) == 3
    for other in (None, "send-1", "stage.4.upload", "sweep.2", "slotwait.x.1.j", "slotwait.1.2"):
        assert waits_of(other) == 0


def test_a_class_limit_or_a_tenant_limit_outside_1_to_100_is_refused_naming_the_field() -> None:
    from pydantic import BaseModel

    class P(BaseModel):
        n: int

    app = App()
    with pytest.raises((JobClassError, ValueError), match="concurrency_limit"):
        app.job("x", payload=P, concurrency_limit=0)(lambda ctx, p: None)
    with pytest.raises(ConfigError, match="tenant_limit=0"):
        App(tenant_limit=0)
    with pytest.raises(ConfigError, match=r"tenant_limits\['big'\]=101"):
        App(tenant_limits={"big": 101})
    limited = App(tenant_limit=2, tenant_limits={"big": 5})
    assert limited.tenant_limit_for("big") == 5 and limited.tenant_limit_for("x") == 2
    assert limited.has_limits and not App().has_limits


# =========================================================================== the flows


def test_a_free_slot_is_taken_only_if_nobody_wrote_it_since_it_was_read() -> None:
    s, grant = _take([Pool("class:ocr", 2)], [_slots(_slot("class:ocr#0", 3, "a", 1)), ok(), OURS])
    assert grant.granted and grant.held == (HeldSlot("class:ocr", "class:ocr#1", "job-1", 5),)
    assert s.ops == ["dynamodb.BatchGetItem", "dynamodb.UpdateItem", "dynamodb.GetItem"]
    assert s.calls[0].params["RequestItems"]["slots-test"]["ConsistentRead"] is True
    take = s.calls[1].params
    assert take["Key"] == {"slot": {"S": "class:ocr#1"}}
    assert "attribute_not_exists" in take["ConditionExpression"]  # never written: version 0


def test_a_full_pool_of_live_holders_makes_the_job_wait_without_writing_anything() -> None:
    full = _slots(_slot("class:ocr#0", 3, "a", 1), _slot("class:ocr#1", 2, "b", 7))
    holders = _jobs(job_item("a", token=1), job_item("b", token=7))
    s, grant = _take([Pool("class:ocr", 2)], [full, holders])
    assert not grant.granted and grant.waiting_for == Pool("class:ocr", 2)
    assert "all 2 slots of class:ocr are held" in grant.why
    assert "dynamodb.UpdateItem" not in s.ops


def test_a_stale_slot_is_taken_over_fenced_by_the_version_it_was_read_at() -> None:
    full = _slots(_slot("class:ocr#0", 3, "a", 1), _slot("class:ocr#1", 9, "dead", 4))
    # "dead"'s worker died: its job was claimed again (token 5), so its slot is stale.
    holders = _jobs(job_item("a", token=1), job_item("dead", token=5))
    s, grant = _take([Pool("class:ocr", 2)], [full, holders, ok(), OURS])
    assert grant.granted and grant.held[0].key == "class:ocr#1"
    take = s.calls[2].params
    assert (
        ":" in take["ConditionExpression"]
        and {"N": "9"} in take["ExpressionAttributeValues"].values()
    )


def test_a_take_another_worker_won_moves_on_to_the_next_candidate() -> None:
    s, grant = _take([Pool("class:ocr", 2)], [_slots(), condition_failed(None), ok(), OURS])
    assert grant.granted and grant.held[0].key == "class:ocr#1"
    assert [c.params["Key"]["slot"]["S"] for c in s.calls[1:3]] == ["class:ocr#0", "class:ocr#1"]


def test_a_job_that_takes_its_classs_slot_but_finds_its_tenant_full_gives_the_first_back() -> None:
    tenant_full = _slots(_slot("tenant:acme#0", 1, "t", 3))
    s, grant = _take(
        [Pool("class:ocr", 1), Pool("tenant:acme", 1)],
        [_slots(), ok(), tenant_full, _jobs(job_item("t", token=3)), ok()],
    )
    assert not grant.granted and grant.waiting_for == Pool("tenant:acme", 1)
    back = s.calls[-1].params
    assert back["Key"] == {"slot": {"S": "class:ocr#0"}} and "REMOVE" in back["UpdateExpression"]
    assert {"S": "job-1"} in back["ExpressionAttributeValues"].values()


@pytest.mark.parametrize(
    ("read", "why"),
    [
        (ok({"Item": job_item("job-1", token=6)}), "moved on while it took its slots"),
        (
            ok({"Item": job_item("job-1", token=6, state=JobState.QUEUED)}),
            "the record is queued under token 6",
        ),
        (ok({}), "the record is gone"),
        (unreachable(), "could not be confirmed"),
    ],
    ids=["taken_over", "given_back", "gone", "unanswered"],
)
def test_a_claim_that_moved_on_while_it_took_its_slots_gives_them_back_and_starts_nothing(
    read: Any, why: str
) -> None:
    """Rule 7 (soak seed 1862836): the slots were taken for token 5; the record no
    longer says running under it (or cannot say): every slot goes back, the job waits
    (rule 4's release is fenced on the token), and no handler starts."""
    s, grant = _take(
        [Pool("class:ocr", 1), Pool("tenant:acme", 1)],
        [_slots(), ok(), _slots(), ok(), read, ok(), ok()],
    )
    assert not grant.granted and why in grant.why
    backs = [c.params for c in s.calls[-2:]]
    assert [b["Key"]["slot"]["S"] for b in backs] == ["class:ocr#0", "tenant:acme#0"]
    assert all("REMOVE" in b["UpdateExpression"] for b in backs)
    assert s.calls[4].params["ConsistentRead"] is True and s.calls[4].op == "GetItem"


def test_a_take_that_got_no_answer_is_given_back_and_the_job_waits() -> None:
    s, grant = _take([Pool("class:ocr", 1)], [_slots(), unreachable(), ok()])
    assert not grant.granted and "no answer" in grant.why
    assert s.ops[-1] == "dynamodb.UpdateItem" and "REMOVE" in s.calls[-1].params["UpdateExpression"]


def test_a_holder_whose_record_cannot_be_read_keeps_its_slot() -> None:
    bad = job_item("x", token=1)
    bad["state"] = {"S": "exploded"}
    s, grant = _take([Pool("class:ocr", 1)], [_slots(_slot("class:ocr#0", 2, "x", 1)), _jobs(bad)])
    assert not grant.granted
    assert "dynamodb.UpdateItem" not in s.ops


def test_a_give_back_is_conditioned_on_the_holder_so_a_late_one_changes_nothing() -> None:
    s = Script([condition_failed(None)])
    given = s.run(give_back_flow(SLOTS, [HeldSlot("p", "p#0", "job-1", 5)], wall_now=1.0))
    assert given == 0
    values = s.calls[0].params["ExpressionAttributeValues"].values()
    assert {"S": "job-1"} in values and {"N": "5"} in values


class Order(BaseModel):
    order: str


# =========================================================================== the attempt flow


def _limited(shell: Shell, limit: int = 1) -> Shell:
    shell.env.slots = SlotEnv(SLOTS, lambda c: limit, lambda t: None)
    return shell


def test_a_job_with_no_slot_free_gives_its_claim_back_uncounted_and_waits_as_a_fresh_message() -> (
    None
):
    # Rule 4: the wait is a new message (a new send id, its wait as its delay), so the
    # redrive, which counts one message's receives, never counts a wait.
    ran: list[Any] = []
    shell = _limited(Shell(lambda run: ran.append(run)))
    full = _slots(_slot("class:ocr#0", 3, "a", 1))
    s = _run(
        shell,
        _answers(full, _jobs(job_item("a", token=1)), ok(), ok({"MessageId": "m-2"}), ok(), ok()),
    )
    assert ran == []  # the handler never ran
    assert [c.op for c in s.calls] == [
        "UpdateItem",  # claim
        "BatchGetItem",  # the pool
        "BatchGetItem",  # its holder's record
        "UpdateItem",  # the claim given back, the next send id named
        "SendMessage",  # the fresh message, delayed by the wait
        "UpdateItem",  # marked sent
        "DeleteMessage",  # the received message, retired
    ]
    release = s.calls[3].params
    assert release["TableName"] == "jobs-test"
    assert " - " in release["UpdateExpression"]  # the attempt its claim counted, given back
    values = release["ExpressionAttributeValues"].values()
    assert {"S": "queued"} in values and {"S": "slotwait.1.5.job-1"} in values
    assert {"BOOL": False} in values  # unsent until the fresh message is out: the sweep's
    sent = s.calls[4].params
    assert sent["QueueUrl"] == QUEUE and sent["DelaySeconds"] == wait_delay(0, 0.5)
    assert json.loads(sent["MessageBody"])["send_id"] == "slotwait.1.5.job-1"
    assert {"S": "slotwait.1.5.job-1"} in s.calls[5].params["ExpressionAttributeValues"].values()
    assert s.calls[6].params == {"QueueUrl": QUEUE, "ReceiptHandle": "rh-1"}
    waiting = s.event("job_waiting_for_slot")
    assert (waiting["pool"], waiting["limit"], waiting["token"]) == ("class:ocr", 1, 5)
    assert (waiting["waits"], waiting["delay"]) == (0, wait_delay(0, 0.5))
    assert shell.counts == Counter(claimed=1, waited_for_slot=1)
    assert len(shell.book) == 0


def test_a_job_that_waited_before_waits_by_its_seniority_not_its_receive_count() -> None:
    shell = _limited(Shell(lambda run: None))
    full = _slots(_slot("class:ocr#0", 3, "a", 1))
    # Its fourth wait, on the fresh message's first receive.
    item = delivery(send_id=wait_send_id(3, 4, "job-1"), receive_count=1)
    claimed = ok(
        {"Attributes": job_item(state=JobState.QUEUED, owner=None, token=4, send_id=item.send_id)}
    )
    s = _run(
        shell,
        [claimed, full, _jobs(job_item("a", token=1)), ok(), ok({"MessageId": "m"}), ok(), ok()],
        item,
    )
    sent = s.calls[4].params
    assert sent["DelaySeconds"] == wait_delay(3, 0.5)
    assert json.loads(sent["MessageBody"])["send_id"] == "slotwait.4.5.job-1"


def test_an_interactive_waiter_goes_back_to_the_interactive_queue_waiting_half_as_long() -> None:
    shell = _limited(Shell(lambda run: None))
    shell.env.interactive_url = FAST_QUEUE
    full = _slots(_slot("class:ocr#0", 3, "a", 1))
    item = replace(delivery(), queue_url=FAST_QUEUE)
    s = _run(
        shell,
        _answers(full, _jobs(job_item("a", token=1)), ok(), ok({"MessageId": "m"}), ok(), ok()),
        item,
    )
    sent = s.calls[4].params
    assert sent["QueueUrl"] == FAST_QUEUE
    assert sent["DelaySeconds"] == wait_delay(0, 0.5, interactive=True)
    assert s.calls[6].params["QueueUrl"] == FAST_QUEUE


def test_a_fifo_waiter_sends_at_once_and_its_retired_message_holds_the_group_for_the_wait() -> None:
    # No per-message delay on a FIFO queue: the received message stays in flight for
    # the wait (its group waits behind it) and then goes as a stray.
    shell = _limited(Shell(lambda run: None))
    shell.env.queue_url = FIFO_QUEUE
    full = _slots(_slot("class:ocr#0", 3, "a", 1))
    s = _run(
        shell,
        _answers(full, _jobs(job_item("a", token=1)), ok(), ok({"MessageId": "m"}), ok(), ok()),
    )
    sent = s.calls[4].params
    assert "DelaySeconds" not in sent
    assert sent["MessageDeduplicationId"] == deduplication_id("job-1", "slotwait.1.5.job-1")
    assert s.calls[6].op == "ChangeMessageVisibility"
    assert s.calls[6].params["VisibilityTimeout"] == wait_delay(0, 0.5)


def test_a_waiter_whose_send_fails_leaves_its_record_unsent_for_the_sweep_and_no_message() -> None:
    shell = _limited(Shell(lambda run: None))
    full = _slots(_slot("class:ocr#0", 3, "a", 1))
    s = _run(
        shell,
        _answers(full, _jobs(job_item("a", token=1)), ok(), unreachable(), ok(), ok()),
    )
    assert [c.op for c in s.calls][4:] == ["SendMessage", "UpdateItem", "DeleteMessage"]
    assert "REMOVE" in s.calls[5].params["UpdateExpression"]  # the right to send given back
    assert s.event("job_send_failed")["send_id"] == "slotwait.1.5.job-1"


def test_a_waiter_whose_claim_was_taken_over_sends_nothing_and_leaves_the_message() -> None:
    shell = _limited(Shell(lambda run: None))
    full = _slots(_slot("class:ocr#0", 3, "a", 1))
    moved = condition_failed(job_item(token=6, owner="w-other"))
    s = _run(shell, _answers(full, _jobs(job_item("a", token=1)), moved))
    assert [c.op for c in s.calls] == ["UpdateItem", "BatchGetItem", "BatchGetItem", "UpdateItem"]
    assert s.event("job_release_skipped")["token"] == 5
    assert shell.counts == Counter(claimed=1, waited_for_slot=1)


def test_a_job_that_takes_its_slot_runs_and_gives_the_slot_back_after_its_end() -> None:
    during: list[int] = []

    def handler(run: Any) -> Any:
        during.append(len(shell.book))
        return {"text": "ok"}

    shell = _limited(Shell(handler))
    claimed_now = ok({"Item": job_item(token=5)})  # the claim moved token 4 to 5
    s = _run(shell, _answers(_slots(), ok(), claimed_now, ok(), ok(), ok()))
    assert during == [1]
    assert [c.op for c in s.calls] == [
        "UpdateItem",  # claim (the receive's lease kept: no visibility change)
        "BatchGetItem",  # the pool
        "UpdateItem",  # take the slot
        "GetItem",  # rule 7: the claim is still the record's
        "UpdateItem",  # commit
        "DeleteMessage",
        "UpdateItem",  # give the slot back
    ]
    assert s.calls[-1].params["TableName"] == "slots-test"
    assert shell.counts["committed"] == 1


def test_a_stage_takes_its_slot_from_its_own_pool_under_its_own_limit() -> None:
    # A staged job's "upload" stage declares concurrency_limit=1; its job class (the
    # head stage) declares none. The stage's limit applies, in a pool of its own.
    ran: list[Any] = []
    shell = Shell(lambda run: ran.append(run))
    shell.env.stage_rules_of = lambda job_class, stage: shell.env.rules_of(job_class)
    shell.env.slots = SlotEnv(
        SLOTS,
        lambda c: None,
        lambda t: None,
        lambda c, stage: (stage, 1) if stage == "upload" else None,
    )
    full = _slots(_slot("class:ocr:upload#0", 3, "a", 1))
    claimed = ok(
        {
            "Attributes": job_item(
                state=JobState.QUEUED, owner=None, token=4, attempt=0, stage="upload"
            )
        }
    )
    s = _run(
        shell,
        [claimed, full, _jobs(job_item("a", token=1)), ok(), ok({"MessageId": "m"}), ok(), ok()],
    )
    assert ran == []  # the other upload holds the stage's one slot
    keys = s.calls[1].params["RequestItems"]["slots-test"]["Keys"]
    assert keys == [{"slot": {"S": "class:ocr:upload#0"}}]
    waiting = s.event("job_waiting_for_slot")
    assert (waiting["pool"], waiting["limit"]) == ("class:ocr:upload", 1)


def test_an_app_reports_each_stages_own_limit_and_needs_the_slots_table_for_it() -> None:
    app = App()
    report = app.staged("report", payload=Order)

    @report.stage("fetch")
    def fetch(ctx: Any, p: Order) -> Any:
        return None

    @report.stage("upload", concurrency_limit=2)
    def upload(ctx: Any, p: Any) -> Any:
        return None

    assert app.has_limits  # a worker needs the slots table for the upload stage
    assert app.class_limit_for("report") is None  # the job class: its first stage
    assert (app.stage_limit_for("report", "fetch"), app.stage_limit_for("report", "upload")) == (
        None,
        ("upload", 2),
    )


class Mail(BaseModel):
    to: str


def test_a_planned_tools_limit_is_one_pool_whatever_the_step_that_calls_it() -> None:
    # Defect 7 of issue 26: the pool was the step's (CLASS:N-tool), so two plans calling
    # the tool at different steps each had a limit of their own.
    app = App()
    research = app.planned("research")

    @research.tool("mail", args=Mail, concurrency_limit=1)
    def mail(ctx: Any, args: Mail) -> Any:
        return None

    ran: list[Any] = []
    shell = Shell(lambda run: ran.append(run))
    shell.env.stage_rules_of = lambda job_class, stage: shell.env.rules_of(job_class)
    shell.env.slots = SlotEnv(SLOTS, app.class_limit_for, app.tenant_limit_for, app.stage_limit_for)
    # Another plan's step 1 holds the tool's one slot; this job is at its step 3.
    full = _slots(_slot("class:research:mail#0", 3, "a", 1))
    claimed = ok(
        {
            "Attributes": job_item(
                state=JobState.QUEUED,
                owner=None,
                token=4,
                attempt=0,
                job_class="research",
                stage="3-mail",
            )
        }
    )
    s = _run(
        shell,
        [claimed, full, _jobs(job_item("a", token=1)), ok(), ok({"MessageId": "m"}), ok(), ok()],
    )
    assert ran == []  # the tool's one slot is held by the other plan's step
    keys = s.calls[1].params["RequestItems"]["slots-test"]["Keys"]
    assert keys == [{"slot": {"S": "class:research:mail#0"}}]
    waiting = s.event("job_waiting_for_slot")
    assert (waiting["pool"], waiting["limit"]) == ("class:research:mail", 1)


def test_without_limits_the_attempt_makes_no_slot_call() -> None:
    shell = Shell()
    shell.env.slots = SlotEnv(SLOTS, lambda c: None, lambda t: None)
    s = _run(shell, _answers(ok(), ok()))
    assert all(c.params.get("TableName") != "slots-test" for c in s.calls)
    assert MONO  # the shared shell's clock


# =========================================================================== real moto


@pytest.mark.integration
def test_two_takers_of_one_slot_version_on_dynamodb_one_wins_and_a_stale_give_back_is_refused(
    aws: AwsTestEnv,
) -> None:
    import boto3

    from sqs_lease import Settings
    from sqs_lease._resources import create_tables

    settings = Settings(endpoint_url=aws.endpoint_url, prefix=aws.prefix)
    create_tables(settings)
    ddb = boto3.client("dynamodb", endpoint_url=aws.endpoint_url, region_name="us-east-1")
    req = SlotTable(settings.slots_table)

    def do(c: Any) -> Any:
        try:
            return getattr(ddb, _snake(c.op))(**c.params)
        except ddb.exceptions.ConditionalCheckFailedException:
            return None

    first = req.take("p#0", seen_version=0, job_id="a", token=1, worker_id="w1", wall_now=1.0)
    second = req.take("p#0", seen_version=0, job_id="b", token=1, worker_id="w2", wall_now=1.0)
    assert do(first) is not None and do(second) is None
    (item,) = req.items(do(req.read(["p#0", "p#1"])))
    view = req.parse(item)
    assert (view.job_id, view.token, view.version) == ("a", 1, 1)
    # b takes it over at the version it read (a's job moved on); a's late give-back fails
    over = req.take("p#0", seen_version=1, job_id="b", token=3, worker_id="w2", wall_now=2.0)
    assert do(over) is not None
    assert do(req.give_back("p#0", job_id="a", token=1, wall_now=3.0)) is None
    assert do(req.give_back("p#0", job_id="b", token=3, wall_now=3.0)) is not None
    (item,) = req.items(do(req.read(["p#0"])))
    assert req.parse(item).free and req.parse(item).version == 3


def _snake(op: str) -> str:
    return "".join("_" + ch.lower() if ch.isupper() else ch for ch in op).lstrip("_")
