"""An EC2 gateway host's own parts, run for real: TLS with the certificate made at boot, and the
publisher of its metrics against moto's CloudWatch.

The certificate script is the one the gateway's cloud-init writes (taken from the rendered user
data, byte for byte), run with openssl into a temporary folder. The gateway is the real process
(``python -m frontier_gateway serve`` with ``--tls-cert``/``--tls-key``, as the host's systemd unit
starts it) in front of stand-in runtimes (tests/gateway/harness.py). The publisher is
``python -m frontier_hostside.bootstrap publish-gateway`` with the real ``aws`` command against
moto's server, reading the gateway's admin /metrics over TLS with that certificate as the one
trusted authority. Only the file paths differ from a host's (no root here).
"""

from __future__ import annotations

import os
import shutil
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import boto3
import httpx
import pytest
import yaml
from frontier_hostside import names
from frontier_settings import to_yaml
from moto.server import ThreadedMotoServer
from test_bootstrap import AWS_CLI

from frontier.render.boot import gateway_env, render_gateway_cloud_init
from tests.gateway.harness import StandIn, gateway_config, tenant

pytestmark = pytest.mark.slow

KEY = "sk-acme-0123456789"
CERT_SCRIPT = "/usr/local/sbin/frontier-gateway-tls"


def boot_files(settings) -> dict[str, str]:  # noqa: ANN001
    user_data = render_gateway_cloud_init(settings, history_bucket="b", history_prefix="history/dev/")
    return {f["path"]: f["content"] for f in yaml.safe_load(user_data)["write_files"]}


@pytest.fixture(scope="module")
def gated_settings(tmp_path_factory: pytest.TempPathFactory):
    """The dev stack with a gateway section (as tests/infra/test_gateway_nodes.py builds it)."""
    from frontier.targets import load_stack
    from tests.gateway.stacks import dev_gateway_document, write_stack

    return load_stack(
        "dev", path=write_stack(tmp_path_factory.mktemp("stacks"), dev_gateway_document(), "dev")
    )


