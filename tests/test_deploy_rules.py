"""The deployment rules the worker and the CDK constructs share (sqs_lease.deploy)."""

from __future__ import annotations

import pytest

from sqs_lease import ConfigError, JobClassError
from sqs_lease.deploy import (
    ECS_MAX_STOP_TIMEOUT,
    REDRIVE_BACKSTOP,
    SHUTDOWN_GRACE_SECONDS,
    SHUTDOWN_RELEASE_MARGIN,
    check_lambda_timing,
    ecs_stop_timeout,
    lambda_visibility_floor,
    max_receive_count_for,
    queue_visibility_for,
    redrive_too_tight,
)


def test_a_redrive_at_most_twice_the_attempts_is_too_tight() -> None:
    assert redrive_too_tight(10, 5)
    assert redrive_too_tight(9, 5)
    assert not redrive_too_tight(11, 5)


def test_the_derived_receive_count_is_never_too_tight_and_never_below_the_backstop() -> None:
    assert max_receive_count_for([1, 3, 5]) == REDRIVE_BACKSTOP
    for most in (1, 24, 25, 26, 100, 499):
        count = max_receive_count_for([most])
        assert not redrive_too_tight(count, most)
        assert count >= REDRIVE_BACKSTOP
    assert max_receive_count_for([30]) == 61


def test_attempts_no_sqs_redrive_can_cover_are_refused_with_the_largest_that_fits() -> None:
    with pytest.raises(JobClassError, match="at most 499"):
        max_receive_count_for([500])
    with pytest.raises(ConfigError, match="no job class"):
        max_receive_count_for([])


def test_the_queue_visibility_is_the_longest_lease() -> None:
    assert queue_visibility_for([30, 120, 60]) == 120
    with pytest.raises(ConfigError, match="no job class"):
        queue_visibility_for([])


def test_lambda_timing_follows_six_times_the_timeout_plus_the_window() -> None:
    assert lambda_visibility_floor(300, 5) == 1805
    check_lambda_timing(1805, 300, 5)
    with pytest.raises(ConfigError, match=r"6 x function timeout 300 s \+ batching window 5 s"):
        check_lambda_timing(1804, 300, 5)
    with pytest.raises(ConfigError, match=r"1\.\.900"):
        check_lambda_timing(10_000, 901, 0)
    with pytest.raises(ConfigError, match=r"0\.\.300"):
        check_lambda_timing(10_000, 60, 301)


def test_the_ecs_stop_timeout_leaves_the_release_margin_after_the_grace() -> None:
    assert ecs_stop_timeout(SHUTDOWN_GRACE_SECONDS) == 30
    assert ecs_stop_timeout(20.5) == 31
    limit = ECS_MAX_STOP_TIMEOUT - SHUTDOWN_RELEASE_MARGIN
    assert ecs_stop_timeout(limit) == ECS_MAX_STOP_TIMEOUT
    with pytest.raises(ConfigError, match="at most 110"):
        ecs_stop_timeout(limit + 1)
    with pytest.raises(ConfigError, match="shutdown_grace"):
        ecs_stop_timeout(float("nan"))


def test_a_lambda_fit_is_refused_naming_each_class_its_budget_lease_and_the_timeout() -> None:
    from sqs_lease.deploy import check_lambda_fit

    rules = {"edge": (297.0, 60), "over": (297.5, 60), "ocr/render": (3600.0, 120)}
    with pytest.raises(JobClassError) as refused:
        check_lambda_fit(rules, 300)
    text = str(refused.value)
    assert "ocr/render: stage_budget_seconds 3600 s (lease 120 s)" in text
    assert "over: stage_budget_seconds 297.5 s (lease 60 s)" in text
    assert "edge" not in text  # 297 s + the 3 s margin fit a 300 s function exactly
    assert "function timeout is 300 s" in text and "at most 297 s" in text
    check_lambda_fit({"edge": (297.0, 60)}, 300)
