"""How ``fab`` reaches an EC2 host that takes no inbound SSH: Session Manager carries the SSH stream,
EC2 Instance Connect delivers this run's key.

The real Session Manager hop needs AWS (an instance whose SSM agent has registered, the
session-manager-plugin on this side), so it cannot run here. What can is everything around it: the
exact ProxyCommand built for a host, and a Fabric connection made by the same code that runs that
command, reaching a real sshd on loopback. There the ``aws`` the command names is a stand-in that
does what ``aws ssm start-session --document-name AWS-StartSSHSession`` does for an SSH client:
copy the SSH stream between its stdin/stdout and the host's ``portNumber`` (``socat``). The key is
pushed with ``SendSSHPublicKey`` to moto's EC2 Instance Connect, and the loopback sshd admits the
pushed key, as the ``ec2-instance-connect`` package's sshd does on a host.
"""

from __future__ import annotations

import getpass
import shutil
import time
from pathlib import Path

import boto3
import pytest
from moto import mock_aws

from frontier.hosts.inventory import HostSpec, InventoryError
from frontier.hosts.transport import ProxiedConnection, TransportError, ephemeral_key
from frontier.targets import load_stack
from frontier.targets.ec2.access import InstanceConnectKey, host_connection, ssm_proxy_argv
from frontier.targets.ec2.backend import Ec2Backend
from frontier.targets.local import services

INSTANCE = "i-0123456789abcdef0"


@pytest.fixture
def dev():
    """The dev stack: no bastion, so its hosts are reached through Session Manager."""
    settings = load_stack("dev")
    assert not settings.inventory.ssh_gateway
    return settings


def as_local_user(settings):
    """The stack with this machine's user as ``inventory.ssh_user`` (the loopback sshd's only user)."""
    inventory = settings.inventory.model_copy(update={"ssh_user": getpass.getuser()})
    return settings.model_copy(update={"inventory": inventory})


def test_the_proxy_command_starts_an_ssh_session_through_session_manager_to_the_instance(dev):
    host = HostSpec("h100-abcdef", "10.20.1.7", 22, "/opt/frontier", "h100", INSTANCE)
    assert ssm_proxy_argv(dev, host) == [
        "aws", "ssm", "start-session",
        "--region", dev.region,
        "--target", INSTANCE,
        "--document-name", "AWS-StartSSHSession",
        "--parameters", "portNumber=22",
    ]  # fmt: skip


def test_a_host_without_an_instance_id_cannot_be_reached_through_session_manager(dev):
    listed = HostSpec("gpu-1", "10.20.1.7", 22, "/opt/frontier", "h100")
    with pytest.raises(InventoryError, match="Session Manager reaches an instance by its id"):
        ssm_proxy_argv(dev, listed)


def test_without_the_session_manager_plugin_fab_says_what_to_install(dev, tmp_path, monkeypatch):
    (tmp_path / "aws").write_text("#!/bin/sh\n")
    (tmp_path / "aws").chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    host = HostSpec("h100-abcdef", "10.20.1.7", 22, "/opt/frontier", "h100", INSTANCE)
    with mock_aws(), pytest.raises(TransportError) as refused:
        host_connection(dev, host, "ssm", InstanceConnectKey(dev, boto3.client))
    assert "session-manager-plugin not found on PATH" in str(refused.value)
    assert "session-manager-working-with-install-plugin" in str(refused.value)


def standin_aws(folder: Path) -> Path:
    """``aws ssm start-session ... --parameters portNumber=N`` as a plain pipe to 127.0.0.1:N."""
    script = folder / "aws"
    script.write_text(
        "#!/bin/sh\n"
        'for arg in "$@"; do case "$arg" in portNumber=*) port="${arg#portNumber=}";; esac; done\n'
        f'exec {shutil.which("socat")} - "TCP:127.0.0.1:$port"\n'
    )
    script.chmod(0o755)
    return script


