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

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any
from unittest import mock

from simtools.mutations import applied
from sqs_lease.testing._sim import network
from sqs_lease.testing._sim.invariants import I17
from sqs_lease.testing._sim.plan import Step
from sqs_lease.testing._sim.render import txn_kind
from sqs_lease.testing._sim.tasks import CallOp, Task
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
