"""The README and docs/testing.md run as written (issue 29): a reader who copies them
in order gets what they show.

A fenced ``python`` block whose first line is ``# NAME.py`` is saved under that name
(later blocks import it, a worker loads it); the others are saved under a name of
their own. A block right after ``<!-- not-run: reason -->`` is left out; keep that rare.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from conftest import AwsTestEnv

from sqs_lease import JobStatus, Producer, Settings, WaitTimedOut

ROOT = Path(__file__).resolve().parent.parent
HANG_GUARD = 300.0  # per process: a hang guard for a loaded machine, never a speed check
_FENCE = re.compile(
    r"^(?:<!-- not-run: (?P<why>[^\n]*?) -->\n\n?)?```(?P<lang>\w*)\n(?P<code>.*?)^```",
    flags=re.S | re.M,
)
_NAME = re.compile(r"#\s*(?P<name>[\w-]+\.py)\b")
# `print(...)  # shown`: what the line prints, as the reader reads it.
_SHOWN = re.compile(r"^\s*print\(.*\)\s+#\s*(?P<shown>.+)$", flags=re.M)
_EXIT = re.compile(r"#.*\bexit (?P<status>\d+)\b")
# Words a reader replaces by a value of their own session; such a line is not run.
_PLACEHOLDERS = {"KEY"}


@dataclass(frozen=True)
class Block:
    """One ```python block: its code and, from a first line ``# NAME.py``, its file name."""

    code: str
    name: str | None


def steps(text: str) -> list[Block | str]:
    """The python blocks and the ``sqs-lease``/``export`` lines of other blocks, in order;
    blocks marked not-run left out (a marker must say why)."""
    found: list[Block | str] = []
    for m in _FENCE.finditer(text):
        if m["why"] is not None:
            assert m["why"].strip(), "a not-run marker says why"
            continue
        code = m["code"]
        if m["lang"] == "python":
            first = _NAME.fullmatch(code.splitlines()[0].split(":")[0]) if code else None
            found.append(Block(code, first["name"] if first else None))
        elif not m["lang"]:
            found += [
                line.strip()
                for line in code.splitlines()
                if line.startswith(("sqs-lease ", "export "))
            ]
    return found


def test_the_extraction_keeps_order_names_and_shell_lines_and_leaves_marked_blocks_out() -> None:
    text = (
        "intro\n```python\n# mod.py: the app\nA = 1\n```\n\n"
        "```\npip install x\nsqs-lease jobs list  # all\nexport X=1\n```\n"
        "<!-- not-run: a fragment -->\n```python\nfragment()\n```\n"
        "```json\n{}\n```\n```python\nfrom mod import A\nprint(A)  # 1\n```\n"
    )
    assert steps(text) == [
        Block("# mod.py: the app\nA = 1\n", "mod.py"),
        "sqs-lease jobs list  # all",
        "export X=1",
        Block("from mod import A\nprint(A)  # 1\n", None),
    ]
    assert [m["shown"] for m in _SHOWN.finditer("x = 1\nprint(A)  # 1\n")] == ["1"]


