"""Directed worlds for mutations no seed draws (``UNCAUGHT`` and ``LAMBDA_UNCAUGHT`` in
simtools/mutations.py).

Each world is one seed's world, narrowed (one job, or a backlog of like jobs; no
drawn fault), with the rare schedule its mutation needs made to happen every time:
a request held in the network, a target answering as told, an operator dying where
told, a backlog queued before the event source starts. The real protocol must pass
with the case drawn (its journal events); the mutation must break the invariant its
docstring names or, where no invariant names the harm, show it (the test says
which). The directing happens in the test (knobs of the built world, one of them,
``SimSQS.cap_from_first_receive``, off in every drawn run; patches of the
simulator's network, operator, event source, SQS sends and handlers for the run),
so no seed's schedule moves (docs/simulation.md, "Directed worlds").
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Generator, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import replace
from typing import Any
from unittest import mock

from simtools.mutations import applied
from sqs_lease._core.calls import Call
from sqs_lease._core.groups import cancel_group_flow
from sqs_lease._core.stages import NextStage, retry_failed_flow
from sqs_lease.testing._sim import lambdas, network, operators
from sqs_lease.testing._sim.fifo import FifoPlan
from sqs_lease.testing._sim.invariants import I2, I4, I17, Origin
from sqs_lease.testing._sim.lambdas import I23
from sqs_lease.testing._sim.plan import Step, SweepPlan
from sqs_lease.testing._sim.receiver import TargetFaults
from sqs_lease.testing._sim.render import txn_kind
from sqs_lease.testing._sim.tasks import CallOp, Pending, Remote, Task, drive_plain
from sqs_lease.testing._sim.worker import SimWorker
from sqs_lease.testing._sim.world import RunResult, World

SEED = 0
ONE_EFFECT = (Step("work", 1.0), Step("effect", action="act0"), Step("work", 1.0))


def _directed(w: World, **changes: Any) -> Any:
    """The world's one job, as the test directs it: no drawn fault, no scripted
    failure (unless ``changes`` scripts one), submitted at 1 s; the job's plan."""
    w.plan.fault_events = 0
    fields: dict[str, Any] = {"submit_at": 1.0, "p_transient": 0.0, "p_permanent": 0.0}
    jp = replace(w.plan.job_plans[0], **{**fields, "p_unknown": 0.0, **changes})
    w.plan.job_plans = [jp]
    w.job_plans = {jp.job_id: jp}
    return jp


def _one_job(mutation: str | None, *, workers: int, target: str) -> World:
    """Seed SEED's narrow world with one job of one effect: what happens to it is what
    the test directs."""
    w = World(SEED, trace=True, features=frozenset(), mutation=mutation, workers=workers, jobs=1)
    _directed(w, steps=ONE_EFFECT, target=target)
    return w


def _events(result: RunResult, kind: str) -> list[tuple[str, Any]]:
    return [(who, data) for _, who, k, data in result.log if k == kind]


# ------------------------------------------------------------- shared_request_tokens


@contextmanager
def _start_held_in_the_network(world: World) -> Iterator[None]:
    """The first owner's first intent start leaves the process, which dies at once;
    the request stays in the network until the next owner's start of the same
    attempt has applied, and lands a second later (a stale owner's late request)."""
    real_call, real_service = network.call, network._service
    held: list[CallOp] = []
    landed: list[bool] = []

    def call(w: World, task: Task, op: CallOp) -> None:
        if not held and op.call.op == "TransactWriteItems" and txn_kind(op.call) == "intent_start":
            held.append(op)
            w.record("test", "start_held", {"from": task.actor.id})
            w.worker_exited(task.actor, restart_after=5.0)
            return
        real_call(w, task, op)

    def service(w: World, op: CallOp) -> Any:
        out = real_service(w, op)
        c = op.call
        if (
            held
            and not landed
            and c.op == "TransactWriteItems"
            and txn_kind(c) == "intent_start"
            and op.origin.worker != held[0].origin.worker
        ):
            landed.append(True)

            def late() -> None:
                w.record("test", "late_start_lands", {"from": held[0].origin.worker})
                real_service(w, held[0])

            w.at(w.now + 1.0, late)
        return out

    with mock.patch.object(network, "call", call), mock.patch.object(network, "_service", service):
        yield


