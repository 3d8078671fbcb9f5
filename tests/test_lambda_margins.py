"""The Lambda consumer's margins (issue 27): a record the time left cannot hold waits
as a fresh message, not straight back into the same wave of batches;
and the receives an attempt spends before it starts stay few (measured with an
event source emulated on moto: receive a batch, invoke, repeat)."""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

from conftest import AwsTestEnv
from test_aws_lambda import BUDGET, RunningDown, Work, batch, job_of
from worker_helpers import HANG_GUARD, collect_journal, prepare

from sqs_lease import App, JobContext, Producer
from sqs_lease._core.eventsource import (
    END_MARGIN_SECONDS,
    batch_size_for,
    can_start,
    not_started_visibility,
)
from sqs_lease.aws_lambda import handler

if TYPE_CHECKING:
    from types_boto3_sqs import SQSClient


def test_a_record_not_started_for_the_budget_waits_as_a_fresh_message(
    aws: AwsTestEnv, sqs_client: SQSClient
) -> None:
    # A record the time left cannot hold is not handed back to be received again
    # (every receive brings it nearer the DLQ): it waits as a fresh message, and the
    # one received is retired (slots rule 4, invocation.unstarted_wait_flow).
    context = RunningDown(600.0)
    left_after_first = 8.5  # the longest run that still leaves the next unstarted

    def work(p: Work) -> dict[str, int]:
        # The first record leaves 8.5 s: less than the next one's 6 s budget + margin.
        context.spend(context.get_remaining_time_in_millis() / 1000 - left_after_first)
        return {"n": p.n}

    b = batch(aws, sqs_client, work, 3)
    _, *rest = b.event["Records"]
    with collect_journal() as journal:
        b.run(b.event, context)
    waits = journal.events("lambda_record_waits")
    assert sorted(e["job_id"] for e in waits) == sorted(job_of(r) for r in rest)
    # Each job comes back once, under a message of its own: never the one received
    # (its receive count starts again), and never twice.
    back: dict[str, tuple[str, int]] = {}
    deadline = time.monotonic() + HANG_GUARD
    while len(back) < len(rest) and time.monotonic() < deadline:
        out = sqs_client.receive_message(
            QueueUrl=b.url,
            MaxNumberOfMessages=10,
            WaitTimeSeconds=1,
            VisibilityTimeout=60,
            MessageSystemAttributeNames=["ApproximateReceiveCount"],
        )
        for m in out.get("Messages", []):
            job = json.loads(m["Body"])["job_id"]
            assert job not in back, f"{job} came back twice"
            back[job] = (m["MessageId"], int(m["Attributes"]["ApproximateReceiveCount"]))
    assert set(back) == {job_of(r) for r in rest} <= set(b.job_ids)
    old = {r["messageId"] for r in rest}
    assert all(mid not in old and count == 1 for mid, count in back.values()), back


def test_the_release_outlasts_the_invocation() -> None:
    assert not_started_visibility(3_200) == 4
    assert not_started_visibility(0) == 1
    assert not_started_visibility(60_000) == 60


class _Invocation:
    """A Lambda context whose time runs down only by what handlers spend: the
    measure counts receives, never this machine's speed."""

    def __init__(self, seconds: float) -> None:
        self._left = seconds

    def spend(self, seconds: float) -> None:
        self._left -= seconds

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int(self._left * 1000))


def _receives_per_attempt(aws: AwsTestEnv, sqs: SQSClient, batch_size: int, jobs: int) -> list[int]:
    """An event source emulated: receive up to ``batch_size`` messages, invoke the
    function (a fresh 10 s invocation, each handler using its whole 6 s budget),
    repeat until every job ran. The receive count each job's claim saw."""
    settings, url, _ = prepare(aws.endpoint_url, f"{aws.prefix}b{batch_size}")
    app = App()
    timeout = 10.0
    contexts: list[_Invocation] = []

    @app.job("work", payload=Work, **BUDGET)
    def work(ctx: JobContext[Work], p: Work) -> dict[str, int]:
        contexts[-1].spend(BUDGET["stage_budget_seconds"])
        return {"n": p.n}

    producer = Producer(settings, app)
    for i in range(jobs):
        producer.submit("work", Work(n=i), job_id=f"{aws.prefix}-b{batch_size}-{i}")
    run = handler(app, settings)
    arn = f"arn:aws:sqs:us-east-1:123456789012:{settings.queue}"
    with collect_journal() as journal:
        deadline = time.monotonic() + 4 * HANG_GUARD
        while len(journal.events("result_committed")) < jobs and time.monotonic() < deadline:
            got = sqs.receive_message(
                QueueUrl=url,
                MaxNumberOfMessages=batch_size,
                WaitTimeSeconds=1,
                VisibilityTimeout=60,
                MessageSystemAttributeNames=["All"],
            ).get("Messages", [])
            if not got:
                continue
            records: list[dict[str, Any]] = [
                {
                    "messageId": m["MessageId"],
                    "receiptHandle": m["ReceiptHandle"],
                    "body": m["Body"],
                    "attributes": dict(m.get("Attributes", {})),
                    "eventSource": "aws:sqs",
                    "eventSourceARN": arn,
                }
                for m in got
            ]
            contexts.append(_Invocation(timeout))
            run({"Records": records}, contexts[-1])
        waits = journal.events("lambda_record_waits")
    assert len(journal.events("result_committed")) == jobs
    # A record not started waits as a fresh message (its receive count starts again):
    # the deliveries a job took before its attempt are its waits plus the one it ran.
    per_job = {f"{aws.prefix}-b{batch_size}-{i}": 1 for i in range(jobs)}
    for e in waits:
        per_job[e["job_id"]] += 1
    return sorted(per_job.values())


def test_the_batch_size_rule_keeps_each_attempt_to_one_receive_measured(
    aws: AwsTestEnv, sqs_client: SQSClient
) -> None:
    jobs = 4
    fitted = batch_size_for(10.0, [BUDGET["stage_budget_seconds"]])
    assert fitted == 1
    # A batch of 10 (the event source's default): one record starts per invocation,
    # the rest are received and wait to be received again (how they come back
    # together depends on their waits' delays, so only the bounds are fixed).
    before = _receives_per_attempt(aws, sqs_client, 10, jobs)
    after = _receives_per_attempt(aws, sqs_client, fitted, jobs)
    assert before[0] == 1 and max(before) > 1 and max(before) <= jobs, before
    assert after == [1, 1, 1, 1], after


def test_the_batch_size_is_what_starts_back_to_back_at_whole_budgets() -> None:
    for timeout, budgets in [(300, [240.0, 280.0]), (300, [20.0]), (60, [10.0, 25.0])]:
        n = batch_size_for(timeout, budgets)
        longest = max(budgets)
        left = timeout * 1000.0
        for _ in range(n):
            assert can_start(int(left), longest)
            left -= longest * 1000
        assert n == 10 or not can_start(int(left), longest)
    assert batch_size_for(900, []) == 10
    assert END_MARGIN_SECONDS > 0
