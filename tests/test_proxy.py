"""FaultProxy against loopback echo/HTTP servers (and botocore -> moto when installed)."""

from __future__ import annotations

import http.client
import http.server
import re
import socket
import socketserver
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
# `infra` is not an installed package; `python -m pytest` finds it via the cwd,
# bare `pytest` does not.
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from infra.proxy import FaultProxy  # noqa: E402

pytestmark = pytest.mark.fault


class _EchoServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _EchoHandler)
        self._lock = threading.Lock()
        self._received = bytearray()

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    @property
    def received(self) -> bytes:
        with self._lock:
            return bytes(self._received)

    def record(self, data: bytes) -> None:
        with self._lock:
            self._received += data


class _EchoHandler(socketserver.BaseRequestHandler):
    server: _EchoServer

    def handle(self) -> None:
        sock = self.request
        assert isinstance(sock, socket.socket)
        sock.settimeout(5)
        while True:
            try:
                data = sock.recv(65536)
                if not data:
                    return
                self.server.record(data)
                sock.sendall(data)
            except OSError:
                return


class _HttpHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive
    disable_nagle_algorithm = True  # else each response stalls ~40 ms on delayed ACKs

    def do_GET(self) -> None:
        body = self.path.encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def echo() -> Iterator[_EchoServer]:
    server = _EchoServer()
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.fixture
def proxy(echo: _EchoServer) -> Iterator[FaultProxy]:
    with FaultProxy("127.0.0.1", echo.port) as p:
        yield p


def _connect(port: int, timeout: float = 2.0) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=timeout)


def _roundtrip(sock: socket.socket, payload: bytes) -> bytes:
    sock.sendall(payload)
    buf = b""
    while len(buf) < len(payload):
        chunk = sock.recv(65536)
        if not chunk:
            break
        buf += chunk
    return buf


def _is_closed(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except ConnectionError:
        return True


def _wait_for(pred: Callable[[], bool], timeout: float = 2.0) -> bool:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def _proxy_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("FaultProxy")]


@pytest.mark.parametrize(
    ("upstream", "listen"),
    [
        ("10.0.0.1", "127.0.0.1"),
        ("8.8.8.8", "127.0.0.1"),
        ("example.com", "127.0.0.1"),
        ("::1", "127.0.0.1"),
        ("0.0.0.0", "127.0.0.1"),
        ("127.0.0.1", "0.0.0.0"),
        ("127.0.0.1", "192.168.1.10"),
    ],
)
def test_refuses_non_loopback_hosts(upstream: str, listen: str) -> None:
    with pytest.raises(ValueError):
        FaultProxy(upstream, 5000, listen_host=listen)


def test_accepts_whole_loopback_range() -> None:
    assert FaultProxy("127.0.0.2", 5000, listen_host="localhost").host == "127.0.0.1"


def test_rejects_bad_arguments(proxy: FaultProxy) -> None:
    with pytest.raises(ValueError):
        proxy.set_latency(-1.0)
    with pytest.raises(ValueError):
        proxy.cut("partial")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        proxy.cut_one_way("sideways")  # type: ignore[arg-type]


def test_forwards_and_counts(proxy: FaultProxy, echo: _EchoServer) -> None:
    assert proxy.url == f"http://127.0.0.1:{proxy.port}"
    with _connect(proxy.port) as sock:
        assert _roundtrip(sock, b"hello") == b"hello"
        big = bytes(range(256)) * 4096  # 1 MiB: exercises partial sends and backpressure
        assert _roundtrip(sock, big) == big
    # Counters are bumped after send() returns, so the client can be a hair ahead.
    total = 5 + len(big)
    assert _wait_for(lambda: proxy.stats.bytes_down == total and proxy.stats.active == 0)
    stats = proxy.stats
    assert (stats.accepted, stats.bytes_up, stats.chunks_dropped) == (1, total, 0)


def test_half_close_is_forwarded(proxy: FaultProxy) -> None:
    with _connect(proxy.port) as sock:
        sock.sendall(b"last words")
        sock.shutdown(socket.SHUT_WR)
        # The echo server sees EOF only if the proxy forwarded our FIN.
        assert sock.recv(100) == b"last words"
        assert sock.recv(100) == b""


