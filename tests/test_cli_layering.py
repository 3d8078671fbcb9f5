"""The command line reads and writes only through the library (issue 28 item 5).

``sqs_lease/cli.py`` and its command groups (``_cli_*.py``) parse arguments, call the
library and print. A raw DynamoDB or SQS call there would bypass the table schema
(``_schema/``) and the operator modules that own each read and write; this test
reads their syntax trees and names any such call.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "sqs_lease"
CLI_MODULES = sorted([PACKAGE / "cli.py", *PACKAGE.glob("_cli_*.py")])

# boto3 client methods (snake_case, as botocore names them) of the two services.
AWS_METHODS = frozenset(
    {
        "get_item",
        "put_item",
        "update_item",
        "delete_item",
        "query",
        "scan",
        "batch_get_item",
        "batch_write_item",
        "transact_get_items",
        "transact_write_items",
        "describe_table",
        "create_table",
        "get_paginator",
        "send_message",
        "send_message_batch",
        "receive_message",
        "delete_message",
        "delete_message_batch",
        "change_message_visibility",
        "get_queue_url",
        "get_queue_attributes",
    }
)
# Callables that make a client or run flows against one.
CLIENT_MAKERS = frozenset({"client", "resource", "make_client", "SyncDriver", "Session"})
# Only botocore's exception types may be imported (to print an expected failure).
ALLOWED_AWS_IMPORTS = frozenset({"botocore.exceptions"})


def _offences(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: list[str] = []
    for node in ast.walk(tree):
        where = f"{path.name}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Call):
            fn = node.func
            name = fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", None)
            if isinstance(fn, ast.Attribute) and name in AWS_METHODS:
                found.append(f"{where}: .{name}(...)")
            elif name in CLIENT_MAKERS:
                found.append(f"{where}: {name}(...)")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                top = alias.name.split(".")[0]
                if top in ("boto3", "botocore", "pynamodb", "aiobotocore") and (
                    alias.name not in ALLOWED_AWS_IMPORTS
                ):
                    found.append(f"{where}: import {alias.name}")
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            top = module.split(".")[0]
            if top in ("boto3", "botocore", "pynamodb", "aiobotocore"):
                found.append(f"{where}: from {module} import ...")
            if node.level and module in ("_aws", "_aio"):
                found.append(f"{where}: from .{module} import ...")
    return found


def test_the_cli_modules_are_the_ones_expected() -> None:
    # The glob finds every command group; an empty list would pass vacuously.
    names = {p.name for p in CLI_MODULES}
    assert {"cli.py", "_cli_jobs.py", "_cli_intents.py", "_cli_dlq.py"} <= names


@pytest.mark.parametrize("path", CLI_MODULES, ids=lambda p: p.name)
def test_the_cli_makes_no_aws_call_of_its_own(path: Path) -> None:
    assert _offences(path) == []


def test_the_check_sees_a_raw_call(tmp_path: Path) -> None:
    # The check itself: a raw read the way cli.py used to make one is named.
    probe = tmp_path / "_cli_probe.py"
    probe.write_text(
        "from ._aws import make_client\n"
        "def f(settings):\n"
        "    ddb = make_client(settings, 'dynamodb')\n"
        "    return ddb.get_item(TableName='t', Key={})\n",
        encoding="utf-8",
    )
    found = _offences(probe)
    assert any(".get_item(" in f for f in found)
    assert any("make_client(" in f for f in found)
    assert any("from ._aws" in f for f in found)
