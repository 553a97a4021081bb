"""Closed doors on EC2: who reaches the load balancer, how it reaches the hosts, where hosts may send.

The program runs under Pulumi mocks like every test of it (no engine or AWS account here). One
provider behaviour needs more than the shared mocks give: an S3 gateway endpoint's prefix list id,
which AWS computes at creation; :class:`PrefixListMocks` fills it in. The hosts' TLS proxy runs for
real: the rendered HAProxy configuration, with a certificate made by cloud-init's own commands,
answers HTTPS on loopback in front of a plain HTTP server standing where the runtime listens.
"""

from __future__ import annotations

import contextvars
import http.server
import ipaddress
import json
import re
import socket
import ssl
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from infra_mocks import Graph, _ensure_event_loop, _Recorder, _run, graph_for
from pulumi.runtime.mocks import MockResourceArgs

from frontier import project
from frontier.errors import StackError
from frontier.render.boot import render_cloud_init
from frontier.targets import load_stack
from frontier.targets.kubernetes.network import ingress_source_cidrs
from frontier.targets.local import services
from infra.edge import (
    TARGET_PROXY_FILE,
    TARGET_TLS_CERTIFICATE,
    TARGET_TLS_PORT,
    render_target_proxy,
)
from infra.eks import ALB_SUBNET_TAG, INTERNAL_ALB_SUBNET_TAG
from infra.network import INTERFACE_ENDPOINTS
from infra.program import build
from infra.security_groups import ANYWHERE

LB = "aws:lb/loadBalancer:LoadBalancer"
TG = "aws:lb/targetGroup:TargetGroup"
SG = "aws:ec2/securityGroup:SecurityGroup"
SUBNET = "aws:ec2/subnet:Subnet"
INGRESS = "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule"
EGRESS = "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule"
ENDPOINT = "aws:ec2/vpcEndpoint:VpcEndpoint"
OBJECT = "aws:s3/bucketObjectv2:BucketObjectv2"
ASG = "aws:autoscaling/group:Group"
EIP = "aws:ec2/eip:Eip"
FUNCTION = "aws:lambda/function:Function"
ALLOWED = ["203.0.113.0/24", "198.51.100.16/28"]
S3_PREFIX_LIST = "pl-63a5400a"


class PrefixListMocks(_Recorder):
    """The shared mocks, plus the prefix list id AWS gives every S3 gateway endpoint and the public
    address it gives every Elastic IP (from the documentation range, one per address made)."""

    def new_resource(self, args: MockResourceArgs) -> tuple[str, dict[str, Any]]:
        resource_id, outputs = super().new_resource(args)
        if args.typ == ENDPOINT and args.inputs.get("vpcEndpointType") == "Gateway":
            outputs["prefixListId"] = S3_PREFIX_LIST
        if args.typ == EIP:
            outputs["publicIp"] = f"203.0.113.{10 + sum(1 for a, *_ in self.created if a.typ == EIP)}"
        return resource_id, outputs


def stack_with(tmp_path_factory: pytest.TempPathFactory, stack: str, **sections: dict) -> Path:
    """The stack's file with some keys of its sections replaced (``edge={"scheme": ...}``)."""
    document = yaml.safe_load((project.root() / "stacks" / f"Pulumi.{stack}.yaml").read_text())
    for section, values in sections.items():
        document["config"][f"frontier:{section}"].update(values)
    path = tmp_path_factory.mktemp("stacks") / f"Pulumi.{stack}.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def run_with_prefix_list(path: Path, stack: str) -> Graph:
    settings = load_stack(stack, path=path)
    _ensure_event_loop()
    return contextvars.Context().run(_run, settings, build, PrefixListMocks(settings.region))


@pytest.fixture(scope="module")
def internal(tmp_path_factory: pytest.TempPathFactory) -> Graph:
    """prod, with an internal balancer that admits two client ranges."""
    path = stack_with(tmp_path_factory, "prod", edge={"scheme": "internal", "allow_cidrs": ALLOWED})
    return run_with_prefix_list(path, "prod")


