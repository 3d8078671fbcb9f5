"""The ``sqs-lease`` command line: a thin click shell over the public API.

Every command builds on one :class:`Settings` (made by the group from its options
and the environment) and calls the library; no protocol decision is made here.
Errors the library raises (and botocore's credential and connection errors) end
as one ``error: ...`` line on stderr and exit code 2, never a traceback; that
mapping lives in one place, :meth:`_Cli.invoke`. Exit statuses, ``--json`` and
tables are in :mod:`sqs_lease._cli_out`; the ``dlq`` group in :mod:`sqs_lease._cli_dlq`,
the ``receiver`` group in :mod:`sqs_lease._cli_receiver`.
"""

from __future__ import annotations

import dataclasses
import getpass
import json
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn

import botocore.exceptions
import click

from ._aws import SyncDriver, make_client
from ._cli_dlq import dlq
from ._cli_out import (
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_NOT_FOUND,
    emit_json,
    fail_line,
    field,
    json_option,
    noop,
    note,
    row,
    table,
)
from ._cli_receiver import receiver
from ._config import Settings
from ._console import HumanConsole
from ._core.flows import UNKNOWN_CLASS_RECEIVES, UNSENT_GRACE_SECONDS
from ._core.inputs import loads as _loads
from ._core.intents import (
    IntentState,
    Resolution,
    Unprotected,
    repeat_unprotected,
    resolve_flow,
)
from ._core.liveness import LIVENESS_PREFIX, Liveness, liveness_key, liveness_of
from ._core.priority import Priority
from ._core.stages import stage_rows
from ._core.texts import visible
from ._core.timeline import IntentAttemptFacts, IntentFacts
from ._errors import (
    AwsCallFailed,
    AwsUnavailable,
    ConfigError,
    IntentNotAmbiguous,
    PayloadError,
    ResourceMissing,
    SqsLeaseError,
)
from ._journal import Journal, configure_stderr, read_journal
from ._local import LocalAws
from ._producer import Producer, new_send_id
from ._resources import (
    DEFAULT_MAX_RECEIVES,
    check_table,
    create_queue,
    create_tables,
    interactive_queue_url,
    queue_url,
)
from ._schema import (
    AMBIGUOUS_INDEX,
    ATTENTION_INDEX,
    ATTENTION_STATES,
    INTENT_LIST_FIELDS,
    JOB_LIST_FIELDS,
    WORKERS_INDEX,
    AttemptRecord,
    IntentRecord,
    IntentTable,
    JobRecord,
    JobTable,
    record_of,
    view_of,
)
from ._timeline_view import render_html, render_text, timeline_of
from ._worker import load_app

__all__ = ["cli", "main"]


def _package_version() -> str:
    try:
        return metadata.version("sqs-lease")
    except metadata.PackageNotFoundError:  # a source tree on sys.path, never installed
        return "unknown (not installed)"


_VERSION = _package_version()
_TIME_FIELDS = (
    "created_at",
    "updated_at",
    "finished_at",
    "lease_deadline",
    "last_heartbeat",
    "rejected_at",
)


# --------------------------------------------------------------------------- errors


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _error_text(exc: Exception, settings: Settings | None) -> str:
    """The one line to print for an expected failure; AWS failures name the endpoints."""
    endpoints = settings.describe_endpoints() if settings is not None else "AWS"
    hint = (
        " (start the local emulator with `sqs-lease local`, or fix --endpoint-url,"
        " --sqs-endpoint-url or --dynamodb-endpoint-url)"
        if settings is not None and any(settings.is_local_for(s) for s in ("sqs", "dynamodb"))
        else " (check --endpoint-url / --sqs-endpoint-url / --dynamodb-endpoint-url,"
        " AWS_ENDPOINT_URL[_SQS|_DYNAMODB] and the network)"
    )
    text = str(exc)
    # The library's own resource errors already say where; flows' errors do not.
    named = " at http" in text
    if isinstance(exc, AwsUnavailable):
        if "credentials" in text:
            return text
        return f"{text}{'' if named else '; ' + endpoints}{hint}"
    if isinstance(exc, ResourceMissing | AwsCallFailed):
        return text if named else f"{text} ({endpoints})"
    if isinstance(exc, SqsLeaseError):
        return text
    if isinstance(exc, botocore.exceptions.NoCredentialsError):
        return (
            f"no AWS credentials for {endpoints}: set AWS_PROFILE or "
            "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY (or use --endpoint-url with the local "
            "emulator, `sqs-lease local`)"
        )
    if isinstance(
        exc,
        botocore.exceptions.EndpointConnectionError
        | botocore.exceptions.ConnectionClosedError
        | botocore.exceptions.ConnectTimeoutError
        | botocore.exceptions.ReadTimeoutError
        | botocore.exceptions.HTTPClientError,
    ):
        # botocore names the URL it tried: the endpoint actually used.
        url = getattr(exc, "kwargs", {}).get("endpoint_url")
        where = f"endpoint {url}" if url else endpoints
        return f"{where} did not answer ({type(exc).__name__}){hint}"
    if isinstance(exc, botocore.exceptions.ClientError):
        error = exc.response.get("Error", {})
        op = getattr(exc, "operation_name", "AWS call")
        return f"{op}: {error.get('Code', 'error')}: {error.get('Message', '')} ({endpoints})"
    return f"AWS client: {type(exc).__name__}: {exc} ({endpoints})"


class _Cli(click.Group):
    """The root group: maps expected failures of any command to one line and exit 2."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (
            SqsLeaseError,
            botocore.exceptions.BotoCoreError,
            botocore.exceptions.ClientError,
        ) as exc:
            settings = ctx.obj if isinstance(ctx.obj, Settings) else None
            _fail(_error_text(exc, settings), EXIT_ERROR)
        except KeyboardInterrupt:
            # Ctrl-C outside a worker's run (which stops gracefully on its own).
            click.echo("\ninterrupted", err=True)
            raise click.exceptions.Exit(EXIT_INTERRUPTED) from None


def _fail(message: str, code: int) -> NoReturn:
    click.echo(fail_line(message), err=True)
    raise click.exceptions.Exit(code)


# --------------------------------------------------------------------------- helpers


def _job_item(ctx: click.Context, job_id: str) -> dict[str, Any]:
    """The job's record as stored (a consistent read), or exit "not found"."""
    settings = _settings(ctx)
    check_table(settings)
    ddb = make_client(settings, "dynamodb")
    item: dict[str, Any] | None = ddb.get_item(
        TableName=settings.jobs_table, Key={"job_id": {"S": job_id}}, ConsistentRead=True
    ).get("Item")
    if not item:
        _fail(f"no job {job_id!r}", EXIT_NOT_FOUND)
    return item


