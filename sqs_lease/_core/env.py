"""What a shell supplies to the core's worker flows (:class:`AttemptEnv`: the worker's
identity, requests, book, clocks, counter), and the values its ``Invoke`` instructions
carry and answer (:class:`Now`, :class:`HandlerRun`, :class:`ActFor`, :class:`Parallel`).
The instruction contract itself is told in :mod:`sqs_lease._core.attempt`."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from .calls import Flow, ask
from .claiming import Claimed
from .deletes import DeleteBatch
from .intents import IntentRequests
from .lease import LocalLease, Stop
from .leasebook import Held, LeaseBook, LeaseRules, Signal
from .records import JobRequests
from .retention import OwnStarts
from .slots import SlotRequests


class ClassRules(LeaseRules, Protocol):
    """A job class as the attempt flow sees it (``JobClass`` satisfies it)."""

    @property
    def keep_rejected_results(self) -> bool: ...

    def validate_payload(self, payload_json: str) -> Any: ...


@dataclass(frozen=True)
class Now:
    """The shell's two clocks, read together: ``mono`` (the lease clock) and ``wall``."""

    mono: float
    wall: float


@dataclass(frozen=True)
class HandlerRun:
    """``Invoke("handler").fn``: the attempt whose handler to run, and the shell's runner.

    Calling it runs ``runner(self)`` (a sync shell's way); an async shell or the
    simulator reads the fields and runs the handler its own way.
    """

    held: Held
    claim: Claimed
    rules: ClassRules
    payload: Any
    runner: Callable[[HandlerRun], Any]

    def __call__(self) -> Any:
        return self.runner(self)


@dataclass(frozen=True)
class ActFor:
    """``Invoke("act_for").fn``: the following calls act for these attempts' tokens
    (``kind`` names the task; ``tokens`` None: back to the flow's own)."""

    kind: str
    tokens: Mapping[str, int] | None = None

    def __call__(self) -> None:
        return None


@dataclass(frozen=True)
class Parallel:
    """``Invoke("parallel").fn``: independent flows to run at once (a heartbeat round's
    parts); the answer is their results, in order.

    Calling it runs ``runner(flows)``: the shell's way to run flows together (the
    thread worker's small pool, the async worker's ``gather``); the simulator runs
    them one after another in simulated time.
    """

    flows: tuple[Flow[Any], ...]
    runner: Callable[[Sequence[Flow[Any]]], Any]

    def __call__(self) -> Any:
        return self.runner(self.flows)


class Observer(Protocol):
    """Moments a checker may watch (the simulator's); shells that do not watch pass None."""

    def handler_ended(self, held: Held, stop: Stop | None) -> None: ...

    def committing(self, claim: Claimed, result_json: str) -> None: ...

    def round_planned(self, leases: list[LocalLease]) -> None: ...

    def round_applied(self, extended: tuple[LocalLease, ...]) -> None: ...

    def round_failed(self, exc: Exception) -> None: ...


@dataclass(frozen=True)
class SlotEnv:
    """The fleet-wide concurrency limits a shell's app declares (``_core/slots.py``):
    where the slots are, and the limit of a job class and of a tenant (None: none)."""

    requests: SlotRequests
    class_limit: Callable[[str], int | None]
    tenant_limit: Callable[[str], int | None]
    # A staged job's stage -> what its own limit belongs to and the limit (None: no
    # limit; no callable: the shell runs no staged jobs). The app decides the unit (a
    # stage, or a planned job's tool); the pool is ``own_pool(CLASS, unit)``.
    stage_limit: Callable[[str, str], tuple[str, int] | None] | None = None


@dataclass
class AttemptEnv:
    """What a shell gives the flows: who it is, where, its book, clocks and counters."""

    table: JobRequests
    intents: IntentRequests
    queue_url: str
    dlq_url: str | None
    worker_id: str
    book: LeaseBook
    rules_of: Callable[[str], ClassRules | None]
    receive_visibility: int
    unknown_class_receives: int
    now: Callable[[], Now]
    random: Callable[[], float]
    write_id: Callable[[], str]
    tally: Callable[[str, int], None]
    new_signal: Callable[[], Signal]
    run_handler: Callable[[HandlerRun], Any]
    observer: Observer | None = None
    # How the shell runs a round's parts at once (``Invoke("parallel")``); None: one
    # after another in this flow.
    run_parallel: Callable[[Sequence[Flow[Any]]], Any] | None = None
    slots: SlotEnv | None = None  # None: no limits declared, no slot is ever taken
    # A staged job's stage -> its rules (None: the shell runs no staged jobs).
    stage_rules_of: Callable[[str, str], ClassRules | None] | None = None
    # A staged job's first stage (None: not staged): names it on a record submitted
    # without the app (a producer that cannot know the stages).
    first_stage_of: Callable[[str], str | None] | None = None
    # Deletes of ended jobs' messages, batched (None: each deleted right after its
    # end write, as the Lambda adapter needs to see it).
    deletes: DeleteBatch | None = None
    # Priorities: the interactive queue (None: none), where the sweep re-sends an
    # interactive job's message.
    interactive_url: str | None = None
    # This process's first starts of intents on its lease clock: the only age a
    # repeat inside a target's key retention may go ahead on (``repeat_unprotected``).
    own_starts: OwnStarts = field(default_factory=OwnStarts)


def rules_for(env: AttemptEnv, job_class: str, stage: str | None) -> ClassRules | None:
    """The rules of a job class, or of one stage of a staged job (each stage has its own)."""
    if stage is not None and env.stage_rules_of is not None:
        return env.stage_rules_of(job_class, stage)
    return env.rules_of(job_class)


def now_of(env: AttemptEnv) -> Flow[Now]:
    """The shell's clocks, read now (both stamps of one moment)."""
    now: Now = yield from ask("now", env.now)
    return now


def nonce_of(env: AttemptEnv) -> Flow[str]:
    """A fresh nonce from the shell: an attempt's, or a release's made on its behalf."""
    nonce: str = yield from ask("write_id", env.write_id)
    return nonce


__all__ = [
    "ActFor",
    "AttemptEnv",
    "ClassRules",
    "HandlerRun",
    "Now",
    "Observer",
    "Parallel",
    "SlotEnv",
    "nonce_of",
    "now_of",
    "rules_for",
]
