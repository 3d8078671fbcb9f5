"""Calling targets with the intent's key and the job's fencing token.

What "success" means differs per tool, and a target declares it
(``app.target(..., success=...)``):

- ``accepted``: the target queued the request (HTTP 202, an SQS send, an ERP
  import job id). The effect may still fail later on its side; follow up with
  a check, not with a repeat.
- ``completed``: the target applied it (a payment captured, a row written).
- ``delivered``: it reached its final recipient (an e-mail delivered, not just
  handed to the mail service).

The helpers below turn a transport's answer into the three outcomes the
intent protocol needs: a result (applied), :class:`~sqs_lease.ToolNotApplied`
(certainly not applied: never sent, or refused by the target), or
:class:`~sqs_lease.ToolOutcomeUnknown` (cannot tell: reconcile). Inside an
effect, any exception other than ``ToolNotApplied`` counts as "cannot tell".

Every call carries the fence: ``Idempotency-Key``, ``X-Execution-Fence-Scope``
(the job id: tokens are ordered per job) and ``X-Execution-Fence`` (the token);
see :func:`fence_headers` and docs/protocol.md. To sign the fence for a receiver
configured with a shared secret, pass ``headers=call.signed_headers(secret)``
to :func:`http_json`, or ``secret=`` to :func:`botocore_fence`. The fence orders
owners; it does not authenticate the caller.
"""

from __future__ import annotations

import http.client
import json
import re
import socket
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from ._core.inputs import loads as _loads
from ._core.intents import CheckAnswer, ToolResult, Verdict
from ._core.texts import url_origin, visible
from ._errors import FenceError, FenceRefused, ToolNotApplied, ToolOutcomeUnknown
from ._fence import (
    FENCE_SCOPE,
    FENCE_SIGNATURE,
    FENCE_TOKEN,
    IDEMPOTENCY_KEY,
    MAX_TOKEN,
    fence_headers,
)
from ._jobs import EffectCall

__all__ = [
    "FENCE_SCOPE",
    "FENCE_SIGNATURE",
    "FENCE_TOKEN",
    "IDEMPOTENCY_KEY",
    "MAX_TOKEN",
    "CheckAnswer",
    "ToolResult",
    "Verdict",
    "botocore_fence",
    "fence_headers",
    "http_json",
]


def http_json(
    call: EffectCall,
    url: str,
    *,
    method: str = "POST",
    body: Mapping[str, Any] | None = None,
    timeout: float | None = None,
    id_field: str | None = "id",
    headers: Mapping[str, str] | None = None,
) -> ToolResult:
    """Send ``body`` (default: the intent's payload) as JSON with the fence headers.

    ``timeout`` (default: ``call.timeout``, the effect's timeout from its job
    class or ``ctx.effect(timeout=...)``) is the socket timeout.

    The rule: "not applied" only where the request provably never left, or the
    target said it refused it; everything after the request was sent is unknown.

    - 2xx: the result (``external_id`` from ``id_field``);
    - connection refused or a name that does not resolve (nothing was sent), and
      429 (the target refused it for now): ``ToolNotApplied`` (retry later);
    - 412: ``FenceRefused``, a ``LeaseLost`` (the receiver fenced this token out: not
      applied);
    - 409 (same key in flight), 5xx, and every transport failure once the
      request may have left (a timeout, a reset, a response cut short or
      unreadable, a dropped connection): ``ToolOutcomeUnknown``;
    - other 4xx (the target rejected the request): ``ToolNotApplied(retry=False)``;
    - a request that cannot be built (a header that is not Latin-1 or holds a line
      break, a URL that is not ASCII, a body that is not JSON): it never left, so
      ``ToolNotApplied(retry=False)``, never "outcome unknown".

    Error texts name the URL by scheme and host only: its path and query (a
    webhook's secret path, ``?token=``) never reach a reason, journal or log.
    """
    where = url_origin(url)  # errors name scheme and host: a path or query may hold a secret
    req = _request(call, url, where, method, body, headers)
    seconds = call.timeout if timeout is None else timeout
    try:
        with urllib.request.urlopen(req, timeout=seconds) as resp:
            raw = resp.read()
            status = resp.status
            request_id = _request_id(resp.headers)
    except urllib.error.HTTPError as err:
        code = err.code
        if code == 412:
            raise FenceRefused(
                f"{where}: the receiver rejected fencing token {call.token}"
            ) from None
        if code == 429:
            raise ToolNotApplied(f"{where}: 429 too many requests", code="http_429") from None
        if code == 409 or code >= 500:
            raise ToolOutcomeUnknown(f"{where}: HTTP {code}", code=f"http_{code}") from None
        raise ToolNotApplied(f"{where}: HTTP {code}", code=f"http_{code}", retry=False) from None
    except urllib.error.URLError as err:
        # urllib wraps what fails while connecting and sending. Only a refused
        # connection and a failed name lookup prove that nothing was sent.
        if isinstance(err.reason, ConnectionRefusedError):
            raise ToolNotApplied(f"{where}: connection refused", code="refused") from None
        if isinstance(err.reason, socket.gaierror):
            raise ToolNotApplied(f"{where}: name not resolved", code="dns") from None
        raise ToolOutcomeUnknown(
            f"{where}: {type(err.reason).__name__} while sending", code="transport"
        ) from None
    except (http.client.HTTPException, OSError) as err:
        # After the request was sent: a timeout, a reset, a dropped connection
        # (RemoteDisconnected), a bad status line, a body cut short (IncompleteRead).
        kind = "timeout" if isinstance(err, TimeoutError) else "transport"
        raise ToolOutcomeUnknown(f"{where}: {type(err).__name__}", code=kind) from None
    try:
        parsed = _loads(raw) if raw else {}
    except ValueError:
        parsed = {"raw": raw[:2000].decode("utf-8", "replace")}
    response = parsed if isinstance(parsed, dict) else {"value": parsed}
    response.setdefault("_status", status)
    external = response.get(id_field) if id_field else None
    return ToolResult(
        response, str(external) if external is not None else None, request_id=request_id
    )