def _group_id(graph: Graph, key: str) -> str:
    return graph.one(SG, f"{graph.stack}-sg-{key}").id


def _rules(graph: Graph, typ: str, group: str) -> set[tuple]:
    """(range or group or prefix list, protocol, port) of every rule of one group."""
    group_id = _group_id(graph, group)
    return {
        (
            r.inputs.get("cidrIpv4")
            or r.inputs.get("prefixListId")
            or r.inputs.get("referencedSecurityGroupId"),
            r.inputs["ipProtocol"],
            int(r.inputs.get("fromPort", -1)),
        )
        for r in graph.of_type(typ)
        if r.inputs["securityGroupId"] == group_id
    }


# --- who reaches the load balancer -------------------------------------------------------------------


def test_an_internal_balancer_lives_in_the_private_subnets(internal):
    alb = internal.one(LB).inputs
    private = {s.id for s in internal.of_type(SUBNET) if s.inputs["tags"]["frontier:tier"] == "private"}
    assert alb["internal"] is True
    assert len(alb["subnets"]) == len(private) and set(alb["subnets"]) == private


def test_the_allowlist_and_the_stacks_probe_are_the_only_ways_into_the_balancer(internal):
    probe = (_group_id(internal, "probe"), "tcp", 443)
    assert _rules(internal, INGRESS, "alb") == {
        (cidr, "tcp", port) for cidr in ALLOWED for port in (443, 80)
    } | {probe}


# --- the synthetic probe where the balancer would not admit AWS's network -----------------------------


@pytest.fixture(scope="module")
def allowlisted(tmp_path_factory: pytest.TempPathFactory) -> Graph:
    """prod, its internet-facing balancer admitting two client ranges."""
    return run_with_prefix_list(stack_with(tmp_path_factory, "prod", edge={"allow_cidrs": ALLOWED}), "prod")


def _probe_function(graph: Graph) -> dict[str, Any]:
    [function] = [f for f in graph.of_type(FUNCTION) if f.inputs["name"] == f"frontier-{graph.stack}-probe"]
    return function.inputs


def _private_subnets(graph: Graph) -> set[str]:
    return {s.id for s in graph.of_type(SUBNET) if s.inputs["tags"]["frontier:tier"] == "private"}


def test_an_open_balancers_probe_calls_from_awss_network_as_a_client_does():
    prod = graph_for("prod")
    assert "vpcConfig" not in _probe_function(prod)
    assert not [g for g in prod.of_type(SG) if g.name == "prod-sg-probe"]


def test_an_internal_balancers_probe_runs_in_the_private_subnets_with_https_to_the_vpc_alone(internal):
    vpc = _probe_function(internal)["vpcConfig"]
    assert set(vpc["subnetIds"]) == _private_subnets(internal)
    assert vpc["securityGroupIds"] == [_group_id(internal, "probe")]
    assert _rules(internal, EGRESS, "probe") == {(internal.settings.network.vpc_cidr, "tcp", 443)}
    assert not _rules(internal, INGRESS, "probe")


def test_an_allowlisted_internet_facing_balancer_admits_the_probe_at_the_nats_addresses_on_443_alone(
    allowlisted,
):
    nats = {f"{eip.outputs['publicIp']}/32" for eip in allowlisted.of_type(EIP) if "-nat-" in eip.name}
    network = allowlisted.settings.network
    assert len(nats) == (network.availability_zones if network.nat == "per_az" else 1)
    assert _rules(allowlisted, INGRESS, "alb") == {(c, "tcp", p) for c in ALLOWED for p in (443, 80)} | {
        (nat, "tcp", 443) for nat in nats
    }
    vpc = _probe_function(allowlisted)["vpcConfig"]
    assert set(vpc["subnetIds"]) == _private_subnets(allowlisted)
    assert _rules(allowlisted, EGRESS, "probe") == {(ANYWHERE, "tcp", 443)}


