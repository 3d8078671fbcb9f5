"""One options object for every worker shell: the same bad value is refused the same way.

The thread worker, the async worker and the Lambda shell each checked some of their
options (and the container's ``WorkerEnv`` its own copy with other bounds): a
``shutdown_grace`` of -1 s, a ``tick`` of 0 or a ``receive_visibility`` of 0 reached
a running worker unchecked. ``WorkerOptions`` holds every bound once; each shell
builds one from its keywords and refuses before any AWS call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from pydantic import BaseModel

from sqs_lease import App, AsyncWorker, ConfigError, Settings, Worker
from sqs_lease.aws_lambda import LambdaShell, handler, sweeper

# No AWS answers here: every refusal must come before the first call.
SETTINGS = Settings(endpoint_url="http://127.0.0.1:9", prefix="unused")


class _P(BaseModel):
    n: int


def _app() -> App:
    app = App()
    app.job("c", payload=_P, lease_seconds=30, heartbeat_seconds=5)(lambda ctx, p: {})
    return app


SHELLS: dict[str, Callable[..., Any]] = {
    "thread": lambda **kw: Worker(_app(), SETTINGS, **kw),
    "async": lambda **kw: AsyncWorker(_app(), SETTINGS, **kw),
    "lambda": lambda **kw: LambdaShell(_app(), SETTINGS, **kw),
}

BAD: list[tuple[str, Any, str]] = [
    # (option, bad value, what the refusal says)
    ("tick", 0, "tick=0: give 0 < tick <= 1 second"),
    ("tick", float("nan"), "tick=nan"),
    ("shutdown_grace", -1.0, "shutdown_grace=-1.0: give seconds >= 0"),
    ("receive_visibility", 0, "receive_visibility=0: give 1..43200 seconds"),
    ("receive_wait", 25, "receive_wait=25: SQS long polls 0..20 s"),
    ("receive_window", float("inf"), "receive_window=inf"),
    ("sweep_grace", -1.0, "sweep_grace=-1.0: give seconds >= 0"),
    ("sweep_limit", 0, "sweep_limit=0: choose 1..1000 records per sweep"),
    ("unknown_class_receives", 0, "unknown_class_receives=0: choose 1..1000 receives"),
    ("concurrency", 0, "concurrency=0: choose 1..100000"),
    ("worker_id", "", "worker_id='': give 1..200 characters"),
    ("threads", 0, "threads=0: choose 1..1000 threads"),
    ("timeouts", 3, "timeouts=3: .*Timeouts"),
    ("concurency", 8, "concurency=8: no such worker option; did you mean concurrency"),
]


@pytest.mark.parametrize("shell", sorted(SHELLS))
@pytest.mark.parametrize(("option", "value", "says"), BAD)
def test_a_bad_value_is_refused_alike_by_every_shell(
    shell: str, option: str, value: Any, says: str
) -> None:
    with pytest.raises(ConfigError, match=says) as refused:
        SHELLS[shell](**{option: value})
    # The very same refusal, word for word, whichever shell was given the value.
    with pytest.raises(ConfigError) as by_thread:
        SHELLS["thread"](**{option: value})
    assert str(refused.value) == str(by_thread.value)
    assert getattr(refused.value, "field", None) == option


def test_the_lambda_handlers_refuse_a_bad_option_when_built_not_at_the_first_record() -> None:
    from sqs_lease import OptionError, WorkerOptions

    with pytest.raises(OptionError, match="tick=0: give 0 < tick") as by_keyword:
        handler(_app(), SETTINGS, tick=0)
    assert by_keyword.value.field == "tick"
    handler(_app(), SETTINGS, options=WorkerOptions(tick=0.5))  # good ones: built, no AWS yet
    with pytest.raises(OptionError, match="concurrency=8: not an option of the lambda shell"):
        handler(_app(), SETTINGS, options=WorkerOptions(concurrency=8))
    with pytest.raises(OptionError, match=r"sweep_grace=-1\.0: give seconds >= 0"):
        sweeper(_app(), SETTINGS, older_than=-1.0)


@pytest.mark.parametrize(
    ("shell", "option", "value", "says"),
    [
        ("thread", "max_loop_lag", 2.0, "not an option of the thread shell: for the async"),
        ("thread", "threads", 4, "not an option of the thread shell"),
        ("thread", "concurrency", 5000, "thread per job: choose 1..1000, or use AsyncWorker"),
        ("lambda", "concurrency", 8, "not an option of the lambda shell: one record at a time"),
        ("lambda", "receive_window", 2.0, "MaximumBatchingWindowInSeconds"),
        ("lambda", "sweep_interval", 30.0, "schedule sweeper"),
    ],
)
def test_an_option_a_shell_decides_itself_is_refused_not_ignored(
    shell: str, option: str, value: Any, says: str
) -> None:
    with pytest.raises(ConfigError, match=f"{option}={value!r}: .*{says}"):
        SHELLS[shell](**{option: value})


def test_one_options_object_serves_every_shell_and_keywords_go_on_top() -> None:
    from sqs_lease import WorkerOptions

    options = WorkerOptions(tick=0.5, sweep_grace=120.0)
    assert WorkerOptions.of(options, tick=0.2) == WorkerOptions(tick=0.2, sweep_grace=120.0)
    assert options.for_shell("thread").concurrency == 4
    assert options.for_shell("async").concurrency == 1000
    lam = options.for_shell("lambda")
    assert (lam.concurrency, lam.receive_wait, lam.sweep_interval) == (1, 0, None)
    assert lam.for_shell("lambda") == lam  # checking twice is harmless
    with pytest.raises(Exception, match="frozen"):
        options.tick = 1.0  # type: ignore[misc]


def test_the_environments_options_have_no_bounds_of_their_own() -> None:
    """``WorkerEnv`` reads the options; their bounds and defaults are WorkerOptions'."""
    from sqs_lease import WorkerOptions
    from sqs_lease.service import _OPTION_NAMES, WorkerEnv

    assert set(_OPTION_NAMES) == {
        "worker_id",
        "concurrency",
        "max_loop_lag",
        "receive_wait",
        "receive_window",
        "shutdown_grace",
        "sweep_interval",
        "sweep_grace",
        "sweep_limit",
        "unknown_class_receives",
    }
    for name in _OPTION_NAMES:
        assert WorkerEnv.model_fields[name].metadata == [], f"{name}: a second bound"
    for shell in ("thread", "async"):
        assert WorkerEnv.load({}).options(shell) == WorkerOptions().for_shell(shell)
    for option, value, _ in BAD:
        if option not in _OPTION_NAMES:
            continue
        with pytest.raises(ConfigError) as from_env:
            WorkerEnv.load({}, **{option: value})
        with pytest.raises(ConfigError) as from_code:
            Worker(_app(), SETTINGS, **{option: value})
        variable = f"SQS_LEASE_{option.upper()}"
        assert str(from_env.value) == f"{variable} (or --{option.replace('_', '-')}): " + str(
            from_code.value
        )


