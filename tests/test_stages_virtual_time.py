"""A job of stages that works 30 hours, on a real moto server, in virtual time.

moto runs in this process (``LocalAws``, on 127.0.0.1, spoken to over HTTP) so that
time-machine moves its clock: the messages' ``SentTimestamp`` and first receive,
their visibility timers and the 12-hour cap all count virtual hours. The clock
ticks on between the jumps (a frozen one would hang an empty long poll).

The worker's lease clock is ``CLOCK_BOOTTIME``, which time-machine leaves alone: the
kit's :class:`~sqs_lease.testing.ShiftedClock` moves it by the same amounts, so the
worker's leases, heartbeat schedule and stage budgets live in the same virtual hours
as SQS. The test moves both one heartbeat interval (a third of the lease) at a
time and waits for the heartbeat round each jump makes due before the next one: a
bounded loop, each wait a hang guard.

What is asserted comes from SQS's side: moto's own record of each send, receive,
visibility change and delete of the queue's messages, stamped on its (virtual)
clock, not what the worker journals about itself.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import boto3
import pytest
import time_machine
from pydantic import BaseModel
from worker_helpers import JournalCollector, collect_journal, prepare, read_view

from sqs_lease import App, JobContext, NextStage, Producer, Worker
from sqs_lease._core.stages import MESSAGE_CAP_SECONDS, stage_log
from sqs_lease._core.timing import SQS_MAX_VISIBILITY
from sqs_lease._local import LocalAws, local_credentials_env
from sqs_lease.testing import HANG_GUARD, ShiftedClock, running, wait_for

pytestmark = [pytest.mark.integration]

HOUR = 3600.0
STAGE_HOURS = {"fetch": 5.0, "transform": 10.0, "upload": 5.0, "notify": 5.0, "archive": 5.0}
"""Five stages, 30 hours of work in all; one of them 10 hours, under the 12-hour cap."""

LEASE: dict[str, Any] = {
    "lease_seconds": 3600,
    "heartbeat_seconds": 1200.0,
    "jitter_seconds": 300.0,
    "missed_heartbeats": 2,
}
"""An hour's lease, a beat every 20 minutes (the timing rule: 3600 > 2 x 1200 + 300)."""

STEP = float(LEASE["heartbeat_seconds"])
"""One jump of virtual time: one heartbeat interval, a third of the lease."""

BUDGET_ROOM = 1.5 * HOUR
"""A stage's budget is its work plus this: the heartbeat stops extending a lease that
would cross the budget (``now + lease > deadline``), so the last beat of a stage,
up to one jump before its work ends, needs the lease and a jump of room."""

MAX_STEPS = 400
"""Bound on the jumps of one run (30 hours take about 100)."""

ENDED = ("result_committed", "job_failed", "job_parked")
BEAT = ("heartbeat_ok", "ownership_unknown", "heartbeat_lost", "lease_dropped")
"""What a heartbeat round that reached the job journals: an extension, or why not."""


class Order(BaseModel):
    order: str


# --------------------------------------------------------------------------- SQS's record


@dataclass
class Seen:
    """One message as SQS saw it: times in virtual epoch seconds, on moto's clock."""

    message_id: str
    stage: str
    sent: float
    receives: list[tuple[float, float, int]] = field(default_factory=list)
    """(when, its ApproximateFirstReceiveTimestamp, its ApproximateReceiveCount)."""
    visibility: list[tuple[float, int, float]] = field(default_factory=list)
    """Each granted change: (when, seconds asked, the visible-at it set)."""
    refused: list[tuple[float, int]] = field(default_factory=list)
    deletes: list[float] = field(default_factory=list)

    @property
    def first_receive(self) -> float:
        return self.receives[0][1]

    @property
    def deleted(self) -> float:
        return self.deletes[0]

    @property
    def latest_visible(self) -> float:
        """The furthest point SQS ever promised to keep the message hidden until."""
        return max(v for _, _, v in self.visibility) if self.visibility else 0.0


