"""API keys: read from Secrets Manager at start, compared by digest, never shown."""

from __future__ import annotations

import json
import logging

import boto3
import pytest
from frontier_runtime.server.auth import ApiKeys
from frontier_runtime.server.logs import configure_logging
from frontier_runtime.storage.secrets import SecretsError, load_api_keys, parse_keys
from moto import mock_aws

KEY_A = "sk-alpha-0123456789"
KEY_B = "sk-bravo-9876543210"


@pytest.fixture
def secrets_client():
    with mock_aws():
        yield boto3.client("secretsmanager", region_name="us-east-1")


def test_keys_json_holds_several_keys(secrets_client) -> None:
    secrets_client.create_secret(Name="rt/keys", SecretString=json.dumps({"keys": [KEY_A, KEY_B]}))
    assert load_api_keys("rt/keys", client=secrets_client) == (KEY_A, KEY_B)


def test_a_plain_string_secret_is_one_key(secrets_client) -> None:
    secrets_client.create_secret(Name="rt/one", SecretString=f"  {KEY_A}\n")
    assert load_api_keys("rt/one", client=secrets_client) == (KEY_A,)


def test_a_missing_secret_names_the_secret_id(secrets_client) -> None:
    with pytest.raises(SecretsError, match=r"'rt/absent'.*ResourceNotFoundException"):
        load_api_keys("rt/absent", client=secrets_client)


@pytest.mark.parametrize("text", ['{"keys": []}', '{"keys": "sk-x"}', '{"other": 1}', "   "])
def test_a_secret_without_usable_keys_is_refused(text: str) -> None:
    with pytest.raises(SecretsError):
        parse_keys(text, "rt/keys")


def test_errors_and_logs_never_show_a_key(secrets_client, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="frontier_runtime")
    secrets_client.create_secret(Name="rt/bad", SecretString='{"keys": ["' + KEY_A + '"')
    with pytest.raises(SecretsError) as err:
        load_api_keys("rt/bad", client=secrets_client)
    secrets_client.create_secret(Name="rt/good", SecretString=json.dumps({"keys": [KEY_B]}))
    keys = load_api_keys("rt/good", client=secrets_client)
    assert KEY_A not in str(err.value)
    assert KEY_A not in caplog.text and KEY_B not in caplog.text
    assert KEY_B not in repr(ApiKeys(keys))


def test_runtime_logging_keeps_aws_libraries_from_logging_response_bodies() -> None:
    root = logging.getLogger()
    saved = (root.handlers[:], root.level)
    try:
        configure_logging("debug")
        assert not logging.getLogger("botocore").isEnabledFor(logging.DEBUG)
        assert not logging.getLogger("botocore.parsers").isEnabledFor(logging.INFO)
    finally:
        root.handlers[:], _ = saved
        root.setLevel(saved[1])
        logging.getLogger("botocore").setLevel(logging.NOTSET)


def test_keys_come_from_moto_server_through_the_standard_environment(aws_endpoint: str) -> None:
    boto3.client("secretsmanager").create_secret(Name="rt/env", SecretString=json.dumps({"keys": [KEY_A]}))
    assert load_api_keys("rt/env") == (KEY_A,)


@pytest.mark.parametrize(
    ("header", "accepted"),
    [
        (f"Bearer {KEY_A}", True),
        (f"bearer {KEY_B}", True),
        (f"Bearer {KEY_A}x", False),
        (f"Basic {KEY_A}", False),
        ("Bearer ", False),
        ("", False),
        (None, False),
    ],
)
def test_only_a_known_bearer_key_is_accepted(header: str | None, accepted: bool) -> None:
    assert ApiKeys([KEY_A, KEY_B]).check(header) is accepted


def test_auth_needs_at_least_one_key() -> None:
    with pytest.raises(ValueError):
        ApiKeys([])