def _shared_tokens_run(mutation: str | None = None) -> RunResult:
    with applied(mutation):
        w = _one_job(mutation, workers=2, target="keyed")
        w.ddb.faults.idempotent_tokens = True  # as AWS: a token names one request
        with _start_held_in_the_network(w):
            return w.run()


def test_a_stale_owners_late_intent_start_is_refused_by_the_fence_not_by_a_shared_token() -> None:
    result = _shared_tokens_run()
    assert result.ok, result.violations[:1]
    assert _events(result, "late_start_lands"), "the directed world no longer holds a start"
    assert [d["token"] for _, d in _events(result, "intent_started")] == [2]
    assert _events(result, "result_committed")


def test_request_tokens_without_the_owner_are_caught() -> None:
    """``shared_request_tokens``: the late start of attempt 1 under token 1 carries the
    token of the new owner's start of attempt 1 under token 2: AWS refuses it
    ``IdempotentParameterMismatch``."""
    result = _shared_tokens_run("shared_request_tokens")
    assert result.violations and result.violations[0].name == I17
    assert "w1" in result.violations[0].message


# ------------------------------------------------------------------ stale_resolution


def _tapped_mortal(
    dies_after: Callable[[bool, str], bool], answered: Callable[[str], None] = lambda op: None
) -> Callable[..., Any]:
    """``operators._mortal`` that watches each command's calls: ``answered(op)`` after
    each call's answer, and the command dies after a call when ``dies_after(first,
    op)`` says so (``first``: the first command of the run)."""
    real_mortal = operators._mortal
    runs: list[int] = []

    def mortal(flow: Any, dies: Callable[[], bool], failed: list[BaseException]) -> Any:
        runs.append(1)
        first = len(runs) == 1
        last: list[str] = [""]

        def tap() -> Generator[Any, Any, Any]:
            instr = next(flow)
            while True:
                last[0] = instr.op if isinstance(instr, Call) else ""
                out = yield instr
                answered(last[0])
                try:
                    instr = flow.send(out)
                except StopIteration as stop:
                    return stop.value

        return real_mortal(tap(), lambda: dies_after(first, last[0]), failed)

    return mortal


@contextmanager
def _operator_dies_after_its_first_send(world: World) -> Iterator[None]:
    """The operator's first command dies right after its SendMessage applied (the
    runbook runs it again up to a minute later); later runs never die. The job's
    next decision waits a minute more than drawn, so the command run again meets
    the job's next ambiguity first (soak seed 57932's order), and the decision
    still comes within the run's settle time (90 s after a park)."""
    mortal = _tapped_mortal(lambda first, op: first and op == "SendMessage")

    real_decide = world.runbook.decide

    def decide(job_id: str, n: int, waited: int = 0) -> None:
        if n == 2 and waited == 0:
            world.at(world.now + 60.0, lambda: real_decide(job_id, n, 1))
            return
        real_decide(job_id, n, waited)

    with ExitStack() as stack:
        stack.enter_context(mock.patch.object(operators, "_mortal", mortal))
        stack.enter_context(mock.patch.object(world.runbook, "decide", decide))
        yield


@contextmanager
def _first_call_fails_before_later_ones_after(world: World) -> Iterator[None]:
    """The target's first answer is a 503 (nothing applied), every later one a 500
    after applying; its check can never tell. Each attempt ends ambiguous and parks:
    the first not applied, the second applied."""
    real_remote = network.remote
    calls: list[int] = []

    def remote(w: World, task: Task, r: Remote) -> None:
        if r.kind == "tool":
            calls.append(1)
            first = len(calls) == 1
            w.receivers.faults = TargetFaults(
                error_before=1.0 if first else 0.0,
                error_after=0.0 if first else 1.0,
                cannot_tell=1.0,
            )
        real_remote(w, task, r)

    with mock.patch.object(network, "remote", remote):
        yield


def _stale_resolution_run(mutation: str | None = None) -> RunResult:
    with applied(mutation):
        w = _one_job(mutation, workers=1, target="unkeyed")
        w.plan.wide = replace(w.plan.wide, features=w.plan.wide.features | {"operator_races"})
        with _operator_dies_after_its_first_send(w), _first_call_fails_before_later_ones_after(w):
            return w.run()


