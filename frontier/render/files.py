"""Render every file that lands on a host or in a launch template from ``templates/``.

One Jinja environment, StrictUndefined (a missing value is an error, never an empty string), no
autoescaping (these are config files, not HTML). Rendering is pure: the same settings and digest
give the same bytes — no clocks, no hostnames, no ordering taken from sets or dicts we did not sort.

``runtime.yaml`` is written from a validated instance of the runtime's own config model, so a
setting the runtime would refuse never reaches a host.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2
from frontier_hostside import names as contracts
from frontier_hostside.agent import AgentConfig
from frontier_hostside.names import AGENT_CONFIG_NAME as CONFIG_NAME
from frontier_hostside.names import (
    AGENT_FILE_NAME,
    CACHE_DEVICE_NAME,
    CACHE_MOUNT,
    CLOUD_WEIGHTS_CACHE,
    CONTAINER_NAME,
    CONTAINER_RELEASE_DIR,
    HOST_ROOT,
    RELEASE_ID_PATTERN,
    RELEASE_MANIFEST,
    SUPERVISE_COMMAND,
    UNIT_NAME,
)
from frontier_runtime.config import HealthConfig, RuntimeConfig
from frontier_settings import problems_of, to_yaml
from pydantic import ValidationError

from frontier import project
from frontier.config.hardware import has_nvswitch, instance_store
from frontier.config.memory import kv_bytes_per_token, kv_cache_dtype_bytes
from frontier.config.schema import NodeGroup, Settings, runtime_config
from frontier.errors import FrontierError
from frontier.release.artifact import check_digest, is_placeholder

TEMPLATES_DIR = project.templates_dir()

# Metric names the alert rules read, as the runtime exports them (histograms by their buckets).
METRICS = {
    "ttft_bucket": f"{contracts.TTFT_METRIC}_bucket",
    "e2e_bucket": f"{contracts.E2E_LATENCY_METRIC}_bucket",
    "http_requests_total": f"{contracts.HTTP_REQUESTS_METRIC}_total",
    "waiting": contracts.WAITING_METRIC,
    "kv_usage": contracts.KV_USAGE_METRIC,
    "ready": contracts.READY_METRIC,
}


def _quote(value: object) -> str:
    """A scalar as a YAML/JSON literal: strings double-quoted and escaped, numbers and bools bare."""
    return json.dumps(value)


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES_DIR)),
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["q"] = _quote
    env.filters["yaml"] = to_yaml
    return env


ENV = _environment()


def render_template(template: str, **context: Any) -> str:
    """``templates/<template>`` rendered with ``context``; a missing value is an error."""
    try:
        return ENV.get_template(template).render(**context)
    except jinja2.UndefinedError as exc:
        raise FrontierError(f"templates/{template}: {exc}") from exc


# --- runtime.yaml ---------------------------------------------------------------------------------


def cpu_kv_cache_bytes(settings: Settings) -> int:
    """KV cache for max_batch_size sequences of max_seq_len tokens, the whole model on one device."""
    per_token = kv_bytes_per_token(settings.model, kv_cache_dtype_bytes(settings))
    return per_token * settings.runtime.batch.max_batch_size * settings.model.max_seq_len


def runtime_config_for(settings: Settings) -> RuntimeConfig:
    """The runtime's config for this stack's (first) pool: its runtime section as written, plus the
    model, the probe paths and the device its node group gives it."""
    on_cpu = settings.serving_group.accelerator == "cpu"
    derived: dict[str, Any] = {
        "health": settings.health.model_dump(include=set(HealthConfig.model_fields)),
        "device": "cpu" if on_cpu else "cuda",
    }
    if on_cpu and "cpu_kv_cache_bytes" not in settings.runtime.model_fields_set:
        # Unless the stack sizes it: max_batch_size x max_seq_len tokens of KV cache in host memory.
        derived["cpu_kv_cache_bytes"] = cpu_kv_cache_bytes(settings)
    return runtime_config(settings.model, settings.runtime, **derived)


def render_runtime_config(settings: Settings) -> str:
    """``runtime.yaml`` for this stack: the validated runtime config, every field written out."""
    try:
        config = runtime_config_for(settings)
    except ValidationError as exc:
        lines = "\n".join(f"  {p}" for p in problems_of(exc))
        raise FrontierError(f"the runtime refuses the config of stack {settings.stack!r}:\n{lines}") from None
    return render_template("runtime.yaml.j2", stack=settings.stack, config=config)


# --- one release on a host ------------------------------------------------------------------------


def image_reference(settings: Settings, digest: str) -> str:
    return f"{settings.runtime.image_repository}@{check_digest(digest)}"


def render_systemd_unit(settings: Settings, digest: str) -> str:
    rt = settings.runtime
    gpu = settings.serving_group.accelerator == "gpu"
    # docker stop waits this long for the runtime's own drain before SIGKILL; systemd waits longer.
    stop_grace_s = math.ceil(rt.drain_timeout_s) + 15
    return render_template(
        "frontier-runtime.service.j2",
        stack=settings.stack,
        image=image_reference(settings, digest),
        placeholder=is_placeholder(digest),
        container=CONTAINER_NAME,
        gpu=gpu,
        region=settings.region,
        host_root=HOST_ROOT,
        release_dir=CONTAINER_RELEASE_DIR,
        weights_cache=CLOUD_WEIGHTS_CACHE,
        stop_grace_s=stop_grace_s,
        timeout_stop_s=stop_grace_s + 15,
        start_timeout_s=math.ceil(settings.rollout.readiness_timeout_s),
    )


def render_release_files(settings: Settings, digest: str) -> dict[str, str]:
    """The files of one release: what ``releases/<id>/`` holds on every host of the stack."""
    check_digest(digest)
    return {
        "runtime.yaml": render_runtime_config(settings),
        UNIT_NAME: render_systemd_unit(settings, digest),
    }


def render_agent_config(settings: Settings, *, host: str, root: str, python: str, address: str) -> str:
    """``frontier-agent.json``: what the host agent of ``host`` needs to know (pure, sorted keys)."""
    config = AgentConfig(
        stack=settings.stack,
        host=host,
        root=root.rstrip("/") or "/",
        python=python,
        address=address,
        port=settings.runtime.port,
        readiness_path=settings.health.readiness_path,
        liveness_path=settings.health.liveness_path,
        drain_timeout_s=float(settings.runtime.drain_timeout_s),
        unit=UNIT_NAME,
        manifest=RELEASE_MANIFEST,
        release_id_pattern=RELEASE_ID_PATTERN.pattern,
        liveness_interval_s=float(settings.health.interval_s),
        liveness_timeout_s=float(settings.health.timeout_s),
        liveness_failures=settings.health.unhealthy_threshold,
        watchdog_unit=render_template(
            "frontier-agent.service.j2",
            stack=settings.stack,
            runtime_unit=UNIT_NAME,
            python=python,
            root=root.rstrip("/") or "/",
            agent_file=AGENT_FILE_NAME,
            config_file=CONFIG_NAME,
            command=SUPERVISE_COMMAND,
            liveness_path=settings.health.liveness_path,
            interval_s=settings.health.interval_s,
            failures=settings.health.unhealthy_threshold,
        ),
    )
    return config.to_json()


# --- node bootstrap -------------------------------------------------------------------------------


def _group(settings: Settings, group: NodeGroup | str | None) -> NodeGroup:
    if group is None:
        return settings.serving_group
    if isinstance(group, NodeGroup):
        return group
    for candidate in settings.node_groups:
        if candidate.name == group:
            return candidate
    known = ", ".join(g.name for g in settings.node_groups)
    raise FrontierError(f"stack {settings.stack!r} has no node group {group!r} (node groups: {known})")


def render_driver_script(settings: Settings, group: NodeGroup | str | None = None) -> str:
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


def render_cloudwatch_agent(settings: Settings) -> str:
    """The CloudWatch agent's configuration: logs only (metrics come from the bootstrap's publisher)."""
    text = render_template("cloudwatch-agent.json.j2", logs=shipped_logs(settings))
    json.loads(text)  # a template typo fails here, not on a host
    return text


def node_env(
    settings: Settings, group: NodeGroup, *, history_bucket: str, history_prefix: str
) -> list[tuple[str, str]]:
    """``/etc/frontier/node.env``: what the host bootstrap (frontier_hostside/bootstrap.py) reads."""
    return [
        ("FRONTIER_STACK", settings.stack),
        ("FRONTIER_NODE_GROUP", group.name),
        ("FRONTIER_ACCELERATOR", group.accelerator),
        ("FRONTIER_GPUS_PER_NODE", str(group.gpus_per_node)),
        ("AWS_REGION", settings.region),
        ("FRONTIER_ROOT", HOST_ROOT),
        ("FRONTIER_HISTORY_BUCKET", history_bucket),
        ("FRONTIER_HISTORY_PREFIX", history_prefix),
        ("FRONTIER_LAUNCH_HOOK", contracts.LAUNCH_HOOK),
        ("FRONTIER_TERMINATE_HOOK", contracts.TERMINATE_HOOK),
        ("FRONTIER_READINESS_TIMEOUT_S", str(math.ceil(settings.rollout.readiness_timeout_s))),
        ("FRONTIER_METRICS_URL", f"http://127.0.0.1:{settings.runtime.port}{contracts.METRICS_PATH}"),
        ("FRONTIER_METRIC_NAMESPACE", contracts.CLOUDWATCH_NAMESPACE),
        ("FRONTIER_QUEUE_METRIC", contracts.QUEUE_DEPTH_METRIC),
        ("FRONTIER_RUNNING_METRIC", contracts.RUNNING_REQUESTS_METRIC),
        ("FRONTIER_LATENCY_METRIC", contracts.E2E_LATENCY_CW_METRIC),
        ("FRONTIER_WAITING_SERIES", contracts.WAITING_METRIC),
        ("FRONTIER_RUNNING_SERIES", contracts.RUNNING_METRIC),
        ("FRONTIER_E2E_SERIES", contracts.E2E_LATENCY_METRIC),
    ]


# Placeholders `fab render` shows where only `pulumi up` knows the value (the account id).
HISTORY_BUCKET_PLACEHOLDER = "<history bucket>"
PUBLISH_INTERVAL_S = 60


def render_gateway_cloud_init(settings: Settings, *, history_bucket: str, history_prefix: str) -> str:
    """Cloud-init of the gateway's CPU hosts: its wheel and gateway.yaml from the history bucket."""
    assert settings.gateway is not None
    return render_template(
        "gateway-cloud-init.yaml.j2",
        stack=settings.stack,
        port=settings.gateway.port,
        history_bucket=history_bucket,
        history_prefix=history_prefix,
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
    prefix = history_prefix or f"history/{settings.stack}/"
    registry = settings.runtime.image_repository.split("/", 1)[0]
    return render_template(
        "cloud-init.yaml.j2",
        stack=settings.stack,
        group=node_group,
        node_env=node_env(settings, node_group, history_bucket=history_bucket, history_prefix=prefix),
        tools_uri=f"s3://{history_bucket}/{prefix}{contracts.HOST_TOOLS_PREFIX}{node_group.name}/",
        host_root=HOST_ROOT,
        gpu=node_group.accelerator == "gpu",
        ecr_registry=registry if ".dkr.ecr." in registry else None,
        publish_interval_s=PUBLISH_INTERVAL_S,
        launch_timeout_s=launch_timeout_s,
    )


# --- alerts --------------------------------------------------------------------------------------


def render_alerts(settings: Settings) -> str:
    """Prometheus alerting rules from the stack's SLOs."""
    slo = settings.slo
    return render_template(
        "alerts.yaml.j2",
        stack=settings.stack,
        metrics=METRICS,
        ttft_s=slo.ttft_ms / 1000,
        p99_s=slo.p99_latency_ms / 1000,
        error_rate=slo.error_rate,
        queue_depth=settings.monitoring.queue_depth_alarm,
        kv_usage=settings.monitoring.kv_usage_alarm,
    )


# --- everything -----------------------------------------------------------------------------------


def render_stack(settings: Settings, digest: str) -> dict[str, str]:
    """Every file Frontier renders for any stack, keyed by relative path, in a stable order.

    A target adds its own (the local balancer's haproxy.cfg, the Kubernetes manifests): see
    ``Backend.rendered_files``.
    """
    files: dict[str, str] = {}
    for name, text in render_release_files(settings, digest).items():
        files[f"release/{name}"] = text
    for group in settings.node_groups:
        files[f"cloud-init/{group.name}.yaml"] = render_cloud_init(settings, group)
        files[f"host/{group.name}/mount-cache.sh"] = render_mount_cache(settings, group)
        if group.accelerator == "gpu":
            files[f"drivers/{group.name}/install-nvidia.sh"] = render_driver_script(settings, group)
    files["monitoring/alerts.yaml"] = render_alerts(settings)
    return dict(sorted(files.items()))


def write_files(files: Mapping[str, str], out_dir: Path) -> list[Path]:
    """Write rendered files under ``out_dir`` (atomically each); scripts become executable."""
    written = []
    for rel, text in files.items():
        path = out_dir / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(text)
        tmp.chmod(0o755 if rel.endswith(".sh") else 0o644)
        tmp.replace(path)
        written.append(path)
    return written
