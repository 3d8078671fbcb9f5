"""Run a Lambda asset's handler as the Lambda runtime would, from the asset alone.

``python -I -S lambda_asset_runner.py ASSET HANDLER EVENTS ANSWERS``: no site-packages
(-S) and no script directory or PYTHON* variables (-I), so the only importable code is
the standard library and ASSET (the unpacked Lambda asset). HANDLER is the function's
handler (``module.function``); EVENTS a JSON file of events, each handed to the
handler in turn with a context counting down from ``remaining_ms``; ANSWERS where the
handler's answers are written (stdout is the function's log). Standard library only.
"""

from __future__ import annotations

import importlib
import json
import sys
import sysconfig
import time
from pathlib import Path
from typing import Any


class Context:
    """What the Lambda runtime hands the handler: the time left, counting down."""

    def __init__(self, remaining_ms: int) -> None:
        self._deadline = time.monotonic() + remaining_ms / 1000.0
        self.function_name = "asset-runner"
        self.aws_request_id = "runner"

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int((self._deadline - time.monotonic()) * 1000))


def main() -> None:
    asset, handler_name, events_path, answers_path = sys.argv[1:5]
    sys.path.insert(0, asset)
    module_name, function_name = handler_name.rsplit(".", 1)
    handler = getattr(importlib.import_module(module_name), function_name)
    answers: list[Any] = []
    for item in json.loads(Path(events_path).read_text()):
        answers.append(handler(item["event"], Context(int(item["remaining_ms"]))))
    # Where every loaded module came from: the asset or the standard library only.
    stdlib = {sysconfig.get_path("stdlib"), sysconfig.get_path("platstdlib")}
    files = [getattr(m, "__file__", None) for m in list(sys.modules.values())]
    origins = sorted({str(Path(f).resolve()) for f in files if isinstance(f, str)})
    itself = str(Path(__file__).resolve())
    foreign = [
        o
        for o in origins
        if o != itself
        and not o.startswith(str(Path(asset).resolve()))
        and not any(o.startswith(str(Path(s).resolve())) for s in stdlib)
    ]
    Path(answers_path).write_text(
        json.dumps({"answers": answers, "foreign": foreign, "python": sys.version_info[:2]})
    )


if __name__ == "__main__":
    main()
