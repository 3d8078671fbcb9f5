"""Fleet-wide concurrency limits: the slot rules, and the flows that take and give back slots.

A job class (a tool) may declare a fleet-wide limit on its jobs running at once
(``JobClass.concurrency_limit``), and a job may carry a tenant (set by the
producer) whose jobs have a limit of their own (``App(tenant_limit=...)``). Each
limit is a *pool* of ``limit`` slot records in the slots table (``PREFIX-slots``),
keyed ``POOL#i``. The rules, each one a function below:

1. **A slot is a lease with a token** (:func:`holder_live`). A slot record names
   its holder: a job and that job's fencing token. Its ``version`` rises by one at
   every take (the slot's own token): a take is a conditional write on the
   version it read, so two takers of one slot are ordered by DynamoDB and one
   loses. Its *time* is the holder job's lease: the slot is held exactly while the
   job's record says ``running`` under that token. A worker that dies leaves its
   jobs ``running``; their messages come back when their visibility (the lease
   ``L``) lapses, the next claim moves the token, and from then on the slot is
   free for anyone (a claim that moved on, a cancel, a finished job: the same).
   No slot needs a heartbeat of its own: the job's heartbeat (visibility + the
   ownership read) *is* the slot's, at no extra call.
2. **Free before stale** (:func:`candidates`): a slot never taken or given back is
   taken first; a stale one (rule 1) only when none is free, after reading its
   holders' records (one consistent BatchGetItem). A holder whose record cannot be
   read is counted live: a slot is never taken on a guess.
3. **Pools in one order, all or nothing** (:func:`pools_for`): the class's pool,
   then the tenant's; a job that cannot take every slot it needs gives back the
   ones it took before it waits. No job holds a slot while waiting for another,
   so no two jobs can wait on each other (no deadlock).
4. **Waiting costs no attempt and no receive** (:func:`wait_flow`): a job that
   finds no slot gives its claim back (record -> ``queued``, the attempt it counted
   returned) and waits as a *fresh message*: the same write that gives the claim
   back names a new send id (:func:`wait_send_id`), the message of that id is sent
   with the wait as its delay, and the received one is deleted. SQS's redrive
   counts the receives of one message, so a wait never brings a job nearer the DLQ
   (its ``maxReceiveCount`` counts only receives that could do work), however long
   the line is; and a delayed message is not in flight, so waiters take none of
   the queue's in-flight quota. The send id fence makes every step safe: the
   received message is retired by the write (should it come back, it claims
   nothing and is deleted as a stray), and a sender that dies before its send
   leaves the record in the ``unsent`` index, where the stranded sweep sends it,
   as it does a stage's continuation. On a FIFO queue (no per-message delay) the
   fresh message goes at once and the received one, left in flight for the wait,
   holds the job's group until it comes back as a stray. Waiting jobs hold no
   worker capacity, so a class at its limit never starves another class of
   workers. A record received and *not started* (a Lambda invocation whose time
   left cannot hold its stage budget, behind long records in its batch) waits
   the same way (:func:`unstarted_wait_flow`): with no claim to give back, the
   write that names the new send id is the take of the send, conditioned on the
   record queued under the received message's send id.
5. **Given back when the handler ends** (:func:`give_back_flow`): conditioned on
   the holder (job and token), so a late give-back of an attempt whose slot was
   taken over changes nothing. A give-back that gets no answer is harmless: rule 1
   frees the slot once the job's record moves on.
6. **Seniority reaches the slots** (:func:`wait_delay`): a full pool's next free
   slot goes to whoever is received first, so a waiter's chance is the rate at
   which it comes back. The delay therefore *falls* with the job's waits (carried
   in the send id): a short first wait (a pool is often full for a moment), then
   the back of the line (up to ``WAIT_CAP``), halving with each further wait down
   to ``WAIT_FLOOR``, so the job that has waited longest comes back most often
   and a newcomer never outpaces it; an interactive job waits half as long at
   every step. (A receive-count backoff did the opposite: it spaced out the oldest
   waiters most, so they starved first.)
7. **A claim is confirmed after its slots are taken** (:func:`_claim_moved`): one
   consistent read of the job's record must still say ``running`` under the claim's
   token, or the slots are given back and the job waits (rule 4, whose release is
   fenced on the token: a claim that moved on changes nothing). Nothing extends a
   claim while it takes its slots (its lease is held, and heartbeated, only once
   its handler may start), so a slow take can outlive it: a duplicate delivery's
   claim takes the job over, and the slots the first claim takes after that are
   stale at once (rule 1). Its handler must not start (soak seed 1862836).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from .._errors import RecordUnreadable
from .calls import Call, Err, ErrorKind, Flow, Ok, call, emit
from .endwrites import EndRequest, release_write
from .fencing import Finish, FinishOutcome, delete_message, set_visibility
from .fifo import is_fifo
from .messages import Delivery, on_queue
from .records import JobRequests, JobState, JobView, awaits_send
from .sending import send_record_message

CLASS_POOL = "class"
TENANT_POOL = "tenant"

MAX_LIMIT = 100
"""The most slots one pool may have: its records are read in one BatchGetItem."""

TAKE_ROUNDS = 3
"""Reads of a pool per take: another taker may win every candidate of one read."""

WAIT_FIRST = 2.0
"""Ceiling (seconds) of a job's first wait for a slot: a pool is often full only for
a moment."""
WAIT_CAP = 30.0
"""Ceiling of its second wait: it found the pool full twice, and goes to the back."""
WAIT_FLOOR = 8.0
"""The least ceiling: a job that keeps waiting comes back every 4 to 8 seconds (what a
long line costs: one receive and a few writes per waiter per ~6 s)."""
WAIT_SEND_PREFIX = "slotwait"
"""Send ids of a waiting job's fresh messages: ``slotwait.WAITS.TOKEN.JOB_ID``."""


