"""Job classes, the app that registers handlers, and the context a handler gets."""

from __future__ import annotations

import difflib
import hashlib
import inspect
import json
import threading
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Generic, TypedDict, TypeVar, Unpack

from pydantic import BaseModel, ConfigDict, Field, RootModel, ValidationError, model_validator

from ._core.inputs import NAME_PATTERN, payload_text
from ._core.intents import (
    RESPONSE_LIMIT,
    SUCCESS_MEANINGS,
    CheckAnswer,
    EffectResult,
    EffectSpec,
    IntentView,
    SuccessMeaning,
)
from ._core.intents import default_key as _default_key
from ._core.lease import LocalLease
from ._core.limits import check_intent, progress_text
from ._core.records import DEFAULT_STAGE
from ._core.slots import MAX_LIMIT, check_limit
from ._core.stages import STAGE_NAME, valid_stage_name
from ._core.texts import visible
from ._core.timing import EFFECT_MARGIN, check_timing
from ._errors import (
    ConfigError,
    FenceError,
    JobClassError,
    LeaseError,
    PayloadError,
    PermanentError,
    ToolNotApplied,
)
from ._fence import check_key_text, fence_headers
from ._journal import Journal

if TYPE_CHECKING:
    import asyncio

    from .plans import PlannedJob

P = TypeVar("P", bound=BaseModel)


class JobClass(BaseModel):
    """Timing and retry policy of one kind of job; the payload never sets any of it.

    Three timeouts, each for its own failure:

    - ``effect_timeout_seconds``: one effect call (``ctx.effect``). It is handed
      to the call (``EffectCall.timeout``; ``effects.http_json`` uses it as its
      socket timeout), and the watchdog stops an attempt whose call runs
      ``EFFECT_MARGIN`` seconds past it: that call's outcome is unknown, and the
      next attempt reconciles its intent with the target.
    - ``progress_timeout_seconds``: the longest the handler may go without
      calling ``ctx.progress()`` (None: no such limit). Each call resets it; an
      effect call in flight is governed by its own timeout instead, and its end
      counts as progress.
    - ``stage_budget_seconds``: the whole attempt, from the message's receive;
      progress does not extend it. It stays under SQS's 12-hour cap less 15 min.

    Rules (checked at definition, a ``JobClassError`` names the numbers and the
    fix): ``lease > missed x heartbeat + jitter``, ``heartbeat <= lease / 2``,
    ``lease - heartbeat > heartbeat + jitter`` (each beat extends with more than
    one heartbeat interval plus the jitter budget left),
    ``lease <= 43200``, ``lease <= stage budget <= 12 h - 15 min``,
    ``0 < effect timeout``, ``effect timeout + EFFECT_MARGIN <= stage budget``,
    ``0 < progress timeout <= stage budget``; every number finite.

    ``model`` and ``provider`` name the model and its provider where the handler
    calls one (an LLM tool call): metrics carry them as dimensions beside the job
    class (see docs/operations.md, "Metrics"). They are labels, never payload.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)

    name: str = Field(pattern=NAME_PATTERN)
    payload_model: type[BaseModel]
    lease_seconds: int = 30
    heartbeat_seconds: float = 5.0
    jitter_seconds: float = 2.0
    missed_heartbeats: int = 3
    effect_timeout_seconds: float = 60.0
    progress_timeout_seconds: float | None = None
    max_attempts: int = Field(default=5, ge=1, le=1000)
    backoff_base_seconds: float = Field(default=2.0, ge=0)
    backoff_max_seconds: float = Field(default=300.0, ge=0, le=43_200)
    stage_budget_seconds: float = 3600.0
    keep_rejected_results: bool = False  # also keep a rejected result's content (bounded)
    # Fleet-wide: at most this many jobs of the class run at once, across every worker
    # and process (slots in PREFIX-slots; None: no limit). See docs/operations.md.
    concurrency_limit: int | None = Field(default=None, ge=1, le=MAX_LIMIT)
    # CloudWatch dimension values: printable ASCII, bounded; no payload belongs here.
    model: str | None = Field(default=None, pattern=r"^[ -~]{1,200}$")
    provider: str | None = Field(default=None, pattern=r"^[ -~]{1,200}$")

    @model_validator(mode="before")
    @classmethod
    def _removed_fields(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and "tool_timeout_seconds" in data:
            name = data.get("name", "?")
            raise JobClassError(
                f"job class {name!r}: tool_timeout_seconds="
                f"{data['tool_timeout_seconds']!r} is gone: it limited the whole attempt, and "
                "progress did not reset it. Say which limit you mean: effect_timeout_seconds "
                "(one effect call), progress_timeout_seconds (no ctx.progress() for that "
                "long) or stage_budget_seconds (the whole attempt)"
            )
        return data

    @model_validator(mode="after")
    def _timing(self) -> JobClass:
        check_timing(
            self.name,
            self.lease_seconds,
            self.heartbeat_seconds,
            self.jitter_seconds,
            self.missed_heartbeats,
            self.stage_budget_seconds,
            effect_timeout=self.effect_timeout_seconds,
            progress_timeout=self.progress_timeout_seconds,
        )
        return self

    def validate_payload(self, data: Any) -> BaseModel:
        """Validate raw payload data; raise PayloadError naming the field and the problem."""
        try:
            if isinstance(data, (str, bytes)):
                return self.payload_model.model_validate_json(data)
            return self.payload_model.model_validate(data)
        except ValidationError as exc:
            first = exc.errors()[0]
            field = ".".join(str(p) for p in first["loc"]) or "<payload>"
            raise PayloadError(
                f"job class {self.name!r}: payload field {field!r}: {first['msg']} "
                f"({exc.error_count()} error(s)); fix the payload to match "
                f"{self.payload_model.__name__}"
            ) from None


class JobPolicy(TypedDict, total=False):
    """The keyword arguments of ``App.job`` / ``staged`` / ``stage`` / ``planned`` / a
    plan's ``tool``: a :class:`JobClass`'s fields but its name and payload model (a test
    holds the two together). Typed so that an editor and mypy catch a misspelt one;
    at run time :func:`job_class_of` names it and the nearest valid one."""

    lease_seconds: int
    heartbeat_seconds: float
    jitter_seconds: float
    missed_heartbeats: int
    effect_timeout_seconds: float
    progress_timeout_seconds: float | None
    max_attempts: int
    backoff_base_seconds: float
    backoff_max_seconds: float
    stage_budget_seconds: float
    keep_rejected_results: bool
    concurrency_limit: int | None
    model: str | None
    provider: str | None


def job_class_of(name: str, payload_model: type[BaseModel], policy: Mapping[str, Any]) -> JobClass:
    """The one way a job class is built from a declaration's keywords: an unknown
    keyword, or a value of the wrong kind, is a :class:`JobClassError` naming the
    class, the keyword and the fix (never pydantic's raw report)."""
    fields = [f for f in JobClass.model_fields if f not in ("name", "payload_model")]
    for key in policy:
        if key in fields or key == "tool_timeout_seconds":  # the gone one names its heirs
            continue
        near = difflib.get_close_matches(key, fields, n=1, cutoff=0.6)
        hint = f"did you mean {near[0]}=?" if near else f"the keywords are: {', '.join(fields)}"
        raise JobClassError(f"job class {name!r}: no keyword {key}=: {hint}")
    try:
        return JobClass(name=name, payload_model=payload_model, **policy)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'value'}={e.get('input')!r}: {e['msg']}"
            for e in exc.errors()
        )
        raise JobClassError(f"job class {name!r}: {problems}") from None


