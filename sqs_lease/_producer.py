"""Submitting jobs: a record (condition: new) and one message; resuming parked
jobs and re-sending stranded ones."""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel

from ._aws import SyncDriver
from ._config import Settings
from ._core.cancelling import Cancelled, cancel_job_flow
from ._core.groups import GroupReport, cancel_group_flow
from ._core.limits import check_payload
from ._core.messages import UNSENT_GRACE_SECONDS
from ._core.priority import PRIORITIES, Priority
from ._core.records import JobView
from ._core.resuming import Resumed, resume_flow
from ._core.sending import SubmitResult, submit_flow
from ._core.stages import Retried, retry_failed_flow
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


class Producer:
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
        self.settings = settings
        self.app = app
        self.driver = driver or SyncDriver(settings)
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
        stage: str | None = None
        stages = 1
        if self.app is not None:
            text, digest = self.app.prepare(job_class, payload)
            stage = self.app.first_stage(job_class, text)
            stages = self.app.stage_count(job_class, text)
        else:
            data = payload.model_dump(mode="json") if isinstance(payload, BaseModel) else payload
            text = canonical_json(data)
            digest = payload_hash(text)
        if group is not None:
            check_group(group)
        if tenant is not None:
            check_tenant(tenant)
        if priority not in PRIORITIES:
            raise ConfigError(
                f"priority={priority!r}: choose one of {', '.join(PRIORITIES)} "
                "(interactive: a person waits for it; batch: the rest)"
            )
        jid = job_id or f"{job_class}-{digest[:24]}"
        # DynamoDB would refuse these with a ValidationException: say which limit now.
        check_payload(jid, text)
        # submit_flow refuses an id no worker would read (inputs.job_id_problem).
        return self.driver.run(
            submit_flow(
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

    def _interactive_or_none(self) -> str | None:
        """The interactive queue's address if it exists (None: there is none): where a
        re-send of an interactive job goes."""
        try:
            return self.interactive_url
        except ResourceMissing:
            return None

    def cancel(self, job_id: str, reason: str = "cancelled by request") -> JobView:
        """End the job ``failed`` (cancelled); its owner loses the lease at its next beat.

        A job already final is left as it is; :meth:`cancel_job` says which happened."""
        return self.cancel_job(job_id, reason).job

    def cancel_job(self, job_id: str, reason: str = "cancelled by request") -> Cancelled:
        """Like :meth:`cancel`, with the verdict: ``cancelled`` by this call, or
        ``already_final`` (succeeded or failed before: nothing changed)."""
        return self.driver.run(
            cancel_job_flow(self.table, job_id=job_id, reason=reason, wall_now=time.time())
        )

    def cancel_group(self, group: str, reason: str = "cancelled by request") -> GroupReport:
        """Cancel an agent session: refuse new submits to it, end every job of it not
        yet terminal with ``reason`` (their owners lose their leases at their next
        heartbeat), and report what was cancelled and what had already finished.
        Safe to repeat (a report with ``missing`` > 0 asks for it)."""
        check_group(group)
        return self.driver.run(
            cancel_group_flow(
                self.table, self.groups, group=group, reason=reason, wall_now=time.time()
            )
        )

    def resume(self, job_id: str) -> Resumed:
        """Re-enqueue a parked job (after an operator decided), granting the attempt it
        starts; a job queued without a sent message is sent again. Safe to repeat."""
        return self.driver.run(
            resume_flow(
                self.table,
                queue_url=self.queue_url,
                job_id=job_id,
                wall_now=time.time(),
                send_id=new_send_id(),
                interactive_url=self._interactive_or_none(),
            )
        )

    def retry(self, job_id: str, stage: str | None = None) -> Retried:
        """Run a failed (or parked) job again from where it ended: a staged job at its
        failed stage, its committed stages kept (see :func:`retry_failed_flow`). Conditional
        on the record's state and token: a second retry of one failure does nothing."""
        return self.driver.run(
            retry_failed_flow(
                self.table,
                queue_url=self.queue_url,
                job_id=job_id,
                wall_now=time.time(),
                send_id=new_send_id(),
                stage=stage,
                interactive_url=self._interactive_or_none(),
                groups=self.groups,
            )
        )

    def repair(
        self,
        *,
        older_than: float = UNSENT_GRACE_SECONDS,
        limit: int = 100,
        dry_run: bool = False,
    ) -> SweepReport:
        """Send again the records left without a sent message for ``older_than``
        seconds (at most ``limit``, oldest first); ``dry_run`` only lists them."""
        return self.driver.run(
            sweep_flow(
                self.table,
                queue_url=self.queue_url,
                wall_now=time.time(),
                older_than=older_than,
                limit=limit,
                send_id_prefix=new_send_id(),
                dry_run=dry_run,
                interactive_url=None if dry_run else self._interactive_or_none(),
            )
        )
