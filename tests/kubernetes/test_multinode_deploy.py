"""``fab deploy`` and ``fab rollback`` on a pool whose replica spans nodes: its LeaderWorkerSet's two
pod templates are patched, the groups rolled, the leaders gated, and a failure puts both back.

Real and mocked as in ``test_backend``: the ``kubernetes`` client over a real socket, the deploy
path and its history on moto's S3; the API server and the LWS controller are ``fake_apiserver``
(mocked: no cluster runs here), time a virtual clock.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from fake_apiserver import WORKER_INDEX, FakeApiServer, FakeCluster
from frontier_hostside import names
from moto import mock_aws
from test_backend import ERRORS, GOOD_A, GOOD_B, STUCK, VirtualClock, behaviour, on_fake_cluster, unverified

from frontier.config.schema import Settings
from frontier.release.artifact import Artifact
from frontier.release.history import HistoryStore
from frontier.render.host import render_runtime_config
from frontier.rollout.deploy import deploy, rollback
from frontier.rollout.rolling import RolloutFailed
from frontier.targets import backend_for, load_stack
from frontier.targets.kubernetes import leader_workers as lw
from frontier.targets.kubernetes import manifests as m
from frontier.targets.kubernetes.backend import KubernetesBackend
from frontier.targets.kubernetes.deploy_access import deploy_rules
from frontier.targets.kubernetes.group_rollout import LeaderWorkerSetRollout

BUCKET = "frontier-eks-multinode-history"
PREFIX = "history/eks-multinode/"
GROUPS = 2


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return unverified(on_fake_cluster(load_stack("eks-multinode"), tmp_path))


@pytest.fixture
def cluster(settings: Settings) -> Iterator[FakeApiServer]:
    fake = FakeCluster(namespace=settings.kubernetes.namespace, behaviour=behaviour, rules=deploy_rules(settings))
    with FakeApiServer(fake) as server:
        Path(settings.kubernetes.cluster.kubeconfig).write_text(server.kubeconfig("fake"))
        # What `pulumi up` left: the LeaderWorkerSet on the stack's first image, scaled by KEDA to 2.
        pool = settings.only_pool
        pod = m.pod_template(settings, pool, GOOD_A, render_runtime_config(settings, pool), track="stable")
        fake.put_group(lw.leader_worker_set(settings, pool, pod, replicas=GROUPS).to_dict())
        fake.requests.clear()
        yield server


@pytest.fixture
def s3(settings, saved_outputs) -> Iterator[HistoryStore]:
    saved_outputs.kubernetes(settings, history_bucket=BUCKET, history_prefix=PREFIX)
    with mock_aws():
        client = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket=BUCKET)
        store = HistoryStore(client, BUCKET, "eks-multinode", PREFIX)
        for digest in (GOOD_A, GOOD_B, ERRORS, STUCK):
            store.put_artifact(Artifact(digest=digest, kind="image", image=f"repo@{digest}"), None)
        yield store


@pytest.fixture
def backend(settings, cluster, s3) -> KubernetesBackend:
    return KubernetesBackend(settings, settings.only_pool, clock=VirtualClock())


def _group(cluster: FakeApiServer, settings: Settings) -> dict[str, Any]:
    return cluster.cluster.groups[lw.set_name(settings.only_pool)]


def _images(group: dict[str, Any]) -> set[str]:
    spec = group["spec"]["leaderWorkerTemplate"]
    return {
        spec[t]["spec"]["containers"][0]["image"].rpartition("@")[2]
        for t in ("leaderTemplate", "workerTemplate")
    }


def _writes(cluster: FakeApiServer) -> list[tuple[str, str]]:
    return [(method, path.rsplit("/", 1)[-1]) for method, path in cluster.cluster.requests if method != "GET"]


def test_the_backend_of_a_pool_spanning_nodes_rolls_its_leader_worker_set(settings, cluster, s3):
    assert isinstance(backend_for(settings).rollout(), LeaderWorkerSetRollout)


def test_deploy_patches_both_templates_and_gates_the_new_leaders_only(backend, cluster, settings, s3):
    events: list = []
    result = deploy(backend, GOOD_B, reporter=events.append)
    assert result.outcome == "succeeded"
    group = _group(cluster, settings)
    assert _images(group) == {GOOD_B}
    leader = group["spec"]["leaderWorkerTemplate"]["leaderTemplate"]
    assert leader["metadata"]["annotations"][names.K8S_RELEASE_ANNOTATION] == result.release
    # One JSON patch of the LeaderWorkerSet after the release's ConfigMap; no canary.
    assert _writes(cluster) == [("POST", "configmaps"), ("PATCH", lw.set_name(settings.only_pool))]
    leaders = sorted(
        p for p, v in cluster.cluster.pods.items() if v["metadata"]["labels"][WORKER_INDEX] == "0"
    )
    assert len(leaders) == GROUPS and sorted(cluster.cluster.scrapes) == leaders
    (gate,) = [e for e in events if e.phase == "gate" and e.status == "ok"]
    assert gate.host == f"leaderworkerset/{lw.set_name(settings.only_pool)}"
    (record,) = s3.records()
    assert [(h["name"], h["outcome"]) for h in record["hosts"]] == [
        (f"leaderworkerset/{lw.set_name(settings.only_pool)}", "updated")
    ]


def test_a_gate_failure_puts_both_previous_templates_back(backend, cluster, settings, s3):
    before = json.dumps(_group(cluster, settings)["spec"]["leaderWorkerTemplate"], sort_keys=True)
    with pytest.raises(RolloutFailed) as err:
        deploy(backend, ERRORS)
    result = err.value.result
    assert result.outcome == "rolled_back" and "gate on pod" in result.reason
    assert json.dumps(_group(cluster, settings)["spec"]["leaderWorkerTemplate"], sort_keys=True) == before
    assert [w for w in _writes(cluster) if w[0] == "PATCH"] == [("PATCH", lw.set_name(settings.only_pool))] * 2
    assert result.hosts[0].outcome == "restored"


def test_groups_that_never_get_ready_are_rolled_back_at_the_progress_deadline(backend, cluster, settings, s3):
    with pytest.raises(RolloutFailed) as err:
        deploy(backend, STUCK)
    result = err.value.result
    assert result.outcome == "rolled_back"
    assert "groups updated" in result.reason and "kubernetes.progress_deadline_s" in result.reason
    assert _images(_group(cluster, settings)) == {GOOD_A}
    assert backend.clock.t >= settings.kubernetes.progress_deadline_s


def test_deploying_the_release_that_runs_changes_nothing(backend, cluster, settings, s3):
    deploy(backend, GOOD_B)
    cluster.cluster.requests.clear()
    result = deploy(backend, GOOD_B)
    assert [h.outcome for h in result.hosts] == ["skipped"]
    assert _writes(cluster) == []


def test_rollback_returns_both_templates_to_the_previous_good_release(backend, cluster, settings, s3):
    first = deploy(backend, GOOD_A)
    deploy(backend, GOOD_B)
    assert _images(_group(cluster, settings)) == {GOOD_B}
    back = rollback(backend)
    assert back.outcome == "succeeded" and back.release == first.release
    assert _images(_group(cluster, settings)) == {GOOD_A}
    assert [r["kind"] for r in s3.records()] == ["deploy", "deploy", "rollback"]


def test_a_missing_leader_worker_set_says_to_provision_first(backend, cluster, settings, s3):
    cluster.cluster.groups.clear()
    with pytest.raises(RolloutFailed, match="leaderworkerset .* does not exist: provision the stack first"):
        deploy(backend, GOOD_B)