def _policy_fields() -> list[str]:
    """The keywords of a declaration's policy (:class:`JobPolicy`)."""
    return [f for f in JobClass.model_fields if f not in ("name", "payload_model")]


def _nearest(word: str, choices: list[str]) -> str:
    near = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    if near:
        return f"did you mean {near[0]!r}?"
    return f"it has: {', '.join(choices) or 'none'}"


def _refuse_unknown(
    where: str,
    given: Mapping[str, Any],
    keywords: list[str],
    error: type[ConfigError] = JobClassError,
) -> None:
    """A keyword not in ``keywords``: ``error`` naming it and the nearest valid one (as
    :func:`job_class_of` names one)."""
    for key in given:
        if key not in keywords:
            near = difflib.get_close_matches(key, keywords, n=1, cutoff=0.6)
            hint = (
                f"did you mean {near[0]}=?" if near else f"the keywords are: {', '.join(keywords)}"
            )
            raise error(f"{where}: no keyword {key}=: {hint}")


def _rebuilt(
    job_class: JobClass, *layers: Mapping[str, Any], payload: type[BaseModel] | None = None
) -> JobClass:
    """The class as declared, with ``layers`` over it (later wins), checked as a
    declaration is (:func:`job_class_of`)."""
    policy: dict[str, Any] = job_class.model_dump(include=set(_policy_fields()))
    for layer in layers:
        policy.update(layer)
    return job_class_of(job_class.name, payload or job_class.payload_model, policy)


def _planned_with(
    job: PlannedJob, app: App, layers: list[Mapping[str, Any]], per: Mapping[str, Any]
) -> PlannedJob:
    """A copy of a planned job for ``app`` whose every tool's class has ``layers`` over it
    (then ``per["job/tool"]``); its plan model checks plans against its own tools."""
    from copy import copy

    from .plans import Tool, _plan_model

    new = copy(job)
    new.app = app
    new.policy = {**job.policy}
    for layer in layers:
        new.policy.update(layer)
    new.tools = {}
    for name, tool in job.tools.items():
        own = per.get(f"{job.name}/{name}", {})
        new.tools[name] = Tool(
            name,
            tool.args,
            _rebuilt(tool.job_class, *layers, own),
            _rebuilt(tool.first_class, *layers, own),
            tool.fn,
        )
    new.plan_model = _plan_model(new)
    new.job_class = _rebuilt(job.job_class, *layers, payload=new.plan_model)
    return new


def canonical_json(data: Any) -> str:
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def payload_hash(payload_json: str) -> str:
    return hashlib.sha256(payload_json.encode()).hexdigest()


Handler = Callable[[Any, Any], Any]
"""``handler(ctx, payload)``: a plain function gets a :class:`JobContext`; an
``async def`` gets an :class:`AsyncJobContext` (and needs the async worker)."""

H = TypeVar("H", bound=Handler)


def is_async_callable(fn: Any) -> bool:
    """Whether calling ``fn`` gives a coroutine to await (an ``async def``, or an object
    whose ``__call__`` is one). Decided for each callable (a handler, a stage, a planned
    tool), never for its job class: a class may mix async and plain stages."""
    return inspect.iscoroutinefunction(fn) or (
        callable(fn) and inspect.iscoroutinefunction(type(fn).__call__)
    )


@dataclass(frozen=True)
class Registered:
    """A job class and its handler; for a staged job, also its stages (first first)."""

    job_class: JobClass
    handler: Handler
    stages: Mapping[str, Registered] | None = None
    first_stage: str | None = None
    planned: PlannedJob | None = None  # a job whose stages come from its plan
    # What a stage's own concurrency_limit belongs to (its pool, ``own_pool``): the
    # stage of a staged job, the tool of a planned job (every step calling it).
    limit_unit: str | None = None

    @property
    def is_async(self) -> bool:
        """Whether this handler is awaited (the async worker) or called (any worker)."""
        return is_async_callable(self.handler)