def test_a_probe_in_the_vpc_may_manage_its_network_interfaces_and_an_open_balancers_may_not(internal):
    def statements(graph: Graph) -> dict[str, dict]:
        [policy] = [
            p
            for p in graph.of_type("aws:iam/rolePolicy:RolePolicy")
            if p.name == f"{graph.stack}-monitoring-probe-role"
        ]
        return {s["Sid"]: s for s in json.loads(policy.inputs["policy"])["Statement"]}

    reach = statements(internal)["ReachItsVpc"]
    assert set(reach["Action"]) == {
        "ec2:CreateNetworkInterface",
        "ec2:DescribeNetworkInterfaces",
        "ec2:DeleteNetworkInterface",
        "ec2:AssignPrivateIpAddresses",
        "ec2:UnassignPrivateIpAddresses",
    }
    assert "ReachItsVpc" not in statements(graph_for("prod"))


def test_with_a_waf_the_allowlist_is_also_its_ip_set_and_everyone_else_is_blocked(internal):
    [ip_set] = internal.of_type("aws:wafv2/ipSet:IpSet")
    assert ip_set.inputs["addresses"] == ALLOWED and ip_set.inputs["ipAddressVersion"] == "IPV4"
    acl = internal.one("aws:wafv2/webAcl:WebAcl").inputs
    assert acl["defaultAction"] == {"block": {}}
    rate, allowed = sorted(acl["rules"], key=lambda rule: rule["priority"])
    assert rate["action"] == {"block": {}} and "rateBasedStatement" in rate["statement"]
    assert allowed["action"] == {"allow": {}}
    assert allowed["statement"] == {"ipSetReferenceStatement": {"arn": ip_set.outputs["arn"]}}


def test_without_an_allowlist_the_waf_lets_everyone_through_its_rate_limit():
    acl = graph_for("prod").one("aws:wafv2/webAcl:WebAcl").inputs
    assert acl["defaultAction"] == {"allow": {}} and len(acl["rules"]) == 1
    assert not graph_for("prod").of_type("aws:wafv2/ipSet:IpSet")


def test_an_open_internet_facing_balancer_admits_everyone_on_its_listener_ports_only():
    prod = graph_for("prod")
    assert prod.one(LB).inputs["internal"] is False
    assert _rules(prod, INGRESS, "alb") == {(ANYWHERE, "tcp", 443), (ANYWHERE, "tcp", 80)}


def test_an_internal_balancer_without_an_allowlist_admits_the_vpc_alone():
    edge = graph_for("prod").settings.edge
    internal = edge.model_copy(update={"scheme": "internal"})
    assert internal.client_cidrs("10.40.0.0/16") == ("10.40.0.0/16",)
    assert edge.client_cidrs("10.40.0.0/16") == (ANYWHERE,)
    allowlisted = internal.model_copy(update={"allow_cidrs": tuple(ALLOWED)})
    assert allowlisted.client_cidrs("10.40.0.0/16") == tuple(ALLOWED)


@pytest.mark.parametrize(
    ("cidrs", "fragment"),
    [
        (["10.0.0.1/8"], "edge.allow_cidrs[0] = '10.0.0.1/8'"),
        (["203.0.113.0/24", "not-a-range"], "edge.allow_cidrs[1] = 'not-a-range'"),
        (["0.0.0.0/0"], "admits everyone"),
        (["2001:db8::/32"], "IPv4 only"),
    ],
)
def test_a_bad_client_range_is_refused_naming_the_field_and_value(tmp_path_factory, cidrs, fragment):
    path = stack_with(tmp_path_factory, "prod", edge={"allow_cidrs": cidrs})
    with pytest.raises(StackError) as refused:
        load_stack("prod", path=path)
    assert fragment in str(refused.value) and str(path) in str(refused.value)


