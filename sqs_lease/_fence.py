"""The fence on the wire: header names, how scope and token are written and read, the signature.

One module for both ends, so the client (``EffectCall.headers``,
``JobContext.fence_headers``, ``effects``) and the receiver kit
(``sqs_lease.receiver``) cannot drift apart.

A fencing token orders the owners of one job: it rises by one at every claim
of that job, and every job's first token is 1. Tokens of two jobs are not
comparable, so a fence names its *scope* (the job id; it stays the job id when
a job has stages, since the token counts per job) and a receiver keeps one
high-water mark per scope. Headers:

- ``X-Execution-Fence-Scope``: the job id, percent-encoded UTF-8
  (``urllib.parse.quote(job_id, safe="")``; a plain ASCII id is sent as is).
  On the wire: 1..1024 visible ASCII characters; decoded: valid UTF-8.
- ``X-Execution-Fence``: the token, ASCII digits ``0-9`` only, no sign, no
  leading zero (``"0"`` itself is fine), at most ``2**63 - 1`` (it fits a
  signed 64-bit integer in every language).
- ``Idempotency-Key``: the intent key, 1..255 characters, no control
  characters (C0, DEL, C1) and valid Unicode; sent percent-encoded UTF-8 with
  every visible ASCII character but ``%`` as is (``key_to_wire``: a key like
  ``payment:INV-1:capture`` goes unchanged; ``é`` goes as ``%C3%A9``, a space as
  ``%20``, ``%`` as ``%25``). On the wire: 1..3060 ASCII characters (``0x20`` to
  ``0x7E``); the receiver decodes it (``parse_key``) as strict UTF-8, so an HTTP
  stack that sends headers as Latin-1 never meets a character it cannot send.
- ``X-Execution-Fence-Signature`` (optional): ``v1=`` and 64 lower-case hex
  digits, the HMAC-SHA256 under a secret shared by caller and receiver of
  ``"sqs-lease-fence-v1\\n" + scope + "\\n" + token + "\\n" + key``, where scope,
  token and key are the header values exactly as sent (scope and key
  percent-encoded) and the key comes last, so no field can be shifted into another.

The fence orders owners; it is **not** authentication. Anyone who can reach
the receiver can send any scope and token; the receiving service must
authenticate its callers (mTLS, IAM/SigV4, a bearer token). The signature only
proves that the fence was issued by a holder of the secret; it does not bind
the request body (the idempotency key's payload check does that) and does not
replace authentication.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import urllib.parse
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final

from ._core.inputs import hidden
from ._errors import FenceError

IDEMPOTENCY_KEY: Final = "Idempotency-Key"
FENCE_TOKEN: Final = "X-Execution-Fence"
FENCE_SCOPE: Final = "X-Execution-Fence-Scope"
FENCE_SIGNATURE: Final = "X-Execution-Fence-Signature"

MAX_TOKEN: Final = 2**63 - 1
MAX_SCOPE_WIRE: Final = 1024
MAX_KEY_LENGTH: Final = 255
MAX_KEY_WIRE: Final = 12 * MAX_KEY_LENGTH  # each character: up to 4 UTF-8 bytes, each %XX
# Sent as is in a key: visible ASCII but "%" (the escape itself). Everything else,
# space and non-ASCII text included, is percent-encoded UTF-8.
# Every visible ASCII character but "%" (the escape) and "," (a WSGI server joins a
# repeated header with ",": the receiver refuses one on the wire as ambiguous).
_KEY_SAFE: Final = "".join(chr(c) for c in range(0x21, 0x7F) if chr(c) not in "%,")
SIGNATURE_PREFIX: Final = "v1="
_SIGNED_CONTEXT: Final = b"sqs-lease-fence-v1"

# Whole-string patterns: \Z, not $, so a trailing newline is not admitted.
_TOKEN_RE: Final = re.compile(r"(?:0|[1-9][0-9]{0,18})\Z", re.ASCII)
_SCOPE_WIRE_RE: Final = re.compile(rf"[\x21-\x7e]{{1,{MAX_SCOPE_WIRE}}}\Z")
_SIGNATURE_RE: Final = re.compile(r"v1=[0-9a-f]{64}\Z")
# A space inside is admitted on the wire: keys sent raw before they were encoded.
_KEY_WIRE_RE: Final = re.compile(rf"[\x20-\x7e]{{1,{MAX_KEY_WIRE}}}\Z")
# C0 controls (NUL, ESC, CR, LF among them), DEL and C1: refused in a key, either end.
_OWS: Final = " \t"  # HTTP's optional whitespace around a field value; nothing else is stripped


@dataclass(frozen=True)
class Fence:
    """One request's fence: the job whose owners it orders, the owner's token, the key."""

    scope: str
    token: int
    idem_key: str


def check_token(token: object) -> int:
    """``token`` as an int in ``0..2**63-1``; ``FenceError`` otherwise."""
    if isinstance(token, bool) or not isinstance(token, int) or not 0 <= token <= MAX_TOKEN:
        raise FenceError(
            "invalid_header",
            FENCE_TOKEN,
            f"token must be an int in 0..{MAX_TOKEN} (2**63-1), got {token!r}",
        )
    return token


def check_scope(scope: object) -> str:
    """``scope`` (a job id) if non-empty and its wire form fits; ``FenceError`` otherwise."""
    if not isinstance(scope, str) or not scope:
        raise FenceError(
            "invalid_header", FENCE_SCOPE, f"scope must be a non-empty job id, got {scope!r}"
        )
    try:
        wire = scope_to_wire(scope)
    except UnicodeEncodeError:
        raise FenceError(
            "invalid_header", FENCE_SCOPE, "scope (the job id) is not valid Unicode"
        ) from None
    if len(wire) > MAX_SCOPE_WIRE:
        raise FenceError(
            "invalid_header",
            FENCE_SCOPE,
            f"scope is longer than {MAX_SCOPE_WIRE} characters once percent-encoded; "
            "use a shorter job id",
        )
    return scope


def refuse_hidden(value: str, header: str, what: str) -> str:
    """``value`` if it holds no hidden character (``inputs.hidden``: control, format such
    as a bidi override or a zero-width space, line and paragraph separators); a
    ``FenceError`` naming ``header`` and the first such character otherwise. None can
    move a terminal's cursor, split a log line or make two keys look alike: neither a
    job id nor a key needs them."""
    for ch in value:
        if hidden(ch):
            raise FenceError(
                "invalid_header",
                header,
                f"{what} must not contain control or format characters (U+{ord(ch):04X})",
            )
    return value


def check_key_text(idem_key: object) -> str:
    """``idem_key`` if it is a non-empty str of valid Unicode without hidden
    characters (control, format such as a bidi override, separators: the one rule of
    ``inputs.hidden`` that ids share); ``FenceError`` otherwise. What the client checks
    before a key is sent (no length bound: other targets take longer keys than the
    receiver kit)."""
    if not isinstance(idem_key, str) or not idem_key:
        raise FenceError("invalid_header", IDEMPOTENCY_KEY, "idempotency key must not be empty")
    try:
        idem_key.encode("utf-8")
    except UnicodeEncodeError:
        raise FenceError(
            "invalid_header", IDEMPOTENCY_KEY, "idempotency key is not valid Unicode"
        ) from None
    refuse_hidden(idem_key, IDEMPOTENCY_KEY, "idempotency key")
    return idem_key


def check_key(idem_key: object) -> str:
    """``idem_key`` if it is 1..255 characters of :func:`check_key_text`; ``FenceError``
    otherwise. What a receiver accepts once the key is decoded."""
    key = check_key_text(idem_key)
    if len(key) > MAX_KEY_LENGTH:
        raise FenceError(
            "invalid_header",
            IDEMPOTENCY_KEY,
            f"idempotency key must be 1..{MAX_KEY_LENGTH} characters",
        )
    return key


def key_to_wire(idem_key: str) -> str:
    """The key as sent: percent-encoded UTF-8, visible ASCII but ``%`` as is."""
    return urllib.parse.quote(check_key_text(idem_key), safe=_KEY_SAFE)


def parse_key(raw: str) -> str:
    """An ``Idempotency-Key`` header's value decoded, or ``FenceError`` saying why not."""
    if not _KEY_WIRE_RE.match(raw):
        raise FenceError(
            "invalid_header",
            IDEMPOTENCY_KEY,
            f"must be 1..{MAX_KEY_WIRE} ASCII characters (percent-encode the key as UTF-8)",
        )
    try:
        key = urllib.parse.unquote(raw, errors="strict")
    except UnicodeDecodeError:
        raise FenceError(
            "invalid_header", IDEMPOTENCY_KEY, "percent-encoding does not decode as UTF-8"
        ) from None
    return check_key(key)


