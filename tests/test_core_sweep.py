"""The sweep with a time budget (a scheduled Lambda sweep, issue 33 item 1), driven by
hand (no AWS): it pages through the ``unsent`` index to its end, past records it
cannot send, stops starting pages when its time runs short, and receives from the
DLQ while time is left; without a budget it is a worker's one-page sweep."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from core_harness import DLQ, QUEUE, WORKER, Script, condition_failed, job_item, ok, table

from sqs_lease._core.calls import Call, Outcome
from sqs_lease._core.deadletter import reconcile_dlq_flow
from sqs_lease._core.env import AttemptEnv, Now
from sqs_lease._core.leasebook import Flag, LeaseBook
from sqs_lease._core.messages import message_body
from sqs_lease._core.records import JobState
from sqs_lease._core.sweeps import SWEEP_PAGE_SECONDS, SweepRun, sweep_once_flow, sweep_pages_flow
from sqs_lease._schema.intent_requests import IntentTable

MONO = 1000.0
WALL = 1_700_000_100.0


class Clock:
    """The shell's lease clock: each reading moves it on by ``step`` seconds."""

    def __init__(self, step: float = 0.0) -> None:
        self.mono = MONO
        self.step = step

    def now(self) -> Now:
        self.mono += self.step
        return Now(self.mono, WALL)


def env(clock: Clock, *, dlq: bool = False) -> tuple[AttemptEnv, Counter[str]]:
    counts: Counter[str] = Counter()

    def tally(name: str, n: int) -> None:
        counts[name] += n

    return (
        AttemptEnv(
            table=table(),
            intents=IntentTable("intents-test", "attempts-test"),
            queue_url=QUEUE,
            dlq_url=DLQ if dlq else None,
            worker_id=WORKER,
            book=LeaseBook(),
            rules_of=lambda name: None,
            receive_visibility=30,
            unknown_class_receives=5,
            now=clock.now,
            random=lambda: 0.5,
            write_id=lambda: "nonce",
            tally=tally,
            new_signal=Flag,
            run_handler=lambda run: None,
        ),
        counts,
    )


def unsent(job_id: str, since: float) -> dict[str, Any]:
    item = job_item(
        job_id,
        state=JobState.QUEUED,
        owner=None,
        token=0,
        attempt=0,
        send_id="send-1",
        unsent_since=since,
    )
    keep = ("job_id", "unsent", "unsent_since", "job_class", "state", "send_id", "message_sent")
    return {k: v for k, v in item.items() if k in keep}


def key_of(item: dict[str, Any]) -> dict[str, Any]:
    return {k: item[k] for k in ("job_id", "unsent", "unsent_since")}


class Index:
    """The ``unsent`` index as DynamoDB pages it: ``Limit`` items after the
    ``ExclusiveStartKey``, a ``LastEvaluatedKey`` when the page is full. Records in
    ``stuck`` cannot be taken (their take fails its condition: moved); the others
    are taken and sent, and leave the index."""

    def __init__(self, items: list[dict[str, Any]], stuck: set[str]) -> None:
        self.items = items
        self.stuck = stuck
        self.sent: list[str] = []

    def __call__(self, c: Call) -> Outcome:
        if c.op == "Query":
            # The key condition's bound on unsent_since: at most (the age query) or
            # after (the query for entries stamped ahead of the sweeper's clock).
            bound = c.params["ExpressionAttributeValues"].get(":t")
            items = [
                i
                for i in self.items
                if bound is None or float(i["unsent_since"]["N"]) > float(bound["N"])
            ]
            start = c.params.get("ExclusiveStartKey")
            at = 0 if start is None else [key_of(i) for i in items].index(start) + 1
            page = items[at : at + c.params["Limit"]]
            out: dict[str, Any] = {"Items": page}
            if len(page) == c.params["Limit"]:
                out["LastEvaluatedKey"] = key_of(page[-1])
            return ok(out)
        if c.op == "UpdateItem":
            job_id = c.params["Key"]["job_id"]["S"]
            if job_id in self.stuck:
                return condition_failed(job_item(job_id, state=JobState.RUNNING))
            taken = job_item(job_id, state=JobState.QUEUED, owner=None, token=0, attempt=0)
            return ok({"Attributes": taken})
        if c.op == "SendMessage":
            self.sent.append(c.params["MessageBody"])
            return ok({"MessageId": f"m-{len(self.sent)}"})
        raise AssertionError(f"unexpected call {c.op}")


def _index(n_stuck: int, n_ok: int) -> Index:
    stuck = [unsent(f"stuck-{i}", WALL - 900 + i) for i in range(n_stuck)]
    fine = [unsent(f"ok-{i}", WALL - 600 + i) for i in range(n_ok)]
    return Index(stuck + fine, {str(i["job_id"]["S"]) for i in stuck})


def _age_queries(s: Script) -> list[Call]:
    return [q for q in s.calls_to("Query") if "#t >" not in q.params["KeyConditionExpression"]]


def _sent_jobs(index: Index) -> list[str]:
    return [str(json.loads(body)["job_id"]) for body in index.sent]


