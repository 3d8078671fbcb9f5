"""Run the ECS worker locally, as ECS would, in one command:

    python examples/ecs/run_local.py

Starts the embedded emulator (moto, on 127.0.0.1), creates the tables and the
queue, submits a few tool calls, and starts the container's command
(``sqs-lease worker``, here ``python -m sqs_lease worker``) with the environment of
``task-definition.json`` (pointed at the emulator). Once the quick jobs are done
and the long export is running, it sends SIGTERM, as ECS does when it stops a
task, and reports: the exit code, every job's state (none left ``running``), and
the CloudWatch metrics the worker wrote (EMF lines on its stdout). Exits 0 when
the stop went as documented.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(ROOT))

from sqs_lease import Producer, Settings, create_queue, create_tables  # noqa: E402
from sqs_lease._aws import make_client  # noqa: E402
from sqs_lease._local import spawn_local_server, stop_local_server  # noqa: E402

HANG_GUARD = 120.0


def say(text: str) -> None:
    print(text, flush=True)


def task_environment() -> dict[str, str]:
    """The container's environment from the task definition."""
    task = json.loads((HERE / "task-definition.json").read_text())
    container = task["containerDefinitions"][0]
    return {e["name"]: e["value"] for e in container["environment"]}


def wait_for(what: str, check: Any) -> None:
    deadline = time.monotonic() + HANG_GUARD
    while not check():
        if time.monotonic() > deadline:
            raise SystemExit(f"gave up waiting for {what}")
        time.sleep(0.2)


def metrics_summary(stdout: str) -> dict[str, dict[str, float]]:
    """Each metric per dimension set over the EMF documents on stdout: counters and
    values summed, gauges at their worst."""
    sums: dict[str, dict[str, float]] = defaultdict(dict)
    for line in stdout.splitlines():
        if not line.startswith("{"):
            continue
        doc = json.loads(line)
        if "_aws" not in doc:
            continue  # the worker's final counters
        for directive in doc["_aws"]["CloudWatchMetrics"]:
            dims = ",".join(f"{k}={doc[k]}" for keys in directive["Dimensions"] for k in keys)
            for metric in directive["Metrics"]:
                name = metric["Name"]
                values = doc[name] if isinstance(doc[name], list) else [doc[name]]
                if name == "LastHeartbeatAge":  # a gauge: its largest value
                    sums[dims][f"max {name}"] = max(sums[dims].get(f"max {name}", 0.0), *values)
                elif name == "LeaseTimeLeft":  # a gauge: its smallest value
                    low = sums[dims].get(f"min {name}", float("inf"))
                    sums[dims][f"min {name}"] = min(low, *values)
                else:
                    sums[dims][name] = sums[dims].get(name, 0.0) + sum(values)
    return sums


def main() -> int:
    server, endpoint = spawn_local_server()
    work = Path(tempfile.mkdtemp(prefix="sqs-lease-ecs-"))
    try:
        env = task_environment()
        prefix = f"ecs{uuid.uuid4().hex[:6]}"
        env.update(
            {
                "SQS_LEASE_PREFIX": prefix,  # the task says "prod": not here
                "SQS_LEASE_METRICS_INTERVAL": "2",
                "AWS_ENDPOINT_URL": endpoint,
            }
        )
        settings = Settings(endpoint_url=endpoint, prefix=prefix)
        create_tables(settings)
        create_queue(settings)
        producer = Producer(settings)
        quick = [
            producer.submit("search", {"text": f"query {i}"}, job_id=f"search-{i}").job_id
            for i in range(3)
        ] + [
            producer.submit("summarize", {"text": f"doc {i} a b c"}, job_id=f"sum-{i}").job_id
            for i in range(2)
        ]
        export = producer.submit("export", {"report": "q3", "pages": 3000}, job_id="export").job_id
        say(f"emulator {endpoint}; submitted {len(quick)} quick jobs and one long export")

        ddb = make_client(settings, "dynamodb")

        def state(job_id: str) -> str:
            item = ddb.get_item(
                TableName=settings.jobs_table, Key={"job_id": {"S": job_id}}, ConsistentRead=True
            )["Item"]
            return str(item["state"]["S"])

        child_env = {k: v for k, v in os.environ.items() if not k.startswith("SQS_LEASE_")}
        child_env.update(env)
        child_env["PYTHONPATH"] = os.pathsep.join([str(HERE), str(ROOT)])
        out_path, err_path = work / "stdout", work / "stderr"
        with out_path.open("wb") as out, err_path.open("wb") as err:
            say("container command: sqs-lease worker (python -m sqs_lease worker), environment:")
            for name in sorted(env):
                say(f"  {name}={env[name]}")
            proc = subprocess.Popen(
                [sys.executable, "-m", "sqs_lease", "worker"],
                env=child_env,
                stdout=out,
                stderr=err,
            )
        try:
            wait_for("the quick jobs", lambda: all(state(j) == "succeeded" for j in quick))
            wait_for("the export to run", lambda: state(export) == "running")
            say("quick jobs done, export running: SIGTERM (ECS stops the task)")
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(timeout=HANG_GUARD)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        states = {j: state(j) for j in [*quick, export]}
        say(f"worker exit code {code} (0: stopped cleanly, every job decided)")
        for job_id, st in states.items():
            say(f"  {job_id:10} {st}")
        say("metrics (CloudWatch EMF on the worker's stdout, summed):")
        for dims, values in sorted(metrics_summary(out_path.read_text()).items()):
            shown = ", ".join(f"{k}={v:g}" for k, v in sorted(values.items()) if v)
            say(f"  {dims}: {shown}")
        say(f"journal (stderr): {err_path}")
        ok = (
            code == 0
            and "running" not in states.values()
            and states[export] == "queued"
            and all(states[j] == "succeeded" for j in quick)
        )
        say("ok" if ok else "NOT OK")
        return 0 if ok else 1
    finally:
        stop_local_server(server)


if __name__ == "__main__":
    raise SystemExit(main())
