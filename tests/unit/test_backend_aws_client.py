"""Which AWS a stack talks to is its backend's answer: the local stack's is its moto server."""

from __future__ import annotations

import pytest

from frontier.targets import backend_for, load_stack


@pytest.fixture
def bare_environment(monkeypatch):
    for name in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_the_local_stack_talks_to_its_moto_server(bare_environment):
    settings = load_stack("local")
    client = backend_for(settings).aws_client("s3")
    assert client.meta.endpoint_url == f"http://127.0.0.1:{settings.local.moto_port}"


def test_an_endpoint_in_the_environment_wins_on_the_local_stack(bare_environment):
    bare_environment.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:1")
    assert backend_for(load_stack("local")).aws_client("s3").meta.endpoint_url == "http://127.0.0.1:1"


def test_a_cloud_stack_talks_to_aws_itself(bare_environment):
    settings = load_stack("prod")
    endpoint = backend_for(settings).aws_client("s3").meta.endpoint_url
    assert endpoint.startswith("https://") and endpoint.endswith(".amazonaws.com")
