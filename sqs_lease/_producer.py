"""Submitting jobs: a record (condition: new) and one message; resuming parked
jobs and re-sending stranded ones."""

from __future__ import annotations

import asyncio
import random
import re
import time
import uuid
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel

from ._aio import AsyncDriver
from ._aws import SyncDriver
from ._config import Settings
from ._core.calls import Flow, Ok, call
from ._core.cancelling import Cancelled, cancel_job_flow
from ._core.groups import GroupReport, cancel_group_flow
from ._core.inputs import payload_text
from ._core.limits import check_payload
from ._core.messages import UNSENT_GRACE_SECONDS
from ._core.priority import PRIORITIES, Priority
from ._core.records import JobView
from ._core.resuming import Resumed, resume_flow
from ._core.sending import SubmitResult, submit_flow
from ._core.stages import Retried, retry_failed_flow
from ._core.status import MAX_POLL, JobStatus, status_flow, wait_flow
from ._core.sweeping import SweepReport, sweep_flow
from ._errors import ConfigError, ResourceMissing
from ._jobs import App, canonical_json, payload_hash
from ._resources import queue_url
from ._schema.group_requests import GroupTable
from ._schema.job_requests import JobTable

GROUP_ID = re.compile(r"^[A-Za-z0-9_.:@/+=-]{1,256}$")


def check_group(group: str) -> str:
    """Refuse a group id that is not 1-256 of ``A-Z a-z 0-9 _ . : @ / + = -``."""
    if not isinstance(group, str) or not GROUP_ID.match(group):
        raise ConfigError(
            f"group={group!r}: a group id is 1-256 characters of letters, digits and "
            "_ . : @ / + = - (an agent session or run id); pass it as given by your runner"
        )
    return group


def check_tenant(tenant: str) -> str:
    """Refuse a tenant id that is not 1-200 of ``A-Z a-z 0-9 _ . : @ / + = -``."""
    if not isinstance(tenant, str) or not GROUP_ID.match(tenant) or len(tenant) > 200:
        raise ConfigError(
            f"tenant={tenant!r}: a tenant id is 1-200 characters of letters, digits and "
            "_ . : @ / + = - (a user or account id); pass your own id for it, never a payload's"
        )
    return tenant


def new_send_id() -> str:
    """A send id unique to one send (or, as a prefix, to one sweep)."""
    return uuid.uuid4().hex


