"""The async driver runs the very same flows as the sync one, against a real moto server."""

from __future__ import annotations

import asyncio
import time

import pytest
from conftest import AwsTestEnv

from sqs_lease import Settings, create_queue, create_tables
from sqs_lease._aio import AsyncDriver
from sqs_lease._core.claiming import Claimed, claim_flow
from sqs_lease._core.endwrites import EndRequest, commit_flow
from sqs_lease._core.heartbeats import heartbeat_flow
from sqs_lease._core.lease import LocalLease
from sqs_lease._core.messages import Delivery, receive_flow
from sqs_lease._core.sending import submit_flow
from sqs_lease._schema.job_requests import JobTable

pytestmark = pytest.mark.integration


async def _scenario(settings: Settings, queue_url: str) -> tuple[str, str, str, int]:
    table = JobTable(settings.jobs_table)
    async with AsyncDriver(settings) as d:
        await d.run(
            submit_flow(
                table,
                queue_url=queue_url,
                job_id="a1",
                job_class="c",
                payload_json="{}",
                payload_hash="h",
                wall_now=time.time(),
                send_id="a1-send",
            )
        )
        batch = await d.run(
            receive_flow(queue_url=queue_url, max_messages=10, wait_seconds=1, visibility=5)
        )
        assert len(batch) == 1
        delivery = batch[0]
        assert isinstance(delivery, Delivery)
        first = await d.run(
            claim_flow(
                table,
                queue_url=queue_url,
                delivery=delivery,
                worker_id="w1",
                wall_now=time.time(),
                lease_seconds=5,
                max_attempts=3,
                nonce="n-1",
            )
        )
        assert isinstance(first, Claimed)
        second = await d.run(
            claim_flow(
                table,
                queue_url=queue_url,
                delivery=delivery,
                worker_id="w2",
                wall_now=time.time(),
                lease_seconds=5,
                max_attempts=3,
                nonce="n-1",
                take_from=first.token,  # a take-over, as the duplicate rule makes it
            )
        )
        assert isinstance(first, Claimed) and isinstance(second, Claimed)
        now = time.monotonic()
        lease = LocalLease(
            "a1",
            first.token,
            delivery.receipt_handle,
            5,
            1.0,
            1.0,
            first.deadline,
            now,
            now + 100,
            100,
        )
        beat = await d.run(
            heartbeat_flow(
                table, queue_url=queue_url, leases=[lease], worker_id="w1", wall_now=time.time()
            )
        )
        stale = await d.run(
            commit_flow(
                table,
                EndRequest(
                    queue_url=queue_url,
                    job=first.job,
                    delivery=first.delivery,
                    worker_id="w1",
                    wall_now=time.time(),
                    nonce="n-1",
                ),
                result_json="{}",
                duration=0.0,
            )
        )
        fresh = await d.run(
            commit_flow(
                table,
                EndRequest(
                    queue_url=queue_url,
                    job=second.job,
                    delivery=second.delivery,
                    worker_id="w2",
                    wall_now=time.time(),
                    nonce="n-1",
                ),
                result_json="{}",
                duration=0.0,
            )
        )
        return beat.beats["a1"].status, stale.outcome, fresh.outcome, second.token


def test_async_driver_runs_the_same_flows(aws: AwsTestEnv) -> None:
    settings = Settings(endpoint_url=aws.endpoint_url, prefix=aws.prefix)
    create_tables(settings)
    queue_url, _ = create_queue(settings)
    beat, stale, fresh, token = asyncio.run(_scenario(settings, queue_url))
    assert beat == "lost"  # w2's claim moved the token on
    assert stale == "rejected"
    assert fresh == "done"
    assert token == 2
