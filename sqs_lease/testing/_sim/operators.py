"""operator_races: the operator who follows the runbook while the workers run.

A job that parks gets the operator's decision a little later: an ambiguous intent
is resolved as the target's truth says, a job parked for another reason resumed.
The operator's process may die half way through a command, and runs it again.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from ..._core import resolving as core_resolving
from ..._core import resuming as core_resuming
from ..._core.calls import Call
from ..._core.intents import IntentState
from ..._core.resolving import Resolution
from ..._errors import IntentError
from .invariants import Origin
from .resources import INTENTS, JOBS
from .tasks import drive_plain

if TYPE_CHECKING:
    from .world import World

OPERATOR_DIES = 0.2
"""operator_races: the chance that an operator's command dies right after one of its
calls applied (before it sees the answer)."""


class OperatorDied(Exception):
    """The operator's process died half way through a command (operator_races)."""


def _mortal(flow: Any, dies: Callable[[], bool], failed: list[BaseException]) -> Any:
    """Pass a flow's instructions through; after a call applied, maybe die there.
    ``failed`` gets what ended it early (its death, or the flow's own error)."""
    try:
        instr = next(flow)
        while True:
            out = yield instr
            if isinstance(instr, Call) and dies():
                flow.close()
                raise OperatorDied(f"the operator died after its {instr.op}")
            try:
                instr = flow.send(out)
            except StopIteration as stop:
                return stop.value
    except Exception as exc:
        failed.append(exc)
        raise


class Runbook:
    """The operator's decisions on parked jobs (at most two per job)."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.decisions: dict[str, int] = {}  # decisions per job

    def job_written(self, old: Mapping[str, Any] | None, new: Mapping[str, Any] | None) -> None:
        """operator_races: a job that parks gets an operator's decision a little later
        (at most two per job), while the workers go on with the others."""
        if new is None or new.get("state", {}).get("S") != "parked":
            return  # (a worker's liveness record carries no state)
        if old is not None and old.get("state", {}).get("S") == "parked":
            return
        job_id = str(new["job_id"]["S"])
        n = self.decisions.get(job_id, 0)
        if n >= 2:
            return
        self.decisions[job_id] = n + 1
        delay = self.world.chaos.wide14.uniform(0.5, 20.0)
        self.world.at(self.world.now + delay, lambda: self.decide(job_id, n + 1))

    def run(self, origin: Origin, command: Callable[[str], Any], send_id: str) -> None:
        """Run an operator's command; the process may die after any of its calls
        applied (up to 3 times per command), and the operator runs the same command
        again a little later, as the runbook says (a fresh send id each time)."""
        tries = [0]

        def run(sid: str) -> None:
            failed: list[BaseException] = []

            def dies() -> bool:
                if tries[0] >= 3 or self.world.chaos.operator.random() >= OPERATOR_DIES:
                    return False
                self.world.chaos.count("operator_died")
                return True

            def again() -> None:
                # Run it again if it died or got no answer (its message says to);
                # not when it was told there is nothing (more) to do.
                if not failed or isinstance(failed[0], IntentError) or tries[0] >= 8:
                    return
                tries[0] += 1
                delay = self.world.chaos.operator.uniform(2.0, 60.0)
                self.world.at(self.world.now + delay, lambda: run(f"{send_id}r{tries[0]}"))

            task = f"{origin.task}-{tries[0]}"
            flow = _mortal(command(sid), dies, failed)
            who = Origin("operator", task, "operator")
            self.world.operator.spawn(
                task, drive_plain(self.world, self.world.operator, flow, who, again)
            )

        run(send_id)

    def decide(self, job_id: str, n: int, waited: int = 0) -> None:
        """Resolve the job's ambiguous intent as the target's truth says (confirmed with
        its id, or retry), or resume the job when it parked for another reason."""
        record = self.world.ddb.get(JOBS, {"job_id": {"S": job_id}})
        if record is None or record["state"]["S"] != "parked":
            return
        ambiguous = [
            v
            for v in (
                self.world.intents_req.parse(i) for i in self.world.ddb.items[INTENTS].values()
            )
            if v.job_id == job_id and v.state is IntentState.AMBIGUOUS
        ]
        send_id = f"{job_id}.op{n}"
        origin = Origin("operator", f"decide-{job_id}-{n}", "operator")
        if ambiguous:
            intent = min(ambiguous, key=lambda v: v.key)
            applied = None
            in_flight = False
            for target in self.world.receivers.targets.values():
                applied = applied or target.applied.get(intent.key)
                in_flight = in_flight or bool(target.pending.get(intent.key))
            if applied is None and in_flight:
                # An operator who cannot tell yet asks the provider again later.
                if waited < 20:
                    self.world.at(self.world.now + 5.0, lambda: self.decide(job_id, n, waited + 1))
                return
            self.world.record(
                "operator",
                "operator_resolves",
                {"job_id": job_id, "key": intent.key, "applied": applied is not None},
            )
            key = intent.key
            judged = intent.attempts  # the ambiguity this decision is about
            resolution = Resolution.CONFIRMED if applied is not None else Resolution.RETRY
            external_id = applied.external_id if applied is not None else None

            def command(sid: str) -> Any:
                # Looked up at each run: a mutation patches the core's flow.
                return core_resolving.resolve_flow(
                    self.world.intents_req,
                    self.world.jobs_req,
                    queue_url=self.world.queue_url,
                    key=key,
                    resolution=resolution,
                    external_id=external_id,
                    who="operator (simulated)",
                    why="checked with the provider",
                    wall_now=self.world.operator.wall(),
                    send_id=sid,
                    # As the runbook says: a command run again names the attempt.
                    attempt=judged,
                )

        else:
            self.world.record("operator", "operator_resumes", {"job_id": job_id})

            def command(sid: str) -> Any:
                return core_resuming.resume_flow(
                    self.world.jobs_req,
                    queue_url=self.world.queue_url,
                    job_id=job_id,
                    wall_now=self.world.operator.wall(),
                    send_id=sid,
                )

        self.run(origin, command, send_id)
