"""Every file ``fab render`` writes for a stack, in a stable order, and writing them out."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from frontier.config.schema import Settings
from frontier.render.alerts import render_alerts
from frontier.render.boot import render_cloud_init, render_driver_script, render_mount_cache
from frontier.render.host import render_release_files


def render_stack(settings: Settings, digest: str) -> dict[str, str]:
    """Every file Frontier renders for any stack, keyed by relative path, in a stable order.

    A target adds its own (the local balancer's haproxy.cfg, the Kubernetes manifests): see
    ``Backend.rendered_files``.
    """
    files: dict[str, str] = {}
    for pool in settings.pools:
        # Each pool's release files: under its model's name where the stack serves several.
        folder = "release/" if len(settings.pools) == 1 else f"release/{pool.name}/"
        for name, text in render_release_files(settings, pool, digest).items():
            files[f"{folder}{name}"] = text
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
