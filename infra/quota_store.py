"""The quota store the gateways of an EC2 stack share: an ElastiCache (Redis OSS) replication group.

Made when the stack's gateway has ``quota.store: redis`` and no ``quota.redis_url`` (the store is
the stack's own, not one the operator runs), named by ``quota.redis_auth_secret``:

- Encrypted in transit (TLS: the gateway connects with ``rediss://``) and at rest with the stack's
  KMS key; clients must present an AUTH token.
- The token is made once by ``pulumi_random`` and kept in the Pulumi state (as a secret) and in the
  Secrets Manager secret ``quota.redis_auth_secret``, as ``{"url": "rediss://<primary>:6379",
  "password": "<token>"}``. The gateway reads both from there at start
  (``frontier_gateway.quotas``): its rendered config names the secret only, so the user data stays
  free of the token and of the endpoint, which exists only once the group does.
- It lives in the private subnets; its security group admits 6379 from the gateway hosts' group and
  nothing else, and the gateway hosts' only way to it is one egress rule on 6379.
- Production keeps a replica in another zone with automatic failover; other stacks run one node.
  Counters are seconds-to-minutes state (token buckets refill within a minute), so nothing is
  snapshotted: a failover or a new group starts every tenant with a full allowance.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws
import pulumi_random as random
from frontier_gateway.config import QuotaConfig

from infra.doors import Rule, open_door
from infra.tags import with_tags

REDIS_PORT = 6379
ENGINE = "redis"
ENGINE_VERSION = "7.1"
PARAMETER_GROUP = "default.redis7"
# ElastiCache takes 16 to 128 printable characters, without '@', '"' or '/': letters and digits only.
AUTH_TOKEN_LENGTH = 64
NODE_TYPE = "cache.t4g.small"
# Production: a primary and a replica in another zone, promoted automatically.
PRODUCTION_NODES = 2
GROUP_ID_MAX = 40
GROUP_ID = re.compile(r"^[A-Za-z](?:-?[A-Za-z0-9])*$")


@dataclass(frozen=True)
class QuotaStoreArgs:
    stack: str
    vpc_id: pulumi.Input[str]
    subnet_ids: Sequence[pulumi.Input[str]]  # the private subnets
    gateway_security_group_id: pulumi.Input[str]
    auth_secret_name: str  # quota.redis_auth_secret
    kms_key_arn: pulumi.Input[str]
    production: bool
    tags: Mapping[str, str]
    node_type: str = NODE_TYPE


def provisions_store(quota: QuotaConfig | None) -> bool:
    """A stack's gateway that shares Redis counters and names no store of its own gets one made."""
    return quota is not None and quota.store == "redis" and not quota.redis_url


def group_id(stack: str) -> str:
    return f"frontier-{stack}-quota"


def store_problems(stack: str, quota: QuotaConfig | None) -> Iterator[str]:
    """What ElastiCache would refuse halfway through an update, found before anything is created."""
    if not provisions_store(quota):
        return
    name = group_id(stack)
    if len(name) > GROUP_ID_MAX or not GROUP_ID.match(name):
        yield (
            f"gateway.quota.store = 'redis' without a redis_url: the stack provisions ElastiCache group "
            f"{name!r}, and ElastiCache takes 1 to {GROUP_ID_MAX} letters, digits and single hyphens "
            f"starting with a letter; use a shorter stack name (at most {GROUP_ID_MAX - len(group_id(''))} "
            "characters) or give the gateway a redis_url of its own"
        )


def redis_url(address: str) -> str:
    """Where the gateway connects: TLS (``rediss``) to the group's primary endpoint."""
    return f"rediss://{address}:{REDIS_PORT}"


def connection_document(address: str, password: str) -> str:
    """The secret's value: what ``frontier_gateway.quotas`` reads at start."""
    return json.dumps({"url": redis_url(address), "password": password})


class QuotaStore(pulumi.ComponentResource):
    endpoint: pulumi.Output[str]
    url: pulumi.Output[str]
    secret_arn: pulumi.Output[str]
    security_group_id: pulumi.Output[str]

    def __init__(self, name: str, args: QuotaStoreArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("frontier:gateway:QuotaStore", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        tags = with_tags(dict(args.tags), role="quota-store")

        group = aws.ec2.SecurityGroup(
            f"{name}-sg",
            vpc_id=args.vpc_id,
            description=f"Quota store: {REDIS_PORT} from the gateway hosts only",
            tags=tags | {"Name": f"{name}-sg"},
            opts=child,
        )
        open_door(
            REDIS_PORT,
            source=args.gateway_security_group_id,
            target=group.id,
            ingress=Rule(f"{name}-from-gateway", "Quota counters from the gateway hosts"),
            egress=Rule(f"{name}-gateway-to-store", "The gateway's quota counters"),
            opts=child,
        )
        subnets = aws.elasticache.SubnetGroup(
            f"{name}-subnets",
            name=group_id(args.stack),
            description=f"Frontier {args.stack}: the quota store's private subnets",
            subnet_ids=list(args.subnet_ids),
            tags=tags,
            opts=child,
        )
        token = random.RandomPassword(
            f"{name}-auth-token",
            length=AUTH_TOKEN_LENGTH,
            special=False,
            # The output is marked secret by the provider; the state encrypts it.
            opts=child,
        )
        nodes = PRODUCTION_NODES if args.production else 1
        store = aws.elasticache.ReplicationGroup(
            f"{name}-redis",
            replication_group_id=group_id(args.stack),
            description=f"Frontier {args.stack}: tenants' quota counters, shared by the gateways",
            engine=ENGINE,
            engine_version=ENGINE_VERSION,
            parameter_group_name=PARAMETER_GROUP,
            node_type=args.node_type,
            num_cache_clusters=nodes,
            automatic_failover_enabled=nodes > 1,
            multi_az_enabled=nodes > 1,
            port=REDIS_PORT,
            subnet_group_name=subnets.name,
            security_group_ids=[group.id],
            transit_encryption_enabled=True,
            at_rest_encryption_enabled=True,
            kms_key_id=args.kms_key_arn,
            auth_token=token.result,
            # A new token is accepted beside the old one until the gateways have read it.
            auth_token_update_strategy="ROTATE",
            snapshot_retention_limit=0,
            apply_immediately=True,
            tags=tags,
            opts=child,
        )
        secret = aws.secretsmanager.Secret(
            f"{name}-auth",
            name=args.auth_secret_name,
            description=f"Frontier {args.stack}: the quota store's URL and AUTH token",
            kms_key_id=args.kms_key_arn,
            recovery_window_in_days=30 if args.production else 7,
            tags=tags,
            # Like the stack's other secrets: a production stack's cannot go by accident.
            opts=pulumi.ResourceOptions(parent=self, protect=args.production),
        )
        aws.secretsmanager.SecretVersion(
            f"{name}-auth",
            secret_id=secret.id,
            secret_string=pulumi.Output.secret(
                pulumi.Output.all(store.primary_endpoint_address, token.result).apply(
                    lambda values: connection_document(values[0], values[1])
                )
            ),
            opts=child,
        )
        self.endpoint = store.primary_endpoint_address
        self.url = store.primary_endpoint_address.apply(redis_url)
        self.secret_arn = secret.arn
        self.security_group_id = group.id
        self.register_outputs({"endpoint": self.endpoint, "secret_arn": secret.arn})
