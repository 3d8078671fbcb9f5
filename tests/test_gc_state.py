"""The shipped package leaves process-wide state alone: the garbage collector's
thresholds change only inside the simulator's command line, and come back after."""

from __future__ import annotations

import gc
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from simtools import cli as sim_cli
from simtools import run_seed
from sqs_lease.testing._sim.world import World

ROOT = Path(__file__).resolve().parent.parent
# Unusual values, so a change by anyone shows.
MARKED = (701, 11, 13)


@pytest.fixture
def marked_thresholds() -> Iterator[None]:
    saved = gc.get_threshold()
    gc.set_threshold(*MARKED)
    try:
        yield
    finally:
        gc.set_threshold(*saved)


def test_running_a_simulated_schedule_leaves_the_collectors_thresholds_alone(
    marked_thresholds: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[tuple[int, ...]] = []
    original = World.run

    def run(self: World) -> Any:
        seen.append(gc.get_threshold())
        return original(self)

    monkeypatch.setattr(World, "run", run)
    run_seed(1, features=frozenset())
    assert seen == [MARKED]
    assert gc.get_threshold() == MARKED


def test_the_simulators_command_line_tunes_the_collector_only_while_it_runs(
    marked_thresholds: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[tuple[int, ...]] = []
    original = sim_cli.run_seeds

    def run_seeds(*args: Any, **kwargs: Any) -> sim_cli.Summary:
        seen.append(gc.get_threshold())
        return original(*args, **kwargs)

    monkeypatch.setattr(sim_cli, "run_seeds", run_seeds)
    assert sim_cli.main(["run", "--seeds", "1", "--widen", "none"]) == 0
    assert seen == [sim_cli.FAST_GC_THRESHOLDS]
    assert gc.get_threshold() == MARKED


def test_the_simulators_command_line_restores_the_collector_when_it_fails(
    marked_thresholds: None,
) -> None:
    with pytest.raises(SystemExit):
        sim_cli.main(["run", "--widen", "no-such-feature"])
    assert gc.get_threshold() == MARKED


def test_importing_every_module_of_the_package_leaves_the_collector_alone() -> None:
    code = (
        "import gc, importlib, pkgutil\n"
        "before = gc.get_threshold()\n"
        "import sqs_lease\n"
        "for m in pkgutil.walk_packages(sqs_lease.__path__, 'sqs_lease.'):\n"
        "    if not m.name.endswith('__main__'):\n"
        "        importlib.import_module(m.name)\n"
        "assert gc.get_threshold() == before, (before, gc.get_threshold())\n"
        "print('ok')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
