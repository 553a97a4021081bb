"""What a node boots with: cloud-init user data per node group (and the gateway's), the model-cache
mount, the NVIDIA driver check, the CloudWatch agent's configuration and ``node.env``."""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass

from frontier_gateway.hold import HELD_REQUESTS_CW_METRIC, POOL_WAITING_METRIC
from frontier_hostside import names
from frontier_hostside.names import (
    CACHE_DEVICE_NAME,
    CACHE_MOUNT,
    CLOUD_WEIGHTS_CACHE,
    HOST_ROOT,
    RUNTIME_UID,
)

from frontier import project
from frontier.access.gateway import render_gateway_config
from frontier.config import host_image as image
from frontier.config.hardware import (
    CPU_AMI_PARAMETER,
    ami_parameter,
    architecture,
    has_nvswitch,
    instance_store,
)
from frontier.config.image_cuda import image_cuda
from frontier.config.schema import NodeGroup, PoolSettings, Settings
from frontier.errors import FrontierError
from frontier.release.history import pool_history_prefix
from frontier.render.alerts import HOST_NAMESPACE, AgentMetrics, agent_metrics
from frontier.render.templates import render_template

# node.env's name for the KV transfer role of a disaggregated pool's host (prefill or decode).
KV_ROLE_ENV = "FRONTIER_KV_ROLE"
NODE_ENV_PATH = "/etc/frontier/node.env"
# Where the Deep Learning AMI mounts the instance-store disks it stripes at boot.
DLAMI_NVME_MOUNT = "/opt/dlami/nvme"


def _group(settings: Settings, group: NodeGroup | str) -> NodeGroup:
    if isinstance(group, NodeGroup):
        return group
    for candidate in settings.node_groups:
        if candidate.name == group:
            return candidate
    known = ", ".join(g.name for g in settings.node_groups)
    raise FrontierError(f"stack {settings.stack!r} has no node group {group!r} (node groups: {known})")


def render_driver_script(settings: Settings, group: NodeGroup | str) -> str:
    """The NVIDIA driver check (or install, on plain Ubuntu); idempotent, ends in a status line."""
    node_group = _group(settings, group)
    return render_template(
        "install-nvidia.sh.j2",
        stack=settings.stack,
        group=node_group.name,
        instance_type=node_group.instance_type,
        nvswitch=has_nvswitch(node_group.instance_type),
        expected_gpus=node_group.gpus_per_node,
        driver_branch=settings.drivers.driver_branch,
        image_cuda=image_cuda(),
        toolkit_version=settings.drivers.container_toolkit_version,
    )


def render_mount_cache(settings: Settings, group: NodeGroup | str) -> str:
    """The model-cache mount: instance-store NVMe in RAID 0 where the stack asks for it, else gp3."""
    node_group = _group(settings, group)
    disks, disk_gb = instance_store(node_group.instance_type)
    return render_template(
        "mount-cache.sh.j2",
        stack=settings.stack,
        group=node_group.name,
        instance_type=node_group.instance_type,
        instance_store=node_group.model_cache == "instance_store" and disks > 0,
        disks=disks,
        disk_gb=disk_gb,
        cache_mount=CACHE_MOUNT,
        cache_device_name=CACHE_DEVICE_NAME,
        cache_volume_gb=node_group.cache_volume_gb,
        cache_volume_bytes=node_group.cache_volume_gb * 1024**3,
        weights_cache=CLOUD_WEIGHTS_CACHE,
        runtime_uid=RUNTIME_UID,
        dlami_nvme=DLAMI_NVME_MOUNT,
    )


@dataclass(frozen=True)
class ShippedLog:
    path: str
    group: str
    stream: str


def shipped_logs(settings: Settings) -> list[ShippedLog]:
    """The host files the CloudWatch agent ships, and the log group (``/frontier/<stack>/...``) of each."""
    root = f"/frontier/{settings.stack}"
    return [
        ShippedLog("/var/lib/docker/containers/*/*-json.log", f"{root}/runtime", "runtime"),
        ShippedLog(f"{HOST_ROOT}/logs/agent.jsonl", f"{root}/runtime", "agent"),
        ShippedLog("/var/log/frontier-bootstrap.log", f"{root}/cloud-init", "bootstrap"),
        ShippedLog("/var/log/cloud-init-output.log", f"{root}/cloud-init", "cloud-init"),
    ]


