"""``App.with_overrides`` (issue 29): a test derives an app with other leases or other
targets from the user's module, without an app factory and without touching it.

The derived app is a new ``App``: the original keeps every class, stage, tool and
target as declared; the derived one has the overrides, checked as a declaration is
(the same typed errors, naming the keyword, class or target and the nearest valid one).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from sqs_lease import App, CheckAnswer, ConfigError, IntentView, JobClass, JobClassError
from sqs_lease._core.intents import Verdict
from sqs_lease.plans import PlanRefused
from sqs_lease.testing import SHORT_LEASE

ROOT = Path(__file__).resolve().parent.parent


class Charge(BaseModel):
    invoice: str
    amount: int = 0


class SearchArgs(BaseModel):
    query: str


def real_check(intent: IntentView) -> CheckAnswer:  # pragma: no cover - never called
    raise AssertionError("the production check")


def fake_check(intent: IntentView) -> CheckAnswer:  # pragma: no cover - never called
    return CheckAnswer(Verdict.NOT_APPLIED)


def handler(ctx: Any, p: Any) -> None:  # pragma: no cover - never run
    return None


def users_app() -> App:
    """What a user's module declares: a plain class, a staged job (one stage with its
    own lease), a planned job (a tool with its own lease) and a target."""
    app = App(tenant_limit=4)
    app.target("payments", check=real_check, key_retention_seconds=86_400)
    app.job("charge", payload=Charge, lease_seconds=300, heartbeat_seconds=30)(handler)
    report = app.staged("report", payload=Charge, lease_seconds=120, heartbeat_seconds=20)
    report.stage("fetch")(handler)
    report.stage("render", lease_seconds=600, heartbeat_seconds=60)(handler)
    research = app.planned("research", lease_seconds=60, heartbeat_seconds=10)
    research.tool("search", args=SearchArgs, lease_seconds=90)(handler)
    return app


def leases(app: App) -> dict[str, tuple[int, float]]:
    return {n: (c.lease_seconds, c.heartbeat_seconds) for n, c in app.lease_rules()}


def step_class(app: App, name: str, stage: str) -> JobClass:
    reg = app.get(name, stage)
    assert reg is not None
    return reg.job_class


DECLARED = {
    "charge": (300, 30.0),
    "report/fetch": (120, 20.0),
    "report/render": (600, 60.0),
    "research": (60, 10.0),
    "research/search": (90, 10.0),
}


def test_the_derived_app_has_the_overrides_and_the_original_is_untouched() -> None:
    app = users_app()
    derived = app.with_overrides(**SHORT_LEASE, targets={"payments": {"check": fake_check}})
    assert derived is not app and isinstance(derived, App)
    assert leases(app) == DECLARED
    assert leases(derived) == {name: (3, 1.0) for name in DECLARED}
    # Every class keeps what the overrides do not name.
    for (_, mine), (_, theirs) in zip(app.lease_rules(), derived.lease_rules(), strict=True):
        expected = mine.model_copy(update=dict(SHORT_LEASE))
        assert theirs.model_dump(exclude={"payload_model"}) == expected.model_dump(
            exclude={"payload_model"}
        )
    # The staged job's stages and the planned job's steps resolve to the new classes.
    assert step_class(derived, "report", "render").lease_seconds == 3
    assert step_class(derived, "research", "1-search").lease_seconds == 3
    assert step_class(app, "research", "1-search").lease_seconds == 90
    assert derived.classes["report"].job_class == step_class(derived, "report", "fetch")
    # The handlers are the same; the target's check is the test's, the rest as declared.
    assert derived.classes["charge"].handler is app.classes["charge"].handler
    assert app.targets["payments"].check is real_check
    assert derived.targets["payments"].check is fake_check
    assert derived.targets["payments"].key_retention_seconds == 86_400
    assert derived.tenant_limit == 4
    assert derived.classes["charge"].job_class.payload_model is Charge


def test_one_class_stage_or_tool_can_be_overridden_after_the_app_wide_keywords() -> None:
    app = users_app()
    derived = app.with_overrides(
        **SHORT_LEASE,
        job_classes={
            "charge": {"max_attempts": 2},
            "report": {"lease_seconds": 5},
            "report/render": {"lease_seconds": 7},
            "research/search": {"effect_timeout_seconds": 9},
        },
    )
    rules = dict(derived.lease_rules())
    assert rules["charge"].max_attempts == 2 and rules["charge"].lease_seconds == 3
    assert rules["report/fetch"].lease_seconds == 5
    assert rules["report/render"].lease_seconds == 7
    assert rules["research/search"].effect_timeout_seconds == 9
    assert rules["research"].effect_timeout_seconds == 60  # the plan's class: as declared
    assert dict(app.lease_rules())["charge"].max_attempts == 5
    assert leases(app) == DECLARED


def test_the_derived_planned_job_checks_plans_against_its_own_tools() -> None:
    derived = users_app().with_overrides(**SHORT_LEASE)
    planned = derived.classes["research"].planned
    assert planned is not None and planned.app is derived
    assert planned.accept([{"tool": "search", "args": {"query": "q"}}])
    with pytest.raises(PlanRefused):
        planned.accept([{"tool": "search", "args": {"query": "q"}, "lease_seconds": 9}])
    text, _ = derived.prepare("research", {"steps": [{"tool": "search", "args": {"query": "q"}}]})
    assert derived.first_stage("research", text) == "1-search"


def test_the_derived_app_takes_declarations_of_its_own() -> None:
    app = users_app()
    derived = app.with_overrides()
    assert leases(derived) == DECLARED
    derived.target("mailer")
    derived.job("notify", payload=Charge)(handler)
    assert "mailer" not in app.targets and "notify" not in app.classes
    with pytest.raises(ConfigError, match="registered twice"):
        derived.job("charge", payload=Charge)(handler)
    with pytest.raises(ConfigError, match="declared twice"):
        derived.target("payments")


@pytest.mark.parametrize(
    ("overrides", "error", "message"),
    [
        (
            {"lease_second": 3},
            JobClassError,
            "with_overrides: no keyword lease_second=: did you mean lease_seconds=?",
        ),
        (
            {"target": {}},
            JobClassError,
            "with_overrides: no keyword target=: did you mean targets=?",
        ),
        (
            {"job_classes": {"chrage": {}}},
            ConfigError,
            "job_classes['chrage']: this app has no such job class, stage or tool; "
            "did you mean 'charge'?",
        ),
        (
            {"job_classes": {"report/rendr": {}}},
            ConfigError,
            "did you mean 'report/render'?",
        ),
        (
            {"job_classes": {"charge": {"heartbeat_second": 1}}},
            JobClassError,
            "job_classes['charge']: no keyword heartbeat_second=: did you mean heartbeat_seconds=?",
        ),
        (
            {"targets": {"payment": {}}},
            ConfigError,
            "targets['payment']: this app declares no such target; did you mean 'payments'?",
        ),
        (
            {"targets": {"payments": {"chek": fake_check}}},
            ConfigError,
            "targets['payments']: no keyword chek=: did you mean check=?",
        ),
        (
            {"targets": {"payments": {"success": "done"}}},
            ConfigError,
            "success='done' must be one of",
        ),
        (
            # A timing rule broken: the class's own heartbeat (30 s) against a 3 s lease.
            {"lease_seconds": 3},
            JobClassError,
            "job class 'charge': heartbeat_seconds=30 > lease_seconds/2=1.5",
        ),
        (
            {"job_classes": {"charge": {"max_attempts": "many"}}},
            JobClassError,
            "job class 'charge': max_attempts='many'",
        ),
    ],
)
def test_a_bad_override_is_refused_as_a_declaration_would_be_naming_it(
    overrides: dict[str, Any], error: type[Exception], message: str
) -> None:
    app = users_app()
    with pytest.raises(error) as got:
        app.with_overrides(**overrides)
    assert type(got.value) is error
    assert message in str(got.value)
    assert leases(app) == DECLARED and app.targets["payments"].check is real_check


def test_what_a_declaration_refuses_the_overrides_refuse_too() -> None:
    # The same rule, the same error, whichever way the numbers came.
    with pytest.raises(JobClassError) as declared:
        App().job("charge", payload=Charge, lease_seconds=300, heartbeat_seconds=200)(handler)
    app = App()
    app.job("charge", payload=Charge, lease_seconds=300, heartbeat_seconds=30)(handler)
    with pytest.raises(JobClassError) as derived:
        app.with_overrides(heartbeat_seconds=200)
    assert str(derived.value) == str(declared.value)
    assert isinstance(app.classes["charge"].job_class, JobClass)
