"""A user's own handlers in the simulated world (``sqs_lease.testing.simulate``).

The simulator's jobs normally run a scripted plan (``plan.JobPlan``). With a
:class:`UserJobs`, each simulated job runs one of the user's handlers instead, with
a real :class:`~sqs_lease.JobContext`, in a thread of its own that runs in lock step
with the simulator: the handler runs while the simulator waits, and the simulator
runs while the handler waits for an answer (an effect, a wait, a check). No
virtual time passes while the handler computes, so a run stays deterministic as
long as the handler is (no wall clock, no randomness of its own, no I/O of its own).

What goes through the simulated world: ``ctx.effect`` (the real effect flow, whose
tool call goes to a simulated fenced target instead of the user's tool function),
``ctx.wait`` (simulated seconds; raises when the attempt was told to stop) and
``ctx.check``. ``ctx.progress``, ``ctx.cancelled``, ``ctx.lease_left`` and
``ctx.last_progress`` read the simulated attempt directly.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from ..._core import attempt as core
from ..._core.env import HandlerRun
from ..._core.intents import EffectResult, EffectSpec
from ..._jobs import App, JobContext
from ..._journal import Journal
from ..._shell import context_fields
from .tasks import SimCheck, SimGen, SimTool, SleepOp

if TYPE_CHECKING:
    from .worker import SimWorker

HANDOFF_TIMEOUT = 60.0
"""Wall seconds the simulator waits for a handler to ask or end (a hang guard: a
handler blocking on anything but its context never hands back)."""


@dataclass(frozen=True)
class UserJob:
    """One job the world submits: the user's class and payload."""

    job_class: str
    payload: BaseModel


@dataclass(frozen=True)
class UserJobs:
    """The user's app and the jobs a simulated run submits (job ``i`` of the run
    runs ``jobs[i % len(jobs)]``)."""

    app: App
    jobs: Sequence[UserJob]

    def job_for(self, job_id: str) -> UserJob:
        return self.jobs[int(job_id.rsplit("-", 1)[1]) % len(self.jobs)]

    def keyed(self, target: str) -> bool:
        """A target that keeps idempotency keys is a keyed simulated receiver."""
        declared = self.app.targets.get(target)
        return declared is not None and bool(declared.key_retention_seconds)


class HandlerGone(BaseException):
    """Raised in a handler's thread when its simulated process died (a crash) or its
    task was closed: the handler unwinds and its thread ends."""


@dataclass(frozen=True)
class _Effect:
    spec: EffectSpec


@dataclass(frozen=True)
class _Wait:
    seconds: float


@dataclass(frozen=True)
class _Check:
    pass


@dataclass(frozen=True)
class _Done:
    value: Any
    error: BaseException | None


@dataclass(frozen=True)
class _Raise:
    error: BaseException


_GONE = object()


class _Bridge:
    """The handler's thread and the simulator, handing control back and forth."""

    def __init__(self) -> None:
        self._to_handler: queue.Queue[Any] = queue.Queue()
        self._to_sim: queue.Queue[Any] = queue.Queue()
        self.thread: threading.Thread | None = None

    # -- the simulator's side

    def start(self, main: Any) -> Any:
        def run() -> None:
            self._to_handler.get()
            try:
                value = main()
            except HandlerGone:
                self._to_sim.put(_Done(None, None))
                return
            except BaseException as exc:
                self._to_sim.put(_Done(None, exc))
                return
            self._to_sim.put(_Done(value, None))

        self.thread = threading.Thread(target=run, name="sim-handler", daemon=True)
        self.thread.start()
        return self.send(None)

    def send(self, answer: Any) -> Any:
        self._to_handler.put(answer)
        try:
            return self._to_sim.get(timeout=HANDOFF_TIMEOUT)
        except queue.Empty:
            raise RuntimeError(
                f"a simulated handler neither asked its context nor ended within "
                f"{HANDOFF_TIMEOUT:g} s: it blocks on something the simulator does not run"
                " (a real sleep, a lock, I/O)"
            ) from None

    def close(self) -> None:
        """End the handler's thread (its process died, or the task was closed)."""
        if self.thread is None or not self.thread.is_alive():
            return
        self._to_handler.put(_GONE)
        self.thread.join(HANDOFF_TIMEOUT)

    # -- the handler's side

    def ask(self, request: Any) -> Any:
        self._to_sim.put(request)
        answer = self._to_handler.get()
        if answer is _GONE:
            raise HandlerGone()
        if isinstance(answer, _Raise):
            raise answer.error
        return answer


