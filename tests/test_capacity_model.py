"""`benchmarks/capacity.py`: the capacity model docs/scale.md quotes.

At records under 1 KB it must give the WCU per job `make bench` measured (BENCHMARKS.md,
benchmark 6: a short job 2 + its producer's 2; one effect 11 more; each extra stage 3
more, the producer's included); past 1 KB every record write scales with the record.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from benchmarks import capacity as cap

ROOT = Path(__file__).resolve().parent.parent


def test_at_the_floor_the_model_counts_what_the_benchmark_measured() -> None:
    assert cap.job_wcu(cap.Shape("short", 1.0)) == 2 + 2
    assert cap.job_wcu(cap.Shape("effect", 1.0, effects=1)) == 13 + 2
    assert cap.job_wcu(cap.Shape("staged", 1.0, stages=3)) == 8 + 2


def test_every_write_of_the_record_scales_with_its_size() -> None:
    # 16 KB: the put, the mark, the claim at 16 WCU each, the commit with its result at
    # 17; an effect's ConditionCheck is a transactional write of the whole record.
    s = cap.Shape("big", 1.0, record_kb=16.0)
    assert cap.job_wcu(s) == 3 * 16 + 17
    assert cap.effect_wcu(s) == cap.INTENT_WCU + 2 * 16
    assert cap.rcu_per_round(s) == 4
    assert round(cap.DDB_TABLE_QUOTA / cap.job_wcu(s)) == 615


def test_what_binds_first_follows_the_shape() -> None:
    short, staged, hour = (cap.limits(s) for s in (cap.SHAPES[0], cap.SHAPES[2], cap.SHAPES[3]))
    assert "unsent" in short.binds_first and short.jobs_per_s == 500
    assert staged.unsent_key == round(1000 / 6, 1)  # two index writes per stage
    assert staged.fifo_calls == 100  # 300 calls/s per action, three stages
    assert "read quota" in hour.binds_first  # heartbeat reads of a 16 KB record
    assert "new on-demand table" in hour.binds_first_new
    assert hour.lambda_mapping is None  # a one-hour stage never runs on Lambda
    assert cap.heartbeat_leases(8.0, 5.0, cap.DDB_NEW_TABLE_RCU) == 30_000


def test_the_script_prints_the_tables_docs_scale_quotes() -> None:
    out = subprocess.run(
        [sys.executable, "benchmarks/capacity.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    doc = (ROOT / "docs" / "scale.md").read_text()
    for line in out.splitlines():
        if line.startswith("| "):
            assert line in doc, f"docs/scale.md lacks this line of the model's output: {line}"
