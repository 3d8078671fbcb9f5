"""The planner/executor split: a plan of tool steps, checked against an allow-list,
run as a staged job (one stage per step).

A model (the planner) may propose *which* tools to call and with *what* arguments;
it never chooses timeouts, leases, retries or idempotency keys. Those belong to
each tool's class, declared in code::

    research = app.planned("research", lease_seconds=60)

    @research.tool("search", args=SearchArgs, effect_timeout_seconds=20)
    def search(ctx, args: SearchArgs):
        return {"hits": find(args.query)}

    @research.tool("send_mail", args=MailArgs, max_attempts=3)
    def send_mail(ctx, args: MailArgs):
        return ctx.effect("send", "mail", args, deliver)  # key built in code

    steps = model_output["steps"]  # [{"tool": "search", "args": {...}}, ...]
    research.accept(steps)         # PlanRefused names the step and the field
    Producer(settings, app).submit("research", {"steps": steps})

A plan is refused before anything runs when a step names a tool not on the
allow-list, carries a field other than ``tool`` and ``args``, or tries to set a
timeout, a lease, a retry policy or a key (in the step or in its ``args``).
Each accepted step becomes a stage named ``N-tool`` with that tool's class; its
effects are keyed by job id + stage (+ action + target), never by the plan. The
plan is the job's payload: stored with the job (immutable, hashed) and shown by
``sqs-lease jobs show ID --payload``. Each step's result is its stage's
checkpoint (``ctx.results``); the job's result lists every step's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Unpack

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from ._core.inputs import loads as _loads
from ._core.stages import NextStage
from ._errors import ConfigError, PayloadError, PermanentError

if TYPE_CHECKING:
    from ._jobs import App, Handler, JobClass, JobPolicy, Registered

MAX_STEPS = 50
"""Steps one plan may have: each is a stage (about five requests and its own message)."""

FORBIDDEN_FIELDS = frozenset(
    {
        "timeout",
        "timeout_seconds",
        "effect_timeout_seconds",
        "progress_timeout_seconds",
        "stage_budget_seconds",
        "budget",
        "lease",
        "lease_seconds",
        "heartbeat",
        "heartbeat_seconds",
        "jitter_seconds",
        "missed_heartbeats",
        "retries",
        "max_attempts",
        "backoff_base_seconds",
        "backoff_max_seconds",
        "key",
        "idempotency_key",
        "intent_key",
        "token",
        "fence",
        "job_id",
        "stage",
    }
)
"""Fields a plan may never set, in a step or in its arguments: time, ownership and keys
are the code's (each tool's class), not the planner's."""

STEP_FIELDS = ("tool", "args")


class PlanRefused(PayloadError):
    """A plan was refused before anything ran; the message names the step and the field."""

    def __init__(self, message: str, step: int, field: str) -> None:
        super().__init__(message)
        self.step = step
        self.field = field


def _step_name(n: int, tool: str) -> str:
    return f"{n}-{tool}"


def _parse_step_name(stage: str) -> tuple[int, str] | None:
    number, sep, tool = stage.partition("-")
    if not sep or not number.isdigit() or not tool:
        return None
    return int(number), tool


class Tool:
    """One tool on a planned job's allow-list: its argument model, class and function.

    ``first_class`` is the same class for a plan's first step, whose input is the
    stored plan itself (its first step's arguments are read out of it)."""

    def __init__(
        self, name: str, args: type[BaseModel], job_class: JobClass, first_class: JobClass, fn: Any
    ):
        self.name = name
        self.args = args
        self.job_class = job_class
        self.first_class = first_class
        self.fn = fn


def _first_step_model(args: type[BaseModel]) -> type[BaseModel]:
    class FirstStep(args):  # type: ignore[valid-type,misc]
        @model_validator(mode="before")
        @classmethod
        def _from_plan(cls, data: Any) -> Any:
            if isinstance(data, Mapping) and isinstance(data.get("steps"), list):
                return data["steps"][0].get("args", {})
            return data

    FirstStep.__name__ = args.__name__
    return FirstStep


