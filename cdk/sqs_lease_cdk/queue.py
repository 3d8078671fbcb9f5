"""The leased queue: visibility and redrive derived from the job classes."""

from __future__ import annotations

from collections.abc import Iterable

from aws_cdk import Duration, RemovalPolicy
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from sqs_lease import App, ConfigError, JobClass, Settings
from sqs_lease.deploy import (
    DLQ_RETENTION_SECONDS,
    PERMISSIONS,
    QUEUE_RETENTION_SECONDS,
    lambda_visibility_floor,
    max_receive_count_for,
    queue_visibility_for,
)

from ._common import allow, lease_rules_of, settings_for

# The actions come from the library's one list (``sqs_lease.deploy.PERMISSIONS``),
# which a test checks against every call the code makes.
WORKER_QUEUE_ACTIONS = PERMISSIONS["worker"]["queue"]
"""What a worker (thread, async or Lambda shell) calls on the job queues."""

WORKER_DLQ_ACTIONS = PERMISSIONS["worker"]["dlq"]
"""What a worker calls on the dead-letter queue."""

SWEEPER_QUEUE_ACTIONS = PERMISSIONS["sweeper"]["queue"]
"""What the Lambda consumer's scheduled sweep calls on the job queues: it receives
and deletes nothing there."""

SWEEPER_DLQ_ACTIONS = PERMISSIONS["sweeper"]["dlq"]
"""What the scheduled sweep calls on the dead-letter queue (it parks the jobs of the
messages SQS moved there, and never deletes one)."""

PRODUCER_QUEUE_ACTIONS = PERMISSIONS["producer"]["queue"]
"""What a producer (``Producer.submit``) calls on the job queue."""

DLQ_RETENTION = Duration.seconds(DLQ_RETENTION_SECONDS)
QUEUE_RETENTION = Duration.seconds(QUEUE_RETENTION_SECONDS)
"""Set on the job queues explicitly (``sqs_lease.deploy.QUEUE_RETENTION_SECONDS``):
shorter than the DLQ's, so a message moved there keeps time to be read."""


