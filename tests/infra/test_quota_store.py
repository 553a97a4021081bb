"""The quota store an EC2 stack provisions for its gateways (``gateway.quota.store: redis`` with no
``redis_url``), and the gateway's side of it: the URL and AUTH token read from Secrets Manager.

The program runs under Pulumi mocks like every test of it (no engine or AWS account here). Three
values a provider computes are filled in by :class:`StoreMocks`: the S3 gateway endpoint's prefix
list, the replication group's primary endpoint, and the random provider's password. The gateway's
side runs for real: a real redis-server started with ``--requirepass`` (plain TCP, as redis-server
here is built without TLS), its token in Secrets Manager (moto, in process).
"""

from __future__ import annotations

import asyncio
import base64
import contextvars
import json
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from frontier_gateway.config import QuotaConfig
from frontier_gateway.quotas import QuotaStoreError, RedisQuotas, open_quotas, store_connection
from frontier_gateway.tenants import Tenant
from infra_mocks import Graph, Resource, _ensure_event_loop, _Recorder, _run, graph_for
from moto import mock_aws
from pulumi.runtime import rpc
from pulumi.runtime.mocks import MockResourceArgs
from pulumi_policy import PolicyResourceOptions, ResourceValidationArgs
from pulumi_policy.proxy import unknown_checking_proxy

from frontier.access.gateway import gateway_config
from frontier.targets import load_stack
from infra.errors import ProvisionError
from infra.program import build
from infra.quota_store import AUTH_TOKEN_LENGTH, REDIS_PORT, provisions_store
from policy.rules import POLICIES
from tests.gateway.harness import redis_server
from tests.gateway.stacks import dev_gateway_document, write_stack

GROUP = "aws:elasticache/replicationGroup:ReplicationGroup"
SUBNET_GROUP = "aws:elasticache/subnetGroup:SubnetGroup"
PASSWORD = "random:index/randomPassword:RandomPassword"
SECRET = "aws:secretsmanager/secret:Secret"
SECRET_VERSION = "aws:secretsmanager/secretVersion:SecretVersion"
SG = "aws:ec2/securityGroup:SecurityGroup"
SUBNET = "aws:ec2/subnet:Subnet"
INGRESS = "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule"
EGRESS = "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule"
ENDPOINT = "aws:ec2/vpcEndpoint:VpcEndpoint"
ROLE_POLICY = "aws:iam/rolePolicy:RolePolicy"
S3_PREFIX_LIST = "pl-63a5400a"
PRIMARY = "frontier-dev-quota.abc123.ng.0001.use1.cache.amazonaws.com"
TOKEN = "t" * AUTH_TOKEN_LENGTH  # what the random provider would make
STORE_SECRET = "frontier/dev/quota-store"


class StoreMocks(_Recorder):
    """The shared mocks, plus the values AWS and the random provider compute at creation."""

    def new_resource(self, args: MockResourceArgs) -> tuple[str, dict[str, Any]]:
        resource_id, outputs = super().new_resource(args)
        if args.typ == ENDPOINT and args.inputs.get("vpcEndpointType") == "Gateway":
            outputs["prefixListId"] = S3_PREFIX_LIST
        if args.typ == GROUP:
            outputs["primaryEndpointAddress"] = PRIMARY
        if args.typ == PASSWORD:
            outputs["result"] = TOKEN
        return resource_id, outputs


def gated_stack(directory: Path, quota: dict, egress: str = "endpoints") -> Path:
    """dev, with a gateway (and a tenant) whose counters live in Redis."""
    document = dev_gateway_document(quota=quota)
    document["config"]["frontier:network"]["egress"] = egress
    return write_stack(directory, document, "dev")


def run(
    path: Path, stack: str = "dev", mocks: Callable[[str], StoreMocks] = StoreMocks, production: bool = False
) -> Graph:
    settings = load_stack("dev", path=path).model_copy(update={"stack": stack, "production": production})
    # Renamed, the stack meters into its own metering bucket (another stack's is refused).
    gateway = settings.gateway
    assert gateway is not None
    metering = gateway.metering.model_copy(
        update={"uri": gateway.metering.uri.replace("frontier-dev-metering", f"frontier-{stack}-metering")}
    )
    settings = settings.model_copy(update={"gateway": gateway.model_copy(update={"metering": metering})})
    _ensure_event_loop()
    return contextvars.Context().run(_run, settings, build, mocks(settings.region))


@pytest.fixture(scope="module")
def gated(tmp_path_factory: pytest.TempPathFactory) -> Graph:
    path = gated_stack(
        tmp_path_factory.mktemp("stacks"), {"store": "redis", "redis_auth_secret": STORE_SECRET}
    )
    return run(path)