class SimContext(JobContext[Any]):
    """A real job context whose effects, waits and checks go through the simulator."""

    def __init__(self, bridge: _Bridge, **fields: Any) -> None:
        super().__init__(run_effect=lambda spec: bridge.ask(_Effect(spec)), **fields)
        self._bridge = bridge

    def wait(self, seconds: float) -> bool:
        self._bridge.ask(_Wait(float(seconds)))
        return False

    def check(self) -> None:
        self._bridge.ask(_Check())


class _SimJournal(Journal):
    """A handler's own journal lines (``ctx.note``, ``tool_request``) in the run's log."""

    def __init__(self, worker: SimWorker) -> None:
        super().__init__()
        self._worker = worker

    def write(self, event: str, fields: Mapping[str, Any] | None = None) -> None:
        self._worker.journal(event, **dict(fields or {}))


def run_user_handler(worker: SimWorker, run: HandlerRun, user: UserJobs) -> SimGen[Any]:
    """``Invoke("handler")`` for a user's job: its handler, in lock step (see the module)."""
    job = user.job_for(run.claim.job.job_id)
    reg = user.app.get(job.job_class, None)
    if reg is None:
        raise RuntimeError(f"simulate: the app has no job class {job.job_class!r}")
    bridge = _Bridge()
    ctx = SimContext(
        bridge,
        **context_fields(
            run,
            job_class=reg.job_class,
            payload=job.payload,
            worker_id=worker.id,
            lock=threading.Lock(),
            clock=worker.mono,
            journal=_SimJournal(worker),
            targets=user.app.targets,
        ),
    )
    try:
        request = bridge.start(lambda: reg.handler(ctx, job.payload))
        while not isinstance(request, _Done):
            try:
                answer = yield from _perform(worker, run, request, user)
            except Exception as exc:
                request = bridge.send(_Raise(exc))
            else:
                request = bridge.send(answer)
    finally:
        bridge.close()
    if request.error is not None:
        raise request.error
    return request.value  # a model becomes data in the core (stages.plain_data)


def _perform(worker: SimWorker, run: HandlerRun, request: Any, user: UserJobs) -> SimGen[Any]:
    held = run.held
    lease = held.lease
    if isinstance(request, _Wait):
        if request.seconds > 0:
            yield SleepOp(request.seconds)
        if held.cancelled.is_set():
            lease.check(worker.mono())  # raises the stop's LeaseError
        return None
    if isinstance(request, _Check):
        lease.check(worker.mono())
        return None
    if isinstance(request, _Effect):
        return (yield from _effect(worker, run, request.spec, user))
    raise TypeError(f"unknown request {request!r}")  # pragma: no cover


def _effect(worker: SimWorker, run: HandlerRun, spec: EffectSpec, user: UserJobs) -> SimGen[Any]:
    """The user's effect through the real effect flow, its tool and check answered by a
    simulated fenced target (``keyed`` when the user's target keeps keys)."""
    claim, origin = run.claim, run.held.tag
    job_id = claim.job.job_id
    target = "keyed" if user.keyed(spec.target) else "unkeyed"
    # A key of the user's own may be shared by jobs: the resource is the key's then.
    default = spec.key.startswith(f"{job_id}:")
    resource = f"{target}:{job_id}" if default else f"{target}:{spec.key}"
    p = worker.world.plan
    lease = run.held.lease
    origin.lease = lease  # the checker's I15, as for a scripted effect
    tool = SimTool(
        target,
        spec.key,
        resource,
        job_id,
        claim.token,
        spec.payload_hash,
        worker.id,
        p.tool_http_timeout,
    )
    # The user's target answers reconciliation only if it declares a check.
    check = (
        SimCheck(target, spec.key, resource, job_id, claim.token, p.tool_http_timeout)
        if spec.check is not None
        else None
    )
    sim_spec = replace(
        spec,
        tool=tool,
        check=check,
        rekey=None,
    )
    result: EffectResult = yield from worker.drive(
        core.held_effect_flow(
            worker.env,
            run.held,
            sim_spec,
            wall_clock=worker.wall,
            flow_id=f"{origin.task}@{worker.world.now:.6f}",
        ),
        origin,
        watch=lease,
    )
    return result