def test_a_timed_sweep_pages_past_records_it_cannot_send_to_the_end_of_the_index() -> None:
    # Regression: a sweep that re-queried the oldest page stopped at a page of
    # records it could not send; the ones behind them were never sent.
    index = _index(n_stuck=4, n_ok=3)
    e, counts = env(Clock())
    s = Script(index)
    run: SweepRun = s.run(
        sweep_pages_flow(e, older_than=60, limit=2, send_id_prefix="sw", until=MONO + 600)
    )
    assert sorted(_sent_jobs(index)) == ["ok-0", "ok-1", "ok-2"]
    assert (run.resent, run.found, run.pages, run.more, run.failed) == (3, 7, 4, False, ())
    queries = _age_queries(s)
    assert [q.params.get("ExclusiveStartKey") for q in queries] == [
        None,
        key_of(index.items[1]),
        key_of(index.items[3]),
        key_of(index.items[5]),
    ]
    # Every page's send ids are its own.
    ids = [json.loads(body)["send_id"] for body in index.sent]
    assert ids == ["swp2.0", "swp2.1", "swp3.0"]
    assert counts["stranded_resent"] == 3


def test_a_timed_sweep_starts_no_page_it_has_not_the_time_for_and_says_more() -> None:
    index = _index(n_stuck=0, n_ok=6)
    e, _ = env(Clock())
    s = Script(index)
    until = MONO + 2 * SWEEP_PAGE_SECONDS - 0.5  # the first page only: it always runs
    run: SweepRun = s.run(
        sweep_pages_flow(e, older_than=60, limit=2, send_id_prefix="sw", until=until)
    )
    assert (run.pages, run.resent, run.more) == (1, 2, True)
    # With the clock moving 5 s a reading, a budget of 60 s holds 3 pages.
    index = _index(n_stuck=0, n_ok=20)
    e, _ = env(Clock(step=5.0))
    run = Script(index).run(
        sweep_pages_flow(e, older_than=60, limit=2, send_id_prefix="sw", until=MONO + 60)
    )
    assert run.more is True and 1 < run.pages < 10


def test_a_workers_sweep_is_one_page_and_one_dlq_receive_as_before() -> None:
    index = _index(n_stuck=0, n_ok=5)
    e, _ = env(Clock(), dlq=True)

    def answer(c: Call) -> Outcome:
        if c.op == "ReceiveMessage":
            return ok({"Messages": []})
        return index(c)

    s = Script(answer)
    resent = s.run(sweep_once_flow(e, older_than=60, limit=2, send_id_prefix="sw"))
    assert resent == 2
    assert len(_age_queries(s)) == 1  # and the one for entries stamped ahead
    assert [c.op for c in s.calls].count("Query") == 2
    assert [c.op for c in s.calls].count("ReceiveMessage") == 1
    assert "ExclusiveStartKey" not in s.calls_to("Query")[0].params


def test_a_failed_page_is_reported_and_the_dlq_still_reconciled() -> None:
    e, _ = env(Clock(), dlq=True)

    def answer(c: Call) -> Outcome:
        if c.op == "Query":
            return condition_failed(None)  # any failure the sweep cannot handle
        if c.op == "ReceiveMessage":
            return ok({"Messages": []})
        raise AssertionError(c.op)

    s = Script(answer)
    run: SweepRun = s.run(
        sweep_pages_flow(
            e, older_than=60, limit=2, send_id_prefix="sw", dlq_receives=5, until=MONO + 600
        )
    )
    assert run.failed == ("stranded_sweep_failed",) and run.more is True
    assert s.event_names()[0] == "stranded_sweep_failed"
    assert [c.op for c in s.calls].count("ReceiveMessage") == 1  # empty: the DLQ's end


def _dlq_message(n: int) -> dict[str, Any]:
    return {
        "MessageId": f"m-{n}",
        "ReceiptHandle": f"rh-{n}",
        "Body": message_body(f"done-{n}", "ocr", send_id="send-1"),
        "Attributes": {"ApproximateReceiveCount": "3", "SentTimestamp": "1700000000000"},
    }


def test_the_dlq_reconciliation_starts_no_receive_after_its_time() -> None:
    # Each receive comes back 4 s after the one before: with receive_until 10 s on,
    # the receives that came back at 4 and 8 s are followed by one more (12 s), no fourth.
    clock = {"t": MONO}
    n = {"m": 0}

    def answer(c: Call) -> Outcome:
        if c.op == "ReceiveMessage":
            clock["t"] += 4.0
            n["m"] += 1
            return ok({"Messages": [_dlq_message(n["m"])]}, clock["t"], clock["t"])
        if c.op == "GetItem":
            return ok({"Item": job_item(state=JobState.SUCCEEDED)})
        return ok({"Successful": []})

    s = Script(answer)
    report = s.run(
        reconcile_dlq_flow(
            table(), dlq_url=DLQ, wall_now=WALL, limit=100, receives=10, receive_until=MONO + 10
        )
    )
    assert n["m"] == 3 and report.more is True
    assert len(report.findings) == 3
