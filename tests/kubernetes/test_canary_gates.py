"""A Kubernetes canary held to the release it replaces, as on the host targets: its answers
(``rollout.verify_canary``: the stack's verification set over port-forward streams, its golden
cases held to the old release's outputs) and its p99 (``rollout.gate.max_p99_ratio``: against a pod
still on the old release over the same window). A canary that fails either is removed and the
Deployment never changes. A pool whose replica spans nodes has no canary: there the ratio is
refused at load, and the verification runs on an old leader before the roll and the new ones after.

Real: the ``kubernetes`` client (its WebSocket port-forward included) over TCP, the deploy path,
the history on moto's S3 and Secrets Manager (in process). Mocked (see fake_apiserver.py and
tests/openai_standin.py): the API server, its controllers and the pods, whose API answers come from
stand-ins on real sockets; time, by a virtual clock.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest
import yaml
from fake_apiserver import FakeApiServer, FakeCluster
from moto import mock_aws
from test_backend import BUCKET, GOOD_A, GOOD_B, REPLICAS, VirtualClock, behaviour, on_fake_cluster

from frontier import project
from frontier.config.schema import Settings
from frontier.errors import StackError
from frontier.release.artifact import Artifact
from frontier.release.history import HistoryStore
from frontier.render.host import render_runtime_config
from frontier.rollout.deploy import deploy
from frontier.rollout.rolling import RolloutFailed
from frontier.targets import load_stack
from frontier.targets.kubernetes import leader_workers as lw
from frontier.targets.kubernetes import manifests as m
from frontier.targets.kubernetes.backend import KubernetesBackend
from frontier.targets.kubernetes.deploy_access import deploy_rules
from tests.openai_standin import API_KEY, openai_standin

SLOW = "sha256:" + "c" * 64
WRONG = "sha256:" + "d" * 64
PREFIX = "history/eks-prod/"
POD_SET = """
cases:
  - {name: answered, kind: normal, request: {messages: [{role: user, content: hi}], max_tokens: 4}, expect: {status: 200}}
  - {name: greedy, kind: golden, route: completions, request: {prompt: once, max_tokens: 4}}
"""


def behaviours(image: str) -> str:
    return "slow" if image.endswith("@" + SLOW) else behaviour(image)


@pytest.fixture
def answers() -> Iterator[dict[str, tuple[str, int]]]:
    """Two runtimes' answers: release A's, and one that says something else."""
    with openai_standin("the sea is wide") as right, openai_standin("the sea is narrow") as wrong:
        yield {"right": right, "wrong": wrong}


@pytest.fixture
def settings(eks_prod: Settings, tmp_path: Path) -> Settings:
    verify_set = tmp_path / "pod-set.yaml"
    verify_set.write_text(POD_SET)
    stack = on_fake_cluster(eks_prod, tmp_path)
    assert stack.rollout.verify_canary and stack.rollout.gate.max_p99_ratio == 2  # as the stack file says
    return stack.model_copy(update={"verify": stack.verify.model_copy(update={"file": str(verify_set)})})


@pytest.fixture
def endpoints_at_forward() -> list[tuple[str, list[str]]]:
    """For each port-forward opened: the image it reached and the pool Service's ready endpoints then."""
    return []


@pytest.fixture
def cluster(settings: Settings, answers, endpoints_at_forward) -> Iterator[FakeCluster]:
    port = settings.runtime.port
    service = m.app_name(settings.only_pool)

    def forwards(image: str, to: int) -> tuple[str, int] | None:
        ready = [e["targetRef"]["name"] for e in fake.ready_endpoints(service)]
        endpoints_at_forward.append((image, ready))
        if to != port:
            return None
        return answers["wrong"] if image.endswith("@" + WRONG) else answers["right"]

    fake = FakeCluster(
        namespace=settings.kubernetes.namespace,
        behaviour=behaviours,
        forwards=forwards,
        rules=deploy_rules(settings),
        services={service: m.selector(settings.only_pool)},
    )
    with FakeApiServer(fake) as server:
        Path(settings.kubernetes.cluster.kubeconfig).write_text(server.kubeconfig("fake"))
        pool = settings.only_pool
        first = m.deployment(settings, pool, GOOD_A, render_runtime_config(settings, pool), replicas=REPLICAS)
        fake.put_deployment(first.to_dict())
        yield fake


