"""Directed worlds for mutations no seed draws (``UNCAUGHT`` in simtools/mutations.py).

Each world is one seed's world, narrowed to one job and no drawn faults, with the
rare schedule its mutation needs made to happen every time: a request held in the
network, a target answering as told, an operator dying where told. The real
protocol must pass with the case drawn (its journal events), the mutation must
break the invariant its docstring names. The directing happens in the test only
(patches of the simulator's network and operator for the run), so no seed's
schedule moves (docs/simulation.md, "Directed worlds").
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import replace
from typing import Any
from unittest import mock

from simtools.mutations import applied
from sqs_lease._core.calls import Call
from sqs_lease.testing._sim import network, operators
from sqs_lease.testing._sim.invariants import I2, I17
from sqs_lease.testing._sim.plan import Step
from sqs_lease.testing._sim.receiver import TargetFaults
from sqs_lease.testing._sim.render import txn_kind
from sqs_lease.testing._sim.tasks import CallOp, Remote, Task
from sqs_lease.testing._sim.world import RunResult, World

SEED = 0
ONE_EFFECT = (Step("work", 1.0), Step("effect", action="act0"), Step("work", 1.0))


def _one_job(mutation: str | None, *, workers: int, target: str) -> World:
    """Seed SEED's narrow world with one job of one effect, no drawn fault, no
    scripted failure: what happens to it is what the test directs."""
    w = World(SEED, trace=True, features=frozenset(), mutation=mutation, workers=workers, jobs=1)
    p = w.plan
    p.fault_events = 0
    jp = replace(
        p.job_plans[0],
        steps=ONE_EFFECT,
        target=target,
        submit_at=1.0,
        p_transient=0.0,
        p_permanent=0.0,
        p_unknown=0.0,
    )
    p.job_plans = [jp]
    w.job_plans = {jp.job_id: jp}
    return w


def _events(result: RunResult, kind: str) -> list[tuple[str, Any]]:
    return [(who, data) for _, who, k, data in result.log if k == kind]


# ------------------------------------------------------------- shared_request_tokens


@contextmanager
def _start_held_in_the_network(world: World) -> Iterator[None]:
    """The first owner's first intent start leaves the process, which dies at once;
    the request stays in the network until the next owner's start of the same
    attempt has applied, and lands a second later (a stale owner's late request)."""
    real_call, real_service = network.call, network._service
    held: list[CallOp] = []
    landed: list[bool] = []

    def call(w: World, task: Task, op: CallOp) -> None:
        if not held and op.call.op == "TransactWriteItems" and txn_kind(op.call) == "intent_start":
            held.append(op)
            w.record("test", "start_held", {"from": task.actor.id})
            w.worker_exited(task.actor, restart_after=5.0)
            return
        real_call(w, task, op)

    def service(w: World, op: CallOp) -> Any:
        out = real_service(w, op)
        c = op.call
        if (
            held
            and not landed
            and c.op == "TransactWriteItems"
            and txn_kind(c) == "intent_start"
            and op.origin.worker != held[0].origin.worker
        ):
            landed.append(True)

            def late() -> None:
                w.record("test", "late_start_lands", {"from": held[0].origin.worker})
                real_service(w, held[0])

            w.at(w.now + 1.0, late)
        return out

    with mock.patch.object(network, "call", call), mock.patch.object(network, "_service", service):
        yield


def _shared_tokens_run(mutation: str | None = None) -> RunResult:
    with applied(mutation):
        w = _one_job(mutation, workers=2, target="keyed")
        w.ddb.faults.idempotent_tokens = True  # as AWS: a token names one request
        with _start_held_in_the_network(w):
            return w.run()


def test_a_stale_owners_late_intent_start_is_refused_by_the_fence_not_by_a_shared_token() -> None:
    result = _shared_tokens_run()
    assert result.ok, result.violations[:1]
    assert _events(result, "late_start_lands"), "the directed world no longer holds a start"
    assert [d["token"] for _, d in _events(result, "intent_started")] == [2]
    assert _events(result, "result_committed")


def test_request_tokens_without_the_owner_are_caught() -> None:
    """``shared_request_tokens``: the late start of attempt 1 under token 1 carries the
    token of the new owner's start of attempt 1 under token 2: AWS refuses it
    ``IdempotentParameterMismatch``."""
    result = _shared_tokens_run("shared_request_tokens")
    assert result.violations and result.violations[0].name == I17
    assert "w1" in result.violations[0].message


# ------------------------------------------------------------------ stale_resolution


@contextmanager
def _operator_dies_after_its_first_send(world: World) -> Iterator[None]:
    """The operator's first command dies right after its SendMessage applied (the
    runbook runs it again up to a minute later); later runs never die. The job's
    next decision waits a minute more than drawn, so the command run again meets
    the job's next ambiguity first (soak seed 57932's order), and the decision
    still comes within the run's settle time (90 s after a park)."""
    real_mortal = operators._mortal
    runs: list[int] = []

    def mortal(flow: Any, dies: Callable[[], bool], failed: list[BaseException]) -> Any:
        runs.append(1)
        first = len(runs) == 1
        last: list[str] = [""]

        def tap() -> Generator[Any, Any, Any]:
            instr = next(flow)
            while True:
                last[0] = instr.op if isinstance(instr, Call) else ""
                out = yield instr
                try:
                    instr = flow.send(out)
                except StopIteration as stop:
                    return stop.value

        return real_mortal(tap(), lambda: first and last[0] == "SendMessage", failed)

    real_decide = world.runbook.decide

    def decide(job_id: str, n: int, waited: int = 0) -> None:
        if n == 2 and waited == 0:
            world.at(world.now + 60.0, lambda: real_decide(job_id, n, 1))
            return
        real_decide(job_id, n, waited)

    with ExitStack() as stack:
        stack.enter_context(mock.patch.object(operators, "_mortal", mortal))
        stack.enter_context(mock.patch.object(world.runbook, "decide", decide))
        yield


@contextmanager
def _first_call_fails_before_later_ones_after(world: World) -> Iterator[None]:
    """The target's first answer is a 503 (nothing applied), every later one a 500
    after applying; its check can never tell. Each attempt ends ambiguous and parks:
    the first not applied, the second applied."""
    real_remote = network.remote
    calls: list[int] = []

    def remote(w: World, task: Task, r: Remote) -> None:
        if r.kind == "tool":
            calls.append(1)
            first = len(calls) == 1
            w.receivers.faults = TargetFaults(
                error_before=1.0 if first else 0.0,
                error_after=0.0 if first else 1.0,
                cannot_tell=1.0,
            )
        real_remote(w, task, r)

    with mock.patch.object(network, "remote", remote):
        yield


def _stale_resolution_run(mutation: str | None = None) -> RunResult:
    with applied(mutation):
        w = _one_job(mutation, workers=1, target="unkeyed")
        w.plan.wide = replace(w.plan.wide, features=w.plan.wide.features | {"operator_races"})
        with _operator_dies_after_its_first_send(w), _first_call_fails_before_later_ones_after(w):
            return w.run()


def test_a_resolve_run_again_after_the_job_went_ambiguous_again_settles_nothing() -> None:
    result = _stale_resolution_run()
    assert result.ok, result.violations[:1]
    failed = [d["error"] for _, d in _events(result, "flow_failed")]
    assert any("OperatorDied" in e for e in failed), "the operator no longer dies half way"
    assert any("changed meanwhile" in e for e in failed), "the command run again was not refused"
    ambiguous = [d["attempt"] for _, d in _events(result, "intent_ambiguous")]
    assert ambiguous == [1, 2]
    assert _events(result, "result_committed")


def test_a_decision_not_bound_to_its_attempt_is_caught() -> None:
    """``stale_resolution``: the command run again settles attempt 2's ambiguity (it
    applied) with the judgement of attempt 1 (it did not): a retry applies it again."""
    result = _stale_resolution_run("stale_resolution")
    assert result.violations and result.violations[0].name == I2
