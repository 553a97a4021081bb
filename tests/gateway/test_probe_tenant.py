"""The synthetic probe's tenant: the gateway makes it from the runtimes' keys (every key of every
pool's own secret), on every model, with a few requests a minute each; no stack's tenant may take its
name. Each pool's runtimes are called with the first key of that pool's secret."""

from __future__ import annotations

import json
from pathlib import Path

import boto3
import pytest
from frontier_gateway.config import GatewayConfig, TenantConfig
from frontier_gateway.tenants import PROBE_REQUESTS_PER_MODEL_MINUTE, TenantKeyError, load_tenants, read_keys
from frontier_hostside.names import INTERACTIVE, PROBE_TENANT
from moto import mock_aws
from pydantic import ValidationError

from tests.gateway.harness import gateway_config, tenant

MODELS = ["tiny-a", "tiny-b"]


def test_a_runtime_key_identifies_the_probe_on_every_model():
    tenants = load_tenants([], probe_keys=["sk-runtime-1", "sk-runtime-0"], models=MODELS)
    for key in ("sk-runtime-1", "sk-runtime-0"):
        found = tenants.identify(f"Bearer {key}")
        assert found is not None and found.name == PROBE_TENANT
        assert found.models == frozenset(MODELS)


def test_the_probes_quota_is_a_few_interactive_requests_a_minute_per_model():
    (probe,) = load_tenants([], probe_keys=["sk-runtime"], models=MODELS).all
    assert probe.requests_per_minute == PROBE_REQUESTS_PER_MODEL_MINUTE * len(MODELS)
    assert probe.priority == INTERACTIVE


def test_no_probe_tenant_where_the_runtimes_take_no_key():
    tenants = load_tenants([TenantConfig.model_validate(tenant("acme", "sk-acme", MODELS))])
    assert [t.name for t in tenants.all] == ["acme"]


def test_a_stack_tenant_named_as_the_probe_is_refused():
    with pytest.raises(ValidationError, match="synthetic probe's tenant"):
        TenantConfig.model_validate(tenant(PROBE_TENANT, "sk-x", MODELS))


def _two_pools(tmp_path: Path) -> GatewayConfig:
    return gateway_config(
        {"tiny-a": ["http://127.0.0.2:8000"], "tiny-b": ["http://127.0.0.3:8000"]},
        [tenant("acme", "sk-acme", MODELS)],
        tmp_path / "metering",
        key_secrets={"tiny-a": "frontier/test/tiny-a/api-keys", "tiny-b": "frontier/test/tiny-b/api-keys"},
    )


def test_the_gateway_reads_every_pools_secret_and_presents_each_pool_its_own_key(tmp_path):
    with mock_aws():
        client = boto3.client("secretsmanager", region_name="us-east-1")
        client.create_secret(
            Name="frontier/test/tiny-a/api-keys", SecretString=json.dumps({"keys": ["sk-a"]})
        )
        client.create_secret(
            Name="frontier/test/tiny-b/api-keys", SecretString=json.dumps({"keys": ["sk-b-new", "sk-b-old"]})
        )
        tenants, upstream = read_keys(_two_pools(tmp_path), client)
    assert upstream == {"tiny-a": "sk-a", "tiny-b": "sk-b-new"}
    for key in ("sk-a", "sk-b-new", "sk-b-old"):
        found = tenants.identify(f"Bearer {key}")
        assert found is not None and found.name == PROBE_TENANT and found.models == frozenset(MODELS)


def test_one_unreadable_pool_secret_fails_the_read_naming_it(tmp_path):
    with mock_aws():
        client = boto3.client("secretsmanager", region_name="us-east-1")
        client.create_secret(
            Name="frontier/test/tiny-a/api-keys", SecretString=json.dumps({"keys": ["sk-a"]})
        )
        with pytest.raises(TenantKeyError, match="frontier/test/tiny-b/api-keys"):
            read_keys(_two_pools(tmp_path), client)