def _nonblank(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


def _run_block(block: Block, index: int, where: Path, env: dict[str, str]) -> str:
    """Run a block as a script of its own in ``where``; it must succeed and print, line
    for line, what its ``print(...)  # shown`` comments show."""
    script = where / (block.name or f"block_{index}.py")
    script.write_text(block.code, encoding="utf-8")
    proc = subprocess.run(
        [sys.executable, script.name],
        cwd=where,
        env=env,
        capture_output=True,
        text=True,
        timeout=HANG_GUARD,
    )
    assert proc.returncode == 0, f"{script.name}:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}"
    shown = [m["shown"].strip() for m in _SHOWN.finditer(block.code)]
    printed = [line.strip() for line in proc.stdout.splitlines()]
    assert all(s in printed for s in shown), f"{script.name} shows {shown}, printed {printed}"
    return proc.stdout


def _settled(producer: Producer, job_id: str, worker: subprocess.Popen[str]) -> JobStatus:
    """The job once settled; a worker that stopped first (an app it cannot load) fails
    the test at once rather than at the hang guard."""
    deadline = time.monotonic() + HANG_GUARD
    while worker.poll() is None and time.monotonic() < deadline:
        try:
            return producer.wait(job_id, timeout=2.0)
        except WaitTimedOut:
            continue
    raise AssertionError(f"the worker ended ({worker.returncode}) before {job_id} settled")


def _run_command(line: str, where: Path, env: dict[str, str], submitted: list[str]) -> str:
    """Run a ``sqs-lease`` line as the reader would; a worker (it runs until Ctrl-C) is
    stopped with SIGINT once every job submitted so far has ended. The status is 0
    unless the line's comment says ``exit N``."""
    args = shlex.split(line, comments=True)
    args[0] = str(Path(sys.executable).with_name("sqs-lease"))  # this venv's command
    expected = int(m["status"]) if (m := _EXIT.search(line)) else 0
    if "worker" not in args[1:2]:
        proc = subprocess.run(
            args, cwd=where, env=env, capture_output=True, text=True, timeout=HANG_GUARD
        )
        assert proc.returncode == expected, f"{line}\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}"
        return proc.stdout
    settings = Settings(endpoint_url=env["AWS_ENDPOINT_URL"], prefix=env["SQS_LEASE_PREFIX"])
    with subprocess.Popen(
        args, cwd=where, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    ) as worker:
        try:
            for job_id in submitted:
                status = _settled(Producer(settings), job_id, worker)
                assert status.state.value == "succeeded", status
        finally:
            worker.send_signal(signal.SIGINT)  # the reader's Ctrl-C
            out, _ = worker.communicate(timeout=HANG_GUARD)
    assert worker.returncode == expected, f"{line}\n{out[-3000:]}"
    return out


def _reader_env(aws: AwsTestEnv) -> dict[str, str]:
    """The test's environment as a reader's shell after the README's ``sqs-lease local``
    and ``export`` lines: the session's emulator stands in for theirs (a fresh prefix,
    since the emulator is shared)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SQS_LEASE_", "AWS_ENDPOINT_URL", "PYTHONPATH"))
    }
    return {**env, "AWS_ENDPOINT_URL": aws.endpoint_url, "SQS_LEASE_PREFIX": aws.prefix}


@pytest.mark.integration
@pytest.mark.timeout(1200)  # a hang guard: a dozen processes in a row on a loaded machine
def test_the_readme_runs_in_order_as_written(
    aws: AwsTestEnv, ddb_client: Any, tmp_path: Path
) -> None:
    readme = steps((ROOT / "README.md").read_text(encoding="utf-8"))
    blocks = [s for s in readme if isinstance(s, Block)]
    # The app module a worker loads is examples/myjobs.py, shown whole (blank lines apart).
    assert blocks[0].name == "myjobs.py"
    assert _nonblank(blocks[0].code) == _nonblank(
        (ROOT / "examples" / "myjobs.py").read_text(encoding="utf-8")
    )
    assert len(_nonblank(blocks[0].code + blocks[1].code)) <= 32, "keep the first example short"
    env = _reader_env(aws)
    submitted: list[str] = []
    ran: list[str] = []
    for index, step in enumerate(readme):
        if isinstance(step, Block):
            out = _run_block(step, index, tmp_path, env)
            if step.name == "myjobs.py":  # importing the app defines; it creates nothing
                assert out == ""
                tables = ddb_client.list_tables()["TableNames"]
                assert not [t for t in tables if t.startswith(aws.prefix)], tables
            ran.append(step.name or f"block {index}")
            continue
        words = shlex.split(step, comments=True)
        if words[0] == "export" or words[1] == "local" or _PLACEHOLDERS & set(words):
            continue  # the session's emulator stands in; a placeholder has no value here
        out = _run_command(step, tmp_path, env, submitted)
        if words[1] == "submit":
            submitted.append(words[words.index("--id") + 1])
        if words[1:3] == ["jobs", "show"]:
            assert "state: succeeded" in out, out
        ran.append(" ".join(words[1:3]))
    assert len(blocks) >= 4 and "worker myjobs:app" in ran and "dlq list" in ran, ran


@pytest.mark.integration
@pytest.mark.timeout(900)  # a hang guard: its own pytest, emulator and 200 simulated seeds
def test_every_python_block_of_the_testing_page_runs(tmp_path: Path) -> None:
    blocks = [
        s
        for s in steps((ROOT / "docs" / "testing.md").read_text(encoding="utf-8"))
        if isinstance(s, Block)
    ]
    # Named, so that pytest collects them as a reader's files would be.
    assert all(b.name for b in blocks), [b.code.splitlines()[0] for b in blocks]
    for block in blocks:
        (tmp_path / str(block.name)).write_text(block.code, encoding="utf-8")
    tests = sum(len(re.findall(r"^def test_", b.code, flags=re.M)) for b in blocks)
    assert tests >= 2
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SQS_LEASE_", "AWS_ENDPOINT"))}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=800,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-3000:]
    assert f"{tests} passed" in proc.stdout, proc.stdout[-3000:]
