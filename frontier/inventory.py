"""The hosts of a stack and SSH connections to them.

A static stack lists its hosts; a cloud stack's hosts are discovered with boto3: running EC2
instances tagged ``frontier:stack=<stack>`` and ``frontier:node-group=<group>`` (the tags the
Pulumi program puts on every node). SSH user, key and gateway (bastion) come from the stack's
``inventory`` settings. Relative paths (key file, a local host's root) are relative to the project.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fabric import Config, Connection

from frontier import aws
from frontier.errors import FrontierError
from frontier.stack import REPO_ROOT, Settings

STACK_TAG = "frontier:stack"
GROUP_TAG = "frontier:node-group"
CLOUD_ROOT = "/opt/frontier"


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

    def __str__(self) -> str:
        return self.name


def project_path(path: str) -> str:
    """``~`` expanded; a relative path taken from the project directory."""
    expanded = Path(os.path.expanduser(path))
    return str(expanded if expanded.is_absolute() else REPO_ROOT / expanded)


def hosts(settings: Settings, *, ec2: Any | None = None, group: str | None = None) -> list[HostSpec]:
    """The serving hosts (or those of ``group``), in a stable order: the rollout order."""
    group_name = group or settings.serving_group.name
    if settings.inventory.source == "static":
        root = project_path if settings.is_local else (lambda p: p)
        return [
            HostSpec(h.name, h.address, h.ssh_port, root(h.root), group_name)
            for h in settings.inventory.hosts
        ]
    return discover(settings, ec2 or aws.client(settings, "ec2"), group_name)


def discover(settings: Settings, ec2: Any, group: str) -> list[HostSpec]:
    filters = [
        {"Name": f"tag:{STACK_TAG}", "Values": [settings.stack]},
        {"Name": f"tag:{GROUP_TAG}", "Values": [group]},
        {"Name": "instance-state-name", "Values": ["running"]},
    ]
    found = []
    for page in ec2.get_paginator("describe_instances").paginate(Filters=filters):
        for reservation in page["Reservations"]:
            for inst in reservation["Instances"]:
                tags = {t["Key"]: t["Value"] for t in inst.get("Tags", [])}
                address = inst.get("PrivateIpAddress")
                if not address:
                    continue
                name = tags.get("Name") or inst["InstanceId"]
                found.append(
                    HostSpec(
                        f"{name}-{inst['InstanceId'][-6:]}",
                        address,
                        22,
                        CLOUD_ROOT,
                        group,
                        inst["InstanceId"],
                    )
                )
    if not found:
        raise InventoryError(
            f"stack {settings.stack!r}: no running instances tagged {STACK_TAG}={settings.stack} and "
            f"{GROUP_TAG}={group} in {settings.region}"
        )
    return sorted(found, key=lambda h: (h.instance_id, h.address))


class LocalSFTP:
    """The few SFTP calls a host session makes, on this machine's own filesystem."""

    def stat(self, path: str) -> os.stat_result:
        return os.stat(path)

    def mkdir(self, path: str, mode: int = 0o755) -> None:
        os.mkdir(path, mode)

    def open(self, path: str, mode: str = "r") -> Any:
        return open(path, mode)  # noqa: SIM115 - the caller closes it, as with paramiko

    def chmod(self, path: str, mode: int) -> None:
        os.chmod(path, mode)

    def posix_rename(self, src: str, dst: str) -> None:
        os.replace(src, dst)


class LocalConnection:
    """A host slot on this machine reached without SSH (the local stack where no sshd exists)."""

    def __init__(self, host: HostSpec) -> None:
        from invoke import Context

        self.host = host.address
        self._context = Context(Config(overrides={"run": {"hide": True, "warn": True}}))

    def run(self, command: str, **kwargs: Any) -> Any:
        return self._context.run(command, **kwargs)

    def sftp(self) -> LocalSFTP:
        return LocalSFTP()

    def close(self) -> None:
        pass


def connect(settings: Settings, host: HostSpec, *, timeout: float = 10.0) -> Connection | LocalConnection:
    """A Fabric connection with the stack's SSH user and key, through its gateway when one is set.

    On the local stack brought up without sshd (``frontier.local.connection_mode`` is ``local``),
    the host slot is driven directly on this machine instead.
    """
    if settings.is_local:
        from frontier.local import connection_mode

        if connection_mode(settings) == "local":
            return LocalConnection(host)
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
