"""A fenced payment-capture service: the receiving end of an sqs-lease side effect.

Run it against the local emulator, with the secret the workers sign fences with::

    export FENCE_SECRET=$(python -c 'import secrets; print(secrets.token_urlsafe(32))')
    python examples/receiver_service.py --endpoint-url http://127.0.0.1:5000 --prefix pay \
        --port 0 --fence-secret-env FENCE_SECRET

Signed fences are the default: without ``--fence-secret-env`` the service refuses
to start unless ``--unsigned-fences`` says, knowingly, that any caller that
reaches it may send any job's scope and token. To rotate the secret, give the
new one first and keep the old one until every worker signs with the new one
(``--fence-secret-env FENCE_SECRET --fence-secret-env FENCE_SECRET_OLD``); see
docs/security.md.

HTTP contract:

- ``POST /charge`` with JSON ``{"invoice": "...", "amount": N}`` and headers
  ``Idempotency-Key``, ``X-Execution-Fence-Scope`` (the worker's job id) and
  ``X-Execution-Fence`` (its token); ``ctx.fence_headers(key)`` and
  ``EffectCall.headers`` make them. The fence mark is kept per scope (per
  job): tokens order the owners of one job, not the jobs that touch one
  invoice. Two jobs capturing one invoice share the key
  (``payment:{invoice}:capture``), and the key stops the second charge. The
  effect is one ledger row in ``{prefix}-ledger``, committed in the same
  transaction as the fence mark and the idempotency record. Answers ``201
  {"charge_id", "invoice", "amount"}``; a repeated key replays it (header
  ``Idempotent-Replayed: true``); ``400`` names a missing or malformed header or
  a bad body (nothing stored); ``403`` a fence signature that does not verify
  (``X-Execution-Fence-Signature``, required unless ``--unsigned-fences``);
  ``409`` in flight; ``412`` stale token (an older owner of the same job);
  ``422`` key reused with another body, or a request the store cannot take
  (nothing applied); ``503`` DynamoDB did not answer (retry, same key). A
  refused request (400, 403, 412) stores nothing and raises no mark.
- ``GET /ledger``: every ledger row, ``{"rows": [...]}`` (one row per applied charge).
- ``GET /health``: ``200 {"ok": true}``.

The fence orders a job's owners and its signature proves a holder of the
secret issued it; a real service on a network also authenticates its callers
(mTLS, IAM, a bearer token) and serves ``/ledger`` to no one but its operators.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import socketserver
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server
from wsgiref.types import StartResponse, WSGIApplication, WSGIEnvironment

from pynamodb.attributes import NumberAttribute, UnicodeAttribute
from pynamodb.models import Model

from sqs_lease import ConfigError, EffectCall, Settings
from sqs_lease.receiver import (
    AtomicWrite,
    EffectResult,
    Fence,
    FencedReceiver,
    HttpRequest,
    Plan,
    Reply,
    create_receiver_tables,
    ensure_table,
    fenced_wsgi_app,
    put_entry,
)

HOST = "127.0.0.1"
_log = logging.getLogger("receiver_service")

FENCE_SECRET_ENV = "RECEIVER_FENCE_SECRET"
"""Where the examples' workers and service share the fence secret (demo.py makes one)."""


def fence_secret() -> bytes | None:
    """The shared fence secret from ``RECEIVER_FENCE_SECRET``, if set."""
    value = os.environ.get(FENCE_SECRET_ENV)
    return value.encode() if value else None


def signed_fence(call: EffectCall) -> dict[str, str]:
    """The fence headers a worker sends, signed with the shared secret when there is one."""
    secret = fence_secret()
    return call.headers if secret is None else call.signed_headers(secret)


class LedgerEntry(Model):
    """One applied charge. Its existence IS the effect, so it commits with the fence."""

    class Meta:
        table_name = "ledger"

    idem_key = UnicodeAttribute(hash_key=True)
    charge_id = UnicodeAttribute()
    invoice = UnicodeAttribute()
    amount = NumberAttribute()
    scope = UnicodeAttribute()  # the fence's scope: the job that applied it
    token = NumberAttribute()
    applied_at = NumberAttribute()


def ledger_table(prefix: str) -> str:
    return f"{prefix}-ledger"


def create_ledger_table(settings: Settings, prefix: str) -> str:
    """Create ``{prefix}-ledger`` (existing is fine); returns its name."""
    return ensure_table(settings, LedgerEntry, ledger_table(prefix))


MAX_INVOICE = 200
MAX_AMOUNT = 10**12


def _charge(req: HttpRequest) -> tuple[str, int]:
    """Validate the body; ValueError names what is wrong (never echoing the value)."""
    try:
        body = req.json()  # parse_json_body: only ValueError, whatever the bytes
    except ValueError:
        raise ValueError("body must be JSON (UTF-8, nested at most 64 levels)") from None
    if not isinstance(body, dict):
        raise ValueError("body must be a JSON object")
    invoice, amount = body.get("invoice"), body.get("amount")
    if not isinstance(invoice, str) or not 0 < len(invoice) <= MAX_INVOICE:
        raise ValueError(f"invoice must be a string of 1..{MAX_INVOICE} characters")
    if isinstance(amount, bool) or not isinstance(amount, int) or not 0 < amount <= MAX_AMOUNT:
        raise ValueError(f"amount must be an integer in 1..{MAX_AMOUNT}")
    return invoice, amount