def test_many_keepalive_http_connections_and_no_thread_leak() -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _HttpHandler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        proxy = FaultProxy("127.0.0.1", int(server.server_address[1])).start()
        assert len(_proxy_threads()) == 1

        def worker(n: int) -> int:
            conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=5)
            try:
                for i in range(10):
                    conn.request("GET", f"/w{n}/r{i}")
                    resp = conn.getresponse()
                    assert resp.status == 200
                    assert resp.read() == f"/w{n}/r{i}".encode()
            finally:
                conn.close()
            return n

        with ThreadPoolExecutor(32) as pool:
            assert sorted(pool.map(worker, range(32))) == list(range(32))
        # One TCP connection per worker proves keep-alive reuse through the proxy.
        assert proxy.stats.accepted == 32
        proxy.stop()
        proxy.stop()  # idempotent
        assert _proxy_threads() == []
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_cut_blackhole_times_out_and_heal_restores(proxy: FaultProxy, echo: _EchoServer) -> None:
    old = _connect(proxy.port, timeout=1.0)
    assert _roundtrip(old, b"ping") == b"ping"

    proxy.cut()
    with pytest.raises(TimeoutError):
        _roundtrip(old, b"lost-on-old")
    # New connections are accepted (connect succeeds) but go nowhere.
    new = _connect(proxy.port, timeout=0.5)
    with pytest.raises(TimeoutError):
        _roundtrip(new, b"lost-on-new")
    assert echo.received == b"ping"
    assert _wait_for(lambda: proxy.stats.chunks_dropped >= 2)

    proxy.heal()
    # Black-holed connections are closed at heal so clients reconnect.
    assert _is_closed(old)
    assert _is_closed(new)
    with _connect(proxy.port) as sock:
        assert _roundtrip(sock, b"back") == b"back"
    old.close()
    new.close()


def test_cut_reset_gives_connection_error_and_heal_restores(proxy: FaultProxy) -> None:
    old = _connect(proxy.port)
    assert _roundtrip(old, b"ping") == b"ping"

    proxy.cut("reset")
    with pytest.raises(ConnectionError):
        old.recv(1)
    with pytest.raises(ConnectionError), _connect(proxy.port) as sock:
        _roundtrip(sock, b"refused")
    assert _wait_for(lambda: proxy.stats.resets >= 2)

    proxy.heal()
    with _connect(proxy.port) as sock:
        assert _roundtrip(sock, b"back") == b"back"
    old.close()


def test_upstream_down_resets_client_and_proxy_survives() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        dead_port = probe.getsockname()[1]  # bound but not listening: connects are refused
        with FaultProxy("127.0.0.1", dead_port) as proxy:
            for _ in range(3):
                with pytest.raises(ConnectionError), _connect(proxy.port) as sock:
                    _roundtrip(sock, b"anyone?")
            assert _wait_for(lambda: proxy.stats.accepted == 3 and proxy.stats.active == 0)


def test_latency_adds_at_least_configured_delay(proxy: FaultProxy) -> None:
    delay = 0.2
    with _connect(proxy.port) as sock:
        assert _roundtrip(sock, b"warm") == b"warm"
        proxy.set_latency(delay)
        start = time.monotonic()
        assert _roundtrip(sock, b"slow") == b"slow"
        # Delay applies once per direction. Lower bound only: the machine is noisy.
        assert time.monotonic() - start >= 2 * delay


def test_one_way_down_applies_request_but_loses_response(
    proxy: FaultProxy, echo: _EchoServer
) -> None:
    proxy.cut_one_way("down")
    sock = _connect(proxy.port, timeout=0.5)
    sock.sendall(b"apply-me")
    assert _wait_for(lambda: echo.received == b"apply-me")
    with pytest.raises(TimeoutError):
        sock.recv(100)
    assert _wait_for(lambda: proxy.stats.chunks_dropped >= 1)

    proxy.heal()
    # The stream lost a response, so it is reset rather than resumed.
    assert _is_closed(sock)
    sock.close()
    with _connect(proxy.port) as fresh:
        assert _roundtrip(fresh, b"ok") == b"ok"


def test_one_way_up_never_reaches_upstream(proxy: FaultProxy, echo: _EchoServer) -> None:
    proxy.cut_one_way("up")
    with _connect(proxy.port, timeout=0.3) as sock:
        sock.sendall(b"never")
        with pytest.raises(TimeoutError):
            sock.recv(100)
    assert echo.received == b""
    assert proxy.stats.accepted == 1  # the upstream connection itself was still made


