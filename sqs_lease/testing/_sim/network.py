"""The network: an AWS call or a target's call travels, is applied, and its answer travels back.

A call reaches its service after a seeded latency and is applied there at that
instant; its answer travels back. A partition drops the request or the answer, a
slow call arrives after the client has given up (the SDK retries it, the service
may apply both), a paused process sees its answers only when it resumes, a crashed
one never. A receive waits on the queue as SQS's long poll does.
"""

from __future__ import annotations

import http.client
from typing import TYPE_CHECKING

from ..._core.calls import Call, Err, ErrorKind, Ok, Outcome
from ..._core.intents import ToolResult
from ..._errors import LeaseLost, ToolNotApplied, ToolOutcomeUnknown
from .invariants import TRANSIENT_REASONS
from .receiver import Reply
from .render import brief, call_key, txn_kind
from .sqs import Wait
from .tasks import Actor, CallOp, Pending, Remote, SimCheck, SimTool, Task

if TYPE_CHECKING:
    from .world import World


# --------------------------------------------------------------------------- AWS calls


def latency(world: World, actor: Actor) -> float:
    lo, hi = world.plan.latency
    # random.Random.uniform(lo, hi) is lo + (hi - lo) * random(): the same draw
    lat = lo + (hi - lo) * world.chaos.rng.random()
    if actor.faulty:
        lat += actor.extra_latency(world.now)
        if world.chaos.roll("slow_call", world.plan.slow_call):
            lat += world.chaos.uniform(0.5, 12.0)
    return lat


def _timeout_for(world: World, actor: Actor, c: Call) -> float:
    if c.op == "ReceiveMessage":
        return float(c.params.get("WaitTimeSeconds", 0)) + 5.0
    return world.plan.read_timeout if actor.faulty else 30.0


def call(world: World, task: Task, op: CallOp) -> None:
    """Send an AWS call for ``task``; the task resumes with its outcome (or a timeout)."""
    actor = task.actor
    c = op.call
    world.checker.now = world.now
    world.checker.call_sent(c, op.origin, actor.mono())
    attempts = 1 if (c.op == "ReceiveMessage" or not actor.faulty) else world.plan.sdk_attempts
    pending = Pending(task, actor.mono())
    _attempt(world, pending, op, attempts)


def _attempt(world: World, p: Pending, op: CallOp, left: int) -> None:
    actor = p.task.actor
    c = op.call
    p.attempt += 1
    attempt = p.attempt
    t0 = world.now
    timeout = _timeout_for(world, actor, c)

    def on_timeout() -> None:
        if p.done or p.attempt != attempt:
            return
        if left > 1:
            _resend(world, p, op, attempt, left)
            return
        p.done = True
        p.on_timeout = None
        err = Err(
            ErrorKind.UNREACHABLE,
            "ReadTimeoutError",
            "",
            f"{c.service} {c.op}: no answer within {timeout:g} s",
            sent_at=p.sent_mono,
        )
        # What ends the attempt now is a call with no answer (any call: seed 411093
        # gave up on a timed-out UpdateItem after an earlier transient cancel).
        op.origin.transient_cancel = False
        if world.trace:
            world.record(actor.id, "call_timeout", {"op": c.op, "key": call_key(c)})
        world.resume(p.task, err)

    # The client's timeout is armed only when it can matter: the request is lost,
    # or arrives too late, or (decided when it applies) its answer is.
    p.on_timeout = on_timeout
    if actor.faulty and actor.cut(c.service, t0, request=True):
        world.chaos.count("request_dropped")
        p.armed = True
        world.at(t0 + timeout, on_timeout)
        return
    lat = latency(world, actor)
    world.at(t0 + lat, lambda: _apply(world, p, attempt, op, t0, timeout, left))
    p.armed = lat >= timeout or c.op == "ReceiveMessage"
    if p.armed:
        world.at(t0 + timeout, on_timeout)


