"""The sync worker: a thin thread shell around the core flows.

Threads: the caller's thread receives; one thread per running job runs claim,
handler and commit; one heartbeat thread extends every held lease in batches.
Every decision is made by a flow or a pure function of ``sqs_lease._core``.
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from pydantic import BaseModel

from ._aws import SyncDriver, Timeouts
from ._clock import lease_clock
from ._config import Settings
from ._core.calls import Emit
from ._core.endings import EndKind, ending_for, stopped_ending
from ._core.flows import (
    UNKNOWN_CLASS_RECEIVES,
    UNSENT_GRACE_SECONDS,
    Claimed,
    Delivery,
    Finish,
    LossSource,
    Poison,
    admit_flow,
    apply_beats,
    commit_flow,
    fail_flow,
    gave_back,
    heartbeat_flow,
    lose,
    lost_event,
    park_flow,
    poison_flow,
    receive_flow,
    rejected_loss,
    release_flow,
    retry_flow,
    sweep_flow,
)
from ._core.intents import EffectResult, EffectSpec, effect_flow
from ._core.records import JobView
from ._core.timing import (
    OPEN,
    Drop,
    LeaseStatus,
    LocalLease,
    Stop,
    backoff_delay,
    plan_heartbeat,
)
from ._errors import (
    ConfigError,
    LeaseLost,
    PayloadError,
)
from ._jobs import App, JobClass, JobContext, canonical_json
from ._journal import Journal
from ._resources import check_table, queue_url, redrive
from ._schema import IntentTable, JobTable


@dataclass
class WorkerStats:
    received: int = 0
    claimed: int = 0
    reclaimed: int = 0
    committed: int = 0
    rejected: int = 0
    failed: int = 0
    retried: int = 0
    parked: int = 0
    poisoned: int = 0
    already_done: int = 0
    stray: int = 0  # messages that were not their job's current message
    lost: int = 0
    released: int = 0
    deferred: int = 0


@dataclass
class _Held:
    lease: LocalLease
    job: JobView
    delivery: Delivery
    cancelled: threading.Event = field(default_factory=threading.Event)
    started: bool = False


def _keeps_rejected(app: App, job_class: str) -> bool:
    reg = app.get(job_class)
    return reg is not None and reg.job_class.keep_rejected_results


class Worker:
    """Consume one queue, run handlers under heartbeat-extended leases, commit fenced.

    ``receive_visibility`` is the lease a message gets at receive, before its claim
    sets the class's own lease; by default the shortest lease among the classes.

    Every ``sweep_interval`` seconds (``None`` turns it off) a separate thread sends
    again up to ``sweep_limit`` records left without a sent message for longer than
    ``sweep_grace`` seconds (a producer that died between its write and its send, a
    resume whose send failed). Many workers may sweep at once: each re-send is won
    by one of them.

    A message naming a job class this worker's app does not know (another version
    of the app on the same queue) is never claimed: it is left for a worker that
    knows the class, with a growing visibility backoff, and after
    ``unknown_class_receives`` receives (or one before the queue's own redrive)
    moved to the DLQ with the reason.
    """

    def __init__(
        self,
        app: App,
        settings: Settings,
        *,
        worker_id: str | None = None,
        concurrency: int = 4,
        receive_wait: int = 2,
        receive_visibility: int | None = None,
        shutdown_grace: float = 20.0,
        timeouts: Timeouts | None = None,
        journal: Journal | None = None,
        tick: float = 0.1,
        rng: random.Random | None = None,
        sweep_interval: float | None = 60.0,
        sweep_grace: float = UNSENT_GRACE_SECONDS,
        sweep_limit: int = 25,
        unknown_class_receives: int = UNKNOWN_CLASS_RECEIVES,
    ) -> None:
        if not app.classes:
            raise ConfigError("the app registers no job class; add one with @app.job(...)")
        if not 1 <= concurrency <= 1000:
            raise ConfigError(f"concurrency={concurrency}: choose 1..1000")
        if not 0 <= receive_wait <= 20:
            raise ConfigError(f"receive_wait={receive_wait}: SQS long polls 0..20 s")
        if sweep_interval is not None and not sweep_interval > 0:
            raise ConfigError(
                f"sweep_interval={sweep_interval}: give seconds > 0, or None to turn the "
                "stranded-record sweep off"
            )
        if not sweep_grace >= 0:
            raise ConfigError(f"sweep_grace={sweep_grace}: give seconds >= 0")
        if not 1 <= sweep_limit <= 1000:
            raise ConfigError(f"sweep_limit={sweep_limit}: choose 1..1000 records per sweep")
        self.sweep_interval = sweep_interval
        self.sweep_grace = sweep_grace
        self.sweep_limit = sweep_limit
        if unknown_class_receives < 1:
            raise ConfigError(
                f"unknown_class_receives={unknown_class_receives}: choose 1 or more receives "
                "before a message of an unknown job class goes to the DLQ"
            )
        self.app = app
        self.settings = settings
        self.worker_id = worker_id or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.concurrency = concurrency
        self.receive_wait = receive_wait
        shortest = min(r.job_class.lease_seconds for r in app.classes.values())
        self.receive_visibility = receive_visibility or shortest
        self.shutdown_grace = shutdown_grace
        self.tick = tick
        self.rng = rng or random.Random()
        self.journal = journal or Journal(worker_id=self.worker_id)
        if self.journal.worker_id is None:
            self.journal.worker_id = self.worker_id
        heartbeat = min(r.job_class.heartbeat_seconds for r in app.classes.values())
        # A heartbeat call must give up well inside the reserve (jitter) of a lease.
        read = max(0.5, min(5.0, heartbeat))
        # Every lease measurement of this worker (its drivers' stamps, its heartbeat,
        # its handlers' contexts) is on the one lease clock (CLOCK_BOOTTIME if any).
        self._clock: Callable[[], float] = lease_clock
        self.driver = SyncDriver(
            settings, self.journal, timeouts or Timeouts(read=read), clock=self._clock
        )
        self.poll_driver = SyncDriver(
            settings, self.journal, Timeouts(read=receive_wait + 5.0, attempts=1), clock=self._clock
        )
        self.table = JobTable(settings.jobs_table)
        self.intents = IntentTable(settings.intents_table, settings.attempts_table)
        check_table(settings)
        self.queue_url = queue_url(settings)
        self.dlq_url, max_receives = redrive(settings, self.queue_url)
        most = max(r.job_class.max_attempts for r in app.classes.values())
        if max_receives is not None and max_receives <= 2 * most:
            # Receives that end in no claim (unanswered claims, duplicates) count too:
            # a redrive this tight can move a live job's message to the DLQ and leave
            # its record without a message (found by the simulation, tight_redrive).
            self.journal(
                "redrive_too_tight",
                max_receive_count=max_receives,
                max_attempts=most,
                fix="raise the queue's maxReceiveCount well above max_attempts "
                "(sqs-lease queue create --max-receives N)",
            )
        # Our DLQ copy (with the reason) must come before SQS's own redrive (without).
        self.unknown_class_receives = (
            unknown_class_receives
            if max_receives is None
            else max(1, min(unknown_class_receives, max_receives - 1))
        )
        self.stats = WorkerStats()
        self._held: dict[str, _Held] = {}
        self._lock = threading.Lock()
        self._slots = threading.Semaphore(concurrency)
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []
        self._saved_signals: dict[int, Any] = {}

    # ----------------------------------------------------------------- running

    def stop(self) -> None:
        """Stop receiving and tell every running attempt to stop.

        Their ``ctx.wait()``/``ctx.check()`` raise ``WorkerShuttingDown``; each job
        goes back to the queue (attempt not spent) as its handler ends. Handlers
        get ``shutdown_grace`` seconds for that; the rest are released anyway.
        Safe from a signal handler: it only sets a flag (the heartbeat thread
        passes the request on within a tick).
        """
        self._stopping.set()

    def _request_stop(self) -> None:
        """Pass a shutdown on to every attempt still held (idempotent)."""
        with self._lock:
            for h in self._held.values():
                if h.lease.status in OPEN and not h.lease.shutdown:
                    h.lease.shutdown = True
                    h.cancelled.set()

    def install_signal_handlers(self) -> None:
        """Stop gracefully on SIGTERM/SIGINT; the previous handlers return when run() ends."""

        def handle(signum: int, frame: FrameType | None) -> None:
            self.journal("worker_stopping", signal=signal.Signals(signum).name)
            self.stop()

        for sig in (signal.SIGTERM, signal.SIGINT):
            self._saved_signals[sig] = signal.signal(sig, handle)

    def _restore_signal_handlers(self) -> None:
        for sig, previous in self._saved_signals.items():
            signal.signal(sig, previous)
        self._saved_signals.clear()

    def run(
        self, *, max_messages: int | None = None, idle_exit: float | None = None
    ) -> WorkerStats:
        """Receive and run until stopped (or idle for ``idle_exit`` s, or after
        ``max_messages`` received); then shut down cleanly. Returns the counters."""
        self.journal(
            "worker_started",
            queue=self.queue_url,
            concurrency=self.concurrency,
            classes=sorted(self.app.classes),
        )
        beat = threading.Thread(target=self._heartbeat_loop, name="heartbeat", daemon=True)
        beat.start()
        sweep: threading.Thread | None = None
        if self.sweep_interval is not None:
            sweep = threading.Thread(target=self._sweep_loop, name="sweep", daemon=True)
            sweep.start()
        idle_since = self._clock()
        try:
            while not self._stopping.is_set():
                if max_messages is not None and self.stats.received >= max_messages:
                    break
                free = self._free_slots()
                if free == 0:
                    self._stopping.wait(self.tick)
                    continue
                want = (
                    free if max_messages is None else min(free, max_messages - self.stats.received)
                )
                batch = self.poll_driver.run(
                    receive_flow(
                        queue_url=self.queue_url,
                        max_messages=want,
                        wait_seconds=self.receive_wait,
                        visibility=self.receive_visibility,
                    )
                )
                if batch or self._held or self._alive():
                    # Idle counts from when the last job finished, not from the last
                    # receive: a retry a job just scheduled comes back within its backoff.
                    idle_since = self._clock()
                elif idle_exit is not None and self._clock() - idle_since >= idle_exit:
                    break
                for item in batch:
                    self._count("received")
                    if self._stopping.is_set():
                        self._release_unstarted(item)
                        continue
                    self._start(item)
        finally:
            self._shutdown()
            self._stopping.set()
            beat.join(timeout=5)
            if sweep is not None:
                sweep.join(timeout=5)
            self._restore_signal_handlers()
        self.journal("worker_stopped", **self.stats.__dict__)
        return self.stats

    def _count(self, name: str, n: int | bool = 1) -> None:
        # Job threads and the heartbeat thread all count; += on an attribute is not atomic.
        with self._lock:
            setattr(self.stats, name, getattr(self.stats, name) + int(n))

    def _free_slots(self) -> int:
        with self._lock:
            return max(0, self.concurrency - sum(1 for t in self._threads if t.is_alive()))

    def _start(self, item: Delivery | Poison) -> None:
        t = threading.Thread(
            target=self._process,
            args=(item,),
            daemon=True,
            name=f"job-{getattr(item, 'job_id', None)}",
        )
        with self._lock:
            self._threads = [x for x in self._threads if x.is_alive()]
            self._threads.append(t)
        t.start()

    def _release_unstarted(self, item: Delivery | Poison) -> None:
        if isinstance(item, Delivery):
            released = self.driver.run(
                release_flow(
                    self.table,
                    queue_url=self.queue_url,
                    held=[(None, item)],
                    worker_id=self.worker_id,
                    wall_now=time.time(),
                    reason="shutdown",
                )
            )
            self._count("released", released)

    def _shutdown(self) -> None:
        if self._stopping.is_set():
            # Asked to stop (not just done: max_messages or idle_exit let handlers finish).
            self._request_stop()
        deadline = self._clock() + self.shutdown_grace
        for t in list(self._threads):
            t.join(timeout=max(0.0, deadline - self._clock()))
        with self._lock:
            left = [h for h in self._held.values() if h.lease.status in OPEN]
            for h in left:
                h.lease.drop(Drop.SHUTDOWN)
                h.cancelled.set()
        if left:
            # No claimed job leaves without a decision: it goes back to queued, at once.
            released = self.driver.run(
                release_flow(
                    self.table,
                    queue_url=self.queue_url,
                    held=[(h.job, h.delivery) for h in left],
                    worker_id=self.worker_id,
                    wall_now=time.time(),
                    reason="shutdown: handler overran the grace period",
                )
            )
            self._count("released", released)
            with self._lock:
                # Handed back, or found taken (release_flow journaled that loss): a
                # late end write of these attempts reports no second loss.
                for h in left:
                    gave_back(h.lease, "shutdown")

    # ----------------------------------------------------------------- one job

    def _process(self, item: Delivery | Poison) -> None:
        if isinstance(item, Poison):
            self._count("poisoned")
            self.driver.run(
                poison_flow(
                    self.table,
                    queue_url=self.queue_url,
                    poison=item,
                    dlq_url=self.dlq_url,
                    body=item.body,
                )
            )
            return
        reg = self.app.get(item.job_class)
        job_class = reg.job_class if reg else None
        claim = self.driver.run(
            admit_flow(
                self.table,
                queue_url=self.queue_url,
                dlq_url=self.dlq_url,
                delivery=item,
                known_class=job_class is not None,
                worker_id=self.worker_id,
                wall_now=time.time(),
                lease_seconds=job_class.lease_seconds if job_class else self.receive_visibility,
                max_attempts=job_class.max_attempts if job_class else 1_000_000,
                unknown_class_receives=self.unknown_class_receives,
                # Drawn only when needed: the rng's stream stays the retries' own.
                rand=self.rng.random() if job_class is None else 0.5,
            )
        )
        if not isinstance(claim, Claimed):
            if claim.outcome in ("done", "parked"):
                self._count("already_done")
            elif claim.outcome == "stray":
                self._count("stray")
            elif claim.outcome in (
                "missing",
                "class_mismatch",
                "unknown_class",
                "unreadable",
                "invalid",
            ):
                self._count("poisoned")
            elif claim.outcome == "exhausted":
                self._count("failed")
            elif claim.outcome == "deferred":
                self._count("deferred")
            return
        self._count("claimed")
        self._count("reclaimed", claim.reclaimed)
        if reg is None or job_class is None:  # pragma: no cover - admit_flow never claims it
            return
        try:
            payload = job_class.validate_payload(claim.job.payload_json or "")
        except PayloadError as exc:
            self._count("poisoned")
            self._finish_fail(claim, None, str(exc), "invalid_payload", poisoned=True)
            return
        held = self._hold(claim, job_class)
        try:
            self._run_handler(held, claim, job_class, reg.handler, payload)
        finally:
            with self._lock:
                if self._held.get(item.job_id) is held:  # not a newer attempt's entry
                    del self._held[item.job_id]

    def _hold(self, claim: Claimed, jc: JobClass) -> _Held:
        now = self._clock()
        lease = LocalLease(
            job_id=claim.job.job_id,
            token=claim.token,
            receipt_handle=claim.delivery.receipt_handle,
            lease_seconds=jc.lease_seconds,
            heartbeat_seconds=jc.heartbeat_seconds,
            jitter_seconds=jc.jitter_seconds,
            deadline=claim.deadline,
            started_at=now,
            stage_deadline=claim.delivery.received_at + jc.stage_budget_seconds,
            progress_timeout=jc.progress_timeout_seconds,
            last_progress=now,
            next_beat=now + jc.heartbeat_seconds,
            last_confirmed=now,
            advised_at=now,
        )
        held = _Held(lease, claim.job, claim.delivery)
        ev: Emit | None = None
        with self._lock:
            earlier = self._held.get(lease.job_id)
            if earlier is not None:
                # Our own new claim moved the token past the earlier attempt (a retry
                # or a duplicate delivery reached this worker): that attempt is lost.
                ev = lose(
                    earlier.lease,
                    LossSource.OWN_CLAIM,
                    f"token moved to {claim.token} by this worker",
                )
                earlier.cancelled.set()
            if self._stopping.is_set():
                # Claimed while the worker stops: the attempt is told at once.
                lease.shutdown = True
                held.cancelled.set()
            self._held[lease.job_id] = held
        self._journal_event(ev)
        return held

    def _journal_event(self, ev: Emit | None) -> None:
        if ev is not None:
            self.journal.write(ev.event, ev.fields)

    def _lose(self, held: _Held | None, claim: Claimed, fin: Finish, source: LossSource) -> None:
        """A fenced write of this attempt was rejected: its lease is gone. Journal that
        once per attempt (the heartbeat, or another write, may have seen it first)."""
        loss = rejected_loss(fin)
        if loss is None:
            return
        reason, cancelled = loss
        if held is None:  # a write right after the claim, before the lease was held
            self._journal_event(
                lost_event(claim.job.job_id, claim.token, LossSource.CLAIM, reason, cancelled)
            )
            return
        with self._lock:
            ev = lose(held.lease, source, reason, cancelled=cancelled)
            held.cancelled.set()
        self._journal_event(ev)

    def _run_handler(
        self, held: _Held, claim: Claimed, jc: JobClass, handler: Any, payload: BaseModel
    ) -> None:
        ctx: JobContext[Any] = JobContext(
            job_id=claim.job.job_id,
            job_class=jc,
            payload=payload,
            payload_hash=claim.job.payload_hash,
            token=claim.token,
            attempt=claim.attempt,
            worker_id=self.worker_id,
            lease=held.lease,
            lock=self._lock,
            cancelled=held.cancelled,
            clock=self._clock,
            journal=self.journal,
            run_effect=lambda spec: self._run_effect(spec, held),
            targets=self.app.targets,
            stage=claim.job.stage or "main",
        )
        start = self._clock()
        error: Exception | None = None
        result: Any = None
        with self._lock:
            told = held.lease.stop  # claimed while the worker stops: do not start
        if told is None:
            try:
                result = handler(ctx, payload)
            except Exception as exc:
                error = exc
        stop = self._mark(held, LeaseStatus.DONE)
        # A handler told to stop may return a partial result: never committed.
        end = stopped_ending(ending_for(error, claim.job.payload_json), stop)
        if end.kind is EndKind.RELEASE:
            released = self.driver.run(
                release_flow(
                    self.table,
                    queue_url=self.queue_url,
                    held=[(claim.job, claim.delivery)],
                    worker_id=self.worker_id,
                    wall_now=time.time(),
                    reason=end.reason,
                )
            )
            self._count("released", released)
        elif end.kind is EndKind.COMMIT:
            self._commit(claim, held, result, self._clock() - start)
        elif end.kind is EndKind.ABANDON:
            # The handler stopped before an irreversible step, or returned after its
            # attempt was told to stop (result_discarded): nothing may be written for
            # this attempt. The message comes back when its visibility lapses.
            self._count("lost")
            self.journal(
                "result_discarded" if end.code == "result_discarded" else "job_abandoned",
                job_id=claim.job.job_id,
                token=claim.token,
                error_code=end.code,
                stop=stop.value if stop is not None else None,
                duration=round(self._clock() - start, 3),
            )
        elif end.kind is EndKind.FAIL:
            self._finish_fail(claim, held, end.reason, end.code)
        elif end.kind is EndKind.PARK:
            # Nobody can tell whether the effect applied: stop automatic retries of
            # this job and keep everything for an operator (sqs-lease intents ...).
            self._count("parked")
            fin = self.driver.run(
                park_flow(
                    self.table,
                    queue_url=self.queue_url,
                    job=claim.job,
                    delivery=claim.delivery,
                    worker_id=self.worker_id,
                    wall_now=time.time(),
                    reason=end.reason,
                )
            )
            self._lose(held, claim, fin, LossSource.PARK)
        else:
            self._retry(claim, held, jc, end.reason, end.code)

    def _run_effect(self, spec: EffectSpec, held: _Held) -> EffectResult:
        try:
            return self.driver.run(
                effect_flow(
                    self.intents,
                    self.table,
                    spec=spec,
                    token=held.lease.token,
                    worker_id=self.worker_id,
                    wall_clock=time.time,
                    flow_id=uuid.uuid4().hex,
                )
            )
        except LeaseLost as exc:
            # Raised while the local lease was still open, it came from the fenced
            # intent start that found the token moved: the first news of the loss.
            with self._lock:
                ev = (
                    lose(held.lease, LossSource.INTENT_START, str(exc))
                    if held.lease.status in OPEN
                    else None
                )
                if ev is not None:
                    held.cancelled.set()
            self._journal_event(ev)
            raise

    def _mark(self, held: _Held, status: LeaseStatus) -> Stop | None:
        """Mark the attempt's end; return the stop it was told before (None: none)."""
        with self._lock:
            stop = held.lease.stop
            if held.lease.status in OPEN:
                held.lease.status = status
            return stop

    def _commit(self, claim: Claimed, held: _Held, result: Any, duration: float) -> None:
        if isinstance(result, BaseModel):
            result = result.model_dump(mode="json")
        try:
            text = canonical_json(result)
        except (TypeError, ValueError):
            self._finish_fail(
                claim, held, "handler returned a result that is not JSON", "bad_result"
            )
            return
        # A result over DynamoDB's item limit (with the payload) is never sent: the
        # core's commit_flow fails the job naming the limit. Always attempt the fenced
        # commit, even when the heartbeat already saw the lease lost: DynamoDB's
        # condition is the only arbiter, and a rejected commit is the record forensics
        # needs (result_rejected).
        fin = self.driver.run(
            commit_flow(
                self.table,
                queue_url=self.queue_url,
                job=claim.job,
                delivery=claim.delivery,
                worker_id=self.worker_id,
                result_json=text,
                wall_now=time.time(),
                duration=duration,
                keep_rejected_content=_keeps_rejected(self.app, claim.job.job_class),
            )
        )
        if fin.outcome == "done":
            self._count("committed")
        elif fin.outcome == "rejected":
            self._count("rejected")
        elif fin.outcome == "failed":
            self._count("failed")
        self._lose(held, claim, fin, LossSource.COMMIT)

    def _retry(
        self, claim: Claimed, held: _Held | None, jc: JobClass, reason: str, code: str
    ) -> Finish:
        delay = backoff_delay(
            claim.attempt, jc.backoff_base_seconds, jc.backoff_max_seconds, self.rng.random()
        )
        fin = self.driver.run(
            retry_flow(
                self.table,
                queue_url=self.queue_url,
                job=claim.job,
                delivery=claim.delivery,
                worker_id=self.worker_id,
                wall_now=time.time(),
                reason=reason,
                error_code=code,
                delay=delay,
                max_attempts=jc.max_attempts,
            )
        )
        if fin.outcome == "done":
            if claim.attempt >= jc.max_attempts + claim.job.granted_attempts:
                self._count("failed")
            else:
                self._count("retried")
        elif fin.outcome == "failed":
            self._count("failed")
        self._lose(held, claim, fin, LossSource.RETRY)
        return fin

    def _finish_fail(
        self, claim: Claimed, held: _Held | None, reason: str, code: str, poisoned: bool = False
    ) -> None:
        if poisoned:
            self.journal(
                "message_poisoned",
                job_id=claim.job.job_id,
                token=claim.token,
                error_code=code,
                reason=reason,
            )
        fin = self.driver.run(
            fail_flow(
                self.table,
                queue_url=self.queue_url,
                job=claim.job,
                delivery=claim.delivery,
                worker_id=self.worker_id,
                wall_now=time.time(),
                reason=reason,
                error_code=code,
            )
        )
        if fin.outcome == "done" and not poisoned:
            self._count("failed")
        self._lose(held, claim, fin, LossSource.FAIL)

    # ----------------------------------------------------------------- heartbeat

    def _heartbeat_loop(self) -> None:
        while not (self._stopping.is_set() and not self._held and not self._alive()):
            try:
                if self._stopping.is_set():
                    self._request_stop()
                self._beat_once()
            except Exception as exc:  # the heartbeat thread must survive anything
                self.journal("heartbeat_error", error_code=type(exc).__name__)
            time.sleep(self.tick)

    def _alive(self) -> bool:
        with self._lock:
            return any(t.is_alive() for t in self._threads)

    def _beat_once(self) -> None:
        now = self._clock()
        with self._lock:
            plan = plan_heartbeat([h.lease for h in self._held.values()], now)
            dropped = {lease.job_id: self._held[lease.job_id] for lease, _ in plan.drop}
            for lease, why in plan.drop:
                lease.drop(why)
                dropped[lease.job_id].cancelled.set()
        for lease, why in plan.drop:
            held = dropped[lease.job_id]
            self.journal(
                "lease_dropped",
                job_id=lease.job_id,
                token=lease.token,
                reason=why.value,
                lease_left=round(lease.deadline - now, 3),
            )
            if why is not Drop.RESERVE_SPENT:
                # The watchdog gives the job back for a counted retry; the handler's
                # late result will meet a moved record and be rejected.
                jc = self.app.classes[held.job.job_class].job_class
                claim = Claimed(
                    held.delivery,
                    held.job,
                    lease.token,
                    held.job.attempt,
                    False,
                    None,
                    lease.deadline,
                )
                fin = self._retry(claim, held, jc, f"watchdog: {why.value}", why.value)
                if fin.outcome in ("done", "failed"):
                    with self._lock:
                        gave_back(lease, f"watchdog: {why.value}")
        with self._lock:
            # The drops' writes above can take long (a partition): a handler that
            # ended meanwhile must not get its visibility extended.
            extend = [lease for lease in plan.extend if lease.status in OPEN]
        if not extend:
            return
        report = self.driver.run(
            heartbeat_flow(
                self.table,
                queue_url=self.queue_url,
                leases=extend,
                worker_id=self.worker_id,
                wall_now=time.time(),
                advise=plan.advise,
            )
        )
        with self._lock:
            # Only the leases this worker still holds (a newer own claim may have
            # replaced one while the round was in flight).
            current = [
                lease
                for lease in extend
                if (h := self._held.get(lease.job_id)) is not None and h.lease is lease
            ]
            changed = apply_beats(current, report, started=now, advised=plan.advise)
            for lease in changed.cancel:
                self._held[lease.job_id].cancelled.set()
        for ev in changed.events:
            self._journal_event(ev)

    # ----------------------------------------------------------------- stranded sweep

    def _sweep_loop(self) -> None:
        assert self.sweep_interval is not None
        # A random first wait spreads the sweeps of workers started together.
        wait = self.sweep_interval * (0.5 + 0.5 * self.rng.random())
        while not self._stopping.wait(wait):
            self.sweep_once()
            wait = self.sweep_interval

    def sweep_once(self) -> int:
        """One bounded sweep of stranded records; returns how many were sent again.

        Never raises: a failed sweep is journaled (``stranded_sweep_failed``, with
        the fix when the index is missing) and the next one tries again.
        """
        try:
            report = self.driver.run(
                sweep_flow(
                    self.table,
                    queue_url=self.queue_url,
                    wall_now=time.time(),
                    older_than=self.sweep_grace,
                    limit=self.sweep_limit,
                    send_id_prefix=uuid.uuid4().hex,
                )
            )
        except Exception as exc:  # the sweep must never stop the worker
            self.journal(
                "stranded_sweep_failed", error_code=type(exc).__name__, reason=str(exc)[:300]
            )
            return 0
        return sum(1 for j in report.jobs if j.verdict == "resent")


def load_app(spec: str) -> App:
    """Import ``MODULE:OBJECT`` and return the App it names."""
    import importlib

    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ConfigError(f"app {spec!r}: write it as MODULE:OBJECT, e.g. myjobs:app")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"app {spec!r}: cannot import {module_name!r}: {exc}") from None
    obj = getattr(module, attr, None)
    if not isinstance(obj, App):
        raise ConfigError(f"app {spec!r}: {attr!r} is not a sqs_lease.App")
    return obj


def result_of(text: str | None) -> Any:
    return None if text is None else json.loads(text)
