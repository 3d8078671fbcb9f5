"""Every journal event the code emits is in the operations table, and only those."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "sqs_lease"
OPERATIONS = ROOT / "docs" / "operations.md"
# The call sites that journal an event: ``emit("...")`` and ``Emit("...")`` in the
# core, ``journal("...")`` / ``self.journal(...)`` and ``.write("...")`` in the shells.
EMITTERS = {"emit", "Emit", "journal", "write"}
EVENT_NAME = re.compile(r"^[a-z][a-z0-9]*(?:_[a-z0-9]+)+$")


def _names(expr: ast.expr, assigned: dict[str, set[str]]) -> set[str]:
    """Event names an expression can evaluate to: a literal, either arm of a
    conditional, or a local name assigned literals in the same function."""
    if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
        return {expr.value}
    if isinstance(expr, ast.IfExp):
        return _names(expr.body, assigned) | _names(expr.orelse, assigned)
    if isinstance(expr, ast.Name):
        return set(assigned.get(expr.id, ()))
    return set()


def _assigned_literals(fn: ast.AST) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for node in ast.walk(fn):
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Name):
                value = node.value
                if isinstance(value, ast.Constant) and isinstance(value.value, str):
                    out.setdefault(target.id, set()).add(value.value)
    return out


def emitted_events() -> dict[str, set[str]]:
    """Event name -> the files that emit it, read from the source of sqs_lease/."""
    found: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text())
        scopes = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]
        for scope in scopes:
            assigned = _assigned_literals(scope)
            for node in ast.walk(scope):
                if not isinstance(node, ast.Call) or not node.args:
                    continue
                f = node.func
                name = f.id if isinstance(f, ast.Name) else getattr(f, "attr", None)
                if name not in EMITTERS:
                    continue
                for event in _names(node.args[0], assigned):
                    # ``.write`` also writes text to streams; events are snake_case names.
                    if EVENT_NAME.match(event):
                        found.setdefault(event, set()).add(str(path.relative_to(ROOT)))
    return found


def documented_events() -> set[str]:
    """The events named in the first column of the table under "### Every event"."""
    text = OPERATIONS.read_text()
    start = text.index("### Every event")
    section = text[start:]
    end = section.find("\n## ", 1)
    rows = [
        line for line in section[: end if end > 0 else None].splitlines() if line.startswith("|")
    ]
    names: set[str] = set()
    for row in rows[2:]:  # header and separator
        first = row.split("|")[1]
        names.update(re.findall(r"`([a-z0-9_]+)`", first))
    return names


def test_the_scan_sees_every_kind_of_call_site() -> None:
    events = emitted_events()
    assert "heartbeat_lost" in events  # Emit("...") built by the core's lose()
    assert "job_already_done" in events and "job_parked_skip" in events  # a conditional
    assert "effect_failed" in events  # a local name journaled by the receiver kit
    assert "tool_request_started" in events  # .write("...") in the handler context
    assert "worker_started" in events  # self.journal("...") in the worker


def test_every_emitted_event_is_documented_in_the_operations_table() -> None:
    missing = {e: sorted(files) for e, files in emitted_events().items()}
    missing = {e: f for e, f in missing.items() if e not in documented_events()}
    assert missing == {}, f"add these to docs/operations.md, 'Every event': {missing}"


def test_every_documented_event_is_emitted_by_the_code() -> None:
    stale = documented_events() - set(emitted_events())
    assert stale == set(), f"docs/operations.md lists events nothing emits: {sorted(stale)}"


def test_every_emitted_event_has_a_log_level_and_the_table_has_no_stale_entry() -> None:
    from sqs_lease._journal import EVENT_LEVELS

    emitted = set(emitted_events())
    assert sorted(emitted - set(EVENT_LEVELS)) == [], "add them to sqs_lease._journal.EVENT_LEVELS"
    assert sorted(set(EVENT_LEVELS) - emitted) == []
