"""pytest fixtures of the testing kit: load with ``pytest_plugins =
["sqs_lease.testing.pytest_plugin"]`` in your ``conftest.py``.

- ``lease_endpoint`` (session): the embedded emulator on 127.0.0.1, its own
  process, with dummy credentials set for the session.
- ``lease_env`` (each test): a fresh prefix with the queue (and DLQ) and the tables
  created: a :class:`~sqs_lease.testing.LeaseEnv`; its workers are stopped after.
- ``fenced_target`` (each test): a :class:`~sqs_lease.testing.FencedTarget`.

Every pytest run of an environment that installs the package loads this module (a
pytest11 entry point): loading it imports no worker, boto3, moto or simulator; a
fixture imports what it needs when a test first uses it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

from . import FencedTarget, LeaseEnv, credentials_env, emulator, make_env

try:
    import pytest
except ImportError:  # pragma: no cover - the package imports without pytest installed
    pytest = None  # type: ignore[assignment]

__all__ = ["fenced_target", "lease_endpoint", "lease_env"]  # the fixtures (with pytest)


def _lease_endpoint() -> Iterator[str]:
    """Endpoint URL of the embedded emulator, shared by the session."""
    saved = {k: os.environ.get(k) for k in (*credentials_env(), "AWS_PROFILE", "NO_PROXY")}
    os.environ.update(credentials_env())
    os.environ.pop("AWS_PROFILE", None)
    # Loopback calls must never go through a proxy set for the session.
    os.environ["NO_PROXY"] = ",".join(
        [n for n in (saved["NO_PROXY"] or "").split(",") if n] + ["127.0.0.1", "localhost"]
    )
    try:
        with emulator() as endpoint:
            yield endpoint
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _lease_env(lease_endpoint: str) -> Iterator[LeaseEnv]:
    """A fresh queue (with DLQ) and tables for this test; its workers stopped after."""
    env = make_env(lease_endpoint)
    try:
        yield env
    finally:
        for worker in env.workers:
            worker.stop()


def _fenced_target() -> FencedTarget:
    """A fake outside system, fenced per job, with a ledger of effects applied."""
    return FencedTarget("target")


if pytest is not None:
    lease_endpoint: Any = pytest.fixture(scope="session", name="lease_endpoint")(_lease_endpoint)
    lease_env: Any = pytest.fixture(name="lease_env")(_lease_env)
    fenced_target: Any = pytest.fixture(name="fenced_target")(_fenced_target)
