"""The invariants, checked as the run goes (after every step that can break one).

Each has a stable name (used in reports, replay output and tests):

- ``I1_stale_effect``: no effect (nor any other request) accepted with a token
  lower than one the target already admitted for that fence scope (the job): by
  an effect, a replay, a refused payload or a fenced check. Scopes, not
  resources: tokens of different jobs are not comparable.
- ``I2_double_effect``: no irreversible effect applied twice for one intent key.
- ``I3_superseded_commit``: no result committed (nor any fenced end of an
  attempt: failed, parked, requeued) by a writer whose token was superseded, and
  nothing commits twice or rewrites a finished record; no result committed that
  its handler returned after the attempt was told to stop (it may be partial).
- ``I4_unfinished_job``: every job ends succeeded, failed with a reason, or
  parked with a reason; none lost, none stuck once faults stop (at the end).
- ``I5_extended_lost_lease``: a heartbeat round may move a worker's local lease
  forward only if the job's token (the truth, in the simulated table) had not
  moved, and the job was still running, when the round started; and no round
  includes a job whose handler has already ended.

The widened world (issue 7) adds:

- ``I6_unrecorded_success``: no job reports an effect success the target did not
  record: every confirmed or replayed effect names the external id the target
  recorded for that intent key (checked when the flow confirms or replays it).
- ``I7_live_owner_fenced``: a target never refuses (412) the current owner of a
  job: a request whose token is the job's token while the job is running. (A
  fence orders the tokens of one job; another job's tokens must not block it.)
- ``I8_transient_cancel_lost``: an attempt is not given up as lost (lease lost,
  ownership unknown) because a transaction was cancelled for throttling or a
  conflict while the job was still its own and its local lease still ran.
- ``I9_unknown_class``: a worker that does not know a job's class never writes its
  record (no claim that fences out a live owner, no failure "unknown job class"),
  and no job fails because a message named another class than its record. The
  one exception: when it moves the job's *current* message to the DLQ after the
  bound, it parks the job (``undeliverable``, token + 1), since that move ends any
  lease the message carried.
- ``I10_stranded_record``: at the end no job is ``queued`` with no message for it
  (the producer died between the record and the message); the message names them.

Issue 14 adds:

- ``I11_stray_claim``: a job is claimed only through its current message: the
  claiming delivery's send id is the record's (concurrent producers of one job id
  send messages that one send wins; the others are strays and claim nothing, so
  none takes the job from its live owner).
- ``I12_resume_exhausted``: an operator's resume or resolution grants the attempt
  it starts: the first claim after a job left ``parked`` never fails it "attempts
  exhausted" (before its handler ran).
- ``I13_heartbeat_round_failed``: no heartbeat round fails as a whole
  (``heartbeat_error``): a job record this version cannot read (an unknown state
  written by hand or by a newer version) affects only its own job.
- ``I14_oversize_result``: a DynamoDB validation error (a result over the 400 KB
  item limit) is never taken for ownership unknown, and a job whose handler returned
  such a result ends failed with a reason naming the limit (not "attempts exhausted").

And the rest of issues 7 and 14:

- ``I15_write_after_lease`` (issue 7 item 13): no intent write but a confirm leaves an
  attempt whose local lease is gone (status not open, or past its conservative
  deadline, on the worker's own clock at the moment it is sent).
- ``I16_half_resolution`` (issue 14 item 6): at the end, no job is still parked since
  before an operator's resolution of its intent landed (the resolution and the unpark
  are one decision; an operator that died half way reruns the command).
- ``I17_shared_request_token`` (issue 14 item 7): no transaction is refused
  ``IdempotentParameterMismatch``: a ClientRequestToken names one owner's one write, so
  only an identical retry ever repeats one.

Issue 9 (staged jobs, the ``staged`` world) adds:

- ``I18_stage_checkpoint``: a stage's checkpoint is never lost nor applied twice: every
  write of a staged job's record keeps the stage log it found as its start; a log
  names each stage at most once and never the record's current stage; a log grows
  by one entry only, the ending stage's, written at the token that held it while it
  ran; and a staged job that succeeded went through each of its stages in order.
- ``I19_stage_effect_after_checkpoint``: each stage's effects at most once: no effect
  of a stage applies at a target after that stage's checkpoint was written (a stale
  attempt of a finished stage acts no more; its intents and fences stop it).

Issue 26 adds:

- ``I24_live_owner_taken_over``: a claim that takes a job ``running`` under a live
  owner (its process alive, not paused, its book holding the job at that token with
  a lease open and inside its conservative deadline) has first read that owner's
  liveness record twice, at two moments (the duplicate rule's watch,
  ``_core/duplicates.py``); a claim that did watch and still took a live owner (its
  liveness write failed or came late) is waste, counted ``live_owner_taken_over``.
  Every take-over is counted (``owner_taken_over``).
- ``I21_idle_backpressure``: backpressure never keeps a worker from work while it
  protects no lease: a worker with a free slot and no open lease (every attempt it
  holds ended, or was taken over) is given room to receive (defect 11: after a
  pause in which every lease was taken over, the throttle stayed on until the
  fenced-out handlers returned).

``I1`` is scoped to what a token orders: the tokens of one job (its fence scope).

Two more names report a broken run rather than a broken protocol:
``E_unhandled_exception`` (a worker task raised where the real worker's thread
would have died) and ``E_budget`` (the run hit its event budget).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..._core.records import (
    DEAD_LETTERED_CODE,
    TERMINAL_STATES,
    UNDELIVERED_CODE,
    JobState,
    JobView,
    is_cancelled,
)
from ..._schema.views import view_of
from .clocks import I25, I25_TEXT
from .receiver import Applied

I1 = "I1_stale_effect"
I2 = "I2_double_effect"
I3 = "I3_superseded_commit"
I4 = "I4_unfinished_job"
I5 = "I5_extended_lost_lease"
I6 = "I6_unrecorded_success"
I7 = "I7_live_owner_fenced"
I8 = "I8_transient_cancel_lost"
I9 = "I9_unknown_class"
I10 = "I10_stranded_record"
I11 = "I11_stray_claim"
I12 = "I12_resume_exhausted"
I13 = "I13_heartbeat_round_failed"
I14 = "I14_oversize_result"
I15 = "I15_write_after_lease"
I16 = "I16_half_resolution"
I17 = "I17_shared_request_token"
I18 = "I18_stage_checkpoint"
I19 = "I19_stage_effect_after_checkpoint"
I20 = "I20_refusal_told_as_unknown"
I21 = "I21_idle_backpressure"
I24 = "I24_live_owner_taken_over"  # issue 26, duplicate deliveries (dup-defer)
E_EXC = "E_unhandled_exception"
E_BUDGET = "E_budget"

INVARIANTS: dict[str, str] = {
    I1: "no effect accepted with a token lower than one already admitted for its scope (job)",
    I2: "no irreversible effect applied twice for one intent key",
    I3: "no result committed (or attempt ended) by a superseded token; nothing commits twice",
    I4: "every job ends succeeded, failed or parked with a reason; none lost or stuck",
    I5: "no lease extended by a worker that knows (or should know) it lost it",
    I6: "no job reports an effect success that the target did not record",
    I7: "no target refuses the current owner of a job (fence scoped to the job)",
    I8: "no attempt given up as lost for a throttled or conflicting transaction",
    I9: "no job written (claimed, failed) by a worker that does not know its class",
    I10: "no job left queued without a message (stranded)",
    I11: "no job claimed through a message that is not its current one (a stray send)",
    I12: "no job an operator resumed fails 'attempts exhausted' at the resume's claim",
    I13: "no heartbeat round fails as a whole (one unreadable record affects its own job)",
    I14: "a result over the item limit fails its job naming the limit; never 'unknown'",
    I15: "no intent write (but a confirm) from an attempt whose local lease is gone",
    I16: "no job left parked after an operator resolved its intent (a half-done resolve)",
    I17: "no ClientRequestToken shared by two different writes (one owner's one write)",
    I18: "no stage checkpoint lost or applied twice; a succeeded staged job ran every stage",
    I19: "no effect of a stage applied after that stage's checkpoint",
    I20: "an attempt a refusal proved superseded (fenced start, receiver's 412) ends LeaseLost",
    I21: "no worker with a free slot and no open lease held off by backpressure",
    I24: "no claim takes a job from a live owner without watching its heartbeat first",
    I25: I25_TEXT,  # issue 26, the backlog world (clocks.py)
}

TRANSIENT_REASONS = frozenset(
    {"ThrottlingError", "TransactionConflict", "ProvisionedThroughputExceeded"}
)

_FINAL = (*TERMINAL_STATES, JobState.PARKED)
_KNOWN_STATES = frozenset(s.value for s in JobState)


@dataclass
class Origin:
    """Who sent a request: the checker's view of the issuing task."""

    worker: str
    task: str
    kind: str  # job | heartbeat | release | sweep | producer | operator
    tokens: dict[str, int] = field(default_factory=dict)  # job id -> token it acts under
    handler_ended: bool = False
    told_to_stop: bool = False  # the attempt was told to stop before its handler ended
    # the last AWS answer this task got was a transaction cancelled for transient
    # reasons only (throttling, a conflict): the checker's view for I8
    transient_cancel: bool = False
    # job tasks: the send id of the message they were given (I11)
    send_id: str | None = None
    # job tasks running an effect: the attempt's local lease (I15)
    lease: Any = None
    # job tasks: when their delivery's receive left (true time) and their worker's
    # lease-clock rate; the claim this task writes carries it to its token (I25)
    received: tuple[float, float] | None = None


