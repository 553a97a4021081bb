"""The Pulumi program of an ``ec2`` stack: the foundation (network, storage, registry, secrets), the
security groups, the load balancer, the IAM roles, the GPU node groups, the gateway's nodes and
quota store where the stack has a gateway, and the monitoring.

:func:`infra.program.build` hands an ``ec2`` stack here. Everything the program creates follows from
the settings and from what :mod:`infra.cloud` and :func:`infra.nodes.look_up_image` read from the
account; :func:`build_ec2` reads top to bottom, one named part per component.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pulumi
from frontier_hostside.names import HOST_TOOLS_PREFIX

from frontier.capacity.startup import instance_warmup
from frontier.config.checks import is_production
from frontier.config.schema import SEVERITIES, NodeGroup, PoolSettings, Settings
from frontier.identity.gateway import tokenizer_arns
from frontier.release.history import pool_history_prefix
from frontier.render.alerts import resource_limits, severities
from frontier.render.boot import group_pool, render_cloud_init, render_gateway_cloud_init, replica_nodes
from infra.cloud import Cloud, look_up
from infra.edge import (
    TARGET_PROXY_FILE,
    TARGET_TLS_PORT,
    Edge,
    EdgeArgs,
    TargetProxyFile,
    TargetProxyFiles,
    render_target_proxy,
)
from infra.foundation import Foundation, FoundationArgs, retention_days
from infra.gateway import GatewayNodes, GatewayNodesArgs, gateway_image_problems, look_up_gateway_image
from infra.host_tools import HostTools, HostToolsArgs
from infra.identity import Identity
from infra.interruptions import wire_interruptions
from infra.lambda_function import FunctionVpc
from infra.monitoring import Monitoring, MonitoringArgs
from infra.network import Network
from infra.nodes import (
    GpuNodeGroup,
    MachineImage,
    NodeGroupArgs,
    image_problems,
    launch_timeout_s,
    look_up_image,
    needs_efa,
    refresh_preferences,
    scale_out_signal,
    terminate_timeout_s,
    ttft_scale_out,
)
from infra.out_of_service import OutOfService, OutOfServiceArgs, needs_out_of_service
from infra.outputs import Ec2Outputs
from infra.placement import GpuPlacement, look_up_placement, placement_problems
from infra.preflight import certificate_problems, refuse_problems, registry_problems, weights_bucket_problems
from infra.probe import probe_door
from infra.quota_store import QuotaStore, QuotaStoreArgs, provisions_store, store_problems
from infra.replica_scaling import ReplicaTerminationArgs
from infra.secret_store import autoscaling_service_role
from infra.security_groups import KvTransferDoor, SecurityGroups, SecurityGroupsArgs
from infra.storage import HISTORY_PREFIX_ROOT, metering_problems, unique_bucket_name
from infra.tags import base_tags

# ALB target group limits (the stack loader allows wider ranges, valid for HAProxy on the local stack).
ALB_MIN_THRESHOLD = 2
ALB_MIN_INTERVAL_S = 5
ALB_MIN_TIMEOUT_S = 2
WAF_MIN_RATE_LIMIT = 10
USER_DATA_MAX_BYTES = 16 * 1024  # EC2's limit, before base64


@dataclass(frozen=True)
class Ground:
    """What every part of the program stands on: the settings, the account, and the foundation with
    its VPC (an EC2 stack always builds one)."""

    settings: Settings
    cloud: Cloud
    production: bool
    tags: dict[str, str]
    foundation: Foundation
    network: Network

    @property
    def stack(self) -> str:
        return self.settings.stack


def build_ec2(settings: Settings) -> Ec2Outputs[pulumi.Input[str]]:
    """Create every resource of the stack; returns what ``fab`` needs to operate it."""
    cloud = look_up(settings.region)
    images = {group.name: look_up_image(group) for group in settings.node_groups}
    user_data = {group.name: node_user_data(settings, group, cloud) for group in settings.node_groups}
    placement = look_up_placement(settings)
    gateway_image = look_up_gateway_image(settings)
    preflight(settings, cloud, images, user_data, placement, gateway_image)

    ground = lay_ground(settings, cloud)
    efa_groups = {group.name for group in settings.node_groups if needs_efa(settings, group)}
    security = security_groups(ground, efa=bool(efa_groups))
    edge = load_balancer(ground, security)
    identity = Identity(
        f"{ground.stack}-iam",
        ground.foundation.identity(
            target_group_arn=edge.target_group_arn,
            canary_target_group_arn=edge.canary_target_group_arn or "",
            api_rule_arn=edge.api_rule_arn or "",
        ),
    )
    # The release key's policy names its one signer, which exists only now.
    ground.foundation.release_key.signed_by(identity.deploy_role_arn)
    # What a booting host fetches; uploaded before any group can launch one.
    tools = host_tools(ground)
    groups = [
        node_group(
            ground,
            group,
            images[group.name],
            user_data[group.name],
            security,
            edge,
            identity,
            tools,
            efa_groups,
            zones=placement.zones_for(group, ground.foundation.zones),
        )
        for group in settings.node_groups
    ]
    # Spot and Capacity Block notices on one queue; a block's hosts move to its fallback at its warning.
    wire_interruptions(ground.stack, ground.tags, settings.node_groups, [g.asg_name for g in groups])
    if needs_out_of_service(settings):
        # A warned spot host leaves the ALB's groups at once, not after its failed health checks.
        OutOfService(
            f"{ground.stack}-out-of-service",
            OutOfServiceArgs(
                stack=ground.stack,
                cloud=ground.cloud,
                target_group_arns=[
                    edge.target_group_arn,
                    *([edge.canary_target_group_arn] if edge.canary_target_group_arn is not None else []),
                ],
                log_retention_days=retention_days(ground.production),
                kms_key_arn=ground.foundation.secrets.key_arn,
                tags=ground.tags,
            ),
        )
    quota_store = gateway(ground, security, edge) if settings.gateway is not None else None
    monitoring = monitoring_for(ground, security, edge, groups)
    return outputs(ground, security, edge, identity, groups, monitoring, quota_store)


# --- preflight ------------------------------------------------------------------------------------


def node_user_data(settings: Settings, group: NodeGroup, cloud: Cloud) -> str:
    """The group's cloud-init, pointing at this stack's history bucket (its name is known up front)."""
    return render_cloud_init(
        settings,
        group,
        history_bucket=unique_bucket_name(settings.stack, "history", cloud),
        history_prefix=f"{HISTORY_PREFIX_ROOT}/{settings.stack}/",
        launch_timeout_s=launch_timeout_s(settings.rollout.readiness_timeout_s),
    )


def preflight(
    settings: Settings,
    cloud: Cloud,
    images: dict[str, MachineImage],
    user_data: dict[str, str],
    placement: GpuPlacement,
    gateway_image: MachineImage | None,
) -> None:
    """Problems AWS would report halfway through an update, reported before anything is created."""
    zones = cloud.availability_zones[: settings.network.availability_zones]
    refuse_problems(
        settings,
        [
            *_problems(settings, cloud),
            *_node_problems(settings, images, user_data),
            *placement_problems(settings, zones, placement),
            *gateway_image_problems(settings, gateway_image),
        ],
    )


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
    yield from certificate_problems(s, cloud)
    yield from metering_problems(s, cloud)
    yield from registry_problems(s, cloud, "hosts")
    yield from weights_bucket_problems(s, cloud)
    health = s.health
    for field in ("healthy_threshold", "unhealthy_threshold"):
        if getattr(health, field) < ALB_MIN_THRESHOLD:
            yield f"health.{field} = {getattr(health, field)}: an ALB target group needs 2 to 10"
    if health.interval_s < ALB_MIN_INTERVAL_S:
        yield f"health.interval_s = {health.interval_s}: an ALB target group checks every 5 to 300 s"
    if health.timeout_s < ALB_MIN_TIMEOUT_S:
        yield f"health.timeout_s = {health.timeout_s}: an ALB target group waits 2 to 120 s"
    for pool in s.pools:
        if pool.runtime.port == TARGET_TLS_PORT:
            yield (
                f"runtime.port = {pool.runtime.port}: the hosts' TLS proxy for the load balancer listens "
                f"there (model {pool.name}); pick another port than {TARGET_TLS_PORT}"
            )
        if pool.disaggregation is not None:
            yield from _disaggregation_problems(s, pool)
    if 0 < s.edge.waf_rate_limit < WAF_MIN_RATE_LIMIT:
        yield f"edge.waf_rate_limit = {s.edge.waf_rate_limit}: WAF rate limits start at {WAF_MIN_RATE_LIMIT} (0 turns WAF off)"
    yield from store_problems(s.stack, s.gateway.quota if s.gateway else None)


def _disaggregation_problems(s: Settings, pool: PoolSettings) -> Iterator[str]:
    """A disaggregated pool's halves as EC2 runs them: behind the gateway, a replica per host within
    each group's sizes, the transfer listener on a port of its own."""
    assert pool.disaggregation is not None
    if s.gateway is None:
        yield (
            f"disaggregation (model {pool.name}): a request goes to a prefill and then a decode "
            "replica through the gateway; add a 'frontier:gateway' section"
        )
    for role, half in (("prefill", pool.disaggregation.prefill), ("decode", pool.disaggregation.decode)):
        group = half.group
        if not group.min_size <= half.replicas <= group.max_size:
            yield (
                f"disaggregation.{role}.replicas = {half.replicas} (model {pool.name}): node group "
                f"{group.name} holds {group.min_size} to {group.max_size} hosts, one replica each"
            )
    port = pool.runtime.kv_transfer.port
    if port in (pool.runtime.port, TARGET_TLS_PORT):
        yield (
            f"runtime.kv_transfer.port = {port} (model {pool.name}): the runtime's API or the hosts' TLS "
            "proxy listens there; pick a port of its own"
        )


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
        yield from image_problems(settings, index, group, image)
        if group.root_volume_gb < image.root_snapshot_gb:
            yield (
                f"node_groups[{index}].root_volume_gb = {group.root_volume_gb}: the AMI {image.image_id} "
                f"needs at least {image.root_snapshot_gb} GB"
            )


