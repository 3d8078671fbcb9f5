"""`benchmarks/run.py` works: a quick run completes and reports every figure's key.

Timings are never asserted (shared, noisy machines); only that each benchmark
ran against its moto server and produced what BENCHMARKS.md is rendered from.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from benchmarks import run as bench_run
from benchmarks.bench_calls import floor_at_held
from benchmarks.plot import draws_all

ROOT = Path(__file__).resolve().parent.parent


# Two halves of about equal length, each one test: pytest-xdist runs them on two
# workers at once, so the quick run is not one long pole of `make test`.
HALVES = [("calls", "overhead", "cost"), ("heartbeat", "takeover", "scale", "coldstart")]


@pytest.mark.integration
@pytest.mark.fault
@pytest.mark.timeout(600)  # hang guards only: a calm machine takes about 40 s a half
@pytest.mark.parametrize("names", HALVES, ids=["-".join(h) for h in HALVES])
def test_quick_bench_run_completes(tmp_path: Path, names: tuple[str, ...]) -> None:
    out, md, png = tmp_path / "results.json", tmp_path / "block.md", tmp_path / "plot.png"
    only = [arg for name in names for arg in ("--only", name)]
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "run.py"),
            "--quick",
            *only,
            "--no-write",
            "--json",
            str(out),
            "--markdown",
            str(md),
            "--plot",
            str(png),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=570,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data: dict[str, Any] = json.loads(out.read_text())
    assert {"nproc", "python", "moto"} <= set(data["machine"])
    results = data["results"]
    assert set(results) == set(names)
    for r in results.values():
        assert "error" not in r
        assert {"date", "seconds", "load_before"} <= set(r["meta"])
    for name in names:
        CHECKS[name](results[name])
    # The plot is drawn from whatever the run holds (a panel per benchmark it has).
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = md.read_text()
    assert text.startswith(bench_run.START) and text.rstrip().endswith(bench_run.END)
    for name in names:
        assert f"<!-- bench:{name}:start -->" in text


def test_the_two_halves_run_every_benchmark() -> None:
    assert sorted(n for half in HALVES for n in half) == sorted(bench_run.NAMES)


def _check_calls(calls: dict[str, Any]) -> None:
    assert {"params", "floor_calls_per_job", "floor_by_op_per_job"} <= set(calls)
    for col in ("batched", "producer", "window"):
        assert calls[col]["committed"] == calls["params"]["jobs"]
        # Rounds of fewer than 100 jobs still read and write once: never below the floor.
        assert calls[col]["floor_at_held"] >= calls["floor_calls_per_job"] - 1e-9
        assert {
            "calls_per_job",
            "ratio_to_floor",
            "calls_by_op_per_job",
            "worker_wcu_per_job",
            "worker_rcu_per_job",
            "moto_busy",
            "journal",
        } <= set(calls[col])


def _check_overhead(overhead: dict[str, Any]) -> None:
    assert {"bare", "fenced loop", "sqs-lease", "sqs-lease async"} <= set(overhead["contenders"])
    for worker in ("sqs-lease", "sqs-lease async"):
        # Each worker side by side with the minimal fenced loop (and Powertools, when
        # installed) in the same run: the ratios the issue asks for.
        assert "fenced loop" in overhead["ratios"][worker]
        assert {"throughput", "calls"} <= set(overhead["ratios"][worker]["fenced loop"])
    for c in overhead["contenders"].values():
        assert {"jobs_per_second", "calls_per_job", "moto_busy"} <= set(c)

    for points in overhead["sweep"].values():
        assert len(points) >= 2 and all(p["jobs_per_second"] > 0 for p in points)


def _check_heartbeat(heartbeat: dict[str, Any]) -> None:
    (size,) = heartbeat["sizes"].values()
    assert set(size["methods"]) == {"batched", "naive", "async sequential", "async gather"}
    assert (
        size["methods"]["batched"]["calls_per_round"] < size["methods"]["naive"]["calls_per_round"]
    )


def _check_takeover(takeover: dict[str, Any]) -> None:
    assert len(takeover["samples"]) == takeover["params"]["reps"]
    assert {"takeover_median", "ratio_to_lease_plus_wait"} <= set(takeover)


def _check_scale(scale: dict[str, Any]) -> None:
    assert [(r["shell"], r["jobs"], r["backend"]) for r in scale["runs"]] == [
        ("async", 20, "moto"),
        ("thread", 20, "moto"),
        ("async", 20, "standin"),
    ]
    for r in scale["runs"]:
        # Every job was held at once, extended while held, and released at the stop.
        assert r["held"] == r["jobs"] and r["stats"]["released"] == r["jobs"]
        assert r["peak_rss_mb"] > 0
        assert len(r["periods"]) == scale["params"]["periods"]
        for per in r["periods"]:
            assert {"late_p50", "late_p99", "late_max", "worker_cpu", "moto_cpu"} <= set(per)
        # Extended while held: in the run as a whole (a period of a loaded machine
        # may pass with no round in it; lateness is the figure, not the test).
        assert sum(p["calls"].get("ChangeMessageVisibilityBatch", 0) for p in r["periods"]) >= 1
    # The stand-in answered every call itself and no extension came after its lease ran out.
    assert scale["runs"][2]["lapsed_extensions"] == 0


def _check_cost(cost: dict[str, Any]) -> None:
    for shape in ("short", "effect", "staged", "held"):
        raw = cost[shape]["raw"]
        assert raw["committed"] == raw["jobs"] and raw["failed"] == 0, shape
        assert cost[shape]["per_job"]["requests"] > 0 and cost[shape]["per_job"]["wcu"] > 0
    # Whole jobs, not the first stages' ends: every staged job ran its three stages.
    staged = cost["staged"]["per_job"]["calls"]
    assert staged.get("UpdateItem(claim)", 0) >= 3, staged
    assert staged.get("UpdateItem(checkpoint)", 0) >= 2, staged
    assert staged.get("UpdateItem(commit)", 0) >= 1, staged
    assert cost["held"]["raw"]["calls"].get("PutItem(liveness)", 0) >= 1
    assert "UpdateItem(advise)" not in cost["held"]["raw"]["calls"]  # no write per job
    assert cost["ten_minutes"]["rounds"] == 120 and cost["prices_date"]


def _check_coldstart(cold: dict[str, Any]) -> None:
    for who in ("baseline", "modelled", "sqs_lease"):
        assert cold[who]["wall"] > 0 and cold[who]["cpu"] > 0
    assert cold["ratio_cpu"] > 0
    assert cold["own_modules"]  # the toolkit's modules, as -X importtime measured them


def test_the_lambda_adapter_loads_nothing_its_path_never_runs() -> None:
    """Issue 30 item 1: no asyncio worker, aiobotocore, simulator or table creation."""
    code = (
        "import sys, sqs_lease.aws_lambda\n"
        "banned = ('asyncio', 'aiobotocore', 'sqs_lease._aio_worker', 'sqs_lease.testing',"
        " 'sqs_lease.deploy', 'sqs_lease._schema.create_table')\n"
        "print(sorted(m for m in sys.modules if m in banned or m.startswith('aiobotocore')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]", out.stdout


CHECKS = {
    "calls": _check_calls,
    "overhead": _check_overhead,
    "heartbeat": _check_heartbeat,
    "takeover": _check_takeover,
    "scale": _check_scale,
    "coldstart": _check_coldstart,
    "cost": _check_cost,
}


def test_rewrite_keeps_other_sections_and_other_benchmarks(tmp_path: Path) -> None:
    path = tmp_path / "BENCHMARKS.md"
    path.write_text(
        "# Benchmarks\n\n## Chaos\nkeep me\n\n"
        f"{bench_run.START}\nold intro\n"
        "<!-- bench:calls:start -->\nOLD CALLS\n<!-- bench:calls:end -->\n"
        "<!-- bench:takeover:start -->\nOLD TAKEOVER\n<!-- bench:takeover:end -->\n"
        f"{bench_run.END}\n\n## Soak\nkeep too\n"
    )
    meta = {
        "date": "2024-01-01 00:00 UTC",
        "seconds": 1.0,
        "load_before": 0.1,
        "load_after": 0.1,
        "quick": True,
    }
    host = {
        "nproc": 2,
        "python": "3.11",
        "platform": "Linux",
        "moto": "5",
        "boto3": "1",
        "aiobotocore": "2",
    }
    bench_run.write_markdown(path, {"takeover": {"error": "boom", "meta": meta}}, host)
    text = path.read_text()
    assert "keep me" in text and "keep too" in text and "OLD CALLS" in text
    assert "OLD TAKEOVER" not in text and "boom" in text and "old intro" not in text
    assert text.count(bench_run.START) == 1 and text.count(bench_run.END) == 1

    fresh = tmp_path / "NEW.md"
    bench_run.write_markdown(fresh, {"takeover": {"error": "boom", "meta": meta}}, host)
    assert fresh.read_text().startswith("# Benchmarks\n\n" + bench_run.START)


@pytest.mark.integration
@pytest.mark.timeout(300)  # hang guard only
def test_write_cost_measures_every_shape_against_its_moto_server() -> None:
    from benchmarks import write_cost
    from benchmarks.bench_common import moto_server

    with moto_server() as moto:
        costs = write_cost.measure(moto, 3)  # raises if a claim or commit is refused
    assert set(costs) == {
        "GetItem, missing key (the floor)",
        "powertools PutItem",
        "powertools UpdateItem",
        "sqs-lease claim UpdateItem",
        "sqs-lease commit UpdateItem",
        "minimal fenced claim",
        "minimal fenced commit",
    }
    assert all(ms >= 0 for ms in costs.values())


def test_call_labels_tell_the_protocols_writes_apart() -> None:
    from benchmarks.bench_common import call_label
    from sqs_lease._schema.job_requests import JobTable

    t = JobTable("jobs")
    claim = t.claim("j", "w", 1.0, 30, job_class="c", send_id="s")
    assert call_label(claim) == "UpdateItem(claim)"
    assert (
        call_label(t.commit("j", 1, "w", "{}", 1.0, write_id="n-1:commit")) == "UpdateItem(commit)"
    )
    assert call_label(t.mark_sent("j", "s", 1.0)) == "UpdateItem(mark_sent)"
    checkpoint = t.advance_stage(
        "j",
        1,
        "w",
        stage="a",
        next_stage="b",
        stage_input="{}",
        stage_log="[]",
        send_id="s2",
        wall_now=1.0,
        write_id="n-1:stage",
    )
    assert call_label(checkpoint) == "UpdateItem(checkpoint)"


def test_the_floor_at_the_jobs_held_counts_a_rounds_calls_once_for_all_it_holds() -> None:
    # 100 held: 10 visibility batches, 1 read, 1 liveness write per round.
    assert floor_at_held(100, 1) == 2.2 + 12 / 100
    # 25 held, 2 beats: 3 batches + 1 read + 1 write per round, over 25 jobs.
    assert floor_at_held(25, 2) == 2.2 + 2 * 5 / 25


def test_a_run_of_some_benchmarks_keeps_the_full_runs_plot() -> None:
    # `--only calls` once blanked both panels of the plot a full run had drawn.
    assert not draws_all(["calls"]) and not draws_all(["overhead"])
    assert draws_all(bench_run.NAMES) and draws_all(["scale", "overhead"])
