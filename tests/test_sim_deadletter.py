"""The simulated workers' sweep reconciles the DLQ as every worker sweep does (soak seed
1582660: the simulator's copy of the sweep had left the DLQ receive out).

A directed world draws the case the soak found once in 100,000 schedules: the queue's
redrive moves a message to the DLQ at its second receive, so every job that needs a
second attempt has its only message in the DLQ while its record says ``queued``. The
workers' sweeps must park each (``job_dead_lettered``); ``sweep_skips_dlq`` (the old
simulated sweep) leaves them waiting for good (I4)."""

from __future__ import annotations

from typing import Any

from simtools.mutations import applied
from sqs_lease.testing._sim.invariants import I4
from sqs_lease.testing._sim.plan import SweepPlan
from sqs_lease.testing._sim.world import World

SEED = 0


def _run(mutation: str | None = None) -> Any:
    with applied(mutation):
        w = World(SEED, trace=True, features=frozenset(), mutation=mutation)
        w.sqs.queues[w.queue_url].max_receive = 1  # a redrive at the second receive
        w.plan.sweep = SweepPlan()  # the workers' periodic sweep, as a worker runs it
        return w.run()


def test_a_job_whose_only_message_sqs_moved_to_the_dlq_is_parked_by_a_worker_sweep() -> None:
    result = _run()
    assert result.ok, result.violations[:1]
    parked = [e[3] for e in result.log if e[2] == "job_dead_lettered"]
    assert parked, "the directed world no longer redrives a job's message"


def test_the_old_simulated_sweep_without_its_dlq_receive_is_caught() -> None:
    result = _run("sweep_skips_dlq")
    assert result.violations and result.violations[0].name == I4
    assert "dlq" in result.violations[0].message