@contextmanager
def _stop_signals(handler: Callable[[int, FrameType | None], None] | None) -> Iterator[None]:
    """Install ``handler`` for SIGINT/SIGTERM (if given) and restore the old ones after."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    if handler is not None:
        for s in saved:
            signal.signal(s, handler)
    try:
        yield
    finally:
        for s, old in saved.items():
            signal.signal(s, old)


def _importable_cwd() -> None:
    """Let ``MODULE:OBJECT`` name a module in the working directory (as ``python -m`` does)."""
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)


def _read_payload(value: str) -> dict[str, Any]:
    if value.startswith("@"):
        source = value[1:]
        try:
            text = sys.stdin.read() if source == "-" else Path(source).read_text(encoding="utf-8")
        except OSError as exc:
            raise PayloadError(f"--payload {value}: cannot read: {exc.strerror or exc}") from None
        where = f"--payload {value}"
    else:
        text, where = value, "--payload"
    try:
        data = _loads(text)
    except ValueError as exc:  # inputs.UnreadableJson: says why, never quotes the text
        raise PayloadError(f"{where}: {exc}") from None
    if not isinstance(data, dict):
        raise PayloadError(f"{where}: must be a JSON object, got {type(data).__name__}")
    return data


def _age(now: float, then: float | None) -> str:
    return "-" if then is None else _seconds(now - then)


def _seconds(value: float) -> str:
    return f"{value:.1f}s"


def _liveness(settings: Settings, owners: Iterable[str]) -> dict[str, list[Liveness]]:
    """The liveness records (every part) of these workers, read in BatchGetItem calls of
    100 keys (eventually consistent: advisory data, half the read cost)."""
    ddb = make_client(settings, "dynamodb")
    found: dict[str, list[Liveness]] = {}

    def read(keys: list[str]) -> None:
        for i in range(0, len(keys), 100):
            want: dict[str, Any] = {
                settings.jobs_table: {"Keys": [{"job_id": {"S": k}} for k in keys[i : i + 100]]}
            }
            for _ in range(5):  # UnprocessedKeys: a few more tries, then show what came
                page = ddb.batch_get_item(RequestItems=want)
                for item in page.get("Responses", {}).get(settings.jobs_table, []):
                    live = liveness_of(item)
                    if live is not None:
                        found.setdefault(live.worker_id, []).append(live)
                want = page.get("UnprocessedKeys") or {}
                if not want:
                    break

    read(sorted({liveness_key(o) for o in owners}))
    more = [liveness_key(w, n) for w, parts in found.items() for n in range(1, parts[0].parts)]
    read(more)
    return found


@dataclasses.dataclass(frozen=True)
class _Alive:
    """What a running job's worker says of it: lease left, heartbeat age, and how known."""

    lease_left: str = "-"
    heartbeat_age: str = "-"
    liveness: str | None = None  # None: not running; else where the figures came from


def _alive(rec: JobRecord, now: float, live: dict[str, list[Liveness]]) -> _Alive:
    # Advisory only: the lease is SQS's visibility, arbitrated by SQS's clock. The
    # figures come from the owner's liveness record (one write per worker per round).
    if rec.state != "running" or not rec.owner:
        return _Alive()
    parts = live.get(rec.owner)
    if not parts:
        return _Alive(
            liveness=f"none found for worker {rec.owner!r} (not yet written, the worker "
            "stopped long ago, or an older version): lease left and heartbeat age unknown"
        )
    beat_at = max(p.beat_at for p in parts)
    held = next((h for p in parts if (h := p.find(rec.job_id)) is not None), None)
    age = _seconds(now - beat_at)
    if held is None or held.token != rec.token:
        mine = "does not list this job" if held is None else f"lists token {held.token}"
        return _Alive(
            heartbeat_age=age,
            liveness=f"worker {rec.owner!r} beat {age} ago; its liveness record {mine} "
            f"(token {rec.token}): lease left unknown",
        )
    round_s = max(p.round_seconds for p in parts)
    return _Alive(
        _seconds(held.lease_deadline - now),
        age,
        f"worker {rec.owner!r}, round of {round_s:.2f}s",
    )


def _iso(ts: float | None) -> str | None:
    return None if ts is None else datetime.fromtimestamp(ts, UTC).isoformat(timespec="seconds")


def _reason(text: str | None) -> str:
    # Whole: the table wraps it on a terminal; `--json` has it verbatim.
    return _one_line(text) if text else "-"


def _fields(
    rec: JobRecord, now: float, names: Sequence[str], live: dict[str, list[Liveness]]
) -> dict[str, Any]:
    out: dict[str, Any] = {name: getattr(rec, name, None) for name in names}
    alive = _alive(rec, now, live)
    out["lease_left"] = alive.lease_left
    out["heartbeat_age"] = alive.heartbeat_age
    if alive.liveness is not None:
        out["liveness"] = alive.liveness
    return out


def _settings(ctx: click.Context) -> Settings:
    obj = ctx.find_root().obj
    assert isinstance(obj, Settings)
    return obj


# --------------------------------------------------------------------------- root


