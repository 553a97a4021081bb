"""Compose one environment from a stack's settings: the whole Pulumi program, as a function.

``infra/__main__.py`` calls :func:`build` with ``load_stack(pulumi.get_stack())``; the tests call it
under mocks with each stack's settings. Everything the program creates follows from the settings and
from what :mod:`infra.cloud` and :func:`infra.nodes.look_up_image` read from the account.
"""

from __future__ import annotations

from collections.abc import Iterator

import pulumi

from frontier.config.schema import SEVERITIES, NodeGroup, Settings
from frontier.render.alerts import resource_limits, severities
from frontier.render.boot import render_cloud_init, render_gateway_cloud_init, replica_nodes
from infra.cloud import Cloud, look_up
from infra.edge import (
    TARGET_TLS_PORT,
    Edge,
    EdgeArgs,
    TargetProxyFiles,
    render_target_proxy,
)
from infra.errors import ProvisionError
from infra.foundation import Foundation, FoundationArgs, retention_days
from infra.gateway import GatewayNodes, GatewayNodesArgs
from infra.host_tools import HostTools, HostToolsArgs
from infra.identity import Identity
from infra.kubernetes_program import build_kubernetes
from infra.monitoring import Monitoring, MonitoringArgs
from infra.nodes import (
    GpuNodeGroup,
    MachineImage,
    NodeGroupArgs,
    launch_timeout_s,
    look_up_image,
    needs_efa,
    refresh_preferences,
    terminate_timeout_s,
)
from infra.outputs import Ec2Outputs, KubernetesOutputs
from infra.quota_store import QuotaStore, QuotaStoreArgs, provisions_store, store_problems
from infra.security_groups import SecurityGroups, SecurityGroupsArgs
from infra.storage import HISTORY_PREFIX_ROOT, bucket_suffix, unique_bucket_name
from infra.tags import base_tags

PRODUCTION_STACKS = frozenset({"prod"})
# ALB target group limits (the stack loader allows wider ranges, valid for HAProxy on the local stack).
ALB_MIN_THRESHOLD = 2
ALB_MIN_INTERVAL_S = 5
ALB_MIN_TIMEOUT_S = 2
WAF_MIN_RATE_LIMIT = 10
USER_DATA_MAX_BYTES = 16 * 1024  # EC2's limit, before base64


def node_user_data(settings: Settings, group: NodeGroup, cloud: Cloud) -> str:
    """The group's cloud-init, pointing at this stack's history bucket (its name is known up front)."""
    return render_cloud_init(
        settings,
        group,
        history_bucket=unique_bucket_name(settings.stack, "history", cloud),
        history_prefix=f"{HISTORY_PREFIX_ROOT}/{settings.stack}/",
        launch_timeout_s=launch_timeout_s(settings.rollout.readiness_timeout_s),
    )


def gateway_nodes(
    settings: Settings, cloud: Cloud, network, security, edge, secrets, tags, boot_dependencies=None
) -> GatewayNodes:  # noqa: ANN001
    """The gateway's CPU node group in the private subnets, registered in the ALB's target group."""
    gw = settings.gateway
    assert gw is not None
    bucket, _, prefix = gw.metering.uri.removeprefix("s3://").partition("/")
    history_bucket = unique_bucket_name(settings.stack, "history", cloud)
    return GatewayNodes(
        f"{settings.stack}-gateway",
        GatewayNodesArgs(
            stack=settings.stack,
            region=cloud.region,
            account_id=cloud.account_id,
            vpc_id=network.vpc_id,
            subnet_ids=network.private_subnet_ids,
            alb_security_group_id=security.alb_id,
            runtime_security_group_id=security.runtime_id,
            target_group_arn=edge.target_group_arn,
            port=gw.port,
            runtime_port=settings.runtime.port,
            instance_type=gw.instance_type,
            ami_id=gw.ami_id,
            min_size=gw.min_size,
            desired_size=gw.desired_size,
            max_size=gw.max_size,
            secret_names=[
                *(t.api_key_secret for t in settings.tenants),
                settings.runtime.api_keys_secret,
                # The quota store's URL and AUTH token (infra.quota_store), read at start.
                *([gw.quota.redis_auth_secret] if gw.quota.redis_auth_secret else []),
            ],
            kms_key_arn=secrets.key_arn,
            metering_bucket=bucket,
            metering_prefix=prefix or "metering",
            history_bucket=history_bucket,
            history_prefix=f"{HISTORY_PREFIX_ROOT}/{settings.stack}/",
            user_data=render_gateway_cloud_init(
                settings,
                history_bucket=history_bucket,
                history_prefix=f"{HISTORY_PREFIX_ROOT}/{settings.stack}/",
            ),
            tags=tags,
            egress=settings.network.egress,
            boot_dependencies=boot_dependencies,
        ),
    )


