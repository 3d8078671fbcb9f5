"""``sqs_lease.testing.simulate``: a user's own app in the deterministic simulator
(issue 13 item 1): their handlers, called with a real context, under random fault
schedules; every broken invariant reported with the call that replays it."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel

from simtools.mutations import applied
from sqs_lease import App, CheckAnswer, ConfigError, JobContext, Verdict
from sqs_lease.testing import replay, simulate


class Charge(BaseModel):
    invoice: str
    amount: int


def _app(seen: list[tuple[str, int, Any]]) -> App:
    app = App()
    # The user's check is never asked: the simulated target answers (see simulate).
    app.target(
        "psp", check=lambda view: CheckAnswer(Verdict.CANNOT_TELL), key_retention_seconds=3600
    )
    app.target("mail")  # keeps no keys and cannot be asked: a repeat is not protected

    @app.job("charge", payload=Charge)
    def charge(ctx: JobContext[Any], p: Charge) -> dict[str, Any]:
        seen.append((ctx.job_id, ctx.token, ctx.last_progress))
        ctx.progress({"invoice": p.invoice, "step": "charging"})
        ctx.wait(2.0)
        done = ctx.effect("capture", "psp", p, lambda ec: {"id": "never called"})
        ctx.wait(1.0)
        ctx.effect("receipt", "mail", {"invoice": p.invoice}, lambda ec: {})
        return {"charge": done.external_id}

    return app


JOBS = [("charge", Charge(invoice=f"INV-{i}", amount=10 * i)) for i in range(4)]


def test_the_users_handlers_run_through_takeovers_and_no_invariant_breaks() -> None:
    seen: list[tuple[str, int, Any]] = []
    report = simulate(_app(seen), JOBS, seeds=range(12))
    report.assert_ok()
    assert report.seeds == 12 and report.counts["reclaimed"] > 0
    assert sum(report.injected.values()) > 0
    # Their handler ran, again under a newer token after a takeover or a retry, and a
    # later attempt found the progress details an earlier one saved.
    assert {token for _, token, _ in seen} >= {1, 2}
    assert any(
        last == {"invoice": last["invoice"], "step": "charging"}
        for _, _, last in seen
        if last is not None
    )


def test_a_broken_protocol_is_reported_with_its_seed_and_a_call_that_replays_it() -> None:
    # An intent left in progress repeated without asking the target (a mutation of
    # the toolkit itself): a user's run must show it, and the replay break the same way.
    app = _app([])
    with applied("blind_retry"):
        report = simulate(app, JOBS, seeds=range(10))
        assert not report.ok
        first = report.failures[0]
        assert first.replay == f"sqs_lease.testing.replay(app, jobs, seed={first.seed})"
        with pytest.raises(AssertionError, match=f"seed {first.seed}: {first.invariant}"):
            report.assert_ok()
        again = replay(app, JOBS, first.seed, echo=False)
    assert [(v.name, v.time) for v in again.violations][:1] == [(first.invariant, first.at)]
    assert again.log  # the full event log of the schedule


def test_one_seed_replays_byte_for_byte() -> None:
    a = replay(_app([]), JOBS, 7, echo=False).render_log()
    b = replay(_app([]), JOBS, 7, echo=False).render_log()
    assert a == b and len(a) > 100


def test_simulate_refuses_what_it_cannot_run_naming_the_fix() -> None:
    app = _app([])

    @app.job("later", payload=Charge)
    async def later(ctx: Any, p: Charge) -> None:  # pragma: no cover - never run
        return None

    with pytest.raises(ConfigError, match="jobs is empty"):
        simulate(app, [], seeds=[1])
    with pytest.raises(ConfigError, match=r"unknown job class 'refund'.*knows: charge, later"):
        simulate(app, [("refund", {"invoice": "x", "amount": 1})], seeds=[1])
    with pytest.raises(ConfigError, match="async handler"):
        simulate(app, [("later", {"invoice": "x", "amount": 1})], seeds=[1])