class SqsRecord:
    """Watches moto's SQS backend (in this process) for one queue: every send,
    receive, visibility change and delete it serves, stamped on its own clock."""

    def __init__(self, queue_name: str) -> None:
        self.queue_name = queue_name
        self.messages: dict[str, Seen] = {}
        self._mutex = threading.Lock()

    def settled(self) -> bool:
        """Every message but the latest sent is deleted: the ended stages' messages
        have left the worker's delete batch."""
        with self._mutex:
            older = sorted(self.messages.values(), key=lambda m: m.sent)[:-1]
            return all(m.deletes for m in older)

    def by_stage(self) -> dict[str, list[Seen]]:
        out: dict[str, list[Seen]] = {}
        with self._mutex:
            for seen in self.messages.values():
                out.setdefault(seen.stage, []).append(seen)
        return out

    def install(self, monkeypatch: pytest.MonkeyPatch) -> SqsRecord:
        from moto.core.utils import unix_time_millis
        from moto.sqs.models import SQSBackend

        record = self

        def now() -> float:
            return float(unix_time_millis()) / 1000.0

        def seconds(millis: int | None) -> float:
            assert millis is not None  # SQS stamps a message at its send and first receive
            return millis / 1000.0

        def message_of(backend: Any, queue_name: str, handle: str) -> Any:
            for m in backend.get_queue(queue_name)._messages:
                if m.had_receipt_handle(handle):
                    return m
            return None

        send = SQSBackend.send_message
        receive = SQSBackend.receive_message
        change = SQSBackend.change_message_visibility
        delete = SQSBackend.delete_message

        def send_message(self: Any, queue_name: str, message_body: str, *a: Any, **k: Any) -> Any:
            m = send(self, queue_name, message_body, *a, **k)
            if queue_name == record.queue_name:
                stage = str(json.loads(message_body).get("stage"))
                with record._mutex:
                    record.messages[m.id] = Seen(m.id, stage, seconds(m.sent_timestamp))
            return m

        def receive_message(self: Any, queue_name: str, *a: Any, **k: Any) -> Any:
            got = receive(self, queue_name, *a, **k)
            if queue_name == record.queue_name:
                with record._mutex:
                    for m in got:
                        first = seconds(m.approximate_first_receive_timestamp)
                        record.messages[m.id].receives.append(
                            (now(), first, m.approximate_receive_count)
                        )
            return got

        def change_message_visibility(
            self: Any, queue_name: str, receipt_handle: str, visibility_timeout: int
        ) -> None:
            m = message_of(self, queue_name, receipt_handle)
            at = now()
            try:
                change(self, queue_name, receipt_handle, visibility_timeout)
            except Exception:
                if m is not None and queue_name == record.queue_name:
                    with record._mutex:
                        record.messages[m.id].refused.append((at, int(visibility_timeout)))
                raise
            if m is not None and queue_name == record.queue_name:
                with record._mutex:
                    record.messages[m.id].visibility.append(
                        (at, int(visibility_timeout), m.visible_at / 1000.0)
                    )

        def delete_message(self: Any, queue_name: str, receipt_handle: str) -> None:
            m = message_of(self, queue_name, receipt_handle)
            delete(self, queue_name, receipt_handle)
            if m is not None and queue_name == record.queue_name:
                with record._mutex:
                    record.messages[m.id].deletes.append(now())

        monkeypatch.setattr(SQSBackend, "send_message", send_message)
        monkeypatch.setattr(SQSBackend, "receive_message", receive_message)
        monkeypatch.setattr(SQSBackend, "change_message_visibility", change_message_visibility)
        monkeypatch.setattr(SQSBackend, "delete_message", delete_message)
        return self


# --------------------------------------------------------------------------- virtual time