# --- the program's parts, in the order they are made ------------------------------------------------


def lay_ground(settings: Settings, cloud: Cloud) -> Ground:
    """The foundation (secrets, network, storage, registry) the rest of the program stands on."""
    production = is_production(settings)
    foundation = Foundation(
        settings.stack,
        FoundationArgs(
            settings=settings,
            cloud=cloud,
            production=production,
            network=True,
            ssm_access=not settings.inventory.ssh_gateway,
        ),
    )
    network = foundation.network
    assert network is not None  # an EC2 stack always builds its VPC
    return Ground(settings, cloud, production, base_tags(settings.stack), foundation, network)


def security_groups(ground: Ground, efa: bool) -> SecurityGroups:
    settings, network = ground.settings, ground.network
    return SecurityGroups(
        f"{ground.stack}-sg",
        SecurityGroupsArgs(
            vpc_id=network.vpc_id,
            runtime_ports=sorted({pool.runtime.port for pool in settings.pools}),
            bastion=bool(settings.inventory.ssh_gateway),
            efa=efa,
            tags=ground.tags,
            alb_to_runtime=settings.gateway is None,
            # TLS to the hosts (infra.edge): the ALB reaches their HAProxy, not the runtime's port.
            alb_target_port=TARGET_TLS_PORT,
            alb_sources=settings.edge.client_cidrs(settings.network.vpc_cidr),
            egress=settings.network.egress,
            vpc_cidr=settings.network.vpc_cidr,
            s3_prefix_list_id=network.s3_prefix_list_id,
            probe=probe_door(settings.edge, settings.network.vpc_cidr, network.nat_public_ips),
            kv_transfers=[
                KvTransferDoor(
                    prefill_group=pool.disaggregation.prefill.group.name,
                    decode_group=pool.disaggregation.decode.group.name,
                    port=pool.runtime.kv_transfer.port,
                )
                for pool in settings.pools
                if pool.disaggregation is not None
            ],
        ),
    )


