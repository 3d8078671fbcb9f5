"""A job's timeline (issue 13 item 4): ownership events kept on the record by the
writes that make them, read back with tokens, drawn in the terminal and as a page."""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import TYPE_CHECKING, Any

from click.testing import CliRunner
from conftest import AwsTestEnv
from pydantic import BaseModel
from worker_helpers import (
    FAST,
    collect_journal,
    hold_heartbeat,
    prepare,
    read_item,
    running,
    wait_until,
)

from sqs_lease import App, JobContext, Producer, Worker
from sqs_lease._core.limits import TIMELINE_ROOM
from sqs_lease._core.timeline import (
    EVENT_BYTES,
    TIMELINE_LIMIT,
    IntentAttemptFacts,
    IntentFacts,
    TimelineEvent,
    TimelineKind,
    attributed,
    decode,
    from_intents,
    from_journal,
    merged,
    trim_count,
    with_tokens,
)
from sqs_lease.cli import cli
from sqs_lease.testing import SHORT_LEASE, Faults, FencedTarget, LeaseEnv

if TYPE_CHECKING:
    from types_boto3_dynamodb import DynamoDBClient

K = TimelineKind


class Work(BaseModel):
    n: int


# --------------------------------------------------------------------------- pure


def test_claims_are_numbered_backwards_from_the_records_token() -> None:
    events = [
        TimelineEvent(K.SUBMITTED, 1.0),
        TimelineEvent(K.CLAIMED, 2.0, owner="w1"),
        TimelineEvent(K.CLAIMED, 3.0, owner="w2"),
        TimelineEvent(K.COMMITTED, 4.0, owner="w2", token=2),
        TimelineEvent(K.REFUSED, 5.0, owner="w1", token=1, stage="commit"),
    ]
    tokens = [ev.token for ev in with_tokens(events, current_token=2)]
    assert tokens == [0, 1, 2, 2, 1]


def test_a_stored_event_survives_encoding_and_an_unknown_kind_is_skipped() -> None:
    ev = TimelineEvent(K.RETRY, 12.5, owner="w", token=3, detail="x" * 500)
    back = decode(ev.encode())
    assert back is not None and (back.kind, back.owner, back.token) == (K.RETRY, "w", 3)
    assert back.detail is not None and len(back.detail) == 120
    assert decode('{"k":"from_the_future","at":1}') is None


def test_the_longest_event_fits_the_room_the_record_keeps_for_the_timeline() -> None:
    widest = TimelineEvent(
        K.REFUSED, 1e12, owner="ü" * 500, token=10**15, detail="€" * 500, stage="ß" * 500
    )
    assert len(widest.encode().encode("utf-8")) <= EVENT_BYTES
    assert TIMELINE_LIMIT * EVENT_BYTES <= TIMELINE_ROOM


def test_the_timeline_is_trimmed_only_once_it_reaches_its_limit() -> None:
    assert trim_count(TIMELINE_LIMIT - 1) == 0
    assert trim_count(TIMELINE_LIMIT) > 0
    assert TIMELINE_LIMIT - trim_count(TIMELINE_LIMIT) < TIMELINE_LIMIT


def test_journal_events_fall_between_record_events_by_time_without_reordering_the_record() -> None:
    # The record's order is DynamoDB's; its writers' clocks may disagree (w3's is late).
    record = [
        TimelineEvent(K.CLAIMED, 10.0, "w1"),
        TimelineEvent(K.CLAIMED, 20.0, "w2"),
        TimelineEvent(K.CLAIMED, 15.0, "w3"),
        TimelineEvent(K.COMMITTED, 30.0, "w3", 3),
    ]
    journal = from_journal(
        "j",
        [
            {"event": "heartbeat_lost", "job_id": "j", "ts": 25.0, "worker": "w1", "token": 1},
            {"event": "heartbeat_lost", "job_id": "other", "ts": 9.5, "worker": "w1"},
            {"event": "heartbeat_ok", "job_id": "j", "ts": 9.5, "worker": "w1"},
        ],
    )
    out = merged(record, journal)
    assert [(e.kind, e.owner) for e in out] == [
        (K.CLAIMED, "w1"),
        (K.CLAIMED, "w2"),
        (K.CLAIMED, "w3"),
        (K.LEASE_LOST, "w1"),
        (K.COMMITTED, "w3"),
    ]
    assert out[3].token == 1 and out[3].source == "journal"


