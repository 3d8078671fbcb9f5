"""The Lambda asset the example stack synthesises, unpacked and run (issue 27, 1, 2, 8).

The asset is built at synth by pip, no Docker (``sqs_lease_cdk.bundling``): the
library and its dependencies for the function's runtime and architecture, the job
module beside them. These tests synthesise the example twice: with its default
runtime (python3.14: its native wheels are checked against it; no python3.14 is on
this machine to import it, so that check stands alone) and with python3.11, whose
asset is imported, and its handler run, by this machine's 3.11 in a separate process
that sees nothing but the unpacked asset and the standard library.

Bundling needs the package registry: when it cannot be reached (checked by asking
pip for one small package) the tests that bundle are skipped, saying so; any other
failure fails them.
"""

from __future__ import annotations

import json
import marshal
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")

import aws_cdk as cdk
from aws_cdk import aws_lambda as lambda_
from cdk_example import load_example

from sqs_lease import App, ConfigError, JobClassError, NextStage, Producer, Settings
from sqs_lease.deploy import check_lambda_fit
from sqs_lease_cdk import (
    LAMBDA_HANDLER,
    BundlingError,
    LambdaConsumer,
    LeasedQueue,
    LeaseTables,
    check_native_code,
)
from sqs_lease_cdk.bundling import LAMBDA_TASK_ROOT, Target, precompile

ROOT = Path(__file__).resolve().parent.parent
CDK_DIR = ROOT / "cdk"
RUNNER = Path(__file__).resolve().parent / "lambda_asset_runner.py"

# One xdist worker builds each asset once (pip and jsii: tens of CPU-seconds).
pytestmark = pytest.mark.xdist_group("lambda_asset")
PREFIX = f"t{uuid.uuid4().hex[:10]}"
Json = dict[str, Any]


EXAMPLE = load_example("cdk_asset_example_app")


def _registry_unreachable() -> str | None:
    """Why pip cannot reach the package registry, or None when it can."""
    with_tmp = Path(os.environ.get("TMPDIR", "/tmp")) / f"probe-{uuid.uuid4().hex}"
    try:
        done = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--no-cache-dir",
             "--disable-pip-version-check", "--dest", str(with_tmp), "six"],
            capture_output=True, text=True, check=False, timeout=300,
        )  # fmt: skip
    finally:
        shutil.rmtree(with_tmp, ignore_errors=True)
    if done.returncode == 0:
        return None
    return (done.stderr or done.stdout).strip().splitlines()[-1:][0][:300]


class Synth:
    """One synthesis of the example: its template and its cloud assembly directory."""

    def __init__(self, outdir: Path, runtime: str | None) -> None:
        app = cdk.App(outdir=str(outdir))
        stack = EXAMPLE.ExampleStack(app, "Asset", prefix=PREFIX, lambda_runtime=runtime)
        assembly = app.synth()
        self.outdir = Path(assembly.directory)
        loaded: Json = json.loads((self.outdir / stack.template_file).read_text(encoding="utf-8"))
        self.template = loaded
        self.stack = stack

    def consumer(self) -> Json:
        fns: list[Json] = [
            r["Properties"]
            for r in self.template["Resources"].values()
            if r["Type"] == "AWS::Lambda::Function" and r["Properties"]["Handler"] == LAMBDA_HANDLER
        ]
        (fn,) = fns
        return fn

    def unpack(self, into: Path) -> Path:
        """The consumer's asset as Lambda gets it: zipped (as the CLI publishes a
        directory asset), then unpacked into ``into``."""
        key = self.consumer()["Code"]["S3Key"]
        source = self.outdir / f"asset.{key.removesuffix('.zip')}"
        assert source.is_dir(), f"no asset directory for {key}"
        archive = shutil.make_archive(str(into / "asset"), "zip", source)
        shutil.unpack_archive(archive, into / "unpacked")
        return into / "unpacked"


def _synth(tmp: pytest.TempPathFactory, runtime: str | None) -> Synth:
    try:
        return Synth(tmp.mktemp("cdk.out"), runtime)
    except Exception as e:  # jsii hands the bundling error back as its own
        if "Lambda asset" not in str(e):
            raise
        why = _registry_unreachable()
        if why is not None:
            pytest.skip(f"the package registry cannot be reached ({why}): the asset is not built")
        raise


