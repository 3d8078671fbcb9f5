"""One attempt, from a received message to a decided end.

Every worker shell (the thread worker, the asyncio worker, the simulator) runs
these flows and decides no protocol step itself. A shell *schedules* (a thread,
a task or a simulated task per attempt; a heartbeat loop; a sweep loop) and
*performs* the instructions the flows yield, exactly as for every other flow:

``attempt_flow(env, item)``
    receive -> (poison: DLQ) -> admit/claim -> validate the payload -> hold the
    lease in the :class:`~sqs_lease._core.leasebook.LeaseBook` -> run the
    handler (unless the attempt was told to stop first) -> mark its end ->
    decide the ending (``ending_for`` + ``stopped_ending``) -> commit / retry
    with backoff / park / fail / release / abandon -> forget the lease.
The worker's other rounds run under the same contract, each in its module:
the heartbeat loop's (:mod:`~sqs_lease._core.rounds`), the stopping worker's
hand-backs (:mod:`~sqs_lease._core.shutdown`) and a late worker's
(:mod:`~sqs_lease._core.handback`), the sweeps
(:mod:`~sqs_lease._core.sweeps`); the receive loop's pacing is
:mod:`~sqs_lease._core.receiving`.

The instruction contract (what a shell must perform):

- ``Call``: one AWS call, answered with ``Ok``/``Err`` (the drivers' ``execute``).
- ``Sleep``: wait on the shell's clock (never used by an attempt itself; the
  flows it runs may back off).
- ``Emit``: write the journal event.
- ``Invoke(what, fn)``: run caller code and answer ``Ok({"value": v})``, or
  ``Err(ErrorKind.RAISED, exc=e)`` when it raised an ``Exception``. The ``what``
  names are:

  - ``"now"``: ``fn`` is the shell's ``env.now`` -> :class:`Now` (the monotonic
    lease clock and the wall clock, read together; the core reads no clock).
  - ``"random"``: ``env.random`` -> a float in [0, 1) (backoff, deferral jitter).
  - ``"write_id"``: ``env.write_id`` -> a fresh nonce (str): an attempt's, carried by
    its end writes so that it recognises its own write exactly (``fencing.end_write_id``);
    a release made on an attempt's behalf draws its own. Unguessable in a real shell
    (``secrets``): whoever could predict it could forge the attempt's write.
  - ``"validate"``: the job class's payload validation (may raise ``PayloadError``).
  - ``"handler"``: ``fn`` is a :class:`HandlerRun`. A sync shell just calls it (in
    the attempt's thread: it calls ``env.run_handler``, which builds the job
    context and calls the handler). An async shell may look at ``fn`` itself
    (``held``, ``claim``, ``payload``, ``rules``) and await a coroutine handler or
    run a sync one in its pool; the simulator runs its scripted handler in
    simulated time. The answer is the handler's return value, or its exception.
    A handler's side effects (``ctx.effect``) are the shell's to drive, each with
    :func:`held_effect_flow` (which tells the book of a refused intent start).
  - ``"act_for"``: ``fn`` is an :class:`ActFor`: the calls that follow, until the
    next ``act_for``, are made on behalf of other attempts (a watchdog's retry,
    the shutdown release). A no-op for every shell but one that attributes calls
    (the simulator's checker).

What a shell supplies is an :class:`~sqs_lease._core.env.AttemptEnv` (the worker's
identity, requests, book, clocks, counter). Counters are the shell's
(``env.tally``): the flows name what to count. Optional :class:`Observer` hooks let
the simulator's checker see the truth at the moments it needs (a handler ended, a
result about to be committed, a round planned and applied); real shells pass none.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from .._errors import JobCancelled, LeaseLost, PayloadError, RecordUnreadable
from .calls import Call, Emit, Err, Flow, Invoke, Ok, ask
from .claiming import Claimed, ClaimResult, NotClaimed, NotClaimedOutcome, admit_flow
from .duplicates import duplicate_defer, owner_alive_flow, owner_window
from .effectflow import effect_flow
from .endings import Ending, EndKind, ending_for, stopped_ending
from .endwrites import (
    EndRequest,
    commit_flow,
    fail_flow,
    park_flow,
    poison_flow,
    release_flow,
    retry_flow,
)
from .env import (
    AttemptEnv,
    ClassRules,
    HandlerRun,
    Now,
    nonce_of,
    now_of,
    rules_for,
)
from .fencing import Finish, FinishOutcome, set_visibility
from .handback import hand_back_defer, hand_back_late_flow
from .heartbeats import LossSource
from .intents import EffectResult, EffectSpec
from .leasebook import Held, LeaseRules
from .messages import Delivery, Poison, on_queue
from .records import attempts_allowed
from .slots import (
    HeldSlot,
    SlotGrant,
    give_back_flow,
    own_pool,
    pools_for,
    slot_wait_event,
    take_slots_flow,
    wait_delay,
    wait_flow,
    waits_of,
)
from .stages import (
    CappedRules,
    NextStage,
    cap_budget,
    continue_flow,
    plain_data,
    refused_next,
    resend_flow,
    stage_input_json,
)
from .timing import backoff_delay

UNKNOWN_CLASS_MAX_ATTEMPTS = 1_000_000  # an unknown class is never claimed: no bound applies


# What a delivery that was not claimed counts as, by its outcome.
NOT_CLAIMED_COUNTS: dict[NotClaimedOutcome, str] = {
    NotClaimedOutcome.DONE: "already_done",
    NotClaimedOutcome.PARKED: "already_done",
    NotClaimedOutcome.STRAY: "stray",
    NotClaimedOutcome.MISSING: "poisoned",
    NotClaimedOutcome.CLASS_MISMATCH: "poisoned",
    NotClaimedOutcome.UNKNOWN_CLASS: "poisoned",
    NotClaimedOutcome.UNREADABLE: "poisoned",
    NotClaimedOutcome.INVALID: "poisoned",
    NotClaimedOutcome.EXHAUSTED: "failed",
    NotClaimedOutcome.DEFERRED: "deferred",
    NotClaimedOutcome.RUNNING: "deferred",
    NotClaimedOutcome.UNKNOWN: "unanswered",
}

# What an end write counts as, by its outcome (a commit's; the others count apart).
COMMIT_COUNTS: dict[FinishOutcome, str] = {
    FinishOutcome.DONE: "committed",
    FinishOutcome.REJECTED: "rejected",
    FinishOutcome.FAILED: "failed",
    FinishOutcome.UNKNOWN: "commit_unknown",
    FinishOutcome.INVALID: "commit_invalid",
}


def result_json(result: Any) -> str | None:
    """The handler's result as canonical JSON, or None when it is not JSON."""
    try:
        return json.dumps(result, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    except (TypeError, ValueError):
        return None


def json_problem(value: Any, where: str = "result") -> str | None:
    """Where ``value`` stops being JSON, named for the person who wrote the handler
    (``result['rows'][2]: datetime is not JSON ...``); None when it is JSON. The first
    such place, depth first, as ``json.dumps`` would meet it."""
    if value is None or isinstance(value, str | bool | int | float):
        return None
    if isinstance(value, dict):
        for k, v in value.items():
            if not (k is None or isinstance(k, str | bool | int | float)):
                return f"{where}: key {k!r} ({type(k).__name__}) is not a JSON key"
            problem = json_problem(v, f"{where}[{k!r}]")
            if problem is not None:
                return problem
        kinds = sorted({type(k).__name__ for k in value})
        if len(kinds) > 1:  # sort_keys cannot order a str beside an int
            return f"{where}: keys of several types ({', '.join(kinds)})"
        return None
    if isinstance(value, list | tuple):
        for i, v in enumerate(value):
            problem = json_problem(v, f"{where}[{i}]")
            if problem is not None:
                return problem
        return None
    return (
        f"{where}: {type(value).__name__} is not JSON (return str(...), numbers, lists, "
        "dicts, or a pydantic model's model_dump(mode='json'))"
    )


# ----------------------------------------------------------------------------- attempt


@dataclass(frozen=True)
class AttemptEnd:
    """What one attempt came to: its end write (``fin``; None when it wrote no end of
    its own) and whether its own flows deleted its message, SQS taking the delete
    (``deleted``): an ended job's (commit, fail, park, a stage handed on, a resend),
    or one the claim found done, stray, poison or exhausted, or one retired for a
    slot wait. A delete left to the worker's batch (``Finish.delete_pending``) is not
    made yet: not deleted. A Lambda record is a success exactly when ``deleted``
    (``invocation.record_flow``)."""

    fin: Finish | None = None
    deleted: bool = False

    @classmethod
    def wrote(cls, fin: Finish | None) -> AttemptEnd:
        """The end of an attempt that came to the end write ``fin`` (None: none)."""
        return cls(fin, fin is not None and fin.deleted)


def attempt_flow(env: AttemptEnv, item: Delivery | Poison, *, tag: Any = None) -> Flow[AttemptEnd]:
    """One received message, to its decided end (see the module doc).

    ``tag`` is kept on the book's entry for the shell (the simulator's task origin).
    Returns the end write, if the attempt wrote one, and whether it deleted its
    message (:class:`AttemptEnd`).
    """
    if isinstance(item, Poison):
        env.tally("poisoned", 1)
        deleted = yield from poison_flow(
            env.table, queue_url=env.queue_url, poison=item, dlq_url=env.dlq_url, body=item.body
        )
        return AttemptEnd(deleted=deleted)
    rules = rules_for(env, item.job_class, item.stage)
    now = yield from now_of(env)
    late, behind = env.book.before_claim(item.job_id, now.mono)
    if late is not None:
        # Our own lapsed attempt of this job goes back (its attempt given back) first.
        yield from hand_back_late_flow(env, late, now.mono)
        now = yield from now_of(env)
    elif behind is not None:
        yield from _defer_behind_hand_back(env, item, behind)
        return AttemptEnd()
    # Drawn only when needed: the random stream stays the retries' own.
    rand = 0.5 if rules is not None else (yield from ask("random", env.random))
    nonce = yield from nonce_of(env)
    try:
        return (yield from _claim_and_run(env, item, rules, now, nonce, rand, tag))
    finally:
        # Held, refused, or ended before its hold: the claim is no longer the book's
        # news (``LeaseBook.owns``); a flow closed midway forgets it too.
        env.book.unclaim(nonce)


def _claim_and_run(
    env: AttemptEnv,
    item: Delivery,
    rules: ClassRules | None,
    now: Now,
    nonce: str,
    rand: float,
    tag: Any,
) -> Flow[AttemptEnd]:
    claim = yield from _admit(env, item, rules, now.wall, nonce, rand=rand)
    if (
        isinstance(claim, NotClaimed)
        and claim.outcome is NotClaimedOutcome.RUNNING
        and rules is not None
    ):
        taken = yield from _owner_running(env, item, claim, rules, nonce)
        if taken is None:
            return AttemptEnd()
        claim = taken
    if not isinstance(claim, Claimed):
        env.tally(NOT_CLAIMED_COUNTS[claim.outcome], 1)
        return AttemptEnd(deleted=claim.deleted)
    env.tally("claimed", 1)
    env.tally("reclaimed", int(claim.reclaimed))
    if rules is None:  # pragma: no cover - admit_flow never claims it
        return AttemptEnd()
    if claim.job.stage is None and env.first_stage_of is not None:
        first = env.first_stage_of(claim.job.job_class)
        if first is not None:
            claim = replace(claim, job=replace(claim.job, stage=first))
    text = stage_input_json(claim.job)
    checked = yield Invoke("validate", lambda: rules.validate_payload(text))
    if isinstance(checked, Err):
        if not isinstance(checked.exc, PayloadError):
            raise checked.exc if checked.exc is not None else RuntimeError(checked.message)
        env.tally("poisoned", 1)
        invalid = Ending(EndKind.FAIL, str(checked.exc), "invalid_payload")
        failed = yield from _fail(AttemptAt(env, claim, rules), invalid, poisoned=True)
        yield from settle_attempt(env, claim, failed)
        return AttemptEnd.wrote(failed)
    assert isinstance(checked, Ok)
    payload = checked.response["value"]
    slots = yield from _take_slots(env, claim)
    if slots is not None and not slots.granted:
        retired = yield from _wait_for_slot(env, claim, slots)
        return AttemptEnd(deleted=retired)
    now = yield from now_of(env)
    held_rules: LeaseRules = rules
    budget = cap_budget(item, rules.stage_budget_seconds, now.wall)
    if budget < rules.lease_seconds:
        # Not one lease is left of the message's 12-hour cap (earlier receives used
        # it): the handler does not start; the job goes on under a new message.
        at = AttemptAt(env, claim, rules)
        resent = yield from resend_attempt(
            at,
            now,
            f"its earlier receives left {budget:.0f} s of SQS's 12-hour cap",
        )
        if slots is not None and slots.held:
            yield from _give_back(env, slots.held)
        yield from settle_attempt(env, claim, resent)
        return AttemptEnd.wrote(resent)
    if budget < rules.stage_budget_seconds:
        # Earlier receives of the message used part of SQS's 12-hour cap: this
        # attempt gets what is left, never a lease past the cap.
        held_rules = CappedRules(rules, budget)
        yield Emit(
            "stage_budget_capped",
            {
                "job_id": claim.job.job_id,
                "token": claim.token,
                "stage": claim.job.stage,
                "budget": round(budget, 3),
                "class_budget": rules.stage_budget_seconds,
            },
        )
    holding = env.book.hold(claim, held_rules, now.mono, env.new_signal(), tag)
    env.book.unclaim(nonce)  # the book's entry says the rest
    if holding.superseded:
        env.tally("own_claim_superseded", 1)
    if holding.event is not None:
        yield holding.event
    fin: Finish | None = None
    full = False
    try:
        at = AttemptAt(env, claim, rules, holding.held)
        try:
            fin = yield from _run(at, holding.held, payload, now.mono)
        except RecordUnreadable as exc:
            fin = yield from _unreadable_end(at, exc)
        # Queued while the book still holds the attempt: a stop that waits for the
        # ending attempts (``LeaseBook.ending``) then flushes this delete too.
        full = yield from _queue_delete(env, claim, fin)
    finally:
        env.book.forget(holding.held, fin)
    if slots is not None and slots.held:
        yield from _give_back(env, slots.held)
    if full:
        yield from flush_deletes_flow(env)
    return AttemptEnd.wrote(fin)


# ----------------------------------------------------------------------------- duplicates


def _owner_running(
    env: AttemptEnv, item: Delivery, found: NotClaimed, rules: ClassRules, nonce: str
) -> Flow[ClaimResult | None]:
    """The job's current message, but the record runs under another token: a live
    owner keeps the job (the delivery is deferred, None), a dead one is taken over
    (the claim's result). The rule: ``_core/duplicates.py``."""
    running = found.job
    assert running is not None
    own = rules_for(env, running.job_class, running.stage) or rules
    now = yield from now_of(env)
    if running.owner == env.worker_id:
        # One worker id, two attempts (a copy reached another of its threads): its
        # own book says whether the first still owns the job: holds a lease it
        # extends, or claimed it and has not held it yet (validating, taking its
        # slots), or has a claim of it under way (soak seeds 1040258, 1045173).
        alive = env.book.owns(running.job_id, running.token, now.mono)
    else:
        window = owner_window(own.heartbeat_seconds)
        # Keep the message while watching: a copy that came back meanwhile would
        # be received (one more receive) and watched again by another worker.
        hold = math.ceil(window) + own.lease_seconds
        cmv = yield from set_visibility(on_queue(item, env.queue_url), item.receipt_handle, hold)
        if isinstance(cmv, Ok):
            item = replace(item, visibility=math.floor(cmv.sent_at - item.received_at) + hold)
        alive = yield from owner_alive_flow(
            env.table,
            owner=running.owner or "",
            job_id=running.job_id,
            token=running.token,
            window=window,
        )
    if not alive:
        now = yield from now_of(env)
        claim = yield from _admit(env, item, rules, now.wall, nonce, take_from=running.token)
        if not (isinstance(claim, NotClaimed) and claim.outcome is NotClaimedOutcome.RUNNING):
            return claim
        # Claimed by another worker while this one watched: that owner is alive.
        running = claim.job if claim.job is not None else running
    yield from _defer(
        env,
        item,
        duplicate_defer(own.lease_seconds, item.receive_count),
        "owner_alive",
        owner=running.owner,
        token=running.token,
        receive_count=item.receive_count,
    )
    return None


def _admit(
    env: AttemptEnv,
    item: Delivery,
    rules: LeaseRules | None,
    wall_now: float,
    nonce: str,
    *,
    rand: float = 0.5,
    take_from: int | None = None,
) -> Flow[ClaimResult]:
    """``admit_flow`` for a delivery under its class's rules (None: a class this
    worker does not know); ``take_from``: the running token a take-over may replace.

    The book knows the claim from its write to its hold (``LeaseBook.owns``): a copy
    of the job that reaches another attempt of this worker meanwhile is deferred."""
    env.book.claiming(nonce, item.job_id)
    claim = yield from admit_flow(
        env.table,
        queue_url=env.queue_url,
        dlq_url=env.dlq_url,
        delivery=item,
        known_class=rules is not None,
        worker_id=env.worker_id,
        wall_now=wall_now,
        lease_seconds=rules.lease_seconds if rules else env.receive_visibility,
        max_attempts=rules.max_attempts if rules else UNKNOWN_CLASS_MAX_ATTEMPTS,
        unknown_class_receives=env.unknown_class_receives,
        rand=rand,
        keep_receive_lease=first_beat_reserve(rules, item.visibility) if rules else None,
        nonce=nonce,
        take_from=take_from,
    )
    if isinstance(claim, Claimed) and rules is not None:
        env.book.claimed(nonce, claim.token, claim.deadline - rules.jitter_seconds)
    else:
        env.book.unclaim(nonce)
    return claim


def _defer(env: AttemptEnv, item: Delivery, delay: int, reason: str, **fields: Any) -> Flow[None]:
    """Leave a delivery unclaimed for ``delay`` seconds (``claim_deferred``)."""
    cmv = yield from set_visibility(on_queue(item, env.queue_url), item.receipt_handle, delay)
    yield Emit(
        "claim_deferred",
        {
            "job_id": item.job_id,
            "message_id": item.message_id,
            "reason": reason,
            **fields,
            "delay": delay,
            "visibility_set": isinstance(cmv, Ok),
        },
    )
    env.tally("deferred", 1)


# ----------------------------------------------------------------------------- slots


def _take_slots(env: AttemptEnv, claim: Claimed) -> Flow[SlotGrant | None]:
    """The slots of the limits this job falls under (None: it falls under none)."""
    if env.slots is None:
        return None
    job = claim.job
    tenant = job.tenant
    pool, limit = job.job_class, None
    if job.stage is not None and env.slots.stage_limit is not None:
        # A stage's own limit (its class's concurrency_limit), in the pool of what it
        # belongs to: a stage limited to 2 (an upload to an ERP) shares no slots with
        # another stage; a planned tool's limit is one pool for every step calling it.
        own = env.slots.stage_limit(job.job_class, job.stage)
        if own is not None:
            pool, limit = own_pool(job.job_class, own[0]), own[1]
    else:
        limit = env.slots.class_limit(job.job_class)
    pools = pools_for(
        pool,
        limit,
        tenant,
        env.slots.tenant_limit(tenant) if tenant is not None else None,
    )
    if not pools:
        return None
    now = yield from now_of(env)
    grant: SlotGrant = yield from take_slots_flow(
        env.slots.requests,
        env.table,
        pools=pools,
        job_id=job.job_id,
        token=claim.token,
        worker_id=env.worker_id,
        wall_now=now.wall,
    )
    return grant


def _wait_for_slot(env: AttemptEnv, claim: Claimed, grant: SlotGrant) -> Flow[bool]:
    """No slot: the claim does not count and the job waits as a fresh message, so the
    wait is no receive its redrive counts (``_core/slots.py``, rules 4 and 6).
    Whether the received message was deleted (retired by the wait)."""
    rand: float = yield from ask("random", env.random)
    d = claim.delivery
    interactive = env.interactive_url is not None and d.queue_url == env.interactive_url
    delay = wait_delay(waits_of(d.send_id), rand, interactive=interactive)
    yield from slot_wait_event(claim.job.job_id, claim.token, grant, delay, waits_of(d.send_id))
    now = yield from now_of(env)
    pool = grant.waiting_for
    waited = yield from wait_flow(
        env.table,
        _end_request(env, claim, now),
        delay=delay,
        reason=f"waiting for a slot of {pool.name if pool else '?'}",
    )
    env.tally("waited_for_slot", 1)
    return waited.deleted


def _give_back(env: AttemptEnv, held: tuple[HeldSlot, ...]) -> Flow[None]:
    assert env.slots is not None
    now = yield from now_of(env)
    yield from give_back_flow(env.slots.requests, held, wall_now=now.wall)


def first_beat_reserve(rules: LeaseRules, visibility: int) -> float:
    """How much of the receive's lease must be left when the claim answers for the
    claim to keep it (no ChangeMessageVisibility: the protocol's floor).

    The first beat comes ``H`` after the receive (at once when the receive granted
    less than the class's L), so keeping the lease while at least ``min(V, L) - H``
    is left gives the first beat no less reserve than any later beat; and never
    less than ``H + J``, the reserve a beat needs to survive one miss
    (``check_beat_reserve``). With less left, the claim sets L itself."""
    lease, beat = rules.lease_seconds, rules.heartbeat_seconds
    return max(beat + rules.jitter_seconds, min(visibility, lease) - beat)


def _queue_delete(env: AttemptEnv, claim: Claimed, fin: Finish | None) -> Flow[bool]:
    """An end write that ended the job left its message to delete: queue it in the
    batch; True when this one filled the batch."""
    if fin is None or not fin.delete_pending or env.deletes is None:
        return False
    now = yield from now_of(env)
    d = claim.delivery
    return env.deletes.add(d.receipt_handle, claim.job.job_id, claim.token, now.mono, d.queue_url)


def settle_attempt(env: AttemptEnv, claim: Claimed, fin: Finish | None) -> Flow[None]:
    """Queue the ended job's delete, and send the batch when this one filled it."""
    if (yield from _queue_delete(env, claim, fin)):
        yield from flush_deletes_flow(env)


def flush_deletes_flow(env: AttemptEnv, *, force: bool = False) -> Flow[int]:
    """Send the deletes that are due (a full batch, or one that waited the window;
    ``force``: all, at shutdown) 10 per DeleteMessageBatch; how many SQS deleted.

    Never raises and never retries: an entry or a batch SQS refused is journaled
    (``message_delete_failed``) and left to its redelivery, which meets the job's
    terminal record at the claim and is deleted then."""
    if env.deletes is None:
        return 0
    deleted = 0
    now = yield from now_of(env)
    while batch := env.deletes.take(now.mono, force=force):
        entries = [{"Id": str(i), "ReceiptHandle": p.receipt_handle} for i, p in enumerate(batch)]
        out = yield Call(
            "sqs",
            "DeleteMessageBatch",
            {"QueueUrl": batch[0].queue_url or env.queue_url, "Entries": entries},
        )
        if isinstance(out, Err):
            for p in batch:
                yield Emit(
                    "message_delete_failed",
                    {
                        "job_id": p.job_id,
                        "token": p.token,
                        "error_code": out.code or out.kind.value,
                    },
                )
            continue
        assert isinstance(out, Ok)
        deleted += len(out.response.get("Successful", []))
        # Batch calls report per-entry failures on HTTP 200: always read Failed[].
        for bad in out.response.get("Failed", []):
            p = batch[int(bad["Id"])]
            yield Emit(
                "message_delete_failed",
                {"job_id": p.job_id, "token": p.token, "error_code": str(bad.get("Code", ""))},
            )
    return deleted


def _end_request(env: AttemptEnv, claim: Claimed, now: Now) -> EndRequest:
    """The end writes' request of a claimed attempt at ``now`` (its deletes batched
    when the shell keeps a delete batch)."""
    return EndRequest(
        queue_url=env.queue_url,
        job=claim.job,
        delivery=claim.delivery,
        worker_id=env.worker_id,
        wall_now=now.wall,
        nonce=claim.nonce,
        defer_delete=env.deletes is not None,
    )


@dataclass(frozen=True)
class AttemptAt:
    """One attempt as its ending steps see it: the shell's env, the claim, the class,
    and the book's entry (None: a write right after the claim, before it was held)."""

    env: AttemptEnv
    claim: Claimed
    rules: ClassRules
    held: Held | None = None

    def handle_ours(self, now: Now) -> bool:
        """Whether a visibility change with this attempt's receipt handle is still safe
        (``LocalLease.handle_ours``; before the attempt is held: the claim's own)."""
        return self.held is None or self.held.lease.handle_ours(now.mono)

    def lapsed(self, now: Now) -> tuple[str, ...]:
        """This attempt's receipt handle when a release must not change its visibility."""
        return () if self.handle_ours(now) else (self.claim.delivery.receipt_handle,)

    def end(self, now: Now) -> EndRequest:
        """What every end write of this attempt shares, written at ``now``."""
        return _end_request(self.env, self.claim, now)

    def rejected(self, fin: Finish, source: LossSource) -> Flow[None]:
        """A rejected end write: the loss, journaled once."""
        ev = self.env.book.rejected(self.held, self.claim, fin, source)
        if ev is not None:
            yield ev


def _unreadable_end(at: AttemptAt, exc: RecordUnreadable) -> Flow[Finish]:
    """A write after the handler met a job record this version cannot read (a state an
    outside writer or a newer version put there). Every such write is conditional on
    the record running under this attempt's token, so the record is not ours, whatever
    else it holds: the attempt writes nothing more, keeps its message (it comes back
    when its visibility lapses, and the claim decides), and reports the loss once.
    The one place for it, whichever write of whichever ending met the record."""
    claim = at.claim
    yield Emit(
        "job_record_unreadable",
        {"job_id": claim.job.job_id, "token": claim.token, "stage": "end", "reason": str(exc)},
    )
    fin = Finish(FinishOutcome.REJECTED, "job record unreadable")
    yield from at.rejected(fin, LossSource.COMMIT)
    return fin


def _run(at: AttemptAt, held: Held, payload: Any, start: float) -> Flow[Finish | None]:
    env, claim = at.env, at.claim
    error: Exception | None = None
    result: Any = None
    t = yield from now_of(env)
    if env.book.lapsed_before_start(held, t.mono):
        yield from hand_back_late_flow(env, held, t.mono)
        return None
    if env.book.told(held) is None:  # claimed while the worker stops: do not start
        run = HandlerRun(held, claim, at.rules, payload, env.run_handler)
        out = yield Invoke("handler", run)
        if isinstance(out, Err):
            exc = out.exc
            if not isinstance(exc, Exception):
                raise exc if exc is not None else RuntimeError(out.message)
            error = exc
        elif out is not None:
            result = plain_data(out.response["value"])
    if isinstance(error, LeaseLost) and not isinstance(error, JobCancelled):
        # The handler's own fenced call was refused (a 412 on ``ctx.fence_headers``):
        # the same proof of another owner as a refused intent start, told once.
        ev = env.book.intent_refused(held, str(error), LossSource.HANDLER)
        if ev is not None:
            yield ev
    stop = env.book.mark(held)
    if env.observer is not None:
        env.observer.handler_ended(held, stop)
    # A handler told to stop may return a partial result: never committed.
    end = stopped_ending(ending_for(error, claim.job.payload_json), stop)
    now = yield from now_of(env)
    if end.kind is EndKind.RELEASE:
        released = yield from release_flow(
            env.table,
            queue_url=env.queue_url,
            held=[(claim.job, claim.delivery)],
            worker_id=env.worker_id,
            wall_now=now.wall,
            reason=end.reason,
            nonce=claim.nonce,
            lapsed=at.lapsed(now),
        )
        env.tally("released", released)
        return None
    if end.kind is EndKind.COMMIT:
        return (yield from _commit(at, result, now, now.mono - start))
    if end.kind is EndKind.ABANDON:
        # The handler stopped before an irreversible step, or returned after its
        # attempt was told to stop (result_discarded): nothing may be written for
        # this attempt. The message comes back when its visibility lapses.
        env.tally("lost", 1)
        yield Emit(
            "result_discarded" if end.code == "result_discarded" else "job_abandoned",
            {
                "job_id": claim.job.job_id,
                "token": claim.token,
                "error_code": end.code,
                "stop": stop.value if stop is not None else None,
                "duration": round(now.mono - start, 3),
            },
        )
        return None
    if end.kind is EndKind.FAIL:
        return (yield from _fail(at, end, now))
    if end.kind is EndKind.PARK:
        # Nobody can tell whether the effect applied: stop automatic retries of
        # this job and keep everything for an operator (sqs-lease intents ...).
        env.tally("parked", 1)
        fin = yield from park_flow(env.table, at.end(now), reason=end.reason)
        yield from at.rejected(fin, LossSource.PARK)
        return fin
    return (yield from retry_attempt(at, end, now))


def _commit(at: AttemptAt, result: Any, now: Now, duration: float) -> Flow[Finish]:
    env = at.env
    if isinstance(result, NextStage):
        return (yield from _continue(at, result, now, duration))
    text = result_json(result)
    if text is None:
        why = json_problem(result) or "it cannot be written as JSON"
        bad = Ending(
            EndKind.FAIL, f"handler returned a result that is not JSON: {why}", "bad_result"
        )
        return (yield from _fail(at, bad, now))
    if env.observer is not None:
        env.observer.committing(at.claim, text)
    # A result over DynamoDB's item limit (with the payload) is never sent: the
    # core's commit_flow fails the job naming the limit. Always attempt the fenced
    # commit, even when the heartbeat already saw the lease lost: DynamoDB's
    # condition is the only arbiter, and a rejected commit is the record forensics
    # needs (result_rejected).
    fin = yield from commit_flow(
        env.table,
        at.end(now),
        result_json=text,
        duration=duration,
        keep_rejected_content=at.rules.keep_rejected_results,
    )
    env.tally(COMMIT_COUNTS[fin.outcome], 1)
    yield from at.rejected(fin, LossSource.COMMIT)
    return fin


def _continue(at: AttemptAt, nxt: NextStage, now: Now, duration: float) -> Flow[Finish]:
    """The handler ended its stage with ``NextStage``: checkpoint, next message, delete
    (``stages.continue_flow``); a next stage the job does not have, or an input its
    payload model refuses, fails the job naming the stage and the field."""
    env, job = at.env, at.claim.job
    lookup = env.stage_rules_of
    rules = lookup(job.job_class, nxt.name) if lookup and isinstance(nxt.name, str) else None
    why = refused_next(job, nxt, rules is not None)
    text = result_json(nxt.payload)
    if why is None and (text is None or result_json(nxt.checkpoint) is None):
        why = f"NextStage({nxt.name!r}): its payload and result must be JSON"
    if why is None and rules is not None and text is not None:
        checked = yield Invoke("validate", lambda: rules.validate_payload(text))
        if isinstance(checked, Err):
            if not isinstance(checked.exc, PayloadError):
                raise checked.exc if checked.exc is not None else RuntimeError(checked.message)
            why = f"NextStage({nxt.name!r}): {checked.exc}"
    if why is not None or text is None:
        bad = Ending(EndKind.FAIL, why or "", "bad_next_stage")
        return (yield from _fail(at, bad, now))
    done = yield from continue_flow(
        env.table, at.end(now), nxt=nxt, input_json=text, duration=duration
    )
    env.tally(COMMIT_COUNTS[done.fin.outcome], 1)
    yield from at.rejected(done.fin, LossSource.COMMIT)
    return done.fin


def retry_attempt(at: AttemptAt, end: Ending, now: Now | None = None) -> Flow[Finish]:
    """A counted retry after a backoff drawn now (or, past the attempts, a failure)."""
    env, claim, rules = at.env, at.claim, at.rules
    rand: float = yield from ask("random", env.random)
    delay = backoff_delay(
        claim.attempt, rules.backoff_base_seconds, rules.backoff_max_seconds, rand
    )
    if now is None:
        now = yield from now_of(env)
    fin = yield from retry_flow(
        env.table,
        at.end(now),
        reason=end.reason,
        error_code=end.code,
        delay=delay,
        max_attempts=rules.max_attempts,
        handle_ours=at.handle_ours(now),
    )
    if fin.outcome is FinishOutcome.DONE:
        spent = claim.attempt >= attempts_allowed(claim.job, rules.max_attempts)
        env.tally("failed" if spent else "retried", 1)
    elif fin.outcome is FinishOutcome.FAILED:
        env.tally("failed", 1)
    yield from at.rejected(fin, LossSource.RETRY)
    return fin


def _fail(
    at: AttemptAt, end: Ending, now: Now | None = None, *, poisoned: bool = False
) -> Flow[Finish]:
    """The job fails for good (``poisoned``: its message carried an invalid payload)."""
    env, claim = at.env, at.claim
    if poisoned:
        yield Emit(
            "message_poisoned",
            {
                "job_id": claim.job.job_id,
                "token": claim.token,
                "error_code": end.code,
                "reason": end.reason,
            },
        )
    if now is None:
        now = yield from now_of(env)
    fin = yield from fail_flow(env.table, at.end(now), reason=end.reason, error_code=end.code)
    if fin.outcome is FinishOutcome.DONE and not poisoned:
        env.tally("failed", 1)
    yield from at.rejected(fin, LossSource.FAIL)
    return fin


# ----------------------------------------------------------------------------- effects


def held_effect_flow(
    env: AttemptEnv,
    held: Held,
    spec: EffectSpec,
    *,
    wall_clock: Callable[[], float],
    flow_id: str,
) -> Flow[EffectResult]:
    """One side effect of a held attempt (``ctx.effect``): ``effect_flow`` under its
    token; a refused intent start while the lease was open is the first news of
    its loss, told to the book (and journaled) before ``LeaseLost`` reaches the
    handler."""
    try:
        return (
            yield from effect_flow(
                env.intents,
                env.table,
                spec=spec,
                token=held.lease.token,
                worker_id=env.worker_id,
                wall_clock=wall_clock,
                flow_id=flow_id,
                own_starts=env.own_starts,
            )
        )
    except LeaseLost as exc:
        ev = env.book.intent_refused(held, str(exc))
        if ev is not None:
            yield ev
        raise


def resend_attempt(at: AttemptAt, now: Now, why: str) -> Flow[Finish]:
    """The job goes on under a new message (``stages.resend_flow``), uncharged: its
    message reached SQS's 12-hour cap. A refused write is this attempt's loss."""
    env = at.env
    reason = f"message cap: {why}; attempt not charged"
    fin = yield from resend_flow(env.table, at.end(now), reason=reason)
    env.tally("resent", int(fin.outcome is FinishOutcome.DONE))
    yield from at.rejected(fin, LossSource.RETRY)
    return fin


def _defer_behind_hand_back(env: AttemptEnv, item: Delivery, age: float) -> Flow[None]:
    """The job's lapsed attempt is being handed back by another flow of this worker:
    a claim now could land before that release and charge the job an attempt for the
    worker's own lateness, so the message comes back later, unclaimed."""
    yield from _defer(env, item, hand_back_defer(age), "hand_back_under_way")


__all__ = [
    "AttemptAt",
    "AttemptEnd",
    "attempt_flow",
    "first_beat_reserve",
    "flush_deletes_flow",
    "held_effect_flow",
    "resend_attempt",
    "result_json",
    "retry_attempt",
    "settle_attempt",
]