class StageInput(RootModel[Any]):
    """The input model of a stage that declares none: any JSON (the handler gets it plain)."""


def _unwrapped(fn: Handler) -> Handler:
    # A stage without an input model gets its input as plain JSON data.
    if is_async_callable(fn):

        async def unwrap_async(ctx: Any, p: Any) -> Any:
            return await fn(ctx, p.root if isinstance(p, StageInput) else p)

        return unwrap_async

    def unwrap(ctx: Any, p: Any) -> Any:
        return fn(ctx, p.root if isinstance(p, StageInput) else p)

    return unwrap


class StagedJob:
    """A job of named stages (``app.staged``); each stage is declared with :meth:`stage`.

    Each stage has its own job class (lease, heartbeat, timeouts, attempts,
    budget: the job's defaults overridden per stage), its own handler, its own
    idempotency keys (job id + stage) and its own checkpoint. The first stage
    declared is the first to run; its input is the job's payload. A handler ends
    its stage by returning :class:`~sqs_lease.NextStage` (the next stage's name
    and input) or a final result (the job succeeds with it)::

        report = app.staged("report", payload=Report, lease_seconds=60)

        @report.stage("fetch")
        def fetch(ctx, p: Report):
            key = store(rows_for(p))
            return NextStage("render", {"rows_key": key})

        @report.stage("render", payload=Rows, stage_budget_seconds=1800)
        def render(ctx, p: Rows):
            ctx.results["fetch"]  # what fetch left: {"rows_key": ...}
            return {"url": publish(p.rows_key)}

    All stages share one job record and one fencing token (it keeps rising
    across stages), so a fenced receiver's scope is the job for all of them.
    """

    def __init__(self, app: App, name: str, payload: type[BaseModel], policy: Mapping[str, Any]):
        self.app = app
        self.name = name
        self.payload_model = payload
        self.policy = dict(policy)
        self.stages: dict[str, Registered] = {}
        job_class_of(name, payload, self.policy)  # refuse bad defaults now

    def stage(
        self,
        name: str,
        *,
        payload: type[BaseModel] | None = None,
        **policy: Unpack[JobPolicy],
    ) -> Callable[[H], H]:
        """Decorator: declare the next stage, with its input model and its own policy.

        The first stage's input is the job's payload (``payload`` must be left out);
        a later stage's input is what ``NextStage`` gave it, validated by
        ``payload`` (None: any JSON, handed over plain).
        """
        if not valid_stage_name(name):
            raise ConfigError(
                f"staged job {self.name!r}: stage name {name!r}: a stage name is {STAGE_NAME}"
            )
        if name in self.stages:
            raise ConfigError(f"staged job {self.name!r}: stage {name!r} is declared twice")
        first = not self.stages
        if first and payload is not None:
            raise ConfigError(
                f"staged job {self.name!r}: the first stage {name!r} gets the job's payload "
                f"({self.payload_model.__name__}); leave payload= out"
            )
        model = self.payload_model if first else (payload or StageInput)
        job_class = job_class_of(self.name, model, {**self.policy, **policy})

        def deco(fn: H) -> H:
            handler = fn if payload is not None or first else _unwrapped(fn)
            self.stages[name] = Registered(job_class, handler, limit_unit=name)
            self.app._put_staged(self)
            return fn

        return deco

    def registered(self) -> Registered:
        """The job as the app registers it: the first stage's class and handler, with
        every stage."""
        first = next(iter(self.stages))
        head = self.stages[first]
        return Registered(head.job_class, head.handler, dict(self.stages), first)


@dataclass(frozen=True)
class Target:
    """An outside system that effects are applied to.

    ``check`` answers, for an intent whose outcome is unknown, whether the call
    applied (by key, source id or business id). ``key_retention_seconds`` is how
    long the target keeps idempotency keys (Stripe: at least 24 h; None: it does
    not honour them). Inside it, after the check said "not applied", the worker
    repeats the call with the same key; past it (or with None) a repeat is not
    protected by the target, so the job parks and an operator decides. ``success`` says what the
    target's success means: ``accepted`` (queued on its side), ``completed``
    (applied) or ``delivered`` (reached its final recipient). It is stored on the
    intent and every attempt (``intents show``), and the check gets it as
    ``IntentView.success``: a check of an ``accepted`` target answers whether the
    target accepted the key, not whether the work is done (docs/protocol.md).
    """

    name: str
    check: Callable[[IntentView], CheckAnswer] | None = None
    key_retention_seconds: float | None = None
    success: SuccessMeaning = "completed"
    log_bodies: bool = False


@dataclass(frozen=True)
class EffectCall:
    """What a tool function gets: the key, the token, the payload to send, and its timeout.

    ``timeout`` is how long the call may take, in seconds (the job class's
    ``effect_timeout_seconds`` unless ``ctx.effect(timeout=...)`` says otherwise):
    give it to the transport. The watchdog stops an attempt whose call runs
    past it by more than ``EFFECT_MARGIN``.
    """

    key: str
    token: int
    job_id: str
    action: str
    target: str
    payload: Mapping[str, Any]
    timeout: float = 60.0

    @property
    def headers(self) -> dict[str, str]:
        """``Idempotency-Key``, ``X-Execution-Fence-Scope`` (job id), ``X-Execution-Fence``.

        A fence that cannot be written (a job id too long once percent-encoded)
        raises ``ToolNotApplied(retry=False)``: no request carrying it can have left.
        """
        return self._fence()

    def signed_headers(self, secret: bytes) -> dict[str, str]:
        """:attr:`headers` plus ``X-Execution-Fence-Signature`` (HMAC-SHA256 under ``secret``)."""
        return self._fence(secret)

    def _fence(self, secret: bytes | None = None) -> dict[str, str]:
        try:
            return fence_headers(self.key, self.job_id, self.token, secret=secret)
        except FenceError as exc:
            # Raised inside the tool, any other exception reads "outcome unknown".
            raise ToolNotApplied(f"not sent: {exc}", code="invalid_fence", retry=False) from None