@pytest.mark.slow
def test_a_fabric_connection_through_the_proxy_command_reaches_sshd_with_the_pushed_key(
    dev, tmp_path, monkeypatch
):
    assert shutil.which("socat"), "socat stands in for the Session Manager hop"
    settings = as_local_user(dev)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    port = services.free_port()
    host = HostSpec("h100-abcdef", "127.0.0.1", port, "/opt/frontier", "h100", INSTANCE)
    with mock_aws():
        pushed: list[dict] = []
        instance_connect = boto3.client("ec2-instance-connect", region_name=settings.region)
        instance_connect.meta.events.register(
            "provide-client-params.ec2-instance-connect.SendSSHPublicKey",
            lambda params, **_: pushed.append(dict(params)),
        )
        key = InstanceConnectKey(settings, {"ec2-instance-connect": instance_connect}.__getitem__)
        # The host's sshd admits what EC2 Instance Connect was given for it, and nothing else.
        sshd = services.start_sshd("127.0.0.1", port, tmp_path / "sshd", key.key.public, name="sshd-eic")
        try:
            conn = host_connection(settings, host, "ssm", key, aws=str(standin_aws(tmp_path)))
            assert isinstance(conn, ProxiedConnection)
            assert conn.proxy_argv[1:] == ssm_proxy_argv(settings, host)[1:]
            answer = conn.run("echo reached $(id -un)", hide=True, in_stream=False)
            assert answer.stdout.strip() == f"reached {getpass.getuser()}"
            # Files travel by SFTP over the same proxied connection (HostSession's uploads).
            with conn.sftp().open(str(tmp_path / "uploaded"), "wb") as fh:
                fh.write(b"release.json\n")
            assert (tmp_path / "uploaded").read_bytes() == b"release.json\n"
            assert pushed == [
                {"InstanceId": INSTANCE, "InstanceOSUser": getpass.getuser(), "SSHPublicKey": key.key.public}
            ]
            # A reconnect starts a new proxy and pushes the key again: a pushed key lives 60 s.
            conn.close()
            conn.run("true", hide=True, in_stream=False)
            assert len(pushed) == 2
            conn.close()
        finally:
            services.stop(sshd, timeout=5)


@pytest.mark.slow
def test_an_sshd_that_was_not_given_the_key_refuses_the_connection(dev, tmp_path):
    settings = as_local_user(dev)
    port = services.free_port()
    host = HostSpec("h100-abcdef", "127.0.0.1", port, "/opt/frontier", "h100", INSTANCE)
    other = ephemeral_key("someone-else")
    sshd = services.start_sshd("127.0.0.1", port, tmp_path / "sshd", other.public, name="sshd-other")
    try:
        with mock_aws():
            key = InstanceConnectKey(
                settings, lambda service: boto3.client(service, region_name=settings.region)
            )
            conn = host_connection(settings, host, "ssm", key, aws=str(standin_aws(tmp_path)))
            with pytest.raises(Exception, match="[Aa]uthentication"):
                conn.run("true", hide=True, in_stream=False)
            conn.close()
    finally:
        services.stop(sshd, timeout=5)


def test_a_proxy_that_ends_early_is_reported_in_its_own_words_without_waiting_for_a_banner(dev):
    said = "An error occurred (TargetNotConnected) when calling the StartSession operation: i-0123 is not connected."
    conn = ProxiedConnection(
        INSTANCE,
        proxy_argv=["sh", "-c", f"echo '{said}' >&2; exit 255"],
        user="ubuntu",
        connect_timeout=30,
        connect_kwargs={"pkey": ephemeral_key("t").pkey, "look_for_keys": False, "banner_timeout": 30},
    )
    started = time.monotonic()
    with pytest.raises(TransportError) as failed:
        conn.open()
    assert "TargetNotConnected" in str(failed.value) and "aws ssm start-session" not in str(failed.value)
    assert time.monotonic() - started < 10
    conn.close()


def test_an_ec2_stack_reaches_its_hosts_by_the_path_its_outputs_name(
    dev, saved_outputs, tmp_path, monkeypatch
):
    """The backend reads ``host_access`` from the stack's outputs: ``ssm`` without a bastion."""
    saved_outputs.ec2(dev)
    (tmp_path / "bin").mkdir()
    for name in ("aws", "session-manager-plugin"):
        (tmp_path / "bin" / name).write_text("#!/bin/sh\n")
        (tmp_path / "bin" / name).chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    host = HostSpec("h100-abcdef", "10.20.1.7", 22, "/opt/frontier", "h100", INSTANCE)
    conn = Ec2Backend(dev, dev.only_pool).connect(host)
    assert isinstance(conn, ProxiedConnection)
    assert conn.proxy_argv == [str(tmp_path / "bin" / "aws"), *ssm_proxy_argv(dev, host)[1:]]
    assert conn.host == INSTANCE and conn.user == dev.inventory.ssh_user
