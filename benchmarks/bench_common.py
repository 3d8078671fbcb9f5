"""Shared pieces of the benchmarks: a moto server per benchmark, call counting,
process CPU, fast fixtures and markdown helpers. Not a benchmark itself.

Every benchmark talks to a moto server in its own process (``spawn_local_server``),
so the server's CPU can be read from ``/proc`` and compared with wall time: a
server near one full core (moto serves under one GIL) is the limit, not the
client.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import platform
import re
import statistics
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from sqs_lease import Settings, create_queue, create_tables
from sqs_lease._aws import SyncDriver, Timeouts, make_client
from sqs_lease._core.calls import Call, Ok, Outcome
from sqs_lease._core.messages import message_body
from sqs_lease._jobs import canonical_json, payload_hash
from sqs_lease._journal import Journal
from sqs_lease._local import local_credentials_env, spawn_local_server, stop_local_server
from sqs_lease._schema.job_requests import JobTable

ROOT = Path(__file__).resolve().parent.parent
_LOOPBACK = ("127.0.0.1", "localhost")

HANG_GUARD = 600.0
"""The bound of every wait in the benchmarks: a hang guard for a loaded machine (the
smoke test runs them beside the whole suite); a wait that succeeds returns at once."""


def setup_env() -> None:
    """Dummy credentials for moto; loopback never goes through a proxy."""
    os.environ.update(local_credentials_env())
    os.environ.pop("AWS_PROFILE", None)
    for name in ("NO_PROXY", "no_proxy"):
        names = [n.strip() for n in os.environ.get(name, "").split(",") if n.strip()]
        os.environ[name] = ",".join(names + [h for h in _LOOPBACK if h not in names])


@dataclass
class Moto:
    """A moto server process: its endpoint and its pid (for CPU readings)."""

    endpoint: str
    pid: int

    def cpu(self) -> float:
        return process_cpu(self.pid)


@contextlib.contextmanager
def moto_server() -> Iterator[Moto]:
    setup_env()
    proc, endpoint = spawn_local_server()
    try:
        yield Moto(endpoint, proc.pid)
    finally:
        stop_local_server(proc)


_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def process_cpu(pid: int) -> float:
    """User + system CPU seconds of a process (all its threads); NaN if unreadable."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return math.nan
    fields = text.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK  # utime, stime


def own_cpu() -> float:
    """CPU seconds of this process, all threads."""
    return time.process_time()


@dataclass
class CpuWindow:
    """Wall time and CPU of this process and of the moto server over one measured span."""

    moto: Moto
    wall: float = 0.0
    moto_cpu: float = 0.0
    client_cpu: float = 0.0
    _t: float = 0.0
    _m: float = 0.0
    _c: float = 0.0

    def __enter__(self) -> CpuWindow:
        self._t, self._m, self._c = time.monotonic(), self.moto.cpu(), own_cpu()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall = time.monotonic() - self._t
        self.moto_cpu = self.moto.cpu() - self._m
        self.client_cpu = own_cpu() - self._c

    @property
    def moto_busy(self) -> float:
        """Share of one core the moto server used (1.0 = saturated: moto is the limit)."""
        return self.moto_cpu / self.wall if self.wall > 0 else math.nan


def fresh_settings(endpoint: str, tag: str) -> tuple[Settings, str]:
    """New tables and queue under a unique prefix; returns settings and the queue URL."""
    settings = Settings(endpoint_url=endpoint, prefix=f"b{tag}{uuid.uuid4().hex[:8]}")
    create_tables(settings)
    url, _dlq = create_queue(settings)
    return settings, url


# --------------------------------------------------------------------------- counting


def call_label(c: Call) -> str:
    """The op name, with UpdateItem told apart by the attributes it sets (and the
    worker's liveness PutItem from other puts)."""
    if c.op == "PutItem" and c.params.get("Item", {}).get("kind", {}).get("S") == "liveness":
        return "PutItem(liveness)"
    if c.op != "UpdateItem":
        return c.op
    names = c.params.get("ExpressionAttributeNames") or {}
    placeholders = re.findall(r"#\w+", str(c.params.get("UpdateExpression", "")))
    updated = {names.get(p, p) for p in placeholders}
    # A stage's checkpoint also sets attempt (to 0) and message_sent (to False): it
    # is told apart by the stage log it writes, before the claim's test.
    if "stages" in updated:
        return "UpdateItem(checkpoint)"
    if "attempt" in updated:
        return "UpdateItem(claim)"
    if "result" in updated:
        return "UpdateItem(commit)"
    if "message_sent" in updated and updated <= {"message_sent", "unsent", "unsent_since"}:
        return "UpdateItem(mark_sent)"
    if updated <= {"last_heartbeat", "lease_deadline"}:
        return "UpdateItem(advise)"
    return "UpdateItem(other)"


