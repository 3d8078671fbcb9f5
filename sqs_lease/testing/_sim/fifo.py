"""The ``fifo`` world (issue 26): a FIFO queue with sessions, staged jobs with progress
hints, and resubmits racing a staged job's unsent continuation.

What a seed draws, from its own stream (``fifo-SEED``), so a seed with the feature off
runs byte for byte as before:

- a FIFO queue (and its FIFO DLQ: SQS wants both FIFO), about one run in four;
- sessions: 1-3 message groups; about 7 jobs in 10 are submitted in one, the others
  alone (their job id is their group, ``_core.fifo.message_group_id``);
- staged jobs (the ``staged`` feature's stages, turned on in 4 runs in 5 of this
  world), with ``interleave_stages`` on or off as the app allows: off, a job of
  several stages is submitted outside any session (the core refuses it in one);
- each stage after the first has an input model of its own that refuses another
  stage's input, as a real staged app's models do (a first stage takes ``{"n"}``,
  ``transform`` takes ``{"n", "stage": "transform"}``);
- progress hints: a cooperative staged job reports ``{"stage", "done"}`` after each
  work step (``ctx.progress(details)``); a stage that finds a hint of its own resumes
  after the steps it names, as a handler reading ``ctx.last_progress`` would;
- resubmits: 0-2 more submissions of a staged job by its producer, any time in the
  run, which may meet the job between a stage's checkpoint and its continuation's
  send (a worker died there, or its send failed) and take that send over.

The simulated SQS learns FIFO as AWS documents it (:class:`FifoQueue`): a group's
messages are received in the order sent and none while an earlier one of the group
is in flight; a ``MessageDeduplicationId`` seen on the queue in the last 5 minutes
(even of a message received and deleted) makes the send answer success and drop the
message; no per-message delay; ``MessageGroupId`` and (content-based deduplication
being off) ``MessageDeduplicationId`` are required; no duplicate deliveries.

The checker rules this world adds (:class:`FifoWorld`):

- ``I18_stage_checkpoint`` (a stage's checkpoint is its own): a stage never starts
  with the progress hint another stage saved (issue 26 defect 5);
- ``I4_unfinished_job`` (a correct run never ends failed): no job fails
  ``invalid_payload``: every input the world sends is valid for its stage (defect 6:
  a send taken over from the record named the first stage, whose model refused the
  next stage's input);
- ``I22_session_order`` (the order docs/operations.md promises a session): a
  session's messages run one at a time in the order they were sent, a staged job's
  next stage at the back of the session. A job of a session is never claimed through
  a message while a message of another job of the session, sent before it, is still
  on the queue (defect 9's rule: every send of a session's job goes in its session's
  group).
"""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from functools import cache
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, create_model

from ..._core.calls import Ok, Outcome
from ..._schema.group_requests import GroupTable
from . import producers
from .invariants import I4, I18, INVARIANTS

if TYPE_CHECKING:
    from ..._jobs import JobClass
    from .chaos import Chaos
    from .plan import JobPlan, RunPlan
    from .sqs import Message, Queue, SimSQS
    from .world import World

FIFO_FEATURES = ("fifo",)
FIFO_SUFFIX = ".fifo"
DEDUP_WINDOW = 300.0
"""SQS's deduplication interval: a deduplication id seen in the last 5 minutes (of a
message sent, even one received and deleted since) drops the send."""

I22 = "I22_session_order"
INVARIANTS[I22] = "a FIFO session's messages run one at a time, in the order they were sent"
ON = 0.25  # the share of runs with a FIFO queue
STAGED = 0.8  # of those, the share that make staged jobs (the staged feature's draw)


@dataclass(frozen=True)
class FifoPlan:
    """The fifo world of one run."""

    # job id -> the session (message group) its producer submits it in; absent: none
    sessions: Mapping[str, str] = field(default_factory=dict)
    interleave: bool = True  # the app submits staged jobs with interleave_stages=True
    hints: bool = False  # cooperative staged jobs report progress hints
    # job id -> when its producer submits it again (after the first submission)
    resubmits: Mapping[str, tuple[float, ...]] = field(default_factory=dict)


def _stream(seed: int) -> random.Random:
    return random.Random(f"fifo-{seed}")


def drawn(seed: int, allowed: frozenset[str]) -> bool:
    """Whether the seed's run has a FIFO queue (the stream's first draw)."""
    return _stream(seed).random() < ON and "fifo" in allowed