@pytest.fixture(scope="module")
def default_synth(tmp_path_factory: pytest.TempPathFactory) -> Synth:
    return _synth(tmp_path_factory, None)


@pytest.fixture(scope="module")
def py311_synth(tmp_path_factory: pytest.TempPathFactory) -> Synth:
    return _synth(tmp_path_factory, "python3.11")


def _native_by_name(root: Path, cp: str, machine: str) -> list[str]:
    """Every extension module's file name against the runtime, read independently of
    ``check_native_code``: CPython names them ``NAME.cpython-3XY-ARCH-linux-gnu.so``."""
    wrong = []
    for so in root.rglob("*.so"):
        name = so.name
        if ".cpython-" in name and not name.endswith(f".cpython-{cp[2:]}-{machine}-linux-gnu.so"):
            wrong.append(str(so.relative_to(root)))
        elif ".cpython-" not in name and ".abi3." not in name:
            with so.open("rb") as f:
                head = f.read(20)
            want = {"x86_64": 0x3E, "aarch64": 0xB7}[machine]
            if head[:4] != b"\x7fELF" or int.from_bytes(head[18:20], "little") != want:
                wrong.append(str(so.relative_to(root)))
    return wrong


# ------------------------------------------------------------------ item 1: the asset


def test_the_default_asset_holds_the_library_the_job_module_and_wheels_for_its_runtime(
    default_synth: Synth, tmp_path: Path
) -> None:
    fn = default_synth.consumer()
    assert (fn["Runtime"], fn.get("Architectures", ["x86_64"])) == ("python3.14", ["x86_64"])
    root = default_synth.unpack(tmp_path)
    assert (root / "sqs_lease" / "aws_lambda.py").is_file()
    assert (root / "example_jobs.py").is_file()
    assert (root / "aws_embedded_metrics").is_dir()  # the metrics the function turns on
    native = check_native_code(root, Target("3.14", "x86_64"))
    assert any(n.startswith("pydantic_core-") for n in native), native
    assert _native_by_name(root, "cp314", "x86_64") == []
    assert list(root.rglob("*.cpython-314-x86_64-linux-gnu.so"))
    assert not list(root.rglob("*.cpython-311-*.so"))  # not the synth's own interpreter


def test_the_default_asset_imports_with_a_python_of_its_runtime_where_one_exists(
    default_synth: Synth, tmp_path: Path
) -> None:
    python = shutil.which("python3.14")
    if python is None:
        pytest.skip(
            "no python3.14 on this machine: the asset's ABI check (the test above) stands "
            "for it; the python3.11 asset is imported and run below"
        )
    _import_handler(python, default_synth.unpack(tmp_path))