def is_production(settings: Settings) -> bool:
    return settings.stack in PRODUCTION_STACKS


def refuse_local(settings: Settings) -> None:
    if settings.target == "local":
        raise ProvisionError(
            f"stack {settings.stack!r} is the embedded local environment ({settings.source} has a 'local:' "
            "section): it runs on this machine through `fab`, with moto and HAProxy standing in for AWS, and is "
            "never provisioned by Pulumi. Pick a cloud stack: pulumi up -s dev|staging|prod"
        )


def preflight(
    settings: Settings, cloud: Cloud, images: dict[str, MachineImage], user_data: dict[str, str]
) -> None:
    """Problems AWS would report halfway through an update, reported before anything is created."""
    problems = [*_problems(settings, cloud), *_node_problems(settings, images, user_data)]
    if problems:
        lines = [f"{settings.source}: {len(problems)} problem(s) for provisioning stack {settings.stack!r}"]
        raise ProvisionError("\n".join([*lines, *(f"  {p}" for p in problems)]))


def _problems(s: Settings, cloud: Cloud) -> Iterator[str]:
    if s.inventory.source != "aws":
        yield (
            f"inventory.source = {s.inventory.source!r}: a provisioned stack's hosts are its auto scaling "
            "groups' instances; use 'aws'"
        )
    zones = len(cloud.availability_zones)
    if s.network.availability_zones > zones:
        yield (
            f"network.availability_zones = {s.network.availability_zones}: region {cloud.region} offers "
            f"{zones} ({', '.join(cloud.availability_zones)})"
        )
    cert_region = s.edge.certificate_arn.split(":")[3] if s.edge.certificate_arn.count(":") >= 5 else ""
    if cert_region != cloud.region:
        yield (
            f"edge.certificate_arn = {s.edge.certificate_arn!r}: an ALB needs an ACM certificate of its own "
            f"region ({cloud.region})"
        )
    registry = f"{cloud.account_id}.dkr.ecr.{cloud.region}.{cloud.dns_suffix}"
    host, _, path = s.runtime.image_repository.partition("/")
    if host != registry or not path:
        yield (
            f"runtime.image_repository = {s.runtime.image_repository!r}: hosts pull the runtime from the ECR "
            f"repository this stack creates; expected {registry}/<name>"
        )
    weights_bucket = s.model.weights_uri.removeprefix("s3://").split("/", 1)[0]
    if not weights_bucket.endswith(bucket_suffix(cloud)):
        yield (
            f"model.weights_uri = {s.model.weights_uri!r}: S3 bucket names are global; name the weights "
            f"bucket with this account and region, e.g. frontier-{s.stack}-weights{bucket_suffix(cloud)}"
        )
    health = s.health
    for field in ("healthy_threshold", "unhealthy_threshold"):
        if getattr(health, field) < ALB_MIN_THRESHOLD:
            yield f"health.{field} = {getattr(health, field)}: an ALB target group needs 2 to 10"
    if health.interval_s < ALB_MIN_INTERVAL_S:
        yield f"health.interval_s = {health.interval_s}: an ALB target group checks every 5 to 300 s"
    if health.timeout_s < ALB_MIN_TIMEOUT_S:
        yield f"health.timeout_s = {health.timeout_s}: an ALB target group waits 2 to 120 s"
    if s.runtime.port == TARGET_TLS_PORT:
        yield (
            f"runtime.port = {s.runtime.port}: the hosts' TLS proxy for the load balancer listens there; "
            f"pick another port than {TARGET_TLS_PORT}"
        )
    if 0 < s.edge.waf_rate_limit < WAF_MIN_RATE_LIMIT:
        yield f"edge.waf_rate_limit = {s.edge.waf_rate_limit}: WAF rate limits start at {WAF_MIN_RATE_LIMIT} (0 turns WAF off)"
    yield from store_problems(s.stack, s.gateway.quota if s.gateway else None)