@pytest.fixture
def in_process_aws(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """moto in this process (so time-machine moves its clock), on 127.0.0.1."""
    for name, value in local_credentials_env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.setenv(name, "127.0.0.1,localhost")
    with LocalAws() as local:
        yield local.endpoint_url


class VirtualTime:
    """The wall clock (time-machine: moto, SQS's timestamps, the worker's wall reads)
    and one worker's lease clock (the kit's ShiftedClock), moved forward together."""

    def __init__(self, traveller: time_machine.Traveller, lease: ShiftedClock) -> None:
        self.traveller = traveller
        self.lease = lease

    def advance(self, seconds: float) -> None:
        self.traveller.shift(seconds)
        self.lease.advance(seconds)


@dataclass
class Working:
    """A handler at work: its stage and the lease-clock time its work is done."""

    stage: str
    done_at: float


class Work:
    """The handlers' side: which stage is working now, and how often each ran."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.runs: Counter[str] = Counter()
        self.current: Working | None = None
        self._mutex = threading.Lock()

    def staged_app(self, hours: dict[str, float], budgets: dict[str, float]) -> App:
        """A job of ``hours``' stages, in order, each with its budget; each stage works
        its hours on the worker's lease clock, waiting on ``ctx.wait`` (so a stop of
        the attempt reaches it), then hands on to the next or ends the job."""
        app = App()
        job = app.staged("long", payload=Order, **LEASE)
        names = list(hours)
        for i, name in enumerate(names):
            after = names[i + 1] if i + 1 < len(names) else None
            job.stage(name, stage_budget_seconds=budgets[name], max_attempts=1)(
                self._handler(name, hours[name], after)
            )
        return app

    def _handler(self, stage: str, hours: float, after: str | None) -> Any:
        def handler(ctx: JobContext[Any], p: Any) -> Any:
            working = Working(stage, self.clock() + hours * HOUR)
            with self._mutex:
                self.runs[stage] += 1
                self.current = working
            try:
                while self.clock() < working.done_at:
                    ctx.wait(0.02)
            finally:
                with self._mutex:
                    self.current = None
            if after is None:
                return {"done": stage}
            return NextStage(after, {"from": stage}, result={"hours": hours})

        return handler


def drive(
    vt: VirtualTime, work: Work, sqs: SqsRecord, journal: JournalCollector, job_id: str
) -> None:
    """Move virtual time while a stage works, one heartbeat interval at a time, until
    the job ends. After each jump, wait for the heartbeat round the jump made due (its
    extension, or why it made none) or for the stage's end: the next jump never comes
    before the round, as on a real clock, where a beat every 20 minutes keeps an
    hour's lease. Nor before the ended stages' messages are deleted: the worker
    batches those deletes over a quarter of a second, which a real clock lets pass
    long before 20 minutes do; a jump that outran the batch would keep a message in
    flight for hours the worker never held it (a busy machine made that happen)."""

    def ended() -> bool:
        return any(journal.events(name, job_id=job_id) for name in ENDED)

    def rounds() -> int:
        return sum(len(journal.events(name, job_id=job_id)) for name in BEAT)

    for _ in range(MAX_STEPS):
        wait_for(
            lambda: ended() or work.current is not None,
            HANG_GUARD,
            "a stage to start working or the job to end",
            interval=0.01,
        )
        if ended():
            return
        working = work.current
        if working is None:
            continue
        wait_for(
            sqs.settled,
            HANG_GUARD,
            "the ended stages' messages deleted from the worker's delete batch",
            interval=0.01,
        )
        beats = rounds()
        # A jump never past the stage's end: the stage's work ends at a jump.
        vt.advance(min(STEP, max(0.0, working.done_at - vt.lease()) + 0.5))

        def beaten(beats: int = beats, working: Working = working) -> bool:
            return rounds() > beats or work.current is not working or ended()

        wait_for(
            beaten,
            HANG_GUARD,
            f"stage {working.stage}'s heartbeat after a jump, or its end",
            interval=0.01,
        )
    raise AssertionError(f"job {job_id} did not end within {MAX_STEPS} jumps of virtual time")


def run_job(
    endpoint: str,
    monkeypatch: pytest.MonkeyPatch,
    hours: dict[str, float],
    budgets: dict[str, float],
    backlog: float = 0.0,
) -> tuple[Any, Work, SqsRecord, JournalCollector, str]:
    """Submit one job of ``hours``' stages and run it in virtual time on one worker
    (started ``backlog`` virtual seconds after the submit); its record, the handlers'
    counts, SQS's record and the journal."""
    settings, queue_url, _ = prepare(endpoint, f"v{uuid.uuid4().hex[:10]}")
    ddb = boto3.client("dynamodb", endpoint_url=endpoint, region_name="us-east-1")
    sqs = SqsRecord(queue_url.rsplit("/", 1)[1]).install(monkeypatch)
    with time_machine.travel(time.time(), tick=True) as traveller:
        lease = ShiftedClock()
        work = Work(lease)
        app = work.staged_app(hours, budgets)
        # The sweep of records left unsent for a minute is off: the test jumps hours,
        # and is about one job's messages, not about stranded records. A short tick:
        # the heartbeat looks for due leases every 20 ms (a jump makes one due).
        worker = Worker(
            app, settings, worker_id="w", receive_wait=1, sweep_interval=None, tick=0.02
        )
        lease.install(worker)
        job_id = Producer(settings, app).submit("long", Order(order="o-30h")).job_id
        vt = VirtualTime(traveller, lease)
        vt.advance(backlog)  # the first message waits in the queue, unreceived
        with collect_journal() as journal, running(worker):
            drive(vt, work, sqs, journal, job_id)
            view = read_view(ddb, settings, job_id)
    return view, work, sqs, journal, job_id


