"""FIFO queues: which queue is one, and the group and deduplication ids of a send.

A FIFO queue is known by its name (AWS's own rule: it ends in ``.fifo``, and so
does its URL), so no flag travels with a queue URL. Every message sent to one
carries two ids, and these are the toolkit's choices:

- ``MessageGroupId``: the job's group (agent session) when the producer set one,
  else the job id. SQS hands out a group's messages one at a time, in order, and
  holds the rest of the group while one is in flight: a leased job holds its
  message in flight for the whole attempt (hours, with heartbeats), and its
  retry backoff too. A shared group for ungrouped jobs would make one long job
  stall every other job of the queue; the job id as its own group keeps
  independent jobs independent (the job's own re-sends and stages stay in order).
  A session's jobs, sharing the session's group, run one at a time in the order
  they were submitted, which is what a FIFO queue is chosen for; the Lambda
  adapter's per-group stop (``eventsource.GroupStop``) keeps that order when a
  record of the group fails. An id SQS would refuse (over 128 characters, or
  characters outside its set) is replaced by a digest of it: stable, so the
  order is the same.
- ``MessageDeduplicationId``: the job id and the send id together
  (:func:`deduplication_id`), the send being the one the record names as its
  current message (written conditionally by the one sender that won the right
  to send). SQS accepts and drops a message whose deduplication id it saw in
  the last 5 minutes on the whole queue (even one already received and
  deleted, and whatever its group). A retried SendMessage of one send (its
  answer lost) therefore leaves one message, while every new send (a
  resubmission taking over, a resume, a retry, the stranded sweep's re-send, a
  stage's continuation) has a new send id and is never dropped as a duplicate
  of the message it replaces. A send id is unique within its job only (a
  continuation's is ``stage.{token}.{next}``, the same for every job at that
  token and stage), so the job id is part of the deduplication id: another
  job's send is never taken for a duplicate (issue 26). Copies of a message
  (the poison copy to the DLQ, a redrive back) are deduplicated per copied
  message (:func:`copy_deduplication_id`). Content-based deduplication is not
  used: an explicit id wins over it anyway.

A FIFO queue takes no per-message ``DelaySeconds`` (only a queue-wide delay): a
delayed submit to one is refused before anything is written.

FIFO order is per message, not per job (issue 26 defect 9). A staged job sends one
message per stage, and each continuation joins the back of its group: a later job
of the same session, already waiting in the group, runs between two stages of an
earlier one. Keeping job order instead would need the continuation ahead of the
waiting message, which SQS cannot do, or every later job of the session held
back outside the queue until the staged job ends. So the order a session gets is
this one, and a producer must accept it: submitting a job that can take more than
one stage (a staged class of several stages, a plan of several steps) to a FIFO
group is refused unless it says ``interleave_stages=True``
(:func:`session_order_problem`, checked by ``submit_flow``).
"""

from __future__ import annotations

import hashlib
from typing import Any, Literal

FIFO_SUFFIX = ".fifo"

GROUP_ID_LIMIT = 128
"""SQS's limit on ``MessageGroupId`` (and ``MessageDeduplicationId``)."""

# Letters, digits and ASCII punctuation: SQS's character set for both ids.
_ID_CHARS = frozenset(
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
    "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"
)


def is_fifo(queue: str) -> bool:
    """Whether the queue (its name, URL or ARN) is a FIFO queue."""
    return queue.endswith(FIFO_SUFFIX)


def sqs_id(value: str) -> str:
    """``value`` if SQS takes it as a group or deduplication id, else a stable digest."""
    if 0 < len(value) <= GROUP_ID_LIMIT and all(c in _ID_CHARS for c in value):
        return value
    return "sha256:" + hashlib.sha256(value.encode("utf-8")).hexdigest()


def message_group_id(job_id: str, group: str | None) -> str:
    """The ``MessageGroupId`` of a job's messages: its group, else the job id."""
    return sqs_id(group if group else job_id)


def deduplication_id(job_id: str, send_id: str) -> str:
    """The ``MessageDeduplicationId`` of one send of a job's message: unique per job
    and per send, on every path that sends (submit, resume, retry, resolve, repair,
    the sweep, a continuation).

    The job id's length comes first, so two (job, send) pairs never spell the same
    id (``a.b``/``c`` and ``a``/``b.c`` differ), and the id starts with a digit, so it
    never meets a copy's id (a word first) nor a digest (``sha256:``, what
    :func:`sqs_id` makes of one too long for SQS)."""
    return sqs_id(f"{len(job_id)}.{job_id}.{send_id}")


CopyPurpose = Literal["poison", "redrive"]


def copy_deduplication_id(purpose: CopyPurpose, message_id: str) -> str:
    """The ``MessageDeduplicationId`` of a copy of one SQS message (its poison copy to
    the DLQ, a redrive back to the queue): a copy repeated because the delete of
    the original failed stays one copy; SQS's message ids are unique."""
    return sqs_id(f"{purpose}:{message_id}")


def fifo_params(queue_url: str, *, group_id: str, dedup_id: str) -> dict[str, Any]:
    """The SendMessage parameters a FIFO queue requires (none for a standard queue).

    ``dedup_id`` comes from :func:`deduplication_id` or :func:`copy_deduplication_id`
    (a test holds every caller to that)."""
    if not is_fifo(queue_url):
        return {}
    return {"MessageGroupId": sqs_id(group_id), "MessageDeduplicationId": sqs_id(dedup_id)}


def session_order_problem(
    queue_url: str, *, group: str | None, stages: int, interleave: bool
) -> str | None:
    """Why a submit would break what a FIFO session's order promises (None: it would not).

    A job of ``stages`` possible messages in the FIFO group ``group``: its stages after
    the first go to the back of the group, so later jobs of the session run between
    them. Only a producer that said so (``interleave``) may submit it. An ungrouped job
    is alone in its group (its id): its stages keep their order."""
    if not is_fifo(queue_url) or group is None or stages < 2 or interleave:
        return None
    return (
        f"group={group!r}: this job runs in {stages} stages, and on a FIFO queue each "
        "stage after the first joins the back of its message group, so later jobs of "
        "the session run between its stages (FIFO order is per message, docs/stages.md); "
        "pass interleave_stages=True (CLI: --interleave-stages) to accept that order, or "
        "submit it without a group"
    )