def revealed(value: Any) -> Any:
    """A secret input as the engine gets it: wrapped, marked secret (kept encrypted in the state)."""
    assert isinstance(value, dict) and value.get(rpc._special_sig_key) == rpc._special_secret_sig
    return value["value"]


def _sg(graph: Graph, name: str) -> str:
    return graph.one(SG, name).id


def _rules(graph: Graph, typ: str, group_id: str) -> set[tuple]:
    return {
        (
            r.inputs.get("cidrIpv4")
            or r.inputs.get("prefixListId")
            or r.inputs.get("referencedSecurityGroupId"),
            r.inputs["ipProtocol"],
            int(r.inputs.get("fromPort", -1)),
        )
        for r in graph.of_type(typ)
        if r.inputs["securityGroupId"] == group_id
    }


# --- what the program makes ---------------------------------------------------------------------------


def test_a_gateway_sharing_redis_without_a_url_gets_an_elasticache_group_in_the_private_subnets(gated):
    group = gated.one(GROUP).inputs
    assert group["engine"] == "redis" and group["port"] == REDIS_PORT
    subnets = gated.one(SUBNET_GROUP).inputs
    private = {s.id for s in gated.of_type(SUBNET) if s.inputs["tags"]["frontier:tier"] == "private"}
    assert set(subnets["subnetIds"]) == private
    assert group["subnetGroupName"] == subnets["name"]


def test_the_store_encrypts_in_transit_and_at_rest_with_the_stacks_key(gated):
    group = gated.one(GROUP).inputs
    key = next(k for k in gated.of_type("aws:kms/key:Key") if k.name.endswith("-secrets-key")).outputs["arn"]
    assert group["transitEncryptionEnabled"] is True
    assert group["atRestEncryptionEnabled"] is True
    assert group["kmsKeyId"] == key


def test_the_auth_token_is_made_by_the_random_provider_and_kept_secret(gated):
    password = gated.one(PASSWORD).inputs
    assert password["length"] == AUTH_TOKEN_LENGTH and password["special"] is False
    assert revealed(gated.one(GROUP).inputs["authToken"]) == TOKEN


def test_outside_production_the_store_is_one_node(gated):
    group = gated.one(GROUP).inputs
    assert group["numCacheClusters"] == 1
    assert group["automaticFailoverEnabled"] is False and group["multiAzEnabled"] is False


def test_production_keeps_a_replica_in_another_zone_and_protects_the_secret(tmp_path_factory):
    path = gated_stack(
        tmp_path_factory.mktemp("stacks"), {"store": "redis", "redis_auth_secret": STORE_SECRET}
    )
    prod = run(path, stack="prod", production=True)
    group = prod.one(GROUP).inputs
    assert group["numCacheClusters"] == 2
    assert group["automaticFailoverEnabled"] is True and group["multiAzEnabled"] is True
    secret = prod.one(SECRET, "prod-quota-store-auth")
    assert secret.options is not None and secret.options.protect is True
    assert secret.inputs["recoveryWindowInDays"] == 30


def test_a_stack_name_too_long_for_an_elasticache_id_is_refused_before_anything_is_created(
    tmp_path_factory,
):
    path = gated_stack(
        tmp_path_factory.mktemp("stacks"), {"store": "redis", "redis_auth_secret": STORE_SECRET}
    )
    stack = "a-stack-name-of-twenty-six"
    mocks: list[StoreMocks] = []

    def recording(region: str) -> StoreMocks:
        mocks.append(StoreMocks(region))
        return mocks[-1]

    with pytest.raises(ProvisionError) as refused:
        run(path, stack=stack, mocks=recording)
    assert f"ElastiCache group 'frontier-{stack}-quota'" in str(refused.value)
    assert "at most 25 characters" in str(refused.value)
    assert mocks[0].created == []


def test_the_secret_holds_the_tls_url_and_the_token_under_the_stacks_key(gated):
    secret = gated.one(SECRET, "dev-quota-store-auth")
    assert secret.inputs["name"] == STORE_SECRET
    assert (
        secret.inputs["kmsKeyId"]
        == next(k for k in gated.of_type("aws:kms/key:Key") if k.name.endswith("-secrets-key")).outputs["arn"]
    )
    version = gated.one(SECRET_VERSION, "dev-quota-store-auth").inputs
    assert version["secretId"] == secret.id
    assert json.loads(revealed(version["secretString"])) == {
        "url": f"rediss://{PRIMARY}:{REDIS_PORT}",
        "password": TOKEN,
    }