def test_a_resolve_run_again_after_the_job_went_ambiguous_again_settles_nothing() -> None:
    result = _stale_resolution_run()
    assert result.ok, result.violations[:1]
    failed = [d["error"] for _, d in _events(result, "flow_failed")]
    assert any("OperatorDied" in e for e in failed), "the operator no longer dies half way"
    assert any("changed meanwhile" in e for e in failed), "the command run again was not refused"
    ambiguous = [d["attempt"] for _, d in _events(result, "intent_ambiguous")]
    assert ambiguous == [1, 2]
    assert _events(result, "result_committed")


def test_a_decision_not_bound_to_its_attempt_is_caught() -> None:
    """``stale_resolution``: the command run again settles attempt 2's ambiguity (it
    applied) with the judgement of attempt 1 (it did not): a retry applies it again."""
    result = _stale_resolution_run("stale_resolution")
    assert result.violations and result.violations[0].name == I2


# ------------------------------------------------------------ late_outcome_dropped


@contextmanager
def _call_held_until(world: World, release: str) -> Iterator[list[Any]]:
    """The first owner's first call to the target leaves its process only when told
    (a process paused between its intent start and its send: the watchdog drops its
    lease, and the next owner takes over); every check's request is lost and times
    out, so the next owner cannot tell and parks the job ambiguous (soak seed
    1808311's order). The operator never dies, except where ``release`` says:

    - ``"judged"``: the operator's first command dies right after its read; the held
      call goes out as it dies. The command is run again later: the call applied
      between the operator's judgement ("not applied") and its write.
    - ``"resolved"``: the held call goes out right after the operator's resolve
      (``--retry``) applied, before the resumed attempt starts.

    Yields the list of released calls (one, once released)."""
    real_remote = network.remote
    held: list[Any] = []
    released: list[Any] = []

    def release_held() -> None:
        if held and not released:
            task, r = held[0]
            released.append(r)
            world.at(world.now + 0.001, lambda: real_remote(world, task, r))

    def remote(w: World, task: Task, r: Remote) -> None:
        if r.kind == "tool" and not held:
            held.append((task, r))
            return
        if r.kind == "check":
            p = Pending(task, task.actor.mono())
            lost = TimeoutError(f"{r.target} check: timeout after {r.timeout:g} s")
            w.at(
                w.now + r.timeout,
                lambda: network._deliver_remote(w, p, r, network._raised(lost, p.sent_mono)),
            )
            return
        real_remote(w, task, r)

    def answered(op: str) -> None:
        if release == "resolved" and op == "TransactWriteItems":
            release_held()

    def dies_after(first: bool, op: str) -> bool:
        if release == "judged" and first and op == "GetItem":
            release_held()
            return True
        return False

    mortal = _tapped_mortal(dies_after, answered)

    with ExitStack() as stack:
        stack.enter_context(mock.patch.object(network, "remote", remote))
        stack.enter_context(mock.patch.object(operators, "_mortal", mortal))
        yield released


def _late_answer_run(release: str, mutation: str | None = None) -> tuple[RunResult, list[Any]]:
    with applied(mutation):
        w = _one_job(mutation, workers=2, target="unkeyed")
        w.plan.wide = replace(w.plan.wide, features=w.plan.wide.features | {"operator_races"})
        with _call_held_until(w, release) as released:
            return w.run(), released


def test_a_late_answer_between_the_operators_judgement_and_its_write_confirms_the_intent() -> None:
    result, released = _late_answer_run("judged")
    assert result.ok, result.violations[:1]
    assert released, "the paused call never went out"
    assert [d["attempt"] for _, d in _events(result, "intent_ambiguous")] == [1]
    judged = [d["applied"] for _, d in _events(result, "operator_resolves")]
    assert judged and judged[0] is False, "the operator did not judge before the call"
    late = [d for _, d in _events(result, "intent_confirmed") if d.get("late")]
    assert [(d["late"], d["attempt"], d["token"]) for d in late] == [("ambiguous", 1, 1)]
    # The decision judged before the answer is not applied; the resolve run again
    # resumes the parked job, whose next attempt replays the outcome.
    assert not _events(result, "intent_resolved")
    assert [d["verdict"] for _, d in _events(result, "intent_resolution_finished")] == ["resumed"]
    assert [d["token"] for _, d in _events(result, "intent_replayed")] == [3]
    assert _events(result, "result_committed")


