"""On Kubernetes the gateway finds a pool's pods by its Service's EndpointSlices and treats each
ready pod as a replica (``KubernetesDiscovery``), with the Role the stack gives it.

Real: the gateway (its discovery loop, prober and proxy) serving on a socket; an API server over
TCP authorizing as RBAC does with the gateway's own rules (``tests/kubernetes/fake_apiserver.py``:
its EndpointSlices list the ready pods a Service selects, as the EndpointSlice controller does);
each pod a real HTTP server answering like a runtime on its own loopback address at one port, as
pods share a container port on their own IPs. Mocked: the API server's controllers; and, in the
parsing tests at the end, the API server's answer itself (an httpx transport), to show conditions
the fake's controller never writes (an endpoint not ready, or of unknown readiness)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from frontier_gateway.config import GatewayConfig, KubernetesDiscovery
from frontier_gateway.discovery import EndpointSliceFinder
from frontier_hostside import names

from frontier.targets.kubernetes.gateway import discovery_rules
from tests.gateway.harness import StandIn, free_port, gateway_config, running_gateway, tenant
from tests.kubernetes.fake_apiserver import FakeApiServer, FakeCluster

KEY = "sk-acme-0123456789"
AUTH = {"Authorization": f"Bearer {KEY}"}
MODEL = "tiny"
NAMESPACE = "frontier-prod"
SERVICE = "frontier-tiny"
SELECTOR = {"app.kubernetes.io/name": SERVICE}
ADDRESSES = ("127.0.0.2", "127.0.0.3", "127.0.0.4")


def _pod(cluster: FakeCluster, name: str, address: str, ready: bool = True) -> None:
    with cluster.lock:
        cluster.pods[name] = {
            "owner": SERVICE,
            "image": "runtime",
            "metadata": {"name": name, "namespace": NAMESPACE, "labels": dict(SELECTOR), "annotations": {}},
            "spec": {"nodeName": "ip-10-50-0-10.ec2.internal"},
            "status": {
                "phase": "Running",
                "podIP": address,
                "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
            },
        }


def _set_ready(cluster: FakeCluster, name: str, ready: bool) -> None:
    with cluster.lock:
        cluster.pods[name]["status"]["conditions"][0]["status"] = "True" if ready else "False"


@pytest.fixture
def pods() -> Iterator[list[StandIn]]:
    """Three pods' runtimes: one container port, each on its own address."""
    port = free_port()
    made = [StandIn(f"pod-{i}", host=address, port=port) for i, address in enumerate(ADDRESSES)]
    yield made
    for pod in made:
        pod.close()


@pytest.fixture
def cluster(pods: list[StandIn]) -> Iterator[tuple[FakeCluster, FakeApiServer]]:
    """The pool's Service selecting two ready pods (the third not yet started), under the gateway's Role."""
    cluster = FakeCluster(NAMESPACE, rules=discovery_rules(), services={SERVICE: SELECTOR})
    _pod(cluster, "tiny-0", ADDRESSES[0])
    _pod(cluster, "tiny-1", ADDRESSES[1])
    with FakeApiServer(cluster) as api:
        yield cluster, api


def _config(api_url: str, port: int, tmp_path: Path) -> GatewayConfig:
    token = tmp_path / "token"
    token.write_text("projected-token\n")
    # Affinity off: requests rotate over the ready replicas, so each pod's share shows.
    config = gateway_config(
        {MODEL: ["http://unused:1"]}, [tenant("acme", KEY, [MODEL])], tmp_path / "m.jsonl", affinity={"mode": "off"}
    )
    found = {"namespace": NAMESPACE, "service": SERVICE, "port": port, "interval_s": 0.2, "api_url": api_url}
    found["token_file"] = str(token)
    models = [{"name": MODEL, "discovery": found, "api_keys_secret": ""}]
    return GatewayConfig.model_validate({**config.model_dump(), "models": models})


def _served_by(gw_url: str, n: int) -> list[str]:
    body = {"model": MODEL, "prompt": "hello", "max_tokens": 2}
    with httpx.Client(timeout=10) as client:
        answers = [client.post(f"{gw_url}{names.COMPLETIONS_PATH}", json=body, headers=AUTH) for _ in range(n)]
    assert [a.status_code for a in answers] == [200] * n
    return [a.json()["served_by"] for a in answers]


def _until(predicate, timeout_s: float = 10) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def _replicas(gw) -> list[str]:  # noqa: ANN001
    return sorted(r.url for r in gw.gateway.pools.get(MODEL).replicas)


def test_each_ready_pod_the_services_endpoint_slices_list_is_a_replica(pods, cluster, tmp_path):
    fake, api = cluster
    port = pods[0].server_address[1]
    with running_gateway(_config(api.url, port, tmp_path)) as gw:
        assert _replicas(gw) == [f"http://{a}:{port}" for a in ADDRESSES[:2]]
        assert set(_served_by(gw.url, 8)) == {"pod-0", "pod-1"}  # spread over the pods themselves