@pytest.fixture(scope="module")
def certificate(gated_settings, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The boot script's certificate and key, made in a temporary folder."""
    assert shutil.which("openssl"), "openssl must be on PATH: gateway hosts make their certificate with it"
    folder = tmp_path_factory.mktemp("boot")
    script = folder / "frontier-gateway-tls"
    script.write_text(boot_files(gated_settings)[CERT_SCRIPT])
    tls = folder / "tls"
    done = subprocess.run(["bash", str(script), str(tls)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return tls


@dataclass
class GatewayProcess:
    public: str  # host:port
    admin: str
    process: subprocess.Popen


def start_gateway(config_path: Path, tls: Path) -> GatewayProcess:
    """The gateway as its host's unit starts it, on free ports."""
    command = [
        sys.executable, "-m", "frontier_gateway", "serve", "--config", str(config_path),
        "--port", "0", "--admin-port", "0",
        "--tls-cert", str(tls / "gateway.crt"), "--tls-key", str(tls / "gateway.key"),
    ]  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    listening = [process.stdout.readline() for _ in range(2)]  # type: ignore[union-attr]
    public, admin = (line.rsplit(" on ", 1)[1].strip() for line in listening)
    return GatewayProcess(public, admin, process)


@pytest.fixture
def gateway(certificate: Path, tmp_path: Path) -> Iterator[tuple[GatewayProcess, dict[str, StandIn]]]:
    """One pool with a ready replica (model-a), one whose only replica is not ready and that holds
    requests (model-b, a pool at zero)."""
    standins = {"a": StandIn("a1"), "b": StandIn("b1")}
    standins["b"].ready = False
    config = gateway_config(
        {"model-a": [standins["a"].url], "model-b": [standins["b"].url]},
        [tenant("acme", KEY, ["model-a", "model-b"])],
        tmp_path / "metering.jsonl",
        hold={"model-b": {"max_requests": 4, "timeout_s": 20}},
    )
    path = tmp_path / "gateway.yaml"
    path.write_text(to_yaml(config))
    running = start_gateway(path, certificate)
    try:
        until_answering(running.public)
        yield running, standins
    finally:
        running.process.terminate()
        running.process.wait(timeout=30)
        for standin in standins.values():
            standin.close()


def until_answering(address: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            httpx.get(f"https://{address}{names.LIVENESS_PATH}", verify=False, timeout=1)
            return
        except httpx.TransportError:
            assert time.monotonic() < deadline, f"nothing answers TLS on {address}"
            time.sleep(0.05)


def trusting(certificate: Path) -> ssl.SSLContext:
    """What the publisher trusts: the host's own certificate, whatever name it was made for."""
    context = ssl.create_default_context(cafile=str(certificate / "gateway.crt"))
    context.check_hostname = False
    return context


def test_the_boot_script_makes_the_certificate_once_readable_by_its_owner_only(gated_settings, certificate):
    key, crt = certificate / "gateway.key", certificate / "gateway.crt"
    assert oct(key.stat().st_mode & 0o777) == "0o600" and oct(certificate.stat().st_mode & 0o777) == "0o700"
    before = crt.read_bytes()
    script = certificate.parent / "frontier-gateway-tls"
    subprocess.run(["bash", str(script), str(certificate)], check=True, timeout=60)
    assert crt.read_bytes() == before  # a reboot keeps the pair


def test_the_gateway_answers_the_balancers_https_health_check_with_the_boot_made_certificate(gateway):
    running, _ = gateway
    # The ALB does not validate its targets' certificates: neither does this client.
    ready = httpx.get(f"https://{running.public}{names.READINESS_PATH}", verify=False, timeout=10)
    assert ready.status_code in (200, 503)  # the gateway's readiness, over TLS
    answer = httpx.post(
        f"https://{running.public}/v1/completions",
        json={"model": "model-a", "prompt": "hello", "max_tokens": 2},
        headers={"Authorization": f"Bearer {KEY}"},
        verify=False,
        timeout=10,
    )
    assert answer.status_code == 200


def test_the_gateways_port_refuses_plain_http_once_it_serves_tls(gateway):
    running, _ = gateway
    host, port = running.public.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as plain:
        plain.sendall(b"GET /health/live HTTP/1.1\r\nHost: x\r\n\r\n")
        plain.settimeout(5)
        try:
            first = plain.recv(64)
        except (ConnectionResetError, TimeoutError):
            first = b""
    assert not first.startswith(b"HTTP/1.1 200")


def test_the_admin_metrics_are_served_over_tls_with_the_hosts_own_certificate(gateway, certificate):
    running, _ = gateway
    metrics = httpx.get(
        f"https://{running.admin}{names.METRICS_PATH}", verify=trusting(certificate), timeout=10
    )
    assert metrics.status_code == 200 and "frontier_gateway_" in metrics.text


@pytest.fixture
def cloudwatch(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    assert AWS_CLI, "the AWS CLI (`aws`) must be on PATH: gateway hosts publish through it"
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    for key, value in {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(key, value)
    try:
        yield endpoint
    finally:
        server.stop()


def publish(env_file: Path) -> subprocess.CompletedProcess:
    """What the host's timer runs, with the host's PATH shape: the aws command beside python."""
    return subprocess.run(
        [sys.executable, "-m", "frontier_hostside.bootstrap", "--env", str(env_file), "publish-gateway"],
        capture_output=True,
        text=True,
        env={**os.environ, "PATH": f"{Path(AWS_CLI or 'aws').parent}:{os.environ['PATH']}"},
        timeout=120,
    )


def test_the_publisher_puts_each_pools_held_requests_and_the_gateways_answers_into_cloudwatch(
    gated_settings, gateway, certificate, cloudwatch, tmp_path
):
    running, standins = gateway
    env = dict(gateway_env(gated_settings))
    env |= {
        "AWS_REGION": "us-east-1",
        "FRONTIER_ROOT": str(tmp_path / "publisher"),
        "FRONTIER_GATEWAY_METRICS_URL": f"https://{running.admin}{names.METRICS_PATH}",
        "FRONTIER_GATEWAY_CA": str(certificate / "gateway.crt"),
        "FRONTIER_GATEWAY_POOLS": "model-a=a10g,model-b=l4",
    }
    env_file = tmp_path / "gateway.env"
    env_file.write_text("".join(f"{k}={v}\n" for k, v in env.items()))

    def ask(model: str) -> int:
        return httpx.post(
            f"https://{running.public}/v1/completions",
            json={"model": model, "prompt": "hello", "max_tokens": 2},
            headers={"Authorization": f"Bearer {KEY}"},
            verify=False,
            timeout=30,
        ).status_code

    first = publish(env_file)  # the baseline: nothing counted before it
    assert first.returncode == 0, first.stdout + first.stderr
    assert [ask("model-a") for _ in range(3)] == [200, 200, 200]
    standins["a"].status = 500
    failed = ask("model-a")
    assert failed >= 500
    held = threading.Thread(target=ask, args=("model-b",), daemon=True)  # waits for a replica
    held.start()
    deadline = time.monotonic() + 10
    while (
        'frontier_gateway_pool_waiting{pool="model-b"} 1.0'
        not in httpx.get(
            f"https://{running.admin}{names.METRICS_PATH}", verify=trusting(certificate), timeout=10
        ).text
    ):
        assert time.monotonic() < deadline, "the request to model-b was never held"
        time.sleep(0.05)
    second = publish(env_file)
    assert second.returncode == 0, second.stdout + second.stderr
    standins["b"].ready = True  # the held request leaves
    held.join(timeout=30)

    client = boto3.client("cloudwatch", region_name="us-east-1")

    def latest(metric: str, group: str) -> list[float]:
        stats = client.get_metric_statistics(
            Namespace="Frontier/Runtime",
            MetricName=metric,
            Dimensions=[{"Name": "Stack", "Value": "dev"}, {"Name": "NodeGroup", "Value": group}],
            StartTime=time.time() - 3600,
            EndTime=time.time() + 3600,
            Period=60,
            Statistics=["Maximum", "Sum", "SampleCount"],
        )["Datapoints"]
        # Over every minute: the two publishes may fall into two.
        return [
            max(d["Maximum"] for d in stats),
            sum(d["Sum"] for d in stats),
            sum(d["SampleCount"] for d in stats),
        ]

    # Two publishes each; the held request was waiting at the second.
    assert latest("HeldRequests", "l4") == [1.0, 1.0, 2.0]
    assert latest("HeldRequests", "a10g") == [0.0, 0.0, 2.0]
    # Answered since the baseline: 3 x 200 and the 5xx, none before it.
    assert latest(names.GATEWAY_REQUESTS_CW_METRIC, names.GATEWAY_NODE_GROUP)[1] == 4.0
    assert latest(names.GATEWAY_5XX_CW_METRIC, names.GATEWAY_NODE_GROUP)[1] == 1.0


def test_counts_are_increases_since_the_last_publish_and_a_restarted_gateway_counts_from_zero():
    from frontier_hostside.gateway_boot import counted_since

    assert counted_since({"200": 5.0, "503": 1.0}, {"200": 9.0, "503": 1.0, "500": 2.0}) == {
        "200": 4.0,
        "503": 0.0,
        "500": 2.0,
    }
    assert counted_since({"200": 5.0}, {"200": 2.0}) == {"200": 2.0}


def test_a_pool_mapping_that_is_not_pool_equals_node_group_is_refused_naming_it(tmp_path):
    from frontier_hostside.aws_cli import BootError
    from frontier_hostside.gateway_boot import GatewayNodeConfig

    env = tmp_path / "gateway.env"
    lines = {
        "FRONTIER_STACK": "dev",
        "AWS_REGION": "us-east-1",
        "FRONTIER_ROOT": str(tmp_path),
        "FRONTIER_GATEWAY_METRICS_URL": "https://127.0.0.1:8091/metrics",
        "FRONTIER_METRIC_NAMESPACE": "Frontier/Runtime",
        "FRONTIER_HELD_METRIC": "HeldRequests",
        "FRONTIER_POOL_WAITING_SERIES": "frontier_gateway_pool_waiting",
        "FRONTIER_GATEWAY_REQUESTS_SERIES": "frontier_gateway_requests",
        "FRONTIER_GATEWAY_POOLS": "model-a=a10g,model-b",
    }
    env.write_text("".join(f"{k}={v}\n" for k, v in lines.items()))
    with pytest.raises(
        BootError, match=r"FRONTIER_GATEWAY_POOLS=.*each item is pool=node_group, not 'model-b'"
    ):
        GatewayNodeConfig.load(str(env))


def test_a_certificate_without_its_key_is_refused_before_the_gateway_listens(certificate, tmp_path):
    config = gateway_config(
        {"model-a": ["http://127.0.0.1:9"]}, [tenant("acme", KEY, ["model-a"])], tmp_path / "m"
    )
    path = tmp_path / "gateway.yaml"
    path.write_text(to_yaml(config))
    done = subprocess.run(
        [sys.executable, "-m", "frontier_gateway", "serve", "--config", str(path), "--port", "0",
         "--admin-port", "0", "--tls-cert", str(certificate / "gateway.crt")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2
    assert "TLS needs both --tls-cert and --tls-key" in done.stderr