def test_a_late_answer_after_an_operators_retry_confirms_the_reopened_intent() -> None:
    result, released = _late_answer_run("resolved")
    assert result.ok, result.violations[:1]
    assert released, "the paused call never went out"
    assert [d["resolution"] for _, d in _events(result, "intent_resolved")] == ["retry"]
    late = [d for _, d in _events(result, "intent_confirmed") if d.get("late")]
    assert [(d["late"], d["attempt"]) for d in late] == [("prepared", 1)]
    # The resumed attempt's start finds the intent confirmed and replays it.
    assert not [d for _, d in _events(result, "intent_started") if d["attempt"] == 2]
    assert _events(result, "intent_replayed")
    assert _events(result, "result_committed")


def test_a_late_answer_kept_off_the_intent_is_caught() -> None:
    """``late_outcome_dropped``: the answer is dropped; the decision judged before
    it stands, and the retry applies the effect again."""
    for release in ("judged", "resolved"):
        result, _ = _late_answer_run(release, "late_outcome_dropped")
        assert result.violations and result.violations[0].name == I2, release


# ------------------------------------------------------ unstarted_released_at_once


LAMBDA_FIFO = frozenset({"lambda", "fifo"})
LAMBDA_SEED = 51  # functions alone on a FIFO queue: a 900 s function, stage budget 874 s
BACKLOG = 10
REDRIVE_AT = 8


@contextmanager
def _mapping_starts_late(world: World, at: float) -> Iterator[None]:
    """The event source starts polling at ``at``: the backlog is on the queue by then."""
    real_start = lambdas.start

    def start(w: World) -> None:
        w.at(at, lambda: real_start(w))

    with mock.patch.object(lambdas, "start", start):
        yield


def _backlog_run(mutation: str | None = None) -> RunResult:
    """Ten jobs of 100 s of work, each in a group of its own, all sent before the
    event source starts; three pollers, batches of ten (the batch-size warning's fix
    never comes), the redrive at the 8th receive. Each invocation runs its first
    record and hands the others back (under 874 s left after 100 s), so a record is
    received again and again behind the backlog until its turn."""
    with applied(mutation):
        w = World(LAMBDA_SEED, trace=True, features=LAMBDA_FIFO, mutation=mutation, jobs=BACKLOG)
        p = w.plan
        assert p.lambdas is not None and w.fifo is not None, "the seed no longer draws its world"
        p.fault_events = 0
        p.lambdas = replace(
            p.lambdas,
            pollers=3,
            batch_size=10,
            fix_after=1e9,
            reserved_id="",
            retries=False,
            starved=0.0,
        )
        p.job_plans = [
            replace(
                jp,
                steps=(Step("work", 100.0),),
                stages=(),
                job_class="sim",
                submit_at=1.0 + i * 0.01,
                p_transient=0.0,
                p_permanent=0.0,
                p_unknown=0.0,
            )
            for i, jp in enumerate(p.job_plans)
        ]
        w.job_plans = {jp.job_id: jp for jp in p.job_plans}
        p.fifo = w.fifo.plan = FifoPlan()  # no sessions: each job is its own group
        w.sqs.queues[w.queue_url].max_receive = REDRIVE_AT
        with _mapping_starts_late(w, 10.0):
            return w.run()


def test_records_not_started_behind_a_backlog_wait_out_their_invocation() -> None:
    result = _backlog_run()
    assert result.ok, result.violations[:1]
    skipped = Counter(d["job_id"] for _, d in _events(result, "lambda_record_not_started"))
    assert max(skipped.values()) >= 4, "the directed world no longer skips records"
    assert len(_events(result, "result_committed")) == BACKLOG