def test_a_pod_that_starts_joins_and_one_that_stops_being_ready_leaves_with_no_failed_request(
    pods, cluster, tmp_path
):
    fake, api = cluster
    port = pods[0].server_address[1]
    failures: list[int] = []
    stop = threading.Event()

    def load(url: str) -> None:
        body = {"model": MODEL, "prompt": "hello", "max_tokens": 2}
        with httpx.Client(timeout=10) as client:
            while not stop.is_set():
                answer = client.post(f"{url}{names.COMPLETIONS_PATH}", json=body, headers=AUTH)
                if answer.status_code != 200:
                    failures.append(answer.status_code)

    with running_gateway(_config(api.url, port, tmp_path)) as gw:
        worker = threading.Thread(target=load, args=(gw.url,), daemon=True)
        worker.start()
        _pod(fake, "tiny-2", ADDRESSES[2])  # scaled out: its endpoint appears once ready
        _until(lambda: f"http://{ADDRESSES[2]}:{port}" in _replicas(gw))
        _until(lambda: len(pods[2].requests) > 0)
        # The pod's readiness fails (its preStop drain): the controller marks it not ready. It keeps
        # serving what it holds, as a draining runtime does, and gets nothing new once discovery saw it.
        _set_ready(fake, "tiny-0", False)
        _until(lambda: f"http://{ADDRESSES[0]}:{port}" not in _replicas(gw))
        seen = len(pods[0].requests)
        time.sleep(0.5)
        stop.set()
        worker.join(15)
    assert failures == []
    assert len(pods[0].requests) == seen


def test_the_gateway_asks_the_api_server_only_what_its_role_grants(pods, cluster, tmp_path):
    fake, api = cluster
    with running_gateway(_config(api.url, pods[0].server_address[1], tmp_path)):
        time.sleep(0.5)  # a few rounds
    asked = {(verb, group, resource, allowed) for verb, group, resource, allowed in fake.authorized}
    assert asked == {("list", "discovery.k8s.io", "endpointslices", True)}


def test_with_the_api_server_gone_the_gateway_keeps_the_pods_it_knew(pods, cluster, tmp_path):
    fake, api = cluster
    port = pods[0].server_address[1]
    with running_gateway(_config(api.url, port, tmp_path)) as gw:
        api.httpd.shutdown()
        api.httpd.server_close()
        time.sleep(0.6)  # rounds that fail
        assert _replicas(gw) == [f"http://{a}:{port}" for a in ADDRESSES[:2]]
        assert set(_served_by(gw.url, 4)) == {"pod-0", "pod-1"}


# -- what an EndpointSlice says, read as the API documents it --------------------------------------


def _finder(slices: list[dict], token: Path, seen: list[httpx.Request]) -> EndpointSliceFinder:
    finder = EndpointSliceFinder(
        KubernetesDiscovery(namespace=NAMESPACE, service=SERVICE, port=8000, api_url="https://api", token_file=str(token))
    )

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"kind": "EndpointSliceList", "items": slices})

    finder.client = httpx.Client(transport=httpx.MockTransport(answer))
    return finder


def test_an_endpoint_not_ready_is_left_out_and_one_of_unknown_readiness_is_taken(tmp_path):
    token = tmp_path / "token"
    token.write_text("first")
    endpoints = [
        {"addresses": ["10.0.0.1"], "conditions": {"ready": True}},
        {"addresses": ["10.0.0.2"], "conditions": {"ready": False, "serving": True, "terminating": True}},
        {"addresses": ["10.0.0.3"], "conditions": {}},  # nil: "interpret as ready", as the API says
        {"addresses": ["fd00::4"], "conditions": {"ready": True}},
    ]
    seen: list[httpx.Request] = []
    finder = _finder([{"addressType": "IPv4", "endpoints": endpoints}], token, seen)
    assert finder.find() == ["http://10.0.0.1:8000", "http://10.0.0.3:8000", "http://[fd00::4]:8000"]
    assert seen[0].url.params["labelSelector"] == f"kubernetes.io/service-name={SERVICE}"
    assert seen[0].url.path == f"/apis/discovery.k8s.io/v1/namespaces/{NAMESPACE}/endpointslices"


def test_the_token_is_read_at_every_round_so_a_renewed_one_is_used(tmp_path):
    token = tmp_path / "token"
    token.write_text("first\n")
    seen: list[httpx.Request] = []
    finder = _finder([], token, seen)
    finder.find()
    token.write_text("renewed\n")  # the kubelet renews a projected token on disk
    finder.find()
    assert [r.headers["Authorization"] for r in seen] == ["Bearer first", "Bearer renewed"]