@click.group(cls=_Cli, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(
    _VERSION, "-V", "--version", prog_name="sqs-lease", message="%(prog)s %(version)s"
)
@click.option(
    "--endpoint-url",
    default=None,
    help="Endpoint of both services (default: env AWS_ENDPOINT_URL; unset means AWS).",
)
@click.option(
    "--sqs-endpoint-url",
    default=None,
    help="SQS endpoint, overrides --endpoint-url (default: env AWS_ENDPOINT_URL_SQS).",
)
@click.option(
    "--dynamodb-endpoint-url",
    default=None,
    help="DynamoDB endpoint, overrides --endpoint-url (default: env AWS_ENDPOINT_URL_DYNAMODB).",
)
@click.option(
    "--region", default=None, help="AWS region (default: env AWS_REGION/AWS_DEFAULT_REGION)."
)
@click.option(
    "--prefix",
    default=None,
    help="Resource name prefix (default: env SQS_LEASE_PREFIX, else sqs-lease).",
)
@click.option(
    "--queue", "queue_name", default=None, help="Job queue name (default: env SQS_LEASE_QUEUE)."
)
@click.option(
    "--fifo/--no-fifo",
    default=None,
    help="FIFO queues, names ending in .fifo (default: env SQS_LEASE_FIFO, else standard).",
)
@click.pass_context
def cli(
    ctx: click.Context,
    endpoint_url: str | None,
    sqs_endpoint_url: str | None,
    dynamodb_endpoint_url: str | None,
    region: str | None,
    prefix: str | None,
    queue_name: str | None,
    fifo: bool | None,
) -> None:
    """Long tool calls on AWS, made safe: SQS leases, DynamoDB fencing tokens."""
    ctx.obj = Settings.from_env(
        endpoint_url=endpoint_url,
        sqs_endpoint_url=sqs_endpoint_url,
        dynamodb_endpoint_url=dynamodb_endpoint_url,
        region=region,
        prefix=prefix,
        queue_name=queue_name,
        fifo=fifo,
    )


# --------------------------------------------------------------------------- local


@cli.command()
@click.option(
    "--port", type=click.IntRange(0, 65535), default=0, show_default=True, help="0 picks one."
)
@click.option("--init", is_flag=True, help="Also create the tables and the queue (--prefix).")
@json_option("Print one JSON object once ready: endpoint, tables, queue, dlq.")
@click.pass_context
def local(ctx: click.Context, port: int, init: bool, as_json: bool) -> None:
    """Run the local AWS emulator (moto) on 127.0.0.1 until Ctrl-C / SIGTERM."""
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    # Installed before the server starts, so a signal during startup also stops cleanly.
    with _stop_signals(on_signal):
        server = LocalAws(port).start()
        try:
            endpoint = server.endpoint_url
            ready: dict[str, Any] = {"endpoint": endpoint, "tables": [], "queue": None, "dlq": None}
            if init:
                # Both services on this emulator, whatever the environment says.
                settings = _settings(ctx).model_copy(
                    update={
                        "endpoint_url": endpoint,
                        "sqs_endpoint_url": None,
                        "dynamodb_endpoint_url": None,
                    }
                )
                ready["tables"] = create_tables(settings)
                ready["queue"], ready["dlq"] = create_queue(settings)
            if as_json:
                emit_json(ready)
            else:
                for name in ready["tables"]:
                    click.echo(f"table {name}")
                if init:
                    click.echo(f"queue {ready['queue']}")
                    click.echo(f"dlq {ready['dlq']}")
                click.echo(f"endpoint {endpoint}")
                click.echo(
                    f"hint: export AWS_ENDPOINT_URL={endpoint}   (Ctrl-C stops the emulator)"
                )
            while not stop.wait(0.5):
                pass
        finally:
            server.stop()
    if not as_json:
        click.echo("stopped")


# --------------------------------------------------------------------------- tables, queue


@cli.group()
def tables() -> None:
    """DynamoDB tables."""


@tables.command("create")
@json_option('{"tables": [NAME, ...]}.')
@click.pass_context
def tables_create(ctx: click.Context, as_json: bool) -> None:
    """Create the tables if missing (idempotent); print their names."""
    names = create_tables(_settings(ctx))
    if as_json:
        emit_json({"tables": names})
        return
    for name in names:
        click.echo(name)


@cli.group()
def queue() -> None:
    """The SQS job queue and its dead-letter queue."""


@queue.command("create")
@click.option(
    "--visibility",
    type=click.IntRange(0, 43_200),
    default=30,
    show_default=True,
    help="Visibility timeout in seconds.",
)
@click.option(
    "--max-receives",
    type=click.IntRange(1, 1000),
    default=DEFAULT_MAX_RECEIVES,
    show_default=True,
    help="Receives before SQS moves a message to the DLQ.",
)
@click.option(
    "--interactive",
    is_flag=True,
    help="Also the interactive jobs' queue (QUEUE-interactive): workers serve it first.",
)
@json_option('{"queue": URL, "dlq": URL} (and "interactive": URL with --interactive).')
@click.pass_context
def queue_create(
    ctx: click.Context, visibility: int, max_receives: int, interactive: bool, as_json: bool
) -> None:
    """Create the job queue with a DLQ and redrive (idempotent); print both URLs."""
    settings = _settings(ctx)
    url, dlq = create_queue(
        settings, visibility=visibility, max_receives=max_receives, interactive=interactive
    )
    fast = queue_url(settings, settings.interactive_queue) if interactive else None
    if as_json:
        emit_json({"queue": url, "dlq": dlq, **({"interactive": fast} if fast else {})})
        return
    click.echo(f"queue {url}")
    click.echo(f"dlq {dlq}")
    if fast:
        click.echo(f"interactive {fast}")


# --------------------------------------------------------------------------- submit


@cli.command()
@click.argument("job_class")
@click.option("--payload", required=True, help="JSON object, or @FILE (@- reads stdin).")
@click.option("--id", "job_id", default=None, help="Job id (default: derived from class+payload).")
@click.option(
    "--app",
    "app_spec",
    default=None,
    envvar="SQS_LEASE_APP",
    help="MODULE:OBJECT app: check the class and validate the payload before sending "
    "(default: env SQS_LEASE_APP; without it nothing is validated, and the command says so).",
)
@click.option("--delay", type=click.IntRange(0, 900), default=0, show_default=True, help="Seconds.")
@click.option("--group", default=None, help="Agent session (or run) id: `jobs cancel --group`.")
@click.option("--tenant", default=None, help="Whose job it is (user, account): its own limit.")
@click.option(
    "--priority",
    type=click.Choice(["interactive", "batch"]),
    default="batch",
    show_default=True,
    help="interactive: the interactive queue, served first (queue create --interactive).",
)
@click.option(
    "--interleave-stages",
    is_flag=True,
    help="FIFO: accept that later jobs of the --group run between this staged job's stages.",
)
@json_option()
@click.pass_context
def submit(
    ctx: click.Context,
    job_class: str,
    payload: str,
    job_id: str | None,
    app_spec: str | None,
    delay: int,
    group: str | None,
    tenant: str | None,
    priority: Priority,
    interleave_stages: bool,
    as_json: bool,
) -> None:
    """Submit a job once; submitting the same job again is a no-op.

    With --app the job class and payload are checked against the app first (a bad
    payload is refused before anything is written); without it nothing is validated
    and a note on stderr says so: the worker validates when it claims the job.
    """
    data = _read_payload(payload)
    settings = _settings(ctx)
    app = None
    if app_spec:
        _importable_cwd()
        app = load_app(app_spec)
    producer = Producer(settings, app)
    _ = producer.queue_url  # a missing queue says `sqs-lease queue create`
    try:
        result = producer.submit(
            job_class,
            data,
            job_id,
            delay_seconds=delay,
            group=group,
            tenant=tenant,
            priority=priority,
            interleave_stages=interleave_stages,
        )
    except ResourceMissing:
        check_table(settings)  # a missing table says `sqs-lease tables create`
        raise
    if as_json:
        emit_json(
            {
                "job_id": result.job_id,
                "created": result.created,
                "note": result.note,
                "message_id": result.message_id,
                "send_id": result.send_id,
                "validated": app is not None,
                "app": app_spec or None,
            }
        )
    else:
        status = "created" if result.created else "already"
        row(result.job_id, status, result.note)
    if app is None:
        note(
            "payload not validated (no --app): a payload its job class refuses fails when a "
            "worker claims the job; give --app MODULE:OBJECT (or SQS_LEASE_APP) to check it now"
        )


# --------------------------------------------------------------------------- worker


@cli.command()
@click.argument("app_spec", metavar="MODULE:OBJECT", required=False)
@click.option(
    "--async/--threads",
    "use_async",
    default=None,
    help="The shell: one event loop (async handlers; plain ones in a thread pool) or a "
    "thread per job. Default: async if any handler is an async def, else threads.",
)
@click.option(
    "--concurrency",
    type=click.IntRange(1, 100_000),
    default=None,
    help="Jobs held at once. Default: 4 (threads, at most 1000), 1000 (async).",
)
@click.option(
    "--max-loop-lag",
    type=click.FloatRange(0, min_open=True),
    default=None,
    help="Async: seconds a handler may hold the event loop before it loses its lease "
    "(default 1, lowered to fit the shortest lease).",
)
@click.option("--receive-wait", type=click.IntRange(0, 20), default=None, help="Default 2.")
@click.option(
    "--receive-window",
    type=click.FloatRange(0, 20),
    default=None,
    help="Seconds to wait after a receive that came back short, so messages that trickle "
    "in are received 10 at a time (fewer requests, up to that much latency). Default 0: off.",
)
@click.option(
    "--shutdown-grace",
    type=click.FloatRange(0),
    default=None,
    help="Seconds running handlers get after SIGTERM (default: fits --stop-timeout, else 20).",
)
@click.option(
    "--stop-timeout",
    type=click.FloatRange(0, 120, min_open=True),
    default=None,
    help="The ECS task's stopTimeout: the grace must fit below it.",
)
@click.option(
    "--idle-exit", type=click.FloatRange(0), default=None, help="Exit after this many idle seconds."
)
@click.option("--max-messages", type=click.IntRange(1), default=None, help="Exit after N received.")
@click.option("--worker-id", default=None, help="Default: host-pid-random.")
@click.option(
    "--sweep-interval",
    type=click.FloatRange(0),
    default=None,
    help="Seconds between sweeps for jobs stranded without a message (default 60); 0: off.",
)
@click.option(
    "--sweep-grace",
    type=click.FloatRange(0),
    default=None,
    help=f"Sweep only jobs without a sent message for this many seconds "
    f"(default {UNSENT_GRACE_SECONDS:g}).",
)
@click.option("--sweep-limit", type=click.IntRange(1, 1000), default=None, help="Default 25.")
@click.option(
    "--unknown-class-receives",
    type=click.IntRange(1),
    default=None,
    help="Receives of a message whose job class this app does not know (another version "
    f"on the queue) before it goes to the DLQ (default {UNKNOWN_CLASS_RECEIVES}); until then "
    "it is left for other workers.",
)
@click.option(
    "--metrics/--no-metrics",
    default=None,
    help="CloudWatch EMF metrics on stdout (default: env SQS_LEASE_METRICS, else off).",
)
@click.option(
    "--output",
    type=click.Choice(["json", "human"]),
    default="json",
    show_default=True,
    help="Journal on stderr: JSON lines for machines, or readable lines for people (with a "
    "live status line on a terminal).",
)
@json_option("Final counters as one JSON object on stdout (always so with --output json).")
@click.pass_context
def worker(
    ctx: click.Context, /, app_spec: str | None, output: str, as_json: bool, **options: Any
) -> None:
    """Run a worker for an app; journal on stderr, final stats (JSON) on stdout.

    Every option also comes from an environment variable, SQS_LEASE_<OPTION>
    (SQS_LEASE_APP for MODULE:OBJECT): a container runs `sqs-lease worker` with
    its settings in the environment. Ctrl-C or SIGTERM stops it gracefully: no
    new jobs, running handlers told to stop, the rest handed back within
    --shutdown-grace. The exit code says how it ended (docs/operations.md,
    "Exit codes").
    """
    from .service import ExitCode, ServiceResult, WorkerEnv, app_of, run_worker

    settings = _settings(ctx)
    _importable_cwd()
    try:
        env = WorkerEnv.load(app=app_spec, **options)
    except ConfigError as exc:
        _fail(str(exc), int(ExitCode.CONFIG))
    app = app_of(env)
    if isinstance(app, ServiceResult):
        _fail(app.message, int(app.code))
    with ExitStack() as stack:
        console: HumanConsole | None = None
        if output == "human":
            console = stack.enter_context(HumanConsole(sys.stderr))
        else:
            # Only a worker that will run sends the journal to stderr (this changes
            # the process's logging, which a caller of the CLI in-process keeps).
            configure_stderr()

        def watch(w: Any) -> None:
            if console is not None:
                console.watch(lambda: {"in_flight": len(w.book), **dataclasses.asdict(w.stats)})

        with _stop_signals(None):
            result = run_worker(settings, env, app=app, on_worker=watch)
    if result.stats is not None:
        counters = dataclasses.asdict(result.stats)
        if output == "json" or as_json:
            click.echo(json.dumps(counters, sort_keys=True))
        else:
            done = ", ".join(f"{k} {v}" for k, v in counters.items() if v)
            click.echo(f"stopped: {done or 'nothing received'}")
    if result.code is not ExitCode.OK:
        _fail(_error_text(SqsLeaseError(result.message), settings), int(result.code))


# --------------------------------------------------------------------------- jobs


@cli.group()
def jobs() -> None:
    """Inspect and cancel jobs."""


_INDEXED_STATES = (*ATTENTION_STATES, "running")


def _list_jobs(
    settings: Settings, state: str | None, limit: int, scan: bool
) -> tuple[list[JobRecord], bool]:
    """Up to ``limit`` job records, and whether more exist. Never a full Scan unless
    asked: parked and failed jobs come from the sparse ``attention`` index, running
    ones from the workers' liveness records (``workers`` index), no state from one
    bounded page of the table; a state with no index needs ``--scan``."""
    ddb = make_client(settings, "dynamodb")
    names = {f"#f{i}": name for i, name in enumerate(JOB_LIST_FIELDS)}
    projection = {"ProjectionExpression": ", ".join(names), "ExpressionAttributeNames": names}
    if state in ATTENTION_STATES:
        items, more = _query_items(
            ddb,
            {
                "TableName": settings.jobs_table,
                "IndexName": ATTENTION_INDEX,
                "KeyConditionExpression": "#a = :a",
                "ExpressionAttributeNames": {"#a": "attention"},
                "ExpressionAttributeValues": {":a": {"S": state}},
                "ScanIndexForward": False,  # newest first
            },
            limit,
        )
        found = [record_of(item) for item in items]
    elif state == "running":
        found, more = _running_jobs(settings, ddb, projection, limit)
    elif state is not None and not scan:
        _fail(
            f"jobs list --state {state}: no index holds {state} jobs, so listing them reads "
            "the whole table (a Scan: about 0.5 read units per 4 KB of every record); add "
            "--scan to run it anyway, or list an indexed state "
            f"({', '.join(_INDEXED_STATES)}); `jobs show ID` reads one job",
            EXIT_ERROR,
        )
    else:
        params: dict[str, Any] = {"TableName": settings.jobs_table, **projection}
        if state:
            params["FilterExpression"] = "#st = :st"
            params["ExpressionAttributeNames"] = {**names, "#st": "state"}
            params["ExpressionAttributeValues"] = {":st": {"S": state}}
        else:
            # Not the workers' liveness records.
            params["FilterExpression"] = "attribute_exists(#st)"
            params["ExpressionAttributeNames"] = {**names, "#st": "state"}
        items, more = _scan_items(ddb, params, limit)
        found = [record_of(item) for item in items]
    found.sort(key=lambda r: (r.created_at or 0, r.job_id))
    return found, more


def _query_items(ddb: Any, params: dict[str, Any], limit: int) -> tuple[list[dict[str, Any]], bool]:
    """Up to ``limit`` items of a Query, following its pages (one item past the
    limit is read to know whether more exist): reads only what it returns."""
    params = dict(params)
    found: list[dict[str, Any]] = []
    want = limit + 1
    while len(found) < want:
        page = ddb.query(**params, Limit=want - len(found))
        found.extend(page.get("Items", []))
        start = page.get("LastEvaluatedKey")
        if not start:
            break
        params["ExclusiveStartKey"] = start
    return found[:limit], len(found) > limit


def _running_jobs(
    settings: Settings, ddb: Any, projection: dict[str, Any], limit: int
) -> tuple[list[JobRecord], bool]:
    """Running jobs: what the workers' liveness records say they hold (found through
    the keys-only ``workers`` index), each read from its record (eventually
    consistent) and kept only if it still says running."""
    workers: list[str] = []
    params: dict[str, Any] = {
        "TableName": settings.jobs_table,
        "IndexName": WORKERS_INDEX,
        "KeyConditionExpression": "#k = :k",
        "ExpressionAttributeNames": {"#k": "kind"},
        "ExpressionAttributeValues": {":k": {"S": "liveness"}},
    }
    while True:
        page = ddb.query(**params)
        for item in page.get("Items", []):
            key = item["job_id"]["S"].removeprefix(LIVENESS_PREFIX)
            if "#" not in key:  # part 0 names the worker; _liveness reads the rest
                workers.append(key)
        if not page.get("LastEvaluatedKey"):
            break
        params["ExclusiveStartKey"] = page["LastEvaluatedKey"]
    live = _liveness(settings, workers) if workers else {}
    held = sorted({h.job_id for parts in live.values() for p in parts for h in p.held})
    found: list[JobRecord] = []
    for i in range(0, len(held), 100):
        want: dict[str, Any] = {
            settings.jobs_table: {
                "Keys": [{"job_id": {"S": j}} for j in held[i : i + 100]],
                **projection,
            }
        }
        for _ in range(5):
            page = ddb.batch_get_item(RequestItems=want)
            for item in page.get("Responses", {}).get(settings.jobs_table, []):
                rec = record_of(item)
                if rec.state == "running":
                    found.append(rec)
            want = page.get("UnprocessedKeys") or {}
            if not want:
                break
        if len(found) > limit:
            break
    found.sort(key=lambda r: (r.created_at or 0, r.job_id))
    return found[:limit], len(found) > limit


def _scan_items(ddb: Any, params: dict[str, Any], limit: int) -> tuple[list[dict[str, Any]], bool]:
    """Up to ``limit`` items of a (maybe filtered) Scan, following its pages, and
    whether more exist (one item past the limit is read to know it for sure)."""
    filtered = "FilterExpression" in params
    params = dict(params)
    found: list[dict[str, Any]] = []
    want = limit + 1
    while len(found) < want:
        # Limit counts items read before the filter; read wider pages when filtering.
        page = ddb.scan(**params, Limit=max(want - len(found), 100 if filtered else 1))
        found.extend(page.get("Items", []))
        start = page.get("LastEvaluatedKey")
        if not start:
            break
        params["ExclusiveStartKey"] = start
    return found[:limit], len(found) > limit


def _limit_note(what: str, limit: int, narrow: str) -> None:
    note(
        f"--limit {limit} reached: more {what} exist and are not shown; raise --limit, "
        f"or narrow with {narrow}"
    )


@jobs.command("list")
@click.option(
    "--state",
    type=click.Choice(["queued", "running", "succeeded", "failed", "parked"]),
    default=None,
)
@click.option("--limit", type=click.IntRange(1), default=50, show_default=True)
@click.option(
    "--scan",
    is_flag=True,
    help="Allow a filtered table Scan for a state no index holds (queued, succeeded).",
)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@click.pass_context
def jobs_list(ctx: click.Context, state: str | None, limit: int, scan: bool, as_json: bool) -> None:
    """List jobs; the whole reason, wrapped on a terminal.

    Parked and failed jobs come from an index (newest first), running ones from the
    workers' liveness records, no --state from one bounded page of the table; queued
    and succeeded need --scan (no index holds them). When --limit cut the list, a
    note on stderr says so.
    """
    settings = _settings(ctx)
    check_table(settings)
    records, more = _list_jobs(settings, state, limit, scan)
    owners = {r.owner for r in records if r.state == "running" and r.owner}
    live = _liveness(settings, owners) if owners else {}
    now = time.time()
    if more:
        _limit_note("jobs", limit, "--state")
    if as_json:
        for rec in records:
            click.echo(json.dumps(_fields(rec, now, JOB_LIST_FIELDS, live), default=str))
        return
    rows = [["JOB ID", "CLASS", "STATE", "OWNER", "TOKEN", "ATT", "LEASE", "BEAT", "REASON"]]
    for rec in records:
        alive = _alive(rec, now, live)
        rows.append(
            [
                rec.job_id,
                rec.job_class or "-",
                rec.state or "-",
                rec.owner or "-",
                str(rec.token),
                str(rec.attempt),
                alive.lease_left,
                alive.heartbeat_age,
                _reason(rec.reason),
            ]
        )
    click.echo(table(rows))


@jobs.command("timeline")
@click.argument("job_id")
@click.option(
    "--html",
    "html_path",
    type=click.Path(dir_okay=False, writable=True, path_type=Path),
    default=None,
    help="Also write a self-contained page (inline SVG) to FILE, to share in an incident.",
)
@click.option(
    "--journal",
    "journals",
    multiple=True,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="A worker's journal file (JSON lines): adds its lease-lost and ownership-unknown"
    " events for the job. Repeatable.",
)
@click.option(
    "--intents/--no-intents",
    "with_intents",
    default=True,
    show_default=True,
    help="Add the job's intent transitions, read from the intents and attempts tables"
    " (a filtered scan of the intents table: --no-intents skips it on a large one).",
)
@json_option("One JSON object: job_id, state, token, events[].")
@click.pass_context
def jobs_timeline(
    ctx: click.Context,
    job_id: str,
    html_path: Path | None,
    journals: tuple[Path, ...],
    with_intents: bool,
    as_json: bool,
) -> None:
    """Draw who held a job when: owners as lanes, tokens, gaps, refused writes marked.

    The events are kept on the job record by the writes that made them; a refused
    commit rides on the stale worker's record of its rejected result. Lease lost and
    ownership unknown show as the next owner's takeover, and in full with --journal.
    Intent transitions (prepared, started, confirmed, unknown, reconciled) come from
    the intents' own records: their keys and tools, never payloads.
    """
    item = _job_item(ctx, job_id)
    facts: list[IntentFacts] = []
    if with_intents:
        facts, more = _intent_facts(_settings(ctx), job_id)
        if more:
            _limit_note("intents of the job", TIMELINE_INTENTS, "--no-intents")
    tl = timeline_of(item, read_journal(*journals), facts)
    if html_path is not None:
        html_path.write_text(render_html(tl), encoding="utf-8")
        note(f"wrote {html_path}")
    if as_json:
        emit_json(tl.as_json())
        return
    click.echo(render_text(tl))


@jobs.command("show")
@click.argument("job_id")
@click.option("--payload", "with_payload", is_flag=True, help="Also print the payload JSON.")
@click.option("--result", "with_result", is_flag=True, help="Also print the result JSON.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object.")
@click.pass_context
def jobs_show(
    ctx: click.Context, job_id: str, with_payload: bool, with_result: bool, as_json: bool
) -> None:
    """Show one job record (the payload only with --payload).

    A running job's lease left and heartbeat age come from its owner's liveness
    record (written once per heartbeat round); ``liveness`` says where they came
    from, or that none was found.
    """
    settings = _settings(ctx)
    item = _job_item(ctx, job_id)
    rec = record_of(item)
    now = time.time()
    # A staged job's checkpoints and stage input are shown as its stages, not as JSON
    # text; the timeline is drawn by `jobs timeline`.
    hidden = ("payload", "result", "timeline", "stages", "stage_input")
    names = [n for n in JobRecord.get_attributes() if n not in hidden]
    names.sort(key=lambda n: (n != "job_id", n))
    live = _liveness(settings, [rec.owner]) if rec.state == "running" and rec.owner else {}
    data = _fields(rec, now, names, live)
    data["timeline_events"] = len(rec.timeline or ())  # drawn by `jobs timeline`
    rows = stage_rows(view_of(item))
    if rows:
        data["stages"] = rows
    if with_payload:
        data["payload"] = _json_or_text(rec.payload)
    if with_result:
        data["result"] = _json_or_text(rec.result)
    if as_json:
        click.echo(json.dumps(data, default=str))
        return
    for name, value in data.items():
        if name == "stages":
            click.echo("stages:")
            for row in value:
                took = "-" if row["duration"] is None else f"{row['duration']:g} s"
                result = "-" if row["result"] is None else _short_json(row["result"])
                field(
                    row["stage"],
                    f"{row['state']}, attempts {row['attempts']}, "
                    f"token {row['token']}, {took}, result {result}",
                    lead="  ",
                )
            continue
        if name in _TIME_FIELDS and value is not None:
            value = f"{value} ({_iso(value)})"
        elif name in ("payload", "result") and value is not None:
            value = json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)
            field(name, value, ours=True)
            continue
        field(name, value)


