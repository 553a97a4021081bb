"""How ``fab`` reaches an EC2 host: the path (Session Manager, or the stack's bastion) and the key.

**The path.** A stack without ``inventory.ssh_gateway`` gives its hosts no inbound SSH at all (the
runtime security group has no port 22, see ``infra/security_groups.py``). SSH then rides a Session
Manager session that the host's SSM agent opened outward, over HTTPS: the ProxyCommand is ::

    aws ssm start-session --region <region> --target <instance id>
        --document-name AWS-StartSSHSession --parameters portNumber=<port>

which needs the AWS CLI and AWS's ``session-manager-plugin`` where ``fab`` runs, ``ssm:StartSession``
on the stack's instances (by their ``frontier:stack`` tag) and on that one document, and the SSM
agent's calls on the host (``frontier/identity/documents.py``). With a bastion, the path is SSH through it.

**The key.** Either way the host must admit a key, and no key is baked into the launch template
or cloud-init: each ``fab`` run makes an Ed25519 key pair in memory and, right before each
connection opens, pushes its public half to the instance with EC2 Instance Connect's
``SendSSHPublicKey`` (valid 60 s, for the stack's ``inventory.ssh_user``; the AMI's
``ec2-instance-connect`` package has sshd ask the instance metadata for it). Chosen over an
authorized key rendered into cloud-init because IAM alone then decides who gets in, and when:
there is no private key to store, share, rotate or revoke, changing who may deploy is a policy
change and not an instance refresh, and CloudTrail names the caller of every push.

A host of a listed inventory (``inventory.source: static``) has no instance id to push a key to or
start a session with: it is reached as listed, with the stack's own key file.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError
from fabric import Config, Connection

from frontier.config.schema import Settings
from frontier.hosts.inventory import HostSpec, InventoryError, ssh_connection
from frontier.hosts.transport import (
    PreparedConnection,
    ProxiedConnection,
    SessionKey,
    TransportError,
    ephemeral_key,
)

SSH_DOCUMENT = "AWS-StartSSHSession"
SESSION_MANAGER_PLUGIN = "session-manager-plugin"
PLUGIN_HELP = "https://docs.aws.amazon.com/systems-manager/latest/userguide/session-manager-working-with-install-plugin.html"


def ssm_proxy_argv(settings: Settings, host: HostSpec, *, aws: str = "aws") -> list[str]:
    """The ProxyCommand that carries SSH to ``host`` through Session Manager, as an argv."""
    if not host.instance_id:
        raise InventoryError(
            f"{host.name} ({host.address}): Session Manager reaches an instance by its id, and this host "
            "has none (a listed inventory); list no hosts (inventory.source: aws) or name a bastion "
            "(inventory.ssh_gateway)"
        )
    return [
        aws, "ssm", "start-session",
        "--region", settings.region,
        "--target", host.instance_id,
        "--document-name", SSH_DOCUMENT,
        "--parameters", f"portNumber={host.ssh_port}",
    ]  # fmt: skip


def require_session_manager_client() -> str:
    """The ``aws`` command, once both it and the Session Manager plugin it runs are installed."""
    missing = [name for name in ("aws", SESSION_MANAGER_PLUGIN) if shutil.which(name) is None]
    if missing:
        raise TransportError(
            f"{' and '.join(missing)} not found on PATH: hosts of a stack without inventory.ssh_gateway "
            f"are reached through Session Manager, which needs the AWS CLI and AWS's {SESSION_MANAGER_PLUGIN} "
            f"({PLUGIN_HELP})"
        )
    return shutil.which("aws") or "aws"


class InstanceConnectKey:
    """The run's key pair, and its public half pushed to an instance before each connection."""

    def __init__(self, settings: Settings, client: Callable[[str], Any]) -> None:
        self.settings = settings
        self.key: SessionKey = ephemeral_key(f"frontier-{settings.stack}")
        self._client = client
        self._instance_connect: Any = None

    def push(self, host: HostSpec) -> None:
        """Let ``host``'s sshd admit this run's key for the next 60 s, as ``inventory.ssh_user``."""
        if self._instance_connect is None:
            self._instance_connect = self._client("ec2-instance-connect")
        user = self.settings.inventory.ssh_user
        try:
            self._instance_connect.send_ssh_public_key(
                InstanceId=host.instance_id, InstanceOSUser=user, SSHPublicKey=self.key.public
            )
        except ClientError as exc:
            error = exc.response.get("Error", {})
            raise TransportError(
                f"{host.name}: EC2 Instance Connect refused the key for {user}@{host.instance_id} "
                f"({error.get('Code', 'error')}: {error.get('Message', exc)}); the deploy role allows "
                f"ec2-instance-connect:SendSSHPublicKey on instances tagged frontier:stack={self.settings.stack}"
            ) from None
        except BotoCoreError as exc:
            raise TransportError(f"{host.name}: EC2 Instance Connect: {exc}") from None


def host_connection(
    settings: Settings,
    host: HostSpec,
    host_access: str,
    key: InstanceConnectKey,
    *,
    aws: str | None = None,
    timeout: float = 30.0,
) -> Connection:
    """A Fabric connection to ``host`` by the stack's path (``host_access``), admitted by ``key``."""
    if not host.instance_id:
        return ssh_connection(settings, host)
    inv = settings.inventory
    connect_kwargs: dict[str, Any] = {
        "pkey": key.key.pkey,
        "look_for_keys": False,
        "allow_agent": False,
        "banner_timeout": timeout,
        "auth_timeout": timeout,
    }
    config = Config(overrides={"load_ssh_configs": False, "run": {"hide": True, "warn": True}})
    common: dict[str, Any] = {
        "user": inv.ssh_user,
        "port": host.ssh_port,
        "config": config,
        "connect_timeout": timeout,
        "connect_kwargs": connect_kwargs,
    }
    if host_access == "ssm":
        argv = ssm_proxy_argv(settings, host, aws=aws or require_session_manager_client())
        # Session Manager resolves the target by instance id; the address only names the host in errors.
        return ProxiedConnection(
            host.instance_id, proxy_argv=argv, before_open=lambda: key.push(host), **common
        )
    if host_access == "bastion":
        bastion = ssh_connection(settings, host).gateway  # the operator's own key reaches the bastion
        return PreparedConnection(host.address, gateway=bastion, before_open=lambda: key.push(host), **common)
    raise InventoryError(f"host_access = {host_access!r} in the stack outputs: expected 'ssm' or 'bastion'")
