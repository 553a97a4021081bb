"""What the hosts of a replica over several nodes boot with: node.env, cloud-init, the runtime's unit,
and a worker's leader proxy (real HAProxy in front of a real HTTP server standing in for the leader).

The stack is ``stacks/Pulumi.prod-multinode.yaml`` (2 nodes per replica). The single-node stacks
(dev, staging, prod) render none of it.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml
from frontier_hostside.aws_cli import BootError
from frontier_hostside.names import (
    CONTAINER_RELEASE_DIR,
    LEADER_ADDRESS_ENV,
    LEADER_PROXY_UNIT,
    NODES_PER_REPLICA_ENV,
    REPLICA_ENV_FILE,
    REPLICA_KEY_ENV,
)
from frontier_hostside.node_boot import NodeConfig
from frontier_hostside.rendezvous import Claim, write_env

from frontier.config.schema import Settings
from frontier.render.boot import node_env, render_cloud_init, render_leader_proxy
from frontier.render.host import render_systemd_unit
from frontier.targets import load_stack


def _pooled(settings):
    """The stack and its one pool, as the renderers of one pool's files take them."""
    (pool,) = settings.pools
    return settings, pool


DIGEST = "sha256:" + "ab" * 32
RUNTIME_YAML = f"{CONTAINER_RELEASE_DIR}/runtime.yaml"
SINGLE_NODE_STACKS = ("dev", "staging", "prod")


def multinode() -> Settings:
    return load_stack("prod-multinode")


def exec_start(unit: str, env: dict[str, str]) -> list[str]:
    """The unit's ExecStart as systemd runs it: continuation lines joined, ``${NAME}`` replaced by
    the value from the unit's Environment= lines and ``env`` (the EnvironmentFile), one word each."""
    environment = dict(re.findall(r"^Environment=(\w+)=(.*)$", unit, re.MULTILINE)) | env
    command = re.search(r"^ExecStart=((?:.*\\\n)*.*)$", unit, re.MULTILINE)
    assert command is not None, "the unit has no ExecStart"
    words = command.group(1).replace("\\\n", " ").split()
    return [re.sub(r"\$\{(\w+)\}", lambda m: environment[m.group(1)], word) for word in words]


def slot_env(tmp_path: Path, claim: Claim) -> dict[str, str]:
    path = write_env(claim, tmp_path / "run" / "replica.env")
    return dict(line.split("=", 1) for line in path.read_text().splitlines())


# --- a replica that fits one node: nothing changes ---------------------------------------------------


@pytest.mark.parametrize("stack", SINGLE_NODE_STACKS)
def test_a_single_node_stacks_unit_runs_serve_and_reads_no_slot(stack: str) -> None:
    unit = render_systemd_unit(*_pooled(load_stack(stack)), DIGEST)
    assert exec_start(unit, {})[-4:] == [
        "frontier_runtime",
        "serve",
        "--config",
        RUNTIME_YAML,
    ]
    assert "replica-env" not in unit and REPLICA_ENV_FILE not in unit and "EnvironmentFile" not in unit


@pytest.mark.parametrize("stack", SINGLE_NODE_STACKS)
def test_a_single_node_groups_hosts_boot_without_a_slot_or_a_leader_proxy(stack: str) -> None:
    settings = load_stack(stack)
    for group in settings.node_groups:
        env = dict(node_env(settings, group, history_bucket="b", history_prefix="history/x/"))
        assert NODES_PER_REPLICA_ENV not in env
        user_data = render_cloud_init(settings, group)
        assert LEADER_PROXY_UNIT not in user_data and LEADER_ADDRESS_ENV not in user_data


# --- a replica over two nodes -------------------------------------------------------------------------


def test_the_hosts_of_a_spanning_group_know_how_many_nodes_a_replica_spans(tmp_path: Path) -> None:
    settings = multinode()
    env = node_env(
        settings, settings.serving_group, history_bucket="b", history_prefix="history/prod-multinode/"
    )
    (tmp_path / "node.env").write_text("".join(f"{k}={v}\n" for k, v in env))
    assert NodeConfig.load(str(tmp_path / "node.env")).nodes_per_replica == 2


@pytest.mark.parametrize("value", ["0", "two", "-1"])
def test_a_bad_replica_size_in_node_env_is_refused_naming_the_file_variable_and_value(
    tmp_path: Path, value: str
) -> None:
    settings = multinode()
    env = dict(node_env(settings, settings.serving_group, history_bucket="b", history_prefix="history/x/"))
    env[NODES_PER_REPLICA_ENV] = value
    (tmp_path / "node.env").write_text("".join(f"{k}={v}\n" for k, v in env.items()))
    with pytest.raises(BootError) as refused:
        NodeConfig.load(str(tmp_path / "node.env"))
    assert str(refused.value) == (
        f"{tmp_path / 'node.env'}: {NODES_PER_REPLICA_ENV}={value!r}: must be a whole number of nodes, 1 or more"
    )


def test_a_spanning_stacks_unit_claims_the_hosts_slot_before_each_start() -> None:
    unit = render_systemd_unit(*_pooled(multinode()), DIGEST)
    assert f"EnvironmentFile=-{REPLICA_ENV_FILE}" in unit
    claim = re.findall(r"^ExecStartPre=(.*frontier-bootstrap\.py.*)$", unit, re.MULTILINE)
    assert claim == ["/usr/bin/python3 /opt/frontier/bin/frontier-bootstrap.py replica-env --restart-proxy"]


def test_a_spanning_stacks_unit_never_stops_restarting_while_its_replica_reforms() -> None:
    # Each node exits whenever its replica loses another; five restarts in ten minutes would park it.
    unit = render_systemd_unit(*_pooled(multinode()), DIGEST)
    assert "StartLimitIntervalSec=0" in unit and "StartLimitBurst" not in unit


