"""What one release puts on a host: ``runtime.yaml``, the runtime's systemd unit, and the host
agent's own configuration.

``runtime.yaml`` is written from a validated instance of the runtime's own config model, so a
setting the runtime would refuse never reaches a host.
"""

from __future__ import annotations

import math
from typing import Any

from frontier_hostside.agent import AgentConfig
from frontier_hostside.names import (
    AGENT_CONFIG_NAME,
    AGENT_FILE_NAME,
    CLOUD_WEIGHTS_CACHE,
    CONTAINER_NAME,
    CONTAINER_RELEASE_DIR,
    HOST_ROOT,
    JIT_CACHE_DIR,
    JIT_CACHE_ENV,
    JIT_CACHE_MIB,
    RELEASE_ID_PATTERN,
    RELEASE_MANIFEST,
    RUNTIME_UID,
    SUPERVISE_COMMAND,
    UNIT_NAME,
)
from frontier_runtime.config import HealthConfig, RuntimeConfig
from frontier_settings import problems_of
from pydantic import ValidationError

from frontier.config.hardware import uses_efa
from frontier.config.memory import kv_bytes_per_token, kv_cache_dtype_bytes
from frontier.config.schema import PoolSettings, Settings, runtime_config
from frontier.errors import FrontierError
from frontier.release.artifact import check_digest, is_placeholder
from frontier.render.boot import KV_ROLE_ENV, NODE_ENV_PATH, replica_unit
from frontier.render.templates import render_template


def cpu_kv_cache_bytes(pool: PoolSettings) -> int:
    """KV cache for max_batch_size sequences of max_seq_len tokens, the whole model on one device."""
    per_token = kv_bytes_per_token(pool.model, kv_cache_dtype_bytes(pool))
    return per_token * pool.runtime.batch.max_batch_size * pool.model.max_seq_len


def runtime_config_for(settings: Settings, pool: PoolSettings) -> RuntimeConfig:
    """The runtime's config for ``pool``: its runtime section as written, plus the model, the
    stack's probe paths and the device its node group gives it."""
    on_cpu = pool.group.accelerator == "cpu"
    derived: dict[str, Any] = {
        "health": settings.health.model_dump(include=set(HealthConfig.model_fields)),
        "device": "cpu" if on_cpu else "cuda",
    }
    if on_cpu and "cpu_kv_cache_bytes" not in pool.runtime.model_fields_set:
        # Unless the stack sizes it: max_batch_size x max_seq_len tokens of KV cache in host memory.
        derived["cpu_kv_cache_bytes"] = cpu_kv_cache_bytes(pool)
    model = pool.model
    if pool.offline_for:  # an offline pool's runtimes answer to the name of the model it serves batch work of
        model = model.model_copy(update={"aliases": (pool.offline_for,)})
    return runtime_config(model, pool.runtime, **derived)


def render_runtime_config(settings: Settings, pool: PoolSettings) -> str:
    """``runtime.yaml`` for ``pool``: the validated runtime config, every field written out."""
    try:
        config = runtime_config_for(settings, pool)
    except ValidationError as exc:
        lines = "\n".join(f"  {p}" for p in problems_of(exc))
        raise FrontierError(f"the runtime refuses the config of stack {settings.stack!r}:\n{lines}") from None
    return render_template("runtime.yaml.j2", stack=settings.stack, config=config)


# --- one release on a host ------------------------------------------------------------------------


def image_reference(pool: PoolSettings, digest: str) -> str:
    return f"{pool.runtime.image_repository}@{check_digest(digest)}"


def render_systemd_unit(settings: Settings, pool: PoolSettings, digest: str) -> str:
    rt = pool.runtime
    gpu = pool.group.accelerator == "gpu"
    # docker stop waits this long for the runtime's own drain before SIGKILL; systemd waits longer.
    stop_grace_s = math.ceil(rt.drain_timeout_s) + 15
    return render_template(
        "frontier-runtime.service.j2",
        stack=settings.stack,
        image=image_reference(pool, digest),
        placeholder=is_placeholder(digest),
        container=CONTAINER_NAME,
        gpu=gpu,
        # The group's EFA devices, which NCCL reaches through libfabric's efa provider (the image's).
        efa=gpu and uses_efa(pool.group, [rt]),
        region=settings.region,
        host_root=HOST_ROOT,
        release_dir=CONTAINER_RELEASE_DIR,
        weights_cache=CLOUD_WEIGHTS_CACHE,
        jit_cache=JIT_CACHE_DIR,
        jit_cache_mib=JIT_CACHE_MIB,
        jit_cache_env=JIT_CACHE_ENV,
        runtime_uid=RUNTIME_UID,
        stop_grace_s=stop_grace_s,
        timeout_stop_s=stop_grace_s + 15,
        start_timeout_s=math.ceil(settings.rollout.readiness_timeout_s),
        # A replica over several nodes: serve or node, as the host's slot says (frontier.render.boot).
        **replica_unit(settings, pool),
        # A disaggregated pool's halves run one runtime.yaml, each host in the role its node.env names.
        node_env=NODE_ENV_PATH if pool.disaggregation is not None else None,
        kv_role_env=KV_ROLE_ENV,
    )


def render_release_files(settings: Settings, pool: PoolSettings, digest: str) -> dict[str, str]:
    """The files of one release of ``pool``: what ``releases/<id>/`` holds on every host of the pool."""
    check_digest(digest)
    return {
        "runtime.yaml": render_runtime_config(settings, pool),
        UNIT_NAME: render_systemd_unit(settings, pool, digest),
    }


def render_agent_config(
    settings: Settings, pool: PoolSettings, *, host: str, root: str, python: str, address: str
) -> str:
    """``frontier-agent.json``: what the host agent of ``host`` needs to know (pure, sorted keys)."""
    config = AgentConfig(
        stack=settings.stack,
        host=host,
        root=root.rstrip("/") or "/",
        python=python,
        address=address,
        port=pool.runtime.port,
        readiness_path=settings.health.readiness_path,
        liveness_path=settings.health.liveness_path,
        drain_timeout_s=float(pool.runtime.drain_timeout_s),
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
            config_file=AGENT_CONFIG_NAME,
            command=SUPERVISE_COMMAND,
            liveness_path=settings.health.liveness_path,
            interval_s=settings.health.interval_s,
            failures=settings.health.unhealthy_threshold,
        ),
    )
    return config.to_json()