class App:
    """A set of job classes and their handlers (what ``sqs-lease worker MODULE:OBJECT`` loads)."""

    def __init__(
        self,
        *,
        tenant_limit: int | None = None,
        tenant_limits: Mapping[str, int] | None = None,
    ) -> None:
        """``tenant_limit``: at most this many jobs of one tenant (``submit(...,
        tenant=...)``) run at once, fleet-wide, whatever their class (None: no limit);
        ``tenant_limits`` sets it per tenant (wins over ``tenant_limit``). Every worker
        of the fleet must run the same limits."""
        self.classes: dict[str, Registered] = {}
        self.targets: dict[str, Target] = {}
        self._staged: dict[str, StagedJob | PlannedJob] = {}
        try:
            self.tenant_limit = check_limit("tenant_limit", tenant_limit)
            self.tenant_limits = {
                t: int(check_limit(f"tenant_limits[{t!r}]", n) or 0)
                for t, n in (tenant_limits or {}).items()
            }
        except ValueError as exc:
            raise ConfigError(str(exc)) from None

    def tenant_limit_for(self, tenant: str) -> int | None:
        """The limit of this tenant's running jobs (None: none)."""
        return self.tenant_limits.get(tenant, self.tenant_limit)

    def class_limit_for(self, job_class: str) -> int | None:
        """The fleet-wide limit of this class's running jobs (None: none, or unknown)."""
        reg = self.classes.get(job_class)
        return reg.job_class.concurrency_limit if reg is not None else None

    def stage_limit_for(self, job_class: str, stage: str) -> tuple[str, int] | None:
        """The fleet-wide limit of one stage's running jobs: what it belongs to (the
        stage, or a planned job's tool across every step calling it) and the stage's
        own class's ``concurrency_limit`` (None: none, or unknown)."""
        reg = self.get(job_class, stage)
        if reg is None or reg.job_class.concurrency_limit is None:
            return None
        return reg.limit_unit or stage, reg.job_class.concurrency_limit

    def async_callables(self) -> list[str]:
        """Every ``async def`` the app runs, named (a class, a class's stage, a planned
        job's tool): a worker that cannot await refuses the app naming them."""
        out: list[str] = []
        for name, top in self.classes.items():
            if top.planned is not None:
                out.extend(
                    f"job class {name!r} tool {t!r}"
                    for t, tool in top.planned.tools.items()
                    if is_async_callable(tool.fn)
                )
            elif top.stages is not None:
                out.extend(
                    f"job class {name!r} stage {s!r}" for s, r in top.stages.items() if r.is_async
                )
            elif top.is_async:
                out.append(f"job class {name!r}")
        return sorted(out)

    @property
    def has_limits(self) -> bool:
        """Whether any job class or tenant has a fleet-wide limit (the worker then
        needs the slots table)."""
        return (
            self.tenant_limit is not None
            or bool(self.tenant_limits)
            or any(c.concurrency_limit is not None for c in self.job_classes())
        )

    def target(
        self,
        name: str,
        *,
        check: Callable[[IntentView], CheckAnswer] | None = None,
        key_retention_seconds: float | None = None,
        success: SuccessMeaning = "completed",
        log_bodies: bool = False,
    ) -> Target:
        """Declare a target: its reconciliation check and how long it keeps keys."""
        if name in self.targets:
            raise ConfigError(f"target {name!r} is declared twice")
        if success not in SUCCESS_MEANINGS:
            raise ConfigError(
                f"target {name!r}: success={success!r} must be one of "
                f"{', '.join(SUCCESS_MEANINGS)} (what the target's success means)"
            )
        t = Target(name, check, key_retention_seconds, success, log_bodies)
        self.targets[name] = t
        return t

    def register(self, job_class: JobClass, handler: Handler) -> None:
        if job_class.name in self.classes or job_class.name in self._staged:
            raise ConfigError(f"job class {job_class.name!r} is registered twice; rename one")
        self.classes[job_class.name] = Registered(job_class, handler)

    def job(
        self, name: str, *, payload: type[BaseModel], **policy: Unpack[JobPolicy]
    ) -> Callable[[H], H]:
        """Decorator: ``@app.job("ocr", payload=OcrPayload, lease_seconds=60)``."""
        job_class = job_class_of(name, payload, policy)

        def deco(fn: H) -> H:
            self.register(job_class, fn)
            return fn

        return deco

    def staged(
        self, name: str, *, payload: type[BaseModel], **policy: Unpack[JobPolicy]
    ) -> StagedJob:
        """A job of named stages; ``policy`` is every stage's default (see :class:`StagedJob`)."""
        if name in self.classes or name in self._staged:
            raise ConfigError(f"job class {name!r} is registered twice; rename one")
        job = StagedJob(self, name, payload, policy)
        self._staged[name] = job
        return job

    def _put_staged(self, job: StagedJob) -> None:
        self.classes[job.name] = job.registered()

    def planned(self, name: str, **policy: Unpack[JobPolicy]) -> PlannedJob:
        """A job run from a plan of tool steps (see :mod:`sqs_lease.plans`); ``policy`` is
        every tool's default class."""
        from .plans import PlannedJob

        if name in self.classes or name in self._staged:
            raise ConfigError(f"job class {name!r} is registered twice; rename one")
        job = PlannedJob(self, name, policy)
        self._staged[name] = job
        return job

    def _put_planned(self, job: PlannedJob) -> None:
        self.classes[job.name] = job.registered()

    def first_stage(self, name: str, payload_json: str) -> str | None:
        """The stage a new job of class ``name`` with this payload starts at (None: one stage)."""
        reg = self.classes.get(name)
        if reg is None:
            return None
        if reg.planned is not None:
            return reg.planned.first_stage(payload_json)
        return reg.first_stage

    def stage_count(self, name: str, payload_json: str) -> int:
        """How many stages a new job of class ``name`` with this payload can take: each
        is a message of its own (1: a plain class, or one this app does not know)."""
        reg = self.classes.get(name)
        if reg is None:
            return 1
        if reg.planned is not None:
            return reg.planned.stage_count(payload_json)
        return len(reg.stages) if reg.stages else 1

    def get(self, name: str, stage: str | None = None) -> Registered | None:
        """A job class, or one stage of a staged job (None: this app does not know it)."""
        reg = self.classes.get(name)
        if reg is None or stage is None:
            return reg
        if reg.planned is not None:
            return reg.planned.stage(stage)
        return None if reg.stages is None else reg.stages.get(stage)

    def lease_rules(self) -> list[tuple[str, JobClass]]:
        """Every lease rule set the app runs, named for people: each job class (its
        name), each stage of a staged job (``job/stage``) and each tool of a planned
        job (``job/tool``), every one with its own lease, heartbeat, budgets and
        attempts.

        The one enumeration: a rule that reads "the classes" (the receive's first
        lease, the heartbeat's timeouts, the pace's budget, the loop lag an async
        worker tolerates, the most attempts against the redrive, a Lambda's stage
        budget) reads it, because a stage or a tool may be tighter than its job's
        defaults (issue 26 defect 10: read at the top level only, a stage's lease
        was lost to a stall the worker tolerated)."""
        out: list[tuple[str, JobClass]] = []
        for name, reg in self.classes.items():
            if reg.stages:
                out.extend((f"{name}/{s}", r.job_class) for s, r in reg.stages.items())
            else:
                out.append((name, reg.job_class))
            if reg.planned is not None:
                out.extend((f"{name}/{t}", tool.job_class) for t, tool in reg.planned.tools.items())
        return out

    def job_classes(self) -> list[JobClass]:
        """Every job class the app runs, each stage's and each tool's own included
        (:meth:`lease_rules`, without the names)."""
        return [c for _, c in self.lease_rules()]

    def prepare(self, name: str, payload: BaseModel | Mapping[str, Any]) -> tuple[str, str]:
        """Validate a payload for a class; return (its JSON, hash): ``payload_text``."""
        text = payload_text(self.validated(name, payload))
        return text, payload_hash(text)

    def validated(self, name: str, payload: BaseModel | Mapping[str, Any]) -> Any:
        """A payload validated by its class's model, as JSON data (``ConfigError``
        for a class this app does not know)."""
        reg = self.classes.get(name)
        if reg is None:
            known = ", ".join(sorted(self.classes)) or "none"
            raise ConfigError(f"unknown job class {name!r}; this app knows: {known}")
        model = (
            payload if isinstance(payload, BaseModel) else reg.job_class.validate_payload(payload)
        )
        return model.model_dump(mode="json")

    def with_overrides(
        self,
        *,
        targets: Mapping[str, Mapping[str, Any]] | None = None,
        job_classes: Mapping[str, JobPolicy] | None = None,
        **policy: Unpack[JobPolicy],
    ) -> App:
        """A new app with this app's handlers and other settings, for a test: shorter
        leases, a test double's check for a target. This app is left as it is::

            fast = app.with_overrides(**SHORT_LEASE, targets={"payments": {"check": t.check}})

        ``policy`` (``App.job``'s keywords) applies to every job class, every stage of
        a staged job and every tool of a planned job, over what each declared;
        ``job_classes`` to one class (its stages and tools too), or to one stage or
        tool named ``job/stage`` as :meth:`lease_rules` names them, after ``policy``.
        ``targets`` changes declared targets (``App.target``'s keywords, over the
        declared ones). Each class is rebuilt as a declaration builds it: a timing
        rule the overrides break is a :class:`~sqs_lease.JobClassError` naming the
        class and the numbers; a keyword, class, stage or target this app does not
        have is named with the nearest it has. The new app takes declarations of
        its own (``app.target``, ``app.job``) without touching this one.
        """
        from copy import copy

        fields = _policy_fields()
        _refuse_unknown("with_overrides", policy, [*fields, "targets", "job_classes"])
        units = sorted({*self.classes, *(n for n, _ in self.lease_rules())})
        per = dict(job_classes or {})
        for unit, over in per.items():
            if unit not in units:
                raise ConfigError(
                    f"with_overrides: job_classes[{unit!r}]: this app has no such job class, "
                    f"stage or tool; {_nearest(unit, units)}"
                )
            _refuse_unknown(f"with_overrides: job_classes[{unit!r}]", over, fields)
        kinds = ["check", "key_retention_seconds", "success", "log_bodies"]
        for name, changes in (targets or {}).items():
            if name not in self.targets:
                raise ConfigError(
                    f"with_overrides: targets[{name!r}]: this app declares no such target; "
                    f"{_nearest(name, sorted(self.targets))}"
                )
            _refuse_unknown(f"with_overrides: targets[{name!r}]", changes, kinds, ConfigError)

        derived = copy(self)
        derived.tenant_limits = dict(self.tenant_limits)
        derived._staged = dict(self._staged)
        derived.targets = {}
        for name, t in self.targets.items():
            declared = {k: getattr(t, k) for k in kinds}
            derived.target(name, **{**declared, **(targets or {}).get(name, {})})
        derived.classes = {}
        for name, reg in self.classes.items():
            layers: list[Mapping[str, Any]] = [policy, per.get(name, {})]
            if reg.planned is not None:
                planned = _planned_with(reg.planned, derived, layers, per)
                derived._staged[name] = planned
                derived.classes[name] = planned.registered()
            elif reg.stages is not None:
                stages = {
                    s: replace(
                        r, job_class=_rebuilt(r.job_class, *layers, per.get(f"{name}/{s}", {}))
                    )
                    for s, r in reg.stages.items()
                }
                first = reg.first_stage or next(iter(stages))
                derived.classes[name] = replace(
                    reg, job_class=stages[first].job_class, stages=stages
                )
            else:
                derived.classes[name] = replace(reg, job_class=_rebuilt(reg.job_class, *layers))
        return derived


