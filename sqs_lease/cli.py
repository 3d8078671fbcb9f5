"""The ``sqs-lease`` command line: a thin click shell over the public API.

Every command builds on one :class:`Settings` (made by the group from its options
and the environment) and calls the library; no protocol decision is made here.
Errors the library raises (and botocore's credential and connection errors) end
as one ``error: ...`` line on stderr and exit code 2, never a traceback; that
mapping lives in one place, :meth:`_Cli.invoke`. Exit statuses, ``--json`` and
tables are in :mod:`sqs_lease._cli_out`; the ``dlq`` group in :mod:`sqs_lease._cli_dlq`,
the ``jobs`` group in :mod:`sqs_lease._cli_jobs`, the ``intents`` group in
:mod:`sqs_lease._cli_intents`, the ``receiver`` group in :mod:`sqs_lease._cli_receiver`.
Reads and writes go through the library (the operator's reads are in
:mod:`sqs_lease._operator`); none of these modules calls boto3 itself.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from importlib import metadata
from pathlib import Path
from types import FrameType
from typing import Any

import botocore.exceptions
import click

from ._cli_dlq import dlq
from ._cli_intents import intents
from ._cli_jobs import jobs
from ._cli_out import (
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    emit_json,
    fail,
    json_option,
    note,
    row,
    settings_of,
)
from ._cli_receiver import receiver
from ._config import Settings
from ._console import HumanConsole
from ._core.claiming import UNKNOWN_CLASS_RECEIVES
from ._core.inputs import loads as _loads
from ._core.messages import UNSENT_GRACE_SECONDS
from ._core.priority import Priority
from ._errors import (
    AwsCallFailed,
    AwsUnavailable,
    ConfigError,
    PayloadError,
    ResourceMissing,
    SqsLeaseError,
)
from ._journal import configure_stderr
from ._local import LocalAws
from ._producer import Producer
from ._resources import (
    DEFAULT_MAX_RECEIVES,
    check_table,
    create_queue,
    create_tables,
    queue_url,
)
from ._worker import load_app

__all__ = ["cli", "main"]


def _package_version() -> str:
    try:
        return metadata.version("sqs-lease")
    except metadata.PackageNotFoundError:  # a source tree on sys.path, never installed
        return "unknown (not installed)"


_VERSION = _package_version()


# --------------------------------------------------------------------------- errors


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


def _error_kind(exc: BaseException) -> str:
    """A failure's ``code`` in JSON: AWS's error code for a refused call, else the
    exception's class in snake case (``job_not_found``, ``aws_unavailable``)."""
    if isinstance(exc, botocore.exceptions.ClientError):
        return str(exc.response.get("Error", {}).get("Code") or "aws_error")
    if isinstance(exc, AwsCallFailed) and exc.code:
        return exc.code
    return re.sub(r"(?<!^)(?=[A-Z])", "_", type(exc).__name__).lower()


class _Cli(click.Group):
    """The root group: maps expected failures of any command to one line and exit 2."""

    def invoke(self, ctx: click.Context) -> Any:
        # Read before the group consumes them (a usage error comes before --json is
        # parsed); the command's name is never "--json", so the rest of the line will do.
        asked_json = "--json" in ctx.args
        try:
            return super().invoke(ctx)
        except (
            SqsLeaseError,
            botocore.exceptions.BotoCoreError,
            botocore.exceptions.ClientError,
        ) as exc:
            settings = ctx.obj if isinstance(ctx.obj, Settings) else None
            fail(_error_text(exc, settings), EXIT_ERROR, kind=_error_kind(exc))
        except click.UsageError as exc:
            # Refused before the command ran (its --json may not be parsed yet): a
            # caller that asked for JSON still gets its one object on stdout.
            if asked_json:
                emit_json({"error": exc.format_message(), "code": "usage", "exit": exc.exit_code})
            raise
        except KeyboardInterrupt:
            # Ctrl-C outside a worker's run (which stops gracefully on its own).
            click.echo("\ninterrupted", err=True)
            raise click.exceptions.Exit(EXIT_INTERRUPTED) from None


# --------------------------------------------------------------------------- helpers


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
                settings = settings_of(ctx).model_copy(
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
@click.option(
    "--warm-reads",
    type=int,
    default=None,
    help="Read units a second each table and index can take at once (12,000 or more; "
    "raised where lower, never lowered). Set before a launch: on-demand scaling "
    "doubles a table's peak at most every 30 minutes.",
)
@click.option(
    "--warm-writes",
    type=int,
    default=None,
    help="Write units a second each table and index can take at once (4,000 or more).",
)
@json_option('{"tables": [NAME, ...]}.')
@click.pass_context
def tables_create(
    ctx: click.Context, warm_reads: int | None, warm_writes: int | None, as_json: bool
) -> None:
    """Create the tables if missing (idempotent); print their names."""
    from ._schema.create_table import WarmThroughput

    warm = None
    if warm_reads is not None or warm_writes is not None:
        try:
            warm = WarmThroughput(reads=warm_reads, writes=warm_writes)
        except ConfigError as exc:
            option = "--warm-reads" if ".reads" in str(exc) else "--warm-writes"
            raise click.BadParameter(str(exc), param_hint=option) from None
    names = create_tables(settings_of(ctx), warm)
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
    settings = settings_of(ctx)
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
    settings = settings_of(ctx)
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
@click.option(
    "--details",
    is_flag=True,
    help="With --output human: whole ids and hashes, and lines not cut to the terminal's "
    "width (by default ids show their first 8 characters and a line fits the terminal).",
)
@json_option("Final counters as one JSON object on stdout (always so with --output json).")
@click.pass_context
def worker(
    ctx: click.Context,
    /,
    app_spec: str | None,
    output: str,
    details: bool,
    as_json: bool,
    **options: Any,
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

    settings = settings_of(ctx)
    _importable_cwd()
    try:
        env = WorkerEnv.load(app=app_spec, **options)
    except ConfigError as exc:
        fail(str(exc), int(ExitCode.CONFIG))
    app = app_of(env)
    if isinstance(app, ServiceResult):
        fail(app.message, int(app.code))
    with ExitStack() as stack:
        console: HumanConsole | None = None
        if output == "human":
            console = stack.enter_context(HumanConsole(sys.stderr, details=details))
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
        fail(_error_text(SqsLeaseError(result.message), settings), int(result.code))


# --------------------------------------------------------------------------- groups

cli.add_command(jobs)
cli.add_command(intents)
cli.add_command(dlq)
cli.add_command(receiver)


# --------------------------------------------------------------------------- entry


def main(argv: Sequence[str] | None = None) -> None:
    """The ``sqs-lease`` console script."""
    cli.main(args=list(argv) if argv is not None else None, prog_name="sqs-lease")


if __name__ == "__main__":
    main()
