"""`make bench`: run the benchmarks side by side and write their figures to BENCHMARKS.md.

Usage::

    python benchmarks/run.py [--only NAME ...] [--quick | --full] [--no-write | --write]
                             [--json FILE] [--output FILE] [--plot FILE]
                             [--max-load X] [--max-wait S]

Each benchmark starts its own moto server in a separate process. The figures go
between ``<!-- bench:start -->`` and ``<!-- bench:end -->`` in BENCHMARKS.md, one
sub-section per benchmark (``--only`` rewrites just its own); the rest of the file
is kept. ``--quick`` (tiny sizes, for the smoke test) does not write unless
``--write`` is given. The default sizes fit in about 15 minutes on a shared
2-core machine; ``--full`` (``BENCH_FULL=1``) runs the long ones (7 runs of
200 messages per contender, a wider concurrency sweep, 300 jobs held against moto
too). The plot (``benchmarks.png``, matplotlib) is drawn from the same run; an
``--only`` run without both of the benchmarks it draws (overhead, scale) keeps it.
Timings are measured, never asserted: the machines are shared and noisy, so
read the ratios measured within one run.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import (  # noqa: E402
    bench_calls,
    bench_coldstart,
    bench_cost,
    bench_heartbeat,
    bench_overhead,
    bench_scale,
    bench_takeover,
)
from benchmarks.bench_common import load_average, machine, setup_env  # noqa: E402
from benchmarks.plot import PLOTTED, draws_all, write_plot  # noqa: E402

COMMAND = "make bench  (= .venv/bin/python benchmarks/run.py)"
START, END = "<!-- bench:start -->", "<!-- bench:end -->"


@dataclass(frozen=True)
class Bench:
    name: str
    title: str
    run: Callable[[bool], dict[str, Any]]
    render: Callable[[dict[str, Any]], str]


def _bench(module: ModuleType) -> Bench:
    return Bench(module.NAME, module.TITLE, module.run, module.render)


BENCHES: tuple[Bench, ...] = tuple(
    _bench(m)
    for m in (
        bench_calls,
        bench_overhead,
        bench_heartbeat,
        bench_takeover,
        bench_scale,
        bench_cost,
        bench_coldstart,
    )
)
NAMES = tuple(b.name for b in BENCHES)


def say(text: str) -> None:
    print(text, flush=True)


def wait_for_quiet(max_load: float, max_wait: float) -> float:
    """Wait (bounded) while the 1-minute load average is above ``max_load``."""
    deadline = time.monotonic() + max_wait
    load = load_average()
    while load > max_load and time.monotonic() < deadline:
        say(f"load average {load:.2f} > {max_load}: waiting (at most {max_wait:g} s in all)")
        time.sleep(min(15.0, max(0.0, deadline - time.monotonic())))
        load = load_average()
    return load


def run_all(names: Sequence[str], quick: bool) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for bench in BENCHES:
        if bench.name not in names:
            continue
        say(f"== {bench.name}: {bench.title}{' (quick)' if quick else ''}")
        started = dt.datetime.now(dt.UTC)
        load_before = load_average()
        t0 = time.monotonic()
        try:
            result = bench.run(quick)
        except Exception as exc:
            traceback.print_exc()
            result = {"error": f"{type(exc).__name__}: {exc}"}
        result["meta"] = {
            "date": started.strftime("%Y-%m-%d %H:%M UTC"),
            "seconds": round(time.monotonic() - t0, 1),
            "load_before": round(load_before, 2),
            "load_after": round(load_average(), 2),
            "quick": quick,
        }
        say(f"   done in {result['meta']['seconds']} s")
        results[bench.name] = result
    return results


def section(bench: Bench, result: dict[str, Any], host: dict[str, Any]) -> str:
    meta = result["meta"]
    stamp = (
        f"_Run {meta['date']}{' (quick sizes)' if meta['quick'] else ''}; took "
        f"{meta['seconds']:g} s; machine: {host['nproc']} CPUs, Python {host['python']}, "
        f"{host['platform']}; moto {host['moto']}, boto3 {host['boto3']}, aiobotocore "
        f"{host['aiobotocore']}; 1-min load average {meta['load_before']} before, "
        f"{meta['load_after']} after._"
    )
    if "error" in result:
        body = f"**Failed:** `{result['error']}` (figures of this benchmark not produced)."
    else:
        body = bench.render(result)
    return "\n".join(
        [
            f"<!-- bench:{bench.name}:start -->",
            f"### {bench.title}",
            "",
            stamp,
            "",
            body,
            f"<!-- bench:{bench.name}:end -->",
        ]
    )


def _intro() -> str:
    return "\n".join(
        [
            "## Performance (`make bench`)",
            "",
            f"Command: `{COMMAND}`; `--only NAME` reruns one of "
            f"{', '.join(f'`{n}`' for n in NAMES)} and rewrites only its sub-section. "
            "Each benchmark starts its own moto server in a separate process "
            "(`spawn_local_server`, 127.0.0.1) and reads that process's CPU time from /proc: "
            "moto serves under one GIL, so **moto busy near 100% of one core means moto, not "
            "the worker, is the limit**. The machine is shared and noisy (2 cores, other "
            "jobs running): compare the ratios measured side by side within one section, not "
            "absolute figures across sections or runs.",
            "",
            "Plot of this run: [benchmarks.png](benchmarks.png) (throughput and requests per job "
            "against concurrency; heartbeat lateness against jobs in flight). Cost per million "
            "jobs: benchmark 6. What one queue and its tables carry, and the read cost of the "
            "operator queries at 10 million records: [docs/scale.md](docs/scale.md).",
        ]
    )


def render_block(results: dict[str, Any], host: dict[str, Any], previous: str | None = None) -> str:
    """The whole bench block; sub-sections not rerun are kept from ``previous``."""
    kept: dict[str, str] = {}
    if previous:
        for name in NAMES:
            m = re.search(
                rf"<!-- bench:{name}:start -->.*?<!-- bench:{name}:end -->", previous, re.S
            )
            if m:
                kept[name] = m.group(0)
    parts = [START, _intro(), ""]
    for bench in BENCHES:
        if bench.name in results:
            parts += [section(bench, results[bench.name], host), ""]
        elif bench.name in kept:
            parts += [kept[bench.name], ""]
    parts.append(END)
    return "\n".join(parts)


def write_markdown(path: Path, results: dict[str, Any], host: dict[str, Any]) -> None:
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    pattern = re.compile(re.escape(START) + r".*?" + re.escape(END), re.S)
    m = pattern.search(text)
    block = render_block(results, host, m.group(0) if m else None)
    if m:
        text = text[: m.start()] + block + text[m.end() :]
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    path.write_text(text)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="benchmarks/run.py", description=__doc__.split("\n")[0])
    parser.add_argument("--only", action="append", choices=NAMES, help="run only this (repeatable)")
    parser.add_argument("--quick", action="store_true", help="tiny sizes (smoke test)")
    parser.add_argument("--full", action="store_true", help="the long runs (about an hour)")
    parser.add_argument(
        "--plot", type=Path, help="draw the plot here (default when writing: benchmarks.png)"
    )
    parser.add_argument("--write", dest="write", action="store_true", default=None)
    parser.add_argument("--no-write", dest="write", action="store_false")
    parser.add_argument("--json", type=Path, help="also dump the raw results as JSON here")
    parser.add_argument("--output", type=Path, default=ROOT / "BENCHMARKS.md")
    parser.add_argument("--markdown", type=Path, help="write the rendered block here too")
    parser.add_argument("--max-load", type=float, default=1.5)
    parser.add_argument("--max-wait", type=float, default=None, help="s (default 60; quick 0)")
    args = parser.parse_args(argv)
    if args.full:
        os.environ["BENCH_FULL"] = "1"
    started = time.monotonic()
    write = (not args.quick) if args.write is None else args.write
    names = args.only or list(NAMES)
    setup_env()
    host = machine()
    max_wait = args.max_wait if args.max_wait is not None else (0.0 if args.quick else 60.0)
    load = wait_for_quiet(args.max_load, max_wait)
    say(f"machine: {host}; load average {load:.2f}")
    results = run_all(names, args.quick)
    if args.json:
        args.json.write_text(json.dumps({"machine": host, "results": results}, indent=2))
    block = render_block(results, host)
    if args.markdown:
        args.markdown.write_text(block + "\n")
    if write:
        write_markdown(args.output, results, host)
        say(f"wrote {args.output}")
    plot = args.plot or (ROOT / "benchmarks.png" if write and draws_all(names) else None)
    if write and args.plot is None and plot is None:
        say(f"plot kept: it draws {', '.join(PLOTTED)}, and this run has not all of them")
    if plot is not None:
        stamp = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
        drawn = write_plot(results, plot, f"{stamp}, load {load_average():.1f}")
        say(f"wrote {drawn}" if drawn else "no plot: matplotlib is not installed (bench extra)")
    say(
        f"make bench took {time.monotonic() - started:.0f} s; 1-min load average "
        f"{load_average():.2f}"
    )
    failed = [n for n, r in results.items() if "error" in r]
    if failed:
        say(f"failed: {', '.join(failed)}")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