class _ContextBase(ABC, Generic[P]):
    """What both job contexts share: ids, token, payload, lease reads, the journal,
    and the building of an effect's intent (the sync and async contexts differ
    only in how they wait and run the effect)."""

    def __init__(
        self,
        *,
        job_id: str,
        job_class: JobClass,
        payload: P,
        payload_hash: str,
        token: int,
        attempt: int,
        worker_id: str,
        lease: LocalLease,
        lock: threading.Lock,
        cancelled: threading.Event,
        clock: Callable[[], float],
        journal: Journal,
        targets: Mapping[str, Target] | None = None,
        stage: str = DEFAULT_STAGE,
        last_progress: Any = None,
        results: Mapping[str, Any] | None = None,
        job_payload_json: str | None = None,
    ) -> None:
        self._targets = dict(targets or {})
        self.last_progress: Any = last_progress
        """The progress details the job's previous owner last saved (``ctx.progress``),
        or None: where a taken-over or retried attempt may resume. A hint only: an
        effect already applied is known from its intent, a finished stage from its
        checkpoint, never from this."""
        self.job_payload_json = job_payload_json
        """The job's own payload (JSON): a later stage's ``payload`` is its stage input."""
        self.stage = stage
        self.results: Mapping[str, Any] = dict(results or {})
        """What the earlier stages of a staged job left (stage name -> checkpoint)."""
        self.job_id = job_id
        self.job_class = job_class
        self.payload = payload
        self.payload_hash = payload_hash
        self.token = token
        self.attempt = attempt
        self.worker_id = worker_id
        self._lease = lease
        self._lock = lock
        self._stopped = cancelled  # set by the worker with every stop request
        self._clock = clock
        self._journal = journal

    def _check_now(self) -> None:
        with self._lock:
            self._lease.check(self._clock())

    def _may_record(self) -> bool:
        with self._lock:
            return self._lease.may_record(self._clock())

    @property
    def cancelled(self) -> bool:
        """True once the worker told this attempt to stop (shutdown, lease lost,
        cancelled, watchdog). Reading it never raises; a handler that sees it
        should raise (``ctx.check()`` does), since a result returned after the
        stop is not committed as success."""
        return self._stopped.is_set()

    def _raise_stop(self) -> None:
        with self._lock:
            error = self._lease.stop_error()
        if error is None:  # pragma: no cover - the worker sets the event with a stop
            error = LeaseError(f"job {self.job_id} token {self.token}: the attempt was stopped")
        raise error

    def progress(self, details: Any = None) -> None:
        """Tell the watchdog the handler is making progress (resets the no-progress timeout).

        With ``details`` (any JSON value, at most ``PROGRESS_LIMIT`` = 2048 bytes as
        JSON, else :class:`~sqs_lease.ProgressTooLarge`), they are also kept on the job
        record by the next heartbeat, conditional on this attempt's token (a stale
        attempt's details are refused), only when they changed, at most one write per
        heartbeat; calling this often costs nothing more. A later owner of the job
        (after a takeover or a retry) finds the last saved details in
        ``ctx.last_progress``: a resume hint, e.g. ``{"pages_done": 500, "cursor":
        "X"}``. Details reported after the last heartbeat of an attempt may not be
        saved; the ones saved may lag the work by up to a heartbeat.
        """
        text = None if details is None else progress_text(details)
        with self._lock:
            self._lease.last_progress = self._clock()
            if text is not None:
                self._lease.progress = text

    @property
    def lease_left(self) -> float:
        with self._lock:
            return self._lease.conservative_deadline - self._clock()

    def _begin_call(self, timeout: float) -> int:
        with self._lock:
            return self._lease.begin_call(self._clock(), timeout)

    def _end_call(self, handle: int) -> None:
        with self._lock:
            self._lease.end_call(handle, self._clock())

    def fence_headers(self, idempotency_key: str, *, secret: bytes | None = None) -> dict[str, str]:
        """Headers for a fenced receiver: the key, the fence's scope (this job) and token.

        With ``secret`` the fence is also signed (``X-Execution-Fence-Signature``).
        The scope is the job id, also in later stages: the token counts per job.
        """
        return fence_headers(idempotency_key, self.job_id, self.token, secret=secret)

    def _effect_spec(
        self,
        action: str,
        target: str,
        payload: BaseModel | Mapping[str, Any],
        call: Callable[[EffectCall], Any],
        *,
        key: str | None,
        version: str | None,
        timeout: float | None,
    ) -> EffectSpec:
        """Validate one effect and describe it for ``effect_flow``, its tool ``call``
        as this context runs it (:meth:`_timed`)."""
        tgt = self._targets.get(target)
        if tgt is None:
            known = ", ".join(sorted(self._targets)) or "none"
            raise ConfigError(
                f"target {target!r} is not declared; declare it with app.target({target!r}, "
                f"check=...) (declared: {known})"
            )
        data = payload.model_dump(mode="json") if isinstance(payload, BaseModel) else dict(payload)
        text = canonical_json(data)
        digest = payload_hash(text)
        ikey = key or _default_key(self.job_id, self.stage, action, target, version)
        if not ikey or len(ikey) > 1024:
            raise ConfigError(f"intent key must be 1..1024 characters, got {len(ikey)}")
        try:
            check_key_text(ikey)  # refused before the intent is written, never sent
        except FenceError as exc:
            raise ConfigError(f"intent key {visible(ikey)!r}: {exc.reason}") from None
        # Keys count in UTF-8 bytes (2048 for a partition key), and the intent holds
        # the payload next to a bounded response: DynamoDB's limits, named up front.
        check_intent(ikey, text, RESPONSE_LIMIT)
        limit = self.job_class.effect_timeout_seconds if timeout is None else timeout
        budget = self.job_class.stage_budget_seconds
        if not 0 < limit <= budget - EFFECT_MARGIN:  # also refuses NaN
            raise ConfigError(
                f"effect {action!r}: timeout={limit!r} must be > 0 and at most "
                f"stage_budget_seconds - {EFFECT_MARGIN:g} = {budget - EFFECT_MARGIN:g}"
            )
        ec = EffectCall(ikey, self.token, self.job_id, action, target, data, limit)
        return EffectSpec(
            key=ikey,
            job_id=self.job_id,
            stage=self.stage,
            action=action,
            target=target,
            payload_json=text,
            payload_hash=digest,
            tool=self._timed(call, ec),
            check=tgt.check,
            lease_check=self._check_now,
            may_record=self._may_record,
            log_bodies=tgt.log_bodies,
            key_retention_seconds=tgt.key_retention_seconds,
            success=tgt.success,
            rekey=lambda new_key: self._timed(call, replace(ec, key=new_key)),
        )

    @abstractmethod
    def _timed(self, call: Callable[[EffectCall], Any], ec: EffectCall) -> Callable[[], Any]:
        """The tool as the effect flow runs it, watched by the watchdog while it runs."""

    def note(self, event: str, **fields: Any) -> None:
        """Journal a handler's own event, tagged with job id and token (no payloads)."""
        self._journal.write(event, {"job_id": self.job_id, "token": self.token, **fields})

    @contextmanager
    def tool_request(self, tool: str, **fields: Any) -> Iterator[None]:
        """Journal a tool call (``tool_request_started``/``_finished``/``_failed``)."""
        base = {"job_id": self.job_id, "token": self.token, "tool": tool, **fields}
        start = self._clock()
        self._journal.write("tool_request_started", base)
        try:
            yield
        except BaseException as exc:
            self._journal.write(
                "tool_request_failed",
                {
                    **base,
                    "duration": round(self._clock() - start, 3),
                    "error_code": type(exc).__name__,
                },
            )
            raise
        self._journal.write(
            "tool_request_finished", {**base, "duration": round(self._clock() - start, 3)}
        )