def load_balancer(ground: Ground, security: SecurityGroups) -> Edge:
    settings, network = ground.settings, ground.network
    storage, secrets = ground.foundation.storage, ground.foundation.secrets
    return Edge(
        f"{ground.stack}-edge",
        EdgeArgs(
            stack=ground.stack,
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
                files=target_proxy_files(settings, storage.history_prefix),
                bucket=storage.history_bucket,
                kms_key_arn=secrets.key_arn,
            ),
            health=settings.health,
            deregistration_delay_s=settings.rollout.deregistration_delay_s,
            certificate_arn=settings.edge.certificate_arn,
            ssl_policy=settings.edge.ssl_policy,
            idle_timeout_s=settings.edge.idle_timeout_s,
            waf_rate_limit=settings.edge.waf_rate_limit,
            allow_cidrs=settings.edge.allow_cidrs,
            deletion_protection=ground.production,
            logs_bucket=storage.logs_bucket,
            tags=ground.tags,
            # Behind a gateway the ALB's targets are the gateway's hosts: no runtime to weigh.
            canary_group=bool(settings.rollout.traffic_steps) and settings.gateway is None,
        ),
    )


def target_proxy_files(settings: Settings, history_prefix: str) -> list[TargetProxyFile]:
    """Each serving group's TLS proxy in front of its pool's runtime, beside the group's host tools
    under that pool's history (where its hosts fetch them: ``frontier.render.boot.render_cloud_init``)."""
    files = []
    for group in settings.node_groups:
        if not settings.pools_on(group):
            continue
        pool = group_pool(settings, group)
        prefix = pool_history_prefix(settings, pool.name, history_prefix)
        files.append(
            TargetProxyFile(
                group=group.name,
                key=f"{prefix}{HOST_TOOLS_PREFIX}{group.name}/{TARGET_PROXY_FILE}",
                content=render_target_proxy(settings, pool),
            )
        )
    return files


