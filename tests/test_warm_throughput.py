"""Warm throughput (issue 33 item 6): `tables create --warm-reads/--warm-writes` sets each
table's and index's warm throughput before a launch, raises it on existing tables and
never lowers it; bad values are refused naming the field. Against the moto server."""

from __future__ import annotations

from typing import Any

import boto3
import pytest
from click.testing import CliRunner
from conftest import AwsTestEnv

from sqs_lease import ConfigError, Settings, WarmThroughput, create_tables
from sqs_lease.cli import cli


def _create(aws: AwsTestEnv) -> list[str]:
    return ["--endpoint-url", aws.endpoint_url, "--prefix", aws.prefix, "tables", "create"]


def _warm(aws: AwsTestEnv, name: str) -> list[dict[str, Any]]:
    """The table's warm throughput, then each index's (units only)."""
    ddb = boto3.client("dynamodb", endpoint_url=aws.endpoint_url, region_name="us-east-1")
    table = ddb.describe_table(TableName=name)["Table"]
    found = [table["WarmThroughput"]] + [
        i["WarmThroughput"] for i in table.get("GlobalSecondaryIndexes", [])
    ]
    return [{k: v for k, v in w.items() if k != "Status"} for w in found]


def test_new_tables_get_the_warm_throughput_on_the_table_and_every_index(
    aws: AwsTestEnv,
) -> None:
    settings = Settings(endpoint_url=aws.endpoint_url, prefix=aws.prefix)
    names = create_tables(settings, WarmThroughput(reads=24_000, writes=8_000))
    want = {"ReadUnitsPerSecond": 24_000, "WriteUnitsPerSecond": 8_000}
    jobs = _warm(aws, settings.jobs_table)
    assert len(jobs) == 5  # the table and its four indexes
    assert all(w == want for w in jobs)
    for name in names:
        assert all(w == want for w in _warm(aws, name))


def test_existing_tables_are_raised_where_lower_and_never_lowered(aws: AwsTestEnv) -> None:
    settings = Settings(endpoint_url=aws.endpoint_url, prefix=aws.prefix)
    create_tables(settings)
    new = {"ReadUnitsPerSecond": 12_000, "WriteUnitsPerSecond": 4_000}
    assert all(w == new for w in _warm(aws, settings.jobs_table))
    create_tables(settings, WarmThroughput(writes=10_000))
    raised = {"ReadUnitsPerSecond": 12_000, "WriteUnitsPerSecond": 10_000}
    assert all(w == raised for w in _warm(aws, settings.jobs_table))
    assert all(w == raised for w in _warm(aws, settings.intents_table))
    create_tables(settings, WarmThroughput(reads=13_000, writes=6_000))  # writes: lower
    kept = {"ReadUnitsPerSecond": 13_000, "WriteUnitsPerSecond": 10_000}
    assert all(w == kept for w in _warm(aws, settings.jobs_table))


@pytest.mark.parametrize(
    ("args", "field"),
    [
        ({"reads": 1_000}, "WarmThroughput.reads=1000"),
        ({"writes": 3_999}, "WarmThroughput.writes=3999"),
        ({"writes": 4_500.5}, "WarmThroughput.writes"),
        ({}, "set reads, writes or both"),
    ],
)
def test_a_bad_warm_throughput_is_refused_naming_the_field(
    args: dict[str, Any], field: str
) -> None:
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        WarmThroughput(**args)


def test_the_cli_refuses_a_low_value_naming_its_option(aws: AwsTestEnv) -> None:
    result = CliRunner().invoke(
        cli,
        [*_create(aws), "--warm-writes", "100"],
    )
    assert result.exit_code == 2
    assert "--warm-writes" in result.output and "4,000 or more" in result.output
    ddb = boto3.client("dynamodb", endpoint_url=aws.endpoint_url, region_name="us-east-1")
    listed = ddb.list_tables()["TableNames"]
    assert not [n for n in listed if n.startswith(aws.prefix)]  # nothing was created


def test_the_cli_sets_it(aws: AwsTestEnv) -> None:
    result = CliRunner().invoke(
        cli,
        [*_create(aws), "--warm-reads", "20000", "--warm-writes", "5000"],
    )
    assert result.exit_code == 0, result.output
    settings = Settings(endpoint_url=aws.endpoint_url, prefix=aws.prefix)
    want = {"ReadUnitsPerSecond": 20_000, "WriteUnitsPerSecond": 5_000}
    assert all(w == want for w in _warm(aws, settings.jobs_table))
