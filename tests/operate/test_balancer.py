"""Draining waits for in-flight requests (real HAProxy); an ALB target group drains by deregistration (moto)."""

from __future__ import annotations

import contextlib
import http.server
import threading
import time
import urllib.request
from pathlib import Path

import boto3
import pytest
from moto import mock_aws

from frontier.hosts.balancer import BalancerError
from frontier.hosts.inventory import HostSpec
from frontier.targets.ec2.balancer import AlbBalancer
from frontier.targets.local import services
from frontier.targets.local.balancer import HAProxyBalancer

HOST = HostSpec("host-1", "127.0.0.1", 22, "/opt/frontier", "cpu")


class SlowBackend(http.server.ThreadingHTTPServer):
    """Answers /ready at once and / after `delay` seconds."""

    def __init__(self, delay: float) -> None:
        delay_s = delay
        self.completed = 0
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path != "/ready":
                    time.sleep(delay_s)
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")
                if self.path != "/ready":
                    server.completed += 1

            def log_message(self, *args: object) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    def handle_error(self, request: object, client_address: object) -> None:
        pass  # a client that went away mid-answer is part of these tests


def wait_in_flight(balancer: HAProxyBalancer) -> None:
    deadline = time.monotonic() + 10
    while int(balancer.stats(HOST)["scur"] or 0) < 1:
        assert time.monotonic() < deadline, "the request never reached the backend"
        time.sleep(0.02)


@pytest.fixture
def haproxy(tmp_path: Path):
    backend = SlowBackend(delay=1.0)
    port = services.free_port()
    config = tmp_path / "haproxy.cfg"
    config.write_text(
        f"global\n    stats socket {tmp_path / 'admin.sock'} mode 600 level admin\n"
        "defaults\n    mode http\n    timeout connect 1s\n    timeout client 10s\n    timeout server 10s\n"
        f"frontend f\n    bind 127.0.0.1:{port}\n    default_backend runtime\n"
        "backend runtime\n    option httpchk GET /ready\n    default-server check inter 200ms rise 1 fall 1\n"
        f"    server host-1 127.0.0.1:{backend.server_address[1]}\n"
    )
    service = services.start_haproxy(config, tmp_path)
    try:
        balancer = HAProxyBalancer(service.extra["admin_socket"])
        balancer.enable(HOST, timeout=5)
        yield balancer, port, backend
    finally:
        services.stop(service)
        backend.shutdown()


def test_draining_waits_for_the_request_in_flight_then_takes_the_host_out(haproxy):
    balancer, port, backend = haproxy
    answered: list[int] = []
    request = threading.Thread(
        target=lambda: answered.append(urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10).status)
    )
    request.start()
    wait_in_flight(balancer)

    still_open = balancer.drain(HOST, timeout=10)
    finished_when_drained = backend.completed
    request.join()

    assert still_open == 0 and finished_when_drained == 1 and answered == [200]
    assert balancer.state(HOST) == "MAINT"


def test_draining_gives_up_after_the_deregistration_delay(haproxy):
    balancer, port, _ = haproxy

    def slow_request() -> None:
        with contextlib.suppress(OSError):  # HAProxy may be gone before the answer comes
            urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10).close()

    threading.Thread(target=slow_request, daemon=True).start()
    wait_in_flight(balancer)
    assert balancer.drain(HOST, timeout=0.2) == 1
    assert balancer.state(HOST) == "MAINT"


def test_enabling_waits_for_haproxy_own_health_check(haproxy):
    balancer, _, _ = haproxy
    balancer.drain(HOST, timeout=5)
    balancer.enable(HOST, timeout=5)
    assert balancer.state(HOST) == "UP"


def test_an_unknown_server_is_a_clear_error(haproxy):
    balancer, _, _ = haproxy
    with pytest.raises(BalancerError, match="no server runtime/host-9"):
        balancer.state(HostSpec("host-9", "127.0.0.9", 22, "/", "cpu"))


def test_an_alb_target_is_deregistered_and_registered_again(monkeypatch):
    monkeypatch.setenv("MOTO_EC2_LOAD_DEFAULT_AMIS", "false")  # the VPC needs none; loading them is slow
    with mock_aws():
        ec2 = boto3.client("ec2", region_name="us-east-1")
        elbv2 = boto3.client("elbv2", region_name="us-east-1")
        vpc = ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
        arn = elbv2.create_target_group(
            Name="runtime", Protocol="HTTP", Port=8000, VpcId=vpc, TargetType="ip"
        )["TargetGroups"][0]["TargetGroupArn"]
        alb = AlbBalancer(elbv2, arn, poll_s=0.01)
        host = HostSpec("gpu-1", "10.0.1.5", 22, "/opt/frontier", "h100")

        alb.enable(host, timeout=5)
        assert alb.state(host) == "healthy"
        assert alb.drain(host, timeout=5) == 0
        assert alb.state(host) == "unused"  # what AWS reports for a target that is not registered


def test_an_alb_drain_takes_out_the_target_the_auto_scaling_group_registered_on_the_groups_port(
    monkeypatch,
):
    # The auto scaling group registers each instance on the target group's own port (the hosts'
    # TLS proxy, not the runtime's): the drain must name that very target.
    monkeypatch.setenv("MOTO_EC2_LOAD_DEFAULT_AMIS", "false")
    with mock_aws():
        ec2 = boto3.client("ec2", region_name="us-east-1")
        elbv2 = boto3.client("elbv2", region_name="us-east-1")
        vpc = ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
        arn = elbv2.create_target_group(
            Name="runtime", Protocol="HTTPS", Port=8443, VpcId=vpc, TargetType="ip"
        )["TargetGroups"][0]["TargetGroupArn"]
        host = HostSpec("gpu-1", "10.0.1.5", 22, "/opt/frontier", "h100")
        elbv2.register_targets(TargetGroupArn=arn, Targets=[{"Id": host.address}])  # as the group does
        named = _Naming(elbv2)
        alb = AlbBalancer(named, arn, poll_s=0.01)

        assert alb.drain(host, timeout=5) == 0
        assert elbv2.describe_target_health(TargetGroupArn=arn)["TargetHealthDescriptions"] == []
        # moto ignores a port on deregistering; AWS takes {Id, Port: another} for another target, answers
        # "unused" for it and leaves the registered one serving. So no call may name another port.
        assert named.ports <= {None, 8443}


class _Naming:
    """The elbv2 client, noting the port each call names its targets on."""

    def __init__(self, client):
        self.client, self.ports = client, set()

    def __getattr__(self, name):
        call = getattr(self.client, name)

        def noted(**kwargs):
            self.ports |= {target.get("Port") for target in kwargs.get("Targets", [])}
            return call(**kwargs)

        return noted


class _AlwaysDraining:
    """moto drops a deregistered target at once and never reports "draining" (see MACHINE-NOTES), so
    this stand-in for the elbv2 client is the one way to show a drain that outlasts its deadline."""

    def deregister_targets(self, **_kwargs):
        return {}

    def describe_target_health(self, **kwargs):
        target = kwargs["Targets"][0]
        return {"TargetHealthDescriptions": [{"Target": target, "TargetHealth": {"State": "draining"}}]}


def test_an_alb_drain_that_outlasts_its_deadline_reports_an_unknown_count_not_a_made_up_one():
    alb = AlbBalancer(_AlwaysDraining(), "arn:tg", poll_s=0.01, drain_margin_s=0)
    assert alb.drain(HOST, timeout=0.05) is None