class LeasedQueue(Construct):
    """The job queue and its dead-letter queue, set up for leases.

    - visibility: the longest ``lease_seconds`` among the job classes, or, when a
      Lambda consumer will read the queue (``lambda_timeout``), at least AWS's
      6 x function timeout + batching window; never typed by hand;
    - redrive: ``maxReceiveCount`` from the classes' ``max_attempts`` by the
      worker's own rule (``sqs_lease.deploy.max_receive_count_for``: never "too
      tight" in the sense of the ``redrive_too_tight`` event);
    - encryption: SQS-managed keys, or ``encryption_key`` (a KMS key) for both queues;
    - a queue policy that denies any access without TLS (both queues);
    - ``fifo``: FIFO queues (names end in ``.fifo``; the DLQ is FIFO too), content-based
      deduplication off: the library sends every message in the job's group (else
      its own) with its send id as the deduplication id (``sqs_lease._core.fifo``);
    - ``interactive``: also the interactive jobs' queue (priorities: ``Settings.
      interactive_queue``, ``PREFIX-jobs-interactive``, ``-interactive.fifo`` on FIFO),
      with the job queue's visibility, encryption and TLS policy, and a redrive to the
      same DLQ with the same ``maxReceiveCount``; workers serve it first when it exists.

    Names follow the library's ``Settings`` for ``prefix`` and ``queue_name``, so
    a worker started with the same prefix finds the queue.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        job_classes: App | Iterable[JobClass],
        prefix: str = "sqs-lease",
        queue_name: str | None = None,
        fifo: bool = False,
        interactive: bool = False,
        lambda_timeout: Duration | None = None,
        max_batching_window: Duration | None = None,
        encryption_key: kms.IKey | None = None,
        removal_policy: RemovalPolicy = RemovalPolicy.RETAIN,
    ) -> None:
        rules = lease_rules_of(job_classes)
        classes = tuple(c for _, c in rules)
        # The library's own rules: FIFO names end in .fifo (the DLQ's too), SQS's charset.
        settings = settings_for(prefix, queue_name, fifo)
        if max_batching_window is not None and lambda_timeout is None:
            raise ConfigError(
                "max_batching_window is the Lambda consumer's: give lambda_timeout too "
                "(or neither when no Lambda reads this queue)"
            )
        window = 0 if max_batching_window is None else int(max_batching_window.to_seconds())
        if fifo and window:
            raise ConfigError(
                f"max_batching_window={window} s: an event source on a FIFO queue takes no "
                "batching window; leave it unset"
            )
        visibility = queue_visibility_for(c.lease_seconds for c in classes)
        timeout: int | None = None
        if lambda_timeout is not None:
            timeout = int(lambda_timeout.to_seconds())
            visibility = max(visibility, lambda_visibility_floor(timeout, window))
        if visibility > 43_200:
            raise ConfigError(
                f"queue visibility {visibility} s exceeds SQS's 43200 s cap; lower lambda_timeout"
            )
        max_receives = max_receive_count_for(c.max_attempts for c in classes)
        super().__init__(scope, construct_id)

        self._settings = settings
        self._classes = classes
        self._rules = rules
        self._visibility = visibility
        self._max_receives = max_receives
        self._lambda_timeout = timeout
        self._window = window
        self._key = encryption_key
        self._fifo = fifo
        # FIFO: explicit deduplication ids (the send id, sqs_lease._core.fifo), so
        # content-based deduplication stays off; SQS wants a FIFO queue's DLQ FIFO.
        dedup = False if fifo else None
        encryption = sqs.QueueEncryption.KMS if encryption_key else sqs.QueueEncryption.SQS_MANAGED
        self._dlq = sqs.Queue(
            self,
            "DeadLetterQueue",
            queue_name=settings.dlq,
            retention_period=DLQ_RETENTION,
            encryption=encryption,
            encryption_master_key=encryption_key,
            enforce_ssl=True,
            fifo=fifo or None,
            content_based_deduplication=dedup,
            removal_policy=removal_policy,
        )
        self._queue = sqs.Queue(
            self,
            "Queue",
            queue_name=settings.queue,
            visibility_timeout=Duration.seconds(visibility),
            retention_period=QUEUE_RETENTION,
            dead_letter_queue=sqs.DeadLetterQueue(queue=self._dlq, max_receive_count=max_receives),
            encryption=encryption,
            encryption_master_key=encryption_key,
            enforce_ssl=True,
            fifo=fifo or None,
            content_based_deduplication=dedup,
            removal_policy=removal_policy,
        )
        # Priorities (docs/operations.md, "Priorities"): a queue of its own per level,
        # the same lease and redrive, one DLQ; the worker finds it by name at start.
        self._interactive: sqs.Queue | None = None
        if interactive:
            self._interactive = sqs.Queue(
                self,
                "InteractiveQueue",
                queue_name=settings.interactive_queue,
                visibility_timeout=Duration.seconds(visibility),
                retention_period=QUEUE_RETENTION,
                dead_letter_queue=sqs.DeadLetterQueue(
                    queue=self._dlq, max_receive_count=max_receives
                ),
                encryption=encryption,
                encryption_master_key=encryption_key,
                enforce_ssl=True,
                fifo=fifo or None,
                content_based_deduplication=dedup,
                removal_policy=removal_policy,
            )

    @property
    def queue(self) -> sqs.IQueue:
        """The job queue."""
        return self._queue

    @property
    def interactive_queue(self) -> sqs.IQueue | None:
        """The interactive jobs' queue (``interactive=True``), else None."""
        return self._interactive

    @property
    def job_queues(self) -> tuple[sqs.IQueue, ...]:
        """Every queue jobs are sent to: the interactive one (when made), then the job queue."""
        return (self._interactive, self._queue) if self._interactive else (self._queue,)

    @property
    def dead_letter_queue(self) -> sqs.IQueue:
        """The dead-letter queue (redrive target; poison messages are copied there)."""
        return self._dlq

    @property
    def settings(self) -> Settings:
        """The library settings whose names this queue has (prefix, queue name)."""
        return self._settings

    @property
    def job_classes(self) -> tuple[JobClass, ...]:
        """The job classes the queue was derived from."""
        return self._classes

    @property
    def lease_budgets(self) -> dict[str, tuple[float, int]]:
        """Each lease rule's name (class, ``job/stage``, ``job/tool``) and its
        (``stage_budget_seconds``, ``lease_seconds``): what a consumer checks it can run."""
        return {n: (c.stage_budget_seconds, c.lease_seconds) for n, c in self._rules}

    @property
    def visibility_timeout_seconds(self) -> int:
        """The queue's default visibility (derived, see the class docstring)."""
        return self._visibility

    @property
    def max_receive_count(self) -> int:
        """The redrive's ``maxReceiveCount`` (derived from the classes' max_attempts)."""
        return self._max_receives

    @property
    def lambda_timeout_seconds(self) -> int | None:
        """The Lambda consumer's function timeout this queue was sized for, if any."""
        return self._lambda_timeout

    @property
    def max_batching_window_seconds(self) -> int:
        """The Lambda event source's batching window this queue was sized for (0: none)."""
        return self._window

    @property
    def fifo(self) -> bool:
        """Whether both queues are FIFO."""
        return self._fifo

    @property
    def encryption_key(self) -> kms.IKey | None:
        """The KMS key of both queues, or None for SQS-managed encryption."""
        return self._key

    def grant_worker(self, grantee: iam.IGrantable) -> None:
        """What a worker calls: receive, extend, delete and send on the job queues; send,
        and the sweep's look, on the DLQ."""
        allow(grantee, WORKER_QUEUE_ACTIONS, [q.queue_arn for q in self.job_queues])
        allow(grantee, WORKER_DLQ_ACTIONS, [self._dlq.queue_arn])
        self._grant_key(grantee)

    def grant_sweeper(self, grantee: iam.IGrantable) -> None:
        """What the scheduled sweep calls: send on the job queues; look at the DLQ."""
        allow(grantee, SWEEPER_QUEUE_ACTIONS, [q.queue_arn for q in self.job_queues])
        allow(grantee, SWEEPER_DLQ_ACTIONS, [self._dlq.queue_arn])
        self._grant_key(grantee)

    def grant_producer(self, grantee: iam.IGrantable) -> None:
        """What a producer calls: send on the job queues (``--priority interactive``)."""
        allow(grantee, PRODUCER_QUEUE_ACTIONS, [q.queue_arn for q in self.job_queues])
        self._grant_key(grantee)

    def _grant_key(self, grantee: iam.IGrantable) -> None:
        if self._key is not None:
            # Sending needs a data key, receiving needs to decrypt it.
            self._key.grant(grantee, "kms:GenerateDataKey", "kms:Decrypt")