def test_an_unknown_scheme_is_refused_naming_the_choices(tmp_path_factory):
    path = stack_with(tmp_path_factory, "prod", edge={"scheme": "public"})
    with pytest.raises(StackError, match=r"edge\.scheme = 'public'.*'internet-facing' or 'internal'"):
        load_stack("prod", path=path)


# --- TLS from the load balancer to the hosts -----------------------------------------------------------


@pytest.mark.parametrize("stack", ["dev", "staging", "prod"])
def test_the_target_group_forwards_and_checks_over_https_on_the_hosts_tls_port(stack):
    graph = graph_for(stack)
    tg = graph.one(TG).inputs
    assert (tg["protocol"], int(tg["port"])) == ("HTTPS", TARGET_TLS_PORT)
    assert tg["healthCheck"]["protocol"] == "HTTPS" and tg["healthCheck"]["port"] == "traffic-port"
    assert tg["healthCheck"]["path"] == graph.settings.health.readiness_path


def test_the_balancer_reaches_the_hosts_only_on_their_tls_port():
    prod = graph_for("prod")
    runtime, alb = _group_id(prod, "runtime"), _group_id(prod, "alb")
    assert _rules(prod, EGRESS, "alb") == {(runtime, "tcp", TARGET_TLS_PORT)}
    from_alb = {rule for rule in _rules(prod, INGRESS, "runtime") if rule[0] == alb}
    assert from_alb == {(alb, "tcp", TARGET_TLS_PORT)}


def test_the_hosts_proxy_configuration_is_uploaded_beside_the_serving_groups_tools():
    prod = graph_for("prod")
    (pool,) = prod.settings.pools
    [uploaded] = [o for o in prod.of_type(OBJECT) if o.inputs["key"].endswith(TARGET_PROXY_FILE)]
    assert (
        uploaded.inputs["key"]
        == f"{prod.outputs['history_prefix']}host/{pool.group.name}/{TARGET_PROXY_FILE}"
    )
    assert uploaded.inputs["content"] == render_target_proxy(prod.settings, pool)
    assert uploaded.inputs["serverSideEncryption"] == "aws:kms"


def test_the_proxy_configuration_is_uploaded_before_a_host_can_boot():
    prod = graph_for("prod")
    [uploaded] = [o for o in prod.of_type(OBJECT) if o.inputs["key"].endswith(TARGET_PROXY_FILE)]
    [group] = prod.of_type(ASG)
    assert uploaded.urn in group.dependencies


def test_a_runtime_on_the_tls_port_is_refused_before_anything_is_created(tmp_path_factory):
    path = stack_with(tmp_path_factory, "prod", runtime={"port": TARGET_TLS_PORT})
    with pytest.raises(Exception, match=rf"runtime.port = {TARGET_TLS_PORT}: the hosts' TLS proxy"):
        run_with_prefix_list(path, "prod")


def _bootstrap(settings) -> str:
    """The bootstrap script cloud-init writes, as bash will read it."""
    user_data = yaml.safe_load(render_cloud_init(settings, settings.serving_group))
    [script] = [f for f in user_data["write_files"] if f["path"] == "/usr/local/sbin/frontier-bootstrap"]
    return script["content"]


def _certificate_commands(script: str) -> str:
    """The lines of the bootstrap that make the host's certificate, once."""
    match = re.search(r'if \[ ! -s "\$\{tls\}/target\.pem" \]; then\n(.*?)\n\s*fi\n', script, re.DOTALL)
    assert match, "the bootstrap makes no certificate"
    return match.group(1)


def test_cloud_init_starts_the_proxy_from_the_uploaded_file_with_the_certificate_it_makes():
    prod = load_stack("prod")
    script = _bootstrap(prod)
    assert f'"${{bin}}/{TARGET_PROXY_FILE}"' in script
    assert "tls=" + str(Path(TARGET_TLS_CERTIFICATE).parent) in script
    assert f"ssl crt {TARGET_TLS_CERTIFICATE} " in render_target_proxy(prod, prod.pools[0])
    assert "systemctl restart frontier-tls.service" in script


