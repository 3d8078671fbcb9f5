"""Shared fixtures: one moto server process per session, unique names per test."""

from __future__ import annotations

import ipaddress
import os
import signal
import socket
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import boto3
import pytest

from sqs_lease._local import local_credentials_env, spawn_local_server, stop_local_server

if TYPE_CHECKING:
    from types_boto3_dynamodb import DynamoDBClient
    from types_boto3_sqs import SQSClient

# The public testing kit's fixtures (lease_endpoint, lease_env, fenced_target): the
# project tests its users' way too (tests/test_testing_kit.py).
pytest_plugins = ["sqs_lease.testing.pytest_plugin"]

REGION = "us-east-1"
_LOOPBACK = ("127.0.0.1", "localhost")


@dataclass(frozen=True)
class AwsTestEnv:
    """Where a test's AWS lives, and the prefix its queue and table names must start with."""

    endpoint_url: str
    prefix: str


def _no_proxy_with_loopback(current: str | None) -> str:
    names = [n.strip() for n in (current or "").split(",") if n.strip()]
    return ",".join(names + [h for h in _LOOPBACK if h not in names])


class OffLoopbackConnect(RuntimeError):
    """A test process tried to open a connection beyond 127.0.0.0/8 (or ::1)."""


def _loopback_only(address: object) -> None:
    host = address[0] if isinstance(address, tuple) else None
    if host is None:
        return  # a Unix socket
    try:
        ip = ipaddress.ip_address(str(host).split("%")[0])
    except ValueError:
        raise OffLoopbackConnect(f"connect to unresolved host {host!r}") from None
    if not ip.is_loopback:
        # RuntimeError, not OSError: botocore would read an OSError as "endpoint
        # unreachable" and a test expecting an outage would pass for the wrong reason.
        raise OffLoopbackConnect(
            f"a test tried to reach {host}: tests talk to 127.0.0.0/8 only (an unmocked"
            " client with no endpoint_url goes to the real AWS endpoint)"
        )


def _xdist_group_suffix(item: pytest.Item) -> str | None:
    names = {
        str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
        for mark in item.iter_markers("xdist_group")
    }
    return "@" + "_".join(sorted(names)) if names else None


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Keep ``--dist loadgroup`` grouping: a file marked ``xdist_group`` runs on one worker.

    pytest-xdist tells its scheduler a test's group by appending ``@group`` to the
    node id, through ``item._nodeid``; pytest 9.2 keeps node ids structured
    (``item._id``), so that write no longer lands and every grouped file was spread
    over all workers, building its module fixtures (the wheel and its virtualenv,
    the CDK synthesis, the extra emulators) once per worker (pytest-xdist#1386).
    This appends the suffix where xdist's write did not land, and stops the run if
    neither way takes, rather than silently losing the grouping again.
    """
    if not getattr(config.option, "loadgroup", False):  # set in xdist's workers only
        return
    for item in items:
        suffix = _xdist_group_suffix(item)
        if suffix is None or item.nodeid.endswith(suffix):
            continue
        wanted = item.nodeid + suffix
        if hasattr(item, "_id"):  # pytest >= 9.2 (before it, xdist's own write landed)
            from _pytest.nodeid import NodeId

            item._id = NodeId.parse(wanted)
        if item.nodeid != wanted:
            raise pytest.UsageError(
                f"cannot mark {item.nodeid} with its xdist group {suffix}: this pytest and"
                " pytest-xdist no longer agree on node ids; `make test` relies on the groups"
            )


@pytest.fixture(autouse=True, scope="session")
def _children_start_with_the_default_sigint() -> Iterator[None]:
    """Run the tests' child processes with SIGINT at its default, however pytest was started.

    A shell without job control starts ``cmd &`` with SIGINT ignored, and an ignored
    signal is inherited across exec: a worker started by a Ctrl-C test would then
    keep the ignore (the library leaves a disposition its program chose alone) and
    never stop. A caught signal is reset to the default at exec, so catching it here
    gives every child the default, as on a terminal.
    """
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGINT) is not signal.SIG_IGN
    ):
        yield
        return
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.fixture(autouse=True, scope="session")
def _no_traffic_beyond_loopback() -> Iterator[None]:
    """Refuse, in this process, any TCP connection that leaves the machine."""
    real_connect = socket.socket.connect
    real_connect_ex = socket.socket.connect_ex

    def connect(self: socket.socket, address: object) -> None:
        _loopback_only(address)
        real_connect(self, address)  # type: ignore[arg-type]

    def connect_ex(self: socket.socket, address: object) -> int:
        _loopback_only(address)
        return real_connect_ex(self, address)  # type: ignore[arg-type]

    with pytest.MonkeyPatch.context() as mp:
        # botocore looks for credentials at the instance metadata address when none are set.
        mp.setenv("AWS_EC2_METADATA_DISABLED", "true")
        mp.setattr(socket.socket, "connect", connect)
        mp.setattr(socket.socket, "connect_ex", connect_ex)
        yield


@pytest.fixture(autouse=True)
def _no_inherited_terminal_width(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI takes ``COLUMNS`` as the terminal's width, and pytest-xdist's worker
    processes start with ``COLUMNS=80``: a test of piped output (one row per line)
    would see an 80-column terminal. A test that means a width sets it itself."""
    monkeypatch.delenv("COLUMNS", raising=False)


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    """Endpoint URL of a moto server in its own process, shared by the whole session.

    A separate process keeps it serving while fault tests SIGSTOP workers. Dummy
    credentials and region are set in ``os.environ`` for the session.
    """
    with pytest.MonkeyPatch.context() as mp:
        for name, value in local_credentials_env().items():
            mp.setenv(name, value)
        mp.setenv("AWS_DEFAULT_REGION", REGION)
        # A profile named in the environment (maybe absent here) would win over the keys.
        mp.delenv("AWS_PROFILE", raising=False)
        # botocore honours *_PROXY: loopback calls must never go through a proxy.
        for name in ("NO_PROXY", "no_proxy"):
            mp.setenv(name, _no_proxy_with_loopback(os.environ.get(name)))
        proc, endpoint = spawn_local_server()
        try:
            yield endpoint
        finally:
            stop_local_server(proc)


@pytest.fixture
def aws(moto_endpoint: str) -> AwsTestEnv:
    """The shared endpoint plus a fresh name prefix, so tests never share queues or tables."""
    return AwsTestEnv(endpoint_url=moto_endpoint, prefix=f"t{uuid.uuid4().hex[:10]}")


@pytest.fixture(scope="session")
def sqs_client(moto_endpoint: str) -> SQSClient:
    """A boto3 SQS client on the session's moto server."""
    return boto3.client("sqs", endpoint_url=moto_endpoint, region_name=REGION)


@pytest.fixture(scope="session")
def ddb_client(moto_endpoint: str) -> DynamoDBClient:
    """A boto3 DynamoDB client on the session's moto server."""
    return boto3.client("dynamodb", endpoint_url=moto_endpoint, region_name=REGION)


@pytest.fixture(autouse=True, scope="module")
def _fast_gc_for_simulations(request: pytest.FixtureRequest) -> Iterator[None]:
    """The simulator's own modules run with the collector tuned as its command line
    tunes it (scoped, restored): the package itself never touches it."""
    if not request.module.__name__.startswith("test_sim"):
        yield
        return
    from simtools.cli import tuned_gc

    with tuned_gc():
        yield
