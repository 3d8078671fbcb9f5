"""`benchmarks/chaos.py` works: one very short real chaos run, and its checks bite.

The run is real (moto in its own process, two worker processes behind fault
proxies, the fenced receiver, SIGSTOP/SIGKILL and proxy cuts); seed 1's
schedule is a kill, a pause and a cut. The other tests feed the invariant
checker fabricated evidence, good and broken, without any process.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from benchmarks.chaos import Evidence, JobPlan, check_invariants

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.integration
@pytest.mark.fault
@pytest.mark.timeout(400)  # hang guards only: a calm machine takes about 20 s
def test_one_short_chaos_run(tmp_path: Path) -> None:
    report = tmp_path / "report.md"
    cmd = [
        sys.executable,
        str(ROOT / "benchmarks" / "chaos.py"),
        "--runs", "1",
        "--seed", "1",
        "--workers", "2",
        "--jobs", "8",
        "--fault-seconds", "8",
        "--drain-seconds", "90",  # the largest bound; a drained run ends at once
        "--artefacts", str(tmp_path / "chaos"),
        "--report", str(report),
    ]  # fmt: skip
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=360)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    assert "chaos: OK" in out
    assert "duplicates 0, lost jobs 0" in out
    assert "faults 3: cut 1, kill 1, pause 1" in out, out[-3000:]
    assert "**duplicated effects** | **0**" in report.read_text()


def _good() -> tuple[list[JobPlan], Evidence]:
    """Job pay-000 applied capture (token 1), changed hands, applied fee (token 2)."""
    jobs = [
        JobPlan("pay-000", "pay", {}, 0.0, (("INV-000", 120), ("INV-000", 7))),
        JobPlan("compute-001", "compute", {}, 0.0, ()),
    ]
    cap, fee = "pay-000:main:capture:payments", "pay-000:main:fee:payments"
    result = json.dumps({"worker": "w2-1", "token": 2})
    ev = Evidence(
        records={
            "pay-000": {"job_id": "pay-000", "state": "succeeded", "token": 2, "owner": "w2-1",
                        "result": result},
            "compute-001": {"job_id": "compute-001", "state": "parked", "token": 1,
                            "owner": "w1-1", "reason": "tool outcome unknown"},
        },
        intents=[
            {"intent_key": cap, "job_id": "pay-000", "state": "confirmed", "external_id": "ch_1"},
            {"intent_key": fee, "job_id": "pay-000", "state": "confirmed", "external_id": "ch_2"},
        ],
        attempts=[
            {"intent_key": cap, "attempt": 1, "token": 1},
            {"intent_key": fee, "attempt": 1, "token": 2},
        ],
        ledger=[
            {"idem_key": cap, "charge_id": "ch_1", "invoice": "INV-000", "amount": 120,
             "scope": "pay-000", "token": 1, "applied_at": 100.0},
            {"idem_key": fee, "charge_id": "ch_2", "invoice": "INV-000", "amount": 7,
             "scope": "pay-000", "token": 2, "applied_at": 105.0},
        ],
        fences=[{"scope": "pay-000", "token": 2}],
        journals={
            "w1-1": [
                {"event": "heartbeat_ok", "job_id": "pay-000", "token": 1},
                {"event": "heartbeat_lost", "job_id": "pay-000", "token": 1},
                {"event": "result_rejected", "job_id": "pay-000", "token": 1},
            ],
            "w2-1": [{"event": "result_committed", "job_id": "pay-000", "token": 2}],
        },
        receiver_journal=[
            {"event": "effect_applied", "idem_key": cap, "ts": 100.1},
            {"event": "effect_applied", "idem_key": fee, "ts": 105.1},
        ],
    )  # fmt: skip
    return jobs, ev


def test_checker_passes_consistent_evidence() -> None:
    jobs, ev = _good()
    assert check_invariants(jobs, ev) == []


def _broken(change: Any) -> list[str]:
    jobs, ev = _good()
    ev = copy.deepcopy(ev)
    change(ev)
    return check_invariants(jobs, ev)


def test_checker_bites() -> None:
    def duplicate(ev: Evidence) -> None:
        row = {**ev.ledger[0], "idem_key": "pay-000:main:capture:payments:t2", "token": 2}
        ev.ledger.append(row)
        ev.attempts.append({"intent_key": row["idem_key"], "attempt": 1, "token": 2})
        ev.receiver_journal.append({"event": "effect_applied", "idem_key": row["idem_key"],
                                    "ts": 106.0})  # fmt: skip

    def stale(ev: Evidence) -> None:
        ev.ledger[0]["applied_at"] = 106.0  # token 1 began committing after token 2 had

    def lost(ev: Evidence) -> None:
        ev.records["compute-001"]["state"] = "running"

    def superseded(ev: Evidence) -> None:
        ev.journals["w1-1"].append(
            {"event": "result_committed", "job_id": "pay-000", "token": 1, "worker": "w1-1"}
        )

    def stuck_intent(ev: Evidence) -> None:
        ev.intents[1]["state"] = "in_progress"

    def extended_after_loss(ev: Evidence) -> None:
        ev.journals["w1-1"].append({"event": "heartbeat_ok", "job_id": "pay-000", "token": 1})

    def phantom_confirm(ev: Evidence) -> None:
        ev.intents[0]["external_id"] = "ch_other"

    def mark_below_rows(ev: Evidence) -> None:
        ev.fences[0]["token"] = 1

    def stray_mark(ev: Evidence) -> None:
        ev.fences.append({"scope": "nobody", "token": 1})

    cases = {
        "duplicate": duplicate,
        "stale effect": stale,
        "lost": lost,
        "result_committed by w": superseded,
        "left in_progress": stuck_intent,
        "after losing it": extended_after_loss,
        "the receiver applied": phantom_confirm,
        "fence mark of job pay-000": mark_below_rows,
        "which is no submitted job": stray_mark,
    }
    for expected, change in cases.items():
        found = _broken(change)
        assert any(expected in v for v in found), (expected, found)
