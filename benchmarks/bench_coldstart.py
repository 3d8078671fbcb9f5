"""Benchmark 7: what a Lambda cold start pays to import the toolkit.

Each run is a fresh interpreter (as a cold start is), timed from its first statement:
the baseline imports ``boto3`` and ``pydantic`` and makes one client (what any
function of this kind pays), the contender imports ``sqs_lease.aws_lambda`` and makes
the same client. Runs alternate (baseline, contender, ...) after one warm-up run of
each, which writes the bytecode a deployed asset ships (issue 30). Reported: the
median wall and CPU time of each and their ratio (target: at most 1.25 x the
baseline), and the toolkit's own modules that cost most (``-X importtime``).
Timings are measured, never asserted.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

NAME = "coldstart"
TITLE = "7. Cold start: importing the Lambda adapter against boto3, pydantic and a client"

ROOT = Path(__file__).resolve().parent.parent

_TIMED = """
import json, time
t0, c0 = time.perf_counter(), time.process_time()
{imports}
import boto3
boto3.client("sqs", region_name="us-east-1")
print(json.dumps({{"wall": time.perf_counter() - t0, "cpu": time.process_time() - c0}}))
"""
BASELINE = "import boto3, pydantic"
# A function that uses pydantic pays for its models too (``import pydantic`` alone
# loads almost nothing): one model defined and validated.
MODELLED = (
    "import boto3, pydantic\n"
    "class Payload(pydantic.BaseModel):\n"
    "    invoice: str\n"
    "    amount: int\n"
    "Payload(invoice='i', amount=1)"
)
CONTENDER = "import sqs_lease.aws_lambda"


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        AWS_ACCESS_KEY_ID="bench",
        AWS_SECRET_ACCESS_KEY="bench",
        AWS_DEFAULT_REGION="us-east-1",
    )
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def _python(*args: str) -> subprocess.CompletedProcess[str]:
    """A fresh interpreter of this environment, run from the project's root."""
    return subprocess.run(
        [sys.executable, *args],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )


def _once(imports: str) -> dict[str, float]:
    out = _python("-c", _TIMED.format(imports=imports))
    got: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return got


def own_modules(top: int = 8, runs: int = 3) -> list[tuple[str, float, float]]:
    """The toolkit's modules by their own import time (ms, median of ``runs``), with
    their cumulative time."""
    seen: dict[str, list[tuple[float, float]]] = {}
    for _ in range(runs):
        out = _python("-X", "importtime", "-c", CONTENDER)
        for line in out.stderr.splitlines():
            if not line.startswith("import time:") or "|" not in line:
                continue
            own, cumulative, name = line.split(":", 1)[1].split("|")
            name = name.strip()
            if name.startswith("sqs_lease") and own.strip().isdigit():
                seen.setdefault(name, []).append((int(own) / 1000, int(cumulative) / 1000))
    rows = [
        (
            name,
            statistics.median(o for o, _ in times),
            statistics.median(c for _, c in times),
        )
        for name, times in seen.items()
    ]
    rows.sort(key=lambda r: -r[1])
    return rows[:top]


def run(quick: bool) -> dict[str, Any]:
    n = 3 if quick else 15
    _once(BASELINE)
    _once(CONTENDER)
    base: list[dict[str, float]] = []
    modelled: list[dict[str, float]] = []
    ours: list[dict[str, float]] = []
    for _ in range(n):
        base.append(_once(BASELINE))
        modelled.append(_once(MODELLED))
        ours.append(_once(CONTENDER))

    def median(rows: list[dict[str, float]], key: str) -> float:
        return statistics.median(r[key] for r in rows)

    figures = {
        who: {key: round(1000 * median(rows, key), 1) for key in ("wall", "cpu")}
        for who, rows in (("baseline", base), ("modelled", modelled), ("sqs_lease", ours))
    }
    m = figures["modelled"]
    return {
        "runs": n,
        "baseline": figures["baseline"],
        "modelled": m,
        "sqs_lease": figures["sqs_lease"],
        "modelled_ratio_cpu": round(m["cpu"] / figures["baseline"]["cpu"], 2),
        "ratio_cpu_vs_modelled": round(figures["sqs_lease"]["cpu"] / m["cpu"], 2),
        "ratio_wall": round(figures["sqs_lease"]["wall"] / figures["baseline"]["wall"], 2),
        "ratio_cpu": round(figures["sqs_lease"]["cpu"] / figures["baseline"]["cpu"], 2),
        "own_modules": own_modules(),
    }


def render(r: dict[str, Any]) -> str:
    b, s, m = r["baseline"], r["sqs_lease"], r["modelled"]
    lines = [
        f"Fresh interpreters, alternating, {r['runs']} runs each after one warm-up run "
        "of each (bytecode written, as the deployed asset ships it); median ms from the "
        "first statement to one boto3 client made. Target: at most 1.25 x the baseline.",
        "",
        "| what is imported | wall ms | CPU ms | x baseline (wall / CPU) |",
        "|---|---|---|---|",
        f"| `{BASELINE}` + a client | {b['wall']} | {b['cpu']} | 1.00 / 1.00 |",
        f"| the same, one pydantic model defined and validated | {m['wall']} | {m['cpu']} | "
        f"{m['wall'] / b['wall']:.2f} / {r['modelled_ratio_cpu']:.2f} |",
        f"| `{CONTENDER}` + a client | {s['wall']} | {s['cpu']} | "
        f"**{r['ratio_wall']:.2f} / {r['ratio_cpu']:.2f}** |",
        "",
        f"Against the function that uses a pydantic model: {r['ratio_cpu_vs_modelled']:.2f} x "
        "its CPU.",
        "",
        "The toolkit's modules that cost most (`-X importtime`, median of 3 runs, own ms / "
        "cumulative ms): "
        + ", ".join(f"`{n}` {own:.1f} / {cum:.1f}" for n, own, cum in r["own_modules"])
        + ".",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    result = run("--quick" in sys.argv)
    print(render(result))