def test_records_released_at_once_are_caught() -> None:
    """``unstarted_released_at_once``: a record handed back at visibility 0 goes straight
    into the other pollers' batches of the same wave, behind records that run: more
    receives than the redrive allows, and the job is dead-lettered unstarted."""
    result = _backlog_run("unstarted_released_at_once")
    assert result.violations and result.violations[0].name == I23


# ------------------------------------------------------ lambda_parser_drops_timestamps


CAP_SEED = 47  # functions alone on a standard queue: a 900 s function, stage budget 868 s


@contextmanager
def _first_message_aged(world: World, cap_left: float) -> Iterator[None]:
    """The job's first message comes from a backlog: received 4 times before (by
    consumers that claimed nothing), its first receive ``cap_left`` seconds short of
    12 hours ago."""
    sqs = world.sqs
    q = sqs.queues[world.queue_url]
    real_send = sqs.send
    aged: list[str] = []

    def send(queue: Any, body: str, *args: Any, **kwargs: Any) -> Any:
        m = real_send(queue, body, *args, **kwargs)
        if queue is q and not aged:
            m.receive_count = 4
            m.first_received_at = world.now - (43_200.0 - cap_left)
            aged.append(m.message_id)
        return m

    with mock.patch.object(sqs, "send", send):
        yield


def _aged_message_run(mutation: str | None = None, *, cap_left: float) -> RunResult:
    """One job of 800 s (eight cooperative steps) for a function that fits it, its
    message hours old; the simulated SQS counts the 12-hour cap from the message's
    first receive (``cap_from_first_receive``)."""
    with applied(mutation):
        w = World(CAP_SEED, trace=True, features=frozenset({"lambda"}), mutation=mutation, jobs=1)
        p = w.plan
        assert p.lambdas is not None, "the seed no longer draws its world"
        p.lambdas = replace(
            p.lambdas, pollers=1, batch_size=1, reserved_id="", retries=False, starved=0.0
        )
        _directed(
            w, steps=tuple(Step("work", 100.0) for _ in range(8)), cooperative=True, job_class="sim"
        )
        w.sqs.cap_from_first_receive = True
        with _first_message_aged(w, cap_left):
            return w.run()


def test_a_record_whose_cap_is_nearly_spent_goes_on_under_a_new_message_unstarted() -> None:
    result = _aged_message_run(cap_left=400.0)
    assert result.ok, result.violations[:1]
    resent = [d for _, d in _events(result, "job_resent") if d["reason"] == "message_cap"]
    assert len(resent) == 1 and resent[0]["token"] == 1, resent
    assert not result.injected.get("cap_exceeded"), "a lease was asked past the cap"
    assert [d["token"] for _, d in _events(result, "result_committed")] == [2]


def test_a_take_past_the_cap_is_caught() -> None:
    """``take_past_cap``: the take asks a whole lease with 30 s of the cap left; SQS
    refuses it and the record comes back, unstarted, until the DLQ (I23)."""
    result = _aged_message_run("take_past_cap", cap_left=30.0)
    assert result.violations and result.violations[0].name == I23, result.violations[:1]
    assert _events(result, "lambda_record_not_taken")


def test_a_parser_without_sqs_timestamps_is_caught() -> None:
    """``lambda_parser_drops_timestamps``: without ``ApproximateFirstReceiveTimestamp``
    the attempt gets the class's whole budget, starts, and its heartbeat asks SQS for
    a visibility past the cap: refused (``InvalidParameterValue``), the lease dropped
    after 346 s of work thrown away. No invariant of the checker names that (the job
    goes on under a new message and ends): the test reads SQS's refusal."""
    result = _aged_message_run("lambda_parser_drops_timestamps", cap_left=400.0)
    assert result.injected.get("cap_exceeded", 0) >= 1
    unknown = [d for _, d in _events(result, "ownership_unknown")]
    assert any("InvalidParameterValue" in d["reason"] for d in unknown), unknown


