"""``python -m simtools digest``: a determinism oracle for the simulator.

For each seed it runs the schedule and prints one hash of everything the run
leaves behind: the result (violations, end time, event count, fault and
protocol counters), the event log, the final tables, queues and target ledgers,
the scheduler's sequence counter and the state of every random stream. Run it
before and after a change that must not change behaviour (a speed-up, a
refactoring) and compare the two outputs: any difference is a changed schedule.

``--trace both`` (the default) hashes a run without the trace (as ``run``/``soak``
run it) and one with it (as ``replay`` runs it), so both paths are compared.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Iterable, Iterator
from typing import Any

from sqs_lease.testing._sim.render import render_entry
from sqs_lease.testing._sim.world import World

from .mutations import applied


def _canonical(value: Any) -> Any:
    """A JSON-able, order-stable form of the simulator's state (dataclasses, sets...)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {
            f.name: _canonical(getattr(value, f.name))
            for f in dataclasses.fields(value)
            if not callable(getattr(value, f.name))
        }
    if isinstance(value, dict):
        return {str(k): _canonical(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if isinstance(value, (list, tuple)):
        return [_canonical(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted((_canonical(v) for v in value), key=repr)
    if isinstance(value, float):
        return repr(value)  # every bit of a virtual time counts
    if value is None or isinstance(value, (str, int, bool)):
        return value
    if hasattr(value, "value") and hasattr(value, "name"):  # an enum
        return f"{type(value).__name__}.{value.name}"
    return repr(value)


def world_state(world: World) -> dict[str, Any]:
    """What a finished run leaves behind (beyond its result and its log)."""
    chaos = world.chaos
    return {
        "now": world.now,
        "seq": world.seq,
        "events": world.events,
        "rng": [
            hashlib.sha256(repr(r.getstate()).encode()).hexdigest()
            for r in (chaos.rng, chaos.wide, chaos.wide14, chaos.operator)
        ],
        "injected": chaos.injected,
        "ddb": world.ddb.items,
        "ddb_calls": world.ddb.calls,
        "sqs": {url: (q.messages, q.gone) for url, q in world.sqs.queues.items()},
        "sqs_calls": world.sqs.calls,
        "ledger": world.receivers.ledger,
        "targets": {
            name: (t.fences, t.stored, t.applied, t.pending)
            for name, t in world.receivers.targets.items()
        },
        "counts": world.counts,
        "final_jobs": world.checker.final_jobs,
        "failed_tasks": world.failed_tasks,
    }


def seed_digest(
    seed: int, *, trace: bool, features: frozenset[str] | None, mutation: str | None
) -> str:
    """The hash of one run of ``seed`` (with or without the trace)."""
    with applied(mutation):
        world = World(seed, mutation=mutation, trace=trace, features=features)
        result = world.run()
    h = hashlib.sha256()
    head = {
        "violations": [(v.name, repr(v.time), v.message) for v in result.violations],
        "end_time": repr(result.end_time),
        "events": result.events,
        "injected": result.injected,
        "counts": result.counts,
    }
    h.update(json.dumps(_canonical(head), sort_keys=True).encode())
    for entry in result.log:
        h.update(render_entry(entry).encode())
        h.update(b"\n")
    h.update(json.dumps(_canonical(world_state(world)), sort_keys=True).encode())
    return h.hexdigest()[:24]


def digests(
    seeds: Iterable[int],
    *,
    trace: str = "both",
    features: frozenset[str] | None = None,
    mutation: str | None = None,
) -> Iterator[tuple[int, str]]:
    """(seed, digest) per seed; with ``trace="both"`` the two runs' hashes joined."""
    modes = {"both": (False, True), "off": (False,), "on": (True,)}[trace]
    for seed in seeds:
        parts = [seed_digest(seed, trace=t, features=features, mutation=mutation) for t in modes]
        yield seed, " ".join(parts)
