"""What both agent examples share: the emulator and the payment service, the agent's
session of tool calls, and the report that checks how it ended.

``run_local.py`` runs the session with a long-running worker, ``lambda_local.py``
with the Lambda adapter; the setting up and the checking are the same and live here.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import secrets
import sys
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent.parent
if str(ROOT) not in sys.path:  # run as a script: examples/ must be importable
    sys.path.insert(0, str(ROOT))

from examples.receiver_service import (  # noqa: E402
    FENCE_SECRET_ENV,
    create_ledger_table,
    ledger_table,
    serve,
)
from sqs_lease import Producer, Settings, create_queue, create_tables  # noqa: E402
from sqs_lease._aws import make_client  # noqa: E402
from sqs_lease._journal import LOGGER_NAME  # noqa: E402
from sqs_lease._local import spawn_local_server, stop_local_server  # noqa: E402
from sqs_lease.receiver import create_receiver_tables  # noqa: E402

TERMINAL = {"succeeded", "failed", "parked"}


def say(text: str) -> None:
    print(text, flush=True)


@dataclass(frozen=True)
class Session:
    """One agent session: where it runs and the jobs its tool calls became."""

    settings: Settings
    group: str
    job_ids: list[str]

    def expected_jobs(self) -> list[str]:
        """The submitted jobs (the ERP export is one job of three stages)."""
        return list(self.job_ids)


def options(argv: Sequence[str] | None, description: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument(
        "--endpoint-url",
        help="an emulator (or AWS endpoint) to use; default: start the embedded one",
    )
    parser.add_argument("--prefix", help="resource name prefix (default: a fresh one)")
    return parser.parse_args(argv)


@contextlib.contextmanager
def local_aws(args: argparse.Namespace, *, visibility: int = 30) -> Iterator[Settings]:
    """The emulator (started here unless ``--endpoint-url``), the tables, the queue
    (``visibility``: its visibility timeout) and the fenced payment service; the
    environment the handlers read is set for them."""
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    server = None
    endpoint = args.endpoint_url
    if endpoint is None:
        server, endpoint = spawn_local_server()
    receiver = None
    try:
        prefix = args.prefix or f"agent{uuid.uuid4().hex[:6]}"
        os.environ["AWS_ENDPOINT_URL"] = endpoint
        os.environ["SQS_LEASE_PREFIX"] = prefix
        settings = Settings.from_env()
        create_tables(settings)
        create_queue(settings, visibility=visibility)
        create_receiver_tables(settings)
        create_ledger_table(settings, prefix)
        # The fence secret the workers sign with, shared through the environment.
        secret = os.environ.setdefault(FENCE_SECRET_ENV, secrets.token_urlsafe(32))
        receiver, url = serve(settings, prefix, fence_secrets=[secret.encode()])
        os.environ["RECEIVER_URL"] = url
        say(f"emulator {endpoint}, prefix {prefix}; fenced payment service on {url}")
        yield settings
    finally:
        if receiver is not None:
            receiver.shutdown()
        if server is not None:
            stop_local_server(server)


def submit_session(settings: Settings) -> Session:
    """The tool calls an agent decided on, one job each, in one group (its session):
    a search that takes a moment and a browse that takes many leases, OCR, an ERP
    export in three stages (fetch, transform, upload), and the same invoice paid
    twice (the agent asked again after the first answer was lost)."""
    group = f"session-{uuid.uuid4().hex[:8]}"
    producer = Producer(settings)
    calls: list[tuple[str, str, dict[str, Any]]] = [
        ("search", "search", {"text": "quarterly revenue by region"}),
        ("ocr-1", "ocr", {"document": "invoice-7.pdf", "page": 1}),
        ("ocr-2", "ocr", {"document": "invoice-7.pdf", "page": 2}),
        # Many leases long: 12 page loads of 0.8 s under a 6 s lease.
        (
            "browse",
            "browse",
            {"url": "https://example.com/report", "steps": 12, "step_seconds": 0.8},
        ),
        ("export", "export", {"export_id": f"{group}-q3", "rows": 1200}),
        ("pay", "pay", {"invoice": f"{group}-INV-7", "amount": 4200, "lose_first_answer": True}),
        ("pay-again", "pay", {"invoice": f"{group}-INV-7", "amount": 4200}),
    ]
    ids = [
        producer.submit(cls, payload, job_id=f"{group}:{name}", group=group).job_id
        for name, cls, payload in calls
    ]
    say(f"agent session {group}: {len(ids)} tool calls submitted")
    return Session(settings, group, ids)


def job_states(session: Session) -> dict[str, dict[str, Any]]:
    """Each expected job's record (state, attempts, result), read consistently."""
    ddb = make_client(session.settings, "dynamodb")
    out: dict[str, dict[str, Any]] = {}
    for job_id in session.expected_jobs():
        item = ddb.get_item(
            TableName=session.settings.jobs_table,
            Key={"job_id": {"S": job_id}},
            ConsistentRead=True,
        ).get("Item")
        if item is None:
            continue
        result = item.get("result", {}).get("S")
        log = json.loads(item.get("stages", {}).get("S", "[]"))
        out[job_id] = {
            "class": item["job_class"]["S"],
            "state": item["state"]["S"],
            "attempt": int(item.get("attempt", {}).get("N", "0")),
            "result": json.loads(result) if result else None,
            # a staged job: (stage, token) of each committed stage, then the current one
            "stages": [(e["stage"], e["token"]) for e in log]
            + (
                [(item["stage"]["S"], int(item["token"]["N"]))]
                if "stage" in item and item["stage"].get("S")
                else []
            ),
        }
    return out