def _charge_plan(table: str) -> Callable[[HttpRequest, Fence], Plan]:
    def plan(req: HttpRequest, fence: Fence) -> Plan:
        try:
            invoice, amount = _charge(req)
        except ValueError as exc:
            # Answered now and not stored: nothing was attempted, a fixed body may reuse the key.
            return Reply(400, {"error": "invalid_request", "message": str(exc)})
        charge_id = f"ch_{uuid.uuid4().hex[:24]}"
        row = LedgerEntry(
            idem_key=fence.idem_key,
            charge_id=charge_id,
            invoice=invoice,
            amount=amount,
            scope=fence.scope,
            token=fence.token,
            applied_at=time.time(),
        )
        body = {"charge_id": charge_id, "invoice": invoice, "amount": amount}
        # The plan only describes the write; the receiver commits it with the fence.
        return AtomicWrite(
            put_entry(row, table, LedgerEntry.idem_key.does_not_exist()),
            EffectResult(201, body, external_id=charge_id),
        )

    return plan


def _json(start_response: StartResponse, status: str, body: Any) -> list[bytes]:
    data = json.dumps(body).encode()
    start_response(
        status, [("Content-Type", "application/json"), ("Content-Length", str(len(data)))]
    )
    return [data]


def make_app(
    settings: Settings,
    prefix: str,
    *,
    fence_secrets: Sequence[bytes] = (),
    unsigned_fences: bool = False,
) -> WSGIApplication:
    """The service's WSGI app: /charge is fenced, /ledger and /health are plain.

    ``fence_secrets`` (new first while rotating) or ``unsigned_fences=True``: one of
    the two is required (``fenced_wsgi_app`` says why).
    """
    receiver = FencedReceiver(settings, prefix=prefix)
    table = ledger_table(prefix)
    charge = fenced_wsgi_app(
        receiver,
        _charge_plan(table),
        fence_secrets=fence_secrets,
        unsigned_fences=unsigned_fences,
    )

    def app(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        route = (environ.get("REQUEST_METHOD", "GET"), environ.get("PATH_INFO") or "/")
        if route == ("POST", "/charge"):
            return charge(environ, start_response)
        if route == ("GET", "/ledger"):
            rows: list[dict[str, Any]] = []
            for page in receiver.client.get_paginator("scan").paginate(
                TableName=table, ConsistentRead=True
            ):
                rows += [LedgerEntry.from_raw_data(i).to_simple_dict() for i in page["Items"]]
            return _json(start_response, "200 OK", {"rows": rows})
        if route == ("GET", "/health"):
            return _json(start_response, "200 OK", {"ok": True})
        return _json(start_response, "404 Not Found", {"error": "not_found"})

    return app


class ThreadingWSGIServer(socketserver.ThreadingMixIn, WSGIServer):
    """One thread per request, so a slow request never blocks the others."""

    daemon_threads = True


class _Handler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        _log.debug(format, *args)


def serve(
    settings: Settings,
    prefix: str,
    port: int = 0,
    *,
    fence_secrets: Sequence[bytes] = (),
    unsigned_fences: bool = False,
) -> tuple[WSGIServer, str]:
    """Start serving in a daemon thread; returns the server (``shutdown()`` it) and its URL."""
    app = make_app(settings, prefix, fence_secrets=fence_secrets, unsigned_fences=unsigned_fences)
    server = make_server(HOST, port, app, ThreadingWSGIServer, handler_class=_Handler)
    threading.Thread(target=server.serve_forever, name="receiver-service", daemon=True).start()
    return server, f"http://{HOST}:{server.server_port}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--endpoint-url", help="DynamoDB endpoint (default: AWS_ENDPOINT_URL)")
    parser.add_argument("--prefix", default="payments", help="table name prefix")
    parser.add_argument("--port", type=int, default=8080, help="0 picks a free port")
    parser.add_argument(
        "--fence-secret-env",
        metavar="VAR",
        action="append",
        default=[],
        help="verify signed fences with the secret in this environment variable; repeat "
        "it to rotate (the new secret first, the old one until every worker signs with "
        "the new one)",
    )
    parser.add_argument(
        "--unsigned-fences",
        action="store_true",
        help="accept unsigned fences (knowingly: any caller that reaches the service can "
        "then raise any job's fence mark); only behind your own authentication",
    )
    args = parser.parse_args(argv)
    secrets: list[bytes] = []
    for var in args.fence_secret_env:
        secret = os.environ.get(var, "")
        if not secret:
            parser.error(f"--fence-secret-env: variable {var} is empty or unset")
        secrets.append(secret.encode())
    if bool(secrets) == args.unsigned_fences:
        parser.error(
            "give --fence-secret-env VAR (signed fences, the default) or --unsigned-fences "
            "(knowingly), not both and not neither"
        )
    settings = Settings.from_env(endpoint_url=args.endpoint_url, prefix=args.prefix)
    create_receiver_tables(settings, prefix=args.prefix)
    create_ledger_table(settings, args.prefix)
    try:
        server, url = serve(
            settings,
            args.prefix,
            args.port,
            fence_secrets=secrets,
            unsigned_fences=args.unsigned_fences,
        )
    except ConfigError as exc:  # e.g. a secret shorter than 16 bytes
        parser.error(str(exc))
    print(f"listening {url}", flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.shutdown()
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
