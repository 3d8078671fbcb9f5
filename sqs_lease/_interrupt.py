"""Ctrl-C while a worker runs: a graceful stop, never a ``KeyboardInterrupt`` traceback.

A program that calls ``Worker.run()`` without choosing a SIGINT handler has
Python's default, which raises ``KeyboardInterrupt`` wherever the main thread
is: in the middle of an AWS call, with jobs claimed and no decision made. While
``run()`` goes on, this swaps that default for "stop gracefully" (the same stop
as SIGTERM under ``install_signal_handlers``), and puts it back when ``run()``
ends. A handler the program chose itself is never touched, and neither is an
ignored SIGINT: a process started that way (``cmd &`` in a script, ``nohup``) was
meant to be immune to Ctrl-C; stop it with SIGTERM (``install_signal_handlers``).
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from types import FrameType


def stop_on_interrupt(journal: Callable[..., None], stop: Callable[[], None]) -> Callable[[], None]:
    """Make SIGINT call ``stop`` (journaling ``worker_stopping``) if it still has
    Python's default handler and this is the main thread; return the undo."""
    if threading.current_thread() is not threading.main_thread():
        return _nothing
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        return _nothing

    def handle(signum: int, frame: FrameType | None) -> None:
        journal("worker_stopping", signal="SIGINT")
        stop()

    signal.signal(signal.SIGINT, handle)

    def undo() -> None:
        if signal.getsignal(signal.SIGINT) is handle:
            signal.signal(signal.SIGINT, signal.default_int_handler)

    return undo


def _nothing() -> None:
    return None