# --------------------------------------------------------------------------- the tests


def test_a_job_of_stages_working_30_virtual_hours_completes_with_no_message_held_near_the_cap(
    in_process_aws: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    budgets = {stage: h * HOUR + BUDGET_ROOM for stage, h in STAGE_HOURS.items()}
    assert max(budgets.values()) < MESSAGE_CAP_SECONDS  # the 10-hour stage's: 11.5 h
    view, work, sqs, journal, job_id = run_job(in_process_aws, monkeypatch, STAGE_HOURS, budgets)

    # Each stage ran exactly once, and the job succeeded with every stage's checkpoint.
    assert work.runs == Counter(dict.fromkeys(STAGE_HOURS, 1))
    assert (view.state.value, view.stage, view.token) == ("succeeded", "archive", 5)
    log = stage_log(view)
    assert [(e.stage, e.token, e.attempt) for e in log] == [
        ("fetch", 1, 1),
        ("transform", 2, 1),
        ("upload", 3, 1),
        ("notify", 4, 1),
    ]
    assert [e.result for e in log] == [{"hours": STAGE_HOURS[e.stage]} for e in log]
    # Each checkpoint's duration is its hours of work, on the worker's (shifted) clock.
    assert all(STAGE_HOURS[e.stage] * HOUR <= e.duration < budgets[e.stage] for e in log)
    bad = ("lease_dropped", "stage_budget_exceeded", "heartbeat_lost", "ownership_unknown")
    assert [e for e in journal.events(job_id=job_id) if e["event"] in bad] == []

    # What SQS saw: one message per stage, each received once and deleted once ...
    seen = sqs.by_stage()
    assert sorted(seen) == sorted(STAGE_HOURS)
    for stage, messages in seen.items():
        (m,) = messages
        assert [count for _, _, count in m.receives] == [1], (stage, m.receives)
        assert len(m.deletes) == 1 and m.refused == [], (stage, m)
        in_flight = m.deleted - m.first_receive
        # ... in flight for its hours of work (the clock really moved) and under its
        # budget, and never held, nor promised, near the 12-hour cap: counted from the
        # first receive (AWS) and from the send (moto).
        assert STAGE_HOURS[stage] * HOUR <= in_flight < budgets[stage], (stage, in_flight)
        held = max(m.deleted, m.latest_visible)
        assert held - m.first_receive < MESSAGE_CAP_SECONDS, (stage, held - m.first_receive)
        assert held - m.sent < MESSAGE_CAP_SECONDS < SQS_MAX_VISIBILITY, (stage, held - m.sent)
        # The heartbeat never asked for visibility past the stage's budget (beyond the
        # real seconds a request takes between the worker's clock read and SQS's).
        assert m.latest_visible - m.first_receive <= budgets[stage] + 60, stage
    order = sorted(seen, key=lambda s: seen[s][0].sent)
    assert order == list(STAGE_HOURS)
    first, last = seen["fetch"][0], seen["archive"][0]
    assert last.deleted - first.sent >= sum(STAGE_HOURS.values()) * HOUR  # 30 virtual hours

    # The heartbeat kept the 10-hour stage alive: SQS extended its message many times,
    # each while it was in flight, never to the cap.
    transform = seen["transform"][0]
    extensions = [v for v in transform.visibility if v[0] < transform.deleted]
    assert len(extensions) > 1, transform.visibility
    assert len(extensions) >= STAGE_HOURS["transform"] * HOUR / LEASE["lease_seconds"]
    beats = journal.events("heartbeat_ok", job_id=job_id, token=2)
    assert len(beats) > 1


def test_a_stage_whose_work_outruns_its_budget_in_virtual_hours_is_stopped_not_kept_in_flight(
    in_process_aws: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check above can fail: the 10-hour stage with an 8-hour budget does not
    finish; the heartbeat lets its message go before the budget and the job fails with
    the watchdog's reason, the stages after it never run."""
    hours = {"fetch": 1.0, "transform": 10.0, "upload": 1.0}
    budgets = {"fetch": 3 * HOUR, "transform": 8 * HOUR, "upload": 3 * HOUR}
    view, work, sqs, journal, job_id = run_job(in_process_aws, monkeypatch, hours, budgets)

    assert work.runs == Counter({"fetch": 1, "transform": 1})
    assert (view.state.value, view.stage) == ("failed", "transform")
    assert view.error_code == "attempts_exhausted"
    assert view.reason is not None and "watchdog: stage_budget_exceeded" in view.reason
    assert [e.stage for e in stage_log(view)] == ["fetch"]  # the committed stage stays
    (dropped,) = journal.events("lease_dropped", job_id=job_id)
    assert (dropped["reason"], dropped["token"]) == ("stage_budget_exceeded", 2)

    seen = sqs.by_stage()
    assert sorted(seen) == ["fetch", "transform"]
    (m,) = seen["transform"]
    assert [count for _, _, count in m.receives] == [1]
    # SQS was never asked to keep it past its budget: the heartbeat stopped first.
    assert m.latest_visible - m.first_receive <= budgets["transform"] + 60
    assert len(m.deletes) == 1 and m.deleted - m.first_receive < budgets["transform"]


def test_a_message_that_waited_12_hours_in_the_backlog_still_runs_and_a_refused_extension_resumes(
    in_process_aws: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SQS's 12-hour cap counts from the receive (AWS): a first stage received 12 hours
    after its submit has its whole budget. moto counts from the send, so it refuses
    the first extension (InvalidParameterValue): the job is still the worker's, so it
    goes on under a new message, its attempt not charged, and the work that never
    ran to its end runs; nothing is failed."""
    hours = {"fetch": 2.0, "publish": 1.0}
    budgets = {"fetch": 3 * HOUR, "publish": 3 * HOUR}
    backlog = 12 * HOUR
    view, work, sqs, journal, job_id = run_job(
        in_process_aws, monkeypatch, hours, budgets, backlog=backlog
    )

    assert (view.state.value, view.stage) == ("succeeded", "publish")
    assert journal.events("stage_budget_capped", job_id=job_id) == []
    first, second = sorted(sqs.by_stage()["fetch"], key=lambda m: m.sent)
    assert first.first_receive - first.sent >= backlog
    assert len(first.refused) >= 1 and first.visibility == []  # moto's quirk, met cleanly
    (resent,) = journal.events("job_resent", job_id=job_id)
    assert (resent["reason"], resent["sent"], resent["stage"]) == ("message_cap", True, "fetch")
    assert [count for _, _, count in second.receives] == [1]
    assert work.runs == Counter({"fetch": 2, "publish": 1})
    # The stage committed under the new message, on its first counted attempt.
    assert [(e.stage, e.attempt) for e in stage_log(view)] == [("fetch", 1)]
    bad = ("job_failed", "heartbeat_lost")
    assert [e for e in journal.events(job_id=job_id) if e["event"] in bad] == []
