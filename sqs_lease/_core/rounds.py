"""The heartbeat loop's rounds: extend the leases still open, apply the verdicts,
write the worker's liveness record, and hand back what the watchdog dropped.

``heartbeat_tick_flow(env, stopping=...)`` / ``heartbeat_round_flow(env)``
    every tick of the heartbeat loop (a shutdown passed on, a failed round
    journaled); one round: the watchdog's drops (a counted retry for each, but a spent
    reserve) -> extend the leases still open (``heartbeat_flow``) -> apply the
    verdicts to the book -> the liveness record (``liveness_flow``).

The shell decides only when a round runs; the instruction contract is the attempt
flow's (:mod:`sqs_lease._core.attempt`).
"""

from __future__ import annotations

from .attempt import AttemptAt, resend_attempt, retry_attempt, settle_attempt
from .calls import Emit, Err, Flow, Invoke, ask, call
from .claiming import Claimed
from .endings import Ending, EndKind
from .env import ActFor, AttemptEnv, Now, Parallel, nonce_of, now_of, rules_for
from .fencing import FinishOutcome
from .handback import hand_back_late_flow
from .heartbeats import HeartbeatReport, heartbeat_flow
from .lease import Drop
from .leasebook import Held, is_open
from .liveness import HeldJob, liveness_parts
from .messages import DDB_BATCH_GET
from .timing import beat_due

# ----------------------------------------------------------------------------- heartbeat


ROUND_PART = DDB_BATCH_GET
"""Leases per part of a heartbeat round: one ownership read (BatchGetItem of 100)
and its ten visibility batches. A round's parts run at once (``Invoke("parallel")``),
so a round of thousands takes about as long as its slowest part, not their sum."""


def heartbeat_round_flow(env: AttemptEnv) -> Flow[None]:
    """One heartbeat round over the book (the shell decides only when to run it)."""
    book = env.book
    clock = yield from now_of(env)
    now = clock.mono
    plan, dropped = book.plan_round(now)
    yield from watchdog_drops_flow(env, dropped, now)
    extend = book.still_open(plan.extend)
    if not extend:
        return
    # Leases joined to their group's shared round ahead of their own beat.
    env.tally("beats_early", len(book.still_open(plan.early)))
    if env.observer is not None:
        env.observer.round_planned(extend)
    due = min(beat_due(lease) for lease in extend)
    wall = (yield from now_of(env)).wall
    parts = [
        heartbeat_flow(
            env.table,
            queue_url=env.queue_url,
            leases=extend[i : i + ROUND_PART],
            worker_id=env.worker_id,
            wall_now=wall,
            still_held=book.still_holds,
        )
        for i in range(0, len(extend), ROUND_PART)
    ]
    if len(parts) == 1 or env.run_parallel is None:
        reports = []
        for part in parts:
            reports.append((yield from part))
    else:
        reports = yield from ask("parallel", Parallel(tuple(parts), env.run_parallel))
    report = HeartbeatReport(
        {job_id: beat for r in reports for job_id, beat in r.beats.items()},
        sum(r.calls for r in reports),
    )
    changed, superseded = book.apply_round(extend, report, started=now)
    if superseded:
        env.tally("verdict_for_superseded_attempt", superseded)
    yield from changed.events
    if changed.capped:
        # SQS refused an extension while the job is still ours: its new message.
        capped = {id(lease) for lease in changed.capped}
        held_capped = [(h, Drop.MESSAGE_CAP) for h in book.entries() if id(h.lease) in capped]
        yield from watchdog_drops_flow(env, held_capped, now)
    if env.observer is not None:
        env.observer.round_applied(changed.extended)
    end = yield from now_of(env)
    pressure = None
    if book.pace is not None:
        pressure = book.paced(extend, due=due, started=now, ended=end.mono)
    yield from liveness_flow(env, end, round_seconds=end.mono - now)
    if pressure is not None:
        yield pressure