@dataclass(frozen=True)
class Pool:
    """One limit: ``limit`` slots named ``name#0`` .. ``name#(limit-1)``."""

    name: str
    limit: int

    def slot_keys(self) -> list[str]:
        """The pool's slot keys."""
        return [f"{self.name}#{i}" for i in range(self.limit)]


@dataclass(frozen=True)
class SlotView:
    """One slot record as the core reads it (``version`` 0: never written)."""

    key: str
    version: int = 0
    job_id: str | None = None
    token: int | None = None
    owner: str | None = None

    @property
    def free(self) -> bool:
        """Never taken, or given back."""
        return self.job_id is None


@dataclass(frozen=True)
class HeldSlot:
    """A slot this attempt took: the key, and the holder the record names."""

    pool: str
    key: str
    job_id: str
    token: int


@dataclass(frozen=True)
class SlotGrant:
    """What :func:`take_slots_flow` did: every slot taken (``waiting_for`` None), or none
    (the pool it could not take a slot of, and why)."""

    held: tuple[HeldSlot, ...]
    waiting_for: Pool | None = None
    why: str = ""

    @property
    def granted(self) -> bool:
        return self.waiting_for is None


class SlotRequests(Protocol):
    """Builds DynamoDB calls for the slots table (``_schema.slot_requests.SlotTable``)."""

    def read(self, keys: Sequence[str]) -> Call:
        """A consistent BatchGetItem of these slot records."""
        ...

    def items(self, response: Mapping[str, Any]) -> list[Mapping[str, Any]]: ...

    def parse(self, item: Mapping[str, Any]) -> SlotView: ...

    def take(
        self,
        key: str,
        *,
        seen_version: int,
        job_id: str,
        token: int,
        worker_id: str,
        wall_now: float,
    ) -> Call:
        """Name the holder and raise the version, only if the version is still the one
        read (``seen_version`` 0: only if the record does not exist)."""
        ...

    def give_back(self, key: str, *, job_id: str, token: int, wall_now: float) -> Call:
        """Clear the holder (and raise the version), only if this job and token hold it."""
        ...


# ----------------------------------------------------------------------------- rules


def pools_for(
    job_class: str, class_limit: int | None, tenant: str | None, tenant_limit: int | None
) -> tuple[Pool, ...]:
    """Rule 3: the pools a job needs, always in the same order (class, then tenant)."""
    pools: list[Pool] = []
    if class_limit is not None:
        pools.append(Pool(f"{CLASS_POOL}:{job_class}", class_limit))
    if tenant is not None and tenant_limit is not None:
        pools.append(Pool(f"{TENANT_POOL}:{tenant}", tenant_limit))
    return tuple(pools)


def own_pool(job_class: str, unit: str) -> str:
    """The pool of a stage's own limit: ``CLASS:UNIT``, the unit being what the limit
    belongs to (the app's ``stage_limit``): a staged job's stage, or a planned job's
    tool, one pool across every plan and step that calls it."""
    return f"{job_class}:{unit}"


def holder_live(slot: SlotView, holder: JobView | None) -> bool:
    """Rule 1: the slot is held while its holder's record is running under its token."""
    if slot.free:
        return False
    if holder is None:  # the holder's record is gone: nobody holds the slot
        return False
    return holder.state is JobState.RUNNING and holder.token == slot.token


