"""OpenTelemetry spans around claim, tool call and commit (issue 10, item 3), read
with the OTel SDK's in-memory exporter."""

from __future__ import annotations

import logging
import uuid
from typing import Any

import pytest
from conftest import AwsTestEnv
from pydantic import BaseModel
from worker_helpers import FAST, prepare

from sqs_lease import App, JobContext, Journal, Producer, ToolResult, Worker
from sqs_lease.tracing import OtelSpans

pytest.importorskip("opentelemetry.sdk")

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
    InMemorySpanExporter,
)


def _traced() -> tuple[Journal, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    logger = logging.getLogger(f"test-tracing-{uuid.uuid4().hex}")
    logger.propagate = False
    logger.addHandler(logging.NullHandler())
    journal = Journal(logger=logger)
    journal.add_sink(OtelSpans(provider.get_tracer("test")))
    return journal, exporter


def _by_name(exporter: InMemorySpanExporter) -> dict[str, list[ReadableSpan]]:
    out: dict[str, list[ReadableSpan]] = {}
    for span in exporter.get_finished_spans():
        out.setdefault(span.name, []).append(span)
    return out


def _child_of(span: ReadableSpan, parent: ReadableSpan) -> bool:
    assert parent.context is not None
    return span.parent is not None and span.parent.span_id == parent.context.span_id


def _seconds(span: ReadableSpan) -> float:
    assert span.start_time is not None and span.end_time is not None
    return (span.end_time - span.start_time) / 1e9


def test_the_claim_and_the_commit_are_child_spans_as_long_as_the_flows_measured() -> None:
    journal, exporter = _traced()
    journal("job_claimed", job_id="a", job_class="ocr", token=1, attempt=1, claim_seconds=0.25)
    journal("result_committed", job_id="a", job_class="ocr", token=1, attempt=1, commit_seconds=0.5)
    spans = _by_name(exporter)
    (attempt,) = spans["sqs_lease.attempt"]
    (claim,) = spans["sqs_lease.claim"]
    (commit,) = spans["sqs_lease.commit"]
    assert _child_of(claim, attempt) and _child_of(commit, attempt)
    assert _seconds(claim) == pytest.approx(0.25) and _seconds(commit) == pytest.approx(0.5)
    assert claim.start_time == attempt.start_time  # the attempt begins with its claim
    assert commit.end_time is not None and attempt.end_time is not None
    assert commit.end_time <= attempt.end_time
    assert commit.attributes is not None and commit.attributes["sqs_lease.outcome"] == "committed"


def test_a_rejected_commit_is_a_commit_span_with_the_outcome_rejected() -> None:
    journal, exporter = _traced()
    journal("job_claimed", job_id="a", job_class="ocr", token=1, attempt=1, claim_seconds=0.1)
    journal("result_rejected", job_id="a", job_class="ocr", token=1, write_seconds=0.2)
    spans = _by_name(exporter)
    (attempt,) = spans["sqs_lease.attempt"]
    (commit,) = spans["sqs_lease.commit"]
    assert _child_of(commit, attempt) and _seconds(commit) == pytest.approx(0.2)
    assert commit.attributes is not None and commit.attributes["sqs_lease.outcome"] == "rejected"
    assert attempt.attributes is not None
    assert attempt.attributes["sqs_lease.outcome"] == "commit_rejected"


class Doc(BaseModel):
    name: str


@pytest.mark.integration
def test_a_real_attempt_traces_claim_then_tool_call_then_commit_in_order(aws: AwsTestEnv) -> None:
    settings, _, _ = prepare(aws.endpoint_url, aws.prefix)
    app = App()
    app.target("store")

    @app.job("save", payload=Doc, **FAST)
    def save(ctx: JobContext[Doc], p: Doc) -> dict[str, Any]:
        done = ctx.effect("put", "store", p, lambda call: ToolResult({}, external_id="s-1"))
        return {"id": done.external_id}

    Producer(settings, app).submit("save", Doc(name="a"))
    journal, exporter = _traced()
    stats = Worker(app, settings, receive_wait=1, journal=journal, sweep_interval=None).run(
        idle_exit=1
    )
    assert stats.committed == 1
    spans = _by_name(exporter)
    (attempt,) = spans["sqs_lease.attempt"]
    (claim,) = spans["sqs_lease.claim"]
    (tool,) = spans["sqs_lease.tool_call"]
    (commit,) = spans["sqs_lease.commit"]
    assert all(_child_of(s, attempt) for s in (claim, tool, commit))
    # Measured from the flows' own stamps: two AWS calls each, so never zero long.
    assert _seconds(claim) > 0 and _seconds(commit) > 0
    assert claim.end_time is not None and tool.start_time is not None
    assert tool.end_time is not None and commit.start_time is not None
    assert claim.end_time <= tool.start_time and tool.end_time <= commit.start_time