_EFFECT_DOC = """Apply one side effect through a durable intent.

        The key defaults to job id + stage + action + target (+ version); pass an
        explicit business key (``f"payment:{invoice}:capture"``) built in code,
        never taken from model output. ``call`` gets an :class:`EffectCall` and
        returns a ``ToolResult`` (or a mapping). It raises ``ToolNotApplied`` only
        where the target certainly did not apply the call (never sent: connection
        refused, name not resolved, a check of yours before sending; or the target
        refused it); then a later attempt repeats it with the same key. Any other
        exception (``ToolOutcomeUnknown``, a timeout, a bug reading a success) means
        "cannot tell" and goes to the target's check.

        A confirmed intent is replayed without calling the target; an intent left
        ``in_progress`` by an earlier attempt is reconciled with the target's check.

        ``timeout`` (default: the class's ``effect_timeout_seconds``) is handed to
        ``call`` as ``EffectCall.timeout``; a call that runs ``EFFECT_MARGIN``
        seconds past it makes the watchdog stop the attempt (outcome unknown:
        the next attempt reconciles the intent).
        """


class JobContext(_ContextBase[P]):
    """What a handler gets: ids, its fencing token, the payload, and the lease check.

    Call :meth:`check` right before every irreversible step; it raises
    ``LeaseLost``/``JobCancelled`` when the token moved on and ``OwnershipUnknown``
    when ownership is not confirmed with enough reserve left.

    **A handler told to stop must stop.** The worker tells an attempt to stop
    when it shuts down, when the lease is lost or the job cancelled, and when
    the watchdog stops it. From then on :meth:`wait` and :meth:`check` raise the
    matching :class:`~sqs_lease.LeaseError` (``WorkerShuttingDown``,
    ``LeaseLost``, ``JobCancelled``, ``AttemptTimedOut``, ``OwnershipUnknown``),
    so a loop of waits cannot fall through to ``return partial_result``; and
    whatever the handler returns after the stop is *not* committed as success
    (at shutdown the job goes back to the queue without spending an attempt;
    otherwise the result is discarded and journaled ``result_discarded``)::

        @app.job("export", payload=Export)
        def export(ctx, p):
            rows = []
            while (page := fetch_next(p, len(rows))) is not None:
                rows.extend(page)
                ctx.progress()
                ctx.wait(0.2)  # raises once the attempt must stop: no partial return
            return {"rows": len(rows)}

    An ``async def`` handler gets an :class:`AsyncJobContext` instead (the async
    worker runs it); a plain handler under the async worker still gets this one,
    in the worker's thread pool.
    """

    def __init__(
        self,
        *,
        run_effect: Callable[[EffectSpec], EffectResult] | None = None,
        **fields: Any,
    ) -> None:
        super().__init__(**fields)
        self._run_effect = run_effect

    def check(self) -> None:
        """Raise unless a new irreversible step may start now (see the class docstring)."""
        self._check_now()

    def wait(self, seconds: float) -> bool:
        """Sleep up to ``seconds``; raise the stop's ``LeaseError`` as soon as the
        attempt is told to stop (also if it already was).

        Returns False once the time has passed (it never returns True: a stop
        raises), so ``while not ctx.wait(s): ...`` loops stay correct.
        """
        if self._stopped.wait(seconds):
            self._raise_stop()
        return False

    def _timed(self, call: Callable[[EffectCall], Any], ec: EffectCall) -> Callable[[], Any]:
        """The tool as the effect flow runs it: its call is watched by the watchdog."""

        def tool() -> Any:
            handle = self._begin_call(ec.timeout)
            try:
                return call(ec)
            finally:
                self._end_call(handle)

        return tool

    def effect(
        self,
        action: str,
        target: str,
        payload: BaseModel | Mapping[str, Any],
        call: Callable[[EffectCall], Any],
        *,
        key: str | None = None,
        version: str | None = None,
        timeout: float | None = None,
    ) -> EffectResult:
        if self._run_effect is None:
            raise ConfigError("this context has no effect runner (run it under a Worker)")
        if is_async_callable(call):
            # Called here, it would give a coroutine, taken for the target's answer.
            # Refused before the intent is written: nothing was sent.
            raise PermanentError(
                f"effect {action!r} on {target!r}: the tool is an async def, which a plain "
                "handler's ctx.effect cannot await: make the tool a plain function, or the "
                "handler an async def (run by the async worker)",
                code="async_tool_in_plain_handler",
            )
        spec = self._effect_spec(
            action, target, payload, call, key=key, version=version, timeout=timeout
        )
        return self._run_effect(spec)

    effect.__doc__ = _EFFECT_DOC