def _import_handler(python: str, root: Path) -> None:
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]);"
        "import sqs_lease.aws_lambda as m, example_jobs, pydantic_core._pydantic_core as c;"
        "assert m.entry and example_jobs.app;"
        "assert all(x.__file__.startswith(sys.argv[1]) for x in (m, example_jobs, c))"
    )
    done = subprocess.run(
        [python, "-I", "-S", "-c", code, str(root)],
        capture_output=True, text=True, check=False, cwd=root.parent, env={"PATH": "/usr/bin"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr


def test_a_python311_asset_imports_its_handler_from_the_asset_alone(
    py311_synth: Synth, tmp_path: Path
) -> None:
    assert py311_synth.consumer()["Runtime"] == "python3.11"
    root = py311_synth.unpack(tmp_path)
    check_native_code(root, Target("3.11", "x86_64"))
    assert _native_by_name(root, "cp311", "x86_64") == []
    assert sys.version_info[:2] == (3, 11)
    # built by this synth's own Python 3.11: every module ships its bytecode
    for module in ("sqs_lease/aws_lambda.py", "botocore/client.py", "pydantic/main.py"):
        _assert_bytecode(root, module, "cpython-311")
    _import_handler(sys.executable, root)


def _assert_bytecode(root: Path, module: str, tag: str) -> None:
    """``module`` has bytecode nobody checks against its source (flags 0b01: hash
    based, unchecked), naming the function's own path for tracebacks."""
    source = root / module
    pyc = source.parent / "__pycache__" / f"{source.stem}.{tag}.pyc"
    assert pyc.is_file(), f"no bytecode for {module}"
    data = pyc.read_bytes()
    assert int.from_bytes(data[4:8], "little") == 0b01, f"{module}: not unchecked-hash"
    code = marshal.loads(data[16:])
    assert code.co_filename == f"{LAMBDA_TASK_ROOT}/{module}"


def test_precompile_writes_the_targets_bytecode_or_says_why_it_cannot(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "mod.py").write_text("X = 1\n", encoding="utf-8")
    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    assert precompile(tmp_path, Target(here, "x86_64")) is None
    _assert_bytecode(tmp_path, "pkg/mod.py", sys.implementation.cache_tag)
    why = precompile(tmp_path / "pkg", Target("3.99", "x86_64"))
    assert why is not None and "python3.99" in why and "every cold start" in why


def _fake_dist(root: Path, name: str, tag: str, so: str | None, machine: int) -> None:
    info = root / f"{name}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "WHEEL").write_text(f"Wheel-Version: 1.0\nRoot-Is-Purelib: false\nTag: {tag}\n")
    if so is not None:
        (root / name).mkdir()
        header = b"\x7fELF" + bytes(14) + machine.to_bytes(2, "little")
        (root / name / so).write_bytes(header)


@pytest.mark.parametrize(
    ("tag", "so", "machine"),
    [
        ("cp311-cp311-manylinux_2_17_x86_64", "_c.cpython-311-x86_64-linux-gnu.so", 0x3E),
        ("cp314-cp314-manylinux_2_17_aarch64", "_c.cpython-314-aarch64-linux-gnu.so", 0xB7),
        ("cp314-cp314-manylinux_2_34_x86_64", "_c.cpython-314-x86_64-linux-gnu.so", 0x3E),
        ("cp314-cp314-macosx_11_0_arm64", "_c.cpython-314-darwin.so", 0xB7),
        ("cp314-cp314-manylinux_2_17_x86_64", "_c.cpython-314-x86_64-linux-gnu.so", 0xB7),
    ],
)
def test_native_code_for_another_runtime_or_machine_is_refused_by_name(
    tmp_path: Path, tag: str, so: str, machine: int
) -> None:
    _fake_dist(tmp_path, "fits", "cp314-cp314-manylinux2014_x86_64", None, 0x3E)
    _fake_dist(tmp_path, "native", tag, so, machine)
    with pytest.raises(BundlingError, match=r"native-1\.0\.dist-info|native/_c"):
        check_native_code(tmp_path, Target("3.14", "x86_64"))


def test_native_code_for_the_runtime_passes_and_is_listed(tmp_path: Path) -> None:
    _fake_dist(tmp_path, "pure", "py3-none-any", None, 0)
    _fake_dist(
        tmp_path, "native", "cp314-cp314-manylinux2014_x86_64",
        "_c.cpython-314-x86_64-linux-gnu.so", 0x3E,
    )  # fmt: skip
    _fake_dist(tmp_path, "stable", "cp39-abi3-manylinux_2_17_x86_64", "_s.abi3.so", 0x3E)
    assert check_native_code(tmp_path, Target("3.14", "x86_64")) == [
        "native-1.0.dist-info",
        "stable-1.0.dist-info",
    ]


def test_a_consumer_takes_code_or_handlers_not_both_nor_neither() -> None:
    app = cdk.App()
    stack = cdk.Stack(app, "S")
    queue, tables = _queue(stack, _fitting_app(), 300)
    for kwargs in ({}, {"code": lambda_.Code.from_inline("x"), "handlers": CDK_DIR}):
        with pytest.raises(ConfigError, match="code / handlers: give exactly one"):
            LambdaConsumer(stack, "C", queue=queue, tables=tables, app_ref="m:app", **kwargs)


# ------------------------------------------------------------------ item 2: classes that fit


def _fitting_app() -> App:
    app = App()
    app.job("quick", payload=_Work, lease_seconds=30, stage_budget_seconds=120.0)(lambda ctx, p: {})
    return app


class _Work(BaseModel):
    n: int = 0


def _queue(stack: cdk.Stack, app: App, timeout: int) -> tuple[LeasedQueue, LeaseTables]:
    queue = LeasedQueue(
        stack, f"Q{uuid.uuid4().hex[:6]}", job_classes=app, prefix="fit",
        lambda_timeout=cdk.Duration.seconds(timeout),
    )  # fmt: skip
    return queue, LeaseTables(stack, f"T{uuid.uuid4().hex[:6]}", prefix="fit")


def test_a_lambda_consumer_refuses_a_class_or_stage_that_can_never_start_naming_the_numbers() -> (
    None
):
    app = _fitting_app()
    app.job("ocr", payload=_Work, lease_seconds=60)(lambda ctx, p: {})  # budget: 3600 s
    report = app.staged("report", payload=_Work, lease_seconds=30, stage_budget_seconds=200.0)
    report.stage("fetch")(lambda ctx, p: NextStage("render", p))
    report.stage("render", payload=_Work, lease_seconds=90, stage_budget_seconds=600.0)(
        lambda ctx, p: {}
    )
    stack = cdk.Stack(cdk.App(), "S")
    queue, tables = _queue(stack, app, 300)
    with pytest.raises(JobClassError) as refused:
        LambdaConsumer(
            stack, "C", queue=queue, tables=tables, app_ref="m:app",
            code=lambda_.Code.from_inline("x"),
        )  # fmt: skip
    text = str(refused.value)
    assert "ocr: stage_budget_seconds 3600 s (lease 60 s)" in text
    assert "report/render: stage_budget_seconds 600 s (lease 90 s)" in text
    assert "function timeout is 300 s" in text and "at most 297 s" in text
    assert "quick" not in text and "report/fetch" not in text
    # Nothing was built: the refusal comes before the function.
    assert not [c for c in stack.node.find_all() if isinstance(c, lambda_.Function)]


def test_a_stage_lease_longer_than_its_jobs_sets_the_queue_visibility() -> None:
    # A rule read from the top-level classes only missed a stage's own lease.
    app = App()
    long = app.staged("long", payload=_Work, lease_seconds=30, stage_budget_seconds=600.0)
    long.stage("first")(lambda ctx, p: NextStage("second", p))
    long.stage("second", payload=_Work, lease_seconds=400, heartbeat_seconds=60.0)(
        lambda ctx, p: {}
    )
    queue = LeasedQueue(cdk.Stack(cdk.App(), "S"), "Q", job_classes=app, prefix="vis")
    assert queue.visibility_timeout_seconds == 400
    assert set(queue.lease_budgets) == {"long/first", "long/second"}


def test_every_example_class_and_stage_starts_within_the_example_function() -> None:
    jobs: App = EXAMPLE.load_jobs()
    budgets = {n: (c.stage_budget_seconds, c.lease_seconds) for n, c in jobs.lease_rules()}
    check_lambda_fit(budgets, int(EXAMPLE.LAMBDA_TIMEOUT.to_seconds()))


# ------------------------------------------------------------------ item 8: deploy-shaped


@pytest.fixture
def deployed(py311_synth: Synth, moto_endpoint: str) -> Iterator[Settings]:
    """The template's queues and tables made on the emulator under its own names."""
    import boto3

    tpl = py311_synth.template
    env = py311_synth.consumer()["Environment"]["Variables"]
    settings = Settings.from_env(
        {"SQS_LEASE_PREFIX": env["SQS_LEASE_PREFIX"], "SQS_LEASE_QUEUE": env["SQS_LEASE_QUEUE"]},
        endpoint_url=moto_endpoint,
    )
    ddb = boto3.client("dynamodb", endpoint_url=moto_endpoint, region_name="us-east-1")
    sqs = boto3.client("sqs", endpoint_url=moto_endpoint, region_name="us-east-1")
    resources = tpl["Resources"].values()
    for props in (r["Properties"] for r in resources if r["Type"] == "AWS::DynamoDB::Table"):
        params: Json = {
            k: props[k] for k in ("TableName", "KeySchema", "AttributeDefinitions", "BillingMode")
        }
        if "GlobalSecondaryIndexes" in props:
            params["GlobalSecondaryIndexes"] = props["GlobalSecondaryIndexes"]
        ddb.create_table(**params)
    queues = {r["Properties"]["QueueName"]: r["Properties"] for r in resources
              if r["Type"] == "AWS::SQS::Queue"}  # fmt: skip
    dlq_url = sqs.create_queue(QueueName=settings.dlq)["QueueUrl"]
    dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq_url, AttributeNames=["QueueArn"])
    main = queues[settings.queue]
    sqs.create_queue(
        QueueName=settings.queue,
        Attributes={
            "VisibilityTimeout": str(main["VisibilityTimeout"]),
            "RedrivePolicy": json.dumps(
                {
                    "deadLetterTargetArn": dlq_arn["Attributes"]["QueueArn"],
                    "maxReceiveCount": str(main["RedrivePolicy"]["maxReceiveCount"]),
                }
            ),
        },
    )
    yield settings


def test_the_unpacked_asset_runs_a_job_of_each_example_class_to_succeeded(
    py311_synth: Synth, deployed: Settings, moto_endpoint: str, tmp_path: Path
) -> None:
    import boto3

    from sqs_lease._schema.job_requests import JobTable
    from sqs_lease._schema.views import view_of

    jobs: App = EXAMPLE.load_jobs()
    payloads: dict[str, Json] = {
        "ocr": {"document": "d-1", "pages": 2},
        "erp_export": {"period": "2026-11"},
    }
    assert set(payloads) == set(jobs.classes)  # every class of the example
    producer = Producer(deployed, jobs)
    for name, payload in payloads.items():
        producer.submit(name, payload, job_id=f"job-{name}")
    sqs = boto3.client("sqs", endpoint_url=moto_endpoint, region_name="us-east-1")
    url = sqs.get_queue_url(QueueName=deployed.queue)["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]
    # The event source mapping's part: receive the messages, hand them over as records.
    received: list[Any] = []
    deadline = time.monotonic() + 60
    while len(received) < len(payloads) and time.monotonic() < deadline:
        got = sqs.receive_message(
            QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1,
            MessageSystemAttributeNames=["All"], MessageAttributeNames=["All"],
        )  # fmt: skip
        received += got.get("Messages", [])
    assert len(received) == len(payloads)
    records = [
        {
            "messageId": m["MessageId"],
            "receiptHandle": m["ReceiptHandle"],
            "body": m["Body"],
            "attributes": m["Attributes"],
            "messageAttributes": m.get("MessageAttributes", {}),
            "md5OfBody": m["MD5OfBody"],
            "eventSource": "aws:sqs",
            "eventSourceARN": arn["QueueArn"],
            "awsRegion": "us-east-1",
        }
        for m in received
    ]
    events = tmp_path / "events.json"
    events.write_text(json.dumps([{"event": {"Records": records}, "remaining_ms": 300_000}]))
    answers = tmp_path / "answers.json"
    root = py311_synth.unpack(tmp_path)
    fn_env = py311_synth.consumer()["Environment"]["Variables"]
    env = {
        **{k: str(v) for k, v in fn_env.items()},
        "AWS_ENDPOINT_URL": moto_endpoint,
        "AWS_ACCESS_KEY_ID": os.environ["AWS_ACCESS_KEY_ID"],
        "AWS_SECRET_ACCESS_KEY": os.environ["AWS_SECRET_ACCESS_KEY"],
        "AWS_REGION": "us-east-1",
        "AWS_DEFAULT_REGION": "us-east-1",
        "NO_PROXY": "127.0.0.1,localhost",
        "LAMBDA_TASK_ROOT": str(root),
    }
    done = subprocess.run(
        [sys.executable, "-I", "-S", str(RUNNER), str(root), fn_env_handler(py311_synth),
         str(events), str(answers)],
        capture_output=True, text=True, check=False, env=env, cwd=tmp_path, timeout=240,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(answers.read_text())
    assert out["foreign"] == [], "loaded from outside the asset and the standard library"
    assert out["answers"] == [{"batchItemFailures": []}]
    ddb = boto3.client("dynamodb", endpoint_url=moto_endpoint, region_name="us-east-1")
    for name in payloads:
        item = ddb.get_item(**JobTable(deployed.jobs_table).get(f"job-{name}").params)["Item"]
        view = view_of(item)
        assert (view.state.value, view.job_class) == ("succeeded", name)
    # Their messages are gone: the handler deleted them with the receipt handles it got.
    attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert attrs["ApproximateNumberOfMessages"] == "0"
    assert attrs["ApproximateNumberOfMessagesNotVisible"] == "0"


def fn_env_handler(synth: Synth) -> str:
    handler: str = synth.consumer()["Handler"]
    return handler