def scope_to_wire(scope: str) -> str:
    """The scope as sent: percent-encoded UTF-8 (unchanged for letters, digits and ``-_.~``)."""
    return urllib.parse.quote(scope, safe="")


def signature(secret: bytes, scope_wire: str, token: int | str, key_wire: str) -> str:
    """``v1=<hex>``: HMAC-SHA256 over the fence as sent (see the module doc)."""
    msg = b"\n".join(
        [
            _SIGNED_CONTEXT,
            scope_wire.encode("ascii"),
            str(token).encode("ascii"),
            key_wire.encode("ascii"),
        ]
    )
    return SIGNATURE_PREFIX + hmac.new(secret, msg, hashlib.sha256).hexdigest()


def fence_headers(
    idem_key: str, scope: str, token: int, *, secret: bytes | None = None
) -> dict[str, str]:
    """The request headers of a fenced call; signed when ``secret`` is given."""
    wire = scope_to_wire(check_scope(scope))
    key_wire = key_to_wire(idem_key)
    headers = {
        IDEMPOTENCY_KEY: key_wire,
        FENCE_SCOPE: wire,
        FENCE_TOKEN: str(check_token(token)),
    }
    if secret is not None:
        headers[FENCE_SIGNATURE] = signature(secret, wire, token, key_wire)
    return headers


