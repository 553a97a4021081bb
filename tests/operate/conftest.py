"""Fixtures of the operate tests: a tiny model (generated once per session), moto in process for the
EC2 fleet tests, and the harness on path."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from moto import mock_aws

sys.path.insert(0, str(Path(__file__).parent))

from harness import make_tiny_model  # noqa: E402

FLEET_REGION = "us-east-1"  # the EC2 fleet tests' region


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("tiny-model"))


@pytest.fixture
def aws(monkeypatch):
    """moto in this process, with test credentials and no endpoint override (the EC2 fleet tests)."""
    for key, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": FLEET_REGION,
        "MOTO_EC2_LOAD_DEFAULT_AMIS": "false",
    }.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    with mock_aws():
        yield
