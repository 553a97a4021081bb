"""The gateway's keys without restarts: tenants' key digests and the runtimes' key are read again
from Secrets Manager (moto's server) every ``keys_reload_s``; a failed reload keeps the keys in use."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import boto3
import httpx
import pytest
from frontier_gateway.tenants import PROBE_REQUESTS_PER_MODEL_MINUTE
from frontier_hostside import names
from frontier_hostside.probe import probe

from tests.gateway.harness import StandIn, digest, gateway_config, running_gateway, tenant
from tests.moto_server import moto_server, reset

TENANT_SECRET = "frontier/test/tenant-acme"
RUNTIME_SECRET = "frontier/test/runtime-keys"
OLD, NEW = "sk-acme-old-0123456789", "sk-acme-new-9876543210"
RUNTIME_OLD, RUNTIME_NEW = "sk-runtime-old-000000", "sk-runtime-new-111111"
RELOAD_S = 5  # the shortest interval the setting allows
WITHIN_S = RELOAD_S + 10  # one interval, plus a busy machine's scheduling


@pytest.fixture
def secrets(monkeypatch: pytest.MonkeyPatch) -> Iterator[object]:
    with moto_server() as endpoint:
        reset(endpoint)
        monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
        client = boto3.client("secretsmanager")
        client.create_secret(Name=TENANT_SECRET, SecretString=json.dumps({"sha256": [digest(OLD)]}))
        client.create_secret(Name=RUNTIME_SECRET, SecretString=json.dumps({"keys": [RUNTIME_OLD]}))
        yield client


@pytest.fixture
def gateway(secrets, standins: dict[str, StandIn], tmp_path: Path):  # type: ignore[no-untyped-def]
    acme = {**tenant("acme", OLD, ["tiny-a"]), "key_sha256": [], "api_key_secret": TENANT_SECRET}
    config = gateway_config(
        {"tiny-a": [standins["a1"].url]},
        [acme],
        tmp_path / "metering",
        keys_reload_s=RELOAD_S,
        key_secrets={"tiny-a": RUNTIME_SECRET},
    )
    with running_gateway(config) as running:
        yield running


def _status(url: str, key: str) -> int:
    body = {"model": "tiny-a", "prompt": "hi", "max_tokens": 2}
    return httpx.post(
        url + names.COMPLETIONS_PATH, json=body, headers={"Authorization": f"Bearer {key}"}, timeout=10
    ).status_code


def _until(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.2)
    raise AssertionError(f"not {what} within {timeout} s")


def test_a_revoked_tenant_key_is_refused_within_the_reload_interval(gateway, secrets) -> None:
    assert _status(gateway.url, OLD) == 200
    secrets.put_secret_value(SecretId=TENANT_SECRET, SecretString=json.dumps({"sha256": [digest(NEW)]}))
    _until(lambda: _status(gateway.url, OLD) == 401, WITHIN_S, "the revoked key refused")
    assert _status(gateway.url, NEW) == 200


def test_the_gateway_presents_the_runtimes_new_first_key_after_a_reload(gateway, secrets, standins) -> None:
    secrets.put_secret_value(
        SecretId=RUNTIME_SECRET, SecretString=json.dumps({"keys": [RUNTIME_NEW, RUNTIME_OLD]})
    )

    def presents_new() -> bool:
        assert _status(gateway.url, OLD) == 200
        headers = {k.lower(): v for k, v in standins["a1"].requests[-1][2].items()}
        return headers["authorization"] == f"Bearer {RUNTIME_NEW}"

    _until(presents_new, WITHIN_S, "the new runtime key presented upstream")


def test_a_failed_reload_keeps_the_tenant_keys_in_use_and_is_counted(gateway, secrets) -> None:
    secrets.put_secret_value(SecretId=TENANT_SECRET, SecretString=json.dumps({"sha256": []}))
    failures = f"{names.GATEWAY_KEYS_RELOAD_FAILURES_METRIC}_total 1.0"
    _until(
        lambda: failures in httpx.get(gateway.admin_url + names.METRICS_PATH).text,
        WITHIN_S,
        "a failure counted",
    )
    assert _status(gateway.url, OLD) == 200
    # acme's one digest and the probe's, the runtimes' one key
    assert f"{names.GATEWAY_KEYS_LOADED_METRIC} 2.0" in httpx.get(gateway.admin_url + names.METRICS_PATH).text


def test_the_synthetic_probe_passes_the_gateway_with_the_runtimes_key(gateway) -> None:
    result = probe(gateway.url, ["tiny-a"], RUNTIME_OLD, timeout_s=10)
    assert result.ok, result


def test_the_probe_is_its_own_tenant_with_a_few_requests_a_minute_per_model(gateway) -> None:
    allowed = PROBE_REQUESTS_PER_MODEL_MINUTE  # one model served
    statuses = [_status(gateway.url, RUNTIME_OLD) for _ in range(allowed + 1)]
    assert statuses == [200] * allowed + [429]
    assert _status(gateway.url, OLD) == 200  # acme's own quota is untouched


def test_the_probe_passes_on_either_runtime_key_while_they_rotate(gateway, secrets) -> None:
    secrets.put_secret_value(
        SecretId=RUNTIME_SECRET, SecretString=json.dumps({"keys": [RUNTIME_NEW, RUNTIME_OLD]})
    )
    _until(lambda: _status(gateway.url, RUNTIME_NEW) == 200, WITHIN_S, "the new runtime key taken")
    assert _status(gateway.url, RUNTIME_OLD) == 200
    secrets.put_secret_value(SecretId=RUNTIME_SECRET, SecretString=json.dumps({"keys": [RUNTIME_NEW]}))
    _until(lambda: _status(gateway.url, RUNTIME_OLD) == 401, WITHIN_S, "the retired runtime key refused")


SECOND_SECRET = "frontier/test/tiny-b/runtime-keys"
SECOND_KEY = "sk-runtime-b-222222"


@pytest.fixture
def two_pools(secrets, standins: dict[str, StandIn], tmp_path: Path):  # type: ignore[no-untyped-def]
    """tiny-a on a1 and tiny-b on b1, each pool's runtimes with a key secret of their own."""
    secrets.create_secret(Name=SECOND_SECRET, SecretString=json.dumps({"keys": [SECOND_KEY]}))
    config = gateway_config(
        {"tiny-a": [standins["a1"].url], "tiny-b": [standins["b1"].url]},
        [tenant("acme", OLD, ["tiny-a", "tiny-b"])],
        tmp_path / "metering",
        keys_reload_s=RELOAD_S,
        key_secrets={"tiny-a": RUNTIME_SECRET, "tiny-b": SECOND_SECRET},
    )
    with running_gateway(config) as running:
        yield running


def test_the_gateway_presents_each_pool_the_first_key_of_its_own_secret(two_pools, standins) -> None:
    for model, standin, key in (("tiny-a", "a1", RUNTIME_OLD), ("tiny-b", "b1", SECOND_KEY)):
        body = {"model": model, "prompt": "hi", "max_tokens": 2}
        answer = httpx.post(
            two_pools.url + names.COMPLETIONS_PATH,
            json=body,
            headers={"Authorization": f"Bearer {OLD}"},
            timeout=10,
        )
        assert answer.status_code == 200
        headers = {k.lower(): v for k, v in standins[standin].requests[-1][2].items()}
        assert headers["authorization"] == f"Bearer {key}"


def test_the_probe_passes_every_model_with_each_pools_own_key(two_pools) -> None:
    result = probe(
        two_pools.url, ["tiny-a", "tiny-b"], {"tiny-a": RUNTIME_OLD, "tiny-b": SECOND_KEY}, timeout_s=10
    )
    assert result.ok, result