class AsyncJobContext(_ContextBase[P]):
    """What an ``async def`` handler gets from the async worker: the same API as
    :class:`JobContext`, with the calls that wait or talk to AWS as awaitables::

        @app.job("capture", payload=Capture)
        async def capture(ctx, p):
            await ctx.check()
            done = await ctx.effect("capture", "payments", p, charge)  # charge: sync or async
            await ctx.wait(0.2)  # raises once the attempt must stop
            return {"charge_id": done.external_id}

    ``check``, ``wait`` and ``effect`` are awaited; ``progress``, ``note``,
    ``fence_headers``, ``tool_request``, ``lease_left`` and ``cancelled`` are the
    same plain calls as on :class:`JobContext`. An effect's ``call`` may be an
    ``async def`` (awaited on the loop) or a plain function (run in the worker's
    thread pool, so a blocking tool never holds the event loop).

    **Never block the event loop in an async handler.** The heartbeat runs on
    the loop: a handler step that holds it longer than the worker's
    ``max_loop_lag`` loses its lease (journaled ``loop_blocked``, the attempt
    given back for a counted retry). Blocking work belongs in a plain ``def``
    handler, or in ``await asyncio.to_thread(...)``.
    """

    def __init__(
        self,
        *,
        stopped: asyncio.Event,
        run_effect: Callable[[EffectSpec], Awaitable[EffectResult]],
        run_blocking: Callable[[Callable[[], Any]], Awaitable[Any]],
        before_check: Callable[[], None] = lambda: None,
        **fields: Any,
    ) -> None:
        super().__init__(**fields)
        self._before_check = before_check  # the worker judges a loop stall first
        self._astopped = stopped
        self._run_effect = run_effect
        self._run_blocking = run_blocking

    async def check(self) -> None:
        """Raise unless a new irreversible step may start now (see :class:`JobContext`)."""
        self._check_now()

    def _check_now(self) -> None:
        self._before_check()
        super()._check_now()

    async def wait(self, seconds: float) -> bool:
        """Sleep up to ``seconds``; raise the stop's ``LeaseError`` as soon as the
        attempt is told to stop (also if it already was). Returns False otherwise."""
        import asyncio  # here: the thread worker and Lambda never load asyncio for this

        self._before_check()
        if not self._astopped.is_set():
            try:
                await asyncio.wait_for(self._astopped.wait(), seconds)
            except TimeoutError:
                return False
        self._raise_stop()
        return False  # pragma: no cover - _raise_stop raises

    def _timed(self, call: Callable[[EffectCall], Any], ec: EffectCall) -> Callable[[], Any]:
        """The tool as the effect flow runs it: awaited if ``call`` is a coroutine
        function, else run in the worker's thread pool; watched while it runs."""

        async def tool() -> Any:
            handle = self._begin_call(ec.timeout)
            try:
                if is_async_callable(call):
                    return await call(ec)
                value = await self._run_blocking(lambda: call(ec))
                return await value if inspect.isawaitable(value) else value
            finally:
                self._end_call(handle)

        return tool

    async def effect(
        self,
        action: str,
        target: str,
        payload: BaseModel | Mapping[str, Any],
        call: Callable[[EffectCall], Any],
        *,
        key: str | None = None,
        version: str | None = None,
        timeout: float | None = None,
    ) -> EffectResult:
        spec = self._effect_spec(
            action, target, payload, call, key=key, version=version, timeout=timeout
        )
        return await self._run_effect(spec)

    effect.__doc__ = _EFFECT_DOC
