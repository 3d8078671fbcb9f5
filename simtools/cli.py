"""``python -m simtools``: run, soak and replay simulated schedules.

- ``run --seeds N [--start S] [--workers K] [--jobs J] [--mutation NAME] [--processes P]``
- ``soak --seeds 100000 [--processes 2]``: the same, with progress lines and a final report
- ``replay --seed N [--mutation NAME]``: the full event log of one schedule and its violation
- ``mutations [--only NAME ...] [--processes P]``: where each mutation is first caught
  (``catch.first_catch``), printed as the ``CAUGHT_AT`` table to pin in
  ``tests/test_sim_mutations.py``; exit status 1 if one is not caught, or if the real
  protocol fails a seed of the search
- ``digest --seeds N [--start S] [--trace both|on|off]``: one hash per seed of all a
  run leaves behind (the determinism oracle: compare before and after a change)
- ``fleet [--workers 500] [--jobs 100000] [--burst 60] [--table new|quota]``: hundreds
  of workers on one queue and its tables, against DynamoDB's and SQS's limits
  (``sqs_lease.testing._sim.fleet``); prints its report as JSON

``--widen F1,F2`` (or ``none``) limits the widened world to those features
(default: all of ``plan.WIDE_FEATURES``); a replay needs the same ``--widen``.

Exit status 1 when any invariant failed.
"""

from __future__ import annotations

import argparse
import gc
import json
import multiprocessing
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TextIO

from sqs_lease.testing._sim.invariants import INVARIANTS
from sqs_lease.testing._sim.plan import WIDE_FEATURES

from .catch import Catch, first_catch
from .mutations import MUTATIONS, VARIANTS, applied

Args = tuple[int, int | None, int | None, str | None, frozenset[str] | None]


@dataclass(frozen=True)
class SeedOutcome:
    seed: int
    violations: tuple[tuple[str, float, str], ...]
    injected: dict[str, int]
    counts: dict[str, int]
    events: int
    virtual_seconds: float


@dataclass
class Summary:
    seeds: int = 0
    failures: list[SeedOutcome] = field(default_factory=list)
    injected: dict[str, int] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    schedules_with: dict[str, int] = field(default_factory=dict)
    events: int = 0
    virtual_seconds: float = 0.0
    wall_seconds: float = 0.0

    def add(self, o: SeedOutcome) -> None:
        self.seeds += 1
        self.events += o.events
        self.virtual_seconds += o.virtual_seconds
        for k, v in o.injected.items():
            self.injected[k] = self.injected.get(k, 0) + v
            self.schedules_with[k] = self.schedules_with.get(k, 0) + 1
        for k, v in o.counts.items():
            self.counts[k] = self.counts.get(k, 0) + v
        if o.violations:
            self.failures.append(o)

    @property
    def rate(self) -> float:
        return self.seeds / self.wall_seconds if self.wall_seconds > 0 else 0.0


def run_one(args: Args) -> SeedOutcome:
    from . import run_seed

    seed, workers, jobs, mutation, features = args
    r = run_seed(
        seed, workers=workers, jobs=jobs, mutation=mutation, trace=False, features=features
    )
    return SeedOutcome(
        seed,
        tuple((v.name, v.time, v.message) for v in r.violations),
        r.injected,
        r.counts,
        r.events,
        r.end_time,
    )


def replay_command(
    seed: int,
    mutation: str | None,
    workers: int | None = None,
    jobs: int | None = None,
    features: frozenset[str] | None = None,
) -> str:
    cmd = f"python -m simtools replay --seed {seed}"
    if mutation:
        cmd += f" --mutation {mutation}"
    if features is not None and features != frozenset(WIDE_FEATURES):
        cmd += f" --widen {widen_arg(features)}"
    if workers is not None:
        cmd += f" --workers {workers}"
    if jobs is not None:
        cmd += f" --jobs {jobs}"
    return cmd


def widen_arg(features: frozenset[str]) -> str:
    return ",".join(f for f in WIDE_FEATURES if f in features) or "none"


