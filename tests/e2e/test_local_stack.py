"""``local.up`` / ``local.down`` on a private copy of the local stack: real moto, sshd and HAProxy."""

from __future__ import annotations

import json
import socket
import stat

import pytest
from fabric import Config, Connection

from frontier import project
from frontier.targets import backend_for, load_stack
from frontier.targets.local import cluster as local
from frontier.targets.local import services
from frontier.targets.local.connection import LocalConnection
from tests.e2e.stackcopy import write_local_stack

pytestmark = pytest.mark.e2e


@pytest.fixture
def settings(tmp_path, monkeypatch):
    """A private local stack that each test brings up (or not) itself."""
    monkeypatch.setenv("FRONTIER_STACKS_DIR", str(write_local_stack(tmp_path, hosts=2)))
    monkeypatch.delenv(local.CONNECTION_ENV, raising=False)
    s = load_stack("local")
    yield s
    local.down(s)


@pytest.fixture(scope="module")
def running(tmp_path_factory):
    """One private local stack, up once for the tests that only look at it."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FRONTIER_STACKS_DIR", str(write_local_stack(tmp_path_factory.mktemp("local"), hosts=2)))
        mp.delenv(local.CONNECTION_ENV, raising=False)
        s = load_stack("local")
        first = local.up(s)
        yield s, first
        local.down(s)


def test_up_starts_moto_sshd_per_host_and_haproxy_and_a_second_up_starts_nothing(running):
    settings, report = running
    first = {c.name: c.state for c in report}
    assert first["moto"] == first["haproxy"] == first["sshd-host-1"] == first["sshd-host-2"] == "started"
    # Each slot's IMDS stand-in and the agent's watcher polling it (spot notices, as on EC2).
    assert first["imds-host-1"] == first["interruptions-host-1"] == first["imds-host-2"] == "started"
    second = {c.name: c.state for c in local.up(settings)}
    assert set(second.values()) <= {"running", "exists"}


def test_up_creates_the_buckets_and_a_secret_whose_key_only_the_state_file_shares(running):
    settings, _ = running
    # IAM is enforced on the local moto: the administrator (pulumi up's stand-in) may read both.
    s3 = local.aws_client(settings, "s3", actor="admin")
    names = {b["Name"] for b in s3.list_buckets()["Buckets"]}
    assert set(local.bucket_names(settings).values()) <= names
    sm = local.aws_client(settings, "secretsmanager", actor="admin")
    stored = json.loads(sm.get_secret_value(SecretId=settings.runtime.api_keys_secret)["SecretString"])
    key_file = local.state_dir(settings) / local.API_KEY_FILE
    assert stored["keys"] == [local.api_key(settings, settings.only_pool)]
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    local.up(settings)
    assert local.api_key(settings, settings.only_pool) == stored["keys"][0]  # a second up keeps the key


def test_host_slots_answer_over_ssh_with_the_aws_environment_pointing_at_moto(running):
    settings, _ = running
    host = settings.inventory.hosts[1]
    conn = Connection(
        host.address,
        user=settings.inventory.ssh_user,
        port=host.ssh_port,
        config=Config(overrides={"load_ssh_configs": False}),
        connect_kwargs={
            "key_filename": str(local.ssh_key_file(settings)),
            "look_for_keys": False,
            "allow_agent": False,
        },
    )
    with conn:
        out = conn.run("echo $AWS_ENDPOINT_URL $FRONTIER_HOST", hide=True, in_stream=False).stdout.split()
    assert out == [local.moto_endpoint(settings), host.name]
    env_file = (local.host_root(host) / "env").read_text()
    assert f"AWS_ENDPOINT_URL={local.moto_endpoint(settings)}\n" in env_file
    assert local.connection_mode(settings) == "ssh"


def test_haproxy_serves_the_rendered_config_with_readiness_checks(running):
    settings, _ = running
    config = local.haproxy_config_path(settings).read_text()
    assert f"option httpchk GET {settings.health.readiness_path}" in config
    with socket.create_connection(("127.0.0.1", settings.local.balancer_port), timeout=2) as sock:
        sock.sendall(b"GET /v1/models HTTP/1.0\r\n\r\n")
        assert sock.recv(64).startswith(b"HTTP/1.1 503")  # no runtime yet: no healthy backend


def test_a_second_up_says_when_the_running_balancer_no_longer_matches_the_stack(settings):
    local.up(settings)
    local.haproxy_config_path(settings).write_text("# edited by hand\n")
    (haproxy,) = [c for c in local.up(settings) if c.name == "haproxy"]
    assert haproxy.state == "running"
    assert "config differs from the stack file" in haproxy.detail


def test_down_stops_everything_and_a_second_down_finds_nothing(settings):
    local.up(settings)
    names = ("moto", "haproxy", "sshd-host-1", "imds-host-1", "interruptions-host-1")
    pids = [services.find(local.state_dir(settings), n).pid for n in names]
    stopped = {c.name: c.state for c in local.down(settings)}
    assert {stopped[n] for n in names} == {"stopped"}
    assert not any(services.pid_alive(pid) for pid in pids)
    again = local.down(settings)
    assert {c.state for c in again} == {"absent"}, [(c.name, c.state, c.detail) for c in again]


def test_a_taken_port_is_named_before_anything_starts(settings):
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", settings.local.balancer_port))
        squatter.listen()
        with pytest.raises(
            services.ServiceError, match=f"127.0.0.1:{settings.local.balancer_port} is already taken"
        ):
            local.up(settings)
    assert services.find(local.state_dir(settings), "moto") is None


def test_without_sshd_the_host_slots_are_driven_by_a_local_connection(settings, monkeypatch):
    monkeypatch.setenv(local.CONNECTION_ENV, "local")
    started = {c.name for c in local.up(settings)}
    assert not any(name.startswith("sshd-") for name in started)
    assert local.connection_mode(settings) == "local"
    host = backend_for(settings).hosts()[0]
    conn = backend_for(settings).connect(host)
    assert isinstance(conn, LocalConnection)
    out = conn.run(f". {host.root}/env && echo $AWS_ENDPOINT_URL", in_stream=False).stdout.strip()
    assert out == local.moto_endpoint(settings)


def test_an_unknown_connection_choice_is_refused(settings, monkeypatch):
    monkeypatch.setenv(local.CONNECTION_ENV, "telnet")
    with pytest.raises(local.LocalStackError, match="must be 'ssh' or 'local'"):
        local.up(settings)


def test_a_stack_without_a_local_section_is_refused():
    with pytest.raises(local.LocalStackError, match="no 'frontier:local' section"):
        local.up(load_stack("dev", path=(project.root() / "stacks") / "Pulumi.dev.yaml"))
