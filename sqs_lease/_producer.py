"""Submitting jobs: a record (condition: new) and one message."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel

from ._aws import SyncDriver
from ._config import Settings
from ._core.flows import SubmitResult, cancel_flow, submit_flow
from ._core.intents import resume_flow
from ._core.records import JobView
from ._jobs import App, canonical_json, payload_hash
from ._resources import queue_url
from ._schema import JobTable


class Producer:
    """Submits jobs. With an ``App`` the payload is validated against its class first."""

    def __init__(
        self, settings: Settings, app: App | None = None, driver: SyncDriver | None = None
    ) -> None:
        self.settings = settings
        self.app = app
        self.driver = driver or SyncDriver(settings)
        self.table = JobTable(settings.jobs_table)
        self._queue_url: str | None = None

    @property
    def queue_url(self) -> str:
        if self._queue_url is None:
            self._queue_url = queue_url(self.settings)
        return self._queue_url

    def submit(
        self,
        job_class: str,
        payload: BaseModel | Mapping[str, Any],
        job_id: str | None = None,
        *,
        delay_seconds: int = 0,
    ) -> SubmitResult:
        """Submit once. The id should come from the source event; by default it is
        derived from class + payload, so submitting the same thing twice is a no-op."""
        if self.app is not None:
            text, digest = self.app.prepare(job_class, payload)
        else:
            data = payload.model_dump(mode="json") if isinstance(payload, BaseModel) else payload
            text = canonical_json(data)
            digest = payload_hash(text)
        jid = job_id or f"{job_class}-{digest[:24]}"
        return self.driver.run(
            submit_flow(
                self.table,
                queue_url=self.queue_url,
                job_id=jid,
                job_class=job_class,
                payload_json=text,
                payload_hash=digest,
                wall_now=time.time(),
                delay_seconds=delay_seconds,
            )
        )

    def cancel(self, job_id: str, reason: str = "cancelled by request") -> JobView:
        """End the job ``failed`` (cancelled); its owner loses the lease at its next beat."""
        return self.driver.run(
            cancel_flow(self.table, job_id=job_id, reason=reason, wall_now=time.time())
        )

    def resume(self, job_id: str) -> bool:
        """Re-enqueue a parked job (after an operator decided); False if it was not parked."""
        state = self.driver.run(
            resume_flow(self.table, queue_url=self.queue_url, job_id=job_id, wall_now=time.time())
        )
        return state is not None