class _Runtime(http.server.BaseHTTPRequestHandler):
    """Stands where the runtime listens on the host: the proxy, not the runtime, is under test."""

    def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
        body = json.dumps({"path": self.path}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def runtime() -> Iterator[http.server.ThreadingHTTPServer]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Runtime)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def _status(url: str, context: ssl.SSLContext) -> int:
    try:
        with urllib.request.urlopen(url, context=context, timeout=5) as answer:
            return answer.status
    except urllib.error.HTTPError as refused:
        return refused.code


@pytest.mark.e2e
def test_the_hosts_haproxy_answers_https_with_the_certificate_made_at_boot(tmp_path, runtime):
    runtime_port = runtime.server_address[1]
    prod = load_stack("prod")
    tls = tmp_path / "tls"
    # cloud-init's own commands, with the directory moved under the test's.
    subprocess.run(
        ["bash", "-euo", "pipefail", "-c", f"tls={tls}\n{_certificate_commands(_bootstrap(prod))}"],
        check=True,
        timeout=60,
    )
    # The private key is root's alone, in a directory only root may enter.
    assert all((tls / name).stat().st_mode & 0o077 == 0 for name in ("", "target.key", "target.pem"))
    settings = prod.model_copy(update={"runtime": prod.runtime.model_copy(update={"port": runtime_port})})
    port = _free_port()
    config = tmp_path / TARGET_PROXY_FILE
    config.write_text(
        render_target_proxy(
            settings,
            settings.pools[0],
            certificate=str(tls / "target.pem"),
            address="127.0.0.1",
            port=port,
            stats_socket=str(tmp_path / "proxy.sock"),
        )
    )
    proxy = services.start_haproxy(config, tmp_path / "state", name="target-proxy")
    try:
        # As the ALB does: TLS, no certificate validation (the host's is self-signed).
        context = ssl.create_default_context()
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
        url = f"https://127.0.0.1:{port}/v1/models"
        with urllib.request.urlopen(url, context=context, timeout=10) as answer:
            assert answer.status == 200 and json.loads(answer.read())["path"] == "/v1/models"
        with (
            socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
            context.wrap_socket(raw) as wrapped,
        ):
            assert wrapped.version() in ("TLSv1.2", "TLSv1.3")
            presented = wrapped.getpeercert(binary_form=True)
        made = ssl.PEM_cert_to_DER_cert((tls / "target.crt").read_text())
        assert presented == made
        # Plain HTTP on the TLS port gets no answer at all.
        with pytest.raises((urllib.error.URLError, ConnectionError)):
            urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=5)
        # A runtime that stops answering turns the target group's HTTPS health check into a 503
        # within a check interval or two of the proxy's own check: the ALB then takes the host out.
        readiness = f"https://127.0.0.1:{port}{settings.health.readiness_path}"
        assert _status(readiness, context) == 200
        runtime.shutdown()
        runtime.server_close()
        deadline = time.monotonic() + 10
        while _status(readiness, context) != 503 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _status(readiness, context) == 503
    finally:
        services.stop(proxy)


# --- where runtime hosts may send -------------------------------------------------------------------


def test_runtime_hosts_send_https_only_to_the_vpc_and_s3s_prefix_list(internal):
    [s3] = [e for e in internal.of_type(ENDPOINT) if e.inputs["vpcEndpointType"] == "Gateway"]
    assert s3.outputs["prefixListId"] == S3_PREFIX_LIST
    assert _rules(internal, EGRESS, "runtime") == {
        (internal.settings.network.vpc_cidr, "tcp", 443),
        (S3_PREFIX_LIST, "tcp", 443),
    }