APP = _app()  # for SQS_LEASE_APP=test_worker_options:APP


@pytest.mark.parametrize(
    ("variable", "value", "says"),
    [
        ("SQS_LEASE_SWEEP_GRACE", "-1", "sweep_grace=-1.0: give seconds >= 0"),
        ("SQS_LEASE_RECEIVE_WAIT", "5", "receive_wait=5: not an option of the lambda shell"),
    ],
)
def test_the_lambda_entry_reads_the_worker_options_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, says: str
) -> None:
    # The variables of the env table are the Lambda shell's too: one it cannot honour,
    # or a bad value, is refused at cold start (it was ignored).
    from sqs_lease.aws_lambda import _env_app

    monkeypatch.setenv("SQS_LEASE_APP", "test_worker_options:APP")
    monkeypatch.setenv(variable, value)
    for make, own in ((handler, "handler(app)"), (sweeper, "sweeper(app)")):
        with pytest.raises(ConfigError, match=says):
            _env_app(make, own)


def test_one_precedence_for_every_setting_code_then_environment_then_default() -> None:
    from sqs_lease.service import WorkerEnv

    env = {"SQS_LEASE_PREFIX": "from-env", "SQS_LEASE_RECEIVE_WAIT": "5"}
    assert Settings.from_env(env, prefix="from-code").prefix == "from-code"
    assert Settings.from_env(env).prefix == "from-env"
    assert Settings.from_env({}).prefix == "sqs-lease"
    assert WorkerEnv.load(env, receive_wait=7).options().receive_wait == 7
    assert WorkerEnv.load(env).options().receive_wait == 5  # the mapping given, not os.environ
    assert WorkerEnv.load({}).options().receive_wait == 2
    # None in code is "not given", in both.
    assert Settings.from_env(env, prefix=None).prefix == "from-env"
    assert WorkerEnv.load(env, receive_wait=None).options().receive_wait == 5