def _short_json(value: Any, limit: int = 120) -> str:
    text = json.dumps(value, sort_keys=True, ensure_ascii=False)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _json_or_text(text: str | None) -> Any:
    if text is None:
        return None
    try:
        return _loads(text)
    except ValueError:
        return text


@jobs.command("cancel")
@click.argument("job_id", required=False)
@click.option("--group", default=None, help="Cancel every job of this agent session instead.")
@click.option("--reason", default="cancelled by request", show_default=True)
@json_option()
@click.pass_context
def jobs_cancel(
    ctx: click.Context, job_id: str | None, group: str | None, reason: str, as_json: bool
) -> None:
    """End a job (or with --group, every open job of a session) failed (cancelled);
    owners lose their leases at their next heartbeat, and a cancelled session
    takes no new submits.

    A job already final (succeeded, failed or cancelled before) is left as it is:
    the command says "nothing to do" and exits 3.
    """
    if (job_id is None) == (group is None):
        raise click.UsageError("name a JOB_ID or --group ID (one of them)")
    if group is not None:
        rep = Producer(_settings(ctx)).cancel_group(group, reason)
        if as_json:
            emit_json(
                {
                    "group": rep.group,
                    "cancelled": list(rep.cancelled),
                    "finished": [{"job_id": j, "state": e} for j, e in rep.finished],
                    "jobs": rep.jobs,
                    "missing": rep.missing,
                    "reason": rep.reason,
                }
            )
        else:
            for jid in rep.cancelled:
                row(jid, "cancelled")
            for jid, ended in rep.finished:
                row(jid, f"already {ended}")
            click.echo(
                f"group {visible(rep.group)}: {len(rep.cancelled)} cancelled, "
                f"{len(rep.finished)} already finished, of {rep.jobs} submitted "
                f"({visible(rep.reason)})"
            )
        if rep.missing:
            _fail(f"{rep.missing} job(s) of the group not yet in its index: run it again", 1)
        return
    done = Producer(_settings(ctx)).cancel_job(job_id or "", reason)
    view = done.job
    data = {
        "job_id": view.job_id,
        "verdict": done.verdict,
        "state": view.state.value,
        "token": view.token,
        "error_code": view.error_code,
        "reason": view.reason,
    }
    if done.verdict == "already_final":
        why = f" ({view.reason})" if view.reason else ""
        noop(
            f"job {job_id!r} is already {view.state.value}{why}: not cancelled",
            as_json=as_json,
            data=data,
        )
    if as_json:
        emit_json(data)
        return
    row(view.job_id, view.state, f"token {view.token}", view.error_code or "-", view.reason or "-")