def _get(headers: Mapping[str, str], name: str) -> str | None:
    value = headers.get(name)
    if value is None:
        value = headers.get(name.lower())
    if value is None:
        lowered = name.lower()
        value = next((v for k, v in headers.items() if k.lower() == lowered), None)
    return None if value is None else value.strip(_OWS)


def _required(headers: Mapping[str, str], name: str) -> str:
    value = _get(headers, name)
    if not value:
        raise FenceError("missing_header", name, f"header {name} is required")
    return value


def parse_token(raw: str) -> int:
    """A token header's value as an int, or ``FenceError`` saying why not."""
    if not _TOKEN_RE.match(raw):
        raise FenceError(
            "invalid_header",
            FENCE_TOKEN,
            "must be ASCII digits 0-9 without sign, spaces or leading zeros",
        )
    token = int(raw)
    if token > MAX_TOKEN:
        raise FenceError("invalid_header", FENCE_TOKEN, f"must be at most {MAX_TOKEN} (2**63-1)")
    return token


def parse_scope(raw: str) -> str:
    """A scope header's value decoded, or ``FenceError`` saying why not."""
    if not _SCOPE_WIRE_RE.match(raw):
        raise FenceError(
            "invalid_header",
            FENCE_SCOPE,
            f"must be 1..{MAX_SCOPE_WIRE} visible ASCII characters (percent-encode the job id)",
        )
    try:
        return urllib.parse.unquote(raw, errors="strict")
    except UnicodeDecodeError:
        raise FenceError(
            "invalid_header", FENCE_SCOPE, "percent-encoding does not decode as UTF-8"
        ) from None


def parse_fence(headers: Mapping[str, str], *, secrets: Iterable[bytes] = ()) -> Fence:
    """Read and check a request's fence; raise ``FenceError`` (with a 400/403 status) if it is bad.

    ``headers`` are matched case-insensitively. With ``secrets`` (any one may
    match: rotate by adding the new one first), the signature header is
    required and compared in constant time.
    """
    key_wire = _required(headers, IDEMPOTENCY_KEY)
    key = parse_key(key_wire)
    scope_wire = _required(headers, FENCE_SCOPE)
    scope = parse_scope(scope_wire)
    token_raw = _required(headers, FENCE_TOKEN)
    token = parse_token(token_raw)
    keys = list(secrets)
    if keys:
        sig = _required(headers, FENCE_SIGNATURE)
        if not _SIGNATURE_RE.match(sig):
            raise FenceError(
                "invalid_header", FENCE_SIGNATURE, "must be 'v1=' and 64 lower-case hex digits"
            )
        # Every secret is compared, so the time taken does not say which one (if any) matched.
        matches = [
            hmac.compare_digest(sig, signature(k, scope_wire, token_raw, key_wire)) for k in keys
        ]
        if not any(matches):
            raise FenceError(
                "fence_signature_mismatch",
                FENCE_SIGNATURE,
                "the signature does not match scope, token and key under the receiver's secret",
            )
    return Fence(scope=scope, token=token, idem_key=key)
