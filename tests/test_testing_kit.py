"""Written as a user would: only ``sqs_lease.testing`` and the public API.

The W1/W2 takeover with a lost response: W1 applies a payment and is paused before
its confirm is answered (and that answer is lost); W2 takes the job over and
reconciles with the target instead of paying again; W1 comes back late. No payment
is applied twice, and the job ends.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from sqs_lease import App, JobContext
from sqs_lease.testing import (
    SHORT_LEASE,
    Faults,
    FencedTarget,
    LeaseEnv,
    assert_every_job_terminal_or_parked,
    assert_no_effect_applied_twice,
)


class Charge(BaseModel):
    invoice: str
    amount: int


@pytest.mark.parametrize("shell", ["thread", "async"])
def test_a_takeover_after_a_lost_response_pays_once(
    lease_env: LeaseEnv, fenced_target: FencedTarget, shell: str
) -> None:
    # The same faults, whichever shell the stalled worker runs in.
    app = App()
    app.target("payments", check=fenced_target.check, key_retention_seconds=3600)
    w1_applied = threading.Event()
    faults: dict[str, Faults] = {}

    def pay(ec: Any) -> dict[str, Any]:
        out = fenced_target.call(ec)
        if ec.token == 1:
            # W1's payment applied; its confirm's answer will be lost, and W1 stalls.
            faults["W1"].lose_next_response("effect_confirm")
            faults["W1"].pause()
            w1_applied.set()
        return out

    @app.job("charge", payload=Charge, **SHORT_LEASE)
    def charge(ctx: JobContext[Any], p: Charge) -> dict[str, Any]:
        done = ctx.effect("capture", "payments", p, pay)
        return {"charge": done.external_id}

    job_id = lease_env.submit(app, "charge", Charge(invoice="INV-1", amount=100))
    w1 = lease_env.worker(app, "W1", concurrency=1, shell=shell)
    faults["W1"] = Faults(w1)
    w2 = lease_env.worker(app, "W2")
    with lease_env.running(w1):
        lease_env.wait_for(w1_applied.is_set, what="W1 applies the payment")
        with lease_env.running(w2):
            lease_env.wait_until_final(job_id)
        faults["W1"].resume()  # W1 comes back late: its writes meet the fence
        lease_env.wait_for(lambda: faults["W1"].lost != [], what="W1's confirm answer lost")
    record = lease_env.record(job_id)
    assert (record.state.value, record.token, record.owner) == ("succeeded", 2, "W2")
    assert len(fenced_target.ledger) == 1
    assert_no_effect_applied_twice(fenced_target, by=lambda row: row.payload["invoice"])
    assert_every_job_terminal_or_parked(lease_env, [job_id])


def test_a_message_delivered_twice_applies_its_effect_once(
    lease_env: LeaseEnv, fenced_target: FencedTarget
) -> None:
    app = App()
    app.target("payments", check=fenced_target.check, key_retention_seconds=3600)

    @app.job("charge", payload=Charge, **SHORT_LEASE)
    def charge(ctx: JobContext[Any], p: Charge) -> dict[str, Any]:
        return {"charge": ctx.effect("capture", "payments", p, fenced_target.call).external_id}

    job_id = lease_env.submit(app, "charge", Charge(invoice="INV-2", amount=5))
    lease_env.deliver_twice(job_id)
    with lease_env.running(lease_env.worker(app, "W", concurrency=2)):
        lease_env.wait_until_final(job_id)
    assert_no_effect_applied_twice(fenced_target)
    assert_every_job_terminal_or_parked(lease_env, [job_id])


def test_the_assertions_fail_on_a_duplicate_and_on_an_open_job(
    lease_env: LeaseEnv, fenced_target: FencedTarget
) -> None:
    from sqs_lease.testing import Applied

    fenced_target.ledger += [
        Applied("k1", "j", 1, {"invoice": "A"}, "x"),
        Applied("k2", "j", 2, {"invoice": "A"}, "y"),
    ]
    assert_no_effect_applied_twice(fenced_target)  # distinct keys
    try:
        assert_no_effect_applied_twice(fenced_target, by=lambda row: row.payload["invoice"])
    except AssertionError as exc:
        assert "'A' applied twice" in str(exc)
    else:  # pragma: no cover - the assertion must bite
        raise AssertionError("a duplicate went unnoticed")
    app = App()

    @app.job("idle", payload=Charge, **SHORT_LEASE)
    def idle(ctx: JobContext[Any], p: Charge) -> None:  # pragma: no cover - never run
        return None

    job_id = lease_env.submit(app, "idle", Charge(invoice="INV-3", amount=1))
    try:
        assert_every_job_terminal_or_parked(lease_env, [job_id])
    except AssertionError as exc:
        assert "queued" in str(exc)
    else:  # pragma: no cover
        raise AssertionError("an open job went unnoticed")


def test_a_worker_whose_clock_is_moved_past_its_lease_lets_the_job_go(
    lease_env: LeaseEnv,
) -> None:
    from sqs_lease.testing import ShiftedClock

    app = App()
    claimed = threading.Event()

    @app.job("hold", payload=Charge, **SHORT_LEASE)
    def hold(ctx: JobContext[Any], p: Charge) -> dict[str, int]:
        if ctx.token == 1:
            claimed.set()
            while True:
                ctx.wait(0.1)  # raises once the worker lets the lease go
        return {"token": ctx.token}

    job_id = lease_env.submit(app, "hold", Charge(invoice="INV-4", amount=1))
    worker = lease_env.worker(app, "W")
    clock = ShiftedClock().install(worker)
    with lease_env.running(worker):
        lease_env.wait_for(claimed.is_set, what="the first claim")
        clock.advance(60)  # the worker's own timers: far past its 3 s lease
        lease_env.wait_until_final(job_id)
    record = lease_env.record(job_id)
    assert (record.state.value, record.token) == ("succeeded", 2)


def test_the_installed_package_offers_the_plugin_to_pytest_as_an_entry_point() -> None:
    (plugin,) = [ep for ep in entry_points(group="pytest11") if ep.value.startswith("sqs_lease")]
    assert plugin.value == "sqs_lease.testing.pytest_plugin"
    # The entry point's name is the module's, so a conftest that lists the module too
    # finds it registered (a plugin registered twice is an error in pytest).
    assert plugin.name == plugin.value


def test_a_users_test_gets_the_fixtures_with_no_conftest_and_with_one_listing_the_plugin(
    tmp_path: Path,
) -> None:
    (tmp_path / "test_user.py").write_text(
        "def test_fixture(fenced_target):\n    assert fenced_target.ledger == []\n"
    )
    bare = tmp_path / "bare"
    listed = tmp_path / "listed"
    for where in (bare, listed):
        where.mkdir()
        (where / "test_user.py").write_text((tmp_path / "test_user.py").read_text())
    (listed / "conftest.py").write_text('pytest_plugins = ["sqs_lease.testing.pytest_plugin"]\n')
    for where in (bare, listed):
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_user.py"],
            cwd=where,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 0, f"{where.name}: {proc.stdout[-2000:]}{proc.stderr[-2000:]}"
        assert "1 passed" in proc.stdout
