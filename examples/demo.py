"""`make demo`: the main job on the embedded emulator, with a takeover on purpose.

Starts a moto server on 127.0.0.1 (its own process), creates the queue and
tables, starts the fenced payment receiver, submits a mixed workload (three
job classes with different leases), runs two worker processes, freezes one of
them (SIGSTOP) in the middle of a payment call so the other takes over, thaws
it, then runs a tool with a fleet-wide limit (a browser pool of two shared by
both workers) and an agent session that is cancelled as a whole, and prints a
summary and the timeline of a job that was taken over (``sqs-lease jobs
timeline``). Exits non-zero if any effect was duplicated, any job was lost, no
takeover happened, the browser limit was exceeded or the session was not
cancelled.
"""

from __future__ import annotations

import collections
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from urllib.request import urlopen

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import boto3  # noqa: E402

from examples.receiver_service import FENCE_SECRET_ENV, create_ledger_table, serve  # noqa: E402
from sqs_lease import (  # noqa: E402
    GroupCancelled,
    Producer,
    Settings,
    create_queue,
    create_tables,
)
from sqs_lease._core.stages import stage_rows  # noqa: E402
from sqs_lease._local import spawn_local_server, stop_local_server  # noqa: E402
from sqs_lease._schema.views import view_of  # noqa: E402
from sqs_lease.receiver import create_receiver_tables  # noqa: E402
from sqs_lease.testing import read_journal  # noqa: E402

PREFIX = "demo"
WORK = ROOT / ".demo"
TERMINAL = {"succeeded", "failed", "cancelled", "parked"}
HANG_GUARD = 300.0  # every wait's bound: a hang guard for a busy machine, never a speed check


def say(text: str) -> None:
    print(text, flush=True)


def events(path: Path) -> list[dict[str, Any]]:
    return read_journal(path)


def _in_hand(log: Path) -> tuple[int, int]:
    """(jobs held, tool calls in flight) by a worker, read from its journal."""
    evs = events(log)
    kinds = collections.Counter(e["event"] for e in evs)
    ended = sum(
        kinds[k]
        for k in (
            "result_committed",
            "job_failed",
            "job_retry_scheduled",
            "job_abandoned",
            "job_parked",
            "job_released",
            "job_waiting_for_slot",
        )
    )
    return kinds["job_claimed"] - ended, kinds["tool_request_started"] - kinds[
        "tool_request_finished"
    ]


def freeze_mid_call(victim: subprocess.Popen[bytes], log: Path, tries: int = 20) -> int:
    """SIGSTOP ``victim`` while it is inside a tool call (a short-lease job: payment or
    ERP); returns how many jobs it held. A busy machine can let the call end between a
    look and the signal: then it is thawed and tried again (bounded)."""
    held = 0
    for _ in range(tries):
        deadline = time.monotonic() + HANG_GUARD
        while time.monotonic() < deadline:
            held, in_call = _in_hand(log)
            if held >= 1 and in_call >= 1:
                break
            time.sleep(0.02)
        victim.send_signal(signal.SIGSTOP)
        held, in_call = _in_hand(log)
        if held >= 1 and in_call >= 1:
            return held
        victim.send_signal(signal.SIGCONT)
    victim.send_signal(signal.SIGSTOP)
    return held


def start_worker(name: str, endpoint: str, receiver: str) -> tuple[subprocess.Popen[bytes], Path]:
    log = WORK / f"{name}.journal.jsonl"
    env = {**os.environ, "RECEIVER_URL": receiver, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sqs_lease.cli",
            "--endpoint-url",
            endpoint,
            "--prefix",
            PREFIX,
            "worker",
            "examples.demo_app:app",
            "--concurrency",
            "4",
            "--receive-wait",
            "1",
            "--worker-id",
            name,
            "--shutdown-grace",
            "10",
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=log.open("w"),
    )
    return proc, log


def scan_states(settings: Settings) -> dict[str, dict[str, Any]]:
    ddb = boto3.client("dynamodb", endpoint_url=settings.endpoint_url, region_name=settings.region)
    rows: dict[str, dict[str, Any]] = {}
    for page in ddb.get_paginator("scan").paginate(TableName=settings.jobs_table):
        for item in page["Items"]:
            if "state" not in item:  # a worker's liveness item, not a job
                continue
            rows[item["job_id"]["S"]] = {
                "state": item["state"]["S"],
                "class": item["job_class"]["S"],
                "token": int(item["token"]["N"]),
                "reason": item.get("reason", {}).get("S"),
            }
    return rows