def parse_widen(text: str | None) -> frozenset[str] | None:
    """``--widen``: None (all features), "none", or a comma-separated list."""
    if text is None or text == "all":
        return None
    if text == "none":
        return frozenset()
    names = frozenset(t.strip() for t in text.split(",") if t.strip())
    unknown = sorted(names - set(WIDE_FEATURES))
    if unknown:
        raise ValueError(
            f"--widen: unknown feature(s) {', '.join(unknown)}; known: {', '.join(WIDE_FEATURES)}"
        )
    return names


def iterate(
    seeds: Sequence[int],
    *,
    workers: int | None,
    jobs: int | None,
    mutation: str | None,
    processes: int,
    features: frozenset[str] | None = None,
) -> Iterator[SeedOutcome]:
    tasks: list[Args] = [(s, workers, jobs, mutation, features) for s in seeds]
    if processes <= 1:
        for t in tasks:
            yield run_one(t)
        return
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(processes) as pool:
        yield from pool.imap_unordered(run_one, tasks, chunksize=16)


def run_seeds(
    seeds: Sequence[int],
    *,
    workers: int | None = None,
    jobs: int | None = None,
    mutation: str | None = None,
    processes: int = 1,
    progress: TextIO | None = None,
    every: int = 0,
    features: frozenset[str] | None = None,
) -> Summary:
    summary = Summary()
    start = time.perf_counter()
    for outcome in iterate(
        seeds,
        workers=workers,
        jobs=jobs,
        mutation=mutation,
        processes=processes,
        features=features,
    ):
        summary.add(outcome)
        if progress is not None and every and summary.seeds % every == 0:
            summary.wall_seconds = time.perf_counter() - start
            progress.write(
                f"  {summary.seeds:>7} schedules, {summary.rate:6.1f}/s, "
                f"{len(summary.failures)} failing\n"
            )
            progress.flush()
    summary.wall_seconds = time.perf_counter() - start
    summary.failures.sort(key=lambda o: o.seed)
    return summary


def report(
    summary: Summary,
    out: TextIO,
    *,
    first: int,
    mutation: str | None,
    processes: int,
    workers: int | None = None,
    jobs: int | None = None,
    features: frozenset[str] | None = None,
) -> None:
    w = out.write
    last = first + summary.seeds - 1
    w(
        f"seeds {first}..{last}: {summary.seeds} schedules in {summary.wall_seconds:.1f} s = "
        f"{summary.rate:.1f} schedules/s ({processes} process{'es' if processes > 1 else ''})"
        f"{'  mutation: ' + mutation if mutation else ''}"
        f"{'  widened: ' + widen_arg(features) if features is not None else ''}\n"
    )
    w(
        f"events {summary.events} ({summary.events / max(1, summary.seeds):.0f} per schedule), "
        f"virtual time {summary.virtual_seconds / 3600:.1f} h\n"
    )
    w("fault coverage (injected, and schedules that saw it):\n")
    for k in sorted(summary.injected):
        w(f"  {k:<24} {summary.injected[k]:>10}  in {summary.schedules_with[k]:>7} schedules\n")
    w("protocol coverage:\n")
    for k in sorted(summary.counts):
        w(f"  {k:<30} {summary.counts[k]:>10}\n")
    w(f"failing schedules: {len(summary.failures)}\n")
    by_name: dict[str, int] = {}
    for o in summary.failures:
        name = o.violations[0][0]
        by_name[name] = by_name.get(name, 0) + 1
    for name in sorted(by_name):
        w(f"  {name}: {by_name[name]}  ({INVARIANTS.get(name, 'run error')})\n")
    for o in summary.failures[:50]:
        name, t, message = o.violations[0]
        w(f"  seed {o.seed}: {name} at t={t:.3f}: {message}\n")
        w(f"    replay: {replay_command(o.seed, mutation, workers, jobs, features)}\n")
    if len(summary.failures) > 50:
        w(f"  ... and {len(summary.failures) - 50} more\n")


def summary_json(
    summary: Summary,
    *,
    first: int,
    mutation: str | None,
    processes: int,
    features: frozenset[str] | None = None,
) -> dict[str, Any]:
    return {
        "first_seed": first,
        "seeds": summary.seeds,
        "mutation": mutation,
        "widened": widen_arg(features) if features is not None else "all",
        "processes": processes,
        "wall_seconds": round(summary.wall_seconds, 2),
        "schedules_per_second": round(summary.rate, 2),
        "events": summary.events,
        "virtual_hours": round(summary.virtual_seconds / 3600, 1),
        "injected": dict(sorted(summary.injected.items())),
        "schedules_with": dict(sorted(summary.schedules_with.items())),
        "counts": dict(sorted(summary.counts.items())),
        "failures": [
            {
                "seed": o.seed,
                "violation": o.violations[0][0],
                "message": o.violations[0][2],
                "replay": replay_command(o.seed, mutation, features=features),
            }
            for o in summary.failures
        ],
    }