_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+\Z")


def _request(
    call: EffectCall,
    url: str,
    where: str,
    method: str,
    body: Mapping[str, Any] | None,
    headers: Mapping[str, str] | None,
) -> urllib.request.Request:
    """The request, checked before anything is sent: what fails here provably never
    left the process, so it is "not sent" (``ToolNotApplied``, no retry: the call
    itself is wrong), never "outcome unknown" (which would park the job)."""

    def refuse(why: str) -> ToolNotApplied:
        return ToolNotApplied(f"{where}: not sent: {why}", code="invalid_request", retry=False)

    try:
        data = json.dumps(dict(body if body is not None else call.payload)).encode()
    except (TypeError, ValueError, RecursionError) as exc:
        raise refuse(f"the body is not JSON ({type(exc).__name__})") from None
    try:
        hdrs = {"Content-Type": "application/json", **call.headers, **dict(headers or {})}
    except FenceError as exc:
        raise refuse(f"the fence: {exc}") from None
    for name, value in hdrs.items():
        if not isinstance(name, str) or not _HEADER_NAME.match(name):
            raise refuse(f"header name {visible(name)!r} is not an HTTP token")
        # http.client sends values as Latin-1 and refuses a line break or NUL inside.
        if not isinstance(value, str) or any(c in value for c in "\r\n\0"):
            raise refuse(f"header {name}: a value must be a str on one line")
        try:
            value.encode("latin-1")
        except UnicodeEncodeError:
            raise refuse(
                f"header {name}: a value must be Latin-1 (percent-encode other text)"
            ) from None
    # http.client sends the target as ASCII and refuses spaces and control characters.
    if not url.isascii() or any(c <= " " or c == "\x7f" for c in url):
        raise refuse("the URL must be ASCII without spaces or control characters (percent-encode)")
    if urllib.parse.urlsplit(url).scheme not in ("http", "https"):
        raise refuse("the URL must be http:// or https://")
    try:
        return urllib.request.Request(url, data, hdrs, method=method)
    except ValueError as exc:
        raise refuse(f"the URL: {type(exc).__name__}") from None


REQUEST_ID_HEADERS = ("X-Request-Id", "X-Amzn-RequestId", "X-Amz-Request-Id", "Request-Id")
"""Response headers a target's request id is read from (first present wins)."""


def _request_id(headers: Any) -> str | None:
    for name in REQUEST_ID_HEADERS:
        value = headers.get(name) if headers is not None else None
        if value:
            return str(value)[:200]
    return None


@contextmanager
def botocore_fence(client: Any, call: EffectCall, *, secret: bytes | None = None) -> Iterator[Any]:
    """Send the fence headers with every request ``client`` makes inside the block.

    For AWS-compatible targets that read custom headers (a fenced service behind
    API Gateway, or your own endpoint speaking an AWS protocol)::

        with botocore_fence(client, call):
            client.put_item(...)

    With ``secret`` the fence is signed (``X-Execution-Fence-Signature``).
    """
    extra = call.headers if secret is None else call.signed_headers(secret)

    def add(request: Any, **_: Any) -> None:
        for name, value in extra.items():
            request.headers[name] = value

    events = client.meta.events
    events.register_first("before-sign.*.*", add, unique_id=f"sqs-lease-fence-{id(call)}")
    try:
        yield client
    finally:
        events.unregister("before-sign.*.*", unique_id=f"sqs-lease-fence-{id(call)}")