def candidates(
    views: Sequence[SlotView], holders: Mapping[str, JobView | None] | None
) -> list[SlotView]:
    """Rule 2: the slots worth trying, free ones first, then stale ones (only once the
    holders were read: ``holders`` None means they were not)."""
    free = [v for v in views if v.free]
    if holders is None:
        return free
    stale = [
        v
        for v in views
        if v.job_id is not None and v.job_id in holders and not holder_live(v, holders[v.job_id])
    ]
    return free + stale


def wait_send_id(waits: int, fence: int | str, job_id: str) -> str:
    """Rule 4: the send id of a waiting job's fresh message after its ``waits``-th wait.
    Unique per job (``fence``: the claim's token, and a wait ends its claim, so each
    token waits at most once; for a record never claimed, ``m`` and the retired
    message's id, each message retired at most once) and across jobs (the job id): a
    FIFO queue drops a message whose deduplication id (the send id) it saw in the
    last 5 minutes, from any job."""
    return f"{WAIT_SEND_PREFIX}.{waits}.{fence}.{job_id}"


def waits_of(send_id: str | None) -> int:
    """How many times the job of a message with this send id has waited for a slot
    (0: any other send: a submit, a retry, a stage, the sweep's re-send)."""
    parts = (send_id or "").split(".", 3)
    if len(parts) == 4 and parts[0] == WAIT_SEND_PREFIX and parts[1].isdigit():
        return int(parts[1])
    return 0


def wait_delay(waits: int, rand: float, *, interactive: bool = False) -> int:
    """Rule 6: the delay (seconds, >= 1) of a job's fresh message after it waited
    ``waits`` times before this one: its first wait short, then ``WAIT_CAP`` halving
    with each wait down to ``WAIT_FLOOR``; an interactive job's half; half of it
    jittered (``rand`` in [0, 1))."""
    later = max(WAIT_FLOOR, WAIT_CAP / 2.0 ** min(max(0, waits - 1), 30))
    ceiling = WAIT_FIRST if waits <= 0 else later
    if interactive:
        ceiling /= 2
    return max(1, round(ceiling / 2 + ceiling / 2 * rand))


def check_limit(what: str, limit: int | None) -> int | None:
    """A limit must be 1..MAX_LIMIT (or None: no limit). Returns it, or raises ValueError."""
    if limit is None:
        return None
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise ValueError(
            f"{what}={limit!r}: a concurrency limit is a whole number from 1 to {MAX_LIMIT} "
            "(or None for no limit)"
        )
    return limit


# ----------------------------------------------------------------------------- flows


def _read_slots(req: SlotRequests, pool: Pool) -> Flow[list[SlotView] | None]:
    out = yield from call(req.read(pool.slot_keys()))
    if isinstance(out, Err):
        return None
    assert isinstance(out, Ok)
    if out.response.get("UnprocessedKeys"):
        return None  # a partial read could hide a holder: wait instead
    found = {v.key: v for v in (req.parse(i) for i in req.items(out.response))}
    return [found.get(k, SlotView(k)) for k in pool.slot_keys()]


def _read_holders(
    jobs: JobRequests, views: Sequence[SlotView]
) -> Flow[dict[str, JobView | None] | None]:
    ids = sorted({v.job_id for v in views if v.job_id is not None})
    out = yield from call(jobs.batch_get(ids))
    if isinstance(out, Err):
        return None
    assert isinstance(out, Ok)
    unprocessed = (out.response.get("UnprocessedKeys") or {}) != {}
    seen: dict[str, JobView | None] = {}
    unreadable: set[str] = set()
    for item in jobs.batch_items(out.response):
        try:
            view = jobs.parse(item)
        except RecordUnreadable as exc:  # an unreadable holder counts live (rule 2)
            unreadable.add(exc.job_id or "")
            continue
        seen[view.job_id] = view
    if not unprocessed and "" not in unreadable:
        for job_id in ids:
            if job_id not in unreadable:
                seen.setdefault(job_id, None)  # read and absent: the record is gone
    return seen