def host_tools(ground: Ground) -> HostTools:
    storage = ground.foundation.storage
    return HostTools(
        f"{ground.stack}-host-tools",
        HostToolsArgs(
            settings=ground.settings,
            history_bucket=storage.history_bucket,
            history_prefix=storage.history_prefix,
            kms_key_arn=ground.foundation.secrets.key_arn,
            tags=ground.tags,
        ),
    )


def node_group(
    ground: Ground,
    group: NodeGroup,
    image: MachineImage,
    user_data: str,
    security: SecurityGroups,
    edge: Edge,
    identity: Identity,
    tools: HostTools,
    efa_groups: set[str],
    zones: tuple[str, ...],
) -> GpuNodeGroup:
    """One GPU node group; the serving group joins the ALB's target group unless a gateway fronts it."""
    settings = ground.settings
    # Without a gateway the stack serves one pool: the groups that boot it join the target group
    # (its own, and a Capacity Block's fallback, which takes over the block's hosts).
    serving = settings.gateway is None and bool(settings.pools_on(group))
    pool = group_pool(settings, group)
    # The group's hosts run as its pool's principal: that pool's weights, secret and history only.
    hosts_role = identity.of(pool)
    return GpuNodeGroup(
        f"{ground.stack}-{group.name}",
        NodeGroupArgs(
            stack=ground.stack,
            group=group,
            image=image,
            user_data=user_data,
            instance_profile_arn=hosts_role.instance_profile_arn,
            # A disaggregated half's hosts join its group too: the KV transfer's door (infra.security_groups).
            security_group_ids=[
                security.runtime_id,
                *([security.role_ids[group.name]] if group.name in security.role_ids else []),
            ],
            # Only the zones that offer the group's type (an EFA group takes the first of them).
            subnet_ids=[
                subnet
                for subnet, zone in zip(
                    ground.network.private_subnet_ids, ground.foundation.zones, strict=True
                )
                if zone in zones
            ],
            target_group_arns=[edge.target_group_arn] if serving else [],
            efa=group.name in efa_groups,
            health_check_grace_s=settings.rollout.readiness_timeout_s,
            tags=ground.tags,
            instance_warmup_s=instance_warmup(settings, group).seconds,
            launch_timeout_s=launch_timeout_s(settings.rollout.readiness_timeout_s),
            terminate_timeout_s=terminate_timeout_s(settings, pool),
            refresh=refresh_preferences(settings, group),
            # A component stands for all its resources here; a component's own depends_on
            # would not reach the group inside it.
            boot_dependencies=[
                *hosts_role.host_permissions,
                tools,
                *edge.target_proxy_objects,
                ground.foundation.storage,
                ground.foundation.secrets,
            ],
            nodes_per_replica=replica_nodes(settings, group),
            termination=replica_termination(ground, group),
            max_concurrency=pool.runtime_on(group).max_concurrency,
            scale_on=scale_out_signal(pool, group),
            ttft_scale_out_ms=ttft_scale_out(settings, pool, group),
            desired_size=half_replicas(pool, group),
        ),
    )


