"""The example CDK app (cdk/app.py) loaded as a module, for the tests that synthesise it."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

CDK_DIR = Path(__file__).resolve().parent.parent / "cdk"


def load_example(name: str) -> ModuleType:
    """cdk/app.py as a module of its own under ``name`` (each test file its own copy)."""
    spec = importlib.util.spec_from_file_location(name, CDK_DIR / "app.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
