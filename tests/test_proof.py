"""The proof from DESIGN.md: W1 is paused or partitioned mid-call, W2 takes over.

W1 must fail to extend, fail to commit, and cause no second irreversible effect
at the fenced receiver. Real worker processes, a real moto server over HTTP,
real SIGSTOP/SIGCONT, and a real TCP proxy for the partition. Each scenario is
also run with the commit's token condition removed, and its checks must then
report a violation (the checks bite).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse
from urllib.request import urlopen

import boto3
import pytest

from examples.receiver_service import create_ledger_table, serve
from infra.proxy import FaultProxy
from sqs_lease import Producer, Settings, create_queue, create_tables
from sqs_lease._schema.views import view_of
from sqs_lease.receiver import create_receiver_tables
from sqs_lease.testing import read_journal

pytestmark = [pytest.mark.integration, pytest.mark.fault]

HERE = Path(__file__).resolve().parent
Event = dict[str, Any]


class WorkerProc:
    """A real worker process whose journal (stderr) goes to a file we can read."""

    def __init__(
        self,
        name: str,
        endpoint: str,
        prefix: str,
        receiver: str,
        gates: Path,
        log_dir: Path,
        extra: dict[str, str] | None = None,
    ) -> None:
        self.name = name
        self.log = log_dir / f"{name}.log"
        env = {
            **os.environ,
            "AWS_ENDPOINT_URL": endpoint,
            "SQS_LEASE_PREFIX": prefix,
            "WORKER_NAME": name,
            "RECEIVER_URL": receiver,
            "GATE_DIR": str(gates),
            **(extra or {}),
        }
        self._fh = self.log.open("w")
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE / "fault_worker.py")],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=self._fh,
        )

    def events(self) -> list[Event]:
        return read_journal(self.log)

    def wait_for(self, pred: Callable[[Event], bool], what: str, timeout: float = 30) -> Event:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for ev in self.events():
                if pred(ev):
                    return ev
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        raise AssertionError(
            f"{self.name}: no {what} within {timeout}s; log:\n" + self.log.read_text()[-4000:]
        )

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self._fh.close()


W1_ENDS = ("result_rejected", "result_committed", "result_discarded")


def named(name: str, **fields: Any) -> Callable[[Event], bool]:
    return lambda ev: ev.get("event") == name and all(ev.get(k) == v for k, v in fields.items())


@dataclass
class Outcome:
    record: Any
    result: Any
    ledger: list[dict[str, Any]]
    w1: list[Event]
    w2: list[Event]


def violations(o: Outcome) -> list[str]:
    """Every rule the proof stands for, checked on what really happened."""
    bad: list[str] = []
    if o.record.state != "succeeded" or o.record.token != 2:
        bad.append(f"record is {o.record.state} token {o.record.token}, want succeeded token 2")
    if not o.result or o.result.get("by") != "W2":
        bad.append(f"stored result is from {o.result and o.result.get('by')}, want W2's")
    # W1's late result ends fenced: discarded by W1 itself (it knew it was told to
    # stop), or its commit rejected by DynamoDB (it did not know yet).
    late_end = ("result_rejected", "result_discarded")
    if not any(e.get("event") in late_end and e.get("token") == 1 for e in o.w1):
        bad.append("W1's late result was neither rejected nor discarded, and not journaled")
    if any(named("result_committed")(e) for e in o.w1):
        bad.append("W1 committed a result after losing its lease")
    keys = [r["idem_key"] for r in o.ledger]
    if len(keys) != len(set(keys)):
        bad.append(f"an effect was applied twice: {keys}")
    charges = [r for r in o.ledger if r["idem_key"].endswith(":charge")]
    if len(charges) != 1:
        bad.append(f"{len(charges)} charges applied, want exactly 1")
    if any(int(r["token"]) < 2 and r["idem_key"].endswith(":receipt") for r in o.ledger):
        bad.append("a receipt was applied with W1's superseded token")
    return bad


@pytest.fixture(params=["thread", "async"])
def proof_env(
    moto_endpoint: str, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[dict[str, Any]]:
    prefix = "p" + uuid.uuid4().hex[:10]
    settings = Settings(endpoint_url=moto_endpoint, prefix=prefix)
    create_tables(settings)
    create_queue(settings, visibility=4)
    create_receiver_tables(settings)
    create_ledger_table(settings, prefix)
    server, url = serve(
        settings, prefix, unsigned_fences=True
    )  # loopback test receiver, unsigned knowingly
    gates = tmp_path / "gates"
    gates.mkdir()
    procs: list[WorkerProc] = []
    yield {
        "settings": settings,
        "prefix": prefix,
        "receiver": url,
        "gates": gates,
        "tmp": tmp_path,
        "procs": procs,
        "endpoint": moto_endpoint,
        "shell": request.param,
    }
    for p in procs:
        p.stop()
    server.shutdown()


def _spawn(env: dict[str, Any], name: str, endpoint: str | None = None, **extra: str) -> WorkerProc:
    w = WorkerProc(
        name,
        endpoint or env["endpoint"],
        env["prefix"],
        env["receiver"],
        env["gates"],
        env["tmp"],
        {"SQS_LEASE_SHELL": env["shell"], **extra},
    )
    env["procs"].append(w)
    return w


def _open(env: dict[str, Any], gate: str) -> None:
    (env["gates"] / gate).touch()


def _outcome(env: dict[str, Any], job_id: str, w1: WorkerProc, w2: WorkerProc) -> Outcome:
    settings: Settings = env["settings"]
    ddb = boto3.client("dynamodb", endpoint_url=settings.endpoint_url, region_name="us-east-1")
    item = ddb.get_item(
        TableName=settings.jobs_table, Key={"job_id": {"S": job_id}}, ConsistentRead=True
    )["Item"]
    result = json.loads(item["result"]["S"]) if "result" in item else None
    with urlopen(env["receiver"] + "/ledger", timeout=10) as resp:
        ledger = json.loads(resp.read())["rows"]
    return Outcome(view_of(item), result, ledger, w1.events(), w2.events())


def _wait_record(env: dict[str, Any], job_id: str, state: str, timeout: float = 30) -> None:
    settings: Settings = env["settings"]
    ddb = boto3.client("dynamodb", endpoint_url=settings.endpoint_url, region_name="us-east-1")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        item = ddb.get_item(
            TableName=settings.jobs_table, Key={"job_id": {"S": job_id}}, ConsistentRead=True
        ).get("Item")
        if item and item["state"]["S"] == state:
            return
        time.sleep(0.1)
    raise AssertionError(f"job {job_id} did not reach {state} within {timeout}s")


def run_pause(env: dict[str, Any], mutation: str = "") -> Outcome:
    job = Producer(env["settings"]).submit(
        "charge", {"invoice": "inv-1", "amount": 100}, job_id="order-1"
    )
    mut = {"SQS_LEASE_MUTATION": mutation} if mutation else {}
    w1 = _spawn(env, "W1", GATE_BEFORE_STEP2="1", **mut)
    w1.wait_for(named("step_done", step="charge"), "charge step")
    w1.proc.send_signal(signal.SIGSTOP)  # W1 freezes holding token 1
    w2 = _spawn(env, "W2", GATE_BEFORE_RETURN="1", **mut)
    w2.wait_for(named("job_claimed", token=2), "W2's claim", timeout=30)
    w2.wait_for(named("step_done", step="receipt"), "W2's receipt step")
    # W2 is now running with token 2. W1 wakes up; its in-flight receipt request
    # arrives late and its handler returns a late success.
    w1.proc.send_signal(signal.SIGCONT)
    _open(env, "W1.step2")
    w1.wait_for(lambda e: e.get("event") in W1_ENDS, "W1's end")
    _open(env, "W2.return")
    w2.wait_for(
        lambda e: e.get("event") in ("result_committed", "result_rejected"), "W2's commit attempt"
    )
    for w in (w1, w2):
        w.proc.wait(30)
    return _outcome(env, job.job_id, w1, w2)


def run_partition(env: dict[str, Any], mutation: str = "") -> Outcome:
    job = Producer(env["settings"]).submit(
        "charge", {"invoice": "inv-9", "amount": 250}, job_id="order-9"
    )
    mut = {"SQS_LEASE_MUTATION": mutation} if mutation else {}
    upstream = urlparse(env["endpoint"])
    with FaultProxy(upstream.hostname or "127.0.0.1", upstream.port or 80) as proxy:
        w1 = _spawn(
            env, "W1", endpoint=proxy.url, GATE_BEFORE_STEP2="1", CHECK_WHILE_WAITING="1", **mut
        )
        w1.wait_for(named("step_done", step="charge"), "charge step")
        proxy.cut()  # W1 can no longer reach SQS or DynamoDB; the receiver still can
        w1.wait_for(named("ownership_unknown"), "ownership_unknown", timeout=20)
        w1.wait_for(named("irreversible_step_refused"), "refusal of the next step")
        w1.wait_for(named("lease_dropped", reason="lease_reserve_spent"), "heartbeat stop")
        w2 = _spawn(env, "W2", GATE_BEFORE_RETURN="1", **mut)
        w2.wait_for(named("job_claimed", token=2), "W2's claim", timeout=30)
        w2.wait_for(named("step_done", step="receipt"), "W2's receipt step")
        proxy.heal()
        _open(env, "W1.step2")
        w1.wait_for(lambda e: e.get("event") in W1_ENDS, "W1's end", timeout=30)
        _open(env, "W2.return")
        w2.wait_for(
            lambda e: e.get("event") in ("result_committed", "result_rejected"),
            "W2's commit attempt",
        )
        for w in (w1, w2):
            w.proc.wait(30)
    return _outcome(env, job.job_id, w1, w2)


def test_pause_w1_is_fenced_out(proof_env: dict[str, Any]) -> None:
    o = run_pause(proof_env)
    assert violations(o) == []
    # W1's late receipt met the receiver's high-water mark.
    late = [e for e in o.w1 if named("step_done", step="receipt")(e)]
    assert late and late[0]["status"] == 412
    # W1 learnt it had lost the lease (heartbeat or its own expired reserve).
    assert any(e["event"] in ("heartbeat_lost", "lease_dropped") for e in o.w1)
    assert len(o.ledger) == 2


def test_partition_w1_stops_and_is_fenced_out(proof_env: dict[str, Any]) -> None:
    o = run_partition(proof_env)
    assert violations(o) == []
    # W1 started no irreversible step while it could not confirm ownership.
    assert not any(named("step_done", step="receipt")(e) for e in o.w1)
    assert len(o.ledger) == 2
    # It stopped heartbeating at its conservative deadline, before W2 claimed.
    dropped = next(e for e in o.w1 if named("lease_dropped")(e))
    claimed = next(e for e in o.w2 if named("job_claimed", token=2)(e))
    assert dropped["ts"] <= claimed["ts"]


@pytest.mark.parametrize("scenario", [run_pause, run_partition], ids=["pause", "partition"])
def test_checks_bite_without_commit_token_condition(
    proof_env: dict[str, Any], scenario: Callable[..., Outcome]
) -> None:
    # Both guards of W1's late result go: the worker's own (a result returned after
    # a stop is discarded) and DynamoDB's (the commit's token condition).
    o = scenario(proof_env, mutation="no_commit_token,commit_after_stop")
    found = violations(o)
    assert any("W1" in v for v in found), found