def test_every_aws_api_a_host_calls_has_an_endpoint_in_the_vpc():
    prod = graph_for("prod")
    region = prod.settings.region
    services_reached = {
        e.inputs["serviceName"].removeprefix(f"com.amazonaws.{region}.") for e in prod.of_type(ENDPOINT)
    }
    # ECR (image pulls), Secrets Manager (API keys), CloudWatch Logs and metrics (the agent and the
    # bootstrap's publisher), STS (credentials), Auto Scaling (the launch hook), S3 (everything else).
    assert {
        "ecr.api",
        "ecr.dkr",
        "secretsmanager",
        "logs",
        "monitoring",
        "sts",
        "autoscaling",
        "s3",
    } <= services_reached
    assert set(INTERFACE_ENDPOINTS) <= services_reached


def test_a_stack_that_installs_packages_at_boot_may_open_web_egress(tmp_path_factory):
    path = stack_with(tmp_path_factory, "dev", network={"egress": "internet"})
    dev = run_with_prefix_list(path, "dev")
    assert _rules(dev, EGRESS, "runtime") == {(ANYWHERE, "tcp", 443), (ANYWHERE, "tcp", 80)}


# --- an internal balancer on EKS ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def eks() -> Graph:
    """eks-prod's program under the mocks of the Kubernetes stacks (k8s_mocks)."""
    from k8s_mocks import run_kubernetes

    _ensure_event_loop()  # an asyncio.run earlier in the session leaves the thread without one
    return run_kubernetes(load_stack("eks-prod"))


def _subnets_tagged(graph: Graph, key: str) -> set[str]:
    return {
        t.inputs["resourceId"]
        for t in graph.of_type("aws:ec2/tag:Tag")
        if t.inputs["key"] == key and t.inputs["value"] == "1"
    }


def _tier(graph: Graph, tier: str) -> set[str]:
    return {s.id for s in graph.of_type(SUBNET) if s.inputs["tags"].get("frontier:tier") == tier}


def test_an_internal_alb_goes_to_the_subnets_that_hold_no_pod(eks):
    # The runtime's NetworkPolicy admits the ALB from the public subnets' range alone.
    assert _subnets_tagged(eks, INTERNAL_ALB_SUBNET_TAG) == _tier(eks, "public")
    assert not _subnets_tagged(eks, INTERNAL_ALB_SUBNET_TAG) & _tier(eks, "private")
    assert len(_tier(eks, "public")) == eks.settings.network.availability_zones


def test_an_internal_alb_sits_where_the_runtimes_network_policy_admits_it(eks):
    admitted = ipaddress.ip_network(ingress_source_cidrs(eks.settings)[0])
    for subnet in eks.of_type(SUBNET):
        if subnet.id in _subnets_tagged(eks, INTERNAL_ALB_SUBNET_TAG):
            assert ipaddress.ip_network(subnet.inputs["cidrBlock"]).subnet_of(admitted)


def test_an_internet_facing_alb_goes_to_the_public_subnets_alone(eks):
    assert _subnets_tagged(eks, ALB_SUBNET_TAG) == _tier(eks, "public")


def test_pulumi_up_as_the_language_host_runs_it_puts_an_internal_balancers_probe_in_the_vpc(tmp_path):
    # A fresh interpreter, cwd infra/, runpy.run_path("."), the variant's config in PULUMI_CONFIG.
    from test_language_host import declared

    document = yaml.safe_load((project.root() / "stacks" / "Pulumi.prod.yaml").read_text())
    document["config"]["frontier:edge"].update({"scheme": "internal", "allow_cidrs": ALLOWED})
    resources = {tuple(r) for r in declared("prod", document, tmp_path)["resources"]}
    assert (SG, "prod-sg-probe") in resources
    assert (EGRESS, "prod-sg-probe-https") in resources
    assert (INGRESS, "prod-sg-alb-443-from-probe") in resources
