"""``fab deploy --model`` on a kubernetes stack of two model pools behind the gateway: one pool rolls
(canary, gate, roll, or back), the other keeps its Deployment and pods as they were.

Real and mocked as in ``test_backend``: the ``kubernetes`` client over a real socket, the deploy
path and its history on moto's S3; the API server and its Deployment controller are
``fake_apiserver`` (mocked: no cluster runs here), time a virtual clock.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest
from fake_apiserver import FakeApiServer, FakeCluster
from moto import mock_aws
from test_backend import ERRORS, GOOD_A, GOOD_B, REPLICAS, VirtualClock, behaviour, on_fake_cluster

from frontier.config.schema import Settings
from frontier.release.artifact import Artifact
from frontier.release.history import HistoryStore, stack_history
from frontier.render.host import render_runtime_config
from frontier.rollout.deploy import deploy
from frontier.rollout.rolling import RolloutFailed
from frontier.targets import backend_for
from frontier.targets.kubernetes import disaggregation as pd
from frontier.targets.kubernetes import manifests as m
from frontier.targets.kubernetes.backend import KubernetesBackend
from frontier.targets.kubernetes.deploy_access import deploy_rules

BUCKET = "frontier-eks-gateway-history"
PREFIX = "history/eks-gateway/"
BIG, SMALL = "llama-3.1-70b-instruct", "llama-3.1-8b-instruct"


@pytest.fixture
def settings(eks_gateway: Settings, tmp_path: Path) -> Settings:
    return on_fake_cluster(eks_gateway, tmp_path)


@pytest.fixture
def cluster(settings: Settings) -> Iterator[FakeApiServer]:
    fake = FakeCluster(
        namespace=settings.kubernetes.namespace, behaviour=behaviour, rules=deploy_rules(settings)
    )
    with FakeApiServer(fake) as server:
        Path(settings.kubernetes.cluster.kubeconfig).write_text(server.kubeconfig("fake"))
        # What `pulumi up` left: each pool's Deployment (the 8B pool's two, one per half) on the
        # stack's first image.
        for pool in settings.pools:
            for half in pd.role_pools(pool):
                config = render_runtime_config(settings, pd.released_runtime(pool))
                fake.put_deployment(m.deployment(settings, half, GOOD_A, config, replicas=REPLICAS).to_dict())
        fake.requests.clear()
        yield server


@pytest.fixture
def s3(settings, saved_outputs) -> Iterator[object]:
    saved_outputs.kubernetes(settings, history_bucket=BUCKET, history_prefix=PREFIX)
    with mock_aws():
        client = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket=BUCKET)
        store = HistoryStore(client, BUCKET, "eks-gateway", PREFIX)
        for digest in (GOOD_A, GOOD_B, ERRORS):
            store.put_artifact(Artifact(digest=digest, kind="image", image=f"repo@{digest}"), None)
        yield client


def _pool(settings: Settings, model: str, clock: VirtualClock) -> KubernetesBackend:
    """What ``fab deploy --model <model>`` holds: the backend of that pool's view of the stack."""
    backend = backend_for(settings.for_pool(model))
    assert isinstance(backend, KubernetesBackend)
    backend.clock = clock
    return backend


def _deployments(settings: Settings, model: str) -> list[str]:
    """A pool's Deployments: its own, or a disaggregated pool's prefill and decode."""
    return [m.app_name(half) for half in pd.role_pools(settings.pool(model))]


def _snapshot(cluster: FakeApiServer, settings: Settings, model: str) -> tuple[str, list[str]]:
    """A pool's Deployments (as JSON) and their ready pods."""
    names = _deployments(settings, model)
    deployments = json.dumps([cluster.cluster.deployments[name] for name in names], sort_keys=True)
    pods = sorted(
        pod
        for pod, v in cluster.cluster.pods.items()
        if v["owner"] in names and v["status"]["conditions"][0]["status"] == "True"
    )
    return deployments, pods


def _touched(cluster: FakeApiServer) -> set[str]:
    return {path.rsplit("/", 1)[-1] for method, path in cluster.cluster.requests if method != "GET"}


def test_rolling_one_pool_leaves_the_other_pools_deployment_untouched_and_serving(settings, cluster, s3):
    before = _snapshot(cluster, settings, BIG)
    result = deploy(_pool(settings, SMALL, VirtualClock()), GOOD_B)
    assert result.outcome == "succeeded"
    for name in _deployments(settings, SMALL):
        small = cluster.cluster.deployments[name]
        assert small["spec"]["template"]["spec"]["containers"][0]["image"].endswith("@" + GOOD_B)
    assert _snapshot(cluster, settings, BIG) == before
    assert len(before[1]) == REPLICAS  # still serving: every pod of the other pool ready throughout
    big_name = m.app_name(settings.for_pool(BIG))
    assert not [name for name in _touched(cluster) if name.startswith(big_name)]


def test_each_pool_rolls_through_its_own_canary_and_gates_only_its_own_pods(settings, cluster, s3):
    events: list = []
    deploy(_pool(settings, SMALL, VirtualClock()), GOOD_B, reporter=events.append)
    assert [e.host for e in events if e.phase == "gate" and e.status == "ok"] == [
        f"deployment/{name}{track}" for name in _deployments(settings, SMALL) for track in ("-canary", "")
    ]
    big = m.app_name(settings.for_pool(BIG))
    assert not [pod for pod in cluster.cluster.scrapes if pod.startswith(big)]


def test_a_failed_pool_rollout_rolls_back_that_pool_and_leaves_the_other_alone(settings, cluster, s3):
    big_before, small_before = _snapshot(cluster, settings, BIG), _snapshot(cluster, settings, SMALL)
    with pytest.raises(RolloutFailed) as err:
        deploy(_pool(settings, SMALL, VirtualClock()), ERRORS)
    assert err.value.result.outcome == "rolled_back"
    assert _snapshot(cluster, settings, BIG) == big_before
    for name, before in zip(_deployments(settings, SMALL), json.loads(small_before[0]), strict=True):
        assert cluster.cluster.deployments[name]["spec"]["template"] == before["spec"]["template"]


def test_each_pool_keeps_its_own_history(settings, cluster, s3):
    deploy(_pool(settings, SMALL, VirtualClock()), GOOD_B)
    deploy(_pool(settings, BIG, VirtualClock()), GOOD_B)
    for model in (BIG, SMALL):
        view = settings.for_pool(model)
        (record,) = stack_history(view, view.only_pool.name, s3, BUCKET, PREFIX).records()
        assert record["digest"] == GOOD_B
        assert [h["name"] for h in record["hosts"]][-1] == f"deployment/{_deployments(settings, model)[-1]}"


def test_each_pools_backend_lists_only_its_own_pods(settings, cluster, s3):
    for model in (BIG, SMALL):
        backend = _pool(settings, model, VirtualClock())
        pods = backend.hosts()
        names = _deployments(settings, model)
        assert len(pods) == REPLICAS * len(names)
        assert all(any(p.name.startswith(name + "-") for name in names) for p in pods)
        assert {p.group for p in backend.hosts(None)} == {g.name for g in settings.pool(model).groups}