def render_cloudwatch_agent(settings: Settings, group: NodeGroup | str) -> str:
    """The CloudWatch agent's configuration for ``group``'s hosts: their logs, and their host, process
    and GPU metrics (:func:`frontier.render.alerts.agent_metrics`; the runtime's own metrics come
    from the bootstrap's publisher)."""
    metrics = agent_metrics(settings, _group(settings, group))
    text = render_template("cloudwatch-agent.json.j2", logs=shipped_logs(settings), metrics=metrics)
    json.loads(text)  # a template typo fails here, not on a host
    return text


def replica_nodes(settings: Settings, group: NodeGroup) -> int:
    """How many nodes one replica of ``group`` spans: ``runtime.nodes_per_replica`` of the pool
    that runs on it (1 for a group no pool runs on)."""
    spans = [pool.runtime.nodes_per_replica for pool in settings.pools_on(group)]
    return max(spans, default=1)


def group_pool(settings: Settings, group: NodeGroup) -> PoolSettings:
    """The pool whose replicas ``group``'s hosts boot into, where every host of the group boots the same
    one (EC2: a group's hosts are alike). A group whose pools split its hosts between them (a static
    inventory, each pool listing its hosts) has no such pool: a host boots the pool that lists it."""
    pools = settings.pools_on(group)
    if len(pools) != 1:
        served = ", ".join(pool.name for pool in pools) or "none"
        split = len(pools) > 1 and all(pool.hosts for pool in pools)
        raise FrontierError(
            f"stack {settings.stack!r}: node group {group.name!r} runs {len(pools)} models ({served}); "
            + (
                "each of its hosts boots the pool that lists it: name that pool"
                if split
                else "its hosts boot the runtime of exactly one"
            )
        )
    return pools[0]


def node_env(
    settings: Settings, pool: PoolSettings | NodeGroup, *, history_bucket: str, history_prefix: str
) -> list[tuple[str, str]]:
    """``/etc/frontier/node.env``: what the host bootstrap (frontier_hostside/bootstrap.py) reads.

    For the hosts of ``pool``: the pool a host boots into, which its caller knows (on a static
    inventory, the pool that lists the host, though its node group runs others' hosts too), or a node
    group whose hosts all boot its one pool (:func:`group_pool`; EC2's cloud-init, rendered per group).

    A pool whose replica spans several nodes adds how many: the bootstrap then claims the host's
    slot (replica, node) before the runtime starts (frontier_hostside/rendezvous.py).
    """
    host_pool = pool if isinstance(pool, PoolSettings) else group_pool(settings, pool)
    halves = host_pool.disaggregation
    role = halves.role_of(pool) if halves is not None and isinstance(pool, NodeGroup) else None
    # A disaggregated pool's half is its own group (the pool's group is its decode half's).
    group = pool if role is not None and isinstance(pool, NodeGroup) else host_pool.group
    nodes = host_pool.runtime.nodes_per_replica
    port = host_pool.runtime.port
    return [
        ("FRONTIER_STACK", settings.stack),
        ("FRONTIER_NODE_GROUP", group.name),
        ("FRONTIER_ACCELERATOR", group.accelerator),
        ("FRONTIER_GPUS_PER_NODE", str(group.gpus_per_node)),
        ("AWS_REGION", settings.region),
        ("FRONTIER_ROOT", HOST_ROOT),
        ("FRONTIER_HISTORY_BUCKET", history_bucket),
        ("FRONTIER_HISTORY_PREFIX", history_prefix),
        ("FRONTIER_LAUNCH_HOOK", names.LAUNCH_HOOK),
        ("FRONTIER_TERMINATE_HOOK", names.TERMINATE_HOOK),
        ("FRONTIER_READINESS_TIMEOUT_S", str(math.ceil(settings.rollout.readiness_timeout_s))),
        ("FRONTIER_METRICS_URL", f"http://127.0.0.1:{port}{names.METRICS_PATH}"),
        ("FRONTIER_METRIC_NAMESPACE", names.CLOUDWATCH_NAMESPACE),
        ("FRONTIER_QUEUE_METRIC", names.QUEUE_DEPTH_METRIC),
        ("FRONTIER_RUNNING_METRIC", names.RUNNING_REQUESTS_METRIC),
        ("FRONTIER_LATENCY_METRIC", names.E2E_LATENCY_CW_METRIC),
        ("FRONTIER_WAITING_SERIES", names.WAITING_METRIC),
        ("FRONTIER_RUNNING_SERIES", names.RUNNING_METRIC),
        ("FRONTIER_E2E_SERIES", names.E2E_LATENCY_METRIC),
        *([(names.NODES_PER_REPLICA_ENV, str(nodes))] if nodes > 1 else []),
        # A disaggregated pool's half: the runtime unit passes it as --kv-role.
        *([(KV_ROLE_ENV, role)] if role is not None else []),
    ]


