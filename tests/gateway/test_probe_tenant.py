"""The synthetic probe's tenant: the gateway makes it from the runtimes' keys, on every model, with a
few requests a minute each; no stack's tenant may take its name."""

from __future__ import annotations

import pytest
from frontier_gateway.config import TenantConfig
from frontier_gateway.tenants import PROBE_REQUESTS_PER_MODEL_MINUTE, load_tenants
from frontier_hostside.names import INTERACTIVE, PROBE_TENANT
from pydantic import ValidationError

from tests.gateway.harness import tenant

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