@jobs.command("resume")
@click.argument("job_id")
@json_option()
@click.pass_context
def jobs_resume(ctx: click.Context, job_id: str, as_json: bool) -> None:
    """Re-enqueue a parked job once you have decided (see docs/operations.md).

    The resume grants the attempt it starts (granted_attempts, shown by `jobs
    show`). Safe to repeat: a job left queued without a sent message is sent again.
    A job neither parked nor unsent is left alone: "nothing to do", exit 3.
    """
    resumed = Producer(_settings(ctx)).resume(job_id)
    data = {
        "job_id": job_id,
        "verdict": resumed.verdict,
        "state": resumed.state.value,
        "note": resumed.note,
        "send_id": resumed.send_id,
        "message_id": resumed.message_id,
    }
    if resumed.verdict == "not_parked":
        noop(
            f"job {job_id!r} is {resumed.state.value}, not parked, and its message is sent: "
            "nothing to resume",
            as_json=as_json,
            data=data,
        )
    if as_json:
        emit_json(data)
        return
    row(job_id, "queued", resumed.note)


@jobs.command("retry")
@click.argument("job_id")
@click.option(
    "--stage",
    default=None,
    help="The stage to retry: must be the job's failed (current) stage; a committed "
    "stage is refused (it runs once per job).",
)
@json_option()
@click.pass_context
def jobs_retry(ctx: click.Context, job_id: str, stage: str | None, as_json: bool) -> None:
    """Run a failed (or parked) job again from where it ended (see docs/stages.md).

    A staged job goes on at its failed stage with a fresh count of attempts; the
    stages committed before it keep their checkpoints and are not run again. The
    write is conditional on the state and token read: a second retry of the same
    failure does nothing ("nothing to do", exit 3). A cancelled job is refused.
    """
    retried = Producer(_settings(ctx)).retry(job_id, stage)
    data = {
        "job_id": job_id,
        "verdict": retried.verdict,
        "state": retried.state.value,
        "stage": retried.stage,
        "committed_stages": list(retried.kept),
        "note": retried.note,
        "send_id": retried.send_id,
        "message_id": retried.message_id,
    }
    if retried.verdict == "nothing_to_do":
        noop(f"job {job_id!r}: {retried.note}", as_json=as_json, data=data)
    if as_json:
        emit_json(data)
        return
    row(job_id, "queued", retried.note)