@dataclass(frozen=True)
class Violation:
    name: str
    time: float
    message: str

    def line(self) -> str:
        return f"{self.name} at t={self.time:.3f}: {self.message}"


class Checker:
    def __init__(self, jobs_table: str, intents_table: str = "") -> None:
        self.jobs_table = jobs_table
        self.intents_table = intents_table
        self.violations: list[Violation] = []
        self.now = 0.0
        self._high: dict[tuple[str, str], int] = {}
        self._applied: dict[tuple[str, str], Applied] = {}
        self._commits: dict[str, int] = {}
        self.final_jobs: set[str] = set()
        self.counts: dict[str, int] = {}
        # I12: job -> its attempt when unparked, and the token of the claim after it
        self._resumed: dict[str, tuple[int, int | None]] = {}
        self._since: dict[str, float] = {}  # I16: job -> when its state last changed
        self._resolved_at: dict[str, tuple[float, str]] = {}  # I16: job -> (when, intent key)
        # worker id -> the job classes its app knows (None: not a worker); set by the world
        self.known_classes: Any = lambda worker: None
        # staged: job -> its stages in order (set by the world); I19: job -> stage ->
        # (when its checkpoint was written, at which token)
        self.staged: dict[str, tuple[str, ...]] = {}
        self._checkpointed: dict[str, dict[str, tuple[float, int]]] = {}
        # The view of each job item written, by the item's identity: the next write's
        # ``old`` is this write's ``new``, so each item is read once, not twice. Safe:
        # the simulated table never changes an item in place (a write stores a new
        # dict), views are frozen, and an entry keeps its item alive (no id reuse).
        self._views: dict[int, tuple[Mapping[str, Any], Any]] = {}
        # I24 (dup-defer): set by the world: is this worker a live owner of the job at
        # this token; and when each job task read each owner's liveness record.
        self.live_owner: Any = lambda worker, job_id, token: False
        self._watched: dict[tuple[str, str, str], list[float]] = {}

    def fail(self, name: str, message: str) -> None:
        self.violations.append(Violation(name, self.now, message))

    def bump(self, what: str, n: int = 1) -> None:
        if n:
            self.counts[what] = self.counts.get(what, 0) + n

    # ------------------------------------------------------------------ I1, I2

    def request_admitted(self, target: str, scope: str, token: int) -> None:
        """The target's fence let a request of ``scope`` at ``token`` through: never one
        below a token it already let through (whatever either request asked: an
        effect, a replay, a refused payload, a fenced check)."""
        key = (target, scope)
        high = self._high.get(key, 0)
        if token < high:
            self.fail(
                I1,
                f"{target} let a request of job {scope} through with token {token} after "
                f"token {high} had been let through for it",
            )
        self._high[key] = max(high, token)

    def effect_applied(self, e: Applied) -> None:
        scope = (e.target, e.scope)
        high = self._high.get(scope, 0)
        if e.token < high:
            self.fail(
                I1,
                f"{e.target} applied {e.key!r} for job {e.scope} with token {e.token} after "
                f"token {high} was admitted for it (worker {e.worker})",
            )
        self._high[scope] = max(high, e.token)
        first = self._applied.get((e.target, e.key))
        if first is not None:
            self.fail(
                I2,
                f"{e.target} applied intent {e.key!r} twice: token {first.token} by "
                f"{first.worker} at t={first.time:.3f}, token {e.token} by {e.worker} "
                f"at t={e.time:.3f}",
            )
        else:
            self._applied[(e.target, e.key)] = e

    # ------------------------------------------------------------------ I3

    def item_written(
        self,
        table: str,
        old: Mapping[str, Any] | None,
        new: Mapping[str, Any] | None,
        origin: Any,
    ) -> None:
        if table == self.intents_table and new is not None:
            self._intent_written(old, new)
            return
        if table != self.jobs_table or new is None:
            return
        if _unreadable(new) or (old is not None and _unreadable(old)):
            return  # unreadable_records: a record no version here reads is no evidence
        n = view_of(new)
        self._views[id(new)] = (new, n)
        if n.state in _FINAL:
            self.final_jobs.add(n.job_id)
        else:
            self.final_jobs.discard(n.job_id)
        if n.state is JobState.FAILED and new.get("error_code", {}).get("S") == "class_mismatch":
            self.fail(
                I9,
                f"{n.job_id} (class {n.job_class}) failed by {_who(origin)} because a message "
                f"named another class: {n.reason}",
            )
            return
        if old is None:
            return
        seen = self._views.pop(id(old), None)
        o = seen[1] if seen is not None and seen[0] is old else view_of(old)
        job = o.job_id
        if job in self.staged:
            self._stage_log_written(o, n, origin)
        if n.state is not o.state:
            self._since[job] = self.now
        self._resume_exhausted(o, n, origin)
        if isinstance(origin, Origin):
            known = self.known_classes(origin.worker)
            if known is not None and o.job_class not in known and self._undeliverable_park(o, n):
                if n.error_code == DEAD_LETTERED_CODE and origin.kind == "sweep":
                    # A DLQ reconciliation's park: the job's current message is in the
                    # DLQ (the write's condition names its send). Parking runs nothing,
                    # so it needs no knowledge of the class (``sqs-lease dlq`` has none).
                    return
                if origin.send_id != o.send_id:
                    self.fail(
                        I9,
                        f"{_who(origin)} parked {job} as undeliverable through message send "
                        f"{origin.send_id!r}; the job's current send is {o.send_id!r}",
                    )
                return
            if (
                known is not None
                and o.job_class not in known
                and ((n.token, n.state) != (o.token, o.state))
            ):
                what = (
                    f"claimed it from its live owner {o.owner} (token {o.token} -> {n.token})"
                    if o.state is JobState.RUNNING and n.token != o.token
                    else f"moved it from {o.state} token {o.token} to {n.state} token {n.token}"
                    + (f" ({n.reason})" if n.reason and n.state in _FINAL else "")
                )
                self.fail(
                    I9,
                    f"{origin.worker}, whose app does not know class {o.job_class!r}, "
                    f"wrote {job}: {what}",
                )
                return
        if o.state.terminal:
            if _operator_retry(o, n, origin):  # lambda: ``jobs retry`` runs a failed job again
                return
            if (n.state, n.token, new.get("result")) != (o.state, o.token, old.get("result")):
                self.fail(
                    I3,
                    f"finished record of {job} ({o.state}, token {o.token}) rewritten to "
                    f"{n.state} token {n.token} by {_who(origin)}",
                )
            return
        if n.state is JobState.SUCCEEDED:
            self._commits[job] = self._commits.get(job, 0) + 1
            if self._commits[job] > 1:
                self.fail(I3, f"{job} committed twice (by {_who(origin)})")
        if not isinstance(origin, Origin):
            return
        if n.state is JobState.SUCCEEDED and origin.kind == "job" and origin.told_to_stop:
            self.fail(
                I3,
                f"{_who(origin)} committed a result its handler returned after the attempt "
                "was told to stop",
            )
        if (
            origin.kind == "job"
            and n.state is JobState.RUNNING
            and n.token == o.token + 1
            and n.owner == origin.worker
        ):
            if origin.send_id != o.send_id:
                self._stray_claim(origin, job, o.state, o.token, o.send_id)
                return
            if o.state is JobState.RUNNING:
                self._took_over(origin, o)
            origin.tokens[job] = n.token  # a claim: this task now acts under the new token
            return
        if o.state is JobState.RUNNING and n.state is not JobState.RUNNING:
            if origin.kind not in ("job", "heartbeat", "release"):
                return
            mine = origin.tokens.get(job)
            if mine != o.token:
                what = (
                    "committed its result"
                    if n.state is JobState.SUCCEEDED
                    else (f"moved the job to {n.state}")
                )
                self.fail(
                    I3,
                    f"{_who(origin)} acting under token {mine} {what} while the job's token "
                    f"was {o.token}",
                )

    def _stage_log_written(self, o: Any, n: Any, origin: Any) -> None:
        """I18 on one write of a staged job's record (and I19's checkpoint times)."""
        job = n.job_id
        before, after = _stage_entries(o), _stage_entries(n)
        if after[: len(before)] != before:
            self.fail(
                I18,
                f"{_who(origin)} rewrote {job}'s stage log: {_names(before)} became "
                f"{_names(after)} (a checkpoint lost or changed)",
            )
            return
        names = [stage for stage, _ in after]
        if len(set(names)) != len(names) or n.stage in names:
            self.fail(
                I18,
                f"{_who(origin)} left {job} with stage log {_names(after)} at stage {n.stage}: "
                "a stage checkpointed twice, or run again after its checkpoint",
            )
            return
        added = after[len(before) :]
        if not added:
            return
        stage, token = added[0]
        if (
            len(added) > 1
            or stage != o.stage
            or token != o.token
            or o.state is not JobState.RUNNING
        ):
            self.fail(
                I18,
                f"{_who(origin)} checkpointed {job} as {_names(added)} on a record at stage "
                f"{o.stage}, {o.state}, token {o.token}: only the running stage's own "
                "checkpoint, at its token, may be appended",
            )
            return
        self._checkpointed.setdefault(job, {})[stage] = (self.now, token)

    def room_given(self, worker: str, slots: int, room: int, open_leases: int) -> None:
        """I21: the receive loop of ``worker`` asked for room with ``slots`` free and
        ``open_leases`` leases its heartbeat extends; the book gave ``room``."""
        if slots > 0 and open_leases == 0 and room == 0:
            self.fail(
                I21,
                f"{worker} has {slots} free slot(s) and no open lease, but backpressure "
                "gives it no room: a throttle that protects nothing keeps it from work",
            )

    def stage_effect_applied(self, job: str, stage: str, key: str, token: int, worker: str) -> None:
        """I19: an effect of ``stage`` applied at a target (the world tells)."""
        done = self._checkpointed.get(job, {}).get(stage)
        if done is not None:
            when, by = done
            self.fail(
                I19,
                f"an effect of {job}'s stage {stage} ({key!r}, token {token}, {worker}) applied "
                f"after that stage's checkpoint at t={when:.3f} (token {by})",
            )

    def _intent_written(self, old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> None:
        """I16: when an operator's resolution lands on an intent (its job is then
        expected to leave ``parked`` in the same decision)."""
        if "resolution" in new and (old is None or "resolution" not in old):
            job = str(new.get("job_id", {}).get("S", ""))
            self._resolved_at[job] = (self.now, str(new.get("intent_key", {}).get("S", "")))

    def call_sent(self, call: Any, origin: Any, mono: float) -> None:
        self._liveness_read(call, origin)
        self._intent_write_checked(call, origin, mono)

    # ------------------------------------------------------------------ I24 (dup-defer)

    def _liveness_read(self, call: Any, origin: Any) -> None:
        """A job task reads an owner's liveness record: the duplicate rule's watch."""
        if not isinstance(origin, Origin) or origin.kind != "job" or call.op != "GetItem":
            return
        key = str(call.params.get("Key", {}).get("job_id", {}).get("S", ""))
        if key.startswith("worker#") and "#" not in key[len("worker#") :]:
            owner = key[len("worker#") :]
            self._watched.setdefault((origin.worker, origin.task, owner), []).append(self.now)

    def _took_over(self, origin: Origin, o: JobView) -> None:
        """A claim took ``o`` (running) over: from a live owner only after watching it."""
        self.bump("owner_taken_over")
        owner = o.owner or ""
        if not self.live_owner(owner, o.job_id, o.token):
            return
        self.bump("live_owner_taken_over")
        reads = self._watched.get((origin.worker, origin.task, owner), [])
        if owner != origin.worker and len(reads) >= 2 and reads[-1] > reads[0]:
            return  # it watched; the owner's liveness did not land meanwhile (waste)
        self.fail(
            I24,
            f"{_who(origin)} took {o.job_id} (token {o.token}) from its live owner {owner} "
            f"without watching its heartbeat ({len(reads)} liveness reads)",
        )

    # ------------------------------------------------------------------ I15

    def _intent_write_checked(self, call: Any, origin: Any, mono: float) -> None:
        """I15: an intent write leaves a job task only while its attempt may still act.

        Every intent write of an attempt checks the local lease first; only a confirm
        (recording an outcome the target gave, which starts nothing) may go out on a
        lease whose ownership is unconfirmed, and never on one that is gone. So every
        intent write but a confirm must find the lease open with time left."""
        if not isinstance(origin, Origin) or origin.lease is None or origin.kind != "job":
            return
        what = _intent_write(call, self.intents_table)
        if what is None or what == "confirm":
            return
        lease = origin.lease
        if not lease.may_record(mono):
            self.fail(
                I15,
                f"{_who(origin)} sent an intent {what} for {lease.job_id} (token {lease.token}) "
                f"after its local lease was gone ({lease.status}, "
                f"{mono - lease.conservative_deadline:+.3f} s past its conservative deadline)",
            )

    def token_mismatch(self, call: Any, origin: Any) -> None:
        """I17: DynamoDB refused a transaction because its ClientRequestToken had
        been used by a different request: two writes shared one token."""
        self.fail(
            I17,
            f"{_who(origin)}'s {call.op} was refused IdempotentParameterMismatch: its "
            "ClientRequestToken names another, different write (tokens must be one "
            "owner's one write)",
        )

    def half_resolutions(
        self, records: Mapping[str, Mapping[str, Any] | None], stranded: Sequence[str] = ()
    ) -> None:
        """I16 at the end: no job left where a resolution stopped half way: parked since
        before an operator resolved its intent, or queued without a message since then
        (the unpark landed, the message was never sent)."""
        for job_id, (when, key) in sorted(self._resolved_at.items()):
            item = records.get(job_id)
            if item is None or _unreadable(item):
                continue
            state = view_of(item).state
            since = self._since.get(job_id, -1.0)
            if state is JobState.PARKED and since <= when:
                where = f"is still parked (since t={since:.3f})"
            elif state is JobState.QUEUED and job_id in stranded and since >= when:
                where = f"is queued without a message (since t={since:.3f})"
            else:
                continue
            self.fail(
                I16,
                f"{job_id} {where} although an operator resolved its intent {key!r} at "
                f"t={when:.3f}: the resolution stopped half way and nothing finished it",
            )

    def _undeliverable_park(self, o: Any, n: Any) -> bool:
        """The writes a worker that does not know a class may make: moving the job's
        current message to the DLQ, it parks the job (token + 1, the reason) so that
        the record does not say ``running`` for a lease nobody can extend any more;
        its sweep's DLQ reconciliation parks a job whose current message SQS moved
        there (``DEAD_LETTERED_CODE``), the same park."""
        ok = (
            n.state is JobState.PARKED
            and n.error_code in (UNDELIVERED_CODE, DEAD_LETTERED_CODE)
            and o.state in (JobState.QUEUED, JobState.RUNNING)
            and n.token == o.token + 1
            and n.attempt == o.attempt
        )
        if ok:
            self.bump("undeliverable_parked")
        return ok

    def _stray_claim(
        self, origin: Origin, job: str, state: JobState, token: int, current: str | None
    ) -> None:
        """I11: a claim through a message whose send id is not the record's."""
        whom = "from its live owner " if state is JobState.RUNNING else ""
        self.fail(
            I11,
            f"{_who(origin)} claimed {job} ({state}, token {token}) {whom}through message "
            f"send {origin.send_id!r}; the job's current send is {current!r}",
        )

    def validation_as_unknown(self, worker: str, job_id: str, reason: str) -> None:
        """I14: ``ownership_unknown`` journaled for a write refused as invalid."""
        self.fail(
            I14,
            f"{worker} reported ownership of {job_id} unknown after DynamoDB refused a "
            f"write as invalid ({reason[:200]}): retrying can never help",
        )

    def oversize_ended(
        self, records: Mapping[str, Mapping[str, Any] | None], returned: Mapping[str, int]
    ) -> None:
        """I14 at the end: each job that returned an oversize result failed naming the limit.

        ``returned`` maps a job to the token of the attempt that returned it. A record
        at another token was ended by another attempt (a duplicate delivery took the
        job over and its own claim decided the end; the oversize attempt's write was
        refused by the fence): that end is the other attempt's story, not this one's.
        """
        for job_id, token in sorted(returned.items()):
            item = records.get(job_id)
            if item is None:
                continue
            v = view_of(item)
            if v.token != token:
                continue
            if v.state is JobState.FAILED and "item limit" in (v.reason or ""):
                continue
            if is_cancelled(v) or (v.state is JobState.FAILED and v.error_code == "class_mismatch"):
                continue
            self.fail(
                I14,
                f"{job_id} returned a result over the item limit and ended {v.state} "
                f"({v.error_code}: {(v.reason or '')[:200]}), not failed naming the limit",
            )

    def round_failed(self, worker: str, exc: Exception) -> None:
        """I13: a heartbeat round raised (the worker journals ``heartbeat_error``)."""
        self.fail(
            I13,
            f"{worker}'s heartbeat round failed as a whole ({type(exc).__name__}: "
            f"{str(exc)[:200]}): no job of the round got a verdict",
        )

    def _resume_exhausted(self, o: JobView, n: JobView, origin: Any) -> None:
        """I12: the first claim after an operator's unpark must not exhaust the job.

        That claim is the job's first step out of ``queued`` after the unpark: either
        one write ending it failed, or a claim (``running``, the next attempt) whose
        owner then ends it failed under the same token. Whatever the job does next
        (a stage ending, another claim) is no longer the resume's: a staged job's
        attempts restart at each stage, so a later stage's own exhaustion must not
        match the resume by its number (seed 105).
        """
        job = o.job_id
        if o.state is JobState.PARKED and n.state is JobState.QUEUED:
            self._resumed[job] = (n.attempt, None)
            return
        entry = self._resumed.get(job)
        if entry is None or (o.state is n.state is JobState.QUEUED):
            return  # not resumed, or still waiting for its claim (a send, a sweep)
        resumed, claim_token = entry
        first = n.attempt == resumed + 1
        if claim_token is None and first and n.state is JobState.RUNNING:
            self._resumed[job] = (resumed, n.token)  # the resume's claim: see how it ends
            return
        del self._resumed[job]
        text = n.reason or ""
        if (
            n.state is JobState.FAILED
            and text.startswith("attempts exhausted")
            and "last error" not in text  # a retry's end: the handler did run
            and first
            and claim_token in (None, n.token)
        ):
            self.fail(
                I12,
                f"{job} failed by {_who(origin)} at the first claim after an operator "
                f"resumed it (attempt {n.attempt}): {text}",
            )

    # ------------------------------------------------------------------ I5

    def beat_planned(self, worker: str, job_id: str, token: int, handler_ended: bool) -> None:
        if handler_ended:
            self.fail(
                I5,
                f"{worker} included {job_id} (token {token}) in a heartbeat round after its "
                "handler had ended",
            )

    def lease_extended(
        self, worker: str, job_id: str, token: int, truth: tuple[int, str] | None
    ) -> None:
        if truth is None:
            self.fail(I5, f"{worker} extended {job_id} (token {token}) whose record is gone")
            return
        t, state = truth
        if state not in _KNOWN_STATES:
            return  # unreadable_records: an outside writer's state, put back meanwhile
        if t != token or state != JobState.RUNNING.value:
            self.fail(
                I5,
                f"{worker} extended its lease on {job_id} (token {token}) although the job was "
                f"at token {t}, state {state}, before the heartbeat round started",
            )

    # ------------------------------------------------------------------ I6, I7, I8

    def effect_reported(
        self, worker: str, job_id: str, key: str, external_id: Any, recorded: Applied | None
    ) -> None:
        """A flow confirmed or replayed an effect: the target must have recorded it so."""
        if recorded is None:
            self.fail(
                I6,
                f"{worker} reported intent {key!r} of {job_id} done (external id "
                f"{external_id}) but no target recorded an effect under that key",
            )
        elif external_id != recorded.external_id:
            self.fail(
                I6,
                f"{worker} reported intent {key!r} of {job_id} done as {external_id}; the "
                f"target recorded {recorded.external_id} (token {recorded.token} of "
                f"{recorded.scope})",
            )

    def owner_fenced(
        self,
        target: str,
        key: str,
        resource: str,
        job_id: str,
        token: int,
        worker: str,
        truth: tuple[int, str] | None,
        mark: Any,
    ) -> None:
        if truth is None:
            return
        t, state = truth
        if t == token and state == JobState.RUNNING.value:
            self.fail(
                I7,
                f"{target} refused {worker}, the live owner of {job_id} (token {token}), "
                f"for {key!r} on {resource}: the resource's mark was {mark}",
            )

    def attempt_abandoned(
        self,
        worker: str,
        job_id: str,
        token: int,
        error: str,
        truth: tuple[int, str] | None,
        lease_running: bool,
    ) -> None:
        """An attempt gave itself up right after a transiently cancelled transaction."""
        if truth is None or not lease_running:
            return
        t, state = truth
        if t == token and state == JobState.RUNNING.value:
            self.fail(
                I8,
                f"{worker} gave up {job_id} (token {token}, still its own, lease running) "
                f"as {error} after a transaction cancelled for a transient reason",
            )

    # ------------------------------------------------------------------ I20

    def refusal_told_as(self, worker: str, job_id: str, token: int, error: str) -> None:
        """I20: the attempt met a refusal that proves another owner (its fenced intent
        start found the token moved, or a fenced receiver answered 412) and ended
        ``error``: anything but a lease loss (or a cancel, a loss too) misinforms the
        operator (issue 26: the before-send pause ended ``OwnershipUnknown``)."""
        if error not in ("LeaseLost", "JobCancelled"):
            self.fail(
                I20,
                f"{worker} abandoned {job_id} (token {token}) as {error} after a refusal "
                "that proved another owner",
            )

    # ------------------------------------------------------------------ I4, I10

    def finish(
        self,
        records: Mapping[str, Mapping[str, Any] | None],
        detail: Mapping[str, str],
        stranded: Sequence[str] = (),
    ) -> None:
        if stranded:
            self.fail(
                I10,
                f"{len(stranded)} job(s) queued with no message at the end: " + ", ".join(stranded),
            )
        for job_id, item in records.items():
            if job_id in stranded:
                continue
            if item is None:
                self.fail(I4, f"{job_id}: no job record (lost)")
                continue
            v = view_of(item)
            extra = detail.get(job_id, "")
            if v.state not in _FINAL:
                self.fail(
                    I4,
                    f"{job_id} is {v.state} (token {v.token}, attempt {v.attempt}, owner "
                    f"{v.owner}) after the drain{extra}",
                )
            elif v.state is not JobState.SUCCEEDED and not (v.reason or "").strip():
                self.fail(I4, f"{job_id} is {v.state} without a reason")
            elif v.state is JobState.SUCCEEDED and job_id in self.staged:
                stages = self.staged[job_id]
                done = [stage for stage, _ in _stage_entries(v)]
                if done != list(stages[:-1]) or v.stage != stages[-1]:
                    self.fail(
                        I18,
                        f"{job_id} succeeded at stage {v.stage} with checkpoints {done}; its "
                        f"stages are {list(stages)}",
                    )


def _operator_retry(o: Any, n: Any, origin: Any) -> bool:
    """An operator's ``jobs retry`` of a failed job: the one write that may reopen a
    finished record (failed -> queued, a new send; the lambda world's operator)."""
    return (
        isinstance(origin, Origin)
        and origin.kind == "operator"
        and o.state is JobState.FAILED
        and n.state is JobState.QUEUED
    )


def _intent_write(call: Any, intents_table: str) -> str | None:
    """Which intent write a call is (None: not one). A confirm is told by the state
    it writes."""
    params = call.params
    if call.op in ("PutItem", "UpdateItem", "DeleteItem"):
        if params.get("TableName") != intents_table:
            return None
        return {"PutItem": "prepare", "UpdateItem": "update", "DeleteItem": "delete"}[call.op]
    if call.op != "TransactWriteItems":
        return None
    kinds: list[str] = []
    for entry in params.get("TransactItems", []):
        for kind, body in entry.items():
            if body.get("TableName") == intents_table and kind != "ConditionCheck":
                values = body.get("ExpressionAttributeValues", {})
                states = {v.get("S") for v in values.values() if isinstance(v, Mapping)}
                kinds.append("confirm" if "confirmed" in states else "transaction")
    if not kinds:
        return None
    return "confirm" if "confirm" in kinds else "transaction"


def _stage_entries(view: Any) -> list[tuple[str, int]]:
    """A record's stage log as (stage, token) pairs, in order."""
    if not view.stage_log:
        return []
    return [(str(e["stage"]), int(e.get("token", 0))) for e in json.loads(view.stage_log)]


def _names(entries: Sequence[tuple[str, int]]) -> str:
    return "[" + ", ".join(f"{stage}@{token}" for stage, token in entries) + "]"


def _unreadable(item: Mapping[str, Any]) -> bool:
    """unreadable_records: the outside writer's edit (a state no version knows)."""
    return item.get("state", {}).get("S") not in _KNOWN_STATES


def _who(origin: Any) -> str:
    if isinstance(origin, Origin):
        return f"{origin.worker}/{origin.task}"
    return str(origin)
