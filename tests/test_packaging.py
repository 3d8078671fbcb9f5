"""The package as a user gets it: the sdist and the wheel built from this tree, the
wheel installed into a fresh virtualenv (with the ``local`` extra, without ``async``),
and used from a directory outside the repository.

Nothing here imports the working tree's ``sqs_lease``: every check runs the new
virtualenv's interpreter in isolated mode (``-I``: no ``PYTHONPATH``, no current
directory on ``sys.path``) from a temporary directory, and checks that
``sqs_lease.__file__`` lies inside that virtualenv. Installation goes through pip
with the versions of ``constraints.txt`` and pip's cache, so it needs the package
index (or its cache) as ``make test`` does.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import textwrap
import tomllib
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "sqs_lease"
PUBLIC_MODULES = ("sqs_lease", "sqs_lease.cli", "sqs_lease.effects", "sqs_lease.receiver")
# Hang guards only (a pip install on a loaded machine can take minutes).
BUILD_TIMEOUT = 600.0
RUN_TIMEOUT = 300.0

# One xdist worker runs this file (`make test` uses --dist loadgroup): its module
# fixtures build the wheel and a virtualenv once, not once per worker.
pytestmark = [
    pytest.mark.packaging,
    pytest.mark.timeout(1200),
    pytest.mark.xdist_group("packaging"),
]

_NOT_SOURCE = shutil.ignore_patterns(
    ".git",
    ".venv",
    "build",
    "dist",
    "*.egg-info",
    "__pycache__",
    ".mypy_cache",
    ".pytest_cache",
    ".ruff_cache",
    "cdk.out",
    "node_modules",
    ".demo",
    ".chaos",
)


@dataclass(frozen=True)
class Dists:
    sdist: Path
    wheel: Path
    log: str  # what the build printed (both streams)


@dataclass(frozen=True)
class Installed:
    venv: Path
    python: Path
    workdir: Path  # outside the repository; every command runs here


def _version() -> str:
    with (ROOT / "pyproject.toml").open("rb") as f:
        return str(tomllib.load(f)["project"]["version"])


def _package_files() -> set[str]:
    """What the wheel must ship: every module of the package, and its typing marker."""
    files = {p.relative_to(ROOT).as_posix() for p in PACKAGE.rglob("*.py")}
    return files | {"sqs_lease/py.typed"}


def _clean_env() -> dict[str, str]:
    """The environment without anything that would point at the repository or at AWS."""
    drop = ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    for name in list(env):
        if name.startswith("AWS_ENDPOINT_URL"):
            del env[name]
    return env


def _run(cmd: list[str], cwd: Path, timeout: float = RUN_TIMEOUT) -> str:
    proc = subprocess.run(
        cmd, cwd=cwd, env=_clean_env(), capture_output=True, text=True, timeout=timeout
    )
    assert proc.returncode == 0, (
        f"{' '.join(cmd)} exited {proc.returncode}\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    )
    return proc.stdout


@pytest.fixture(scope="module")
def dists(tmp_path_factory: pytest.TempPathFactory) -> Dists:
    """An sdist of a copy of the tree, and the wheel built *from that sdist* (``build``'s
    default), so a file the sdist forgets makes the wheel fail or lack it."""
    base = tmp_path_factory.mktemp("dists")
    src = base / "src"
    shutil.copytree(ROOT, src, ignore=_NOT_SOURCE)
    out = base / "out"
    cmd = [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(src)]
    proc = subprocess.run(
        cmd, cwd=base, env=_clean_env(), capture_output=True, text=True, timeout=BUILD_TIMEOUT
    )
    assert proc.returncode == 0, f"{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    (sdist,) = out.glob("*.tar.gz")
    (wheel,) = out.glob("*.whl")
    return Dists(sdist, wheel, proc.stdout + proc.stderr)


@pytest.fixture(scope="module")
def installed(dists: Dists, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    """A fresh virtualenv holding the wheel with the ``local`` extra (not ``async``)."""
    base = tmp_path_factory.mktemp("venv")
    venv = base / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=base)
    python = venv / "bin" / "python"
    # This environment's pip drives the new interpreter (no second pip to bootstrap).
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "--quiet",
            "--disable-pip-version-check",
            # Bytecode is written on first import anyway; compiling all of botocore
            # at install time was a quarter of the install's CPU time.
            "--no-compile",
            "--constraint",
            str(ROOT / "constraints.txt"),
            f"{dists.wheel}[local]",
        ],
        cwd=base,
        timeout=BUILD_TIMEOUT,
    )
    workdir = base / "work"
    workdir.mkdir()
    yield Installed(venv, python, workdir)


def test_the_wheel_ships_every_module_of_the_package_and_nothing_else(dists: Dists) -> None:
    with zipfile.ZipFile(dists.wheel) as whl:
        names = set(whl.namelist())
    shipped = {n for n in names if n.startswith("sqs_lease/")}
    missing = sorted(_package_files() - shipped)
    assert not missing, f"the wheel lacks {missing}"
    tops = {n.split("/", 1)[0] for n in names}
    assert tops == {"sqs_lease", f"sqs_lease-{_version()}.dist-info"}


def test_the_wheel_leaves_the_simulators_tooling_out(dists: Dists) -> None:
    # Soak, replay and the mutations are the project's tools (simtools/), not the users'.
    with zipfile.ZipFile(dists.wheel) as whl:
        names = set(whl.namelist())
    tooling = sorted(n for n in names if n.rsplit("/", 1)[-1] in ("mutations.py", "cli.py"))
    assert tooling == ["sqs_lease/cli.py"], tooling
    assert "sqs_lease/testing/__init__.py" in names  # the users' testing kit is shipped
    # The simulator is the testing kit's (simulate/replay), not the runtime's (issue 28).
    assert "sqs_lease/testing/_sim/world.py" in names
    assert not [n for n in names if n.startswith("sqs_lease/_sim/")]


def test_the_wheel_declares_ranges_and_keeps_aiobotocore_and_moto_in_extras(
    dists: Dists,
) -> None:
    with zipfile.ZipFile(dists.wheel) as whl:
        meta = whl.read(f"sqs_lease-{_version()}.dist-info/METADATA").decode()
    requires = [
        line.split(":", 1)[1].strip()
        for line in meta.splitlines()
        if line.startswith("Requires-Dist:")
    ]
    core = [r for r in requires if "extra ==" not in r]
    assert core, meta
    assert not [r for r in core if "==" in r], f"exact pins in the dependencies: {core}"
    assert not [r for r in core if r.startswith(("aiobotocore", "moto"))], core
    assert [r for r in requires if r.startswith("aiobotocore") and 'extra == "async"' in r]
    assert [r for r in requires if r.startswith("moto") and 'extra == "local"' in r]


def test_the_wheel_offers_the_testing_kit_to_pytest_as_a_plugin(dists: Dists) -> None:
    # An installed package gives pytest its fixtures with no `-p` and no conftest line.
    with zipfile.ZipFile(dists.wheel) as whl:
        text = whl.read(f"sqs_lease-{_version()}.dist-info/entry_points.txt").decode()
    section = text.split("[pytest11]", 1)[1].split("[", 1)[0]
    plugins = [line.replace(" ", "") for line in section.splitlines() if line.strip()]
    assert plugins == ["sqs_lease.testing.pytest_plugin=sqs_lease.testing.pytest_plugin"], text


def test_the_sdist_holds_what_the_wheel_is_built_from(dists: Dists) -> None:
    with tarfile.open(dists.sdist) as tar:
        names = {m.name.split("/", 1)[1] for m in tar.getmembers() if "/" in m.name}
    wanted = _package_files() | {"pyproject.toml", "README.md"}
    missing = sorted(wanted - names)
    assert not missing, f"the sdist lacks {missing}"


def test_the_sdist_ships_the_license_and_no_tests_that_import_what_it_lacks(
    dists: Dists,
) -> None:
    # Issue 27: the sdist carried tests/ (they import simtools, examples, cdk: not in it).
    with tarfile.open(dists.sdist) as tar:
        names = {m.name.split("/", 1)[1] for m in tar.getmembers() if "/" in m.name}
    assert "LICENSE" in names
    assert not [n for n in names if n.startswith("tests/")]
    tops = {n.split("/", 1)[0] for n in names}
    assert tops <= {"sqs_lease", "sqs_lease.egg-info", "LICENSE", "README.md", "MANIFEST.in",
                    "pyproject.toml", "setup.cfg", "PKG-INFO"}, tops  # fmt: skip


def test_the_build_warns_of_nothing_and_the_wheel_carries_the_license(dists: Dists) -> None:
    # A license table in pyproject.toml gave setuptools' deprecation warning at each build.
    assert "deprecat" not in dists.log.lower(), dists.log[-3000:]
    warned = [
        line
        for line in dists.log.splitlines()
        if "warning" in line.lower() and "byte-compiling is disabled" not in line
    ]  # (PYTHONDONTWRITEBYTECODE turns byte-compiling off: that one is no defect)
    assert warned == [], warned
    with zipfile.ZipFile(dists.wheel) as whl:
        meta = whl.read(f"sqs_lease-{_version()}.dist-info/METADATA").decode()
        names = set(whl.namelist())
    assert "License-Expression: Apache-2.0" in meta.splitlines()
    assert f"sqs_lease-{_version()}.dist-info/licenses/LICENSE" in names


def test_the_installed_package_imports_from_the_venv_without_aiobotocore(
    installed: Installed,
) -> None:
    script = textwrap.dedent(
        """
        import asyncio, importlib, importlib.util, json, pkgutil, sys
        import sqs_lease
        imported = []
        for info in pkgutil.walk_packages(sqs_lease.__path__, "sqs_lease."):
            if not info.name.endswith("__main__"):
                importlib.import_module(info.name)
                imported.append(info.name)
        for name in sys.argv[1:]:
            importlib.import_module(name)
        from sqs_lease import Settings
        from sqs_lease._aio import AsyncDriver
        try:
            asyncio.run(AsyncDriver(Settings()).__aenter__())
            aio_error = None
        except sqs_lease.ConfigError as exc:
            aio_error = str(exc)
        print(json.dumps({
            "file": sqs_lease.__file__,
            "modules": imported,
            "aiobotocore": importlib.util.find_spec("aiobotocore") is not None,
            "aio_error": aio_error,
        }))
        """
    )
    cmd = [str(installed.python), "-I", "-c", script, *PUBLIC_MODULES]
    out = json.loads(_run(cmd, cwd=installed.workdir))
    assert Path(out["file"]).resolve().is_relative_to(installed.venv.resolve()), out["file"]
    assert not Path(out["file"]).resolve().is_relative_to(ROOT)
    expected = {
        "sqs_lease." + p.relative_to(PACKAGE).with_suffix("").as_posix().replace("/", ".")
        for p in PACKAGE.rglob("*.py")
    }
    expected = {m.removesuffix(".__init__") for m in expected if not m.endswith("__main__")}
    assert expected - {"sqs_lease"} <= set(out["modules"])
    assert out["aiobotocore"] is False
    assert out["aio_error"] is not None and "sqs-lease[async]" in out["aio_error"]


def test_the_installed_command_reports_the_package_version(installed: Installed) -> None:
    out = _run([str(installed.venv / "bin" / "sqs-lease"), "--version"], cwd=installed.workdir)
    assert out.strip() == f"sqs-lease {_version()}"


def test_one_job_runs_end_to_end_on_the_embedded_emulator_from_the_installed_package(
    installed: Installed,
) -> None:
    (installed.workdir / "wheel_app.py").write_text(
        textwrap.dedent(
            """
            from pydantic import BaseModel
            from sqs_lease import App, JobContext

            app = App()
            ran: list[str] = []

            class Echo(BaseModel):
                text: str

            @app.job("echo", payload=Echo, lease_seconds=10, heartbeat_seconds=2)
            def echo(ctx: JobContext[Echo], p: Echo) -> dict[str, str]:
                ran.append(ctx.job_id)
                return {"echo": p.text}
            """
        )
    )
    script = textwrap.dedent(
        """
        import json, sys
        sys.path.insert(0, ".")  # the app module next to this script, as a user runs it
        import boto3
        import sqs_lease
        from sqs_lease import Producer, Settings, Worker, create_queue, create_tables
        from sqs_lease._local import LocalAws
        from wheel_app import app, ran

        with LocalAws() as local:
            settings = Settings(endpoint_url=local.endpoint_url, prefix="wheel")
            create_tables(settings)
            create_queue(settings)
            Producer(settings, app).submit("echo", {"text": "hi"}, job_id="wheel-1")
            stats = Worker(app, settings, receive_wait=1).run(idle_exit=1)
            ddb = boto3.client(
                "dynamodb", endpoint_url=local.endpoint_url, region_name="us-east-1",
                aws_access_key_id="testing", aws_secret_access_key="testing",
            )
            item = ddb.get_item(TableName=settings.jobs_table, Key={"job_id": {"S": "wheel-1"}})
        print(json.dumps({
            "file": sqs_lease.__file__,
            "committed": stats.committed,
            "ran": ran,
            "state": item["Item"]["state"]["S"],
        }))
        """
    )
    lines = _run([str(installed.python), "-I", "-c", script], cwd=installed.workdir)
    out = json.loads(lines.strip().splitlines()[-1])
    assert Path(out["file"]).resolve().is_relative_to(installed.venv.resolve())
    assert out["ran"] == ["wheel-1"]
    assert out["committed"] == 1
    assert out["state"] == "succeeded"