class _Operations:
    """What both producers share: the tables, the queues' addresses, and each
    operation as the core flow it runs (the producers only run them: one sequence)."""

    def __init__(
        self, settings: Settings, app: App | None, *, unsent_grace: float = UNSENT_GRACE_SECONDS
    ) -> None:
        self.settings = settings
        self.app = app
        self.unsent_grace = unsent_grace
        self.table = JobTable(settings.jobs_table)
        self.groups = GroupTable(settings.groups_table)
        self._queue_url: str | None = None
        self._interactive_url: str | None = None

    @property
    def queue_url(self) -> str:
        if self._queue_url is None:
            self._queue_url = queue_url(self.settings)
        return self._queue_url

    @property
    def interactive_url(self) -> str:
        """The interactive jobs' queue (ResourceMissing naming the fix when absent)."""
        if self._interactive_url is None:
            self._interactive_url = queue_url(self.settings, self.settings.interactive_queue)
        return self._interactive_url

    def _interactive_or_none(self) -> str | None:
        """The interactive queue's address if it exists (None: there is none): where a
        re-send of an interactive job goes."""
        try:
            return self.interactive_url
        except ResourceMissing:
            return None

    def _submit_flow(
        self,
        job_class: str,
        payload: BaseModel | Mapping[str, Any],
        job_id: str | None,
        *,
        delay_seconds: int,
        group: str | None,
        tenant: str | None,
        priority: Priority,
        interleave_stages: bool,
    ) -> Flow[SubmitResult]:
        stage: str | None = None
        stages = 1
        if self.app is not None:
            data = self.app.validated(job_class, payload)
        else:
            data = payload.model_dump(mode="json") if isinstance(payload, BaseModel) else payload
        text = payload_text(data)
        digest = payload_hash(text)
        if self.app is not None:
            stage = self.app.first_stage(job_class, text)
            stages = self.app.stage_count(job_class, text)
        if group is not None:
            check_group(group)
        if tenant is not None:
            check_tenant(tenant)
        if priority not in PRIORITIES:
            raise ConfigError(
                f"priority={priority!r}: choose one of {', '.join(PRIORITIES)} "
                "(interactive: a person waits for it; batch: the rest)"
            )
        jid = job_id or (yield from self._auto_id(job_class, data, digest))
        # DynamoDB would refuse these with a ValidationException: say which limit now.
        check_payload(jid, text)
        # submit_flow refuses an id no worker would read (inputs.job_id_problem).
        return (
            yield from submit_flow(
                self.table,
                queue_url=self.interactive_url if priority == "interactive" else self.queue_url,
                job_id=jid,
                job_class=job_class,
                payload_json=text,
                payload_hash=digest,
                wall_now=time.time(),
                send_id=new_send_id(),
                delay_seconds=delay_seconds,
                resend_after=self.unsent_grace,
                group=group,
                groups=self.groups,
                tenant=tenant,
                stage=stage,
                priority=priority,
                stages=stages,
                interleave_stages=interleave_stages,
            )
        )

    def _auto_id(self, job_class: str, data: Any, digest: str) -> Flow[str]:
        """The id of a job submitted without one: its class and its payload's hash.

        Before whole numbers were written as ints (``payload_text``), a payload with a
        float like ``2.0`` was hashed as written: should a job exist under the id that
        text gave, this submission is that job again (a resubmit across the upgrade
        stays one job). Only such payloads pay the one read."""
        jid = f"{job_class}-{digest[:24]}"
        before = canonical_json(data)
        if before == payload_text(data):
            return jid
        legacy = f"{job_class}-{payload_hash(before)[:24]}"
        out = yield from call(self.table.get(legacy))
        if isinstance(out, Ok) and out.response.get("Item"):
            return legacy
        return jid

    def _cancel_flow(self, job_id: str, reason: str) -> Flow[Cancelled]:
        return cancel_job_flow(self.table, job_id=job_id, reason=reason, wall_now=time.time())

    def _cancel_group_flow(self, group: str, reason: str) -> Flow[GroupReport]:
        check_group(group)
        return cancel_group_flow(
            self.table, self.groups, group=group, reason=reason, wall_now=time.time()
        )

    def _resume_flow(self, job_id: str, interactive_url: str | None) -> Flow[Resumed]:
        return resume_flow(
            self.table,
            queue_url=self.queue_url,
            job_id=job_id,
            wall_now=time.time(),
            send_id=new_send_id(),
            interactive_url=interactive_url,
        )

    def _retry_flow(
        self, job_id: str, stage: str | None, interactive_url: str | None
    ) -> Flow[Retried]:
        return retry_failed_flow(
            self.table,
            queue_url=self.queue_url,
            job_id=job_id,
            wall_now=time.time(),
            send_id=new_send_id(),
            stage=stage,
            interactive_url=interactive_url,
            groups=self.groups,
        )

    def _repair_flow(self, older_than: float, limit: int, dry_run: bool) -> Flow[SweepReport]:
        return sweep_flow(
            self.table,
            queue_url=self.queue_url,
            wall_now=time.time(),
            older_than=older_than,
            limit=limit,
            send_id_prefix=new_send_id(),
            dry_run=dry_run,
            interactive_url=None if dry_run else self._interactive_or_none(),
        )

    def _wait_flow(self, job_id: str, timeout: float, max_poll: float) -> Flow[JobStatus]:
        return wait_flow(
            self.table,
            job_id,
            timeout=timeout,
            clock=time.monotonic,
            jitter=random.random,
            max_poll=max_poll,
        )