def _resend(world: World, p: Pending, op: CallOp, attempt: int, left: int) -> None:
    """The SDK sends the call again (after a timeout, a throttle or a 5xx): at once in a
    drawn world, after botocore's standard backoff in a fleet (``World.sdk_backoff``)."""
    world.chaos.count("sdk_retry")
    backoff = world.sdk_backoff
    if backoff is None:
        _attempt(world, p, op, left - 1)
        return
    p.attempt += 1  # the waited-for attempt's timeout (if armed) no longer applies
    world.at(world.now + backoff(attempt), lambda: _attempt(world, p, op, left - 1))


def _service(world: World, op: CallOp) -> Outcome | Wait:
    c = op.call
    if c.service == "dynamodb":
        world.checker.now = world.now
        out = world.ddb.handle(c.op, c.params, world.now, op.origin)
        if isinstance(out, Err) and out.code == "IdempotentParameterMismatchException":
            world.checker.token_mismatch(c, op.origin)
        return out
    return world.sqs.handle(c.op, c.params, world.now)


def _apply(
    world: World, p: Pending, attempt: int, op: CallOp, t0: float, timeout: float, left: int
) -> None:
    out = _service(world, op)
    if isinstance(out, Wait):
        _long_poll(world, p, attempt, op, t0, timeout, out)
        return
    if isinstance(out, Ok):
        p.applied = min(p.applied or attempt, attempt)
    _answer(world, p, attempt, op, t0, timeout, left, out)


def _long_poll(
    world: World, p: Pending, attempt: int, op: CallOp, t0: float, timeout: float, first: Wait
) -> None:
    state = {"done": False}
    until = first.until

    def poll() -> None:
        if state["done"]:
            return
        if not p.task.actor.alive:
            state["done"] = True  # the process is gone, and its connection with it
            return
        out = _service(world, op)
        if isinstance(out, Wait):
            if world.now >= until - 1e-9:
                out = Ok({})
            else:
                arm(out.next_visible)
                return
        state["done"] = True
        _answer(world, p, attempt, op, t0, timeout, 1, out)

    def over() -> bool:
        return state["done"] or not p.task.actor.alive

    def woken() -> bool:
        if over():
            return False  # pass the wake-up on to the next waiting poll
        world.at(world.now, poll)
        return True

    def arm(nxt: float | None) -> None:
        # (the Wait's next_visible: the queue as the poll just saw it, this instant)
        when = until if nxt is None else min(until, nxt)
        world.at(when, poll)
        world.sqs.wait(woken, over)

    arm(first.next_visible)


def _answer(
    world: World,
    p: Pending,
    attempt: int,
    op: CallOp,
    t0: float,
    timeout: float,
    left: int,
    out: Outcome,
) -> None:
    actor = p.task.actor
    c = op.call
    if world.trace:
        world.record("aws", c.op, {"from": actor.id, "key": call_key(c), "out": brief(out)})
    t_back = world.now + latency(world, actor)
    lost = actor.faulty and (
        actor.cut(c.service, t_back, request=False)
        or world.chaos.roll("lost_response", world.plan.lost_response)
    )
    if lost or t_back > t0 + timeout:
        if not lost:
            world.chaos.count("late_answer")
        if p.attempt == attempt and not p.armed and p.on_timeout is not None:
            p.armed = True
            world.at(t0 + timeout, p.on_timeout)
        return  # the client's timeout decides what it sees

    def deliver() -> None:
        if p.done or p.attempt != attempt:
            return
        if c.op == "TransactWriteItems" and 0 < p.applied < attempt:
            # The SDK resent a transaction whose first try applied, and the worker
            # sees the resend's answer: success where the ClientRequestToken made it
            # idempotent (AWS), a cancellation where it did not (moto, or no token).
            kind = f"retried_applied_{txn_kind(c)}"
            world.checker.bump(kind)
            world.record(
                actor.id, "sim_note", {"kind": kind, "key": call_key(c), "out": brief(out)}
            )
        if (
            isinstance(out, Err)
            and out.kind in (ErrorKind.THROTTLED, ErrorKind.SERVER)
            and left > 1
        ):
            _resend(world, p, op, attempt, left)
            return
        p.done = True
        p.on_timeout = None
        # I8 charges a give-up to the last failure before it. A later error (seed
        # 989: a throttled plain UpdateItem, which the core reads as "outcome
        # unknown" by design) replaces the cancel as the cause; a read that only
        # looks at what the cancel left (a refused start's GetItem) does not.
        if c.op == "TransactWriteItems" or isinstance(out, Err):
            op.origin.transient_cancel = c.op == "TransactWriteItems" and _transient_cancel(out)
        world.resume(p.task, out, p.sent_mono)

    world.at(t_back, deliver)