@jobs.command("repair")
@click.option(
    "--older-than",
    type=click.FloatRange(0),
    default=UNSENT_GRACE_SECONDS,
    show_default=True,
    help="Only records without a sent message for this many seconds.",
)
@click.option("--limit", type=click.IntRange(1, 1000), default=100, show_default=True)
@click.option("--dry-run", is_flag=True, help="Only list what would be sent again.")
@json_option()
@click.pass_context
def jobs_repair(
    ctx: click.Context, older_than: float, limit: int, dry_run: bool, as_json: bool
) -> None:
    """Send again jobs stranded without a message (a producer died between its
    write and its send, a resume whose send failed). Queries a sparse index."""
    settings = _settings(ctx)
    check_table(settings)
    report = Producer(settings).repair(older_than=older_than, limit=limit, dry_run=dry_run)
    counts = {v: sum(1 for j in report.jobs if j.verdict == v) for v in ("resent", "failed")}
    if as_json:
        emit_json(
            {
                "dry_run": dry_run,
                "more": report.more,
                "jobs": [
                    {
                        "job_id": j.job_id,
                        "job_class": j.job_class,
                        "unsent_for": round(j.unsent_for, 3),
                        "verdict": j.verdict,
                        "detail": j.detail,
                    }
                    for j in report.jobs
                ],
            }
        )
        if counts["failed"]:
            raise click.exceptions.Exit(EXIT_NOT_FOUND)
        return
    for job in report.jobs:
        what = {
            "resent": "sent again",
            "would_resend": "would send again",
            "moved": "skipped: sent, claimed or taken over meanwhile",
            "cleared": "taken out of the unsent index: it no longer waits for a message",
            "failed": f"failed: {job.detail}",
        }[job.verdict]
        row(job.job_id, job.job_class, f"unsent for {_seconds(job.unsent_for)}", what)
    if dry_run:
        summary = f"{len(report.jobs)} stranded (dry run: nothing sent)"
    else:
        summary = f"{len(report.jobs)} stranded, {counts['resent']} sent again"
        summary += f", {counts['failed']} failed" if counts["failed"] else ""
    if report.more:
        summary += f"; --limit {limit} reached: run again for more"
    click.echo(summary)
    if counts["failed"]:
        raise click.exceptions.Exit(EXIT_NOT_FOUND)


# --------------------------------------------------------------------------- intents

# Read besides, for a job's timeline (still never payloads or responses).
_INTENT_TIMELINE_FIELDS = ("confirmed_at", "reconciled")
_INTENT_TIME_FIELDS = (
    "created_at",
    "updated_at",
    "first_started_at",
    "confirmed_at",
    "resolved_at",
)
_RESOLUTION_FIELDS = ("resolution", "resolved_by", "resolved_at", "resolution_reason")
_ATTEMPT_FIELDS = (
    "attempt",
    "token",
    "worker",
    "tool",
    "action",
    "payload_hash",
    "started_at",
    "ended_at",
    "duration",
    "outcome",
    "success",
    "error",
    "external_id",
    "response",
)


def _intent_of(item: dict[str, Any]) -> IntentRecord:
    rec: IntentRecord = IntentRecord.from_raw_data(item)
    return rec


def _attempt_of(item: dict[str, Any]) -> AttemptRecord:
    rec: AttemptRecord = AttemptRecord.from_raw_data(item)
    return rec