class Producer(_Operations):
    """Submits jobs. With an ``App`` the payload is validated against its class first.

    ``unsent_grace`` is how long a resubmission leaves a record without a sent
    message to the submitter that created it before taking the send over.
    """

    def __init__(
        self,
        settings: Settings,
        app: App | None = None,
        driver: SyncDriver | None = None,
        *,
        unsent_grace: float = UNSENT_GRACE_SECONDS,
    ) -> None:
        super().__init__(settings, app, unsent_grace=unsent_grace)
        self.driver = driver or SyncDriver(settings)

    def submit(
        self,
        job_class: str,
        payload: BaseModel | Mapping[str, Any],
        job_id: str | None = None,
        *,
        delay_seconds: int = 0,
        group: str | None = None,
        tenant: str | None = None,
        priority: Priority = "batch",
        interleave_stages: bool = False,
    ) -> SubmitResult:
        """Submit once. The id should come from the source event; by default it is
        derived from class + payload, so submitting the same thing twice is a no-op.

        ``group`` puts the job in an agent session (or run) that :meth:`cancel_group`
        can end as a whole; it is the producer's, never the payload's. A submit to a
        cancelled group raises ``GroupCancelled``.

        ``tenant`` names whose job it is (a user, an account): a worker whose app sets
        a tenant limit (``App(tenant_limit=...)``) runs at most that many of the
        tenant's jobs at once, fleet-wide. Like the group, it is the producer's.

        ``priority``: ``interactive`` (a person waits: the interactive queue, which
        workers serve first; ``sqs-lease queue create --interactive`` makes it) or
        ``batch`` (the job queue).

        ``interleave_stages``: on a FIFO queue, FIFO order is per message: a staged
        job's later stages join the back of its group, so later jobs of the same
        ``group`` run between its stages. A job of several stages (with the app: a
        staged class, a plan of several steps) submitted to a FIFO group is refused
        (``ConfigError``) unless this is True (docs/stages.md).

        Raises ``LimitExceeded`` when the job id (over 2048 UTF-8 bytes) or the
        payload (over what a 400 KB DynamoDB item leaves for it) cannot be stored."""
        return self.driver.run(
            self._submit_flow(
                job_class,
                payload,
                job_id,
                delay_seconds=delay_seconds,
                group=group,
                tenant=tenant,
                priority=priority,
                interleave_stages=interleave_stages,
            )
        )

    def status(self, job_id: str) -> JobStatus:
        """The job as its record says now (one consistent read): state, stage,
        attempt, the decoded result once it succeeded, the reason and error code of a
        failure. ``JobNotFound`` when there is no such job."""
        return self.driver.run(status_flow(self.table, job_id))

    def wait(self, job_id: str, timeout: float, *, max_poll: float = MAX_POLL) -> JobStatus:
        """Block until the job is settled (succeeded, failed, cancelled or parked) and
        return its status; ``WaitTimedOut`` (a ``TimeoutError`` carrying the last
        status) after ``timeout`` seconds. It polls: one consistent read after 0.2 s,
        then pauses growing by half up to ``max_poll`` seconds (12 reads a minute at the
        default 5 s), each read billed on the whole record (1 read unit per 4 KB).
        A parked job returns too: it needs an operator, not more waiting."""
        return self.driver.run(self._wait_flow(job_id, timeout, max_poll))

    def cancel(self, job_id: str, reason: str = "cancelled by request") -> JobView:
        """End the job ``failed`` (cancelled); its owner loses the lease at its next beat.

        A job already final is left as it is; :meth:`cancel_job` says which happened."""
        return self.cancel_job(job_id, reason).job

    def cancel_job(self, job_id: str, reason: str = "cancelled by request") -> Cancelled:
        """Like :meth:`cancel`, with the verdict: ``cancelled`` by this call, or
        ``already_final`` (succeeded or failed before: nothing changed)."""
        return self.driver.run(self._cancel_flow(job_id, reason))

    def cancel_group(self, group: str, reason: str = "cancelled by request") -> GroupReport:
        """Cancel an agent session: refuse new submits to it, end every job of it not
        yet terminal with ``reason`` (their owners lose their leases at their next
        heartbeat), and report what was cancelled and what had already finished.
        Safe to repeat (a report with ``missing`` > 0 asks for it)."""
        return self.driver.run(self._cancel_group_flow(group, reason))

    def resume(self, job_id: str) -> Resumed:
        """Re-enqueue a parked job (after an operator decided), granting the attempt it
        starts; a job queued without a sent message is sent again. Safe to repeat."""
        return self.driver.run(self._resume_flow(job_id, self._interactive_or_none()))

    def retry(self, job_id: str, stage: str | None = None) -> Retried:
        """Run a failed (or parked) job again from where it ended: a staged job at its
        failed stage, its committed stages kept (see :func:`retry_failed_flow`). Conditional
        on the record's state and token: a second retry of one failure does nothing."""
        return self.driver.run(self._retry_flow(job_id, stage, self._interactive_or_none()))

    def repair(
        self,
        *,
        older_than: float = UNSENT_GRACE_SECONDS,
        limit: int = 100,
        dry_run: bool = False,
    ) -> SweepReport:
        """Send again the records left without a sent message for ``older_than``
        seconds (at most ``limit``, oldest first); ``dry_run`` only lists them."""
        return self.driver.run(self._repair_flow(older_than, limit, dry_run))