def test_the_gateways_user_data_holds_neither_the_token_nor_the_endpoint(gated):
    # The config the host fetches names the secret (next test); the store's values stay out.
    template = gated.one("aws:ec2/launchTemplate:LaunchTemplate", "dev-gateway-lt")
    user_data = base64.b64decode(template.inputs["userData"]).decode()
    assert TOKEN not in user_data and PRIMARY not in user_data


def test_the_gateways_config_takes_the_store_from_the_secret(gated):
    quota = gateway_config(gated.settings, None).quota
    assert (quota.store, quota.redis_url, quota.redis_auth_secret) == ("redis", "", STORE_SECRET)


def test_only_the_gateway_hosts_reach_the_store_and_only_on_its_port(gated):
    store, gateway = _sg(gated, "dev-quota-store-sg"), _sg(gated, "dev-gateway-sg")
    assert _rules(gated, INGRESS, store) == {(gateway, "tcp", REDIS_PORT)}
    assert _rules(gated, EGRESS, store) == set()
    assert (store, "tcp", REDIS_PORT) in _rules(gated, EGRESS, gateway)


def test_the_gateway_role_may_read_the_store_secret(gated):
    [policy] = [p for p in gated.of_type(ROLE_POLICY) if p.name == "dev-gateway-policy"]
    [reads] = [s for s in json.loads(policy.inputs["policy"])["Statement"] if s["Sid"] == "ReadKeyDigests"]
    region = gated.settings.region
    assert f"arn:aws:secretsmanager:{region}:123456789012:secret:{STORE_SECRET}-*" in reads["Resource"]


def test_the_stack_exports_the_store_endpoint(gated):
    assert gated.outputs["quota_store_endpoint"] == PRIMARY


def test_a_stack_without_a_shared_store_makes_no_cache_and_exports_none():
    dev = graph_for("dev")
    assert dev.of_type(GROUP) == [] and dev.outputs["quota_store_endpoint"] is None


@pytest.mark.parametrize(
    ("quota", "provisioned"),
    [
        ({"store": "redis", "redis_auth_secret": STORE_SECRET}, True),
        ({"store": "redis", "redis_url": "rediss://quota.internal:6379"}, False),
        ({"store": "memory"}, False),
    ],
)
def test_only_a_redis_store_without_a_url_is_provisioned(quota, provisioned):
    assert provisions_store(QuotaConfig(**quota)) is provisioned


def test_a_shared_store_with_neither_url_nor_secret_is_refused_naming_both():
    with pytest.raises(ValueError, match="redis_url") as refused:
        QuotaConfig(store="redis")
    assert "redis_auth_secret" in str(refused.value)


def test_a_memory_store_naming_an_auth_secret_is_refused_naming_the_field():
    with pytest.raises(ValueError, match="redis_auth_secret is set but store is 'memory'"):
        QuotaConfig(store="memory", redis_auth_secret=STORE_SECRET)


# --- where the gateway hosts may send --------------------------------------------------------------


def test_with_endpoints_egress_gateway_hosts_reach_aws_through_the_vpc_and_s3s_prefix_list(gated):
    gateway = _sg(gated, "dev-gateway-sg")
    vpc = gated.settings.network.vpc_cidr
    assert {(vpc, "tcp", 443), (S3_PREFIX_LIST, "tcp", 443)} <= _rules(gated, EGRESS, gateway)


def test_with_endpoints_egress_gateway_hosts_reach_nothing_outside_the_vpc(gated):
    gateway = _sg(gated, "dev-gateway-sg")
    assert not [rule for rule in _rules(gated, EGRESS, gateway) if rule[0] == "0.0.0.0/0"]


def test_with_internet_egress_gateway_hosts_reach_https_anywhere(tmp_path):
    path = gated_stack(tmp_path, {"store": "redis", "redis_auth_secret": STORE_SECRET}, egress="internet")
    graph = run(path)
    assert ("0.0.0.0/0", "tcp", 443) in _rules(graph, EGRESS, _sg(graph, "dev-gateway-sg"))


def test_no_gateway_host_boots_before_the_quota_store_exists(gated):
    group = gated.one("aws:autoscaling/group:Group", "dev-gateway-asg")
    store = gated.one("aws:elasticache/replicationGroup:ReplicationGroup")
    assert store.urn in group.dependencies


def test_the_gateways_runtime_discovery_has_an_ec2_endpoint_in_the_vpc(gated):
    services = {e.inputs["serviceName"].rsplit(".", 1)[-1] for e in gated.of_type(ENDPOINT)}
    assert {"ec2", "secretsmanager", "s3"} <= services


# --- the policy pack ------------------------------------------------------------------------------------

