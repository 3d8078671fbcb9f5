"""The lease clock: the one clock every worker shell and driver measures leases on.

A local lease is counted from before the request that granted it, on this
clock, and compared with "now" on this clock; SQS meanwhile counts on its own.
The clock must therefore keep counting whatever the machine does. Linux's
``CLOCK_MONOTONIC`` stops while the machine is suspended or hibernated (a
laptop lid, a paused VM, a Lambda execution environment frozen between
invocations): after a resume it would say the lease still has reserve while
SQS has long given the message to another worker. ``CLOCK_BOOTTIME`` counts
that time too, so it is used wherever the platform has it; elsewhere the clock
falls back to :func:`time.monotonic` (on macOS and Windows it already counts
suspend, on other systems it may not: keep leases long there).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from types import ModuleType
from typing import Any


def pick_clock(clock_source: ModuleType | Any = time) -> tuple[str, Callable[[], float]]:
    """Choose the lease clock from ``clock_source`` (the :mod:`time` module, or a stand-in).

    Returns its name (``"CLOCK_BOOTTIME"`` or ``"monotonic"``) and the function.
    ``CLOCK_BOOTTIME`` is taken only when the constant exists *and* a first
    reading succeeds (an old kernel may define the name but refuse the clock).
    """
    boottime = getattr(clock_source, "CLOCK_BOOTTIME", None)
    gettime = getattr(clock_source, "clock_gettime", None)
    if boottime is not None and gettime is not None:
        try:
            gettime(boottime)
        except OSError:
            pass
        else:

            def boot_clock() -> float:
                return float(gettime(boottime))

            return "CLOCK_BOOTTIME", boot_clock
    monotonic: Callable[[], float] = clock_source.monotonic
    return "monotonic", monotonic


CLOCK_NAME, _read = pick_clock()
"""The name of the clock :func:`lease_clock` reads on this platform."""


def lease_clock() -> float:
    """Seconds on the lease clock (``CLOCK_BOOTTIME`` where available, else monotonic).

    Only differences between two readings mean anything; never compare it with
    the wall clock or with another machine's reading.
    """
    return _read()
