"""The benchmark plot (``benchmarks.png``): throughput and requests per job against
concurrency (benchmark 2's sweep), and heartbeat lateness against jobs in flight
(benchmark 5). Written by ``benchmarks/run.py`` after the runs; a panel whose
benchmark did not run says so. Needs matplotlib (the ``bench`` extra).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

PLOTTED = ("overhead", "scale")
"""The benchmarks the plot draws: a run without them all keeps the plot it has (a
``--only`` run must not blank the panels of a full run's plot)."""


def draws_all(names: Iterable[str]) -> bool:
    """Whether a run of ``names`` holds everything the plot draws."""
    return set(PLOTTED) <= set(names)


def write_plot(results: dict[str, Any], path: Path, stamp: str) -> Path | None:
    """Draw what ``results`` holds into ``path``; None when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.8))
    ax_tp, ax_req, ax_gap = axes
    sweep = (results.get("overhead") or {}).get("sweep") or {}
    if sweep:
        for kind, points in sweep.items():
            xs = [p["concurrency"] for p in points]
            ax_tp.plot(xs, [p["jobs_per_second"] for p in points], marker="o", label=kind)
            ax_req.plot(xs, [p["calls_per_job"] for p in points], marker="o", label=kind)
        ax_req.axhline(2.2, color="grey", linestyle="--", linewidth=1, label="floor (2.2)")
        for ax in (ax_tp, ax_req):
            ax.set_xscale("log")
            ax.set_xlabel("concurrency (jobs at once, one process)")
            ax.legend(fontsize=8)
            ax.grid(True, alpha=0.3)
    else:
        for ax in (ax_tp, ax_req):
            ax.text(0.5, 0.5, "benchmark 2 (overhead) not in this run", ha="center")
    ax_tp.set_ylabel("jobs/s (no-op handler, one moto server)")
    ax_tp.set_title("Throughput against concurrency")
    ax_req.set_ylabel("AWS requests per job")
    ax_req.set_title("Requests per job against concurrency")
    runs = [r for r in (results.get("scale") or {}).get("runs", []) if r.get("periods")]
    if runs:
        series: dict[str, list[tuple[int, float, float, float]]] = {}
        for r in runs:
            periods = r["periods"]

            def worst(key: str, periods: list[dict[str, Any]] = periods) -> float:
                vals = [p[key] for p in periods if not math.isnan(p.get(key, math.nan))]
                return max(vals) if vals else math.nan

            name = f"{r['shell']} ({r.get('backend', 'moto')})"
            held = int(r.get("held") or r["jobs"])
            series.setdefault(name, []).append(
                (held, worst("late_p50"), worst("late_p99"), worst("late_max"))
            )
        for name, pts in series.items():
            pts.sort()
            xs = [p[0] for p in pts]
            for i, (label, style) in enumerate((("p50", ":"), ("p99", "-"), ("max", "--"))):
                ax_gap.plot(
                    xs,
                    [p[i + 1] for p in pts],
                    marker="o",
                    linestyle=style,
                    label=f"{name} {label}",
                )
        ax_gap.set_xscale("log")
        ax_gap.set_xlabel("jobs in flight (one process)")
        ax_gap.legend(fontsize=7)
        ax_gap.grid(True, alpha=0.3)
    else:
        ax_gap.text(0.5, 0.5, "benchmark 5 (scale) not in this run", ha="center")
    ax_gap.set_ylabel("beat lateness, s (extension sent - due)")
    ax_gap.set_title("Heartbeat lateness against jobs in flight")
    fig.suptitle(f"sqs-lease benchmarks ({stamp})", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