@pytest.mark.parametrize("stack", SINGLE_NODE_STACKS)
def test_a_single_node_stacks_unit_gives_up_on_a_crash_loop(stack: str) -> None:
    unit = render_systemd_unit(*_pooled(load_stack(stack)), DIGEST)
    assert "StartLimitIntervalSec=600" in unit and "StartLimitBurst=5" in unit


def test_a_workers_unit_runs_node(tmp_path: Path) -> None:
    env = slot_env(tmp_path, Claim(replica=0, node=1, leader_address="10.0.1.10", key="k" * 64))
    argv = exec_start(render_systemd_unit(*_pooled(multinode()), DIGEST), env)
    assert argv[-4:] == ["frontier_runtime", "node", "--config", RUNTIME_YAML]


def test_a_leaders_unit_runs_serve(tmp_path: Path) -> None:
    env = slot_env(tmp_path, Claim(replica=0, node=0, leader_address="10.0.1.10", key="k" * 64))
    argv = exec_start(render_systemd_unit(*_pooled(multinode()), DIGEST), env)
    assert argv[-4:] == ["frontier_runtime", "serve", "--config", RUNTIME_YAML]


def test_the_container_gets_the_slot_by_name_so_the_key_is_on_no_command_line(tmp_path: Path) -> None:
    env = slot_env(tmp_path, Claim(replica=0, node=1, leader_address="10.0.1.10", key="k" * 64))
    argv = exec_start(render_systemd_unit(*_pooled(multinode()), DIGEST), env)
    passed = [argv[i + 1] for i, word in enumerate(argv) if word == "--env"]
    assert {"FRONTIER_RUNTIME_COMMAND", "FRONTIER_NODE_RANK", LEADER_ADDRESS_ENV, REPLICA_KEY_ENV} <= set(
        passed
    )
    assert not any("k" * 64 in word for word in argv)


def test_no_rendered_file_of_a_spanning_stack_holds_a_replica_key() -> None:
    settings = multinode()
    for text in (
        render_systemd_unit(settings, settings.only_pool, DIGEST),
        render_cloud_init(settings, settings.serving_group),
    ):
        assert f"{REPLICA_KEY_ENV}=" not in text


def test_a_spanning_groups_hosts_get_the_leader_proxy_started_only_where_a_leader_is_named() -> None:
    settings = multinode()
    user_data = render_cloud_init(settings, settings.serving_group)
    unit = user_data.split(f"/etc/systemd/system/{LEADER_PROXY_UNIT}.service", 1)[1]
    assert "ConditionPathExists=/run/frontier/leader.env" in unit
    assert "EnvironmentFile=/run/frontier/leader.env" in unit


def test_cloud_init_writes_the_leader_proxy_configuration_byte_for_byte() -> None:
    settings = multinode()
    user_data = render_cloud_init(settings, settings.serving_group)
    assert user_data.startswith("#cloud-config\n")
    files = {f["path"]: f["content"] for f in yaml.safe_load(user_data)["write_files"]}
    assert files["/etc/frontier/leader-proxy.cfg"] == render_leader_proxy(settings, settings.only_pool)


def test_the_leader_proxy_configuration_is_valid_haproxy_once_the_leader_is_named(tmp_path: Path) -> None:
    config = tmp_path / "leader-proxy.cfg"
    config.write_text(render_leader_proxy(*_pooled(multinode()), stats_socket=str(tmp_path / "proxy.sock")))
    checked = subprocess.run(
        ["haproxy", "-c", "-f", str(config)],
        env={**os.environ, LEADER_ADDRESS_ENV: "10.0.1.10"},
        capture_output=True,
        text=True,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


# --- a worker's port answers as its leader -------------------------------------------------------------


class Leader(BaseHTTPRequestHandler):
    """The leader's runtime while it loads: live, not ready."""

    def log_message(self, *_args: object) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802 - the http.server API
        status = 503 if self.path == "/health/ready" else 200
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()


class LeaderServer(ThreadingHTTPServer):
    # The proxy binds the runtime's port on every IPv4 address, as on a worker; the leader stand-in
    # takes the same port on IPv6 loopback, as another host would on its own address.
    address_family = socket.AF_INET6

    def handle_error(self, request: object, client_address: object) -> None:
        pass  # HAProxy closing a connection it retried is no failure of the leader


@pytest.mark.slow
def test_a_workers_leader_proxy_answers_every_probe_with_its_leaders_own_status(tmp_path: Path) -> None:
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    settings = multinode()
    settings = settings.model_copy(update={"runtime": settings.runtime.model_copy(update={"port": port})})
    config = tmp_path / "leader-proxy.cfg"
    config.write_text(
        render_leader_proxy(settings, settings.only_pool, stats_socket=str(tmp_path / "proxy.sock"))
    )
    leader = LeaderServer(("::1", port), Leader)
    threading.Thread(target=leader.serve_forever, daemon=True).start()
    proxy = subprocess.Popen(
        ["haproxy", "-db", "-f", str(config)],
        env={**os.environ, LEADER_ADDRESS_ENV: "::1"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:

        def status(path: str) -> int:
            deadline = time.monotonic() + 10
            while True:
                try:
                    return urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5).status
                except urllib.error.HTTPError as answer:
                    return answer.code
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)

        # Live while loading: a worker's watchdog must not restart it for a leader that is not ready.
        assert status(settings.health.liveness_path) == 200
        assert status(settings.health.readiness_path) == 503
    finally:
        proxy.terminate()
        proxy.wait(timeout=10)
        leader.shutdown()