def test_a_record_with_less_than_one_lease_of_its_cap_left_is_not_dead_lettered() -> None:
    """The record's take asks only what is left of the cap (30 s, less than a lease):
    SQS grants it, and the attempt sends the job on under a new message unstarted.
    Taking a whole lease, SQS refuses (the cap) and the record comes back until the
    DLQ (the fix of a strict xfail of this file). The function's wall clock is off by
    up to 5 minutes, so its estimate of what is left may be short (the take then asks
    1 s) and the claim's own move to a lease may be refused: harmless, the lease is
    the take's and the attempt only resends."""
    result = _aged_message_run(cap_left=30.0)
    assert result.ok, result.violations[:1]
    resent = [d for _, d in _events(result, "job_resent") if d["reason"] == "message_cap"]
    assert len(resent) == 1 and resent[0]["token"] == 1, resent
    assert not _events(result, "lambda_record_not_taken")
    assert [d["token"] for _, d in _events(result, "result_committed")] == [2]


# ---------------------------------------------------------- final_size_ignores_stages


STAGE_RESULT_BYTES = 140 * 1024


@contextmanager
def _stage_results_padded(nbytes: int) -> Iterator[None]:
    """Every stage's result (its checkpoint, and the last stage's the job's) pads to
    ``nbytes``: each fits the item limit alone, three together do not."""
    real = SimWorker._handler

    def handler(self: SimWorker, run: Any) -> Generator[Any, Any, Any]:
        out = yield from real(self, run)
        if isinstance(out, NextStage):
            return replace(out, result={**(out.result or {}), "blob": "x" * nbytes})
        return {**out, "blob": "x" * nbytes}

    with mock.patch.object(SimWorker, "_handler", handler):
        yield


def _staged_size_run(mutation: str | None = None) -> RunResult:
    """One job of three stages whose results are 140 KB each; the simulated DynamoDB
    refuses an item over 400 KB (``oversize``'s table)."""
    with applied(mutation):
        w = World(SEED, trace=True, features=frozenset(), mutation=mutation, workers=2, jobs=1)
        p = w.plan
        stages = tuple((name, (Step("work", 1.0),)) for name in ("fetch", "transform", "upload"))
        jp = _directed(w, steps=tuple(s for _, steps in stages for s in steps), stages=stages)
        w.checker.staged = {jp.job_id: jp.stage_names}
        p.sweep = SweepPlan()  # the staged world's sweep (a continuation's send)
        w.ddb.item_limit = True
        with _stage_results_padded(STAGE_RESULT_BYTES):
            return w.run()


def test_a_final_result_the_checkpoints_push_over_the_item_limit_fails_naming_it() -> None:
    result = _staged_size_run()
    assert result.ok, result.violations[:1]
    assert len(_events(result, "stage_committed")) == 2
    failed = [d for _, d in _events(result, "job_failed")]
    assert [d["error_code"] for d in failed] == ["result_too_large"], failed
    assert "stage log" in failed[0]["reason"]
    assert not _events(result, "job_write_refused")


def test_a_size_check_without_the_stages_is_caught() -> None:
    """``final_size_ignores_stages``: the commit's check counts the payload and the
    result only, so the final stage's result goes to DynamoDB, which refuses the item.
    The job still fails naming the limit (I14 holds); the test reads the refused write."""
    result = _staged_size_run("final_size_ignores_stages")
    refused = [d for _, d in _events(result, "job_write_refused")]
    assert refused and "ValidationException" in refused[0]["reason"], refused
    assert [d["error_code"] for _, d in _events(result, "job_failed")] == ["dynamodb_validation"]


# ---------------------------------------------------------------- retry_ignores_group


FIFO_SEED = 13  # the fifo world: a FIFO queue with sessions, three workers
SESSION = "session-0"


def _operator_command(world: World, at: float, name: str, command: Callable[[], Any]) -> None:
    """An operator runs ``command()``'s flow at ``at`` (built then, with its clock)."""

    def run() -> None:
        origin = Origin("operator", name, "operator")
        world.operator.spawn(name, drive_plain(world, world.operator, command(), origin))

    world.at(at, run)


