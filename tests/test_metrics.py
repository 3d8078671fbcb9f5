"""Metrics in CloudWatch Embedded Metric Format, derived from the journal.

A real worker process on the moto server writes EMF to stdout; the documents
must parse as EMF (namespace, dimensions, metric definitions, values), carry
the figures operators alarm on, and never a payload. The counters a real run
cannot easily produce (takeovers, rejected commits, expired leases) are fed to
the sink as the journal events the flows emit.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import uuid
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from conftest import AwsTestEnv
from pydantic import BaseModel
from worker_helpers import prepare, read_view, wait_until

from sqs_lease import App, JobContext, JobState, Journal, Producer
from sqs_lease.metrics import METRICS, EmfMetrics
from sqs_lease.tracing import OtelSpans

if TYPE_CHECKING:
    from types_boto3_dynamodb import DynamoDBClient

ROOT = Path(__file__).resolve().parent.parent
TESTS = Path(__file__).resolve().parent
HANG_GUARD = 120
NAMESPACE = "SqsLeaseTest"
UNITS = {m.name: m.unit for m in METRICS}

Doc = dict[str, Any]


def emf_documents(text: str) -> list[Doc]:
    """Every EMF document in ``text``, checked against the format as it is parsed."""
    docs = []
    for line in text.splitlines():
        if not line.startswith("{"):
            continue
        doc = json.loads(line)
        if "_aws" not in doc:
            continue  # the worker's final counters
        check_emf(doc)
        docs.append(doc)
    return docs


def check_emf(doc: Doc) -> None:
    """The structure CloudWatch requires of an EMF document (its specification)."""
    meta = doc["_aws"]
    assert isinstance(meta["Timestamp"], int) and meta["Timestamp"] > 1_600_000_000_000
    directives = meta["CloudWatchMetrics"]
    assert isinstance(directives, list) and directives
    for d in directives:
        assert d["Namespace"] == NAMESPACE
        assert isinstance(d["Dimensions"], list) and d["Dimensions"]
        for keys in d["Dimensions"]:
            assert 1 <= len(keys) <= 30
            for key in keys:
                assert isinstance(doc[key], str) and doc[key], (key, doc)
        assert 0 < len(d["Metrics"]) <= 100
        for m in d["Metrics"]:
            assert m["Unit"] == UNITS[m["Name"]], m
            value = doc[m["Name"]]
            values = value if isinstance(value, list) else [value]
            assert values and len(values) <= 100
            assert all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)


def dims_of(doc: Doc) -> tuple[tuple[str, str], ...]:
    keys = doc["_aws"]["CloudWatchMetrics"][0]["Dimensions"][0]
    return tuple((k, doc[k]) for k in keys)


def values_by_dims(docs: list[Doc]) -> dict[tuple[tuple[str, str], ...], dict[str, list[float]]]:
    out: dict[tuple[tuple[str, str], ...], dict[str, list[float]]] = defaultdict(dict)
    for doc in docs:
        for m in doc["_aws"]["CloudWatchMetrics"][0]["Metrics"]:
            value = doc[m["Name"]]
            out[dims_of(doc)].setdefault(m["Name"], []).extend(
                value if isinstance(value, list) else [value]
            )
    return out


# --------------------------------------------------------------------------- a real worker


@pytest.mark.integration
@pytest.mark.fault
def test_a_real_worker_writes_emf_with_the_figures_and_never_a_payload(
    aws: AwsTestEnv, ddb_client: DynamoDBClient, tmp_path: Path
) -> None:
    settings, _, _ = prepare(aws.endpoint_url, aws.prefix)
    marker = f"PAYLOAD-MARKER-{uuid.uuid4().hex}"
    producer = Producer(settings)
    jobs = {
        name: producer.submit(name, {"n": n, "note": marker}, job_id=f"{aws.prefix}-{name}").job_id
        for n, name in enumerate(("quick", "flaky", "unsure", "broken", "summarize"))
    }
    env = {k: v for k, v in os.environ.items() if not k.startswith("SQS_LEASE_")}
    env.update(
        {
            "PYTHONPATH": os.pathsep.join([str(TESTS), str(ROOT)]),
            "PYTHONUNBUFFERED": "1",
            "AWS_ENDPOINT_URL": aws.endpoint_url,
            "SQS_LEASE_PREFIX": aws.prefix,
            "SQS_LEASE_APP": "container_app:app",
            "SQS_LEASE_CONCURRENCY": "5",
            "SQS_LEASE_RECEIVE_WAIT": "1",
            "SQS_LEASE_METRICS": "true",
            "SQS_LEASE_METRICS_NAMESPACE": NAMESPACE,
            "SQS_LEASE_METRICS_INTERVAL": "0.5",
            "GATE_DIR": str(tmp_path),
        }
    )
    out_path, err_path = tmp_path / "stdout", tmp_path / "stderr"
    with out_path.open("wb") as out, err_path.open("wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "sqs_lease", "worker"], env=env, stdout=out, stderr=err
        )
    summarize = (("JobClass", "summarize"), ("Model", "demo-model-1"), ("Provider", "demo-ai"))

    def held_gauges_seen() -> bool:
        found = values_by_dims(emf_documents(out_path.read_text())).get(summarize, {})
        return "LastHeartbeatAge" in found and "LeaseTimeLeft" in found

    def state(name: str) -> JobState:
        return read_view(ddb_client, settings, jobs[name]).state

    try:
        # The summarize job holds its lease until a flush has reported it as held.
        wait_until(held_gauges_seen, HANG_GUARD, "gauges of the held summarize job")
        (tmp_path / "open-summarize").touch()
        ends = {
            "quick": JobState.SUCCEEDED,
            "flaky": JobState.SUCCEEDED,
            "unsure": JobState.PARKED,
            "broken": JobState.FAILED,
            "summarize": JobState.SUCCEEDED,
        }
        wait_until(
            lambda: all(state(n) is end for n, end in ends.items()),
            HANG_GUARD,
            "every job to end",
        )
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=HANG_GUARD) == 0, err_path.read_text()[-2000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
    text = out_path.read_text()
    docs = emf_documents(text)
    by = values_by_dims(docs)

    def total(job_class: str, name: str) -> float:
        dims = summarize if job_class == "summarize" else (("JobClass", job_class),)
        return sum(by[dims].get(name, []))

    assert total("quick", "JobsSucceeded") == 1
    assert total("flaky", "JobsRetried") == 1 and total("flaky", "JobsSucceeded") == 1
    assert by[(("JobClass", "flaky"),)]["Attempts"] == [2]
    assert total("unsure", "ParkedJobs") == 1
    assert total("broken", "JobsFailed") == 1
    assert total("summarize", "JobsSucceeded") == 1
    assert by[summarize]["JobDuration"][0] > 0
    assert max(by[summarize]["LastHeartbeatAge"]) >= 0
    assert min(by[summarize]["LeaseTimeLeft"]) > 0
    # Counters are written for every class at every flush, zeros included.
    assert by[(("JobClass", "polite"),)]["RejectedResults"][0] == 0
    # Never a payload: not in the metrics, not in the journal.
    assert marker not in text
    assert marker not in err_path.read_text()


# --------------------------------------------------------------------------- the sink


class Work(BaseModel):
    n: int


def _app() -> App:
    app = App()

    @app.job("ocr", payload=Work)
    def ocr(ctx: JobContext[Any], p: Work) -> None: ...

    @app.job("draft", payload=Work, model="m-large", provider="acme")
    def draft(ctx: JobContext[Any], p: Work) -> None: ...

    return app


def test_the_sink_counts_takeovers_rejections_expiries_and_ambiguity_per_class() -> None:
    now = [100.0]
    stream = io.StringIO()
    metrics = EmfMetrics(_app(), namespace=NAMESPACE, stream=stream, clock=lambda: now[0])
    journal = Journal(logger=_quiet_logger())
    journal.add_sink(metrics)
    # The events, with the fields the flows give them.
    journal("job_claimed", job_id="a", job_class="ocr", token=2, attempt=2, lease_seconds=30)
    journal("job_reclaimed", job_id="a", token=2, previous_owner="w1", previous_token=1)
    journal("job_claimed", job_id="b", job_class="draft", token=1, attempt=1, lease_seconds=30)
    now[0] = 104.0
    journal("heartbeat_ok", job_id="b", token=1, lease_left=29.5)
    journal("ownership_unknown", job_id="a", token=2, reason="sqs: timeout")
    journal("lease_dropped", job_id="a", token=2, reason="lease_reserve_spent", lease_left=0.1)
    journal("lease_dropped", job_id="a", token=2, reason="no_progress", lease_left=5.0)
    journal("intent_ambiguous", job_id="b", key="k", attempt=1, token=1, reason="r")
    journal("job_parked", job_id="b", token=1, reason="r")
    now[0] = 110.0
    assert metrics.flush() == 2
    docs = emf_documents(stream.getvalue())
    by = values_by_dims(docs)
    ocr = (("JobClass", "ocr"),)
    draft = (("JobClass", "draft"), ("Model", "m-large"), ("Provider", "acme"))
    assert by[ocr]["ReclaimedJobs"] == [1]
    assert by[ocr]["ExtensionFailures"] == [1]
    assert by[ocr]["ExpiredLeases"] == [1]  # only the reserve-spent drop is an expiry
    assert by[ocr]["LastHeartbeatAge"] == [10.0]  # a is still held: claimed at 100
    assert by[ocr]["LeaseTimeLeft"] == [20.0]
    assert by[draft]["AmbiguousIntents"] == [1] and by[draft]["ParkedJobs"] == [1]
    assert "LastHeartbeatAge" not in by[draft]  # b ended (parked): no longer held
    # A stale attempt's rejected commit counts under its class, then ends it.
    journal("result_rejected", job_id="a", job_class="ocr", token=2, reason="token moved")
    metrics.flush()
    later = values_by_dims(emf_documents(stream.getvalue())[2:])
    assert later[ocr]["RejectedResults"] == [1]
    assert "LastHeartbeatAge" not in later[ocr]


def test_the_otel_hook_makes_an_attempt_span_with_a_tool_call_child() -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    journal = Journal(logger=_quiet_logger())
    journal.add_sink(OtelSpans(provider.get_tracer("test")))
    journal("job_claimed", job_id="a", job_class="ocr", token=1, attempt=1, payload={"x": 1})
    journal("tool_request_started", job_id="a", key="k", tool="ocr-api", attempt=1, token=1)
    journal("tool_request_finished", job_id="a", key="k", tool="ocr-api", attempt=1, token=1)
    journal("result_committed", job_id="a", job_class="ocr", token=1, attempt=1, duration=0.2)
    spans = {s.name: s for s in exporter.get_finished_spans()}
    attempt, tool = spans["sqs_lease.attempt"], spans["sqs_lease.tool_call"]
    assert tool.parent is not None and tool.parent.span_id == attempt.context.span_id
    assert [e.name for e in attempt.events] == ["claimed", "committed"]
    assert attempt.attributes is not None and attempt.attributes["sqs_lease.job_class"] == "ocr"
    assert not any("payload" in k for k in attempt.attributes)


def _quiet_logger() -> Any:
    import logging

    logger = logging.getLogger(f"test-metrics-{uuid.uuid4().hex}")
    logger.propagate = False
    logger.addHandler(logging.NullHandler())
    return logger


def test_operations_md_lists_every_metric_with_its_unit() -> None:
    doc = (ROOT / "docs" / "operations.md").read_text()
    for m in METRICS:
        assert f"| `{m.name}` | {m.unit} | {m.meaning} | {m.source} |" in doc, m.name
