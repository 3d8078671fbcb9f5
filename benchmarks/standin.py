"""An in-process stand-in for SQS and DynamoDB, constant time per entry (benchmark 5).

moto's ChangeMessageVisibility scans the whole queue for each entry, so with
thousands of messages in flight the emulator, not the worker, sets the pace.
This stand-in answers the worker's calls from the worker's own process so that
the scale benchmark can measure the worker's scheduling, batching, lateness, CPU
and RSS apart from the emulator:

- **SQS** (ReceiveMessage, ChangeMessageVisibility(Batch), DeleteMessage(Batch)):
  a dict of messages and a dict of receipt handles, O(1) per entry. A receipt
  handle is valid until its message is deleted or received again; an unknown
  handle gets ``ReceiptHandleIsInvalid`` as from SQS. Skipped: a lapsed
  visibility does not make a message receivable again by itself (the benchmark's
  leases are extended, and every extension that arrives after its message's
  visibility ran out is counted in ``lapsed``, so the figures show whether it
  would have mattered); no DLQ, no redrive, no FIFO, no message attributes.
- **DynamoDB**, two backends (``ddb=``):

  - ``"sim"`` (the default): the simulator's DynamoDB
    (:class:`sqs_lease.testing._sim.ddb.SimDynamo`), items in dicts, condition and update
    expressions evaluated from the request's own expressions
    (:mod:`sqs_lease.testing._sim.expr`, the model the simulation's
    invariants stand on), answered as outcome values with no botocore request
    serialisation and no moto expression parser. Claims, commits and releases meet
    the same conditions (``tests/test_bench_standin.py`` checks both backends).
  - ``"moto"``: moto's own in-process backend (``mock_aws``, no HTTP server) through a
    boto3 client. Its expression parsing costs ~0.7 ms per UpdateItem here, which
    made the stand-in itself the bottleneck at 5,000 leases.

  Either way the tables also exist in moto's backend (the worker checks them at
  start). The backend's Python cost runs in the worker's process; the stand-in
  times every call it answers (thread CPU time) so that cost is reported as the
  emulator's, apart from the worker's.

Errors become outcomes through the driver's own :func:`sqs_lease._aws.classify`,
so the flows see exactly what a real client error would give them.
"""

from __future__ import annotations

import dataclasses
import threading
import time
import uuid
from collections import Counter, deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from botocore import xform_name
from botocore.exceptions import ClientError

from sqs_lease._aws import classify
from sqs_lease._core.calls import Call, Ok, Outcome


@dataclass
class _Message:
    message_id: str
    body: str
    sent_ms: int
    receives: int = 0
    handle: str | None = None
    visible_at: float = 0.0


def _client_error(code: str, message: str, op: str) -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": message}}, op)