def _cancelled_session_run(mutation: str | None = None) -> RunResult:
    """One job of a session fails for good; the session is cancelled (the job already
    failed: the cancel leaves its record alone); then an operator runs ``jobs
    retry`` on it, as for any failed job."""
    with applied(mutation):
        w = World(FIFO_SEED, trace=True, features=frozenset({"fifo"}), mutation=mutation, jobs=1)
        p = w.plan
        fifo = w.fifo
        assert fifo is not None, "the seed no longer draws its world"
        jp = _directed(w, steps=(Step("work", 1.0),), stages=(), p_permanent=1.0)
        w.checker.staged = {}
        p.fifo = fifo.plan = FifoPlan(sessions={jp.job_id: SESSION})
        _operator_command(
            w,
            30.0,
            f"cancel-{SESSION}",
            lambda: cancel_group_flow(
                w.jobs_req,
                fifo.groups,
                group=SESSION,
                reason="the user closed the session",
                wall_now=w.operator.wall(),
            ),
        )
        _operator_command(
            w,
            40.0,
            f"retry-{jp.job_id}",
            lambda: retry_failed_flow(
                w.jobs_req,
                queue_url=w.queue_url,
                job_id=jp.job_id,
                wall_now=w.operator.wall(),
                send_id=f"{jp.job_id}.retry1",
                groups=fifo.groups,
            ),
        )
        return w.run()


def _claims_after_cancel(result: RunResult) -> list[float]:
    cancelled = [t for t, _, k, _ in result.log if k == "group_cancelled"]
    assert cancelled, "the directed world no longer cancels its session"
    return [t for t, _, k, _ in result.log if k == "job_claimed" and t > cancelled[0]]


def test_a_retry_of_a_failed_job_of_a_cancelled_session_is_refused() -> None:
    result = _cancelled_session_run()
    assert result.ok, result.violations[:1]
    assert [d["error_code"] for _, d in _events(result, "job_failed")] == ["sim_permanent"]
    failed = [d["error"] for _, d in _events(result, "flow_failed")]
    assert any("RetryRefused" in e for e in failed), failed
    assert not _claims_after_cancel(result)


def test_a_retry_reading_the_job_alone_is_caught() -> None:
    """``retry_ignores_group``: the retry reads the job's record only (failed, not
    cancelled) and runs the cancelled session's job again. No invariant of the
    checker names a cancelled session; the test reads the claim after the cancel."""
    result = _cancelled_session_run("retry_ignores_group")
    assert _claims_after_cancel(result)


# ----------------------------------------------------------------- late_never_charged


@contextmanager
def _handler_holds_the_gil() -> Iterator[None]:
    """Every attempt's handler stops its whole worker for three leases as it starts (a
    long C call holding the GIL: the heartbeat thread stops with it)."""
    real = SimWorker._handler

    def handler(self: SimWorker, run: Any) -> Generator[Any, Any, Any]:
        self.paused_until = max(self.paused_until, self.world.now + 3 * self.world.plan.lease)
        self.world.record(self.id, "sim_holds_the_gil", {})
        return (yield from real(self, run))

    with mock.patch.object(SimWorker, "_handler", handler):
        yield


def _gil_run(mutation: str | None = None) -> RunResult:
    """One worker, one job whose handler makes its worker late on every attempt; the
    narrow world (no sweep: a job whose message SQS moved to the DLQ stays unfinished)."""
    with applied(mutation):
        w = _one_job(mutation, workers=1, target="keyed")
        jp = replace(w.job_plans["job-000"], steps=(Step("work", 1.0),))
        w.plan.job_plans = [jp]
        w.job_plans = {jp.job_id: jp}
        with _handler_holds_the_gil():
            return w.run()


def test_a_handler_that_makes_its_worker_late_every_time_ends_by_its_attempts() -> None:
    result = _gil_run()
    assert result.ok, result.violations[:1]
    late = _events(result, "lease_dropped_late")
    assert [d["charged"] for _, d in late[:3]] == [False, False, True], late[:3]
    assert _events(result, "worker_late_charged")
    failed = [d["error_code"] for _, d in _events(result, "job_failed")]
    assert failed == ["attempts_exhausted"], failed


def test_late_hand_backs_never_charged_are_caught() -> None:
    """``late_never_charged``: every late hand-back gives the attempt back, so the job
    is received until SQS moves its message to the DLQ (I4: unfinished, here where no
    sweep parks it; a sweeping world parks it ``dead_lettered``, never by its
    attempts)."""
    result = _gil_run("late_never_charged")
    assert result.violations and result.violations[0].name == I4
    assert "dlq" in result.violations[0].message
