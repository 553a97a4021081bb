"""IAM roles of an EC2 stack: each pool's hosts' instance role and profile, and the deploy role.

What each role may do is :mod:`frontier.identity`'s (the documents, Pulumi-free, which the local
stack's moto users are made from too). Here the stack's resources' ARNs are resolved and those
documents become roles: one runtime role and instance profile per pool, scoped to that pool's weights
prefix, API-keys secret and history path (a host of one pool cannot read another pool's weights),
and one deploy role, which deploys every pool.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws

from frontier.config.schema import PoolSettings, Settings
from frontier.identity.documents import (
    DEPLOY_SESSION_S,
    IdentityArgs,
    PolicyDocument,
    deploy_policy,
    lifecycle_policy,
    runtime_policy,
    trust,
)
from frontier.identity.pools import StackResources, pool_identity, principal_suffix, stack_identity
from infra.cloud import Cloud


@dataclass(frozen=True)
class IdentityInputs:
    """The stack's resources as the Pulumi program holds them (ARNs not yet known), from which each
    principal's :class:`~frontier.identity.documents.IdentityArgs` are resolved."""

    settings: Settings
    cloud: Cloud
    weights_bucket_arn: pulumi.Input[str]
    weights_prefix: str
    history_bucket_arn: pulumi.Input[str]
    history_prefix: str
    kms_key_arn: pulumi.Input[str]
    #: Each pool's API-keys secret, by model name.
    api_keys_secret_arns: Mapping[str, pulumi.Input[str]]
    repository_arn: pulumi.Input[str]
    target_group_arn: pulumi.Input[str]
    ssm_access: bool
    tags: Mapping[str, str]
    #: The release key (infra/release_key.py): the deploy role signs with it, hosts read its public key.
    release_key_arn: pulumi.Input[str] = ""
    #: A rollout by traffic share: the canary target group and the API rule weighing it; "" elsewhere.
    canary_target_group_arn: pulumi.Input[str] = ""
    api_rule_arn: pulumi.Input[str] = ""

    @property
    def stack(self) -> str:
        return self.settings.stack

    def _resolved(self, make: Callable[[StackResources], IdentityArgs]) -> pulumi.Output[IdentityArgs]:
        models = list(self.api_keys_secret_arns)

        def resources(arns: list[str]) -> IdentityArgs:
            weights, history, key, repository, target_group, release_key, canary, rule, *secrets = arns
            return make(
                StackResources(
                    weights_bucket_arn=weights,
                    weights_prefix=self.weights_prefix,
                    history_bucket_arn=history,
                    history_prefix=self.history_prefix,
                    kms_key_arn=key,
                    api_keys_secret_arns={
                        self.settings.api_keys_secrets[model]: secret
                        for model, secret in zip(models, secrets, strict=True)
                    },
                    repository_arn=repository,
                    target_group_arn=target_group or "",
                    release_key_arn=release_key or "",
                    canary_target_group_arn=canary or "",
                    api_rule_arn=rule or "",
                )
            )

        return pulumi.Output.all(
            self.weights_bucket_arn,
            self.history_bucket_arn,
            self.kms_key_arn,
            self.repository_arn,
            self.target_group_arn,
            self.release_key_arn,
            self.canary_target_group_arn,
            self.api_rule_arn,
            *self.api_keys_secret_arns.values(),
        ).apply(resources)

    def for_stack(self) -> pulumi.Output[IdentityArgs]:
        """The deploy role's scope."""
        return self._resolved(
            lambda found: stack_identity(self.settings, self.cloud, found, ssm_access=self.ssm_access)
        )

    def for_pool(self, pool: PoolSettings) -> pulumi.Output[IdentityArgs]:
        """``pool``'s runtime principal's scope."""
        return self._resolved(
            lambda found: pool_identity(
                self.settings,
                pool,
                stack_identity(self.settings, self.cloud, found, ssm_access=self.ssm_access),
                found,
            )
        )


def rendered(
    args: pulumi.Output[IdentityArgs], make: Callable[[IdentityArgs], PolicyDocument]
) -> pulumi.Output[str]:
    """The JSON of ``make``'s document once ``args``' ARNs are known."""
    return args.apply(lambda resolved: make(resolved).to_json())


def service_role(
    name: str, service: str, description: str, cloud: Cloud, tags: Mapping[str, str], parent: pulumi.Resource
) -> aws.iam.Role:
    """A role that an AWS ``service`` (``ec2``, ``eks``, ``lambda``) assumes for the stack, a child
    of ``parent``."""
    return aws.iam.Role(
        name,
        description=description,
        assume_role_policy=trust({"Service": cloud.service_principal(service)}),
        tags=dict(tags),
        opts=pulumi.ResourceOptions(parent=parent),
    )


@dataclass(frozen=True)
class PoolRole:
    """One pool's hosts' identity."""

    role_arn: pulumi.Output[str]
    role_name: pulumi.Output[str]
    instance_profile_arn: pulumi.Output[str]
    #: What a host's role may do the moment it boots: its groups wait for these (depends_on).
    host_permissions: tuple[pulumi.Resource, ...]


class Identity(pulumi.ComponentResource):
    deploy_role_arn: pulumi.Output[str]
    pools: dict[str, PoolRole]

    def __init__(self, name: str, args: IdentityInputs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("frontier:identity:Identity", name, None, opts)
        self.name = name
        child = pulumi.ResourceOptions(parent=self)
        tags, cloud, settings = dict(args.tags), args.cloud, args.settings

        self.pools = {}
        for pool in settings.pools:
            suffix = principal_suffix(settings, pool)
            runtime = service_role(
                f"{name}-runtime{suffix}",
                "ec2",
                f"Frontier {args.stack}: runtime hosts of {pool.name}",
                cloud,
                tags,
                self,
            )
            grants = aws.iam.RolePolicy(
                f"{name}-runtime{suffix}",
                role=runtime.id,
                policy=rendered(args.for_pool(pool), lambda a: runtime_policy(a, hosts=True)),
                opts=child,
            )
            lifecycle = aws.iam.RolePolicy(
                f"{name}-lifecycle{suffix}",
                role=runtime.name,
                policy=lifecycle_policy(cloud, args.stack).to_json(),
                opts=child,
            )
            profile = aws.iam.InstanceProfile(
                f"{name}-runtime{suffix}", role=runtime.name, tags=tags, opts=child
            )
            self.pools[pool.name] = PoolRole(
                runtime.arn, runtime.name, profile.arn, (grants, lifecycle, profile)
            )

        deploy = aws.iam.Role(
            f"{name}-deploy",
            description=f"Frontier {args.stack}: fab deploy, rollback, weights and image push",
            # Principals of this account that IAM allows to assume it; the account decides who.
            assume_role_policy=trust({"AWS": cloud.account_root}),
            max_session_duration=DEPLOY_SESSION_S,
            tags=tags,
            opts=child,
        )
        aws.iam.RolePolicy(
            f"{name}-deploy", role=deploy.id, policy=rendered(args.for_stack(), deploy_policy), opts=child
        )
        self.deploy_role_arn = deploy.arn
        self.register_outputs(
            {
                "deploy_role_arn": deploy.arn,
                **{f"runtime_role_arn:{p}": r.role_arn for p, r in self.pools.items()},
            }
        )

    def of(self, pool: PoolSettings) -> PoolRole:
        return self.pools[pool.name]
