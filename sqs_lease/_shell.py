"""What every worker shell sets up the same way: its options, its queue, its counters.

The thread worker (``_worker.py``) and the async worker (``_aio_worker.py``)
differ in how they schedule; the checks of their options, the queue and
redrive they find and their counters live here once.
"""

from __future__ import annotations

import inspect
import os
import socket
import uuid
from dataclasses import dataclass

from ._config import Settings
from ._core.attempt import redrive_rules
from ._errors import ConfigError
from ._jobs import App
from ._journal import Journal
from ._resources import check_table, queue_url, redrive


@dataclass
class WorkerStats:
    """A worker's counters, returned by ``run()`` and journaled as ``worker_stopped``
    (the flows name what to count, ``AttemptEnv.tally``; names not here are skipped)."""

    received: int = 0
    claimed: int = 0
    reclaimed: int = 0
    committed: int = 0
    rejected: int = 0
    failed: int = 0
    retried: int = 0
    parked: int = 0
    poisoned: int = 0
    already_done: int = 0
    stray: int = 0  # messages that were not their job's current message
    lost: int = 0
    released: int = 0
    deferred: int = 0


def default_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


def check_options(
    app: App,
    *,
    receive_wait: int,
    sweep_interval: float | None,
    sweep_grace: float,
    sweep_limit: int,
    unknown_class_receives: int,
) -> None:
    """Refuse options no worker can run with, naming the field and the fix."""
    if not app.classes:
        raise ConfigError("the app registers no job class; add one with @app.job(...)")
    if not 0 <= receive_wait <= 20:
        raise ConfigError(f"receive_wait={receive_wait}: SQS long polls 0..20 s")
    if sweep_interval is not None and not sweep_interval > 0:
        raise ConfigError(
            f"sweep_interval={sweep_interval}: give seconds > 0, or None to turn the "
            "stranded-record sweep off"
        )
    if not sweep_grace >= 0:
        raise ConfigError(f"sweep_grace={sweep_grace}: give seconds >= 0")
    if not 1 <= sweep_limit <= 1000:
        raise ConfigError(f"sweep_limit={sweep_limit}: choose 1..1000 records per sweep")
    if unknown_class_receives < 1:
        raise ConfigError(
            f"unknown_class_receives={unknown_class_receives}: choose 1 or more receives "
            "before a message of an unknown job class goes to the DLQ"
        )


def async_handlers(app: App) -> list[str]:
    """The job classes whose handler is an ``async def`` (they need the async worker)."""
    return sorted(
        name
        for name, reg in app.classes.items()
        if inspect.iscoroutinefunction(reg.handler)
        or inspect.iscoroutinefunction(type(reg.handler).__call__)
    )


@dataclass(frozen=True)
class QueueSetup:
    queue_url: str
    dlq_url: str | None
    unknown_class_receives: int


def find_queue(
    app: App, settings: Settings, journal: Journal, unknown_class_receives: int
) -> QueueSetup:
    """Check the tables, find the queue and its redrive, and warn of a redrive too tight."""
    check_table(settings)
    url = queue_url(settings)
    dlq_url, max_receives = redrive(settings, url)
    most = max(r.job_class.max_attempts for r in app.classes.values())
    unknown, warning = redrive_rules(max_receives, most, unknown_class_receives)
    if warning is not None:
        journal.write(warning.event, warning.fields)
    return QueueSetup(url, dlq_url, unknown)


STAT_NAMES = frozenset(WorkerStats.__dataclass_fields__)