def staged_jobs(settings: Settings) -> dict[str, list[str]]:
    """Each staged job's stages as ``jobs show`` lists them: ``stage (state, token)``."""
    ddb = boto3.client("dynamodb", endpoint_url=settings.endpoint_url, region_name=settings.region)
    out: dict[str, list[str]] = {}
    for page in ddb.get_paginator("scan").paginate(TableName=settings.jobs_table):
        for item in page["Items"]:
            if "state" not in item:  # a worker's liveness item, not a job
                continue
            view = view_of(item)
            if view.stage is not None:
                out[view.job_id] = [
                    f"{r['stage']} ({r['state']}, token {r['token']})" for r in stage_rows(view)
                ]
    return dict(sorted(out.items()))


def workload() -> list[tuple[str, dict[str, Any], str]]:
    jobs: list[tuple[str, dict[str, Any], str]] = []
    for i in range(1, 26):
        jobs.append(("ocr", {"document": "contract-17", "page": i}, f"ocr-contract-17-p{i}"))
    for i in range(1, 19):
        jobs.append(
            (
                "export",
                {"report": f"ledger-{i}", "rows": 500 * (1 + i % 4), "flaky": i % 6 == 0},
                f"export-ledger-{i}",
            )
        )
    for i in range(1, 16):
        jobs.append(
            (
                "charge",
                {
                    "invoice": f"INV-{1000 + i}",
                    "amount": 100 + 7 * i,
                    "lose_response": i in (4, 11),
                },
                f"charge-INV-{1000 + i}",
            )
        )
    for i in range(1, 3):
        jobs.append(
            ("report_export", {"report": f"quarterly-{i}", "months": 3 * i}, f"report-export-{i}")
        )
    for i in range(1, 5):
        jobs.append(
            (
                "erp_post",
                {"invoice": f"INV-{1000 + i}", "account": "4400", "timeout_first": i == 3},
                f"erp-INV-{1000 + i}",
            )
        )
    return jobs


def cli(endpoint: str, *args: str) -> str:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "sqs_lease.cli",
            "--endpoint-url",
            endpoint,
            "--prefix",
            PREFIX,
            *args,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return out.stdout


def most_at_once(journal: list[dict[str, Any]], opened: str, closed: str) -> int:
    """The most attempts between ``opened`` and ``closed`` at one moment (journal times)."""
    marks = sorted(
        (e["ts"], 1 if e["event"] == opened else -1)
        for e in journal
        if e["event"] in (opened, closed)
    )
    running = most = 0
    for _, step in marks:  # at equal times a close sorts first (-1 < 1)
        running += step
        most = max(most, running)
    return most


def limited_and_session(producer: Producer, endpoint: str, logs: list[Path]) -> dict[str, Any]:
    """Steps 7-8: a tool with a fleet-wide limit, and an agent session cancelled whole."""
    browse = [(f"browse-page-{i}", {"page": i, "seconds": 0.8}) for i in range(1, 9)]
    for job_id, payload in browse:
        producer.submit("browse", payload, job_id=job_id)
    steps = [f"agent-7-step-{i}" for i in range(1, 5)]
    for i, job_id in enumerate(steps, 1):
        producer.submit("agent_step", {"step": i}, job_id=job_id, group="agent-session-7")
    say(
        f"7. submitted {len(browse)} browse jobs (class limit: 2 browsers for the whole fleet) "
        f"and an agent session of {len(steps)} steps (group agent-session-7)"
    )
    deadline = time.monotonic() + HANG_GUARD
    while time.monotonic() < deadline:
        started = {
            e.get("job_id")
            for log in logs
            for e in events(log)
            if e["event"] == "agent_step_started"
        }
        if sum(1 for s in steps if s in started) >= 2:
            break
        time.sleep(0.1)
    out = cli(
        endpoint,
        "jobs",
        "cancel",
        "--group",
        "agent-session-7",
        "--reason",
        "the user closed the chat",
        "--json",
    )
    report: dict[str, Any] = json.loads(out)
    say(
        f"8. operator: sqs-lease jobs cancel --group agent-session-7: "
        f"{len(report['cancelled'])} cancelled, {len(report['finished'])} already finished; "
        "their owners lose their leases at the next heartbeat"
    )
    try:
        producer.submit("agent_step", {"step": 5}, job_id="agent-7-step-5", group="agent-session-7")
        refused = ""
    except GroupCancelled as exc:
        refused = str(exc)
        say(f"   a new step for the session is refused: {refused[:90]}...")
    return {"browse": [j for j, _ in browse], "steps": steps, "report": report, "refused": refused}


def resolve_confirmed(endpoint: str, key: str, external_id: str, reason: str) -> None:
    """The operator's `intents resolve KEY --confirmed` (the job resumes, replaying it)."""
    cli(
        endpoint,
        "intents",
        "resolve",
        key,
        "--confirmed",
        external_id,
        "--reason",
        reason,
        "--who",
        "demo-operator",
    )