class StandIn:
    """Answers the worker's SQS calls from dicts and its DynamoDB calls from moto in-process.

    Start it with :meth:`start` (it enters ``mock_aws``); ``ddb`` is a boto3
    client on the mocked backend, for creating tables and seeding items.
    """

    def __init__(self, clock: Any = time.monotonic, *, ddb: str = "sim") -> None:
        if ddb not in ("sim", "moto"):
            raise ValueError(f"ddb={ddb!r}: choose 'sim' or 'moto'")
        self.backend = ddb
        self.dynamo: Any = None  # the SimDynamo of the "sim" backend
        self.clock = clock
        self.lock = threading.Lock()  # one server: calls are answered one at a time
        self.messages: dict[str, _Message] = {}
        self.handles: dict[str, str] = {}  # receipt handle -> message id
        self.ready: deque[str] = deque()  # message ids receivable now
        self.cpu = 0.0  # thread CPU seconds spent answering
        self.answered: Counter[str] = Counter()
        self.lapsed = 0  # extensions that arrived after their message's visibility ran out
        self._mock: Any = None
        self.ddb: Any = None
        self.sqs: Any = None

    def start(self) -> None:
        import boto3
        from moto import mock_aws

        self._mock = mock_aws()
        self._mock.start()
        session = boto3.session.Session(
            aws_access_key_id="testing", aws_secret_access_key="testing", region_name="us-east-1"
        )
        self.ddb = session.client("dynamodb")
        self.sqs = session.client("sqs")

    def create_tables(self, settings: Any) -> None:
        """Create the toolkit's tables on the mocked backend through :attr:`ddb`.

        Not through the library's ``create_tables``: its clients come from one
        session per process, and a session made before moto was imported never
        sees ``mock_aws`` (its requests would go to the real endpoint).
        """
        from sqs_lease._schema.create_table import create_table_params
        from sqs_lease.deploy import TABLE_MODELS, table_names

        names = table_names(settings)
        for role, model in TABLE_MODELS.items():
            self.ddb.create_table(**create_table_params(model, names[role]))
        if self.backend == "sim":
            from sqs_lease.testing._sim.chaos import Chaos
            from sqs_lease.testing._sim.ddb import SimDynamo, TableSpec
            from sqs_lease.testing._sim.resources import jobs_table_spec

            self.dynamo = SimDynamo(
                [
                    jobs_table_spec(names["jobs"]),
                    TableSpec(names["intents"], "intent_key"),
                    TableSpec(names["attempts"], "intent_key", "attempt"),
                    TableSpec(names["groups"], "group_id"),
                ],
                Chaos(0),  # no faults: every roll has probability 0
            )

    def put_items(self, table: str, items: list[Mapping[str, Any]]) -> None:
        """Seed items (not a worker call: no cost is counted)."""
        if self.dynamo is None:
            from benchmarks.bench_common import put_items

            put_items(self.ddb, table, items)
            return
        for item in items:
            out = self.dynamo.handle("PutItem", {"TableName": table, "Item": dict(item)}, 0.0)
            if not isinstance(out, Ok):
                raise RuntimeError(f"seeding {table}: {out}")

    def stop(self) -> None:
        if self._mock is not None:
            self._mock.stop()

    def send(self, bodies: list[str]) -> None:
        """Seed messages (not a worker call: no cost is counted)."""
        now_ms = int(time.time() * 1000)
        for body in bodies:
            mid = str(uuid.uuid4())
            self.messages[mid] = _Message(mid, body, now_ms)
            self.ready.append(mid)

    # ----------------------------------------------------------------- answering

    def answer(self, c: Call) -> tuple[Outcome, float]:
        """The call's outcome, and how long a ReceiveMessage found nothing to wait for."""
        sent = self.clock()
        t0 = time.thread_time()
        idle = 0.0
        try:
            with self.lock:
                self.answered[c.op] += 1
                if c.service == "sqs":
                    response, idle = self._sqs(c.op, c.params)
                elif self.dynamo is not None:
                    got = self.dynamo.handle(c.op, c.params, sent)
                    return dataclasses.replace(got, sent_at=sent, received_at=self.clock()), 0.0
                else:
                    response = getattr(self.ddb, xform_name(c.op))(**c.params)
            out: Outcome = Ok(response, sent, self.clock())
        except ClientError as exc:
            out = classify(exc, sent, self.clock(), where="stand-in")
        finally:
            with self.lock:
                self.cpu += time.thread_time() - t0
        return out, idle

    def _sqs(self, op: str, p: Mapping[str, Any]) -> tuple[dict[str, Any], float]:
        now = self.clock()
        if op == "ReceiveMessage":
            out: list[dict[str, Any]] = []
            while self.ready and len(out) < int(p.get("MaxNumberOfMessages", 1)):
                m = self.messages.get(self.ready.popleft())
                if m is None:
                    continue
                if m.handle is not None:
                    self.handles.pop(m.handle, None)
                m.receives += 1
                m.handle = f"{m.message_id}.{m.receives}"
                m.visible_at = now + int(p.get("VisibilityTimeout", 30))
                self.handles[m.handle] = m.message_id
                out.append(
                    {
                        "MessageId": m.message_id,
                        "ReceiptHandle": m.handle,
                        "Body": m.body,
                        "Attributes": {
                            "ApproximateReceiveCount": str(m.receives),
                            "SentTimestamp": str(m.sent_ms),
                        },
                    }
                )
            idle = float(p.get("WaitTimeSeconds", 0)) if not out else 0.0
            return ({"Messages": out} if out else {}), idle
        if op == "ChangeMessageVisibility":
            self._change(p["ReceiptHandle"], int(p["VisibilityTimeout"]), now, op)
            return {}, 0.0
        if op == "DeleteMessage":
            self._delete(p["ReceiptHandle"], op)
            return {}, 0.0
        if op in ("ChangeMessageVisibilityBatch", "DeleteMessageBatch"):
            ok: list[dict[str, Any]] = []
            failed: list[dict[str, Any]] = []
            for e in p["Entries"]:
                try:
                    if op == "DeleteMessageBatch":
                        self._delete(e["ReceiptHandle"], op)
                    else:
                        self._change(e["ReceiptHandle"], int(e["VisibilityTimeout"]), now, op)
                    ok.append({"Id": e["Id"]})
                except ClientError as exc:
                    err = exc.response["Error"]
                    failed.append(
                        {
                            "Id": e["Id"],
                            "SenderFault": True,
                            "Code": err["Code"],
                            "Message": err["Message"],
                        }
                    )
            return {"Successful": ok, "Failed": failed}, 0.0
        raise _client_error("UnsupportedOperation", f"the stand-in does not answer {op}", op)

    def _message(self, handle: str, op: str) -> _Message:
        mid = self.handles.get(handle)
        if mid is None:
            raise _client_error(
                "ReceiptHandleIsInvalid", f"The input receipt handle {handle!r} is not valid.", op
            )
        return self.messages[mid]

    def _change(self, handle: str, timeout: int, now: float, op: str) -> None:
        m = self._message(handle, op)
        if timeout > 0 and now > m.visible_at:
            self.lapsed += 1
        m.visible_at = now + timeout
        if timeout == 0:  # released: receivable again; this handle stays valid until then
            self.ready.append(m.message_id)

    def _delete(self, handle: str, op: str) -> None:
        m = self._message(handle, op)
        self.handles.pop(handle, None)
        self.messages.pop(m.message_id, None)

    # ----------------------------------------------------------------- wiring

    def install(self, probe_call: Any) -> None:
        """Route both drivers' AWS calls here (``probe_call`` sees each call first)."""
        import asyncio

        from sqs_lease._aio import AsyncDriver
        from sqs_lease._aws import SyncDriver

        standin = self

        def execute(self: SyncDriver, c: Call) -> Outcome:
            probe_call(c)
            out, idle = standin.answer(c)
            if idle:
                time.sleep(min(idle, 1.0))  # a long poll that found nothing
            self.calls += 1
            for observe in self.observers:
                observe(c, out)
            return out

        async def aexecute(self: AsyncDriver, c: Call) -> Outcome:
            probe_call(c)
            # Answered off the loop, as a server would: the stand-in's own CPU (moto's
            # expression parsing) must not block the loop it is measuring.
            out, idle = await asyncio.to_thread(standin.answer, c)
            await asyncio.sleep(min(idle, 1.0))
            self.calls += 1
            return out

        SyncDriver.execute = execute  # type: ignore[method-assign]
        AsyncDriver.execute = aexecute  # type: ignore[method-assign]