def forces_staged(seed: int, allowed: frozenset[str]) -> bool:
    """Whether the fifo world turns the ``staged`` feature on for this seed."""
    r = _stream(seed)
    on = r.random() < ON
    return on and r.random() < STAGED and "fifo" in allowed and "staged" in allowed


def draw(c: Chaos, plan: RunPlan, allowed: frozenset[str]) -> None:
    """Draw the fifo world after every other feature (its own stream, whatever is
    allowed; nothing is drawn from the run's other streams)."""
    r = _stream(plan.seed)
    on = r.random() < ON
    r.random()  # (forces_staged's draw)
    n_sessions = r.randint(1, 3)
    interleave = r.random() < 0.8
    hints = r.random() < 0.8
    picks = [
        (
            r.random() < 0.7,
            r.randrange(n_sessions),
            tuple(r.uniform(5.0, plan.cutoff) for _ in range(r.choice([0, 1, 1, 2]))),
        )
        for _ in plan.job_plans
    ]
    if not on or "fifo" not in allowed:
        return
    sessions: dict[str, str] = {}
    resubmits: dict[str, tuple[float, ...]] = {}
    for jp, (grouped, k, again) in zip(plan.job_plans, picks, strict=True):
        if grouped and (interleave or len(jp.stages) < 2):
            sessions[jp.job_id] = f"session-{k}"
        if jp.stages and again:
            resubmits[jp.job_id] = tuple(sorted(round(jp.submit_at + t, 3) for t in again))
    c.count("world_fifo")
    # A group runs its jobs one after another (and a job sent again for the 12-hour cap
    # goes behind the others): the drain's bound counts the largest group's jobs in a
    # row (soak seed 1607424: three long jobs of one session, 11.7 h an attempt).
    from .plan import serial_bound  # (plan imports this module)

    largest = max(Counter(sessions.values()).values(), default=1)
    plan.max_time = max(plan.max_time, serial_bound(plan, largest))
    plan.fifo = FifoPlan(sessions, interleave, hints, resubmits)
    plan.wide = replace(plan.wide, features=plan.wide.features | {"fifo"})
    plan.sqs = replace(plan.sqs, duplicate=0.0)  # FIFO: exactly-once, no duplicate copies


def queue_urls(plan: RunPlan, queue: str, dlq: str) -> tuple[str, str]:
    """The run's job queue and DLQ: FIFO ones (``.fifo``) in the fifo world."""
    if plan.fifo is None:
        return queue, dlq
    return queue + FIFO_SUFFIX, dlq + FIFO_SUFFIX


# --------------------------------------------------------------------------- SQS


@dataclass
class FifoQueue:
    """A simulated queue's FIFO state: each message's group, the deduplication ids
    seen (with when, and the message that carried them)."""

    groups: dict[str, str] = field(default_factory=dict)  # message id -> group
    dedup: dict[str, tuple[float, str]] = field(default_factory=dict)

    def group_of(self, m: Message) -> str:
        # a message the world sends by hand (poison, a stray) is alone in its group
        return self.groups.get(m.message_id, m.message_id)

    def receivable(self, q: Queue, visible: list[Message], now: float) -> list[Message]:
        """Of the visible messages, the head of each group none of whose messages is
        in flight, in the order sent. A receive of one message (a worker's: one per
        call from a FIFO queue) takes one of these heads; a receive of several (a
        Lambda mapping's) fills its batch behind them with :meth:`batch`."""
        blocked = {self.group_of(m) for m in q.messages.values() if m.visible_at > now}
        heads: dict[str, Message] = {}
        for m in sorted(visible, key=lambda m: m.seq):
            g = self.group_of(m)
            if g not in blocked and g not in heads:
                heads[g] = m
        return list(heads.values())

    def batch(self, q: Queue, heads: list[Message], want: int, now: float) -> list[Message]:
        """Up to ``want`` messages for one receive: each group's visible messages in the
        order sent, behind its head, the groups in the order of ``heads`` (as SQS fills
        a batch of several messages from a FIFO queue)."""
        live = sorted((m for m in q.messages.values() if m.visible_at <= now), key=lambda m: m.seq)
        out: list[Message] = []
        for head in heads:
            g = self.group_of(head)
            out.extend(m for m in live if self.group_of(m) == g and m.seq >= head.seq)
            if len(out) >= want:
                break
        return out[:want]