class AsyncProducer(_Operations):
    """:class:`Producer` for asyncio code: the same operations, awaited, run by an
    :class:`~sqs_lease._aio.AsyncDriver` (aiobotocore: ``pip install 'sqs-lease[async]'``).

    ``async with AsyncProducer(settings) as producer:`` opens its own driver; pass
    ``driver=`` (already entered) to share one. The queues' addresses are looked up once
    in a thread, never on the event loop."""

    def __init__(
        self,
        settings: Settings,
        app: App | None = None,
        driver: AsyncDriver | None = None,
        *,
        unsent_grace: float = UNSENT_GRACE_SECONDS,
    ) -> None:
        super().__init__(settings, app, unsent_grace=unsent_grace)
        self._owns_driver = driver is None
        self.driver = driver or AsyncDriver(settings)

    async def __aenter__(self) -> AsyncProducer:
        if self._owns_driver:
            await self.driver.__aenter__()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        if self._owns_driver:
            await self.driver.__aexit__(*exc_info)

    async def _job_queue(self) -> None:
        """Look the job queue up off the loop (boto3's lookup blocks), once."""
        if self._queue_url is None:
            await asyncio.to_thread(lambda: self.queue_url)

    async def _interactive(self) -> str | None:
        await self._job_queue()
        return await asyncio.to_thread(self._interactive_or_none)

    async def submit(
        self,
        job_class: str,
        payload: BaseModel | Mapping[str, Any],
        job_id: str | None = None,
        *,
        delay_seconds: int = 0,
        group: str | None = None,
        tenant: str | None = None,
        priority: Priority = "batch",
        interleave_stages: bool = False,
    ) -> SubmitResult:
        """As :meth:`Producer.submit`."""
        if priority == "interactive":
            await asyncio.to_thread(lambda: self.interactive_url)
        else:
            await self._job_queue()
        return await self.driver.run(
            self._submit_flow(
                job_class,
                payload,
                job_id,
                delay_seconds=delay_seconds,
                group=group,
                tenant=tenant,
                priority=priority,
                interleave_stages=interleave_stages,
            )
        )

    async def status(self, job_id: str) -> JobStatus:
        """As :meth:`Producer.status`."""
        return await self.driver.run(status_flow(self.table, job_id))

    async def wait(self, job_id: str, timeout: float, *, max_poll: float = MAX_POLL) -> JobStatus:
        """As :meth:`Producer.wait`; the pauses are awaited (the loop runs on)."""
        return await self.driver.run(self._wait_flow(job_id, timeout, max_poll))

    async def cancel_job(self, job_id: str, reason: str = "cancelled by request") -> Cancelled:
        """As :meth:`Producer.cancel_job`."""
        return await self.driver.run(self._cancel_flow(job_id, reason))

    async def cancel_group(self, group: str, reason: str = "cancelled by request") -> GroupReport:
        """As :meth:`Producer.cancel_group`."""
        return await self.driver.run(self._cancel_group_flow(group, reason))

    async def resume(self, job_id: str) -> Resumed:
        """As :meth:`Producer.resume`."""
        return await self.driver.run(self._resume_flow(job_id, await self._interactive()))

    async def retry(self, job_id: str, stage: str | None = None) -> Retried:
        """As :meth:`Producer.retry`."""
        there = await self._interactive()
        return await self.driver.run(self._retry_flow(job_id, stage, there))