# --- a replica over several nodes --------------------------------------------------------------------

LEADER_PROXY_CONFIG = "/etc/frontier/leader-proxy.cfg"
LEADER_PROXY_SOCKET = f"{names.CLOUD_HAPROXY_STATE}/leader-proxy.sock"


def render_leader_proxy(
    settings: Settings, pool: PoolSettings, *, stats_socket: str = LEADER_PROXY_SOCKET
) -> str:
    """A worker node's HAProxy: the runtime's port (all addresses) forwarded to its leader's.

    The leader's address is HAProxy's ``${FRONTIER_LEADER_ADDRESS}``, from the environment file the
    rendezvous writes, so one rendered file serves every worker of the group. It checks nothing
    itself: a readiness or liveness probe passes through and gets the leader's own answer (a check
    of its own would answer 503 to the liveness probe while the leader loads, and the worker's
    watchdog would restart it for that).
    """
    runtime = pool.runtime
    per_host = runtime.max_concurrency + runtime.queue.max_length
    return render_template(
        "haproxy.cfg.j2",
        stack=settings.stack,
        servers=[("leader", f'"${{{names.LEADER_ADDRESS_ENV}}}"', runtime.port)],
        bind_address="0.0.0.0",
        bind_port=runtime.port,
        stats_socket=stats_socket,
        stats_port=None,
        checks=False,
        queue_timeout_ms=runtime.queue.timeout_ms,
        check_timeout_ms=settings.health.timeout_s * 1000,
        stream_timeout_s=max(settings.edge.idle_timeout_s, math.ceil(settings.slo.p99_latency_ms / 1000) * 2),
        maxconn=per_host,
        server_maxconn=per_host,
    )


@dataclass(frozen=True)
class ReplicaBoot:
    """What cloud-init adds on the hosts of a group whose replica spans ``nodes`` nodes."""

    nodes: int
    proxy_config: str
    proxy_config_path: str = LEADER_PROXY_CONFIG
    proxy_unit: str = names.LEADER_PROXY_UNIT
    leader_env: str = names.LEADER_ENV_FILE


def replica_boot(settings: Settings, group: NodeGroup) -> ReplicaBoot | None:
    """None for a group whose replica fits one node: its hosts boot exactly as before."""
    nodes = replica_nodes(settings, group)
    return (
        ReplicaBoot(nodes, render_leader_proxy(settings, group_pool(settings, group))) if nodes > 1 else None
    )


def replica_unit(settings: Settings, pool: PoolSettings) -> dict[str, object]:
    """What the runtime's unit (templates/frontier-runtime.service.j2) adds for a replica over several
    nodes; nothing for one that fits a node, whose unit renders as before."""
    nodes = replica_nodes(settings, pool.group)
    if nodes == 1:
        return {}
    return {
        "nodes_per_replica": nodes,
        "replica_env": names.REPLICA_ENV_FILE,
        # Passed by name: docker takes each value from the unit's environment, so the key is in no
        # command line.
        "replica_env_names": [
            names.RUNTIME_COMMAND_ENV,
            names.REPLICA_INDEX_ENV,
            names.NODE_RANK_ENV,
            names.LEADER_ADDRESS_ENV,
            names.REPLICA_KEY_ENV,
        ],
        "command_env": names.RUNTIME_COMMAND_ENV,
    }


# Placeholders `fab render` shows where only `pulumi up` knows the value (the account id).
HISTORY_BUCKET_PLACEHOLDER = "<history bucket>"
PUBLISH_INTERVAL_S = 60