@pytest.mark.timeout(120)
def test_cli_controls_proxy_over_stdin(echo: _EchoServer) -> None:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "infra.proxy",
            "--upstream",
            f"127.0.0.1:{echo.port}",
            "--listen",
            "127.0.0.1:0",
        ],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdin is not None
    assert proc.stdout is not None
    stdin, stdout = proc.stdin, proc.stdout

    def cmd(line: str) -> str:
        stdin.write(line + "\n")
        stdin.flush()
        return stdout.readline().strip()

    try:
        match = re.fullmatch(r"listening 127\.0\.0\.1:(\d+)", stdout.readline().strip())
        assert match is not None
        port = int(match.group(1))
        with _connect(port) as sock:
            assert _roundtrip(sock, b"via-cli") == b"via-cli"

        assert cmd("cut reset") == "ok cut reset"
        with pytest.raises(ConnectionError), _connect(port) as sock:
            _roundtrip(sock, b"x")
        assert cmd("heal") == "ok heal"
        with _connect(port) as sock:
            assert _roundtrip(sock, b"healed") == b"healed"

        assert cmd("cut") == "ok cut blackhole"
        with _connect(port, timeout=0.3) as sock, pytest.raises(TimeoutError):
            _roundtrip(sock, b"x")
        assert cmd("heal") == "ok heal"
        assert cmd("cut up") == "ok cut up"
        assert cmd("cut down") == "ok cut down"
        assert cmd("heal") == "ok heal"
        assert cmd("latency 0.05") == "ok latency 0.05"
        assert cmd("latency -1").startswith("err ")
        assert cmd("bogus").startswith("err ")

        stats = cmd("stats")
        assert stats.startswith("ok ")
        fields = dict(kv.split("=") for kv in stats.removeprefix("ok ").split())
        assert int(fields["accepted"]) == 4
        assert int(fields["bytes_up"]) >= len(b"via-cli" + b"healed")
        assert int(fields["resets"]) >= 1

        assert cmd("quit") == "ok quit"
        assert proc.wait(timeout=5) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        stdin.close()
        stdout.close()


@pytest.mark.timeout(180)
def test_botocore_to_moto_through_proxy() -> None:
    """Real botocore -> moto traffic: concurrency, partition and lost response."""
    moto_server = pytest.importorskip("moto.server")
    boto3 = pytest.importorskip("boto3")
    from botocore.config import Config
    from botocore.exceptions import ConnectionClosedError, EndpointConnectionError, ReadTimeoutError

    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        _host, moto_port = server.get_host_and_port()
        with FaultProxy("127.0.0.1", moto_port) as proxy:

            def client(read_timeout: float) -> Any:
                return boto3.client(
                    "sqs",
                    endpoint_url=proxy.url,
                    region_name="us-east-1",
                    aws_access_key_id="testing",
                    aws_secret_access_key="testing",
                    config=Config(
                        max_pool_connections=16,
                        connect_timeout=1,
                        read_timeout=read_timeout,
                        retries={"total_max_attempts": 1},  # surface faults, don't retry them
                    ),
                )

            # Generous timeout for healthy calls (the box may be loaded); short for faults.
            sqs, impatient = client(10), client(1)
            queue_url = sqs.create_queue(QueueName="proxy-test")["QueueUrl"]
            with ThreadPoolExecutor(16) as pool:
                ids = list(
                    pool.map(
                        lambda i: sqs.send_message(QueueUrl=queue_url, MessageBody=str(i))[
                            "MessageId"
                        ],
                        range(64),
                    )
                )
            assert len(set(ids)) == 64
            # moto's dev server answers `Connection: close`, so each request is a fresh
            # connection here; what matters is that none are left behind.
            assert proxy.stats.accepted >= 65
            assert _wait_for(lambda: proxy.stats.active == 0, timeout=5)

            def depth() -> int:
                attrs = sqs.get_queue_attributes(
                    QueueUrl=queue_url, AttributeNames=["ApproximateNumberOfMessages"]
                )["Attributes"]
                return int(attrs["ApproximateNumberOfMessages"])

            proxy.cut_one_way("down")
            with pytest.raises(ReadTimeoutError):
                impatient.send_message(QueueUrl=queue_url, MessageBody="applied-but-unacked")
            # A dropped response chunk means moto already answered, i.e. applied it.
            assert _wait_for(lambda: proxy.stats.chunks_dropped >= 1, timeout=10)
            proxy.heal()
            assert depth() == 65  # the request was applied even though the client saw a timeout

            proxy.cut("reset")
            with pytest.raises((ConnectionClosedError, EndpointConnectionError)):
                impatient.list_queues()
            proxy.heal()
            assert depth() == 65
    finally:
        server.stop()