# --------------------------------------------------------------------------- on moto


def _taken_over(aws: AwsTestEnv, tmp_path: Path) -> tuple[Any, str, str, str, Path]:
    """W1 claims and is paused; W2 takes over and commits; W1's late commit is refused."""
    settings, _, _ = prepare(aws.endpoint_url, aws.prefix)
    app = App()
    release = threading.Event()

    @app.job("slow", payload=Work, **FAST)
    def slow(ctx: JobContext[Any], p: Work) -> dict[str, int]:
        if ctx.token == 1:
            release.wait(300)  # released by the test; a hang guard, not a timing
        return {"token": ctx.token}

    job_id = Producer(settings, app).submit("slow", Work(n=1), job_id=f"{aws.prefix}-t").job_id
    w1 = Worker(app, settings, worker_id="W1", receive_wait=1, concurrency=1)
    w2 = Worker(app, settings, worker_id="W2", receive_wait=1)
    paused = threading.Event()
    hold_heartbeat(w1, paused)
    with collect_journal() as journal, running(w1):
        journal.wait_for("job_claimed", job_id=job_id, worker="W1")
        paused.set()
        with running(w2):
            journal.wait_for("result_committed", job_id=job_id, worker="W2", timeout=120)
        # W1's handler returns while its heartbeat is still held, so its commit goes
        # out (fenced, refused). Were the heartbeat let go first, its next round could
        # drop the lapsed lease before the handler returned, and the result would be
        # discarded unwritten (`result_discarded`): right too, but not this timeline.
        release.set()
        journal.wait_for("rejected_result_kept", job_id=job_id, worker="W1", timeout=120)
        paused.clear()
        wait_until(
            lambda: bool(journal.events("heartbeat_lost", job_id=job_id, worker="W1")),
            60,
            "W1 journals its loss",
        )
    log = tmp_path / "w1.journal.jsonl"
    lines = [{k: v for k, v in e.items() if k != "_mono"} for e in journal.events(worker="W1")]
    log.write_text("".join(json.dumps(e) + "\n" for e in lines))
    return settings, job_id, "W1", "W2", log


def test_the_timeline_of_a_job_taken_over_shows_both_owners_tokens_and_the_refused_commit(
    aws: AwsTestEnv, ddb_client: DynamoDBClient, tmp_path: Path
) -> None:
    settings, job_id, w1, w2, log = _taken_over(aws, tmp_path)
    item = read_item(ddb_client, settings, job_id)
    assert item is not None
    page = tmp_path / "timeline.html"
    base = ["--endpoint-url", aws.endpoint_url, "--prefix", aws.prefix, "jobs", "timeline"]
    got = CliRunner().invoke(cli, [*base, job_id, "--json"])
    assert got.exit_code == 0, got.output
    events = [(e["kind"], e["owner"], e["token"]) for e in json.loads(got.stdout)["events"]]
    assert events == [
        ("submitted", None, 0),
        ("claimed", w1, 1),
        ("claimed", w2, 2),
        ("committed", w2, 2),
        ("refused", w1, 1),
    ]
    text = CliRunner().invoke(cli, [*base, job_id, "--html", str(page)])
    assert text.exit_code == 0, text.output
    lines = text.stdout.splitlines()
    assert w1 in lines[1] and w2 in lines[1]  # owners are the lanes
    order = [i for i, line in enumerate(lines) for word in ("claimed", "REFUSED") if word in line]
    assert len(order) == 3 and order == sorted(order)
    assert "took over from W1" in text.stdout and "REFUSED commit" in text.stdout
    # The page: well-formed, self-contained, and the same events in the same order.
    html = page.read_text(encoding="utf-8")
    root = ET.fromstring(html.split("\n", 1)[1])  # past the doctype: XML-parseable markup
    assert "http" not in html.replace('xmlns="http://www.w3.org/2000/svg"', "")
    assert root.find(".//script") is None
    ns = "{http://www.w3.org/2000/svg}"
    drawn = [
        (g.get("data-kind"), g.get("data-owner"), int(g.get("data-token") or 0))
        for g in root.iter(f"{ns}g")
        if g.get("class") == "event"
    ]
    assert drawn == [(k, o or "(record)", t) for k, o, t in events]
    rows = [tr.get("data-kind") for tr in root.iter("tr") if tr.get("data-kind")]
    assert rows == [k for k, _, _ in events]
    # A worker's journal adds what the record cannot hold: W1's lost lease.
    merged_out = CliRunner().invoke(cli, [*base, job_id, "--journal", str(log), "--json"])
    kinds = [(e["kind"], e["owner"]) for e in json.loads(merged_out.stdout)["events"]]
    assert ("lease_lost", w1) in kinds
    assert kinds.index(("lease_lost", w1)) > kinds.index(("claimed", w1))
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser:
        dumped = subprocess.run(
            [browser, "--headless", "--disable-gpu", "--dump-dom", page.as_uri()],
            capture_output=True,
            text=True,
            timeout=300,  # a hang guard: a loaded machine starts Chromium slowly
        ).stdout
        assert dumped.count('class="event"') == len(events)