def wait_states(settings: Settings, n: int, done: set[str], limit: float) -> dict[str, Any]:
    deadline = time.monotonic() + limit
    states: dict[str, dict[str, Any]] = {}
    while time.monotonic() < deadline:
        states = scan_states(settings)
        if len(states) == n and all(s["state"] in done for s in states.values()):
            break
        time.sleep(0.5)
    return states


def scan_intents(settings: Settings) -> list[dict[str, Any]]:
    ddb = boto3.client("dynamodb", endpoint_url=settings.endpoint_url, region_name=settings.region)
    out = []
    for page in ddb.get_paginator("scan").paginate(TableName=settings.intents_table):
        for item in page["Items"]:
            out.append(
                {
                    "state": item["state"]["S"],
                    "reconciled": item.get("reconciled", {}).get("BOOL", False),
                    "resolution": item.get("resolution", {}).get("S"),
                }
            )
    return out


def main() -> int:
    WORK.mkdir(exist_ok=True)
    for old in WORK.glob("*.jsonl"):
        old.unlink()
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    server, endpoint = spawn_local_server()
    say(f"1. embedded AWS emulator (moto) on {endpoint}")
    workers: list[tuple[subprocess.Popen[bytes], Path]] = []
    receiver = None
    try:
        settings = Settings(endpoint_url=endpoint, prefix=PREFIX)
        create_tables(settings)
        create_queue(settings, visibility=6)
        create_receiver_tables(settings)
        create_ledger_table(settings, PREFIX)
        # The fence secret the workers sign with and the receiver verifies: shared
        # through the environment the workers inherit (docs/security.md).
        secret = os.environ.setdefault(FENCE_SECRET_ENV, secrets.token_urlsafe(32))
        receiver, receiver_url = serve(settings, PREFIX, fence_secrets=[secret.encode()])
        say(f"2. queue, DLQ and tables created; fenced payment receiver on {receiver_url}")

        from examples.demo_app import app

        producer = Producer(settings, app)
        jobs = workload()
        for job_class, payload, job_id in jobs:
            producer.submit(job_class, payload, job_id=job_id)
        again = producer.submit(*jobs[0][:2], job_id=jobs[0][2])
        counts = collections.Counter(c for c, _, _ in jobs)
        say(f"3. submitted {len(jobs)} jobs ({dict(counts)})")
        say(f"   resubmitting one: {again.note}")

        workers = [start_worker(n, endpoint, receiver_url) for n in ("worker-A", "worker-B")]
        say("4. two worker processes started (4 slots each)")
        victim, victim_log = workers[0]
        frozen = freeze_mid_call(victim, victim_log)
        say(f"5. worker-A frozen (SIGSTOP) in the middle of a payment call, holding ~{frozen} jobs")
        time.sleep(9)  # longer than every lease: worker-B must take the held jobs over
        victim.send_signal(signal.SIGCONT)
        say("6. worker-A thawed (SIGCONT) after 9 s; its late results meet the fence")
        extra = limited_and_session(producer, endpoint, [log for _, log in workers])
        n_jobs = len(jobs) + len(extra["browse"]) + len(extra["steps"])

        states = wait_states(settings, n_jobs, TERMINAL, HANG_GUARD)
        parked = sorted(k for k, v in states.items() if v["state"] == "parked")
        say(f"9. every job is terminal or parked; parked for an operator: {parked}")
        listing = cli(endpoint, "intents", "list", "--state", "ambiguous", "--json")
        ambiguous = [json.loads(line) for line in listing.splitlines() if line.strip()]
        for intent in ambiguous:
            key = intent["intent_key"]
            say(f"   operator: intent {key} is ambiguous ({intent.get('reason')})")
            say("   operator: checked the ERP by hand; it did post: resolving as confirmed")
            resolve_confirmed(
                endpoint, key, f"erp-manual-{key[-4:]}", "posting found in the ERP's screen"
            )
        # A call that applied after its job was parked ambiguous (a frozen worker's late
        # answer) confirms the intent (confirmed_late): the operator's resolve resumes
        # the parked job, which replays the known outcome (docs/operations.md).
        late = 0
        for job_id in parked:
            reason = str(states[job_id].get("reason") or "")
            if not reason.startswith("intent '"):
                continue
            key = reason.split("'")[1]
            shown = json.loads(cli(endpoint, "intents", "show", key, "--json"))["intent"]
            if shown.get("state") != "confirmed" or not shown.get("confirmed_late"):
                continue
            late += 1
            say(f"   operator: intent {key} of parked {job_id} was confirmed by a late answer")
            resolve_confirmed(
                endpoint, key, "late-answer", "the frozen worker's call applied after the park"
            )
        states = wait_states(settings, n_jobs, TERMINAL - {"parked"}, HANG_GUARD)
        say(
            f"10. {len(ambiguous)} ambiguous intent(s) and {late} confirmed late resolved "
            "with the CLI; jobs resumed"
        )
        for proc, _ in workers:
            proc.send_signal(signal.SIGTERM)
        for proc, _ in workers:
            proc.wait(30)
        say("11. all jobs terminal; workers stopped with SIGTERM")

        journal = [e for _, log in workers for e in events(log)]
        with urlopen(receiver_url + "/ledger", timeout=10) as resp:
            ledger = json.loads(resp.read())["rows"]
        by_invoice = collections.Counter(r["invoice"] for r in ledger)
        duplicates = sum(n - 1 for n in by_invoice.values() if n > 1)
        takeovers = sum(1 for e in journal if e["event"] == "job_reclaimed")
        rejected = sum(1 for e in journal if e["event"] == "result_rejected")
        lost = n_jobs - sum(1 for s in states.values() if s["state"] in TERMINAL)
        by_state = collections.Counter(s["state"] for s in states.values())
        failed = {
            k: v["reason"]
            for k, v in states.items()
            if v["state"] == "failed" and k not in extra["steps"]
        }
        browsers = most_at_once(journal, "browser_opened", "browser_closed")
        browsed = sum(1 for j in extra["browse"] if states.get(j, {}).get("state") == "succeeded")
        waited = sum(1 for e in journal if e["event"] == "job_waiting_for_slot")
        session = {j: states.get(j, {}) for j in extra["steps"]}
        session_cancelled = sum(1 for s in session.values() if s.get("state") == "cancelled")
        session_lost = {
            e["job_id"]
            for e in journal
            if e["event"] == "heartbeat_lost" and e.get("cancelled") and e["job_id"] in session
        }
        intents = scan_intents(settings)
        intent_states = collections.Counter(i["state"] for i in intents)
        reconciled = sum(1 for i in intents if i["reconciled"])
        resolved = sum(1 for i in intents if i["resolution"])

        say("")
        say("summary")
        say(f"  jobs by state:          {dict(sorted(by_state.items()))}")
        for job_id, reason in sorted(failed.items()):
            say(f"    failed {job_id}: {reason}")
        say(f"  takeovers:              {takeovers}")
        say(f"  rejected results:       {rejected}")
        say(
            f"  retries scheduled:      "
            f"{sum(1 for e in journal if e['event'] == 'job_retry_scheduled')}"
        )
        say(f"  intents by state:       {dict(sorted(intent_states.items()))}")
        say(f"  intents reconciled:     {reconciled} (outcome unknown, confirmed by the target)")
        say(f"  intents resolved:       {resolved} (ambiguous, decided by an operator)")
        say(f"  effects at receiver:    {len(ledger)} charges for {len(by_invoice)} invoices")
        say(f"  duplicated effects:     {duplicates}")
        say(f"  jobs lost:              {lost}")
        say(
            f"  browse (limit 2):       {browsed} of {len(extra['browse'])} done, at most "
            f"{browsers} browsers open at once across both workers; {waited} waits for a slot "
            "(no attempt spent)"
        )
        say(
            f"  session agent-session-7: {session_cancelled} of {len(session)} steps cancelled "
            f"({len(session_lost)} running ones lost their leases at a heartbeat); "
            f"a new submit to it refused: {bool(extra['refused'])}"
        )
        staged = staged_jobs(settings)
        for job_id, stages in staged.items():
            say(f"  staged {job_id}: {' -> '.join(stages)}")
        say(f"  journals:               {WORK}/worker-*.journal.jsonl")
        ok = (
            duplicates == 0
            and lost == 0
            and takeovers >= 1
            and reconciled >= 1
            and resolved >= 1
            and by_state.get("parked", 0) == 0
            and browsed == len(extra["browse"])
            and browsers <= 2
            and session_cancelled == len(session)
            and bool(extra["refused"])
            and all(len(s) == 3 and "succeeded" in s[-1] for s in staged.values())
        )
        # A job another worker took over; one whose late commit was refused first.
        refused = {e["job_id"] for e in journal if e["event"] == "result_rejected"}
        taken = sorted(
            {
                e["job_id"]
                for e in journal
                if e["event"] == "job_reclaimed" and e.get("previous_owner") != e.get("worker")
            },
            key=lambda job_id: (job_id not in refused, job_id),
        )
        if taken:
            page = WORK / "timeline.html"
            logs = [arg for _, log in workers for arg in ("--journal", str(log))]
            say("")
            say(f"timeline of {taken[0]}, a job taken over (page: {page})")
            say(cli(endpoint, "jobs", "timeline", taken[0], "--html", str(page), *logs).rstrip())
        say("demo: OK" if ok else "demo: FAILED")
        return 0 if ok else 1
    finally:
        for proc, _ in workers:
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.kill()
        if receiver is not None:
            receiver.shutdown()
        stop_local_server(server)


if __name__ == "__main__":
    raise SystemExit(main())
