"""The hosts of a stack and SSH connections to them.

A static stack lists its hosts; a cloud stack's hosts are discovered with boto3: running EC2
instances tagged ``frontier:stack=<stack>`` and ``frontier:node-group=<group>`` (the tags the
Pulumi program puts on every node). SSH user, key and gateway (bastion) come from the stack's
``inventory`` settings. Relative paths (key file, a local host's root) are relative to the project.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fabric import Config, Connection

from frontier import project
from frontier.config.schema import Settings
from frontier.contracts import NODE_GROUP_TAG as GROUP_TAG
from frontier.contracts import STACK_TAG
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


def discover(settings: Settings, ec2: Any, group: str, *, root: str, python: str) -> list[HostSpec]:
    """Running instances tagged with the stack and node group, in a stable order."""
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
                        root,
                        group,
                        inst["InstanceId"],
                        python=python,
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
