"""The embedded emulator: in-thread server, child-process server, and the fixtures."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import boto3
import pytest
from conftest import AwsTestEnv

from sqs_lease._errors import ConfigError
from sqs_lease._local import (
    LocalAws,
    local_credentials_env,
    spawn_local_server,
    stop_local_server,
)

if TYPE_CHECKING:
    from types_boto3_dynamodb import DynamoDBClient
    from types_boto3_sqs import SQSClient


def _clients(endpoint: str) -> tuple[SQSClient, DynamoDBClient]:
    creds = local_credentials_env()
    key, secret = creds["AWS_ACCESS_KEY_ID"], creds["AWS_SECRET_ACCESS_KEY"]
    sqs = boto3.client(
        "sqs",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id=key,
        aws_secret_access_key=secret,
    )
    ddb = boto3.client(
        "dynamodb",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id=key,
        aws_secret_access_key=secret,
    )
    return sqs, ddb


def _roundtrip_sqs(sqs: SQSClient, name: str) -> None:
    url = sqs.create_queue(QueueName=name)["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="hello")
    got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=1, WaitTimeSeconds=1)
    assert [m["Body"] for m in got.get("Messages", [])] == ["hello"]


def _roundtrip_ddb(ddb: DynamoDBClient, name: str) -> None:
    ddb.create_table(
        TableName=name,
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    ddb.put_item(TableName=name, Item={"pk": {"S": "k"}, "v": {"N": "7"}})
    item = ddb.get_item(TableName=name, Key={"pk": {"S": "k"}}, ConsistentRead=True)["Item"]
    assert item == {"pk": {"S": "k"}, "v": {"N": "7"}}


def _accepts_connections(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


@pytest.mark.integration
def test_local_aws_in_thread_serves_sqs_and_dynamodb() -> None:
    with LocalAws() as local:
        endpoint = local.endpoint_url
        assert urlsplit(endpoint).hostname == "127.0.0.1"
        sqs, ddb = _clients(endpoint)
        _roundtrip_sqs(sqs, "thread-q")
        _roundtrip_ddb(ddb, "thread-t")
        port = local.port
    assert not _accepts_connections(port)
    with pytest.raises(RuntimeError):
        _ = local.endpoint_url
    local.stop()  # idempotent


def test_local_aws_endpoint_needs_start() -> None:
    with pytest.raises(RuntimeError, match="not started"):
        _ = LocalAws().endpoint_url


def test_local_aws_rejects_busy_port() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        with pytest.raises(ConfigError, match="in use"):
            LocalAws(sock.getsockname()[1]).start()


@pytest.mark.integration
def test_spawned_server_serves_and_stops_on_sigterm() -> None:
    proc, endpoint = spawn_local_server()
    try:
        assert urlsplit(endpoint).hostname == "127.0.0.1"
        port = urlsplit(endpoint).port
        assert port
        sqs, ddb = _clients(endpoint)
        _roundtrip_sqs(sqs, "proc-q")
        _roundtrip_ddb(ddb, "proc-t")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0  # a hang guard
        assert not _accepts_connections(port)
    finally:
        stop_local_server(proc)


@pytest.mark.integration
def test_spawned_server_exits_when_parent_pipe_closes() -> None:
    proc, _ = spawn_local_server()
    try:
        assert proc.stdin is not None
        proc.stdin.close()  # what the child sees when the test process dies
        assert proc.wait(timeout=5) == 0
    finally:
        stop_local_server(proc)


@pytest.mark.integration
def test_session_fixtures(
    aws: AwsTestEnv, sqs_client: SQSClient, ddb_client: DynamoDBClient
) -> None:
    assert urlsplit(aws.endpoint_url).hostname == "127.0.0.1"
    assert aws.prefix.startswith("t") and len(aws.prefix) == 11
    assert os.environ["AWS_ACCESS_KEY_ID"] == "testing"
    assert os.environ["AWS_DEFAULT_REGION"] == "us-east-1"
    _roundtrip_sqs(sqs_client, f"{aws.prefix}-q")
    _roundtrip_ddb(ddb_client, f"{aws.prefix}-t")


def test_local_credentials_env_keeps_a_set_region(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-1")
    env = local_credentials_env()
    assert env["AWS_DEFAULT_REGION"] == "eu-west-1"
    assert env["AWS_ACCESS_KEY_ID"] == env["AWS_SECRET_ACCESS_KEY"] == "testing"
    monkeypatch.delenv("AWS_DEFAULT_REGION")
    assert local_credentials_env()["AWS_DEFAULT_REGION"] == "us-east-1"


def test_missing_moto_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    # A None entry in sys.modules makes the import (and find_spec) fail as if not installed.
    monkeypatch.setitem(sys.modules, "moto", None)
    monkeypatch.setitem(sys.modules, "moto.server", None)
    with pytest.raises(ConfigError, match=r"pip install 'sqs-lease\[local\]'"):
        LocalAws().start()
    with pytest.raises(ConfigError, match=r"pip install 'sqs-lease\[local\]'"):
        spawn_local_server()


@pytest.mark.integration
def test_the_local_default_loses_no_write_next_to_cancelled_transactions() -> None:
    """moto restores whole-table snapshots when a transaction is cancelled; the
    local default serialises DynamoDB so concurrent writes in between survive.
    (Measured with ``serial_dynamodb=False``: 28 of 1,500 such writes lost at
    3,000 operations on 16 threads; at this size the loss is likely, not certain.)"""
    import concurrent.futures

    import boto3

    with LocalAws() as local:
        ddb = boto3.client(
            "dynamodb",
            endpoint_url=local.endpoint_url,
            region_name="us-east-1",
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        )
        ddb.create_table(
            TableName="t",
            BillingMode="PAY_PER_REQUEST",
            KeySchema=[{"AttributeName": "k", "KeyType": "HASH"}],
            AttributeDefinitions=[{"AttributeName": "k", "AttributeType": "S"}],
        )
        ddb.put_item(TableName="t", Item={"k": {"S": "fixed"}})

        def put(i: int) -> None:
            ddb.put_item(TableName="t", Item={"k": {"S": f"item-{i}"}})

        def cancelled(i: int) -> None:
            with contextlib.suppress(ddb.exceptions.TransactionCanceledException):
                ddb.transact_write_items(
                    TransactItems=[
                        {
                            "Put": {
                                "TableName": "t",
                                "Item": {"k": {"S": "fixed"}},
                                "ConditionExpression": "attribute_not_exists(k)",
                            }
                        }
                    ]
                )

        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            futures = [pool.submit(put if i % 2 else cancelled, i) for i in range(1200)]
            for f in futures:
                f.result()
        keys = {
            item["k"]["S"]
            for page in ddb.get_paginator("scan").paginate(TableName="t")
            for item in page["Items"]
        }
        assert {f"item-{i}" for i in range(1, 1200, 2)} <= keys


@pytest.mark.integration
def test_a_memoised_update_expression_still_applies_each_requests_own_values() -> None:
    """The local default parses each distinct UpdateExpression once; the parsed
    tree is shared, so nothing one request substitutes into it may reach the next:
    two items updated by the same text each get their own values, their own
    ``if_not_exists`` branch and their own ``ADD``, and a malformed text is refused
    every time (an error is never remembered as a tree)."""
    from moto.dynamodb.parsing.expressions import (  # type: ignore[attr-defined]
        UpdateExpressionParser,
    )

    with LocalAws() as local:
        _sqs, ddb = _clients(local.endpoint_url)
        ddb.create_table(
            TableName="memo",
            KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
            AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
            BillingMode="PAY_PER_REQUEST",
        )
        ddb.put_item(TableName="memo", Item={"pk": {"S": "b"}, "log": {"L": [{"S": "old"}]}})
        expression = (
            "SET #v = :v, #log = list_append(if_not_exists(#log, :empty), :add) ADD #n :one"
        )
        before = UpdateExpressionParser.make.cache_info().hits
        for key, value, add in (("a", "first", 1), ("b", "second", 5), ("a", "third", 2)):
            ddb.update_item(
                TableName="memo",
                Key={"pk": {"S": key}},
                UpdateExpression=expression,
                ExpressionAttributeNames={"#v": "v", "#log": "log", "#n": "n"},
                ExpressionAttributeValues={
                    ":v": {"S": value},
                    ":empty": {"L": []},
                    ":add": {"L": [{"S": value}]},
                    ":one": {"N": str(add)},
                },
            )
        assert UpdateExpressionParser.make.cache_info().hits > before

        def item(key: str) -> dict[str, object]:
            got = ddb.get_item(TableName="memo", Key={"pk": {"S": key}}, ConsistentRead=True)
            return dict(got["Item"])

        assert item("a") == {
            "pk": {"S": "a"},
            "v": {"S": "third"},
            "log": {"L": [{"S": "first"}, {"S": "third"}]},
            "n": {"N": "3"},
        }
        assert item("b") == {
            "pk": {"S": "b"},
            "v": {"S": "second"},
            "log": {"L": [{"S": "old"}, {"S": "second"}]},
            "n": {"N": "5"},
        }
        for _ in range(2):
            with pytest.raises(ddb.exceptions.ClientError, match="ValidationException"):
                ddb.update_item(
                    TableName="memo",
                    Key={"pk": {"S": "a"}},
                    UpdateExpression="SET #v = = :v",
                    ExpressionAttributeNames={"#v": "v"},
                    ExpressionAttributeValues={":v": {"S": "x"}},
                )
        assert item("a")["v"] == {"S": "third"}
