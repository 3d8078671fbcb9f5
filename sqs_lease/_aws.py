"""The sync driver: boto3 clients and the loop that runs a flow against them.

This is the boundary where botocore's exceptions become outcome values; nothing
above it sees a botocore type.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import boto3
import botocore.config
import botocore.exceptions
from botocore import xform_name

from ._clock import lease_clock
from ._config import Settings, is_local_url
from ._core.calls import (
    Call,
    Emit,
    Err,
    ErrorKind,
    Flow,
    Instruction,
    Invoke,
    Ok,
    Outcome,
    Sleep,
    raised,
    sqs_code_is,
)
from ._errors import AwsUnavailable
from ._journal import Journal

T = TypeVar("T")

CallObserver = Callable[[Call, Outcome], float | None]
"""Sees each AWS call and its outcome (both drivers); returns seconds to pause
before the flow goes on, or None. It never changes what the flow is told."""

_NOT_FOUND = ("ResourceNotFoundException", "QueueDoesNotExist", "TableNotFoundException")
_THROTTLED = (
    "ThrottlingException",
    "ProvisionedThroughputExceededException",
    "RequestLimitExceeded",
    "Throttling",
    "RequestThrottled",
    "OverLimit",  # SQS: a receive while the queue's in-flight limit is reached
)
_VALIDATION = ("ValidationException",)
_UNREACHABLE = (
    botocore.exceptions.EndpointConnectionError,
    botocore.exceptions.ConnectionClosedError,
    botocore.exceptions.ConnectTimeoutError,
    botocore.exceptions.ReadTimeoutError,
    botocore.exceptions.ProxyConnectionError,
    botocore.exceptions.HTTPClientError,
)


def classify(
    exc: BaseException, sent_at: float, received_at: float, *, where: str | None = None
) -> Err:
    """Turn a botocore exception into an outcome value (shared with the async driver).

    ``where`` names the service and endpoint the call went to (see
    :func:`endpoint_of`) for the one error raised here, missing credentials.
    """
    if isinstance(exc, botocore.exceptions.ClientError):
        resp: dict[str, Any] = dict(exc.response)
        error = resp.get("Error", {})
        code = str(error.get("Code", ""))
        query = str(error.get("QueryErrorCode", ""))
        status = int(resp.get("ResponseMetadata", {}).get("HTTPStatusCode", 400) or 400)
        item = resp.get("Item")
        reasons = tuple(resp.get("CancellationReasons") or ())
        if code == "ConditionalCheckFailedException":
            kind = ErrorKind.CONDITION_FAILED
        elif code == "TransactionCanceledException":
            kind = ErrorKind.TRANSACTION_CANCELLED
        elif code in _NOT_FOUND or sqs_code_is("QueueDoesNotExist", code, query):
            kind = ErrorKind.NOT_FOUND
        elif code in _THROTTLED or query in _THROTTLED:
            kind = ErrorKind.THROTTLED
        elif status >= 500:
            kind = ErrorKind.SERVER
        elif code in _VALIDATION or query in _VALIDATION:
            # DynamoDB's answer for a request that can never succeed as sent (item or
            # key size, a malformed value, an update on an attribute the item lacks):
            # permanent for that job, never "ownership unknown".
            kind = ErrorKind.VALIDATION
        else:
            kind = ErrorKind.INVALID
        meta = resp.get("ResponseMetadata", {})
        request_id = str(
            meta.get("RequestId") or meta.get("HTTPHeaders", {}).get("x-amzn-requestid", "")
        )
        return Err(
            kind,
            code,
            query,
            str(error.get("Message", "")),
            item,
            reasons,
            sent_at,
            received_at,
            request_id=request_id,
        )
    if isinstance(exc, botocore.exceptions.NoCredentialsError):
        raise AwsUnavailable(
            f"no AWS credentials for {where or 'AWS'}: set AWS_PROFILE or "
            "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY (or point AWS_ENDPOINT_URL, or "
            "AWS_ENDPOINT_URL_SQS / AWS_ENDPOINT_URL_DYNAMODB, at the local emulator)"
        ) from None
    if isinstance(exc, _UNREACHABLE):
        return Err(
            ErrorKind.UNREACHABLE, type(exc).__name__, "", str(exc), None, (), sent_at, received_at
        )
    raise exc


@dataclass(frozen=True)
class Timeouts:
    """Client timeouts; a heartbeat call must give up well inside the lease reserve."""

    connect: float = 2.0
    read: float = 5.0
    attempts: int = 2


def endpoint_of(client: Any) -> str:
    """The service, the endpoint a client really talks to and its region, for error
    messages: ``SQS at http://127.0.0.1:5000 (region us-east-1)``. The region is named
    even with an endpoint of one's own: an emulator keeps each region apart, as AWS
    does, so a wrong one reads as "does not exist" there too."""
    model = client.meta.service_model
    name = {"sqs": "SQS", "dynamodb": "DynamoDB"}.get(model.service_name, model.service_name)
    return f"{name} at {client.meta.endpoint_url} (region {client.meta.region_name})"


def client_kwargs(settings: Settings, service: str) -> dict[str, Any]:
    """Endpoint, region and (for a local emulator only) dummy credentials for ``service``."""
    kw: dict[str, Any] = {"region_name": settings.region}
    endpoint = settings.endpoint_for(service)
    if endpoint:
        kw["endpoint_url"] = endpoint
    if is_local_url(endpoint):
        kw.update(_local_credentials())
    return kw


def _local_credentials() -> dict[str, str]:
    # moto wants some credentials, and has no use for real ones: supply dummies
    # only when the chain finds none, so a configured profile still works.
    with _SESSION_LOCK:
        missing = _shared_session().get_credentials() is None
    return {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"} if missing else {}


_SESSION_LOCK = threading.Lock()
_SESSIONS: dict[int, Any] = {}


def _shared_session() -> Any:
    """One boto3 session per process (call with ``_SESSION_LOCK`` held).

    A new session re-reads every service model (about 0.1 s a client: eight of
    them made a worker start in a second), and a session is not thread-safe, so
    every use goes through the lock. A forked child gets a session of its own.
    """
    pid = os.getpid()
    if pid not in _SESSIONS:
        _SESSIONS.clear()
        _SESSIONS[pid] = boto3.session.Session()
    return _SESSIONS[pid]


def client_config(timeouts: Timeouts, *, pool: int) -> botocore.config.Config:
    """What every client of either driver is made with: the timeouts, botocore's
    standard retries within ``timeouts.attempts``, and ``pool`` connections."""
    return botocore.config.Config(
        connect_timeout=timeouts.connect,
        read_timeout=timeouts.read,
        retries={"total_max_attempts": timeouts.attempts, "mode": "standard"},
        max_pool_connections=pool,
    )


def make_client(settings: Settings, service: str, timeouts: Timeouts = Timeouts()) -> Any:
    config = client_config(timeouts, pool=50)
    kwargs = client_kwargs(settings, service)
    with _SESSION_LOCK:
        client = _shared_session().client(service, config=config, **kwargs)
    if "endpoint_url" not in kwargs and is_local_url(client.meta.endpoint_url):
        # boto3 found a loopback endpoint the settings do not name (its own
        # AWS_ENDPOINT_URL_* variables, or its config file): it is an emulator too.
        creds = _local_credentials()
        if creds:
            with _SESSION_LOCK:
                client = _shared_session().client(service, config=config, **kwargs, **creds)
    return client


class DriverBase:
    """What the sync and async drivers share; each keeps only its own way to wait
    (a call, a sleep, caller code)."""

    clients: dict[str, Any]
    clock: Callable[[], float]
    journal: Journal
    observers: list[CallObserver]

    def _failed(self, c: Call, exc: Exception, sent: float) -> Err:
        """A call's exception as its outcome (:func:`classify`)."""
        return classify(exc, sent, self.clock(), where=endpoint_of(self.clients[c.service]))

    def _pauses(self, c: Call, outcome: Outcome) -> Iterator[float]:
        """Show the call's outcome to each observer in turn; yield each pause one asks
        for (the driver waits it out before the next observer sees the outcome)."""
        for observe in self.observers:
            pause = observe(c, outcome)
            if pause:
                yield pause

    def _past_emits(self, flow: Flow[Any], instruction: Instruction) -> Call | Sleep | Invoke:
        """Journal each Emit the flow yields from ``instruction`` on; return the first
        instruction the driver must wait on (the flow's StopIteration passes through)."""
        while isinstance(instruction, Emit):
            self.journal.write(instruction.event, instruction.fields)
            instruction = flow.send(None)
        return instruction


