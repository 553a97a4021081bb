"""An AWS error a user can cause is one line naming what to fix, on every task; never a traceback."""

from __future__ import annotations

import os

import boto3
import pytest
from botocore.exceptions import ClientError, NoCredentialsError, NoRegionError
from fabric.main import program

from frontier import project
from frontier.cli.common import aws_error_line


def _client_error(code: str, operation: str = "DescribeInstances") -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": "from AWS"}}, operation)


def test_no_credentials_names_the_variables_to_set():
    assert "set AWS_PROFILE" in aws_error_line(NoCredentialsError())


def test_no_region_names_the_stack_setting():
    assert "aws:region" in aws_error_line(NoRegionError())


def test_access_denied_names_the_operation_the_role_lacks():
    line = aws_error_line(_client_error("AccessDenied", "CompleteLifecycleAction"))
    assert (
        line
        == "AWS denied CompleteLifecycleAction: the credentials' role lacks that permission (AccessDenied)"
    )


def test_an_expired_token_says_to_renew_the_credentials():
    assert "renew the credentials" in aws_error_line(_client_error("ExpiredToken"))


def test_throttling_says_to_retry():
    assert "retry in a minute" in aws_error_line(_client_error("ThrottlingException"))


def test_an_unknown_aws_error_keeps_aws_words():
    assert aws_error_line(_client_error("Weird")) == "AWS refused DescribeInstances: Weird: from AWS"


@pytest.fixture
def no_aws_credentials(monkeypatch, tmp_path):
    for name in [n for n in os.environ if n.startswith(("AWS_", "FRONTIER_STACK"))]:
        monkeypatch.delenv(name)  # credentials, endpoints (moto's) and stack outputs other tests set
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # no instance role to fall back on
    # A default session an earlier test made keeps the credentials it resolved then.
    monkeypatch.setattr(boto3, "DEFAULT_SESSION", None)
    monkeypatch.chdir(project.root())


def test_a_task_without_credentials_exits_with_one_line(capsys, no_aws_credentials):
    try:
        program.run(["fab", "ami.latest", "-s", "prod"])
        code = 0
    except SystemExit as exc:
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2
    assert err.strip().splitlines() == [
        "error: no AWS credentials found: set AWS_PROFILE (or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY), "
        "or run where an instance role applies"
    ]