# --- the gateway's hosts (EC2) ---------------------------------------------------------------------

GATEWAY_HOME = "/opt/frontier-gateway"
# Baked (`fab ami.bake --group gateway`): Python and the gateway's locked dependencies.
GATEWAY_VENV = f"{GATEWAY_HOME}/venv"
GATEWAY_ENV = "/etc/frontier/gateway.env"
# The gateway's own TLS certificate and key, made once at first boot (the ALB does not validate
# its targets' certificates: see infra/edge.py), readable by the gateway's user only.
GATEWAY_TLS_DIR = "/etc/frontier/gateway-tls"
GATEWAY_LOG = "/var/log/frontier-gateway.log"
GATEWAY_PROCESS_PATTERN = "frontier_gateway"


def gateway_release(settings: Settings) -> str:
    """The digest of the ``gateway.yaml`` the stack renders (pure: same settings, same digest).

    The gateway's user data names it, so a changed ``gateway:`` section, tenant or pool is a new
    launch template version, which the group rolls in with an instance refresh (infra/gateway.py).
    """
    return "sha256:" + hashlib.sha256(render_gateway_config(settings, None).encode()).hexdigest()


def gateway_env(settings: Settings) -> list[tuple[str, str]]:
    """``/etc/frontier/gateway.env``: what the bootstrap's ``publish-gateway`` reads on a gateway host."""
    gw = settings.gateway
    assert gw is not None
    pools = ",".join(f"{pool.name}={pool.group.name}" for pool in settings.pools)
    return [
        ("FRONTIER_STACK", settings.stack),
        ("AWS_REGION", settings.region),
        ("FRONTIER_ROOT", GATEWAY_HOME),
        ("FRONTIER_GATEWAY_METRICS_URL", f"https://127.0.0.1:{gw.admin_port}{names.METRICS_PATH}"),
        ("FRONTIER_GATEWAY_CA", f"{GATEWAY_TLS_DIR}/gateway.crt"),
        ("FRONTIER_METRIC_NAMESPACE", names.CLOUDWATCH_NAMESPACE),
        ("FRONTIER_HELD_METRIC", HELD_REQUESTS_CW_METRIC),
        ("FRONTIER_POOL_WAITING_SERIES", POOL_WAITING_METRIC),
        ("FRONTIER_GATEWAY_REQUESTS_SERIES", names.GATEWAY_REQUESTS_METRIC),
        ("FRONTIER_GATEWAY_POOLS", pools),
    ]


def gateway_shipped_logs(settings: Settings) -> list[ShippedLog]:
    """What the CloudWatch agent ships from a gateway host: the gateway's own log and its boot."""
    root = f"/frontier/{settings.stack}"
    return [
        ShippedLog(GATEWAY_LOG, f"{root}/gateway", "gateway"),
        ShippedLog("/var/log/cloud-init-output.log", f"{root}/cloud-init", "cloud-init"),
    ]


def gateway_agent_metrics(settings: Settings) -> AgentMetrics:
    """Host CPU, memory, root disk, network and the gateway process, under NodeGroup=gateway."""
    stack_dim, group_dim = names.CLOUDWATCH_DIMENSIONS
    return AgentMetrics(
        namespace=HOST_NAMESPACE,
        dimensions={stack_dim: settings.stack, group_dim: names.GATEWAY_NODE_GROUP},
        gpu=False,
        cache_mount="/",
        process_pattern=GATEWAY_PROCESS_PATTERN,
    )


def render_gateway_cloudwatch_agent(settings: Settings) -> str:
    """The CloudWatch agent's configuration on gateway hosts (the runtime hosts' template)."""
    text = render_template(
        "cloudwatch-agent.json.j2",
        logs=gateway_shipped_logs(settings),
        metrics=gateway_agent_metrics(settings),
    )
    json.loads(text)  # a template typo fails here, not on a host
    return text


def gateway_lock() -> image.LockedSet:
    """The gateway's locked dependencies (``requirements/gateway.txt``, written by ``make lock``)."""
    path = project.root() / "requirements" / "gateway.txt"
    try:
        return image.locked_set(path.read_text())
    except (OSError, ValueError) as exc:
        raise FrontierError(f"{path}: cannot read the gateway's locked dependencies: {exc}") from None


