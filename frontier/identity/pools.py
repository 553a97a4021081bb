"""Each pool's principal: its hosts (EC2), its pods (Kubernetes) or its host slots (the local stack)
run as a principal of their own, scoped to the pool's weights prefix, its API-keys secret and its
history path, so one pool's hosts cannot read another pool's weights.

The deploy role deploys every pool: it keeps the stack's weights root and history prefix.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace

from frontier.config.purchase import has_notice_queue, notice_queue_name
from frontier.config.schema import PoolSettings, Settings
from frontier.errors import FrontierError
from frontier.identity.cloud import Cloud
from frontier.identity.documents import IdentityArgs
from frontier.release.history import pool_history_prefix
from frontier.release.restore import backup_bucket_name, backup_key_alias


@dataclass(frozen=True)
class StackResources:
    """The stack's resources as its principals' documents name them (ARNs resolved)."""

    weights_bucket_arn: str
    #: The weights prefix every pool's lies under (``Settings.weights_root``'s path).
    weights_prefix: str
    history_bucket_arn: str
    history_prefix: str
    kms_key_arn: str
    #: Each API-keys secret the stack keeps, by its name (``runtime.api_keys_secret``).
    api_keys_secret_arns: Mapping[str, str]
    repository_arn: str
    target_group_arn: str
    #: The release key (frontier.release.signing); "" where the stack has none.
    release_key_arn: str = ""
    #: A rollout by traffic share: the canary target group and the API rule weighing it; "" elsewhere.
    canary_target_group_arn: str = ""
    api_rule_arn: str = ""


def weights_prefix(pool: PoolSettings) -> str:
    """The pool's weights prefix in the stack's weights bucket (``model.weights_uri``'s path)."""
    uri: str = pool.model.weights_uri
    return uri.removeprefix("s3://").partition("/")[2].strip("/")


def stack_identity(
    settings: Settings, cloud: Cloud, found: StackResources, *, ssm_access: bool
) -> IdentityArgs:
    """The deploy role's scope: the stack's weights root, its history, every pool's secret."""
    return IdentityArgs(
        stack=settings.stack,
        cloud=cloud,
        weights_bucket_arn=found.weights_bucket_arn,
        weights_prefix=found.weights_prefix,
        history_bucket_arn=found.history_bucket_arn,
        history_prefix=found.history_prefix,
        kms_key_arn=found.kms_key_arn,
        api_keys_secret_arns=tuple(_secret_arn(found, name) for name in settings.api_keys_secrets.values()),
        repository_arn=found.repository_arn,
        # Behind a gateway the ALB's targets are the gateway's hosts, which their group registers:
        # the deploy role never registers or deregisters one.
        target_group_arn=found.target_group_arn if settings.gateway is None else "",
        canary_target_group_arn=found.canary_target_group_arn if settings.gateway is None else "",
        api_rule_arn=found.api_rule_arn if settings.gateway is None else "",
        release_key_arn=found.release_key_arn,
        ssm_access=ssm_access,
        ssh_user=settings.inventory.ssh_user,
        metering_uri=gateway.metering.uri if (gateway := settings.gateway) else "",
        weights_prefixes=tuple(dict.fromkeys(weights_prefix(pool) for pool in settings.pools)),
        backup_bucket_arn=backup_bucket_arn(settings, cloud, found.history_bucket_arn),
        backup_region=settings.backup.region,
        backup_key_alias=backup_key_alias(settings.stack) if settings.backup.region else "",
        # Known by name before the queue exists, so the role need not wait for it in `pulumi up`.
        interruption_queue_arn=(
            cloud.arn("sqs", notice_queue_name(settings.stack))
            if has_notice_queue(settings.node_groups)
            else ""
        ),
    )


def backup_bucket_arn(settings: Settings, cloud: Cloud, history_bucket_arn: str) -> str:
    """Where the deploy role reads the history's backup copy: the backup bucket, named after the
    history bucket (frontier.release.restore); "" where the stack keeps no copy."""
    region = settings.backup.region
    if not region:
        return ""
    history_bucket = history_bucket_arn.rsplit(":", 1)[-1]
    return f"arn:{cloud.partition}:s3:::{backup_bucket_name(history_bucket, cloud.region, region)}"


def pool_identity(
    settings: Settings, pool: PoolSettings, stack: IdentityArgs, found: StackResources
) -> IdentityArgs:
    """``pool``'s runtime principal: its own weights prefix, secret and history path."""
    pool_prefix = pool_history_prefix(settings, pool.name, stack.history_prefix)
    return replace(
        stack,
        weights_prefix=weights_prefix(pool),
        api_keys_secret_arns=(_secret_arn(found, pool.runtime.api_keys_secret or ""),),
        pool_history_prefix="" if pool_prefix == stack.history_prefix else pool_prefix,
        replica_slots=pool.runtime.nodes_per_replica > 1,
        weights_prefixes=(),
    )


def principal_suffix(settings: Settings, pool: PoolSettings) -> str:
    """What tells a pool's principal from another's in resource names: nothing on a one-model stack
    (its role keeps the name it always had), the pool's name where the file lists its models."""
    if not settings.listed_models:
        return ""
    return "-" + re.sub(r"[^a-z0-9-]+", "-", pool.name.lower()).strip("-")


def _secret_arn(found: StackResources, name: str) -> str:
    try:
        return found.api_keys_secret_arns[name]
    except KeyError:
        raise FrontierError(
            f"runtime.api_keys_secret = {name!r}: not a secret the stack keeps "
            f"({', '.join(sorted(found.api_keys_secret_arns)) or 'none'})"
        ) from None