def _node_problems(
    settings: Settings, images: dict[str, MachineImage], user_data: dict[str, str]
) -> Iterator[str]:
    for index, group in enumerate(settings.node_groups):
        size = len(user_data[group.name].encode())
        if size > USER_DATA_MAX_BYTES:
            yield (
                f"node_groups[{index}] ({group.name}): the cloud-init rendered from templates/cloud-init.yaml.j2 is "
                f"{size} bytes; EC2 accepts at most {USER_DATA_MAX_BYTES}"
            )
        if group.cache_volume_gb == group.root_volume_gb:
            yield (
                f"node_groups[{index}].cache_volume_gb = {group.cache_volume_gb}: must differ from root_volume_gb; "
                "cloud-init tells the model-cache volume from the root volume by its size"
            )
        image = images[group.name]
        if group.root_volume_gb < image.root_snapshot_gb:
            yield (
                f"node_groups[{index}].root_volume_gb = {group.root_volume_gb}: the AMI {image.image_id} "
                f"needs at least {image.root_snapshot_gb} GB"
            )


def build(settings: Settings) -> Ec2Outputs[pulumi.Input[str]] | KubernetesOutputs[pulumi.Input[str]]:
    """Create every resource of the stack; returns what ``fab`` needs to operate it."""
    refuse_local(settings)
    if settings.target == "kubernetes":
        return build_kubernetes(settings)
    cloud = look_up(settings.region)
    images = {group.name: look_up_image(group) for group in settings.node_groups}
    user_data = {group.name: node_user_data(settings, group, cloud) for group in settings.node_groups}
    preflight(settings, cloud, images, user_data)

    stack, production = settings.stack, is_production(settings)
    tags = base_tags(stack)
    bastion = bool(settings.inventory.ssh_gateway)
    foundation = Foundation(
        stack,
        FoundationArgs(
            settings=settings, cloud=cloud, production=production, network=True, ssm_access=not bastion
        ),
    )
    secrets, storage, registry, network = (
        foundation.secrets,
        foundation.storage,
        foundation.registry,
        foundation.network,
    )
    assert network is not None  # an EC2 stack always builds its VPC
    efa_groups = {group.name for group in settings.node_groups if needs_efa(settings, group)}
    security = SecurityGroups(
        f"{stack}-sg",
        SecurityGroupsArgs(
            vpc_id=network.vpc_id,
            runtime_port=settings.runtime.port,
            bastion=bastion,
            efa=bool(efa_groups),
            tags=tags,
            alb_to_runtime=settings.gateway is None,
            # TLS to the hosts (infra.edge): the ALB reaches their HAProxy, not the runtime's port.
            alb_target_port=TARGET_TLS_PORT,
            alb_sources=settings.edge.client_cidrs(settings.network.vpc_cidr),
            egress=settings.network.egress,
            vpc_cidr=settings.network.vpc_cidr,
            s3_prefix_list_id=network.s3_prefix_list_id,
        ),
    )
    edge = Edge(
        f"{stack}-edge",
        EdgeArgs(
            stack=stack,
            vpc_id=network.vpc_id,
            subnet_ids=network.private_subnet_ids
            if settings.edge.scheme == "internal"
            else network.public_subnet_ids,
            internal=settings.edge.scheme == "internal",
            security_group_id=security.alb_id,
            # HTTPS to the targets either way: behind a gateway they are the gateway's hosts, which
            # terminate TLS in the gateway on its port (templates/gateway-cloud-init.yaml.j2);
            # runtime hosts terminate it in HAProxy (infra.edge).
            target_port=settings.gateway.port if settings.gateway else TARGET_TLS_PORT,
            target_protocol="HTTPS",
            # The serving hosts' TLS proxy, fetched at boot beside the host tools.
            target_proxy=None
            if settings.gateway
            else TargetProxyFiles(
                content=render_target_proxy(settings),
                bucket=storage.history_bucket,
                history_prefix=storage.history_prefix,
                groups=[settings.serving_group.name],
                kms_key_arn=secrets.key_arn,
            ),
            health=settings.health,
            deregistration_delay_s=settings.rollout.deregistration_delay_s,
            certificate_arn=settings.edge.certificate_arn,
            ssl_policy=settings.edge.ssl_policy,
            idle_timeout_s=settings.edge.idle_timeout_s,
            waf_rate_limit=settings.edge.waf_rate_limit,
            allow_cidrs=settings.edge.allow_cidrs,
            deletion_protection=production,
            logs_bucket=storage.logs_bucket,
            tags=tags,
        ),
    )
    identity = Identity(f"{stack}-iam", foundation.identity(target_group_arn=edge.target_group_arn))
    # What a booting host fetches; uploaded before any group can launch one.
    tools = HostTools(
        f"{stack}-host-tools",
        HostToolsArgs(
            settings=settings,
            history_bucket=storage.history_bucket,
            history_prefix=storage.history_prefix,
            kms_key_arn=secrets.key_arn,
            tags=tags,
        ),
    )
    groups = []
    for group in settings.node_groups:
        serving = group is settings.serving_group and settings.gateway is None
        groups.append(
            GpuNodeGroup(
                f"{stack}-{group.name}",
                NodeGroupArgs(
                    stack=stack,
                    group=group,
                    image=images[group.name],
                    user_data=user_data[group.name],
                    instance_profile_arn=identity.instance_profile_arn,
                    security_group_ids=[security.runtime_id],
                    subnet_ids=network.private_subnet_ids,
                    target_group_arns=[edge.target_group_arn] if serving else [],
                    efa=group.name in efa_groups,
                    health_check_grace_s=settings.rollout.readiness_timeout_s,
                    tags=tags,
                    launch_timeout_s=launch_timeout_s(settings.rollout.readiness_timeout_s),
                    terminate_timeout_s=terminate_timeout_s(settings),
                    refresh=refresh_preferences(settings, group),
                    # A component stands for all its resources here; a component's own depends_on
                    # would not reach the group inside it.
                    boot_dependencies=[
                        *identity.host_permissions,
                        tools,
                        *edge.target_proxy_objects,
                        storage,
                        secrets,
                    ],
                    nodes_per_replica=replica_nodes(settings, group),
                ),
            )
        )
    stores: list[QuotaStore] = []
    if settings.gateway is not None:
        gw = settings.gateway

        def quota_store_for(gateway_security_group_id: pulumi.Output[str]) -> list[pulumi.Resource]:
            """The store the gateway's hosts share, made once their security group exists."""
            if not provisions_store(gw.quota):
                return []
            stores.append(
                QuotaStore(
                    f"{stack}-quota-store",
                    QuotaStoreArgs(
                        stack=stack,
                        vpc_id=network.vpc_id,
                        subnet_ids=network.private_subnet_ids,
                        gateway_security_group_id=gateway_security_group_id,
                        auth_secret_name=gw.quota.redis_auth_secret,
                        kms_key_arn=secrets.key_arn,
                        production=production,
                        tags=tags,
                    ),
                )
            )
            return stores

        gateway = gateway_nodes(settings, cloud, network, security, edge, secrets, tags, quota_store_for)
        security.confine_gateway(gateway.security_group_id)
    quota_store = stores[0] if stores else None
    monitoring = Monitoring(
        f"{stack}-monitoring",
        MonitoringArgs(
            stack=stack,
            region=cloud.region,
            slo=settings.slo,
            queue_depth_alarm=settings.monitoring.queue_depth_alarm,
            node_group=settings.serving_group.name,
            unhealthy_allowance=max(settings.rollout.batch_size, settings.rollout.canary_hosts),
            routes={severity: settings.alert_route(severity) for severity in SEVERITIES},
            severities=severities(settings),
            node_groups={g.name: g.accelerator == "gpu" for g in settings.node_groups},
            limits=resource_limits(settings),
            kms_key_arn=secrets.key_arn,
            log_retention_days=retention_days(production),
            alb_arn_suffix=edge.alb_arn_suffix,
            target_group_arn_suffix=edge.target_group_arn_suffix,
            asg_names=[g.asg_name for g in groups],
            tags=tags,
            gateway=settings.gateway is not None,
        ),
    )
    return Ec2Outputs(
        region=cloud.region,
        weights_bucket=storage.weights_bucket,
        weights_prefix=storage.weights_prefix,
        history_bucket=storage.history_bucket,
        history_prefix=storage.history_prefix,
        target_group_arn=edge.target_group_arn,
        asg_names=[g.asg_name for g in groups],
        ecr_repository_url=registry.repository_url,
        api_keys_secret_arn=secrets.api_keys_secret_arn,
        alb_dns_name=edge.alb_dns_name,
        # The API's base URL: the ALB answers HTTPS only.
        # The certificate's name when the stack gives one: TLS checks pass against it.
        endpoint=f"https://{settings.edge.domain}"
        if settings.edge.domain
        else pulumi.Output.concat("https://", edge.alb_dns_name),
        alb_zone_id=edge.alb_zone_id,
        kms_key_arn=secrets.key_arn,
        deploy_role_arn=identity.deploy_role_arn,
        runtime_role_arn=identity.runtime_role_arn,
        alarm_topic_arn=monitoring.topic_arn,
        dashboard_name=monitoring.dashboard_name,
        vpc_id=network.vpc_id,
        private_subnet_ids=network.private_subnet_ids,
        host_access="bastion" if bastion else "ssm",
        bastion_security_group_id=security.bastion_id,
        monitoring_security_group_id=security.monitoring_id,
        quota_store_endpoint=quota_store.endpoint if quota_store else None,
    )