def gateway_tools() -> tuple[image.HostTool, ...]:
    """What a gateway host runs and its image must therefore carry."""
    return image.gateway_needs(GATEWAY_VENV, gateway_lock())


def gateway_bake_command(settings: Settings) -> str:
    return image.bake_command(settings.stack, image.GATEWAY_IMAGE)


def render_gateway_preflight(settings: Settings, *, strict: bool = False) -> str:
    """The gateway boot's first step: everything it runs is on the image, or one line says what is
    missing and how to bake it. Closed whatever ``network.egress`` says: a gateway host installs
    nothing at boot, so no boot depends on a mirror being up."""
    return render_template(
        "host-preflight.sh.j2",
        tools=gateway_tools(),
        aws_cli_min=image.AWS_CLI_MIN,
        closed=True,
        advice=(
            "installed, yet not usable"
            if strict
            else "gateway hosts install nothing at boot: bake an image with "
            f"'{gateway_bake_command(settings)}' and pin it in gateway.ami_id"
        ),
        tools_uri="",
        stop='fail "preflight"' if strict else "exit 1",
        define_checks=not strict,
    )


def render_gateway_cloud_init(settings: Settings, *, history_bucket: str, history_prefix: str) -> str:
    """Cloud-init of the gateway's CPU hosts: a preflight of what the image carries, then the stack's
    wheels and gateway.yaml from the history bucket (installed from those files alone), its TLS
    certificate made at first boot, the CloudWatch agent's configuration and the units started."""
    gw = settings.gateway
    assert gw is not None
    return render_template(
        "gateway-cloud-init.yaml.j2",
        stack=settings.stack,
        port=gw.port,
        history_bucket=history_bucket,
        history_prefix=history_prefix,
        release=gateway_release(settings),
        home=GATEWAY_HOME,
        venv=GATEWAY_VENV,
        env_path=GATEWAY_ENV,
        env=gateway_env(settings),
        tls_dir=GATEWAY_TLS_DIR,
        log_path=GATEWAY_LOG,
        cloudwatch_agent=render_gateway_cloudwatch_agent(settings),
        publish_interval_s=PUBLISH_INTERVAL_S,
        preflight=render_gateway_preflight(settings),
    )


def host_tools(settings: Settings, group: NodeGroup) -> tuple[image.HostTool, ...]:
    """What a host of ``group`` runs and its image must therefore carry."""
    return image.needs(group, multi_node=replica_nodes(settings, group) > 1)


def render_preflight(
    settings: Settings,
    group: NodeGroup,
    *,
    tools_uri: str = "",
    strict: bool = False,
    advice: str = "",
    stop: str = "exit 1",
) -> str:
    """The bootstrap's first step: every tool the host runs is on its image, or one line says why not.

    With ``network.egress: endpoints`` nothing can be installed at boot, so a missing tool stops the
    boot at once, naming each tool and the bake command, in the bootstrap log and on the console
    (``aws ec2 get-console-output``). With ``internet`` the bootstrap goes on and installs what it
    can, as on a bare Ubuntu image. ``strict`` stops on a missing tool whatever the egress: the bake
    checking its own result, in a script that defines the checks' helpers itself.
    """
    return render_template(
        "host-preflight.sh.j2",
        tools=host_tools(settings, group),
        aws_cli_min=image.AWS_CLI_MIN,
        closed=strict or settings.network.egress == "endpoints",
        advice=advice
        or (
            "network.egress is endpoints, so no package mirror is reachable: bake an image with "
            f"'{image.bake_command(settings.stack, group.name)}' and pin it in node_groups[{group.name}].ami_id"
        ),
        tools_uri=tools_uri,
        stop=stop,
        define_checks=not strict,
    )


@dataclass(frozen=True)
class ImageRole:
    """What one baked image is for: the runtime hosts of a node group, or the gateway's hosts."""

    name: str  # the node group's name, or image.GATEWAY_IMAGE
    field: str  # the stack-file key that pins it
    pinned: str
    instance_type: str
    root_volume_gb: int
    gpu: bool
    # The public SSM parameter of the newest stock image it is baked from.
    stock_parameter: str
    tools: tuple[image.HostTool, ...]
    # The bake checks its result with this: the hosts' own preflight, stopping on anything missing.
    preflight: str