@pytest.fixture
def store(settings: Settings, saved_outputs) -> Iterator[HistoryStore]:
    saved_outputs.kubernetes(settings, history_bucket=BUCKET, history_prefix=PREFIX)
    with mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket=BUCKET)
        boto3.client("secretsmanager", region_name="us-east-1").create_secret(
            Name=settings.runtime.api_keys_secret, SecretString=json.dumps({"keys": [API_KEY]})
        )
        history = HistoryStore(s3, BUCKET, "eks-prod", PREFIX)
        for digest in (GOOD_A, GOOD_B, SLOW, WRONG):
            history.put_artifact(Artifact(digest=digest, kind="image", image=f"repo@{digest}"), None)
        yield history


@pytest.fixture
def backend(settings, cluster, store) -> KubernetesBackend:
    return KubernetesBackend(settings, settings.only_pool, clock=VirtualClock())


def stable_image(cluster: FakeCluster, settings: Settings) -> str:
    return cluster.deployments[m.app_name(settings)]["spec"]["template"]["spec"]["containers"][0]["image"]


def test_a_canary_that_answers_like_the_release_it_replaces_passes_its_verification_and_rolls(
    backend, cluster, settings, store
):
    # Release A over the provisioned image (no release, so nothing to record from: golden not recorded).
    release_a = deploy(backend, GOOD_A).release
    events = []
    result = deploy(backend, GOOD_B, reporter=events.append)
    assert result.outcome == "succeeded"
    assert stable_image(cluster, settings).endswith("@" + GOOD_B)
    # Nothing was recorded yet: release A's outputs were, from a pod still on it, beside release A.
    assert any(e.detail == f"golden outputs recorded from {release_a}" for e in events)
    assert store.s3.get_object(Bucket=BUCKET, Key=f"{PREFIX}releases/{release_a}/verify/pod-set.golden.json")
    (verified,) = [e for e in events if e.phase == "verify" and e.status == "ok"]
    assert verified.detail.endswith("2/2 cases passed (100.0%)")


def test_a_canary_that_answers_wrongly_is_removed_and_the_deployment_never_changes(
    backend, cluster, settings, store
):
    deploy(backend, GOOD_A)
    with pytest.raises(RolloutFailed) as failed:
        deploy(backend, WRONG)
    result = failed.value.result
    assert result.outcome == "rolled_back"
    assert "verify on pod" in result.reason and "failed cases: greedy (golden: " in result.reason
    assert stable_image(cluster, settings).endswith("@" + GOOD_A)
    assert m.canary_name(settings) not in cluster.deployments
    record = store.records()[-1]
    assert record["outcome"] == "rolled_back" and "verify on pod" in record["reason"]


def canary_pods_forwarded(endpoints_at_forward, digest: str) -> list[list[str]]:
    """The Service's ready endpoints at each port-forward to a pod of ``digest``."""
    return [ready for image, ready in endpoints_at_forward if image.endswith("@" + digest)]


def test_a_verified_canary_takes_no_request_until_its_verification_passes_then_joins_the_service(
    backend, cluster, settings, endpoints_at_forward
):
    deploy(backend, GOOD_A)
    cluster.requests.clear()
    assert deploy(backend, GOOD_B).outcome == "succeeded"
    canary = m.canary_name(settings)
    forwarded = canary_pods_forwarded(endpoints_at_forward, GOOD_B)
    assert forwarded and all(not any(pod.startswith(canary) for pod in ready) for ready in forwarded)
    admitted = [
        i
        for i, (method, path) in enumerate(cluster.requests)
        if method == "PATCH" and path.endswith("/status")
    ]
    tunnels = [i for i, (_, path) in enumerate(cluster.requests) if path.endswith("/portforward")]
    assert len(admitted) == settings.rollout.canary_hosts and max(tunnels) < min(admitted)
    # Once admitted, the canary's pods were the Service's: the timeline counts them among its endpoints.
    service = f"service/{m.app_name(settings)}"
    assert (
        max(moment.get(service, 0) for moment in cluster.timeline) == REPLICAS + settings.rollout.canary_hosts
    )


def test_a_canary_that_fails_its_verification_never_joins_the_service(
    backend, cluster, settings, endpoints_at_forward
):
    deploy(backend, GOOD_A)
    cluster.requests.clear()
    cluster.timeline.clear()
    with pytest.raises(RolloutFailed):
        deploy(backend, WRONG)
    forwarded = canary_pods_forwarded(endpoints_at_forward, WRONG)
    canary = m.canary_name(settings)
    assert forwarded and all(not any(pod.startswith(canary) for pod in ready) for ready in forwarded)
    assert not [path for method, path in cluster.requests if method == "PATCH" and path.endswith("/status")]
    service = f"service/{m.app_name(settings)}"
    assert max(moment.get(service, 0) for moment in cluster.timeline) == REPLICAS


