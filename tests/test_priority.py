"""Priorities: the weighted receive order by hand, and a real worker serving the
interactive queue first without starving the batch queue (moto over HTTP)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from conftest import AwsTestEnv
from core_harness import Script, ok
from pydantic import BaseModel
from worker_helpers import collect_journal

from sqs_lease import App, JobContext, Producer, Settings, Worker, create_queue
from sqs_lease._core.calls import Call, Outcome
from sqs_lease._core.priority import (
    LOWER_POLL_SECONDS,
    WEIGHTS,
    receive_order,
    receive_prioritized_flow,
)
from sqs_lease._errors import ConfigError
from sqs_lease._resources import create_tables

FAST, SLOW = "https://q/fast", "https://q/slow"


def _msg(job: str) -> dict[str, Any]:
    body = json.dumps({"v": 1, "job_id": job, "job_class": "c"})
    return {"MessageId": f"m-{job}", "ReceiptHandle": f"rh-{job}", "Body": body}


def test_of_every_four_receives_three_ask_interactive_first_and_one_asks_batch_first() -> None:
    firsts = [receive_order(turn)[0] for turn in range(8)]
    assert firsts == [0, 0, 0, 1, 0, 0, 0, 1]
    assert receive_order(3) == [1, 0]
    with pytest.raises(ValueError, match="weight of 1 or more"):
        receive_order(0, (3, 0))


def test_a_receive_takes_the_first_queue_of_its_turn_with_messages_and_tags_its_queue() -> None:
    s = Script([ok({}), ok({"Messages": [_msg("b1")]})])
    got = s.run(
        receive_prioritized_flow(
            queue_urls=[FAST, SLOW], turn=0, max_messages=5, wait_seconds=2, visibility=30
        )
    )
    assert [c.params["QueueUrl"] for c in s.calls] == [FAST, SLOW]
    assert [c.params["WaitTimeSeconds"] for c in s.calls] == [0, 0]  # short polls
    assert got[0].queue_url == SLOW  # its visibility and delete go to the batch queue


def test_on_batchs_turn_the_batch_queue_is_asked_first() -> None:
    s = Script([ok({"Messages": [_msg("b1")]})])
    s.run(
        receive_prioritized_flow(
            queue_urls=[FAST, SLOW], turn=3, max_messages=5, wait_seconds=2, visibility=30
        )
    )
    assert [c.params["QueueUrl"] for c in s.calls] == [SLOW]


def test_with_both_queues_empty_the_worker_long_polls_the_interactive_one() -> None:
    s = Script([ok({}), ok({}), ok({})])
    assert (
        s.run(
            receive_prioritized_flow(
                queue_urls=[FAST, SLOW], turn=1, max_messages=5, wait_seconds=2, visibility=30
            )
        )
        == []
    )
    assert (s.calls[-1].params["QueueUrl"], s.calls[-1].params["WaitTimeSeconds"]) == (FAST, 2)


def test_a_sparse_batch_queue_short_polls_miss_is_received_within_one_round() -> None:
    # AWS answers a short poll from a sample of its servers: a queue holding one
    # message may answer it empty every time, while a long poll (1 s or more) asks
    # every server. Here the batch queue's one message is seen by long polls only.
    def answer(c: Call) -> Outcome:
        if c.params["QueueUrl"] == SLOW and c.params["WaitTimeSeconds"] >= 1:
            return ok({"Messages": [_msg("b1")]})
        return ok({})

    received = []
    for turn in range(sum(WEIGHTS)):
        s = Script(answer)
        got = s.run(
            receive_prioritized_flow(
                queue_urls=[FAST, SLOW], turn=turn, max_messages=5, wait_seconds=20, visibility=30
            )
        )
        polls = [(c.params["QueueUrl"], c.params["WaitTimeSeconds"]) for c in s.calls]
        if got:
            received.append(turn)
            # On its own turn the batch queue is long-polled for the shortest wait.
            assert polls == [(SLOW, LOWER_POLL_SECONDS)]
        else:  # interactive's turns: the batch queue's ask stays a short poll
            assert polls == [(FAST, 0), (SLOW, 0), (FAST, 20)]
    assert received == [3]  # within one round of receives, however few messages wait


def test_a_worker_configured_without_long_polls_keeps_its_short_polls() -> None:
    s = Script([ok({}), ok({}), ok({})])
    s.run(
        receive_prioritized_flow(
            queue_urls=[FAST, SLOW], turn=3, max_messages=5, wait_seconds=0, visibility=30
        )
    )
    assert [c.params["WaitTimeSeconds"] for c in s.calls] == [0, 0, 0]


def test_one_queue_is_one_long_poll_as_before() -> None:
    s = Script([ok({})])
    s.run(
        receive_prioritized_flow(
            queue_urls=[SLOW], turn=0, max_messages=5, wait_seconds=2, visibility=30
        )
    )
    assert len(s.calls) == 1 and s.calls[0].params["WaitTimeSeconds"] == 2


# =========================================================================== real moto


class N(BaseModel):
    n: int


@pytest.mark.integration
def test_a_worker_serves_interactive_jobs_first_and_still_gives_batch_its_turn(
    aws: AwsTestEnv,
) -> None:
    settings = Settings(endpoint_url=aws.endpoint_url, prefix=aws.prefix)
    create_tables(settings)
    create_queue(settings, visibility=10, interactive=True)
    app = App()

    @app.job("c", payload=N, lease_seconds=10, heartbeat_seconds=2.0, jitter_seconds=1.0)
    def c(ctx: JobContext[Any], p: N) -> dict[str, int]:
        return {"n": p.n}

    p = Producer(settings, app)
    batch = [p.submit("c", {"n": n}, f"batch-{n}").job_id for n in range(8)]
    fast = [
        p.submit("c", {"n": 100 + n}, f"fast-{n}", priority="interactive").job_id for n in range(4)
    ]
    worker = Worker(app, settings, concurrency=1, receive_wait=1, sweep_interval=None)
    assert worker.queue_urls[0].endswith(f"{settings.queue}-interactive")
    with collect_journal() as journal:
        stats = worker.run(max_messages=12, idle_exit=10)
    assert stats.committed == 12
    order = [e["job_id"] for e in journal.events("job_claimed")]
    # Interactive first: all four within the first five claims...
    assert max(order.index(j) for j in fast) <= 4, order
    # ...and batch still got its turn among them (one receive in four asks it first).
    assert any(j in batch for j in order[:4]), order
    # Their deletes went to the queue each came from: nothing is left on either queue.
    import boto3

    sqs = boto3.client("sqs", endpoint_url=aws.endpoint_url, region_name="us-east-1")
    for url in worker.queue_urls:
        attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
        assert attrs["ApproximateNumberOfMessages"] == "0"
        assert attrs["ApproximateNumberOfMessagesNotVisible"] == "0"


def test_an_unknown_priority_is_refused_naming_the_field(aws: AwsTestEnv) -> None:
    settings = Settings(endpoint_url=aws.endpoint_url, prefix=aws.prefix)
    with pytest.raises(ConfigError, match="priority='urgent'"):
        Producer(settings).submit("c", {"n": 1}, "x", priority="urgent")  # type: ignore[arg-type]


# --------------------------------------------------------------------------- re-sends


def _interactive_item(**extra: Any) -> dict[str, Any]:
    from core_harness import job_item

    from sqs_lease._core.records import JobState

    item = job_item(state=JobState.QUEUED, owner=None, token=2, message_sent=False, **extra)
    item["priority"] = {"S": "interactive"}
    return item


INTERACTIVE = "https://sqs.test/123/work-interactive"


def test_the_sweep_sends_an_interactive_job_back_to_the_interactive_queue() -> None:
    from core_harness import QUEUE, table

    from sqs_lease._core.sweeping import sweep_flow

    stranded = _interactive_item(unsent_since=1.0)
    s = Script(
        [ok({"Items": [stranded]}), ok({"Attributes": stranded}), ok({"MessageId": "m"}), ok()]
    )
    s.run(
        sweep_flow(
            table(),
            queue_url=QUEUE,
            wall_now=500.0,
            older_than=60.0,
            limit=10,
            send_id_prefix="sw",
            interactive_url=INTERACTIVE,
        )
    )
    (send,) = [c for c in s.calls if c.op == "SendMessage"]
    assert send.params["QueueUrl"] == INTERACTIVE  # not the batch queue: it keeps its priority


def test_a_resumed_interactive_job_goes_back_to_the_interactive_queue() -> None:
    from core_harness import QUEUE, table

    from sqs_lease._core.resuming import resume_flow

    resumed = _interactive_item()
    s = Script([ok({"Attributes": resumed}), ok({"MessageId": "m"}), ok()])
    s.run(
        resume_flow(
            table(),
            queue_url=QUEUE,
            job_id="job-1",
            wall_now=500.0,
            send_id="r-1",
            interactive_url=INTERACTIVE,
        )
    )
    (send,) = [c for c in s.calls if c.op == "SendMessage"]
    assert send.params["QueueUrl"] == INTERACTIVE


@pytest.mark.integration
def test_an_interactive_job_resumed_from_the_cli_is_sent_to_the_interactive_queue(
    aws: AwsTestEnv, ddb_client: Any, sqs_client: Any
) -> None:
    from test_stranded import _cli

    settings = Settings(endpoint_url=aws.endpoint_url, prefix=aws.prefix)
    create_tables(settings)
    create_queue(settings, visibility=10, interactive=True)
    producer = Producer(settings)
    job_id = producer.submit("c", {"n": 1}, priority="interactive").job_id
    # Its message is taken (and dropped); an operator parks the job, then resumes it.
    got = sqs_client.receive_message(QueueUrl=producer.interactive_url, WaitTimeSeconds=1)
    sqs_client.delete_message(
        QueueUrl=producer.interactive_url, ReceiptHandle=got["Messages"][0]["ReceiptHandle"]
    )
    ddb_client.update_item(
        TableName=settings.jobs_table,
        Key={"job_id": {"S": job_id}},
        UpdateExpression="SET #s = :p",
        ExpressionAttributeNames={"#s": "state"},
        ExpressionAttributeValues={":p": {"S": "parked"}},
    )
    out = _cli(settings, "jobs", "resume", job_id)
    assert out.exit_code == 0, out.output
    batch = sqs_client.receive_message(QueueUrl=producer.queue_url, WaitTimeSeconds=0)
    assert not batch.get("Messages")  # not sent to the batch queue
    got = sqs_client.receive_message(QueueUrl=producer.interactive_url, WaitTimeSeconds=1)
    (message,) = got["Messages"]
    assert json.loads(message["Body"])["job_id"] == job_id
    item = ddb_client.get_item(TableName=settings.jobs_table, Key={"job_id": {"S": job_id}})
    assert item["Item"]["priority"] == {"S": "interactive"}  # the record says where it belongs
