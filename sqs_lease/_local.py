"""Local AWS emulation: moto's HTTP server on 127.0.0.1, in a thread or a child process.

``moto`` is optional (extra ``local``) and imported only when a server starts.

Run a server in the foreground::

    python -m sqs_lease._local [--port N]    # prints "endpoint http://127.0.0.1:PORT"
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import functools
import importlib.util
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import Any

from sqs_lease._errors import AwsUnavailable, ConfigError, SqsLeaseError

__all__ = [
    "HOST",
    "START_TIMEOUT_SECONDS",
    "LocalAws",
    "local_credentials_env",
    "main",
    "spawn_local_server",
    "stop_local_server",
]

HOST = "127.0.0.1"
"""The only address the emulator ever binds: it has no auth, so never expose it."""

START_TIMEOUT_SECONDS = 120.0
"""How long a start may take before it counts as hung. A hang guard, not a speed
check: importing moto alone takes ten seconds and more on a busy 2-core machine."""

_ENDPOINT_PREFIX = "endpoint "
_INSTALL_HINT = "the local AWS emulator needs moto: pip install 'sqs-lease[local]'"


def local_credentials_env() -> dict[str, str]:
    """Dummy credentials and region for talking to moto; use only with a local endpoint."""
    return {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        # Overwrite any real session token: paired with dummy keys it would only confuse.
        "AWS_SESSION_TOKEN": "testing",
        "AWS_DEFAULT_REGION": os.environ.get("AWS_DEFAULT_REGION") or "us-east-1",
    }


def _threaded_moto_server_cls() -> Any:
    try:
        from moto.server import ThreadedMotoServer
    except ImportError as exc:
        raise ConfigError(_INSTALL_HINT) from exc
    return ThreadedMotoServer


def _check_port_free(port: int) -> None:
    # Match the server's SO_REUSEADDR so a port in TIME_WAIT does not count as taken.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((HOST, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise ConfigError(
                    f"port {port} on {HOST} is in use; pick a free one with port 0 (CLI: --port 0)"
                ) from exc
            raise


def _wait_until_answering(endpoint_url: str, deadline: float) -> None:
    # Bypass *_PROXY settings: a proxy must never see, or break, loopback traffic.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            with opener.open(f"{endpoint_url}/moto-api/", timeout=1.0) as resp:
                resp.read()
                return
        except (urllib.error.URLError, OSError) as exc:
            last_error = exc
            time.sleep(0.05)
    raise AwsUnavailable(f"local AWS emulator at {endpoint_url} did not answer: {last_error}")


_SERIALISED = threading.Lock()
_serialised_installed = False


def serialise_dynamodb() -> None:
    """Make this process's moto apply DynamoDB requests one at a time (idempotent).

    moto's TransactWriteItems snapshots the tables it touches and, when the
    transaction is cancelled, puts the snapshots back: a write another request
    thread made in between is silently lost (measured by the chaos runs: 2 of
    300 concurrent items vanished next to cancelled transactions). AWS applies
    conditional writes per item, in order; the local default must not lose
    writes, since cancelled transactions are routine in this protocol.
    """
    global _serialised_installed
    if _serialised_installed:
        return
    from moto.dynamodb.responses import DynamoHandler

    original = DynamoHandler.call_action

    def call_action(self: Any) -> Any:
        with _SERIALISED:
            return original(self)

    DynamoHandler.call_action = call_action  # type: ignore[method-assign]
    _serialised_installed = True


_memo_installed = False


def memoise_update_expressions() -> None:
    """Make this process's moto parse each distinct UpdateExpression once (idempotent).

    moto tokenises and parses an UpdateExpression twice per request (once to
    check the names and values it uses, once to apply it) and most of an
    update's CPU goes there; a protocol sends the same few expressions over
    and over. Every caller only reads the parsed tree (moto's validator
    deep-copies it before it substitutes values), so one tree per distinct
    text serves them all. An expression moto cannot parse raises each time,
    as before: errors are never cached.
    """
    global _memo_installed
    if _memo_installed:
        return
    from moto.dynamodb.parsing.expressions import (  # type: ignore[attr-defined]
        UpdateExpressionParser,
    )

    parse = UpdateExpressionParser.make  # bound to the class: takes the text alone
    UpdateExpressionParser.make = staticmethod(functools.lru_cache(maxsize=1024)(parse))
    _memo_installed = True


class LocalAws:
    """moto's ``ThreadedMotoServer`` in a daemon thread of this process, on 127.0.0.1.

    ``port=0`` (the default) lets the kernel pick a free port at bind time, so
    there is no window in which another process can take it. DynamoDB requests
    are applied one at a time unless ``serial_dynamodb=False`` (see
    :func:`serialise_dynamodb`), and each distinct update expression is parsed
    once (see :func:`memoise_update_expressions`).
    """

    def __init__(
        self,
        port: int = 0,
        *,
        start_timeout: float = START_TIMEOUT_SECONDS,
        quiet: bool = True,
        serial_dynamodb: bool = True,
    ) -> None:
        self._serial_dynamodb = serial_dynamodb
        self._requested_port = port
        self._start_timeout = start_timeout
        self._quiet = quiet
        self._server: Any = None  # moto.server.ThreadedMotoServer (moto is untyped)
        self._port: int | None = None

    @property
    def endpoint_url(self) -> str:
        """``http://127.0.0.1:PORT``; only valid while started."""
        if self._port is None:
            raise RuntimeError("LocalAws is not started")
        return f"http://{HOST}:{self._port}"

    @property
    def port(self) -> int:
        """The bound port; only valid while started."""
        if self._port is None:
            raise RuntimeError("LocalAws is not started")
        return self._port

    def start(self) -> LocalAws:
        """Bind, serve, and return once the server answers HTTP (at most ``start_timeout``)."""
        if self._server is not None:
            raise RuntimeError("LocalAws is already started")
        server_cls = _threaded_moto_server_cls()
        if self._serial_dynamodb:
            serialise_dynamodb()
        memoise_update_expressions()
        if self._requested_port:
            _check_port_free(self._requested_port)
        if self._quiet:
            # werkzeug logs every request to stderr unless the application configured it.
            wz_logger = logging.getLogger("werkzeug")
            if wz_logger.level == logging.NOTSET:
                wz_logger.setLevel(logging.WARNING)

        deadline = time.monotonic() + self._start_timeout
        server = server_cls(HOST, self._requested_port, verbose=False)
        # ThreadedMotoServer.start() waits forever if its thread fails to bind
        # (e.g. a port taken after the check above); bound the wait from outside.
        starter = threading.Thread(target=server.start, name="sqs-lease-moto-start", daemon=True)
        starter.start()
        starter.join(self._start_timeout)
        if starter.is_alive():
            raise AwsUnavailable(
                f"local AWS emulator did not bind {HOST}:{self._requested_port} "
                f"within {self._start_timeout:g} s"
            )
        _host, port = server.get_host_and_port()
        self._server = server
        self._port = int(port)
        try:
            _wait_until_answering(self.endpoint_url, deadline)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Shut the server down and join its thread (takes up to ~0.5 s); idempotent."""
        server, self._server, self._port = self._server, None, None
        if server is not None:
            server.stop()

    def __enter__(self) -> LocalAws:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def _package_root() -> str:
    return str(Path(__file__).resolve().parent.parent)


def _read_endpoint_line(proc: subprocess.Popen[str], timeout: float) -> str:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    if not ready:
        raise AwsUnavailable(f"local AWS emulator process did not start within {timeout:g} s")
    # The child writes the whole line in one flushed write, so readline() cannot stall here.
    line = proc.stdout.readline()
    if not line:
        code = proc.wait(timeout=timeout)
        raise AwsUnavailable(
            f"local AWS emulator process exited with code {code} before it started; see its stderr"
        )
    if not line.startswith(_ENDPOINT_PREFIX):
        raise AwsUnavailable(f"local AWS emulator process printed {line!r}, expected an endpoint")
    return line[len(_ENDPOINT_PREFIX) :].strip()


def spawn_local_server(
    port: int = 0, *, timeout: float = START_TIMEOUT_SECONDS, serial_dynamodb: bool = True
) -> tuple[subprocess.Popen[str], str]:
    """Start ``python -m sqs_lease._local`` as a child process; return it and its endpoint URL.

    A separate process keeps the emulator running (and off this process's GIL)
    while tests pause or signal workers. The child exits on SIGTERM/SIGINT, and
    also when this process dies (its stdin pipe closes), so it never outlives
    the caller. Its stderr is inherited. Stop it with :func:`stop_local_server`.
    """
    if importlib.util.find_spec("moto") is None:
        raise ConfigError(_INSTALL_HINT)
    env = dict(os.environ)
    # Importable even when the package is used from a checkout without installing it.
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (_package_root(), env.get("PYTHONPATH", "")) if p
    )
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sqs_lease._local",
            "--port",
            str(port),
            "--managed",
            *([] if serial_dynamodb else ["--plain-dynamodb"]),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        # Own session: a Ctrl-C or killpg aimed at the tests' process group must not
        # take the emulator down before the tests' own teardown has run.
        start_new_session=True,
    )
    try:
        endpoint = _read_endpoint_line(proc, timeout)
        if not endpoint.startswith(f"http://{HOST}:"):
            raise AwsUnavailable(f"local AWS emulator reported endpoint {endpoint!r}")
    except BaseException:
        stop_local_server(proc)
        raise
    return proc, endpoint


def stop_local_server(proc: subprocess.Popen[str], timeout: float = 5.0) -> int:
    """SIGTERM a process from :func:`spawn_local_server`, SIGKILL after ``timeout``; exit code."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    for stream in (proc.stdin, proc.stdout):
        if stream is not None:
            with contextlib.suppress(OSError):
                stream.close()
    assert proc.returncode is not None
    return proc.returncode


def _exit_when_stdin_closes(stop: threading.Event) -> None:
    # os.read, not sys.stdin: a daemon thread blocked inside a buffered reader
    # holds its lock and aborts interpreter shutdown.
    with contextlib.suppress(OSError):
        while os.read(0, 4096):
            pass
    stop.set()


def main(argv: Sequence[str] | None = None) -> int:
    """Run an emulator in the foreground until SIGTERM/SIGINT."""
    parser = argparse.ArgumentParser(
        prog="python -m sqs_lease._local",
        description=f"Run moto (SQS, DynamoDB, ...) on {HOST}; prints 'endpoint URL'.",
    )
    parser.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (0: pick one)")
    # Set by spawn_local_server: exit when the parent's stdin pipe closes, and
    # keep stdout to the one endpoint line the parent reads.
    parser.add_argument("--managed", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument(
        "--plain-dynamodb",
        action="store_true",
        help="let moto apply DynamoDB requests concurrently (it can lose writes)",
    )
    args = parser.parse_args(argv)

    stop = threading.Event()

    def _on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    # Installed before start so a signal during startup also ends in a clean stop.
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)

    try:
        local = LocalAws(args.port, serial_dynamodb=not args.plain_dynamodb).start()
    except SqsLeaseError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        print(f"{_ENDPOINT_PREFIX}{local.endpoint_url}", flush=True)
        if args.managed:
            # Nobody reads the pipe after the first line; stray output must not fill it.
            os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
            threading.Thread(
                target=_exit_when_stdin_closes, args=(stop,), name="stdin-watch", daemon=True
            ).start()
        while not stop.wait(1.0):
            pass
    finally:
        local.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
