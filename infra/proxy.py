"""Fault-injecting TCP proxy for loopback tests.

Sits between a client (e.g. botocore) and a local server (e.g. moto) and can
partition, reset, delay or one-way-drop traffic at runtime.  All sockets are
served by one selector thread, so hundreds of keep-alive connections cost no
extra threads and ``stop()`` leaves none behind.

CLI, for controlling a proxy that lives in another process::

    python -m infra.proxy --upstream 127.0.0.1:5000 --listen 127.0.0.1:0

prints ``listening 127.0.0.1:PORT`` and then reads one command per stdin line:
``cut``, ``cut reset``, ``cut up``, ``cut down``, ``heal``, ``latency SECONDS``,
``stats``, ``quit``.  Each is answered by one ``ok ...`` line (``err ...`` if
the command is malformed).  EOF on stdin behaves like ``quit``.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import errno
import ipaddress
import logging
import math
import selectors
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Literal, Self

__all__ = ["CutMode", "Direction", "FaultProxy", "ProxyStats", "main"]

log = logging.getLogger(__name__)

CutMode = Literal["blackhole", "reset"]
Direction = Literal["up", "down"]

_LOOPBACK = ipaddress.IPv4Network("127.0.0.0/8")
_RECV_SIZE = 65536
# Stop reading a side once this much is buffered for the other, so a slow
# reader (or a large latency) exerts TCP backpressure instead of growing memory.
_HIGH_WATER = 1 << 20
_CONTROL_TIMEOUT = 10.0
_ACCEPT_BACKOFF = 0.1
# l_onoff=1, l_linger=0: close() sends RST, which is what a "reset" fault must look like.
_LINGER_RST = struct.pack("ii", 1, 0)
_READ = selectors.EVENT_READ
_WRITE = selectors.EVENT_WRITE


def _loopback_host(host: str) -> str:
    """Return ``host`` as an IPv4 literal; ValueError unless it is in 127.0.0.0/8."""
    # No DNS: a resolver (or /etc/hosts) must never be able to point us off-box.
    candidate = "127.0.0.1" if host == "localhost" else host
    try:
        addr = ipaddress.ip_address(candidate)
    except ValueError:
        raise ValueError(f"host must be an IPv4 address in 127.0.0.0/8, got {host!r}") from None
    if not isinstance(addr, ipaddress.IPv4Address) or addr not in _LOOPBACK:
        raise ValueError(f"host must be an IPv4 address in 127.0.0.0/8, got {host!r}")
    return str(addr)


def _check_port(port: int, *, allow_zero: bool) -> int:
    low = 0 if allow_zero else 1
    if isinstance(port, bool) or not isinstance(port, int) or not low <= port <= 65535:
        raise ValueError(f"port must be an int in [{low}, 65535], got {port!r}")
    return port


def _abort(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RST)
    sock.close()


@dataclasses.dataclass(frozen=True, slots=True)
class ProxyStats:
    """Snapshot of proxy counters. Bytes count what was actually forwarded."""

    accepted: int = 0
    active: int = 0
    bytes_up: int = 0
    bytes_down: int = 0
    chunks_dropped: int = 0
    bytes_dropped: int = 0
    resets: int = 0

    def format(self) -> str:
        """``key=value`` pairs, as printed by the CLI ``stats`` command."""
        return " ".join(f"{f.name}={getattr(self, f.name)}" for f in dataclasses.fields(self))


@dataclasses.dataclass(slots=True)
class _Counters:
    accepted: int = 0
    active: int = 0
    bytes_up: int = 0
    bytes_down: int = 0
    chunks_dropped: int = 0
    bytes_dropped: int = 0
    resets: int = 0


class _Pipe:
    """One direction of a connection: chunks waiting for their due time."""

    __slots__ = ("blocked", "queue", "queued", "shut", "src_eof", "upward")

    def __init__(self, *, upward: bool) -> None:
        self.upward = upward
        self.queue: collections.deque[tuple[float, bytes]] = collections.deque()
        self.queued = 0
        self.src_eof = False
        self.shut = False
        # True only while the destination's send buffer is full; we then wait
        # for EVENT_WRITE rather than retrying on every loop turn.
        self.blocked = False

    @property
    def finished(self) -> bool:
        return self.src_eof and not self.queue


class _Conn:
    __slots__ = (
        "blackholed",
        "client",
        "closed",
        "connecting",
        "down",
        "masks",
        "tainted",
        "up",
        "upstream",
    )

    def __init__(self, client: socket.socket, upstream: socket.socket | None) -> None:
        self.client = client
        self.upstream = upstream
        self.connecting = upstream is not None
        self.up = _Pipe(upward=True)
        self.down = _Pipe(upward=False)
        if upstream is None:
            # Accepted during a partition: there is no server side that could ever talk.
            self.down.src_eof = True
        self.blackholed = False
        # Set once any byte (or FIN) of this connection was dropped: the byte
        # stream is now desynchronised (e.g. a lost HTTP response), so heal()
        # must close it rather than resume forwarding on it.
        self.tainted = False
        self.closed = False
        self.masks: dict[socket.socket, int] = {}


class FaultProxy:
    """TCP proxy on 127.0.0.0/8 with runtime-switchable faults.

    Fault methods are thread-safe and synchronous: when they return, existing
    connections already reflect the new state.
    """

    _listener: socket.socket
    _sel: selectors.BaseSelector
    _wake_r: socket.socket

    def __init__(
        self,
        upstream_host: str,
        upstream_port: int,
        listen_host: str = "127.0.0.1",
        listen_port: int = 0,
    ) -> None:
        self._upstream = (
            _loopback_host(upstream_host),
            _check_port(upstream_port, allow_zero=False),
        )
        self._listen = (_loopback_host(listen_host), _check_port(listen_port, allow_zero=True))
        self._lock = threading.Lock()
        self._stats_lock = threading.Lock()
        self._commands: collections.deque[tuple[Callable[[], None], threading.Event]] = (
            collections.deque()
        )
        self._thread: threading.Thread | None = None
        self._wake_w: socket.socket | None = None
        self._started = False
        self._running = False
        self._stopping = False
        self._port: int | None = None
        self._c = _Counters()
        # Fault state: written only by commands, which run on the loop thread
        # (or under _lock before start / after stop), so the loop reads it lock-free.
        self._mode: Literal["ok", "blackhole", "reset"] = "ok"
        self._drop_up = False
        self._drop_down = False
        self._latency = 0.0
        # Loop-thread-only state.
        self._conns: set[_Conn] = set()
        self._queued: set[_Conn] = set()
        self._accept_resume_at: float | None = None

    # -- lifecycle ---------------------------------------------------------

    def start(self) -> Self:
        """Bind the listener and start the forwarding thread."""
        with self._lock:
            if self._started or self._stopping:
                raise RuntimeError("FaultProxy can only be started once")
            self._started = True
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind(self._listen)
            listener.listen(512)
            listener.setblocking(False)
        except BaseException:
            listener.close()
            raise
        wake_r, wake_w = socket.socketpair()
        wake_r.setblocking(False)
        wake_w.setblocking(False)
        sel = selectors.DefaultSelector()
        sel.register(listener, _READ)
        sel.register(wake_r, _READ)
        self._listener, self._sel, self._wake_r = listener, sel, wake_r
        self._port = listener.getsockname()[1]
        thread = threading.Thread(target=self._loop, name=f"FaultProxy:{self._port}", daemon=True)
        with self._lock:
            self._wake_w = wake_w
            self._thread = thread
            self._running = True
        thread.start()
        return self

    def stop(self) -> None:
        """Close every connection and the listener; join the thread. Idempotent."""
        with self._lock:
            self._stopping = True
            thread = self._thread
        if thread is None:
            return
        self._wake()
        thread.join(_CONTROL_TIMEOUT)
        if thread.is_alive():
            raise RuntimeError("FaultProxy thread did not stop")
        if self._wake_w is not None:
            self._wake_w.close()

    def __enter__(self) -> Self:
        return self if self._started else self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def port(self) -> int:
        """The bound listen port (useful with ``listen_port=0``)."""
        if self._port is None:
            raise RuntimeError("FaultProxy is not started")
        return self._port

    @property
    def host(self) -> str:
        return self._listen[0]

    @property
    def url(self) -> str:
        return f"http://{self._listen[0]}:{self.port}"

    @property
    def stats(self) -> ProxyStats:
        c = self._c
        with self._stats_lock:
            return ProxyStats(
                accepted=c.accepted,
                active=c.active,
                bytes_up=c.bytes_up,
                bytes_down=c.bytes_down,
                chunks_dropped=c.chunks_dropped,
                bytes_dropped=c.bytes_dropped,
                resets=c.resets,
            )

    # -- faults ------------------------------------------------------------

    def cut(self, mode: CutMode = "blackhole") -> None:
        """Partition the link until ``heal()``.

        ``blackhole``: connections stay open but every byte is swallowed, and
        new connections are accepted but never reach upstream, so clients hit
        read timeouts.  ``reset``: every connection, existing or new, is closed
        with RST, so clients get connection errors.
        """
        if mode == "blackhole":
            self._run_in_loop(self._apply_blackhole)
        elif mode == "reset":
            self._run_in_loop(self._apply_reset)
        else:
            raise ValueError(f"mode must be 'blackhole' or 'reset', got {mode!r}")

    def cut_one_way(self, direction: Direction) -> None:
        """Drop only ``up`` (client->server) or ``down`` (server->client) bytes.

        ``down`` models "request applied, response lost".  Connections are
        still made to upstream.  Cumulative with other faults until ``heal()``.
        """
        if direction not in ("up", "down"):
            raise ValueError(f"direction must be 'up' or 'down', got {direction!r}")
        self._run_in_loop(lambda: self._apply_one_way(upward=direction == "up"))

    def heal(self) -> None:
        """Clear cuts; connections that were black-holed or lost bytes are reset."""
        self._run_in_loop(self._apply_heal)

    def set_latency(self, seconds: float) -> None:
        """Delay each chunk by ``seconds`` in both directions (applies to new chunks)."""
        if not math.isfinite(seconds) or seconds < 0:
            raise ValueError(f"latency must be a finite number >= 0, got {seconds!r}")

        def apply() -> None:
            self._latency = float(seconds)

        self._run_in_loop(apply)

    # -- command plumbing ----------------------------------------------------

    def _run_in_loop(self, fn: Callable[[], None]) -> None:
        # Connection state is owned by the loop thread, so mutations go there
        # and we wait, which makes fault switches deterministic for tests.
        with self._lock:
            if not self._running or threading.current_thread() is self._thread:
                fn()
                return
            done = threading.Event()
            self._commands.append((fn, done))
        self._wake()
        if not done.wait(_CONTROL_TIMEOUT):
            raise RuntimeError("FaultProxy loop did not apply the command in time")

    def _run_commands(self) -> None:
        with self._lock:
            pending = list(self._commands)
            self._commands.clear()
        for fn, done in pending:
            try:
                fn()
            except Exception:
                log.exception("fault proxy command failed")
            finally:
                done.set()

    def _wake(self) -> None:
        wake_w = self._wake_w
        if wake_w is None:
            return
        try:
            wake_w.send(b"\0")
        except (BlockingIOError, InterruptedError):
            pass  # buffer full: a wake-up is already pending
        except OSError:
            pass  # already torn down

    # -- fault application (loop thread) -------------------------------------

    def _apply_blackhole(self) -> None:
        self._mode = "blackhole"
        for conn in list(self._conns):
            conn.blackholed = True
            self._discard(conn, conn.up)
            self._discard(conn, conn.down)
            self._update(conn)

    def _apply_reset(self) -> None:
        self._mode = "reset"
        for conn in list(self._conns):
            self._discard(conn, conn.up)
            self._discard(conn, conn.down)
            self._count_reset()
            self._close(conn, abortive=True)

    def _apply_one_way(self, *, upward: bool) -> None:
        if upward:
            self._drop_up = True
        else:
            self._drop_down = True
        for conn in list(self._conns):
            self._discard(conn, conn.up if upward else conn.down)
            self._update(conn)

    def _apply_heal(self) -> None:
        self._mode = "ok"
        self._drop_up = self._drop_down = False
        for conn in list(self._conns):
            if conn.blackholed or conn.tainted:
                self._count_reset()
                self._close(conn, abortive=True)

    def _discard(self, conn: _Conn, pipe: _Pipe) -> None:
        """Drop in-flight chunks: a partition loses what was on the wire."""
        pipe.blocked = False
        if not pipe.queue:
            return
        conn.tainted = True
        self._count_drop(len(pipe.queue), pipe.queued)
        pipe.queue.clear()
        pipe.queued = 0

    def _dropping(self, conn: _Conn, pipe: _Pipe) -> bool:
        return conn.blackholed or (self._drop_up if pipe.upward else self._drop_down)

    # -- event loop (loop thread) --------------------------------------------

    def _loop(self) -> None:
        try:
            while not self._stopping:
                events = self._sel.select(self._next_timeout())
                for key, mask in events:
                    if key.fileobj is self._wake_r:
                        self._drain_wake()
                    elif key.fileobj is self._listener:
                        self._accept_all()
                    else:
                        conn, is_client = key.data
                        self._service(conn, is_client, mask)
                self._run_commands()
                self._flush_due()
                self._maybe_resume_accept()
        except Exception:
            log.exception("fault proxy loop crashed")
        finally:
            self._teardown()

    def _teardown(self) -> None:
        for conn in list(self._conns):
            self._close(conn, abortive=True)
        for sock in (self._listener, self._wake_r):
            with contextlib.suppress(KeyError, ValueError):
                self._sel.unregister(sock)
            sock.close()
        self._sel.close()
        with self._lock:
            self._running = False
        # Anything queued before _running went false still gets applied and
        # acknowledged, so no caller is left waiting.
        self._run_commands()

    def _next_timeout(self) -> float | None:
        deadline: float | None = None
        for conn in self._queued:
            for pipe in (conn.up, conn.down):
                if pipe.queue and not pipe.blocked:
                    due = pipe.queue[0][0]
                    deadline = due if deadline is None else min(deadline, due)
        if self._accept_resume_at is not None:
            due = self._accept_resume_at
            deadline = due if deadline is None else min(deadline, due)
        if deadline is None:
            return None  # nothing timed: sleep until a socket or control wake-up
        return max(0.0, deadline - time.monotonic())

    def _drain_wake(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except (BlockingIOError, InterruptedError):
            pass

    def _accept_all(self) -> None:
        for _ in range(64):
            try:
                client, _addr = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionAbortedError:
                continue
            except OSError as exc:
                # e.g. EMFILE: the listener stays readable, so back off
                # instead of spinning on it.
                log.warning("fault proxy accept failed: %s", exc)
                self._sel.unregister(self._listener)
                self._accept_resume_at = time.monotonic() + _ACCEPT_BACKOFF
                return
            with self._stats_lock:
                self._c.accepted += 1
            try:
                self._admit(client)
            except OSError as exc:
                log.debug("fault proxy could not admit connection: %s", exc)
                _abort(client)

    def _maybe_resume_accept(self) -> None:
        if self._accept_resume_at is not None and time.monotonic() >= self._accept_resume_at:
            self._accept_resume_at = None
            self._sel.register(self._listener, _READ)

    def _admit(self, client: socket.socket) -> None:
        client.setblocking(False)
        if self._mode == "reset":
            # Count before the RST: the client may read stats the moment it sees it.
            self._count_reset()
            _abort(client)
            return
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self._mode == "blackhole":
            conn = _Conn(client, None)
            conn.blackholed = True
        else:
            upstream = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            upstream.setblocking(False)
            err = upstream.connect_ex(self._upstream)
            if err not in (0, errno.EINPROGRESS):
                upstream.close()
                log.debug("fault proxy upstream connect failed: %s", errno.errorcode.get(err))
                _abort(client)
                return
            conn = _Conn(client, upstream)
            if err == 0:
                self._connected(conn)
        self._conns.add(conn)
        with self._stats_lock:
            self._c.active = len(self._conns)
        self._update(conn)

    def _connected(self, conn: _Conn) -> None:
        assert conn.upstream is not None
        conn.connecting = False
        # Without NODELAY, Nagle plus delayed ACKs add ~40 ms stalls to small
        # HTTP writes, which would swamp any latency we inject on purpose.
        conn.upstream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def _service(self, conn: _Conn, is_client: bool, mask: int) -> None:
        if conn.closed:
            return  # closed by an earlier event in the same batch
        try:
            if not is_client and conn.connecting:
                assert conn.upstream is not None
                err = conn.upstream.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if err:
                    raise OSError(err, f"upstream connect failed: {errno.errorcode.get(err)}")
                self._connected(conn)
                self._flush(conn, conn.up, time.monotonic())
            else:
                if mask & _WRITE:
                    self._flush(conn, conn.down if is_client else conn.up, time.monotonic())
                if mask & _READ:
                    self._read(conn, conn.up if is_client else conn.down)
        except OSError as exc:
            log.debug("fault proxy connection error: %s", exc)
            self._close(conn, abortive=True)
            return
        self._update(conn)

    def _read(self, conn: _Conn, pipe: _Pipe) -> None:
        src = conn.client if pipe.upward else conn.upstream
        assert src is not None
        try:
            data = src.recv(_RECV_SIZE)
        except (BlockingIOError, InterruptedError):
            return
        dropping = self._dropping(conn, pipe)
        if not data:
            pipe.src_eof = True
            if dropping:
                conn.tainted = True  # the FIN is lost too
            else:
                self._flush(conn, pipe, time.monotonic())
            return
        if dropping:
            conn.tainted = True
            self._count_drop(1, len(data))
            return
        now = time.monotonic()
        pipe.queue.append((now + self._latency, data))
        pipe.queued += len(data)
        self._queued.add(conn)
        self._flush(conn, pipe, now)

    def _flush(self, conn: _Conn, pipe: _Pipe, now: float) -> None:
        """Send every due chunk of ``pipe``; forward its FIN once drained."""
        if self._dropping(conn, pipe):
            return
        dst = conn.upstream if pipe.upward else conn.client
        if dst is None or (pipe.upward and conn.connecting):
            return
        pipe.blocked = False
        while pipe.queue:
            due, data = pipe.queue[0]
            if due > now:
                return
            try:
                sent = dst.send(data)
            except (BlockingIOError, InterruptedError):
                pipe.blocked = True
                return
            pipe.queued -= sent
            with self._stats_lock:
                if pipe.upward:
                    self._c.bytes_up += sent
                else:
                    self._c.bytes_down += sent
            if sent < len(data):
                pipe.queue[0] = (due, data[sent:])
                pipe.blocked = True
                return
            pipe.queue.popleft()
        if pipe.src_eof and not pipe.shut:
            pipe.shut = True
            dst.shutdown(socket.SHUT_WR)

    def _flush_due(self) -> None:
        if not self._queued:
            return
        now = time.monotonic()
        for conn in list(self._queued):
            if conn.closed:
                continue
            try:
                for pipe in (conn.up, conn.down):
                    if pipe.queue and not pipe.blocked and pipe.queue[0][0] <= now:
                        self._flush(conn, pipe, now)
            except OSError as exc:
                log.debug("fault proxy connection error: %s", exc)
                self._close(conn, abortive=True)
                continue
            self._update(conn)

    def _update(self, conn: _Conn) -> None:
        """Close finished connections; otherwise re-derive selector interest."""
        if conn.closed:
            return
        if conn.up.finished and conn.down.finished:
            self._close(conn, abortive=False)
            return
        if not conn.up.queue and not conn.down.queue:
            self._queued.discard(conn)
        self._set_mask(
            conn,
            conn.client,
            (_READ if self._wants_read(conn.up) else 0) | (_WRITE if conn.down.blocked else 0),
            is_client=True,
        )
        if conn.upstream is not None:
            if conn.connecting:
                mask = _WRITE
            else:
                mask = (_READ if self._wants_read(conn.down) else 0) | (
                    _WRITE if conn.up.blocked else 0
                )
            self._set_mask(conn, conn.upstream, mask, is_client=False)

    @staticmethod
    def _wants_read(pipe: _Pipe) -> bool:
        return not pipe.src_eof and pipe.queued < _HIGH_WATER

    def _set_mask(self, conn: _Conn, sock: socket.socket, mask: int, *, is_client: bool) -> None:
        old = conn.masks.get(sock, 0)
        if mask == old:
            return
        if old == 0:
            self._sel.register(sock, mask, (conn, is_client))
        elif mask == 0:
            self._sel.unregister(sock)
        else:
            self._sel.modify(sock, mask, (conn, is_client))
        if mask:
            conn.masks[sock] = mask
        else:
            del conn.masks[sock]

    def _close(self, conn: _Conn, *, abortive: bool) -> None:
        if conn.closed:
            return
        conn.closed = True
        for sock in (conn.client, conn.upstream):
            if sock is None:
                continue
            if sock in conn.masks:
                self._sel.unregister(sock)
            if abortive:
                _abort(sock)
            else:
                sock.close()
        conn.masks.clear()
        self._conns.discard(conn)
        self._queued.discard(conn)
        with self._stats_lock:
            self._c.active = len(self._conns)

    def _count_drop(self, chunks: int, nbytes: int) -> None:
        with self._stats_lock:
            self._c.chunks_dropped += chunks
            self._c.bytes_dropped += nbytes

    def _count_reset(self) -> None:
        with self._stats_lock:
            self._c.resets += 1


# -- CLI ---------------------------------------------------------------------


def _parse_addr(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {value!r}")
    try:
        return _loopback_host(host), int(port)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _command(proxy: FaultProxy, line: str) -> tuple[str, bool]:
    """Apply one control line; return (reply, quit?)."""
    words = line.split()
    match words:
        case ["cut"] | ["cut", "blackhole"]:
            proxy.cut("blackhole")
            return "ok cut blackhole", False
        case ["cut", "reset"]:
            proxy.cut("reset")
            return "ok cut reset", False
        case ["cut", "up"]:
            proxy.cut_one_way("up")
            return "ok cut up", False
        case ["cut", "down"]:
            proxy.cut_one_way("down")
            return "ok cut down", False
        case ["heal"]:
            proxy.heal()
            return "ok heal", False
        case ["latency", value]:
            try:
                seconds = float(value)
                proxy.set_latency(seconds)
            except ValueError as exc:
                return f"err {exc}", False
            return f"ok latency {seconds:g}", False
        case ["stats"]:
            return f"ok {proxy.stats.format()}", False
        case ["quit"]:
            return "ok quit", True
        case _:
            return f"err unknown command {line.strip()!r}", False


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m infra.proxy",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--upstream", type=_parse_addr, required=True, metavar="HOST:PORT")
    parser.add_argument("--listen", type=_parse_addr, default=("127.0.0.1", 0), metavar="HOST:PORT")
    args = parser.parse_args(argv)
    up_host, up_port = args.upstream
    listen_host, listen_port = args.listen
    try:
        proxy = FaultProxy(up_host, up_port, listen_host, listen_port)
    except ValueError as exc:
        parser.error(str(exc))
    with proxy:
        print(f"listening {proxy.host}:{proxy.port}", flush=True)
        try:
            # readline() rather than iteration: answer each line as soon as it arrives.
            while line := sys.stdin.readline():
                if not line.strip():
                    continue
                reply, quit_ = _command(proxy, line)
                print(reply, flush=True)
                if quit_:
                    break
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
