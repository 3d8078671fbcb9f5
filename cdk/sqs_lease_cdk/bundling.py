"""The Lambda asset: sqs-lease and its dependencies built for the function, no Docker.

``lambda_code(handlers, runtime=..., architecture=...)`` gives a ``lambda_.Code``
whose asset is built at synth on this machine by pip: the library and its
dependencies installed for the function's Python version and platform
(``pip install --target --platform manylinux2014_<arch> --python-version X.Y
--implementation cp --only-binary=:all:``, pinned by ``constraints`` when given),
and the job module(s) of ``handlers`` copied beside them. Built for the local
interpreter instead, a native wheel (``pydantic_core``) would not import on the
function (issue 27: cp311 wheels on a python3.14 runtime).

Where the library comes from: the distribution this synth runs with. Installed from
a directory (a clone, editable or not) or a wheel file, that source is built into the
asset; installed from an index, the same version is fetched (``sqs-lease==X``).
``library`` overrides it (a path, a wheel, or a requirement).

After pip, :func:`check_native_code` reads every native file of the bundle (each
wheel's tags and each shared object's ELF header) against the runtime and
architecture, and refuses a bundle that would not load. Bundling needs the package
registry; a pip that fails raises :class:`BundlingError` with pip's last lines.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import jsii
from aws_cdk import AssetHashType, BundlingOptions, DockerImage, ILocalBundling
from aws_cdk import aws_lambda as lambda_

from sqs_lease import ConfigError

LIBRARY = "sqs-lease"
DEFAULT_EXTRAS = ("metrics",)
"""The library's extras in the asset: ``metrics``, for the EMF metrics the
``LambdaConsumer`` turns on (``SQS_LEASE_METRICS``)."""

# ELF e_machine of each Lambda architecture (the bundle's shared objects must match).
_ELF_MACHINE = {"x86_64": 0x3E, "aarch64": 0xB7}
# The newest manylinux glibc every Lambda Python runtime has (Amazon Linux 2: 2.26):
# AWS's own recipe asks pip for manylinux2014 (glibc 2.17) wheels.
PLATFORM_GLIBC = (2, 17)


class BundlingError(ConfigError):
    """The Lambda asset could not be built (pip failed, or a native file does not fit
    the function's runtime or architecture); the message names what and the fix."""


@dataclass(frozen=True)
class Target:
    """What the asset is built for: the function's Python (``3.14``) and machine."""

    python: str
    machine: str  # x86_64 or aarch64

    @property
    def platform(self) -> str:
        return f"manylinux2014_{self.machine}"

    @property
    def cp(self) -> str:
        return "cp" + self.python.replace(".", "")


def target_of(runtime: lambda_.Runtime, architecture: lambda_.Architecture) -> Target:
    """The pip target of a Lambda runtime (``python3.X`` only) and architecture."""
    name = str(runtime.name)
    if not name.startswith("python3."):
        raise ConfigError(
            f"runtime={name}: the bundled asset is built for a Python runtime "
            "(lambda_.Runtime.PYTHON_3_X); give one, or pass code= built otherwise"
        )
    arch = str(architecture.name)
    machine = {"x86_64": "x86_64", "arm64": "aarch64"}.get(arch)
    if machine is None:
        raise ConfigError(f"architecture={arch}: give Architecture.X86_64 or Architecture.ARM_64")
    return Target(python=name.removeprefix("python"), machine=machine)


def library_source(library: str | Path | None = None) -> str:
    """What pip installs for the library: ``library`` when given; else the source tree
    the imported ``sqs_lease`` lives in (a clone, installed editable or run in place);
    else the directory or wheel it was installed from (PEP 610's ``direct_url.json``);
    else ``sqs-lease==VERSION`` from the index. Extras are added by the caller."""
    if library is not None:
        return str(library)
    import sqs_lease

    tree = Path(sqs_lease.__file__).resolve().parent.parent
    pyproject = tree / "pyproject.toml"
    if pyproject.is_file() and f'name = "{LIBRARY}"' in pyproject.read_text(encoding="utf-8"):
        return str(tree)
    version = metadata.version(LIBRARY)
    for dist in metadata.distributions(name=LIBRARY):
        direct = dist.read_text("direct_url.json")
        if not direct:
            continue
        url = urlparse(str(json.loads(direct).get("url", "")))
        path = Path(unquote(url.path))
        if url.scheme == "file" and path.exists():
            return str(path)
    return f"{LIBRARY}=={version}"


def _with_extras(source: str, extras: Sequence[str]) -> str:
    if not extras:
        return source
    named = f"[{','.join(extras)}]"
    if source.startswith(f"{LIBRARY}=="):
        return source.replace("==", f"{named}==", 1)
    return source + named


def _pip(args: Sequence[str], what: str) -> None:
    cmd = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input", *args]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-12:])
        raise BundlingError(
            f"Lambda asset: {what} failed (pip exit {done.returncode}); bundling needs the "
            f"package registry (or your pip's configured index).\n$ {' '.join(cmd)}\n{tail}"
        )


def build_bundle(
    out: Path,
    handlers: Path,
    target: Target,
    *,
    library: str | Path | None = None,
    extras: Sequence[str] = DEFAULT_EXTRAS,
    requirements: Sequence[str] = (),
    constraints: Path | None = None,
) -> None:
    """Fill ``out`` with the library, its dependencies and ``requirements`` for
    ``target``, and the files of ``handlers`` (the job modules) beside them."""
    source = library_source(library)
    pins = ["--constraint", str(constraints)] if constraints is not None else []
    with tempfile.TemporaryDirectory(prefix="sqs-lease-wheel-") as tmp:
        if Path(source).exists() and not source.endswith(".whl"):
            # A directory (a clone): built into a wheel first, the one form pip installs
            # for another platform (the library is pure Python). Built from a copy: two
            # synths at once would share the tree's build/ directory and fail.
            tree = Path(tmp) / "tree"
            shutil.copytree(source, tree, ignore=_NOT_SOURCE)
            _pip(
                ["wheel", "--no-deps", "--quiet", "--wheel-dir", tmp, str(tree)],
                "building sqs-lease",
            )
            (wheel,) = Path(tmp).glob("*.whl")
            source = str(wheel)
        spec = _with_extras(source, extras)
        _pip(
            [
                "install",
                "--quiet",
                "--no-warn-conflicts",
                "--no-compile",  # by pip's interpreter: precompile() uses the target's
                "--target",
                str(out),
                "--platform",
                target.platform,
                "--python-version",
                target.python,
                "--implementation",
                "cp",
                "--only-binary=:all:",
                *pins,
                spec,
                *requirements,
            ],
            f"installing sqs-lease for {target.cp} {target.platform}",
        )
    # pip's console scripts name the synth's interpreter: of no use on the function.
    shutil.rmtree(out / "bin", ignore_errors=True)
    for path in sorted(handlers.iterdir()):
        if path.name == "__pycache__" or path.name.startswith("."):
            continue
        dest = out / path.name
        if dest.exists():
            raise BundlingError(
                f"handlers: {path.name} would replace a module of the bundled dependencies; "
                "rename it"
            )
        if path.is_dir():
            shutil.copytree(path, dest, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(path, dest)
    check_native_code(out, target)
    missing = precompile(out, target)
    if missing is not None:
        warnings.warn(missing, BundlingWarning, stacklevel=2)


_NOT_SOURCE = shutil.ignore_patterns(
    ".git", ".venv", "build", "dist", "cdk.out", ".demo", "__pycache__", "*.egg-info"
)


LAMBDA_TASK_ROOT = "/var/task"
"""Where Lambda unpacks a function's code (``LAMBDA_TASK_ROOT``): the paths the
bytecode names, so a traceback on the function shows the function's own files."""


class BundlingWarning(UserWarning):
    """The asset was built, but not as well as it could be (e.g. no bytecode)."""


def precompile(root: Path, target: Target) -> str | None:
    """Compile every module of the bundle to bytecode for the function's Python. The
    function's code directory is read-only, so a module shipped without its bytecode
    is compiled again at every cold start: ``import sqs_lease.aws_lambda`` took 3.3x
    the CPU without any bytecode (1.89 s against 0.57 s, farm-bench medians of 7). The
    bytecode is checked by nobody against its source (``unchecked-hash``): an asset's
    files never change after the build, and a zip may not keep their times. Compiled by
    an interpreter of the target's version: this one, or ``python3.X`` on the PATH.
    Returns why it could not (the asset then works, compiling at each cold start)."""
    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    python = sys.executable if here == target.python else shutil.which(f"python{target.python}")
    if python is None:
        return (
            f"the Lambda asset for python{target.python} ships without bytecode: this synth "
            f"runs Python {here} and no python{target.python} is on the PATH, so every cold "
            f"start compiles the modules it imports (about 1.3 s of CPU); synthesize with "
            f"Python {target.python}, or put python{target.python} on the PATH"
        )
    # The bytecode goes beside its source (__pycache__), where the function looks: a
    # PYTHONPYCACHEPREFIX of the synth's environment would send it elsewhere.
    env = {k: v for k, v in os.environ.items() if k not in _BYTECODE_VARIABLES}
    # check=False: a file no interpreter of that version compiles (a dependency's test
    # data) fails alone; compileall goes on with the rest, and no function imports it.
    subprocess.run(
        [python, "-m", "compileall", "-qq", "-j", "0", "--invalidation-mode", "unchecked-hash",
         "-d", LAMBDA_TASK_ROOT, str(root)],
        capture_output=True, check=False, env=env,
    )  # fmt: skip
    return None


_BYTECODE_VARIABLES = ("PYTHONPYCACHEPREFIX", "PYTHONDONTWRITEBYTECODE")


def _tag_fits(tag: str, target: Target) -> bool:
    """Whether one wheel tag (``cp314-cp314-manylinux_2_17_x86_64``) loads on ``target``."""
    python, abi, platform = tag.split("-")
    if abi == "none" and platform == "any":
        return True
    if abi == "abi3":
        version = python.removeprefix("cp")
        ok_python = python.startswith("cp3") and int(version[1:]) <= int(target.cp[3:])
    else:
        ok_python = python == target.cp and abi in (target.cp, "none")
    if not ok_python:
        return False
    for prefix, glibc in (("manylinux2014_", (2, 17)), ("manylinux2010_", (2, 12))):
        if platform == prefix + target.machine:
            return glibc <= PLATFORM_GLIBC
    parts = platform.split("_", 3)
    if len(parts) == 4 and parts[0] == "manylinux" and parts[3] == target.machine:
        return (int(parts[1]), int(parts[2])) <= PLATFORM_GLIBC
    return False


def check_native_code(root: Path, target: Target) -> list[str]:
    """Refuse a bundle with native code the function cannot load: every installed
    wheel that is not pure must carry a tag for ``target``, and every shared object
    must be an ELF file of its machine. Returns the native wheels' names."""
    wrong: list[str] = []
    native: list[str] = []
    for wheel_file in sorted(root.glob("*.dist-info/WHEEL")):
        fields = [line.split(":", 1) for line in wheel_file.read_text().splitlines()]
        tags = [v.strip() for k, v in (f for f in fields if len(f) == 2) if k == "Tag"]
        if all(t.endswith("-none-any") for t in tags):
            continue
        native.append(wheel_file.parent.name)
        if not any(_tag_fits(t, target) for t in tags):
            wrong.append(f"{wheel_file.parent.name} ({', '.join(tags)})")
    for so in sorted(root.rglob("*.so*")):
        if not so.is_file() or not (so.suffix == ".so" or ".so." in so.name):
            continue
        head = so.read_bytes()[:20]
        machine = int.from_bytes(head[18:20], "little") if head[:4] == b"\x7fELF" else None
        if machine != _ELF_MACHINE[target.machine]:
            wrong.append(f"{so.relative_to(root)} (ELF machine {machine})")
        elif so.name.count(".cpython-") and f".cpython-{target.cp[2:]}-" not in so.name:
            wrong.append(f"{so.relative_to(root)} (not for {target.cp})")
    if wrong:
        raise BundlingError(
            f"Lambda asset for {target.cp} {target.platform}: native code that cannot load "
            f"there: {'; '.join(wrong)}; pin versions that publish wheels for this runtime "
            "or choose the runtime those wheels are for"
        )
    return native


@jsii.implements(ILocalBundling)
class _PipBundling:
    """CDK's local bundling: runs at synth instead of a Docker container."""

    def __init__(self, build: dict[str, Any]) -> None:
        self._build = build

    def try_bundle(self, output_dir: str, *args: Any, **kwargs: Any) -> bool:
        build_bundle(Path(output_dir), **self._build)
        return True


def lambda_code(
    handlers: Path,
    *,
    runtime: lambda_.Runtime,
    architecture: lambda_.Architecture,
    library: str | Path | None = None,
    extras: Sequence[str] = DEFAULT_EXTRAS,
    requirements: Sequence[str] = (),
    constraints: Path | None = None,
) -> lambda_.Code:
    """The function's code: ``handlers`` (a directory holding the job module) with
    the library and its dependencies built for ``runtime`` and ``architecture``. The
    asset's hash is its content's: a new library version is a new asset."""
    handlers = Path(handlers)
    if not handlers.is_dir():
        raise ConfigError(f"handlers={handlers}: give the directory holding the job module")
    if constraints is not None and not Path(constraints).is_file():
        raise ConfigError(f"constraints={constraints}: no such file")
    target = target_of(runtime, architecture)
    build: dict[str, Any] = {
        "handlers": handlers,
        "target": target,
        "library": library,
        "extras": tuple(extras),
        "requirements": tuple(requirements),
        "constraints": Path(constraints) if constraints is not None else None,
    }
    return lambda_.Code.from_asset(
        str(handlers),
        asset_hash_type=AssetHashType.OUTPUT,
        bundling=BundlingOptions(
            # Never run: local bundling always answers (or raises). CDK requires an image.
            image=DockerImage.from_registry(f"public.ecr.aws/sam/build-{runtime.name}"),
            local=_PipBundling(build),
        ),
    )


__all__ = [
    "DEFAULT_EXTRAS",
    "BundlingError",
    "Target",
    "build_bundle",
    "check_native_code",
    "lambda_code",
    "library_source",
    "target_of",
]
