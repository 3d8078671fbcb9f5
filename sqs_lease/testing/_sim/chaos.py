"""The one source of randomness of a run, and the fault switchboard.

Everything random in a run comes from one ``random.Random(seed)``: this object.
Fault decisions go through :meth:`Chaos.roll`, which is always ``False`` once
faults have stopped (the cut-off), and counts every fault it injects by kind, so
a soak can report coverage.

The *widened world* (docs/simulation.md, "The widened world") draws from a
second stream, :attr:`Chaos.wide`, seeded from the same seed: a run whose widened
features are all off draws exactly what it drew before they existed, so every
seed pinned in the tests keeps its schedule.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import TypeVar

T = TypeVar("T")


class Chaos:
    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.wide = random.Random(f"wide-{seed}")  # str seeds hash with sha512: stable
        # issue 14's features draw from a third stream, so adding them changed no
        # draw of the second (whose values the issue-7 features also use mid-run)
        self.wide14 = random.Random(f"wide14-{seed}")
        # operator_races: whether an operator's command dies half way (its own stream,
        # so the decisions and everything else keep their draws)
        self.operator = random.Random(f"operator-{seed}")
        self.now = 0.0
        self.cutoff = float("inf")
        self.injected: dict[str, int] = {}

    @property
    def active(self) -> bool:
        return self.now < self.cutoff

    def roll(self, kind: str, p: float) -> bool:
        """True (and counted) with probability ``p`` while faults are active.

        The draw happens whatever the outcome, so the random stream does not
        depend on which faults are enabled.
        """
        # (called for every latency and answer: ``active`` and ``count`` inlined)
        if self.rng.random() < p and self.now < self.cutoff:
            self.injected[kind] = self.injected.get(kind, 0) + 1
            return True
        return False

    def roll_wide(self, kind: str, p: float) -> bool:
        """:meth:`roll` on the widened world's stream (drawn only where a feature is on)."""
        if p <= 0.0:
            return False
        hit = self.wide.random() < p
        if hit and self.active:
            self.count(kind)
            return True
        return False

    def count(self, kind: str, n: int = 1) -> None:
        self.injected[kind] = self.injected.get(kind, 0) + n

    # plain draws (not faults) ----------------------------------------------------

    def random(self) -> float:
        return self.rng.random()

    def uniform(self, a: float, b: float) -> float:
        # random.Random.uniform's own arithmetic on one draw, a call level less
        return a + (b - a) * self.rng.random()

    def randint(self, a: int, b: int) -> int:
        return self.rng.randint(a, b)

    def chance(self, p: float) -> bool:
        return self.rng.random() < p

    def choice(self, seq: Sequence[T]) -> T:
        return seq[self.rng.randrange(len(seq))]

    def sample(self, seq: Sequence[T], k: int) -> list[T]:
        return self.rng.sample(list(seq), k)

    def shuffle(self, seq: list[T]) -> None:
        self.rng.shuffle(seq)
