"""pytest fixtures of the testing kit: load with ``pytest_plugins =
["sqs_lease.testing.pytest_plugin"]`` in your ``conftest.py``.

- ``lease_endpoint`` (session): the embedded emulator on 127.0.0.1, its own
  process, with dummy credentials set for the session.
- ``lease_env`` (each test): a fresh prefix with the queue (and DLQ) and the tables
  created: a :class:`~sqs_lease.testing.LeaseEnv`; its workers are stopped after.
- ``fenced_target`` (each test): a :class:`~sqs_lease.testing.FencedTarget`.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from . import FencedTarget, LeaseEnv, credentials_env, emulator, make_env


@pytest.fixture(scope="session")
def lease_endpoint() -> Iterator[str]:
    """Endpoint URL of the embedded emulator, shared by the session."""
    with pytest.MonkeyPatch.context() as mp:
        for name, value in credentials_env().items():
            mp.setenv(name, value)
        mp.delenv("AWS_PROFILE", raising=False)
        mp.setenv("NO_PROXY", "127.0.0.1,localhost")
        mp.setenv("no_proxy", "127.0.0.1,localhost")
        with emulator() as endpoint:
            yield endpoint


@pytest.fixture
def lease_env(lease_endpoint: str) -> Iterator[LeaseEnv]:
    """A fresh queue (with DLQ) and tables for this test."""
    env = make_env(lease_endpoint)
    try:
        yield env
    finally:
        for worker in env.workers:
            worker.stop()


@pytest.fixture
def fenced_target() -> FencedTarget:
    """A fake outside system, fenced per job, with a ledger of effects applied."""
    return FencedTarget("target")