def _replay(
    seed: int,
    mutation: str | None,
    workers: int | None,
    jobs: int | None,
    features: frozenset[str] | None = None,
) -> int:
    from sqs_lease.testing._sim.render import render_entry

    from . import run_seed

    r = run_seed(seed, workers=workers, jobs=jobs, mutation=mutation, trace=True, features=features)
    for entry in r.log:
        sys.stdout.write(render_entry(entry) + "\n")
    sys.stdout.write(
        f"--- seed {seed}{' mutation ' + mutation if mutation else ''}: {r.events} events, "
        f"virtual end t={r.end_time:.3f}\n"
    )
    if r.ok:
        sys.stdout.write("all invariants held\n")
        return 0
    for v in r.violations:
        sys.stdout.write(f"VIOLATION {v.line()}\n")
    return 1


_WIDEN_HELP = (
    "widened-world features to allow: all (default), none, or a comma list of "
    + ", ".join(WIDE_FEATURES)
)


# A run allocates many short-lived generators and closures; collecting the young
# generation less often makes it about a third faster and changes nothing else.
FAST_GC_THRESHOLDS = (20_000, 20, 100)


@contextmanager
def tuned_gc() -> Iterator[None]:
    """The collector's thresholds set for speed while the block runs, then restored.

    Process-wide state: only the simulator's command line opts in (``main``); the
    package never sets them. Forked pool workers inherit the setting.
    """
    saved = gc.get_threshold()
    gc.set_threshold(*FAST_GC_THRESHOLDS)
    try:
        yield
    finally:
        gc.set_threshold(*saved)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m simtools``: the collector is tuned for speed while it runs."""
    with tuned_gc():
        return _main(argv)


def _main(argv: Sequence[str] | None) -> int:
    parser = argparse.ArgumentParser(prog="python -m simtools", description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)
    for name in ("run", "soak"):
        p = sub.add_parser(name)
        p.add_argument("--seeds", type=int, default=1000 if name == "run" else 100_000)
        p.add_argument("--start", type=int, default=0)
        p.add_argument("--workers", type=int, default=None)
        p.add_argument("--jobs", type=int, default=None)
        p.add_argument("--mutation", choices=sorted(VARIANTS), default=None)
        p.add_argument("--processes", type=int, default=1 if name == "run" else 2)
        p.add_argument("--json", dest="json_path", default=None, help="also write the summary here")
        p.add_argument("--widen", default=None, help=_WIDEN_HELP)
    mp = sub.add_parser("mutations")
    mp.add_argument("--only", nargs="+", choices=sorted(MUTATIONS), default=None)
    mp.add_argument("--processes", type=int, default=2)
    rp = sub.add_parser("replay")
    rp.add_argument("--widen", default=None, help=_WIDEN_HELP)
    rp.add_argument("--seed", type=int, required=True)
    rp.add_argument("--mutation", choices=sorted(VARIANTS), default=None)
    rp.add_argument("--workers", type=int, default=None)
    rp.add_argument("--jobs", type=int, default=None)
    dp = sub.add_parser("digest", help="one hash per seed of everything a run leaves behind")
    dp.add_argument("--seeds", type=int, default=100)
    dp.add_argument("--start", type=int, default=0)
    dp.add_argument("--widen", default=None, help=_WIDEN_HELP)
    dp.add_argument("--mutation", choices=sorted(VARIANTS), default=None)
    dp.add_argument("--trace", choices=("both", "on", "off"), default="both")
    fp = sub.add_parser("fleet", help="a fleet on one queue and its tables, against AWS's limits")
    fp.add_argument("--workers", type=int, default=500)
    fp.add_argument("--jobs", type=int, default=100_000)
    fp.add_argument("--burst", type=float, default=60.0, help="seconds the jobs are submitted over")
    fp.add_argument("--concurrency", type=int, default=4)
    fp.add_argument("--table", choices=("new", "quota"), default="new")
    fp.add_argument("--seed", type=int, default=0)
    fp.add_argument("--mutation", choices=sorted(VARIANTS), default=None)
    fp.add_argument("--json", dest="json_path", default=None, help="also write the report here")
    args = parser.parse_args(argv)
    if args.cmd == "fleet":
        return _fleet(args, sys.stdout)
    if args.cmd == "mutations":
        return _mutations(args.only or sorted(MUTATIONS), args.processes, sys.stdout)
    try:
        features = parse_widen(args.widen)
    except ValueError as exc:
        parser.error(str(exc))
    if args.cmd == "replay":
        return _replay(args.seed, args.mutation, args.workers, args.jobs, features)
    if args.cmd == "digest":
        from .digest import digests

        for seed, digest in digests(
            range(args.start, args.start + args.seeds),
            trace=args.trace,
            features=features,
            mutation=args.mutation,
        ):
            sys.stdout.write(f"{seed} {digest}\n")
            sys.stdout.flush()
        return 0
    if args.seeds < 1 or args.processes < 1:
        parser.error("--seeds and --processes must be >= 1")
    seeds = range(args.start, args.start + args.seeds)
    soak = args.cmd == "soak"
    if soak:
        sys.stdout.write(
            f"soak: {args.seeds} schedules from seed {args.start} on {args.processes} processes\n"
        )
    summary = run_seeds(
        seeds,
        workers=args.workers,
        jobs=args.jobs,
        mutation=args.mutation,
        processes=args.processes,
        progress=sys.stdout if soak else None,
        every=max(1000, args.seeds // 50) if soak else 0,
        features=features,
    )
    report(
        summary,
        sys.stdout,
        first=args.start,
        mutation=args.mutation,
        processes=args.processes,
        workers=args.workers,
        jobs=args.jobs,
        features=features,
    )
    if args.json_path:
        with open(args.json_path, "w") as fh:
            json.dump(
                summary_json(
                    summary,
                    first=args.start,
                    mutation=args.mutation,
                    processes=args.processes,
                    features=features,
                ),
                fh,
                indent=2,
            )
    return 1 if summary.failures else 0


def _fleet(args: argparse.Namespace, out: TextIO) -> int:
    """Run one fleet; print its report (JSON); 1 when the checker found a violation."""
    from sqs_lease.testing._sim import fleet

    if min(args.workers, args.jobs, args.concurrency) < 1 or args.burst < 0:
        raise SystemExit("fleet: --workers, --jobs and --concurrency must be >= 1, --burst >= 0")
    spec = fleet.FleetSpec(
        workers=args.workers,
        jobs=args.jobs,
        burst=args.burst,
        concurrency=args.concurrency,
        table=args.table,
        seed=args.seed,
    )
    started = time.perf_counter()
    with applied(args.mutation):
        found = fleet.run(spec, mutation=args.mutation).as_dict()
    found["wall_seconds"] = round(time.perf_counter() - started, 1)
    text = json.dumps(found, indent=1)
    out.write(text + "\n")
    if args.json_path:
        with open(args.json_path, "w") as fh:
            fh.write(text + "\n")
    return 0 if found["ok"] else 1


def _mutations(names: Sequence[str], processes: int, out: TextIO) -> int:
    """Search where each mutation is first caught; print the table to pin."""
    started = time.perf_counter()
    if processes > 1:
        with multiprocessing.get_context("fork").Pool(processes) as pool:
            found: list[Catch] = pool.map(first_catch, names, chunksize=1)
    else:
        found = [first_catch(n) for n in names]
    bad = 0
    out.write("CAUGHT_AT = {\n")
    for c in found:
        if c.seed is None:
            bad += 1
            out.write(f"    # {c.name}: NOT CAUGHT in its search\n")
            continue
        note = f"  # {c.violation}"
        if c.protocol_fails:
            bad += 1
            note += f"; the real protocol FAILS seeds {c.protocol_fails}"
        out.write(f'    "{c.name}": {c.seed},{note}\n')
    out.write("}\n")
    out.write(f"searched {len(found)} mutations in {time.perf_counter() - started:.1f} s\n")
    return 1 if bad else 0
