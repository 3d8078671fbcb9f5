"""The protocol core does no I/O, reads no clock and imports no AWS SDK."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORE = ROOT / "sqs_lease" / "_core"
# What the core may import: the standard library's pure parts, and the package's
# own error types. Anything that talks to the world or reads a clock is out.
ALLOWED_ABSOLUTE = {
    "__future__",
    "collections",
    "dataclasses",
    "enum",
    "hashlib",  # pure: a FIFO group id digest (_core/fifo.py)
    "json",
    "math",
    "re",  # pure: outside text's URLs and words (_core/texts.py)
    "typing",
    "unicodedata",  # pure: character categories (_core/inputs.py ids, _core/texts.py)
}
FORBIDDEN_NAMES = {
    "time",
    "datetime",
    "random",
    "socket",
    "os",
    "boto3",
    "botocore",
    "aiobotocore",
    "pynamodb",
    "urllib",
    "http",
    "threading",
    "asyncio",
}


def _imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            found.append("." * node.level + (node.module or ""))
    return found


def test_core_imports_only_pure_modules() -> None:
    files = sorted(CORE.glob("*.py"))
    assert files, "no core modules found"
    for path in files:
        for name in _imports(path):
            if name.startswith("."):
                # Relative: the core's own modules, or the package's error types.
                outside_core = name.startswith("..")
                assert not outside_core or name == ".._errors", f"{path.name} imports {name}"
                continue
            top = name.split(".")[0]
            assert top not in FORBIDDEN_NAMES, f"{path.name} imports {name}"
            assert top in ALLOWED_ABSOLUTE, f"{path.name} imports {name}: not known to be pure"


def test_core_reads_no_clock() -> None:
    for path in sorted(CORE.glob("*.py")):
        text = path.read_text()
        for needle in ("time.time", "monotonic(", "datetime.now", "perf_counter", "sleep("):
            assert needle not in text, f"{path.name} mentions {needle}"


def test_core_runs_without_any_aws_sdk_loaded() -> None:
    # Load the core without the package's __init__ (which wires up the drivers),
    # then prove that no AWS SDK or pynamodb module was imported on the way. Every
    # core module, so a module split off another is covered the day it lands.
    modules = sorted(p.stem for p in CORE.glob("*.py") if p.stem != "__init__")
    assert {"attempt", "env", "handback", "rounds", "receiving", "shutdown", "sweeps"} <= set(
        modules
    )
    script = f"""
import sys, types
pkg = types.ModuleType("sqs_lease")
pkg.__path__ = [{str(ROOT / "sqs_lease")!r}]
sys.modules["sqs_lease"] = pkg
import importlib
for name in {modules!r}:
    importlib.import_module("sqs_lease._core." + name)
sdk = ("boto3", "botocore", "aiobotocore", "pynamodb")
bad = sorted(m for m in sys.modules if m.split(".")[0] in sdk)
print(",".join(bad))
"""
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == ""