def half_replicas(pool: PoolSettings, group: NodeGroup) -> int | None:
    """The replicas a disaggregated pool's half asks of ``group`` (one host each: a half's replica
    runs on one rank); None for any other group, which starts at its desired_size."""
    halves = pool.disaggregation
    if halves is None:
        return None
    return halves.prefill.replicas if halves.role_of(group) == "prefill" else halves.decode.replicas


def replica_termination(ground: Ground, group: NodeGroup) -> ReplicaTerminationArgs | None:
    """Where the group's replica spans hosts, the termination policy that gives up whole replicas."""
    settings = ground.settings
    nodes = replica_nodes(settings, group)
    if nodes == 1:
        return None
    stack_prefix = f"{HISTORY_PREFIX_ROOT}/{settings.stack}/"
    return ReplicaTerminationArgs(
        stack=settings.stack,
        cloud=ground.cloud,
        node_group=group.name,
        nodes_per_replica=nodes,
        history_bucket=ground.foundation.storage.history_bucket,
        history_prefix=pool_history_prefix(settings, group_pool(settings, group).name, stack_prefix),
        kms_key_arn=ground.foundation.secrets.key_arn,
        autoscaling_role_arn=autoscaling_service_role(ground.cloud),
        tags=ground.tags,
        after=[ground.foundation.secrets],
        log_retention_days=retention_days(ground.production),
    )