@dataclass
class Tally:
    """Calls by label, their summed latency, entries carried by batch calls."""

    calls: Counter[str] = field(default_factory=Counter)
    seconds: defaultdict[str, float] = field(default_factory=lambda: defaultdict(float))
    entries: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, c: Call, out: Outcome) -> None:
        label = call_label(c)
        n = 0
        if c.op == "ReceiveMessage" and isinstance(out, Ok):
            n = len(out.response.get("Messages") or [])
            if n == 0:
                label = "ReceiveMessage(empty)"
        elif c.op == "ChangeMessageVisibilityBatch" or c.op == "DeleteMessageBatch":
            n = len(c.params.get("Entries") or [])
        elif c.op == "BatchGetItem":
            n = sum(len(t.get("Keys") or []) for t in (c.params.get("RequestItems") or {}).values())
        with self.lock:
            self.calls[label] += 1
            self.seconds[label] += out.received_at - out.sent_at
            self.entries[label] += n
            if not isinstance(out, Ok):
                self.errors[f"{label}:{out.code or out.kind}"] += 1

    def total(self) -> int:
        with self.lock:
            return sum(self.calls.values())

    def count(self, *labels: str) -> int:
        with self.lock:
            return sum(self.calls[x] for x in labels)


class CountingDriver(SyncDriver):
    """The library's sync driver, counting every call by op into a shared :class:`Tally`."""

    def __init__(
        self,
        settings: Settings,
        tally: Tally,
        timeouts: Timeouts | None = None,
        journal: Journal | None = None,
    ) -> None:
        super().__init__(settings, journal, timeouts or Timeouts())
        self.tally = tally

    def execute(self, c: Call) -> Outcome:
        out = super().execute(c)
        self.tally.record(c, out)
        return out


class EventCounter(logging.Handler):
    """Counts journal events by name (and ``heartbeat_lost`` by reason)."""

    def __init__(self) -> None:
        super().__init__(level=logging.INFO)
        self.counts: Counter[str] = Counter()
        self.lost_reasons: Counter[str] = Counter()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            event = json.loads(record.getMessage())
        except ValueError:
            return
        name = str(event.get("event"))
        self.counts[name] += 1
        if name == "heartbeat_lost":
            # "job is succeeded", "token moved to 3", ...: keep the kind, not the number.
            self.lost_reasons[re.sub(r"\d+", "N", str(event.get("reason")))] += 1


def counting_journal() -> tuple[Journal, EventCounter]:
    """A journal whose events are counted (on a private logger, nothing printed)."""
    counter = EventCounter()
    logger = logging.getLogger(f"bench.journal.{uuid.uuid4().hex[:8]}")
    logger.setLevel(logging.INFO)
    logger.propagate = False
    logger.addHandler(counter)
    return Journal(logger=logger), counter


def count_client_calls(client: Any, counter: Counter[str], lock: threading.Lock) -> None:
    """Count every API call a raw boto3 client makes (botocore's before-call event)."""

    def handler(model: Any, **_: Any) -> None:
        with lock:
            counter[str(model.name)] += 1

    client.meta.events.register("before-call.*.*", handler)


# --------------------------------------------------------------------------- fixtures


def job_item(
    table: JobTable,
    job_id: str,
    job_class: str,
    payload: Mapping[str, Any],
    *,
    running_as: str | None = None,
) -> dict[str, Any]:
    """A job record as the producer writes it (message marked sent); optionally
    already claimed (``running``, token 1) by ``running_as``."""
    text = canonical_json(dict(payload))
    put = table.put_new(
        job_id=job_id,
        job_class=job_class,
        payload_json=text,
        payload_hash=payload_hash(text),
        wall_now=time.time(),
        send_id=bench_send_id(job_id),
    )
    item: dict[str, Any] = dict(put.params["Item"])
    item["message_sent"] = {"BOOL": True}
    item.pop("unsent", None)
    item.pop("unsent_since", None)
    if running_as is not None:
        item.update(
            state={"S": "running"},
            owner={"S": running_as},
            token={"N": "1"},
            attempt={"N": "1"},
        )
    return item


def put_items(ddb: Any, table: str, items: Sequence[Mapping[str, Any]]) -> None:
    """BatchWriteItem in 25s, following UnprocessedItems."""
    for i in range(0, len(items), 25):
        request: dict[str, Any] = {
            table: [{"PutRequest": {"Item": dict(it)}} for it in items[i : i + 25]]
        }
        while request:
            out = ddb.batch_write_item(RequestItems=request)
            request = out.get("UnprocessedItems") or {}