def send(sqs: SimSQS, q: Queue, fifo: FifoQueue, params: Mapping[str, Any]) -> Outcome:
    """SendMessage to a FIFO queue, as AWS answers it."""
    if int(params.get("DelaySeconds", 0)):
        return sqs._err(
            "InvalidParameterValue",
            f"Value {params.get('DelaySeconds')} for parameter DelaySeconds is invalid. "
            "Reason: The request include parameter that is not valid for this queue type.",
        )
    group = str(params.get("MessageGroupId") or "")
    if not group:
        return sqs._err(
            "MissingParameter", "The request must contain the parameter MessageGroupId."
        )
    dedup = str(params.get("MessageDeduplicationId") or "")
    if not dedup:
        return sqs._err(
            "InvalidParameterValue",
            "The queue should either have ContentBasedDeduplication enabled or "
            "MessageDeduplicationId provided explicitly",
        )
    body = str(params.get("MessageBody", ""))
    if not body:
        return sqs._err("MissingParameter", "The request must contain MessageBody")
    seen = fifo.dedup.get(dedup)
    if seen is not None and sqs.now - seen[0] < DEDUP_WINDOW:
        # "accepted successfully but not delivered": the earlier message's id
        sqs.chaos.count("fifo_deduplicated")
        return Ok({"MessageId": seen[1]})
    m = sqs.send(q, body, 0, params.get("MessageAttributes"))
    fifo.groups[m.message_id] = group
    fifo.dedup[dedup] = (sqs.now, m.message_id)
    return Ok({"MessageId": m.message_id})


# --------------------------------------------------------------------------- the app


class _FirstStage(BaseModel):
    """A staged job's first input in the fifo world: the payload and nothing else."""

    model_config = ConfigDict(extra="forbid")
    n: int


@cache
def _stage_model(stage: str) -> type[BaseModel]:
    """The input model of a stage after the first: it names its stage."""
    named: Any = Literal.__getitem__(stage)  # (a Literal of a value known at run time)
    model: type[BaseModel] = create_model(
        f"Sim{stage.title()}Input",
        __config__=ConfigDict(extra="forbid"),
        n=(int, ...),
        stage=(named, ...),
    )
    return model


def _hint(stage: str, done: int) -> str:
    return json.dumps({"stage": stage, "done": done}, separators=(",", ":"), sort_keys=True)