def all_done(session: Session) -> bool:
    states = job_states(session)
    return len(states) == len(session.expected_jobs()) and all(
        s["state"] in TERMINAL for s in states.values()
    )


def charges_for(session: Session, invoice: str) -> int:
    """Ledger rows (applied charges) of one invoice at the payment service."""
    ddb = make_client(session.settings, "dynamodb")
    rows = 0
    for page in ddb.get_paginator("scan").paginate(TableName=ledger_table(session.settings.prefix)):
        rows += sum(1 for item in page["Items"] if item.get("invoice", {}).get("S") == invoice)
    return rows


def report(session: Session, journal: Sequence[dict[str, Any]]) -> bool:
    """Print how every tool call ended; True when the session went as it must."""
    states = job_states(session)
    say("tool calls:")
    for job_id in session.expected_jobs():
        s = states.get(job_id)
        if s is None:
            say(f"  {job_id:40} (no record)")
            continue
        say(
            f"  {job_id:40} {s['class']:15} {s['state']:10} attempt {s['attempt']}  "
            f"{json.dumps(s['result'])}"
        )
    browse = f"{session.group}:browse"
    extended = sum(
        1 for e in journal if e.get("event") == "heartbeat_ok" and e.get("job_id") == browse
    )
    invoice = f"{session.group}-INV-7"
    charged = charges_for(session, invoice)
    pays = [states.get(f"{session.group}:pay"), states.get(f"{session.group}:pay-again")]
    charge_ids = {p["result"]["charge_id"] for p in pays if p and p["result"]}
    export = states.get(f"{session.group}:export") or {}
    stages = export.get("stages", [])
    say(
        "the ERP export's stages: "
        + " -> ".join(f"{name} (token {token})" for name, token in stages)
    )
    say(f"the browse call's lease was extended {extended} times while it ran")
    say(f"payment service: {charged} charge(s) for {invoice}, charge ids {sorted(charge_ids)}")
    ok = (
        len(states) == len(session.expected_jobs())
        and all(s["state"] == "succeeded" for s in states.values())
        and charged == 1
        and len(charge_ids) == 1
        and extended > 0
        and [name for name, _ in stages] == ["fetch", "transform", "upload"]
    )
    say("ok" if ok else "NOT OK")
    return ok


@contextlib.contextmanager
def journal_events() -> Iterator[list[dict[str, Any]]]:
    """Every journal event written meanwhile (the ``sqs_lease.journal`` logger's JSON
    lines: ids, tokens, outcomes; never payloads), whoever made the journal."""
    events: list[dict[str, Any]] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            with contextlib.suppress(ValueError):
                events.append(json.loads(record.getMessage()))

    logger = logging.getLogger(LOGGER_NAME)
    handler, level = Collect(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield events
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
