"""What the world schedules: the ops a task yields, the tasks, the actors that run them.

Tasks are generators that yield :class:`CallOp` (an AWS call), :class:`SleepOp`
(on the actor's own monotonic clock) or :class:`RemoteOp` (a tool call or a
reconciliation check at a simulated target); ``world.World`` answers each one at a
virtual time (``network`` carries the calls).
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeAlias, TypeVar

from ..._core.calls import Call
from .invariants import Origin
from .resources import EPOCH_S

if TYPE_CHECKING:
    from .clocks import Skew
    from .world import World

T = TypeVar("T")

# --------------------------------------------------------------------------- ops


# The ops are built for every instruction a task yields (tens of thousands per run):
# plain slotted classes, not frozen dataclasses, whose __init__ costs several times
# more. Nothing compares, hashes or changes them.


class CallOp:
    __slots__ = ("call", "origin")

    def __init__(self, call: Call, origin: Origin) -> None:
        self.call = call
        self.origin = origin


class SleepOp:
    __slots__ = ("seconds", "wakeable")

    def __init__(self, seconds: float, wakeable: bool = False) -> None:
        self.seconds = seconds  # on the actor's monotonic clock
        self.wakeable = wakeable


class RemoteCall(BaseException):
    """Raised by a simulated tool or check when called: the driver turns it into a
    :class:`RemoteOp`. It works whether the core invokes the object itself or a
    closure around it (``lambda: check(view)``), and no ``except Exception`` in
    between can swallow it."""

    def __init__(self, remote: SimTool | SimCheck, args: tuple[Any, ...]) -> None:
        super().__init__(remote.kind)
        self.remote = remote
        self.args_seen = args


@dataclass(eq=False)
class SimTool:
    """The tool an ``Invoke("tool", ...)`` carries: a call to a simulated target."""

    target: str
    key: str
    resource: str
    scope: str  # the fence's scope: the job id (tokens are ordered per job)
    token: int
    payload_hash: str
    worker: str
    timeout: float
    kind: str = "tool"
    stage: str = ""  # staged: the stage whose attempt sends it (the checker's I19)

    def __call__(self, *args: Any) -> Any:
        raise RemoteCall(self, args)


@dataclass(eq=False)
class SimCheck:
    """The reconciliation check (called with the intent's view); runs at the target."""

    target: str
    key: str
    resource: str
    scope: str
    token: int
    timeout: float
    kind: str = "check"

    def __call__(self, *args: Any) -> Any:
        raise RemoteCall(self, args)


Remote: TypeAlias = SimTool | SimCheck


class RemoteOp:
    __slots__ = ("remote",)

    def __init__(self, remote: Remote) -> None:
        self.remote = remote


Op: TypeAlias = CallOp | SleepOp | RemoteOp
SimGen: TypeAlias = Generator[Op, Any, T]


class Task:
    __slots__ = ("actor", "done", "gen", "name", "on_done", "sleep_gen", "sleeping")

    def __init__(self, actor: Actor, name: str, gen: SimGen[Any]) -> None:
        self.actor = actor
        self.name = name
        self.gen = gen
        self.done = False
        self.sleep_gen = 0
        self.sleeping = False
        self.on_done: Callable[[], None] | None = None


class Pending:
    """One call in flight (all its SDK attempts)."""

    __slots__ = ("applied", "armed", "attempt", "done", "on_timeout", "sent_mono", "task")

    def __init__(self, task: Task, sent_mono: float) -> None:
        self.task = task
        self.sent_mono = sent_mono
        self.attempt = 0
        self.done = False
        self.applied = 0  # the first attempt of this call the service applied (0: none)
        self.armed = False  # the current attempt's timeout is scheduled
        self.on_timeout: Callable[[], None] | None = None


# --------------------------------------------------------------------------- actors


class Actor:
    """Something that runs tasks: a worker process, the producer, an operator."""

    def __init__(
        self,
        world: World,
        actor_id: str,
        *,
        faulty: bool = False,
        rate: float = 1.0,
        mono0: float = 0.0,
        wall_offset: float = 0.0,
    ) -> None:
        self.world = world
        self.id = actor_id
        self.faulty = faulty
        self.rate = rate
        self.mono0 = mono0
        self.wall_offset = wall_offset
        self.clock: Skew | None = None  # issue 26 (clocks): skew, drift, a step
        self.t0 = world.now
        self.alive = True
        self.paused_until = 0.0
        self.tasks: list[Task] = []
        # (start, end, mode, services): mode "both" drops requests and answers,
        # "response" lets the request apply and loses the answer.
        self.partitions: list[tuple[float, float, str, tuple[str, ...]]] = []
        self.slow: list[tuple[float, float, float]] = []  # (start, end, max extra latency)

    def mono(self, t: float | None = None) -> float:
        """This actor's monotonic clock: its own origin and rate (drift)."""
        return self.mono0 + ((self.world.now if t is None else t) - self.t0) * self.rate

    def wall(self) -> float:
        """This actor's wall clock: off by its offset (the protocol must not care)."""
        if self.clock is not None:  # issue 26 (clocks)
            skew = self.clock.at(self.world.now)
            return round(EPOCH_S + self.world.now * self.rate + self.wall_offset + skew, 3)
        return round(EPOCH_S + self.world.now * self.rate + self.wall_offset, 3)

    def cut(self, service: str, t: float, *, request: bool) -> bool:
        for start, end, mode, services in self.partitions:
            if start <= t < end and service in services and (mode == "both" or not request):
                return True
        return False

    def extra_latency(self, t: float) -> float:
        extra = 0.0
        for start, end, hi in self.slow:
            if start <= t < end:
                extra = max(extra, self.world.chaos.uniform(0.2, hi))
        return extra

    def spawn(self, name: str, gen: SimGen[Any]) -> Task:
        task = Task(self, name, gen)
        self.tasks.append(task)
        self.world.at(self.world.now, lambda: self.world.resume(task, None))
        return task

    def kill(self) -> None:
        """The process is gone: its tasks stop where they are; nothing of it runs again."""
        self.alive = False
        for task in self.tasks:
            if not task.done:
                task.done = True
                task.gen.close()


# --------------------------------------------------------------------------- the world


def drive_plain(
    world: World,
    actor: Actor,
    flow: Any,
    origin: Origin,
    on_error: Callable[[], None] | None = None,
) -> SimGen[Any]:
    """Run a flow for a fault-free actor (producer, operator); its errors are logged."""
    from .worker import drive

    try:
        return (yield from drive(world, actor, flow, origin))
    except Exception as exc:
        world.record(actor.id, "flow_failed", {"task": origin.task, "error": repr(exc)})
        if on_error is not None:
            on_error()
        return None