class FifoWorld:
    """The fifo world's part of a run: its app, its producer's sessions and resubmits,
    and its checker rules (the module doc)."""

    def __init__(self, world: World, plan: FifoPlan) -> None:
        self.world = world
        self.plan = plan
        self.groups = GroupTable(_groups_table())
        self._classes: dict[tuple[str, str], JobClass] = {}

    # ------------------------------------------------------------------ the producer

    def submit_args(self, jp: JobPlan) -> dict[str, Any]:
        """What the producer adds to a submission: the session, the stage count, and
        ``interleave_stages`` as the app allows."""
        group = self.plan.sessions.get(jp.job_id)
        args: dict[str, Any] = {"stages": max(1, len(jp.stages))}
        if group is not None:
            args.update(group=group, groups=self.groups, interleave_stages=self.plan.interleave)
        return args

    def schedule(self) -> None:
        """The producers' later submissions of the same jobs (a retry of the upstream
        event, a user pressing the button again)."""
        w = self.world
        for job_id, times in self.plan.resubmits.items():
            for k, when in enumerate(times, 1):

                def again(j: str = job_id, who: str = f"r{k}") -> None:
                    if w.chaos.active:
                        w.chaos.count("fifo_resubmit")
                    producers.submit(w, j, producer=who)

                w.at(when, again)

    # ------------------------------------------------------------------ the app's stages

    def stage_class(self, base: JobClass, job_class: str, stage: str) -> JobClass:
        """A stage's rules: the class's, with the stage's own input model."""
        from .plan import STAGE_NAMES

        key = (job_class, stage)
        cls = self._classes.get(key)
        if cls is None:
            model = _FirstStage if stage == STAGE_NAMES[0] else _stage_model(stage)
            cls = base.model_copy(update={"payload_model": model})
            self._classes[key] = cls
        return cls

    def next_input(self, job_id: str, stage: str) -> dict[str, Any]:
        """The input a stage hands to the next one (``NextStage``)."""
        return {"n": int(job_id.rsplit("-", 1)[1]), "stage": stage}

    # ------------------------------------------------------------------ progress hints

    def resume_from(self, job_id: str, stage: str, hint_json: str | None) -> int:
        """How many of the stage's steps its last owner reported done (0: none), read
        from ``ctx.last_progress``; a hint another stage saved is a violation (I18)."""
        if not self.plan.hints or not hint_json:
            return 0
        hint = json.loads(hint_json)
        if not isinstance(hint, dict) or hint.get("stage") != stage:
            c = self.world.checker
            c.now = self.world.now
            c.fail(
                I18,
                f"{job_id}: stage {stage} started with the progress hint {hint_json} another "
                "stage saved (a checkpoint keeps only what its stage needs; the next stage "
                "starts without a hint)",
            )
            return 0
        return int(hint.get("done", 0))

    def hint(self, stage: str, done: int) -> str | None:
        """The hint a cooperative staged job reports after ``done`` steps (None: off)."""
        return _hint(stage, done) if self.plan.hints else None

    # ------------------------------------------------------------------ the checker

    def job_written(
        self, old: Mapping[str, Any] | None, new: Mapping[str, Any] | None, origin: Any
    ) -> None:
        """A job record was written: a claim is checked for the session's order, a
        failure for an input the world never sent wrong."""
        if new is None or "state" not in new:
            return
        state = new["state"].get("S")
        job_id = str(new["job_id"]["S"])
        if state == "failed" and new.get("error_code", {}).get("S") == "invalid_payload":
            self._fail(
                I4,
                f"{job_id} failed invalid_payload at stage {new.get('stage', {}).get('S')}: "
                f"every input of this world is valid for its stage ({new.get('reason')})",
            )
            return
        if state != "running" or old is None:
            return
        if old.get("state", {}).get("S") == "running" and old.get("token") == new.get("token"):
            return
        session = self.plan.sessions.get(job_id)
        send_id = getattr(origin, "send_id", None)
        if session is None or send_id is None:
            return
        self._claimed(job_id, session, send_id)

    def _claimed(self, job_id: str, session: str, send_id: str) -> None:
        q = self.world.sqs.queues[self.world.queue_url]
        bodies = {m.message_id: _body(m.body) for m in q.messages.values()}
        mine = [
            m
            for m in q.messages.values()
            if bodies[m.message_id].get("job_id") == job_id
            and bodies[m.message_id].get("send_id") == send_id
        ]
        if not mine:
            return  # (deleted meanwhile: a stale handle's claim; nothing to compare)
        m = min(mine, key=lambda m: m.seq)
        for x in q.messages.values():
            other = bodies[x.message_id]
            k = other.get("job_id")
            if (
                x.seq < m.seq
                and k != job_id
                and "send_id" in other  # the protocol's sends (not the world's strays)
                and self.plan.sessions.get(str(k)) == session
                and self._runs(str(k), str(other["send_id"]))
            ):
                where = "in flight" if self.world.sqs.in_flight(x) else "waiting"
                self._fail(
                    I22,
                    f"{job_id} (session {session}) claimed through {m.message_id} while "
                    f"{x.message_id} of {k}, sent before it in the session, is still "
                    f"{where}: a session's messages run one at a time, in the order sent",
                )
                return

    def _runs(self, job_id: str, send_id: str) -> bool:
        """Whether a message of ``job_id`` sent as ``send_id`` can still run its job: the
        record waits for it or runs it (not ended, not parked, its current send). A
        leftover copy (soak seed 1510739: a delete under a receipt handle SQS had
        replaced by another receive, which SQS answers with success and does not apply)
        is deleted by its claim and runs nothing, so a later job of the session may go:
        the order the session promises is its jobs', not its leftovers'."""
        from .resources import JOBS

        item = self.world.ddb.get(JOBS, {"job_id": {"S": job_id}})
        if item is None or "state" not in item:
            return True  # not written yet: its producer is at work
        state = item["state"].get("S")
        if state in ("succeeded", "failed", "parked"):
            return False
        current = item.get("send_id", {}).get("S")
        return current is None or current == send_id  # (no send id: cannot tell, so it may)

    def _fail(self, name: str, message: str) -> None:
        c = self.world.checker
        c.now = self.world.now
        c.fail(name, message)


def _body(text: str) -> dict[str, Any]:
    try:
        out = json.loads(text)
    except ValueError:
        return {}
    return out if isinstance(out, dict) else {}


def _groups_table() -> str:
    from .resources import GROUPS

    return GROUPS