class PlannedJob:
    """A job whose stages come from a plan (``app.planned``); see the module doc."""

    def __init__(self, app: App, name: str, policy: Mapping[str, Any]) -> None:
        from ._jobs import job_class_of

        self.app = app
        self.name = name
        self.policy = dict(policy)
        self.tools: dict[str, Tool] = {}
        self.plan_model = _plan_model(self)
        self.job_class = job_class_of(name, self.plan_model, self.policy)

    def tool(
        self, name: str, *, args: type[BaseModel], **policy: Unpack[JobPolicy]
    ) -> Callable[[Any], Any]:
        """Decorator: put a tool on the allow-list, with its argument model and its own
        class (the job's defaults overridden: lease, timeouts, attempts, budget)."""
        from ._core.stages import valid_stage_name
        from ._jobs import job_class_of

        if not valid_stage_name(name) or "-" in name:
            raise ConfigError(
                f"planned job {self.name!r}: tool name {name!r}: use letters, digits, _ . : "
                "(no '-': it separates the step number in the stage name)"
            )
        if name in self.tools:
            raise ConfigError(f"planned job {self.name!r}: tool {name!r} is declared twice")
        merged = {**self.policy, **policy}
        job_class = job_class_of(self.name, args, merged)
        first = job_class_of(self.name, _first_step_model(args), merged)

        def deco(fn: Any) -> Any:
            self.tools[name] = Tool(name, args, job_class, first, fn)
            self.app._put_planned(self)
            return fn

        return deco

    # ------------------------------------------------------------------ the plan

    def accept(self, steps: Sequence[Any]) -> list[dict[str, Any]]:
        """The plan as it will be stored, or :class:`PlanRefused` naming the step and field."""
        if not isinstance(steps, Sequence) or isinstance(steps, (str, bytes)):
            raise PlanRefused("a plan is a list of steps", 0, "steps")
        if not 1 <= len(steps) <= MAX_STEPS:
            raise PlanRefused(
                f"a plan has 1 to {MAX_STEPS} steps, this one {len(steps)}", 0, "steps"
            )
        return [self._step(n, step) for n, step in enumerate(steps, start=1)]

    def _step(self, n: int, step: Any) -> dict[str, Any]:
        if not isinstance(step, Mapping):
            raise PlanRefused(f"step {n}: a step is an object with tool and args", n, "step")
        for field in step:
            if field in FORBIDDEN_FIELDS:
                raise PlanRefused(_forbidden(n, str(field)), n, str(field))
            if field not in STEP_FIELDS:
                raise PlanRefused(
                    f"step {n}: field {field!r} is not part of a step (only tool and args)",
                    n,
                    str(field),
                )
        tool_name = step.get("tool")
        tool = self.tools.get(tool_name) if isinstance(tool_name, str) else None
        if tool is None:
            allowed = ", ".join(sorted(self.tools)) or "none"
            raise PlanRefused(
                f"step {n}: tool {tool_name!r} is not on the allow-list of {self.name!r} "
                f"(allowed: {allowed})",
                n,
                "tool",
            )
        args = step.get("args", {})
        if not isinstance(args, Mapping):
            raise PlanRefused(f"step {n} ({tool.name}): args must be an object", n, "args")
        for field in args:
            if field in FORBIDDEN_FIELDS:
                raise PlanRefused(_forbidden(n, f"args.{field}", tool.name), n, f"args.{field}")
        try:
            model = tool.args.model_validate(dict(args))
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "<args>"
            raise PlanRefused(
                f"step {n} ({tool.name}): field 'args.{where}': {first['msg']}",
                n,
                f"args.{where}",
            ) from None
        return {"tool": tool.name, "args": model.model_dump(mode="json")}

    # ------------------------------------------------------------------ running it

    def first_stage(self, payload_json: str) -> str:
        """The stage a stored plan starts at."""
        steps = _loads(payload_json)["steps"]
        return _step_name(1, steps[0]["tool"])

    def stage_count(self, payload_json: str) -> int:
        """How many stages (messages) a stored plan takes: one per step."""
        return len(_loads(payload_json)["steps"])

    def stage(self, stage: str) -> Registered | None:
        """The class and handler of stage ``N-tool`` (None: no such tool)."""
        from ._jobs import Registered

        parsed = _parse_step_name(stage)
        tool = self.tools.get(parsed[1]) if parsed else None
        if parsed is None or tool is None:
            return None
        n = parsed[0]
        return Registered(
            tool.first_class if n == 1 else tool.job_class,
            _step_handler(tool, n),
            limit_unit=tool.name,  # a tool's limit is the tool's, whatever the step
        )

    def registered(self) -> Registered:
        """How the app registers the job: the plan's class; each step resolves by stage."""
        from ._jobs import Registered

        return Registered(self.job_class, _unstaged, planned=self)


def _forbidden(n: int, field: str, tool: str | None = None) -> str:
    where = f"step {n}" if tool is None else f"step {n} ({tool})"
    return (
        f"{where}: field {field!r} may not be set by a plan: timeouts, leases, retries and "
        "keys come from the tool's class, in code"
    )


def _plan_model(job: PlannedJob) -> type[BaseModel]:
    class Plan(BaseModel):
        """A plan as stored: its steps, each a tool on the allow-list and its arguments."""

        model_config = ConfigDict(extra="forbid")
        steps: list[dict[str, Any]] = Field(min_length=1, max_length=MAX_STEPS)

        @model_validator(mode="after")
        def _allowed(self) -> Plan:
            self.steps = job.accept(self.steps)
            return self

    Plan.__name__ = f"Plan[{job.name}]"
    return Plan


def _unstaged(ctx: Any, plan: Any) -> Any:
    # A planned job's record always names its stage when submitted with the app; one
    # submitted without it cannot tell its first step's class.
    raise PermanentError(
        f"planned job {ctx.job_id!r} was submitted without its stage: submit it with "
        "Producer(settings, app) (or `sqs-lease submit CLASS --app MODULE:OBJECT`)",
        code="plan_without_stage",
    )


def _step_handler(tool: Tool, n: int) -> Handler:
    # An async tool's step is itself async (awaited by the async worker); a plain
    # tool's is plain: decided for this tool's callable, never for the plan's class.
    from ._jobs import is_async_callable

    if is_async_callable(tool.fn):

        async def run_async_step(ctx: Any, args: Any) -> Any:
            return _step_end(ctx, n, await tool.fn(ctx, args))

        return run_async_step

    def run_step(ctx: Any, args: Any) -> Any:
        return _step_end(ctx, n, tool.fn(ctx, args))

    return run_step


def _step_end(ctx: Any, n: int, result: Any) -> Any:
    """What step ``n`` returns: the next step's stage, or (the last step) every result."""
    if isinstance(result, BaseModel):
        result = result.model_dump(mode="json")
    steps = _loads(ctx.job_payload_json)["steps"]
    if n < len(steps):
        nxt = steps[n]
        return NextStage(_step_name(n + 1, nxt["tool"]), nxt["args"], result=result)
    results = [ctx.results.get(_step_name(i, s["tool"])) for i, s in enumerate(steps, 1)]
    results[-1] = result
    return {"steps": len(steps), "results": results}


__all__ = ["FORBIDDEN_FIELDS", "MAX_STEPS", "PlanRefused", "PlannedJob", "Tool"]