def _take_one(
    req: SlotRequests,
    jobs: JobRequests,
    pool: Pool,
    *,
    job_id: str,
    token: int,
    worker_id: str,
    wall_now: float,
) -> Flow[tuple[HeldSlot | None, str]]:
    why = f"all {pool.limit} slots of {pool.name} are held"
    for _ in range(TAKE_ROUNDS):
        views = yield from _read_slots(req, pool)
        if views is None:
            return None, f"the slots of {pool.name} could not be read"
        holders: dict[str, JobView | None] | None = None
        if not any(v.free for v in views):
            holders = yield from _read_holders(jobs, views)
            if holders is None:
                return None, f"the holders of {pool.name}'s slots could not be read"
        tried = candidates(views, holders)
        if not tried:
            return None, why
        for v in tried:
            out = yield from call(
                req.take(
                    v.key,
                    seen_version=v.version,
                    job_id=job_id,
                    token=token,
                    worker_id=worker_id,
                    wall_now=wall_now,
                )
            )
            if isinstance(out, Ok):
                return HeldSlot(pool.name, v.key, job_id, token), ""
            if out.kind is ErrorKind.CONDITION_FAILED:
                continue  # another taker won this one: try the next
            # No answer: the take may have applied. Give it back (conditioned on this
            # job and token, so harmless if it did not) and wait.
            yield from call(req.give_back(v.key, job_id=job_id, token=token, wall_now=wall_now))
            return None, f"taking a slot of {pool.name} got no answer ({out.code or out.kind})"
    return None, why


def take_slots_flow(
    req: SlotRequests,
    jobs: JobRequests,
    *,
    pools: Sequence[Pool],
    job_id: str,
    token: int,
    worker_id: str,
    wall_now: float,
) -> Flow[SlotGrant]:
    """Take one slot of every pool, in order; all or nothing (rule 3); then confirm the
    claim they were taken for (rule 7)."""
    taken: list[HeldSlot] = []
    for pool in pools:
        got, why = yield from _take_one(
            req, jobs, pool, job_id=job_id, token=token, worker_id=worker_id, wall_now=wall_now
        )
        if got is None:
            yield from give_back_flow(req, taken, wall_now=wall_now)
            return SlotGrant((), pool, why)
        taken.append(got)
    if taken:
        lost = yield from _claim_moved(jobs, job_id, token)
        if lost is not None:
            yield from give_back_flow(req, taken, wall_now=wall_now)
            return SlotGrant((), pools[-1], lost)
    return SlotGrant(tuple(taken))


def _claim_moved(jobs: JobRequests, job_id: str, token: int) -> Flow[str | None]:
    """Rule 7: is the claim the slots were taken for still the record's? A slot is
    held only while its holder's record says ``running`` under the holder's token
    (rule 1), and nothing extends a claim while its slots are taken (its lease is
    held, and heartbeated, only once its handler may start): a claim that moved on
    meanwhile (taken over after a duplicate delivery, its takes slow) took slots that
    were stale the moment it took them, and its handler must not start (soak seed
    1862836: a third job of a tenant limited to two ran). Returns why it cannot go
    on (None: the record still says running under this token); a read without an
    answer cannot confirm it either."""
    out = yield from call(jobs.get(job_id))
    if isinstance(out, Err):
        return f"its claim (token {token}) could not be confirmed after taking its slots"
    item = out.response.get("Item")
    try:
        view = jobs.parse(item) if item else None
    except RecordUnreadable:
        view = None
    if view is None or view.state is not JobState.RUNNING or view.token != token:
        now = f"{view.state.value} under token {view.token}" if view is not None else "gone"
        return f"its claim (token {token}) moved on while it took its slots (the record is {now})"
    return None


def give_back_flow(req: SlotRequests, held: Sequence[HeldSlot], *, wall_now: float) -> Flow[int]:
    """Rule 5: give these slots back; how many writes answered (a refused or unanswered
    one is left to rule 1)."""
    given = 0
    for slot in held:
        out = yield from call(
            req.give_back(slot.key, job_id=slot.job_id, token=slot.token, wall_now=wall_now)
        )
        if isinstance(out, Ok):
            given += 1
    return given


def wait_flow(req: JobRequests, end: EndRequest, *, delay: int, reason: str) -> Flow[Finish]:
    """Rule 4: give the claim back and wait as a fresh message (``delay`` seconds on).

    ``end.job`` is the record as claimed (its token); ``end.nonce`` the attempt's, which
    its release write carries (``fencing.end_write_id``). Returns the release write:
    ``DONE`` when the claim was given back (``deleted``: the received message is gone,
    retired by its delete); a write refused or unanswered changes nothing more (the
    message is left to come back: a claim that moved on owns it, and an unknown write
    is either undone by the lease or followed by the sweep's send; no lease was held
    yet, so the release's own journal is the only one of a loss)."""
    job, delivery = end.job, end.delivery
    send_id = wait_send_id(waits_of(delivery.send_id) + 1, job.token, job.job_id)
    write_id = end.write_id("release")
    # The release names the fresh message's send id: it retires the received message.
    retire = req.release(
        job.job_id,
        job.token,
        end.worker_id,
        reason,
        end.wall_now,
        write_id=write_id,
        resend_id=send_id,
    )
    fin = yield from release_write(req, job, retire, write_id)
    if fin.outcome is not FinishOutcome.DONE:
        return fin
    gone = yield from _wait_as_fresh(req, end.home, job, delivery, send_id, end.wall_now, delay)
    return replace(fin, deleted=gone)