def send_bodies(sqs: Any, queue_url: str, bodies: Sequence[str]) -> None:
    """SendMessageBatch in 10s; raises if any entry failed."""
    for i in range(0, len(bodies), 10):
        entries = [{"Id": str(j), "MessageBody": b} for j, b in enumerate(bodies[i : i + 10])]
        out = sqs.send_message_batch(QueueUrl=queue_url, Entries=entries)
        if out.get("Failed"):
            raise RuntimeError(f"SendMessageBatch failed: {out['Failed'][:1]}")


def bench_send_id(job_id: str) -> str:
    """The send id of a benchmark job's one message (record and body agree)."""
    return f"{job_id}.bench"


def job_bodies(job_ids: Sequence[str], job_class: str) -> list[str]:
    return [message_body(j, job_class, send_id=bench_send_id(j)) for j in job_ids]


def raw_clients(settings: Settings) -> tuple[Any, Any]:
    """Plain boto3 SQS and DynamoDB clients (the library's client settings)."""
    return make_client(settings, "sqs"), make_client(settings, "dynamodb")


class Feeder:
    """Keeps queue depth (sent - done) at most ``depth`` by topping up in batches of 10.

    Its own client, the same for every contender, so its load on moto is equal.
    """

    def __init__(
        self, sqs: Any, queue_url: str, bodies: Sequence[str], depth: int, done: Callable[[], int]
    ) -> None:
        self.sqs, self.queue_url, self.bodies = sqs, queue_url, list(bodies)
        self.depth, self.done = depth, done
        self.sent = 0
        self.max_depth = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="feeder", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set() and self.sent < len(self.bodies):
            room = self.depth - (self.sent - self.done())
            if room >= 10 or (room > 0 and len(self.bodies) - self.sent <= room):
                n = min(10, room, len(self.bodies) - self.sent)
                send_bodies(self.sqs, self.queue_url, self.bodies[self.sent : self.sent + n])
                self.sent += n
                self.max_depth = max(self.max_depth, self.sent - self.done())
            else:
                self._stop.wait(0.002)

    def start(self) -> Feeder:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


# --------------------------------------------------------------------------- DynamoDB sizes


def _number_size(text: str) -> int:
    digits = text.lstrip("-").replace(".", "").lstrip("0").rstrip("0") or "0"
    return 1 + math.ceil(len(digits) / 2)


def attribute_size(value: Mapping[str, Any]) -> int:
    """Bytes of one attribute value by DynamoDB's item-size rules."""
    (kind, v), *_ = value.items()
    if kind == "S":
        return len(str(v).encode())
    if kind == "N":
        return _number_size(str(v))
    if kind == "B":
        return len(v) if isinstance(v, bytes | bytearray) else len(str(v))
    if kind in ("BOOL", "NULL"):
        return 1
    if kind in ("SS", "NS", "BS", "L"):
        parts = v if kind != "L" else [attribute_size(x) for x in v]
        return 3 + sum(p if isinstance(p, int) else len(str(p).encode()) for p in parts)
    if kind == "M":
        return 3 + item_size(v)
    return len(str(v))


def item_size(item: Mapping[str, Any]) -> int:
    """An item's size: attribute names plus values (what capacity units are billed on)."""
    return sum(len(k.encode()) + attribute_size(v) for k, v in item.items())


def scan_items(ddb: Any, table: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    kw: dict[str, Any] = {"TableName": table}
    while True:
        out = ddb.scan(**kw)
        items.extend(out.get("Items", []))
        if not out.get("LastEvaluatedKey"):
            return items
        kw["ExclusiveStartKey"] = out["LastEvaluatedKey"]


def wcu(size: int) -> int:
    """Write capacity units of one write of an item of ``size`` bytes (1 KB steps)."""
    return max(1, math.ceil(size / 1024))


def rcu_consistent(size: int) -> int:
    """Read capacity units of one strongly consistent read (4 KB steps)."""
    return max(1, math.ceil(size / 4096))


# --------------------------------------------------------------------------- reporting


def machine() -> dict[str, Any]:
    def version(name: str) -> str:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return "not installed"

    return {
        "nproc": os.cpu_count(),
        "python": platform.python_version(),
        "platform": f"{platform.system()} {platform.machine()}",
        "moto": version("moto"),
        "boto3": version("boto3"),
        "aiobotocore": version("aiobotocore"),
    }


def load_average() -> float:
    try:
        return os.getloadavg()[0]
    except OSError:
        return math.nan


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else math.nan


def ratio(a: float, b: float) -> float:
    return a / b if b else math.nan


def fmt(x: Any, digits: int = 2) -> str:
    if isinstance(x, float):
        if math.isnan(x):
            return "n/a"
        if abs(x) >= 100:
            return f"{x:,.0f}"
        return f"{x:.{digits}f}"
    return str(x)


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(fmt(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def wait_until(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"benchmark: timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.01)
