"""The async driver: the same flows, run with aiobotocore.

Only the concurrency shell differs from the sync driver; error translation is
shared (:func:`sqs_lease._aws.classify`).
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from contextlib import AsyncExitStack
from typing import Any, TypeVar

from ._aws import CallObserver, DriverBase, Timeouts, client_config, client_kwargs
from ._clock import lease_clock
from ._config import Settings
from ._core.calls import Call, Flow, Invoke, Ok, Outcome, Sleep, raised
from ._errors import ConfigError
from ._journal import Journal

T = TypeVar("T")


class AsyncDriver(DriverBase):
    """Runs flows with aiobotocore clients. Use as ``async with AsyncDriver(...) as d``."""

    def __init__(
        self,
        settings: Settings,
        journal: Journal | None = None,
        timeouts: Timeouts | None = None,
        clock: Callable[[], float] = lease_clock,
        observers: list[CallObserver] | None = None,
    ) -> None:
        self.settings = settings
        # As SyncDriver.observers; a pause they ask for is awaited, never slept.
        self.observers: list[CallObserver] = observers if observers is not None else []
        self.journal = journal or Journal()
        self.timeouts = timeouts or Timeouts()
        self.clock = clock
        self.clients: dict[str, Any] = {}
        self._stack = AsyncExitStack()
        self.calls = 0

    async def __aenter__(self) -> AsyncDriver:
        # Imported here: aiobotocore is the optional extra ``async`` (it pins
        # botocore narrowly), so the rest of the package must import without it.
        try:
            from aiobotocore.session import get_session
        except ImportError as exc:
            raise ConfigError(
                "the async driver needs aiobotocore: pip install 'sqs-lease[async]'"
            ) from exc
        session = get_session()
        config = client_config(self.timeouts, pool=100)
        for service in ("sqs", "dynamodb"):
            self.clients[service] = await self._stack.enter_async_context(
                session.create_client(
                    service, config=config, **client_kwargs(self.settings, service)
                )
            )
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._stack.aclose()

    async def execute(self, c: Call) -> Outcome:
        from botocore import xform_name

        method = getattr(self.clients[c.service], xform_name(c.op))
        sent = self.clock()
        outcome: Outcome
        try:
            outcome = Ok(await method(**c.params), sent, self.clock())
        except Exception as exc:
            outcome = self._failed(c, exc, sent)
        finally:
            self.calls += 1
        for pause in self._pauses(c, outcome):
            await asyncio.sleep(pause)
        return outcome

    async def invoke(self, inv: Invoke) -> Outcome:
        start = self.clock()
        try:
            value = inv.fn()
            if inspect.isawaitable(value):
                value = await value
        except Exception as exc:
            return raised(exc, start, self.clock())
        return Ok({"value": value}, start, self.clock())

    async def run(self, flow: Flow[T]) -> T:
        """Drive a flow to its end and return its result."""
        try:
            instruction = self._past_emits(flow, next(flow))
            while True:
                outcome: Outcome
                if isinstance(instruction, Invoke):
                    outcome = await self.invoke(instruction)
                elif isinstance(instruction, Sleep):
                    start = self.clock()
                    await asyncio.sleep(instruction.seconds)
                    outcome = Ok({}, start, self.clock())
                else:
                    outcome = await self.execute(instruction)
                instruction = self._past_emits(flow, flow.send(outcome))
        except StopIteration as stop:
            result: T = stop.value
            return result