class SyncDriver(DriverBase):
    """Runs flows with boto3 clients; one per thread is not needed (clients are thread-safe)."""

    def __init__(
        self,
        settings: Settings,
        journal: Journal | None = None,
        timeouts: Timeouts = Timeouts(),
        clock: Callable[[], float] = lease_clock,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.settings = settings
        self.journal = journal or Journal()
        self.clock = clock
        self.sleep = sleep
        self.clients: dict[str, Any] = {
            "sqs": make_client(settings, "sqs", timeouts),
            "dynamodb": make_client(settings, "dynamodb", timeouts),
        }
        self.calls = 0
        # Watchers of every AWS call's outcome (the container entry point's
        # lost-AWS monitor); they see outcomes, never steer a flow, and may ask
        # for a pause before the flow goes on (seconds; the driver sleeps it).
        self.observers: list[CallObserver] = []

    def execute(self, c: Call) -> Outcome:
        method = getattr(self.clients[c.service], xform_name(c.op))
        sent = self.clock()
        outcome: Outcome
        try:
            outcome = Ok(method(**c.params), sent, self.clock())
        except Exception as exc:
            outcome = self._failed(c, exc, sent)
        finally:
            self.calls += 1
        for pause in self._pauses(c, outcome):
            self.sleep(pause)
        return outcome

    def invoke(self, inv: Invoke) -> Outcome:
        """Run caller code for a flow; its exception becomes an outcome value."""
        start = self.clock()
        try:
            value = inv.fn()
        except Exception as exc:
            return raised(exc, start, self.clock())
        return Ok({"value": value}, start, self.clock())

    def run(self, flow: Flow[T]) -> T:
        """Drive a flow to its end and return its result."""
        try:
            instruction = self._past_emits(flow, next(flow))
            while True:
                outcome: Outcome
                if isinstance(instruction, Invoke):
                    outcome = self.invoke(instruction)
                elif isinstance(instruction, Sleep):
                    start = self.clock()
                    self.sleep(instruction.seconds)
                    outcome = Ok({}, start, self.clock())
                else:
                    outcome = self.execute(instruction)
                instruction = self._past_emits(flow, flow.send(outcome))
        except StopIteration as stop:
            result: T = stop.value
            return result
