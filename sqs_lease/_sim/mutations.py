"""Deliberately broken variants of the protocol, for checking that the checker bites.

Each mutation is a context manager that monkeypatches one piece of the real code
(or of the simulated worker shell) inside this process and restores it on exit.
``tests/test_sim_mutations.py`` asserts every one is caught within a bounded
number of seeds, and that the unmutated protocol passes the same seeds.

Two *variants* change the environment, not the protocol, to show what the
protocol relies on: ``naive_check`` gives targets a reconciliation check that
neither fences nor knows about requests still in flight (it answers from what
has applied at that instant), which shows why a "not applied" answer must stay
true afterwards; ``tight_redrive`` sets the queue's ``maxReceiveCount`` to one
above the job class's ``max_attempts``, which shows why the redrive backstop
must stay well above the attempts the worker counts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

from .._core import flows, intents
from .._core.calls import Call, Flow
from .._core.flows import Beat, Finish
from .._core.records import JobState
from .._core.timing import LeaseStatus, LocalLease
from .._schema import JobTable, R
from . import receiver
from .worker import SimHeld, SimWorker


@contextmanager
def _patch(owner: Any, name: str, value: Any) -> Iterator[None]:
    missing = object()
    old = owner.__dict__.get(name, missing) if isinstance(owner, type) else getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        if old is missing:
            delattr(owner, name)
        else:
            setattr(owner, name, old)


def _commit_with(condition: Callable[[int, float], Any]) -> Callable[..., Call]:
    def commit(
        self: JobTable, job_id: str, token: int, worker_id: str, result_json: str, wall_now: float
    ) -> Call:
        return self._update(
            job_id,
            condition(token, wall_now),
            [
                R.state.set(JobState.SUCCEEDED.value),
                R.result.set(result_json),
                R.updated_at.set(wall_now),
                R.finished_at.set(wall_now),
                R.lease_deadline.remove(),
                R.reason.remove(),
                R.error_code.remove(),
            ],
        )

    return commit


@contextmanager
def no_commit_token() -> Iterator[None]:
    """The commit's condition forgets the token: any running record takes the result."""
    with _patch(JobTable, "commit", _commit_with(lambda token, wall: R.state == "running")):
        yield


@contextmanager
def wall_clock_fence() -> Iterator[None]:
    """The commit is fenced by the record's advisory lease_deadline against the
    committing worker's own wall clock, instead of by token."""
    with _patch(
        JobTable,
        "commit",
        _commit_with(lambda token, wall: (R.lease_deadline > wall) & (R.state == "running")),
    ):
        yield


@contextmanager
def no_ownership_check() -> Iterator[None]:
    """The heartbeat treats a successful visibility change as ownership: the
    ownership read's verdict is always ``ok``."""

    def verdict(lease: LocalLease, view: Any, worker_id: str, sent_at: float) -> Beat:
        return Beat(lease.job_id, "ok", deadline=sent_at + lease.lease_seconds)

    with _patch(flows, "_verdict", verdict):
        yield


@contextmanager
def blind_retry() -> Iterator[None]:
    """An intent found ``in_progress`` is repeated without asking the target's check."""

    def reconcile(*args: Any, **kwargs: Any) -> Flow[None]:
        return None
        yield  # a generator, like the real one

    with _patch(intents, "_reconcile", reconcile):
        yield


@contextmanager
def extend_after_end() -> Iterator[None]:
    """The worker keeps a job in its heartbeat set after the handler ended, unless
    the attempt ended with a clean commit (e.g. when the commit's outcome was unknown)."""

    def mark(self: SimWorker, held: SimHeld, status: LeaseStatus) -> None:
        if status is LeaseStatus.DONE:
            return
        if held.lease.status in (LeaseStatus.OK, LeaseStatus.UNKNOWN):
            held.lease.status = status

    def forget(self: SimWorker, held: SimHeld, item: Any, fin: Finish | None) -> None:
        if fin is not None and fin.outcome == "done":
            self.held.pop(item.job_id, None)

    with ExitStack() as stack:
        stack.enter_context(_patch(SimWorker, "_mark", mark))
        stack.enter_context(_patch(SimWorker, "_forget", forget))
        yield


@contextmanager
def commit_after_stop() -> Iterator[None]:
    """The shell ignores that an attempt was told to stop: what its handler returns
    afterwards (maybe partial) is committed, fenced by token only."""
    from . import worker

    with _patch(worker, "stopped_ending", lambda end, stop: end):
        yield


@contextmanager
def tight_redrive() -> Iterator[None]:
    """A queue whose ``maxReceiveCount`` is only one above the job class's
    ``max_attempts`` (nothing in the library compares the two)."""
    from . import plan as plans

    original = plans.draw_plan

    def draw(*args: Any, **kwargs: Any) -> Any:
        plan = original(*args, **kwargs)
        plan.max_receive = plan.max_attempts + 1
        return plan

    with _patch(plans, "draw_plan", draw):
        yield


@contextmanager
def naive_check() -> Iterator[None]:
    """Targets whose check neither fences nor sees requests in flight (see module doc)."""
    with _patch(receiver.Receivers, "default_check_mode", "naive"):
        yield


MUTATIONS: dict[str, Callable[[], Any]] = {
    "no_commit_token": no_commit_token,
    "no_ownership_check": no_ownership_check,
    "blind_retry": blind_retry,
    "wall_clock_fence": wall_clock_fence,
    "extend_after_end": extend_after_end,
    "commit_after_stop": commit_after_stop,
}
VARIANTS: dict[str, Callable[[], Any]] = {
    **MUTATIONS,
    "naive_check": naive_check,
    "tight_redrive": tight_redrive,
}


@contextmanager
def applied(name: str | None) -> Iterator[None]:
    """Apply the named mutation (or nothing for ``None``) for the duration of the block."""
    if name is None:
        yield
        return
    factory = VARIANTS.get(name)
    if factory is None:
        known = ", ".join(sorted(VARIANTS))
        raise ValueError(f"unknown mutation {name!r}; known: {known}")
    with factory():
        yield


__all__ = ["MUTATIONS", "VARIANTS", "applied"]