def test_the_deploy_role_may_set_a_pods_status_only_where_canaries_are_verified(settings):
    status = [rule for rule in deploy_rules(settings) if rule.resource == "pods/status"]
    assert [rule.verbs for rule in status] == [("patch",)]
    unverified = settings.model_copy(
        update={"rollout": settings.rollout.model_copy(update={"verify_canary": False})}
    )
    assert not [rule for rule in deploy_rules(unverified) if rule.resource == "pods/status"]


def test_a_canary_slower_than_the_old_release_by_more_than_max_p99_ratio_is_removed(
    backend, cluster, settings, store
):
    with pytest.raises(RolloutFailed) as failed:
        deploy(backend, SLOW)
    result = failed.value.result
    assert result.outcome == "rolled_back"
    assert "gate on pod" in result.reason
    assert "> rollout.gate.max_p99_ratio 2 x the old release's" in result.reason
    assert stable_image(cluster, settings).endswith("@" + GOOD_A)
    assert m.canary_name(settings) not in cluster.deployments


def test_max_p99_ratio_on_a_pool_whose_replica_spans_nodes_is_refused_at_load(tmp_path):
    document = yaml.safe_load((project.stacks_dir() / "Pulumi.eks-multinode.yaml").read_text())
    document["config"]["frontier:rollout"]["gate"]["max_p99_ratio"] = 2
    path = tmp_path / "Pulumi.eks-multinode.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    with pytest.raises(StackError) as refused:
        load_stack("eks-multinode", path=path)
    assert "rollout.gate.max_p99_ratio = 2.0: cannot apply on kubernetes" in str(refused.value)
    assert "its LeaderWorkerSet rolls with no canary beside the old release" in str(refused.value)


# -- a pool whose replica spans nodes: verified before and after the roll -------------------------


@pytest.fixture
def multinode(tmp_path: Path, answers, saved_outputs) -> Iterator[tuple[KubernetesBackend, FakeCluster]]:
    verify_set = tmp_path / "pod-set.yaml"
    verify_set.write_text(POD_SET)
    stack = on_fake_cluster(load_stack("eks-multinode"), tmp_path)
    stack = stack.model_copy(update={"verify": stack.verify.model_copy(update={"file": str(verify_set)})})

    def forwards(image: str, to: int) -> tuple[str, int] | None:
        return answers["wrong"] if image.endswith("@" + WRONG) else answers["right"]

    fake = FakeCluster(
        namespace=stack.kubernetes.namespace,
        behaviour=behaviour,
        forwards=forwards,
        rules=deploy_rules(stack),
    )
    prefix = "history/eks-multinode/"
    bucket = "frontier-eks-multinode-history"
    saved_outputs.kubernetes(stack, history_bucket=bucket, history_prefix=prefix)
    with FakeApiServer(fake) as server, mock_aws():
        Path(stack.kubernetes.cluster.kubeconfig).write_text(server.kubeconfig("fake"))
        pool = stack.only_pool
        pod = m.pod_template(stack, pool, GOOD_A, render_runtime_config(stack, pool), track="stable")
        fake.put_group(lw.leader_worker_set(stack, pool, pod, replicas=2).to_dict())
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket=bucket)
        boto3.client("secretsmanager", region_name="us-east-1").create_secret(
            Name=stack.runtime.api_keys_secret, SecretString=json.dumps({"keys": [API_KEY]})
        )
        history = HistoryStore(s3, bucket, "eks-multinode", prefix)
        for digest in (GOOD_A, GOOD_B, WRONG):
            history.put_artifact(Artifact(digest=digest, kind="image", image=f"repo@{digest}"), None)
        yield KubernetesBackend(stack, stack.only_pool, clock=VirtualClock()), fake


def leader_image(fake: FakeCluster) -> str:
    (group,) = fake.groups.values()
    return group["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["containers"][0]["image"]


def test_a_multinode_release_that_answers_wrongly_puts_both_templates_back(multinode):
    backend, fake = multinode
    deploy(backend, GOOD_A)
    with pytest.raises(RolloutFailed) as failed:
        deploy(backend, WRONG)
    result = failed.value.result
    assert result.outcome == "rolled_back"
    assert "verify on pod" in result.reason and "failed cases: greedy (golden: " in result.reason
    assert leader_image(fake).endswith("@" + GOOD_A)


def test_a_multinode_release_that_answers_like_the_old_one_rolls(multinode):
    backend, fake = multinode
    assert deploy(backend, GOOD_B).outcome == "succeeded"
    assert leader_image(fake).endswith("@" + GOOD_B)