def test_a_claim_on_a_full_timeline_trims_the_oldest_events_in_one_fenced_write(
    aws: AwsTestEnv, ddb_client: DynamoDBClient
) -> None:
    settings, _, _ = prepare(aws.endpoint_url, aws.prefix)
    app = App()

    @app.job("quick", payload=Work, **FAST)
    def quick(ctx: JobContext[Any], p: Work) -> dict[str, int]:
        return {"n": p.n}

    job_id = Producer(settings, app).submit("quick", Work(n=1), job_id=f"{aws.prefix}-f").job_id
    filler = [{"S": json.dumps({"k": "retry", "at": 1.0 + i})} for i in range(TIMELINE_LIMIT)]
    ddb_client.update_item(
        TableName=settings.jobs_table,
        Key={"job_id": {"S": job_id}},
        UpdateExpression="SET #t = :t",
        ExpressionAttributeNames={"#t": "timeline"},
        ExpressionAttributeValues={":t": {"L": filler}},
    )
    with collect_journal() as journal, running(Worker(app, settings, receive_wait=1)):
        journal.wait_for("result_committed", job_id=job_id, timeout=20)
    item = read_item(ddb_client, settings, job_id)
    assert item is not None
    kept = [json.loads(v["S"]) for v in item["timeline"]["L"]]
    assert len(kept) == TIMELINE_LIMIT + 2 - trim_count(TIMELINE_LIMIT + 1)
    assert len(kept) < TIMELINE_LIMIT
    assert [e["k"] for e in kept[-2:]] == ["claimed", "committed"]
    assert kept[0]["at"] == 1.0 + trim_count(TIMELINE_LIMIT + 1)  # the oldest went


# --------------------------------------------------------------------------- intents


def _attempt(
    n: int, job: str, token: int, worker: str, t0: float, t1: float | None, out: str
) -> IntentAttemptFacts:
    return IntentAttemptFacts(n, job, token, worker, t0, t1, out)


def test_intent_transitions_name_key_and_tool_and_fall_in_the_owners_lane() -> None:
    pay = IntentFacts(
        key="j:main:capture:psp",
        target="psp",
        action="capture",
        state="confirmed",
        created_at=11.0,
        updated_at=40.0,
        confirmed_at=35.0,
        reconciled=True,
        attempts=(
            _attempt(1, "j", 1, "w1", 12.0, 13.0, "confirmed_by_check"),
            _attempt(2, "other", 1, "w9", 12.5, 12.6, "ok"),  # another job's, shared key
        ),
    )
    mail = IntentFacts(
        "j:main:send:mail",
        "mail",
        "send",
        "ambiguous",
        36.0,
        38.0,
        attempts=(_attempt(1, "j", 2, "w2", 36.5, 37.0, "unknown"),),
    )
    record = [
        TimelineEvent(K.CLAIMED, 10.0, "w1", 1),
        TimelineEvent(K.CLAIMED, 30.0, "w2", 2),
        TimelineEvent(K.PARKED, 39.0, "w2", 2),
    ]
    out = attributed(merged(record, from_intents("j", [pay, mail])))
    assert [(e.kind.value, e.owner, e.token) for e in out] == [
        ("claimed", "w1", 1),
        ("intent_prepared", "w1", 1),
        ("intent_started", "w1", 1),
        ("claimed", "w2", 2),
        ("intent_reconciled", "w2", 2),  # when the check answered, by the owner then
        ("intent_prepared", "w2", 2),
        ("intent_started", "w2", 2),
        ("intent_unknown", "w2", 2),
        ("intent_ambiguous", "w2", 2),
        ("parked", "w2", 2),
    ]
    assert all(
        (e.detail or "").startswith(
            ("j:main:capture:psp (psp.capture)", "j:main:send:mail (mail.send)")
        )
        for e in out
        if e.kind.is_intent
    )
    assert {e.source for e in out if e.kind.is_intent} == {"intent"}


