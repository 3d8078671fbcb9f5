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


def test_seed_169_an_old_workers_sweep_parks_a_dead_lettered_job_of_a_class_it_lacks() -> None:
    """Every issue 26 world together: w3, whose app predates class ``sim-v2``, found
    job-004's only message in the DLQ with its sweep and parked the job. The park runs
    nothing, so it needs no knowledge of the class (``sqs-lease dlq`` has none); the
    checker's I9 took it for a claim of an unknown class until it allowed this park as
    it allows the undeliverable one (the checker's error)."""
    from simtools import run_seed

    result = run_seed(169, trace=True)
    assert result.ok, result.violations[:1]
    old = {e[1] for e in result.log if e[2] == "worker_started" and e[3].get("app") == "old"}
    parks = [(e[1], e[3]["job_id"]) for e in result.log if e[2] == "job_dead_lettered"]
    assert any(who in old for who, _ in parks), "the seed no longer draws its case"
