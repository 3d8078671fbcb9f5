"""The lease's state machine (``sqs_lease/_core/lease.py``): the whole table walked, every
event in every state, against the rules written out independently here; and the one
writer (nothing outside ``lease.py`` sets a lease's state)."""

from __future__ import annotations

import ast
from collections import deque
from pathlib import Path

import pytest
from core_harness import local_lease

from sqs_lease._core.lease import (
    OPEN,
    TRANSITIONS,
    Action,
    Drop,
    LeaseEvent,
    LeaseState,
    LocalLease,
    Stop,
)

ROOT = Path(__file__).resolve().parent.parent
S, E, A = LeaseState, LeaseEvent, Action
OPEN_STATES = {S.OK, S.UNKNOWN, S.STOPPING, S.STOPPING_UNKNOWN}
STOPPING = {S.STOPPING, S.STOPPING_UNKNOWN}
KNOWN_LOSS = {S.LOST, S.GIVEN_BACK, S.CANCELLED}


def expected(state: LeaseState, event: LeaseEvent) -> tuple[LeaseState, Action]:
    """The rules of docs/protocol.md, spelled out apart from the table."""
    if state in KNOWN_LOSS:
        return state, A.IGNORE  # a loss is learned once; a hand-back is final
    if event is E.LOST:
        return S.LOST, A.TELL_LOSS  # even a lease that ended or was dropped learns it
    if event is E.CANCELLED:
        return S.CANCELLED, A.TELL_LOSS
    if event is E.GAVE_BACK:
        return S.GIVEN_BACK, A.SETTLE
    if state not in OPEN_STATES:
        return state, A.IGNORE  # only an open lease is extended, stopped or dropped
    stopping = state in STOPPING
    if event is E.CONFIRMED:
        return (S.STOPPING if stopping else S.OK), A.EXTEND
    if event is E.UNCONFIRMED:
        return (S.STOPPING_UNKNOWN if stopping else S.UNKNOWN), A.RETRY_SOON
    if event is E.STOP_ASKED:
        if stopping:
            return state, A.IGNORE  # told once
        return (S.STOPPING if state is S.OK else S.STOPPING_UNKNOWN), A.TELL
    if event is E.RETURNED:
        return S.DONE, A.SETTLE
    assert event is E.DROPPED
    return S.EXPIRED, A.TELL


def paths() -> dict[LeaseState, list[LeaseEvent]]:
    """The shortest way to every state from a fresh claim's (breadth-first on the table)."""
    found: dict[LeaseState, list[LeaseEvent]] = {S.OK: []}
    todo = deque([S.OK])
    while todo:
        state = todo.popleft()
        for event, (nxt, _) in TRANSITIONS[state].items():
            if nxt not in found:
                found[nxt] = [*found[state], event]
                todo.append(nxt)
    return found


def fresh_in(state: LeaseState) -> LocalLease:
    lease = local_lease("job-1", token=3)
    for event in paths()[state]:
        lease.process(event, "because", why=Drop.NO_PROGRESS)
    assert lease.state is state
    return lease


def test_the_table_lists_every_event_in_every_state_and_reaches_every_state() -> None:
    assert set(TRANSITIONS) == set(LeaseState)
    for state, row in TRANSITIONS.items():
        assert set(row) == set(LeaseEvent), state
    assert set(paths()) == set(LeaseState)


@pytest.mark.parametrize("event", list(LeaseEvent))
@pytest.mark.parametrize("state", list(LeaseState))
def test_every_event_in_every_state_follows_the_rules(state: LeaseState, event: LeaseEvent) -> None:
    assert TRANSITIONS[state][event] == expected(state, event)
    lease = fresh_in(state)
    before = (lease.state, lease.reason, lease.dropped)
    action = lease.process(event, "news", why=Drop.STAGE_BUDGET)
    nxt, want = expected(state, event)
    assert (lease.state, action) == (nxt, want)
    if action is A.IGNORE:
        assert (lease.state, lease.reason, lease.dropped) == before
    # The views agree with the state: an open lease is extendable and not yet told to
    # stop unless the worker is stopping; a told attempt always has a stop to hear.
    assert (lease.status in OPEN) == (lease.state in OPEN_STATES)
    assert lease.shutdown == (lease.state in STOPPING)
    if action in (A.TELL, A.TELL_LOSS):
        assert lease.stop is not None and lease.stop_error() is not None
    if lease.state in (S.OK, S.UNKNOWN, S.DONE):
        assert lease.stop is None


def test_a_loss_is_told_once_however_it_is_learned() -> None:
    for first in (E.LOST, E.CANCELLED):
        for second in (E.LOST, E.CANCELLED, E.GAVE_BACK):
            lease = local_lease("job-1")
            assert lease.process(first, "token moved") is A.TELL_LOSS
            assert lease.process(second, "again") is A.IGNORE
            assert lease.reason == "token moved"


def test_the_stop_an_attempt_hears_is_the_states() -> None:
    assert fresh_in(S.STOPPING).stop is Stop.SHUTDOWN
    assert fresh_in(S.STOPPING_UNKNOWN).stop is Stop.SHUTDOWN
    assert fresh_in(S.EXPIRED).stop is Stop.LET_GO
    assert fresh_in(S.LOST).stop is Stop.LEASE_LOST
    assert fresh_in(S.GIVEN_BACK).stop is Stop.LEASE_LOST
    assert fresh_in(S.CANCELLED).stop is Stop.CANCELLED
    # Dropped, then handed back by its own ending: it still hears why it was dropped.
    lease = local_lease("job-1")
    lease.drop(Drop.EFFECT_TIMEOUT)
    lease.process(E.GAVE_BACK, "watchdog retry")
    assert lease.given_back and lease.dropped is Drop.EFFECT_TIMEOUT
    assert "stopped by the watchdog" in str(lease.stop_error())


def test_a_drop_names_its_reason() -> None:
    with pytest.raises(ValueError, match="names its reason"):
        local_lease("job-1").process(E.DROPPED)


_PRIVATE = {"_state", "_reason", "_dropped"}


def _writes_lease_state(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: list[str] = []
    for node in ast.walk(tree):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "id", None) == "setattr"
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and node.args[1].value in _PRIVATE
        ):
            found.append(f"{path}:{node.lineno}")
        for t in targets:
            if isinstance(t, ast.Attribute) and t.attr in _PRIVATE:
                found.append(f"{path}:{t.lineno}")
    return found


def test_nothing_but_the_lease_module_writes_a_leases_state() -> None:
    sources = [
        p
        for folder in ("sqs_lease", "simtools")
        for p in sorted((ROOT / folder).rglob("*.py"))
        if p.name != "lease.py"
    ]
    assert sources
    assert [w for p in sources for w in _writes_lease_state(p)] == []
    assert _writes_lease_state(ROOT / "sqs_lease" / "_core" / "lease.py")  # the check sees