def liveness_flow(env: AttemptEnv, at: Now, *, round_seconds: float) -> Flow[int]:
    """After a round: the worker's one liveness record (``_core/liveness.py``): every
    open lease it holds (and every claim it made and holds not yet), with its token
    and deadline on the wall clock. Advisory: its only condition keeps it off a job
    record under its key, and a failure is only journaled (``liveness_failed``).
    Written once per heartbeat interval (the shortest held; at most one per half
    interval), however many rounds the leases' own schedules make; each write counts
    ``beats`` up, which a claim of a job this worker runs watches move
    (``_core/duplicates.py``). Returns the calls made (one per
    :data:`~sqs_lease._core.liveness.LIVENESS_PART` jobs)."""
    book = env.book
    open_ = [h for h in book.entries() if is_open(h)]
    if not open_:
        return 0
    every = min(h.lease.heartbeat_seconds for h in open_)
    # Half an interval: rounds come every H on their shared schedule, but each ends
    # a little earlier or later than the one before; with a whole H a round that
    # ended early would skip its write, leaving 2H between two, and a claimer
    # watching for the owner's heartbeat (``_core/duplicates.py``) must see one
    # within its window.
    if book.liveness_at is not None and at.mono - book.liveness_at < every / 2:
        return 0
    book.liveness_at = at.mono
    book.liveness_beats += 1
    listed = {
        h.job.job_id: HeldJob(h.job.job_id, h.lease.token, at.wall + (h.lease.deadline - at.mono))
        for h in open_
    }
    # A claim that landed and is not held yet (validating, taking its slots) is this
    # worker's too: a claimer watching it must not judge it dead. It is the job's
    # newest token here (a held entry of the job is the attempt it supersedes).
    for c in book.pending_claims(at.mono):
        assert c.token is not None
        listed[c.job_id] = HeldJob(c.job_id, c.token, at.wall + (c.deadline - at.mono))
    held = sorted(listed.values(), key=lambda j: j.job_id)
    parts = liveness_parts(env.worker_id, at.wall, round_seconds, held, book.liveness_beats)
    for part in parts:
        out = yield from call(env.table.liveness(part))
        if isinstance(out, Err):
            yield Emit(
                "liveness_failed",
                {
                    "part": part.part,
                    "jobs": len(part.held),
                    "error_code": out.code or out.kind.value,
                },
            )
    env.tally("liveness_writes", len(parts))
    return len(parts)


def watchdog_drops_flow(
    env: AttemptEnv, dropped: list[tuple[Held, Drop]], now: float
) -> Flow[None]:
    """Leases the worker let go (the book already dropped them and told their
    attempts): journal each, and give its job back for a counted retry unless the
    reserve was spent (then the message simply comes back)."""
    book = env.book
    for held, why in dropped:
        lease = held.lease
        if why is Drop.WORKER_LATE:
            yield from hand_back_late_flow(env, held, now)
            continue
        yield Emit(
            "lease_dropped",
            {
                "job_id": lease.job_id,
                "token": lease.token,
                "reason": why.value,
                "lease_left": round(lease.deadline - now, 3),
            },
        )
        rules = rules_for(env, held.job.job_class, held.job.stage)
        if why is Drop.RESERVE_SPENT or rules is None:
            continue
        # The watchdog gives the job back for a counted retry; the handler's late
        # result will meet a moved record and be rejected.
        # Its own nonce: the attempt's late end write must not take this retry for its own.
        nonce = yield from nonce_of(env)
        claim = Claimed(
            held.delivery,
            held.job,
            lease.token,
            held.job.attempt,
            False,
            None,
            lease.deadline,
            nonce,
        )
        yield Invoke("act_for", ActFor("heartbeat", {lease.job_id: lease.token}))
        if why is Drop.MESSAGE_CAP:
            # Not the job's fault: a new message, the attempt given back.
            t = yield from now_of(env)
            fin = yield from resend_attempt(
                AttemptAt(env, claim, rules, held), t, "SQS's 12-hour cap reached"
            )
            yield from settle_attempt(env, claim, fin)
            yield Invoke("act_for", ActFor("heartbeat"))
            book.gave_back([held], f"watchdog: {why.value}")
            continue
        watchdog = Ending(EndKind.RETRY, f"watchdog: {why.value}", why.value)
        fin = yield from retry_attempt(AttemptAt(env, claim, rules, held), watchdog)
        yield from settle_attempt(env, claim, fin)  # attempts spent: the job failed
        yield Invoke("act_for", ActFor("heartbeat"))
        if fin.outcome in (FinishOutcome.DONE, FinishOutcome.FAILED):
            book.gave_back([held], f"watchdog: {why.value}")


def heartbeat_tick_flow(env: AttemptEnv, *, stopping: bool) -> Flow[None]:
    """What the heartbeat loop does every tick: pass a shutdown on to every attempt
    still held, then one round. A round that raises is journaled
    (``heartbeat_error``) and the loop goes on: the heartbeat survives anything."""
    if stopping:
        env.book.request_stop()
    try:
        yield from heartbeat_round_flow(env)
    except Exception as exc:
        yield Emit("heartbeat_error", {"error_code": type(exc).__name__})
        if env.observer is not None:
            env.observer.round_failed(exc)


__all__ = [
    "heartbeat_round_flow",
    "heartbeat_tick_flow",
    "liveness_flow",
    "watchdog_drops_flow",
]