def gateway(ground: Ground, security: SecurityGroups, edge: Edge) -> QuotaStore | None:
    """The gateway's nodes, and the quota store they share where the stack provisions one (made once
    the nodes' security group exists, which the store admits); returns the store."""
    gw = ground.settings.gateway
    assert gw is not None
    stores: list[QuotaStore] = []

    def quota_store_for(gateway_security_group_id: pulumi.Output[str]) -> list[pulumi.Resource]:
        """The store the gateway's hosts share, made once their security group exists."""
        if not provisions_store(gw.quota):
            return []
        stores.append(
            QuotaStore(
                f"{ground.stack}-quota-store",
                QuotaStoreArgs(
                    stack=ground.stack,
                    vpc_id=ground.network.vpc_id,
                    subnet_ids=ground.network.private_subnet_ids,
                    gateway_security_group_id=gateway_security_group_id,
                    auth_secret_name=gw.quota.redis_auth_secret,
                    kms_key_arn=ground.foundation.secrets.key_arn,
                    production=ground.production,
                    tags=ground.tags,
                ),
            )
        )
        return stores

    nodes = gateway_nodes(
        ground.settings,
        ground.cloud,
        ground.network,
        security,
        edge,
        ground.foundation.secrets,
        ground.tags,
        quota_store_for,
    )
    security.confine_gateway(nodes.security_group_id)
    return stores[0] if stores else None


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
            runtime_ports=sorted({pool.runtime.port for pool in settings.pools}),
            kv_event_ports=sorted(
                {
                    port
                    for pool in settings.pools
                    if pool.runtime.kv_events.enabled
                    for port in (pool.runtime.kv_events.port, pool.runtime.kv_events.replay_port)
                }
            ),
            tokenizer_arns=tokenizer_arns(settings, cloud.partition),
            instance_type=gw.instance_type,
            ami_id=gw.ami_id,
            min_size=gw.min_size,
            desired_size=gw.desired_size,
            max_size=gw.max_size,
            secret_names=[
                *(t.api_key_secret for t in settings.tenants),
                # It calls every pool, each with the key of that pool's own secret.
                *settings.api_keys_secrets.values(),
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


def monitoring_for(
    ground: Ground, security: SecurityGroups, edge: Edge, groups: list[GpuNodeGroup]
) -> Monitoring:
    settings = ground.settings
    return Monitoring(
        f"{ground.stack}-monitoring",
        MonitoringArgs(
            stack=ground.stack,
            region=ground.cloud.region,
            slo=settings.slo,
            queue_depth_alarm=settings.monitoring.queue_depth_alarm,
            serving_groups=[group.name for group in settings.node_groups if settings.pools_on(group)],
            unhealthy_allowance=max(settings.rollout.batch_size, settings.rollout.canary_hosts),
            routes={severity: settings.alert_route(severity) for severity in SEVERITIES},
            severities=severities(settings),
            node_groups={g.name: g.accelerator == "gpu" for g in settings.node_groups},
            limits=resource_limits(settings),
            kms_key_arn=ground.foundation.secrets.key_arn,
            log_retention_days=retention_days(ground.production),
            alb_arn_suffix=edge.alb_arn_suffix,
            target_group_arn_suffix=edge.target_group_arn_suffix,
            asg_names=[g.asg_name for g in groups],
            tags=ground.tags,
            gateway=settings.gateway is not None,
            settings=settings,
            cloud=ground.cloud,
            endpoint=public_endpoint(settings, edge),
            probe_key_secret_arns=ground.foundation.secrets.api_keys_secret_arns,
            probe_vpc=None
            if security.probe_id is None
            else FunctionVpc(
                subnet_ids=ground.network.private_subnet_ids, security_group_ids=[security.probe_id]
            ),
        ),
    )


def public_endpoint(settings: Settings, edge: Edge) -> pulumi.Input[str]:
    """The API's base URL: the ALB answers HTTPS only; the certificate's name when the stack gives
    one (TLS checks pass against it)."""
    if settings.edge.domain:
        return f"https://{settings.edge.domain}"
    return pulumi.Output.concat("https://", edge.alb_dns_name)


def outputs(
    ground: Ground,
    security: SecurityGroups,
    edge: Edge,
    identity: Identity,
    groups: list[GpuNodeGroup],
    monitoring: Monitoring,
    quota_store: QuotaStore | None,
) -> Ec2Outputs[pulumi.Input[str]]:
    """What ``fab`` needs to operate the stack, as the stack exports it."""
    settings, foundation = ground.settings, ground.foundation
    storage, secrets = foundation.storage, foundation.secrets
    return Ec2Outputs(
        region=ground.cloud.region,
        weights_bucket=storage.weights_bucket,
        weights_prefix=storage.weights_prefix,
        history_bucket=storage.history_bucket,
        history_prefix=storage.history_prefix,
        target_group_arn=edge.target_group_arn,
        canary_target_group_arn=edge.canary_target_group_arn,
        api_rule_arn=edge.api_rule_arn,
        asg_names=[g.asg_name for g in groups],
        ecr_repository_url=foundation.registry.repository_url,
        api_keys_secret_arn=arns[0] if len(arns := list(secrets.api_keys_secret_arns.values())) == 1 else "",
        api_keys_secret_arns=secrets.api_keys_secret_arns,
        alb_dns_name=edge.alb_dns_name,
        endpoint=public_endpoint(settings, edge),
        alb_zone_id=edge.alb_zone_id,
        kms_key_arn=secrets.key_arn,
        release_key_arn=foundation.release_key.arn,
        deploy_role_arn=identity.deploy_role_arn,
        runtime_role_arn=roles[0].role_arn if len(roles := list(identity.pools.values())) == 1 else "",
        runtime_role_arns={name: role.role_arn for name, role in identity.pools.items()},
        alarm_topic_arn=monitoring.topic_arn,
        dashboard_name=monitoring.dashboard_name,
        vpc_id=ground.network.vpc_id,
        private_subnet_ids=ground.network.private_subnet_ids,
        host_access="bastion" if settings.inventory.ssh_gateway else "ssm",
        bastion_security_group_id=security.bastion_id,
        monitoring_security_group_id=security.monitoring_id,
        quota_store_endpoint=quota_store.endpoint if quota_store else None,
    )