# The gateway's builder disk: the stock image's 8 GB is tight for the locked set beside the OS.
GATEWAY_ROOT_VOLUME_GB = 16


def image_role(settings: Settings, name: str | None) -> ImageRole:
    """The role ``name`` names: a node group of the stack, else the gateway's hosts (``gateway``);
    ``None``: the stack's only node group."""
    groups = {group.name: (index, group) for index, group in enumerate(settings.node_groups)}
    if name is None and len(groups) == 1:
        name = settings.node_groups[0].name
    if name in groups:
        index, group = groups[name]
        preflight = render_preflight(
            settings, group, strict=True, advice="installed, yet not usable", stop='fail "preflight"'
        )
        return ImageRole(
            group.name,
            f"node_groups[{index}].ami_id",
            group.ami_id,
            group.instance_type,
            group.root_volume_gb,
            group.accelerator == "gpu",
            ami_parameter(group),
            host_tools(settings, group),
            preflight,
        )
    if name == image.GATEWAY_IMAGE and settings.gateway is not None:
        gw = settings.gateway
        return ImageRole(
            image.GATEWAY_IMAGE,
            "gateway.ami_id",
            gw.ami_id,
            gw.instance_type,
            GATEWAY_ROOT_VOLUME_GB,
            False,
            CPU_AMI_PARAMETER.format(arch="arm64" if architecture(gw.instance_type) == "arm64" else "amd64"),
            gateway_tools(),
            render_gateway_preflight(settings, strict=True),
        )
    gateway = f" and a gateway ('{image.GATEWAY_IMAGE}')" if settings.gateway is not None else ""
    raise FrontierError(f"stack {settings.stack!r} has node groups {', '.join(groups)}{gateway}")


def render_bake_script(settings: Settings, role: ImageRole, source_image: str) -> str:
    """The builder instance's user data for ``fab ami.bake``: install, check as a host would, power off."""
    return render_template(
        "bake-host-image.sh.j2",
        stack=settings.stack,
        role=role,
        source_image=source_image,
        tools=role.tools,
        contents=image.contents_value(role.tools),
        aws_cli_min=image.AWS_CLI_MIN,
        driver_branch=settings.drivers.driver_branch,
        toolkit_version=settings.drivers.container_toolkit_version,
        needs_nvidia_repositories=role.gpu,
        preflight=role.preflight,
    )


def render_cloud_init(
    settings: Settings,
    group: NodeGroup | str,
    *,
    history_bucket: str = HISTORY_BUCKET_PLACEHOLDER,
    history_prefix: str = "",
    launch_timeout_s: int = 3600,
) -> str:
    """Cloud-init user data for one node group: thin, it fetches the host tools and bootstraps.

    No secrets: hosts fetch them by id at runtime. The tools live under the history prefix's
    ``host/`` (uploaded by ``pulumi up``), beside the releases the host bootstraps from.
    """
    node_group = _group(settings, group)
    pool = group_pool(settings, node_group)
    stack_prefix = history_prefix or f"history/{settings.stack}/"
    # The group's pool's history, where its deploys write its releases and records (and `pulumi up`
    # its host tools); the runtime artifacts stay the stack's.
    prefix = pool_history_prefix(settings, pool.name, stack_prefix)
    registry = pool.runtime.image_repository.split("/", 1)[0]
    tools_uri = f"s3://{history_bucket}/{prefix}{names.HOST_TOOLS_PREFIX}{node_group.name}/"
    env = node_env(settings, node_group, history_bucket=history_bucket, history_prefix=prefix)
    if prefix != stack_prefix:
        env.append(("FRONTIER_ARTIFACTS_PREFIX", stack_prefix))
    return render_template(
        "cloud-init.yaml.j2",
        stack=settings.stack,
        group=node_group,
        node_env=env,
        tools_uri=tools_uri,
        host_root=HOST_ROOT,
        gpu=node_group.accelerator == "gpu",
        ecr_registry=registry if ".dkr.ecr." in registry else None,
        publish_interval_s=PUBLISH_INTERVAL_S,
        launch_timeout_s=launch_timeout_s,
        replica=replica_boot(settings, node_group),
        preflight=render_preflight(settings, node_group, tools_uri=tools_uri),
    )
