"""Foundation: what every cloud stack stands on, whichever its target.

The stack's key and each pool's API-keys secret, its VPC (unless an existing cluster brings its own), its
weights, history and log buckets, its image registry, and what the stack's roles are granted on all
of these. The EC2 program (:mod:`infra.ec2_program`) and the EKS program
(:mod:`infra.kubernetes_program`) each build one and then only what their target adds.

The roles themselves stay with each target: the EC2 deploy role drains the edge's target group,
which is made after the network (so after this), and on Kubernetes the pods' role and the
deployer's depend on the cluster. :meth:`Foundation.identity` hands them the grants.

These components were made at the stack's root before the Foundation existed. Each carries an
alias to its root URN; the Pulumi engine derives its children's old URNs from that alias, so an
existing stack keeps every resource instead of replacing it.
"""

from __future__ import annotations

from dataclasses import dataclass

import pulumi

from frontier.config.schema import Settings
from frontier.identity.pools import principal_suffix
from infra.backup import Backup, BackupArgs, ReplicatedBucket
from infra.cloud import Cloud
from infra.identity import IdentityInputs
from infra.network import Network, NetworkArgs
from infra.registry import Registry, RegistryArgs
from infra.release_key import ReleaseKey, ReleaseKeyArgs
from infra.secret_store import PoolSecret, Secrets, SecretsArgs
from infra.storage import Storage, StorageArgs, stack_metering_bucket
from infra.tags import base_tags

TYPE = "frontier:foundation:Foundation"
WEIGHTS_NONCURRENT_DAYS = 30
HISTORY_NONCURRENT_DAYS = 365


def retention_days(production: bool) -> int:
    """How long logs (flow logs, access logs, the runtime's) are kept."""
    return 90 if production else 30


@dataclass(frozen=True)
class FoundationArgs:
    settings: Settings
    cloud: Cloud
    production: bool
    #: False where an existing cluster brings its own VPC.
    network: bool
    #: Hosts are reached through Session Manager: the VPC gets its endpoints, the roles its grants.
    ssm_access: bool


class Foundation(pulumi.ComponentResource):
    backup: Backup | None
    secrets: Secrets
    network: Network | None
    storage: Storage
    registry: Registry
    release_key: ReleaseKey
    zones: tuple[str, ...]

    def __init__(self, name: str, args: FoundationArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(TYPE, name, None, opts)
        self._args = args
        settings, cloud, production = args.settings, args.cloud, args.production
        stack, tags, retention = settings.stack, base_tags(settings.stack), retention_days(production)
        moved = pulumi.ResourceOptions(parent=self, aliases=[pulumi.Alias(parent=pulumi.ROOT_STACK_RESOURCE)])
        # Weights, history and the key outlive a careless `pulumi destroy` in production.
        keep = pulumi.ResourceOptions.merge(moved, pulumi.ResourceOptions(protect=production))
        self.zones = cloud.availability_zones[: settings.network.availability_zones]
        # The copy in backup.region (infra/backup.py): its key first, which the secret's replica uses.
        self.backup = (
            Backup(
                f"{name}-backup",
                BackupArgs(
                    stack=stack,
                    cloud=cloud,
                    region=settings.backup.region,
                    noncurrent_days=HISTORY_NONCURRENT_DAYS,
                    tags=tags,
                ),
                opts=pulumi.ResourceOptions(parent=self, protect=production),
            )
            if settings.backup.region
            else None
        )

        self.secrets = Secrets(
            f"{name}-secrets",
            SecretsArgs(
                stack=stack,
                cloud=cloud,
                api_keys_secrets=[
                    PoolSecret(
                        pool.name, pool.runtime.api_keys_secret or "", principal_suffix(settings, pool)
                    )
                    for pool in settings.pools
                ],
                production=production,
                tags=tags,
                replica=(settings.backup.region, self.backup.key_arn) if self.backup else None,
            ),
            opts=keep,
        )
        self.network = (
            Network(
                f"{name}-network",
                NetworkArgs(
                    stack=stack,
                    cloud=cloud,
                    cidr=settings.network.vpc_cidr,
                    zones=self.zones,
                    nat=settings.network.nat,
                    ssm_access=args.ssm_access,
                    log_key_arn=self.secrets.key_arn,
                    log_retention_days=retention,
                    tags=tags,
                ),
                opts=moved,
            )
            if args.network
            else None
        )
        self.storage = Storage(
            f"{name}-storage",
            StorageArgs(
                stack=stack,
                cloud=cloud,
                weights_uri=settings.weights_root,
                kms_key_arn=self.secrets.key_arn,
                weights_noncurrent_days=WEIGHTS_NONCURRENT_DAYS,
                history_noncurrent_days=HISTORY_NONCURRENT_DAYS,
                log_expiration_days=retention,
                tags=tags,
                metering_bucket=stack_metering_bucket(settings, cloud),
            ),
            opts=keep,
        )
        if self.backup is not None:
            storage = self.storage
            sources = [ReplicatedBucket("history", storage.history_bucket_name, storage.history)]
            metering = stack_metering_bucket(settings, cloud)
            if storage.metering is not None:
                sources.append(ReplicatedBucket("metering", metering, storage.metering))
            self.backup.replicate(sources, self.secrets.key_arn)
        self.registry = Registry(
            f"{name}-registry",
            RegistryArgs(
                image_repository=settings.image_repository,
                kms_key_arn=self.secrets.key_arn,
                tags=tags,
            ),
            opts=keep,
        )
        # Signs releases: hosts run only what it signed (infra/release_key.py).
        self.release_key = ReleaseKey(
            f"{name}-release",
            ReleaseKeyArgs(stack=stack, cloud=cloud, tags=tags),
            # New with release signing: no root URN to alias; kept like the other key in production.
            opts=pulumi.ResourceOptions(parent=self, protect=production),
        )
        self.register_outputs(
            {
                "kms_key_arn": self.secrets.key_arn,
                "release_key_arn": self.release_key.arn,
                "vpc_id": self.network.vpc_id if self.network else None,
                "weights_bucket": self.storage.weights_bucket,
                "history_bucket": self.storage.history_bucket,
                "repository_url": self.registry.repository_url,
            }
        )

    def identity(
        self,
        target_group_arn: pulumi.Input[str] = "",
        canary_target_group_arn: pulumi.Input[str] = "",
        api_rule_arn: pulumi.Input[str] = "",
    ) -> IdentityInputs:
        """What the stack's roles are granted: each pool's runtime principal its pool's weights
        prefix, secret and history path; the deploy role the stack's weights root and history, the key,
        every pool's API-keys secret and the repository, and on EC2 draining ``target_group_arn`` (none on
        Kubernetes: the ALB is the load balancer controller's), and where the stack rolls by traffic
        share, weighing ``canary_target_group_arn`` against it by ``api_rule_arn``."""
        storage = self.storage
        return IdentityInputs(
            settings=self._args.settings,
            cloud=self._args.cloud,
            weights_bucket_arn=storage.weights_bucket_arn,
            weights_prefix=storage.weights_prefix,
            history_bucket_arn=storage.history_bucket_arn,
            history_prefix=storage.history_prefix,
            kms_key_arn=self.secrets.key_arn,
            release_key_arn=self.release_key.arn,
            api_keys_secret_arns=self.secrets.api_keys_secret_arns,
            repository_arn=self.registry.repository_arn,
            target_group_arn=target_group_arn,
            canary_target_group_arn=canary_target_group_arn,
            api_rule_arn=api_rule_arn,
            ssm_access=self._args.ssm_access,
            tags=base_tags(self._args.settings.stack),
        )