def test_an_attempt_applied_after_its_intent_moved_on_says_so() -> None:
    pay = IntentFacts(
        key="j:main:capture:psp",
        target="psp",
        action="capture",
        state="abandoned",
        created_at=11.0,
        updated_at=40.0,
        attempts=(_attempt(1, "j", 1, "w1", 12.0, 90.0, "ok_late"),),
    )
    out = from_intents("j", [pay])
    assert [(e.kind.value, e.owner, e.token, e.at) for e in out][-1] == (
        "intent_confirmed",
        "w1",
        1,
        90.0,
    )
    assert "attempt 1 applied, told after the intent had moved on" in (out[-1].detail or "")


class Charge(BaseModel):
    invoice: str
    card: str


def test_the_timeline_shows_the_intent_the_first_owner_started_and_the_second_reconciled(
    lease_env: LeaseEnv, fenced_target: FencedTarget
) -> None:
    # W1 pays and stalls before its confirm; W2 takes over and asks the target.
    app = App()
    app.target("psp", check=fenced_target.check, key_retention_seconds=3600)
    faults: dict[str, Faults] = {}
    paid = threading.Event()

    def pay(ec: Any) -> dict[str, Any]:
        out = fenced_target.call(ec)
        if ec.token == 1:
            faults["W1"].pause()
            paid.set()
        return out

    @app.job("charge", payload=Charge, **SHORT_LEASE)
    def charge(ctx: JobContext[Any], p: Charge) -> dict[str, Any]:
        return {"id": ctx.effect("capture", "psp", p, pay).external_id}

    job_id = lease_env.submit(app, "charge", Charge(invoice="INV-9", card="4111-SECRET"))
    w1 = lease_env.worker(app, "W1", concurrency=1)
    faults["W1"] = Faults(w1)
    with lease_env.running(w1):
        lease_env.wait_for(paid.is_set, what="W1 pays")
        with lease_env.running(lease_env.worker(app, "W2")):
            lease_env.wait_until_final(job_id)
        faults["W1"].resume()
    settings = lease_env.settings
    base = ["--endpoint-url", settings.endpoint_url or "", "--prefix", settings.prefix]
    got = CliRunner().invoke(cli, [*base, "jobs", "timeline", job_id, "--json"])
    assert got.exit_code == 0, got.output
    events = [(e["kind"], e["owner"], e["token"]) for e in json.loads(got.stdout)["events"]]
    key = f"{job_id}:main:capture:psp"
    order = [
        ("claimed", "W1", 1),
        ("intent_prepared", "W1", 1),
        ("intent_started", "W1", 1),
        ("claimed", "W2", 2),
        ("intent_reconciled", "W2", 2),
        ("committed", "W2", 2),
    ]
    assert [e for e in events if e in order] == order, events
    text = CliRunner().invoke(cli, [*base, "jobs", "timeline", job_id])
    assert f"intent started: {key} (psp.capture)" in text.stdout
    assert "intent reconciled" in text.stdout
    assert "SECRET" not in got.stdout + text.stdout  # never a payload
    bare = CliRunner().invoke(cli, [*base, "jobs", "timeline", job_id, "--no-intents", "--json"])
    assert not [e for e in json.loads(bare.stdout)["events"] if e["kind"].startswith("intent_")]