# --------------------------------------------------------------------------- targets


def remote(world: World, task: Task, r: Remote) -> None:
    """Send a tool call or a check to its target; the task resumes with its outcome."""
    actor = task.actor
    p = Pending(task, actor.mono())
    t0 = world.now
    timeout = r.timeout

    def on_timeout() -> None:
        if p.done:
            return
        late: Exception = (
            ToolOutcomeUnknown(f"{r.target}: timeout after {timeout:g} s", code="timeout")
            if r.kind == "tool"
            else TimeoutError(f"{r.target} check: timeout after {timeout:g} s")
        )
        world.chaos.count("tool_timeout" if r.kind == "tool" else "check_timeout")
        _deliver_remote(world, p, r, _raised(late, p.sent_mono))

    p.on_timeout = on_timeout
    if actor.faulty and actor.cut("target", t0, request=True):
        world.chaos.count("request_dropped")
        if r.kind == "tool" and world.chaos.chance(0.5):
            # Connection refused: certainly nothing was sent.
            exc: Exception = ToolNotApplied("target: connection refused", code="refused")
            world.at(t0 + 0.001, lambda: _deliver_remote(world, p, r, _raised(exc, p.sent_mono)))
            return
        p.armed = True
        world.at(t0 + timeout, on_timeout)
        return
    lat = latency(world, actor)
    if isinstance(r, SimTool):
        world.receivers.sent(r.target, r.key, r.token)
        if world.plan.wide.tool_work:
            # widened world: the target takes its time (a capture is not instant),
            # which is the window two jobs sharing a key can race in
            lat += world.chaos.wide.uniform(0.0, world.plan.wide.tool_work)
    world.at(t0 + lat, lambda: _remote_apply(world, p, r, t0, timeout))
    if lat >= timeout:
        p.armed = True
        world.at(t0 + timeout, on_timeout)


def _remote_apply(world: World, p: Pending, r: Remote, t0: float, timeout: float) -> None:
    actor = p.task.actor
    out: Outcome
    world.checker.now = world.now  # the fence tells the checker what it admits (I1)
    if isinstance(r, SimTool):
        applied_before = len(world.receivers.ledger)
        reply = world.receivers.apply(
            r.target,
            key=r.key,
            resource=r.resource,
            scope=r.scope,
            token=r.token,
            payload_hash=r.payload_hash,
            worker=r.worker,
            now=world.now,
        )
        out = _tool_outcome(r, reply, p.sent_mono)
        if r.stage and len(world.receivers.ledger) > applied_before:
            # staged: an effect of a stage applied (even when answered 500 after)
            world.checker.stage_effect_applied(r.scope, r.stage, r.key, r.token, r.worker)
        if reply.status == 412:
            world.checker.now = world.now
            world.checker.owner_fenced(
                r.target,
                r.key,
                r.resource,
                r.scope,
                r.token,
                r.worker,
                world.truth(r.scope),
                reply.body.get("highest"),
            )
        elif 200 <= reply.status < 300:
            out = _after_success(world, r, out, p.sent_mono)
        if world.trace:
            world.record(
                r.target,
                "effect",
                {
                    "from": actor.id,
                    "key": r.key,
                    "token": r.token,
                    "status": reply.status,
                    "replayed": reply.replayed,
                },
            )
    else:
        assert isinstance(r, SimCheck)
        answer = world.receivers.check(
            r.target, key=r.key, resource=r.resource, scope=r.scope, token=r.token
        )
        out = Ok({"value": answer}, p.sent_mono)
        if world.trace:
            world.record(
                r.target,
                "check",
                {
                    "from": actor.id,
                    "key": r.key,
                    "token": r.token,
                    "verdict": answer.verdict.value,
                },
            )
    t_back = world.now + latency(world, actor)
    lost = actor.faulty and (
        actor.cut("target", t_back, request=False)
        or world.chaos.roll("lost_response", world.plan.lost_response)
    )
    if lost or t_back > t0 + timeout:
        if not p.armed and p.on_timeout is not None:
            p.armed = True
            world.at(t0 + timeout, p.on_timeout)
        return
    world.at(t_back, lambda: _deliver_remote(world, p, r, out))