CACHE_RULE = next(p for p in POLICIES if p.name == "cache-encrypted-with-auth")


def _violations(resource: Resource, **changes: Any) -> list[str]:
    found: list[str] = []
    args = ResourceValidationArgs(
        resource.type,
        unknown_checking_proxy({**resource.inputs, **changes}),
        resource.urn,
        resource.name,
        PolicyResourceOptions(False, [], None, [], None, [], None),
        None,
        None,
    )
    CACHE_RULE.validate(args, lambda message, urn=None: found.append(message))
    return found


def test_the_cache_rule_passes_on_the_programs_store(gated):
    assert _violations(gated.one(GROUP)) == []


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        ({"transitEncryptionEnabled": False}, "encryption in transit"),
        ({"atRestEncryptionEnabled": False}, "encryption at rest"),
        ({"authToken": ""}, "AUTH token"),
    ],
)
def test_the_cache_rule_fires_on_a_store_left_open(gated, change, fragment):
    [message] = _violations(gated.one(GROUP), **change)
    assert message.startswith("dev-quota-store-redis: ") and fragment in message


# --- the gateway's side: a real redis-server that requires a password -------------------------------

SERVER_PASSWORD = "p" * 32


@pytest.fixture(scope="module")
def guarded_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A redis-server of its own that takes only clients presenting ``SERVER_PASSWORD``."""
    with redis_server(tmp_path_factory.mktemp("redis"), password=SERVER_PASSWORD) as port:
        yield f"redis://127.0.0.1:{port}"


@pytest.fixture
def secrets() -> Iterator[Any]:
    """Secrets Manager as moto serves it in this process (no AWS account here)."""
    with mock_aws():
        yield boto3.client("secretsmanager", region_name="us-east-1")


def _store_secret(secrets: Any, document: dict) -> str:
    name = f"frontier/test/quota-store-{uuid.uuid4().hex[:8]}"
    secrets.create_secret(Name=name, SecretString=json.dumps(document))
    return name


def _admit_once(quotas: RedisQuotas) -> str:
    tenant = Tenant(
        name="acme",
        models=frozenset({"model-a"}),
        requests_per_minute=10,
        tokens_per_minute=1000,
        max_concurrent_requests=2,
        priority="interactive",
    )

    async def admit() -> str:
        try:
            decision = await quotas.admit(tenant, 10, uuid.uuid4().hex)
            return type(decision).__name__
        finally:
            await quotas.aclose()

    return asyncio.run(admit())


@pytest.mark.e2e
def test_the_gateway_reads_url_and_token_from_the_secret_and_admits_through_the_store(guarded_redis, secrets):
    name = _store_secret(secrets, {"url": guarded_redis, "password": SERVER_PASSWORD})
    config = QuotaConfig(store="redis", redis_auth_secret=name, key_prefix=f"t-{uuid.uuid4().hex[:8]}")
    quotas = open_quotas(config, [], hold_s=60, secrets=secrets)
    assert isinstance(quotas, RedisQuotas)
    assert _admit_once(quotas) == "Grant"


@pytest.mark.e2e
def test_a_url_in_the_config_wins_and_the_secret_gives_the_token_alone(guarded_redis, secrets):
    name = _store_secret(secrets, {"password": SERVER_PASSWORD})
    config = QuotaConfig(store="redis", redis_url=guarded_redis, redis_auth_secret=name)
    assert store_connection(config, secrets) == (guarded_redis, SERVER_PASSWORD)


@pytest.mark.e2e
def test_a_wrong_token_stops_the_gateway_at_start_naming_the_store_and_the_secret(guarded_redis, secrets):
    name = _store_secret(secrets, {"url": guarded_redis, "password": "not-the-password"})
    config = QuotaConfig(store="redis", redis_auth_secret=name)
    with pytest.raises(QuotaStoreError) as refused:
        open_quotas(config, [], hold_s=60, secrets=secrets)
    message = str(refused.value)
    assert f"the quota store at {guarded_redis} refused the AUTH token from secret {name!r}" in message


def test_a_missing_secret_is_refused_naming_it(secrets):
    config = QuotaConfig(store="redis", redis_auth_secret="frontier/test/none")
    with pytest.raises(QuotaStoreError, match="secret 'frontier/test/none': ResourceNotFoundException"):
        store_connection(config, secrets)


def test_a_secret_without_the_url_is_refused_naming_the_shape_it_needs(secrets):
    name = _store_secret(secrets, {"password": SERVER_PASSWORD})
    with pytest.raises(QuotaStoreError, match=r'must hold \{"password": "...", "url": "rediss://..."\}'):
        store_connection(QuotaConfig(store="redis", redis_auth_secret=name), secrets)
