"""The hosts of a stack and SSH connections to them.

A host is a :class:`HostSpec` (name, address, SSH port, install root, node group). A stack that
lists its hosts (``inventory.source: static``) gives them in :func:`static_hosts`; each target
finds its own otherwise (EC2 by instance tags, see :mod:`frontier.targets.ec2.discovery`). SSH
user, key and gateway (bastion) come from the stack's ``inventory`` settings. Relative paths (key
file, a local host's root) are relative to the project.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fabric import Config, Connection

from frontier import project
from frontier.config.schema import Settings
from frontier.errors import FrontierError


class InventoryError(FrontierError):
    """Hosts that cannot be listed or reached."""


@dataclass(frozen=True)
class HostSpec:
    name: str
    address: str
    ssh_port: int
    root: str
    group: str
    instance_id: str = ""
    # The interpreter that runs the host agent and (without a container) the runtime.
    python: str = "/usr/bin/python3"

    def __str__(self) -> str:
        return self.name


def project_path(path: str) -> str:
    """``~`` expanded; a relative path taken from the project directory."""
    return str(project.resolve(path))


def static_hosts(
    settings: Settings, group: str, *, python: str, resolve_root: Callable[[str], str]
) -> list[HostSpec]:
    """The stack's listed hosts, in the order listed: the rollout order."""
    return [
        HostSpec(h.name, h.address, h.ssh_port, resolve_root(h.root), group, python=python)
        for h in settings.inventory.hosts
    ]


def ssh_connection(settings: Settings, host: HostSpec, *, timeout: float = 10.0) -> Connection:
    """A Fabric connection with the stack's SSH user and key, through its gateway when one is set."""
    inv = settings.inventory
    connect_kwargs: dict[str, Any] = {
        "look_for_keys": False,
        "allow_agent": not inv.ssh_key_file,
        "banner_timeout": timeout,
    }
    if inv.ssh_key_file:
        key = project_path(inv.ssh_key_file)
        if not Path(key).exists():
            raise InventoryError(f"inventory.ssh_key_file = {inv.ssh_key_file!r}: no such file ({key})")
        connect_kwargs["key_filename"] = key
    config = Config(overrides={"load_ssh_configs": False, "run": {"hide": True, "warn": True}})
    gateway = None
    if inv.ssh_gateway:
        gateway = Connection(
            inv.ssh_gateway, user=inv.ssh_user, config=config, connect_kwargs=dict(connect_kwargs)
        )
    return Connection(
        host.address,
        user=inv.ssh_user,
        port=host.ssh_port,
        config=config,
        gateway=gateway,
        connect_timeout=timeout,
        connect_kwargs=connect_kwargs,
    )