def _after_success(world: World, r: SimTool, out: Outcome, sent: float) -> Outcome:
    """Widened world (cut_responses): the target applied, yet the caller sees an error.

    Either the answer is cut on its way back (the HTTP client raises what
    ``urllib``/``http.client`` raise then, and ``effects.http_json`` lets through)
    or the user's code parsing the success response raises.
    """
    w = world.plan.wide
    if world.chaos.roll_wide("tool_cut_response", w.cut_response):
        exc: Exception = world.chaos.wide.choice(
            [
                http.client.IncompleteRead(b'{"id": "', 64),
                http.client.BadStatusLine(""),
            ]
        )
        return _raised(exc, sent)
    if world.chaos.roll_wide("tool_parse_bug", w.parse_bug):
        return _raised(KeyError("charge_id"), sent)
    return out


def _deliver_remote(world: World, p: Pending, r: Remote, out: Outcome) -> None:
    if p.done:
        return
    p.done = True
    p.on_timeout = None
    world.resume(p.task, out)


# --------------------------------------------------------------------------- outcomes


def stamped(out: Outcome, sent: float, received: float) -> Outcome:
    """The outcome with the driver's monotonic stamps (as the sync driver sets them)."""
    if isinstance(out, Ok):
        return Ok(out.response, sent, received)
    return Err(
        out.kind,
        out.code,
        out.query_code,
        out.message,
        out.item,
        out.reasons,
        sent,
        received,
        out.exc,
    )


def _transient_cancel(out: Outcome) -> bool:
    """A transaction cancelled only for transient reasons (throttling, a conflict)."""
    if not isinstance(out, Err) or out.kind is not ErrorKind.TRANSACTION_CANCELLED:
        return False
    codes = {str(r.get("Code", "")) for r in out.reasons} - {"None"}
    return bool(codes) and codes <= TRANSIENT_REASONS


def _raised(exc: Exception, sent: float) -> Err:
    return Err(ErrorKind.RAISED, type(exc).__name__, "", str(exc), None, (), sent, sent, exc)


def _tool_outcome(r: SimTool, reply: Reply, sent: float) -> Outcome:
    """What an HTTP tool (``effects.http_json``) makes of the target's answer."""
    status = reply.status
    if 200 <= status < 300:
        return Ok({"value": ToolResult(dict(reply.body), reply.external_id)}, sent)
    exc: Exception
    if status == 412:
        exc = LeaseLost(f"{r.target}: the receiver rejected fencing token {r.token}")
    elif status == 429:
        exc = ToolNotApplied(f"{r.target}: 429 too many requests", code="http_429")
    elif status == 409 or status >= 500:
        exc = ToolOutcomeUnknown(f"{r.target}: HTTP {status}", code=f"http_{status}")
    else:
        exc = ToolNotApplied(f"{r.target}: HTTP {status}", code=f"http_{status}", retry=False)
    return _raised(exc, sent)
