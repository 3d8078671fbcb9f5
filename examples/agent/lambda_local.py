"""The same agent tool calls behind the Lambda adapter, locally, in one command:

    python examples/agent/lambda_local.py

Sets up what ``run_local.py`` does (emulator, fenced payment service, one agent
session's tool calls), then plays the SQS event source mapping: it receives up to
ten messages at a time, builds the event Lambda would deliver (``Records`` with the
event's own key spelling and the real receipt handles) and invokes the deployable
handler ``sqs_lease.aws_lambda.entry`` with ``SQS_LEASE_APP=examples.agent.tools:lambda_app``
(the same handlers, with a stage budget a 900 s function can hold) and a context
whose remaining time runs down. Records the function reports in
``batchItemFailures`` are left for the next receive, as the mapping does. Exits 0
when every call succeeded and the invoice was charged exactly once.

Deployed, nothing here is needed: the function's handler is
``sqs_lease.aws_lambda.entry``, its environment ``SQS_LEASE_APP``,
``SQS_LEASE_PREFIX`` and ``RECEIVER_URL``; the queue's visibility timeout at
least 6 x the function timeout (docs/operations.md, "Running on AWS Lambda").
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent))

from examples.agent.session import (
    all_done,
    journal_events,
    local_aws,
    options,
    report,
    say,
    submit_session,
)
from sqs_lease import Settings
from sqs_lease._aws import make_client
from sqs_lease.aws_lambda import entry

FUNCTION_TIMEOUT = 900
"""Lambda's longest; the queue's visibility is 6 x this, as AWS advises."""

HANG_GUARD = 180.0


class Context:
    """What Lambda's context object offers the adapter: the time left, running down."""

    def __init__(self, seconds: float) -> None:
        self._end = time.monotonic() + seconds

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int((self._end - time.monotonic()) * 1000))


def event_source(settings: Settings) -> list[dict[str, Any]]:
    """One receive as the event source mapping makes it: up to 10 records."""
    sqs = make_client(settings, "sqs")
    url = sqs.get_queue_url(QueueName=settings.queue)["QueueUrl"]
    got = sqs.receive_message(
        QueueUrl=url,
        MaxNumberOfMessages=10,
        WaitTimeSeconds=1,
        MessageSystemAttributeNames=["All"],
    ).get("Messages", [])
    arn = f"arn:aws:sqs:{settings.region}:123456789012:{settings.queue}"
    return [
        {
            "messageId": m["MessageId"],
            "receiptHandle": m["ReceiptHandle"],
            "body": m["Body"],
            "attributes": m.get("Attributes", {}),
            "messageAttributes": {},
            "md5OfBody": m["MD5OfBody"],
            "eventSource": "aws:sqs",
            "eventSourceARN": arn,
            "awsRegion": settings.region,
        }
        for m in got
    ]


def main(argv: Sequence[str] | None = None) -> int:
    args = options(argv, "an agent's tool calls behind the Lambda adapter, locally")
    with local_aws(args, visibility=6 * FUNCTION_TIMEOUT) as settings, journal_events() as journal:
        session = submit_session(settings)
        os.environ["SQS_LEASE_APP"] = "examples.agent.tools:lambda_app"
        say("invoking sqs_lease.aws_lambda.entry (SQS_LEASE_APP=examples.agent.tools:lambda_app)")
        deadline = time.monotonic() + HANG_GUARD
        invocations = 0
        while not all_done(session) and time.monotonic() < deadline:
            records = event_source(settings)
            if not records:
                continue  # a failed record comes back after its backoff
            answer = entry({"Records": records}, Context(FUNCTION_TIMEOUT))
            invocations += 1
            failed = [f["itemIdentifier"] for f in answer["batchItemFailures"]]
            say(f"invocation {invocations}: {len(records)} records, {len(failed)} failed")
        return 0 if report(session, journal) else 1


if __name__ == "__main__":
    raise SystemExit(main())