def unstarted_wait_flow(
    req: JobRequests, *, queue_url: str, delivery: Delivery, wall_now: float, delay: int
) -> Flow[bool]:
    """Rule 4 for a record received and not started (a Lambda invocation's record that
    its time left could not hold): it waits as a fresh message (``delay`` seconds on),
    so a record behind long ones in a batch never nears the DLQ however often it is
    not started. Nothing was claimed, so no claim is given back: the write that names
    the new send id is the take of the send (``take_send(retire=True)``), conditioned
    on the record queued under the received message's send id; it retires that
    message as wait_flow's release does. The send id carries the retired message's id
    where a claim's carries its token: each message is retired at most once.

    Returns whether the job waits; False when the record moved on (claimed by another
    copy, ended, or this message a stray): the caller hands the message back."""
    send_id = wait_send_id(
        waits_of(delivery.send_id) + 1, f"m{delivery.message_id}", delivery.job_id
    )
    took = yield from call(
        req.take_send(
            delivery.job_id,
            seen_send_id=delivery.send_id,
            new_send_id=send_id,
            wall_now=wall_now,
            retire=True,
        )
    )
    item = took.response.get("Attributes") if isinstance(took, Ok) else None
    if isinstance(took, Err) and took.kind is ErrorKind.CONDITION_FAILED:
        item = took.item  # our own write, retried after its answer was lost?
    try:
        job = req.parse(item) if item else None
    except RecordUnreadable as exc:
        yield from emit(
            "job_record_unreadable", job_id=delivery.job_id, stage="wait", reason=str(exc)
        )
        return False
    if job is None or job.send_id != send_id or not awaits_send(job):
        return False
    home = on_queue(delivery, queue_url)
    yield from _wait_as_fresh(req, home, job, delivery, send_id, wall_now, delay)
    return True


def _wait_as_fresh(
    req: JobRequests,
    home: str,
    job: JobView,
    delivery: Delivery,
    send_id: str,
    wall_now: float,
    delay: int,
) -> Flow[bool]:
    """Rule 4's wait, once the record names ``send_id``: send its message, retire the
    received one. ``home``: the queue it was received from (an interactive job stays
    interactive). Whether the received message was deleted (SQS took the delete)."""
    fifo = is_fifo(home)
    yield from send_record_message(
        req,
        job,
        queue_url=home,
        send_id=send_id,
        wall_now=wall_now,
        delay_seconds=0 if fifo else delay,
    )
    # Sent or not, the received message is retired (a failed send leaves the record
    # in the unsent index: the sweep sends it).
    if fifo:
        # No per-message delay: the retired message, in flight for the wait, holds
        # the job's group (the fresh one behind it) and then goes as a stray.
        yield from set_visibility(home, delivery.receipt_handle, delay)
        return False
    out = yield from delete_message(home, delivery.receipt_handle)
    return isinstance(out, Ok)


def slot_wait_event(
    job_id: str, token: int, grant: SlotGrant, delay: int, waits: int = 0
) -> Flow[None]:
    """Journal a job that waits for a slot (``job_waiting_for_slot``; ``waits``: how
    many times it waited before)."""
    pool = grant.waiting_for
    yield from emit(
        "job_waiting_for_slot",
        job_id=job_id,
        token=token,
        pool=pool.name if pool else None,
        limit=pool.limit if pool else None,
        reason=grant.why,
        delay=delay,
        waits=waits,
    )


__all__ = [
    "CLASS_POOL",
    "MAX_LIMIT",
    "TENANT_POOL",
    "HeldSlot",
    "Pool",
    "SlotGrant",
    "SlotRequests",
    "SlotView",
    "candidates",
    "check_limit",
    "give_back_flow",
    "holder_live",
    "own_pool",
    "pools_for",
    "take_slots_flow",
    "unstarted_wait_flow",
    "wait_delay",
    "wait_flow",
    "wait_send_id",
    "waits_of",
]
