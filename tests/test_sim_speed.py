"""The simulator's speed-ups keep every schedule: the oracle, and the long-poll queue."""

from __future__ import annotations

from collections.abc import Callable

from simtools.digest import seed_digest
from sqs_lease.testing._sim.chaos import Chaos
from sqs_lease.testing._sim.sqs import SimSQS


def test_a_seeds_digest_is_the_same_on_every_run_and_differs_from_another_seeds() -> None:
    first = seed_digest(3, trace=True, features=None, mutation=None)
    assert seed_digest(3, trace=True, features=None, mutation=None) == first
    assert seed_digest(4, trace=True, features=None, mutation=None) != first


def test_the_digest_sees_the_trace_mode_of_a_run() -> None:
    # a replay (trace) records more events than a soak's run: both paths are hashed
    assert seed_digest(3, trace=True, features=None, mutation=None) != seed_digest(
        3, trace=False, features=None, mutation=None
    )


def test_ended_long_polls_are_dropped_and_live_ones_keep_their_turn() -> None:
    sqs = SimSQS(Chaos(0))
    woken: list[int] = []
    ended = [False] * 500

    def poll(i: int) -> tuple[Callable[[], bool], Callable[[], bool]]:
        def wake() -> bool:
            if ended[i]:
                return False
            woken.append(i)
            return True

        return wake, lambda: ended[i]

    for i in range(500):
        if i >= 2:
            ended[i - 2] = True  # each poll ends soon after the next ones wait
        sqs.wait(*poll(i))
    assert len(sqs.waiters) < 200  # not 500: ended polls do not pile up
    sqs._wake()
    sqs._wake()
    assert woken == [498, 499]  # the longest-waiting live polls, in order