def _list_intents(
    settings: Settings, state: str | None, job_id: str | None, limit: int, scan: bool
) -> tuple[list[IntentRecord], bool]:
    """Up to ``limit`` intents: ambiguous ones from the sparse ``ambiguous`` index (a
    Query, newest first), none filtered from one bounded page of the table; any
    other filter needs ``--scan`` (no index holds it)."""
    ddb = make_client(settings, "dynamodb")
    if state == IntentState.AMBIGUOUS.value:
        params_q: dict[str, Any] = {
            "TableName": settings.intents_table,
            "IndexName": AMBIGUOUS_INDEX,
            "KeyConditionExpression": "#a = :a",
            "ExpressionAttributeNames": {"#a": "attention"},
            "ExpressionAttributeValues": {":a": {"S": state}},
            "ScanIndexForward": False,
        }
        if job_id:
            params_q["FilterExpression"] = "#job = :job"
            params_q["ExpressionAttributeNames"]["#job"] = "job_id"
            params_q["ExpressionAttributeValues"][":job"] = {"S": job_id}
        items, more = _query_items(ddb, params_q, limit)
        found = [_intent_of(item) for item in items]
        found.sort(key=lambda r: (r.created_at or 0, r.intent_key))
        return found, more
    if (state or job_id) and not scan:
        what = " ".join(
            part
            for part in (f"--state {state}" if state else "", f"--job {job_id}" if job_id else "")
            if part
        )
        _fail(
            f"intents list {what}: no index holds this filter, so listing reads the whole "
            "intents table (a Scan); add --scan to run it anyway, or list --state ambiguous "
            "(indexed); `jobs timeline JOB_ID` and `intents show KEY` read one job or intent",
            EXIT_ERROR,
        )
    fields = INTENT_LIST_FIELDS + _INTENT_TIMELINE_FIELDS
    names = {f"#f{i}": name for i, name in enumerate(fields)}
    params: dict[str, Any] = {
        "TableName": settings.intents_table,
        # Never read payloads or responses just to list intents.
        "ProjectionExpression": ", ".join(names),
        "ExpressionAttributeNames": names,
    }
    filters: list[str] = []
    values: dict[str, Any] = {}
    if state:
        filters.append("#st = :st")
        names["#st"] = "state"
        values[":st"] = {"S": state}
    if job_id:
        filters.append("#job = :job")
        names["#job"] = "job_id"
        values[":job"] = {"S": job_id}
    if filters:
        params["FilterExpression"] = " AND ".join(filters)
        params["ExpressionAttributeValues"] = values
    items, more = _scan_items(ddb, params, limit)
    found = [_intent_of(item) for item in items]
    found.sort(key=lambda r: (r.created_at or 0, r.intent_key))
    return found, more


def _intent_row(rec: IntentRecord, now: float) -> dict[str, Any]:
    out: dict[str, Any] = {name: getattr(rec, name, None) for name in INTENT_LIST_FIELDS}
    out["updated_age"] = _age(now, rec.updated_at)
    return out


@cli.group()
def intents() -> None:
    """Inspect side-effect intents and resolve ambiguous ones."""


@intents.command("list")
@click.option("--state", type=click.Choice([s.value for s in IntentState]), default=None)
@click.option("--job", "job_id", default=None, help="Only this job's intents.")
@click.option("--limit", type=click.IntRange(1), default=50, show_default=True)
@click.option(
    "--scan", is_flag=True, help="Allow a filtered table Scan for a filter no index holds."
)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@click.pass_context
def intents_list(
    ctx: click.Context,
    state: str | None,
    job_id: str | None,
    limit: int,
    scan: bool,
    as_json: bool,
) -> None:
    """List intents (never payloads): ambiguous ones from an index, no filter from one
    bounded page; other filters need --scan. A note says when --limit cut the list."""
    settings = _settings(ctx)
    check_table(settings)
    records, more = _list_intents(settings, state, job_id, limit, scan)
    now = time.time()
    if more:
        _limit_note("intents", limit, "--state or --job")
    if as_json:
        for rec in records:
            click.echo(json.dumps(_intent_row(rec, now), default=str))
        return
    rows = [
        [
            "KEY",
            "JOB",
            "ACTION",
            "TARGET",
            "STATE",
            "ATT",
            "TOKEN",
            "EXTERNAL ID",
            "UPDATED",
            "REASON",
        ]
    ]
    for rec in records:
        rows.append(
            [
                rec.intent_key,
                rec.job_id or "-",
                rec.action or "-",
                rec.target or "-",
                rec.state or "-",
                str(rec.attempts),
                str(rec.last_token),
                rec.external_id or "-",
                _age(now, rec.updated_at),
                _reason(rec.reason),
            ]
        )
    click.echo(table(rows))


TIMELINE_INTENTS = 200
"""Intents of one job `jobs timeline` reads at most (a note says when more exist)."""


def _intent_facts(settings: Settings, job_id: str) -> tuple[list[IntentFacts], bool]:
    """The job's intents and their attempt logs, as the timeline reads them."""
    records, more = _list_intents(settings, None, job_id, TIMELINE_INTENTS, scan=True)
    facts = [
        IntentFacts(
            key=rec.intent_key,
            target=rec.target,
            action=rec.action,
            state=rec.state,
            created_at=float(rec.created_at or 0),
            updated_at=float(rec.updated_at or 0),
            confirmed_at=None if rec.confirmed_at is None else float(rec.confirmed_at),
            reconciled=bool(rec.reconciled),
            attempts=tuple(
                IntentAttemptFacts(
                    attempt=int(a.attempt),
                    job_id=a.job_id,
                    token=int(a.token),
                    worker=a.worker,
                    started_at=float(a.started_at),
                    ended_at=None if a.ended_at is None else float(a.ended_at),
                    outcome=a.outcome,
                )
                for a in _attempts_of(settings, rec.intent_key)
            ),
        )
        for rec in records
    ]
    return facts, more


def _attempts_of(settings: Settings, key: str) -> list[AttemptRecord]:
    ddb = make_client(settings, "dynamodb")
    params: dict[str, Any] = {
        "TableName": settings.attempts_table,
        "KeyConditionExpression": "#k = :k",
        "ExpressionAttributeNames": {"#k": "intent_key"},
        "ExpressionAttributeValues": {":k": {"S": key}},
        "ScanIndexForward": True,
        "ConsistentRead": True,
    }
    found: list[AttemptRecord] = []
    while True:
        page = ddb.query(**params)
        found.extend(_attempt_of(item) for item in page.get("Items", []))
        start = page.get("LastEvaluatedKey")
        if not start:
            return found
        params["ExclusiveStartKey"] = start


def _attempt_fields(rec: AttemptRecord) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in _ATTEMPT_FIELDS:
        if name == "duration":
            out[name] = (
                None
                if rec.ended_at is None or rec.started_at is None
                else round(rec.ended_at - rec.started_at, 3)
            )
        elif name == "response":
            out[name] = _json_or_text(rec.response)
        else:
            out[name] = getattr(rec, name, None)
    return out


@intents.command("show")
@click.argument("key")
@click.option("--payload", "with_payload", is_flag=True, help="Also print the payload JSON.")
@click.option(
    "--response",
    "with_response",
    is_flag=True,
    help="Also print the response the target returned (kept on the intent for replays).",
)
@click.option("--json", "as_json", is_flag=True, help="One JSON object.")
@click.pass_context
def intents_show(
    ctx: click.Context, key: str, with_payload: bool, with_response: bool, as_json: bool
) -> None:
    """Show one intent and every attempt of it.

    Bodies only on request: the payload with --payload, the target's response kept
    on the intent with --response. The attempt log holds a response only where the
    target logs bodies (``app.target(..., log_bodies=True)``)."""
    settings = _settings(ctx)
    check_table(settings)
    ddb = make_client(settings, "dynamodb")
    item = ddb.get_item(
        TableName=settings.intents_table, Key={"intent_key": {"S": key}}, ConsistentRead=True
    ).get("Item")
    if not item:
        _fail(f"no intent {key!r}", 1)
    rec = _intent_of(item)
    names = [
        n
        for n in IntentRecord.get_attributes()
        if n not in ("payload", "response") and n not in _RESOLUTION_FIELDS
    ]
    names.sort(key=lambda n: (n != "intent_key", n))
    intent: dict[str, Any] = {name: getattr(rec, name, None) for name in names}
    if with_response:
        intent["response"] = _json_or_text(rec.response)
    if rec.resolution is not None:
        intent.update({name: getattr(rec, name, None) for name in _RESOLUTION_FIELDS})
    if with_payload:
        intent["payload"] = _json_or_text(rec.payload)
    attempts = [_attempt_fields(a) for a in _attempts_of(settings, key)]
    if as_json:
        click.echo(json.dumps({"intent": intent, "attempts": attempts}, default=str))
        return
    for name, value in intent.items():
        field(name, _show_value(name, value), ours=name in _BODIES)
    click.echo(f"attempt log: {len(attempts)}")
    for entry in attempts:
        for i, (name, value) in enumerate(entry.items()):
            if name == "response" and value is None:
                continue  # stored only when the target opts in to bodies
            lead = "- " if i == 0 else "  "
            field(name, _show_value(name, value, indent="  "), lead=lead, ours=name in _BODIES)


