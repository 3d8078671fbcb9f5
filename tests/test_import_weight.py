"""What importing the package and its testing kit loads (issue 28): nothing heavy.

Every pytest run of an environment that installs sqs-lease loads the testing kit's
plugin (a pytest11 entry point), so ``import sqs_lease``, ``sqs_lease.testing`` and
the plugin must not load the workers, an AWS SDK, moto or the simulator: each is
imported when a name, fixture or function that needs it is first used. These are
checks of what is imported, in a fresh interpreter, never of how long it takes.
"""

from __future__ import annotations

import ast
import importlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import ModuleType

import pytest

import sqs_lease
import sqs_lease.testing

ROOT = Path(__file__).resolve().parent.parent

# Modules that must wait for their first use: the shells (and the drivers they
# stand on), the simulator, and the third-party packages behind them.
HEAVY_PACKAGES = ("boto3", "botocore", "aiobotocore", "moto")
HEAVY_MODULES = (
    "sqs_lease._worker",
    "sqs_lease._aio_worker",
    "sqs_lease._aws",
    "sqs_lease._aio",
    "sqs_lease.testing._simulate",
    "sqs_lease.testing._sim",
)


def _heavy(modules: list[str]) -> list[str]:
    return sorted(
        m
        for m in modules
        if m.split(".")[0] in HEAVY_PACKAGES
        or any(m == h or m.startswith(h + ".") for h in HEAVY_MODULES)
    )


def _fresh(script: str) -> dict[str, list[str]]:
    """Run ``script`` in a fresh interpreter on this checkout; its printed JSON."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    loaded: dict[str, list[str]] = json.loads(out.stdout)
    return loaded


@pytest.mark.parametrize(
    "module", ["sqs_lease", "sqs_lease.testing", "sqs_lease.testing.pytest_plugin"]
)
def test_importing_the_package_its_kit_or_the_plugin_loads_no_worker_sdk_moto_or_simulator(
    module: str,
) -> None:
    loaded = _fresh(
        f"""
        import json, sys
        import {module}
        print(json.dumps({{"modules": sorted(sys.modules)}}))
        """
    )
    assert module in loaded["modules"]
    assert _heavy(loaded["modules"]) == []


def test_each_part_is_loaded_when_a_name_that_needs_it_is_first_used() -> None:
    loaded = _fresh(
        """
        import json, sys
        import sqs_lease.testing
        out = {"before": sorted(sys.modules)}
        sqs_lease.testing.simulate  # the simulator, on first use
        out["simulate"] = sorted(sys.modules)
        sqs_lease.testing.SHELLS  # the worker shells
        out["shells"] = sorted(sys.modules)
        print(json.dumps(out))
        """
    )
    assert _heavy(loaded["before"]) == []
    assert "sqs_lease.testing._sim.world" in loaded["simulate"]
    assert {"sqs_lease._worker", "sqs_lease._aio_worker"} <= set(loaded["shells"])


def test_a_pytest_run_loads_the_plugin_by_its_entry_point_and_nothing_heavy(
    tmp_path: Path,
) -> None:
    # A user's project: no conftest, the plugin comes from the installed entry point.
    (tmp_path / "test_user.py").write_text(
        textwrap.dedent(
            f"""
            import sys

            HEAVY_PACKAGES = {HEAVY_PACKAGES!r}
            HEAVY_MODULES = {HEAVY_MODULES!r}

            def test_the_plugin_is_loaded_and_nothing_heavy():
                assert "sqs_lease.testing.pytest_plugin" in sys.modules
                heavy = [
                    m for m in sys.modules
                    if m.split(".")[0] in HEAVY_PACKAGES
                    or any(m == h or m.startswith(h + ".") for h in HEAVY_MODULES)
                ]
                assert heavy == []
            """
        )
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_user.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}{proc.stderr[-2000:]}"
    assert "1 passed" in proc.stdout


def _declared(module: ModuleType) -> tuple[dict[str, str], set[str]]:
    """What a module's source says: the names its ``if TYPE_CHECKING:`` block imports,
    each with its module (what type checkers are told each name is), and the names it
    binds when it runs (definitions, assignments, imports outside that block)."""
    assert module.__file__ is not None
    tree = ast.parse(Path(module.__file__).read_text())
    declared: dict[str, str] = {}
    bound: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            for stmt in node.body:
                if isinstance(stmt, ast.ImportFrom):
                    source = "." * stmt.level + (stmt.module or "")
                    absolute = importlib.util.resolve_name(source, module.__name__)
                    declared.update({a.asname or a.name: absolute for a in stmt.names})
                elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                    declared[stmt.target.id] = ""  # a name only annotated here
        elif isinstance(node, ast.ImportFrom | ast.Import):
            bound.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.FunctionDef | ast.ClassDef):
            bound.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            bound.update(t.id for t in targets if isinstance(t, ast.Name))
    return declared, bound


def _lazy(module: ModuleType) -> dict[str, str]:
    """A module's lazy table: each name its ``__getattr__`` imports, with its module."""
    if module is sqs_lease:
        table = vars(sqs_lease)["_MODULE_OF"]
    else:
        table = {**vars(sqs_lease.testing)["_WHERE"], "SHELLS": None}
    return {
        name: "" if where is None else importlib.util.resolve_name(where, module.__name__)
        for name, where in table.items()
    }


@pytest.mark.parametrize("module", [sqs_lease, sqs_lease.testing], ids=lambda m: m.__name__)
def test_every_public_name_is_bound_or_lazy_and_resolves_to_what_type_checkers_see(
    module: ModuleType,
) -> None:
    # The lazy table and the imports for type checkers are two lists: held together here.
    declared, bound = _declared(module)
    lazy = _lazy(module)
    unknown = sorted(set(lazy) - set(declared))
    assert unknown == [], f"lazy names type checkers are not told of: {unknown}"
    for name, where in lazy.items():
        assert not where or declared[name] == where, f"{name}: {where} != {declared[name]}"
    unbound = sorted(set(module.__all__) - bound - set(lazy))
    assert unbound == [], f"{module.__name__}.__all__ names what it cannot resolve: {unbound}"
    for name in module.__all__:
        value = getattr(module, name)
        if name in declared and name in lazy and lazy[name]:
            assert value is getattr(importlib.import_module(declared[name]), name), name
    assert set(dir(module)) >= set(module.__all__)
    with pytest.raises(AttributeError, match="no_such_name"):
        _ = module.no_such_name