_BODIES = ("payload", "response")


def _show_value(name: str, value: Any, indent: str = "") -> str:
    if value is None:
        return "-"
    if name in _INTENT_TIME_FIELDS or name in ("started_at", "ended_at"):
        return f"{value} ({_iso(value)})"
    if name == "duration":
        return _seconds(value)
    if name in ("payload", "response"):
        text = json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)
        return text.replace("\n", "\n" + indent)
    return str(value)


def _default_who() -> str:
    try:
        user = getpass.getuser()
    except (OSError, KeyError):  # no login name in the environment or the password database
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


@intents.command("resolve")
@click.argument("key")
@click.option(
    "--confirmed",
    "external_id",
    metavar="EXTERNAL_ID",
    default=None,
    help="The effect did apply; record the target's id for it.",
)
@click.option("--retry", is_flag=True, help="The effect did not apply; repeat it (same key).")
@click.option("--abandon", is_flag=True, help="Never do this effect; the job fails at it.")
@click.option(
    "--reason", default=None, help="Why (required with --abandon; default: resolved by operator)."
)
@click.option("--who", default=None, help="Who decides (default: USER@HOST).")
@click.option(
    "--force",
    is_flag=True,
    help="With --retry: repeat even where the target no longer protects the key.",
)
@click.option(
    "--new-operation",
    is_flag=True,
    help="Approve a new, separate operation under a derived key (needs --reason).",
)
@click.option(
    "--attempt",
    type=click.IntRange(min=1),
    default=None,
    help="The intent attempt you decided on (as `intents show` prints it): refused if "
    "the intent has moved on since. Give it when you run a resolve again.",
)
@json_option()
@click.pass_context
def intents_resolve(
    ctx: click.Context,
    key: str,
    external_id: str | None,
    retry: bool,
    abandon: bool,
    reason: str | None,
    who: str | None,
    force: bool,
    new_operation: bool,
    attempt: int | None,
    as_json: bool,
) -> None:
    """Decide an ambiguous intent; its parked job is re-enqueued (journaled on stderr).

    A decision is about one attempt's ambiguity: with --attempt N it is refused
    ("changed meanwhile") if the job ran again since and the intent is now at
    another attempt, so running the same command again never settles a newer
    ambiguity with an older judgement.

    --new-operation approves a new, separate operation: the intent becomes
    `superseded`, its successor key (KEY~op2) is recorded, and the job goes on
    under that key with the same payload (the target sees a new request).
    An intent already settled (confirmed or abandoned) whose job needs nothing more
    is left alone: "nothing to do", exit 3.
    """
    chosen = [external_id is not None, retry, abandon, new_operation]
    if sum(chosen) != 1:
        raise click.UsageError(
            "give exactly one of --confirmed EXTERNAL_ID, --retry, --abandon, --new-operation"
        )
    if new_operation and not (reason and reason.strip()):
        raise click.UsageError("--new-operation needs --reason TEXT (why a new operation)")
    if external_id is not None and not external_id.strip():
        raise click.UsageError("--confirmed needs the target's non-empty external id")
    if abandon and not (reason and reason.strip()):
        raise click.UsageError("--abandon needs --reason TEXT (why the effect is given up)")
    if external_id is not None:
        resolution = Resolution.CONFIRMED
    elif retry:
        resolution = Resolution.RETRY
    elif new_operation:
        resolution = Resolution.NEW_OPERATION
    else:
        resolution = Resolution.ABANDON
    settings = _settings(ctx)
    check_table(settings)
    url = queue_url(settings)  # before deciding: a missing queue must not strand the job
    if retry and not force:
        _refuse_unprotected_retry(settings, key)
    configure_stderr()
    driver = SyncDriver(settings, Journal())
    try:
        resolved = driver.run(
            resolve_flow(
                IntentTable(settings.intents_table, settings.attempts_table),
                JobTable(settings.jobs_table),
                queue_url=url,
                key=key,
                resolution=resolution,
                external_id=external_id,
                who=who or _default_who(),
                why=reason or "resolved by operator",
                wall_now=time.time(),
                send_id=new_send_id(),
                # an interactive job goes back to its own queue
                interactive_url=interactive_queue_url(settings),
                attempt=attempt,
            )
        )
    except IntentNotAmbiguous as exc:
        if not exc.final:
            raise  # prepared or in progress: a worker owns it, an error
        noop(
            f"intent {key!r} is already {exc.state} and its job needs nothing more: "
            "not resolved again",
            as_json=as_json,
            data={"key": key, "verdict": "already_final", "state": exc.state},
        )
    intent = resolved.intent
    state = intent.state.value
    if as_json:
        emit_json(
            {
                "key": intent.key,
                "verdict": "finished_earlier" if resolved.finished_earlier else "resolved",
                "state": state,
                "job_id": intent.job_id,
                "job_requeued": resolved.job_requeued,
                "note": resolved.note,
                "successor": intent.successor,
            }
        )
        return
    successor = [f"successor {intent.successor}"] if intent.successor else []
    row(intent.key, state, *successor, f"job {intent.job_id} {resolved.note}")


def _refuse_unprotected_retry(settings: Settings, key: str) -> None:
    """A repeat is protected only while the target still keeps the key: say so."""
    ddb = make_client(settings, "dynamodb")
    item = ddb.get_item(
        TableName=settings.intents_table, Key={"intent_key": {"S": key}}, ConsistentRead=True
    ).get("Item")
    if item is None:
        return  # resolve_flow says "no intent" in its own words
    rec = _intent_of(item)
    started = rec.first_started_at or rec.created_at
    # No age on one clock here (the operator's clock against the starting worker's):
    # the rule answers OTHER_CLOCK, or EXPIRED when the two walls say the window has
    # passed. It only guards a person's decision (--retry says they checked the
    # target): EXPIRED is refused; otherwise the person's word stands.
    why = repeat_unprotected(rec.key_retention, started, time.time())
    if why is Unprotected.NO_KEYS:
        raise click.UsageError(
            f"target {rec.target!r} does not keep idempotency keys: a repeat of {key!r} is "
            "not protected by the target; make sure it did not apply, then add --force"
        )
    if why is Unprotected.EXPIRED:
        raise click.UsageError(
            f"the first attempt of {key!r} is older than the {rec.key_retention:g} s the target "
            "keeps keys: a repeat is no longer protected; make sure it did not apply, then add "
            "--force"
        )


# --------------------------------------------------------------------------- dlq

cli.add_command(dlq)
cli.add_command(receiver)


# --------------------------------------------------------------------------- entry


def main(argv: Sequence[str] | None = None) -> None:
    """The ``sqs-lease`` console script."""
    cli.main(args=list(argv) if argv is not None else None, prog_name="sqs-lease")


if __name__ == "__main__":
    main()
