"""A Kubernetes pool rolled by traffic share (``rollout.traffic_steps``): its Service selects the
pods of the stable Deployment and of the canary, so a step's share is the canary's replicas over
the pool's. Each step raises the canary before it lowers the stable Deployment, at most the room
the node pool keeps for a rollout at a time; the Service's ready endpoints stay at least one after
every step and every write; a failed step raises the stable Deployment back before the canary loses
a pod; the ScaledObject is paused while the rollout holds the counts. A step the pool's replicas
cannot realise is refused at load, naming the step, the replicas and the nearest share.

Real and mocked as in ``test_canary_gates`` (whose answers and history fixtures these tests use):
the ``kubernetes`` client over TCP (its port-forward included), the deploy path, history on moto;
mocked: the API server, its Deployment and EndpointSlice controllers and KEDA's pause
(``fake_apiserver``, authorizing as RBAC does with the deploy Role), the pods, and time.
"""

# The fixtures come from test_canary_gates: a test's parameters name them.
# ruff: noqa: F811

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fake_apiserver import FakeApiServer, FakeCluster
from test_backend import ERRORS, STUCK, VirtualClock, behaviour, on_fake_cluster
from test_canary_gates import GOOD_A, GOOD_B, POD_SET, answers, store  # noqa: F401 (fixtures)
from test_deploy_access import halved_batch

from frontier.config.schema import Settings
from frontier.errors import StackError
from frontier.release.artifact import Artifact
from frontier.render.host import render_runtime_config
from frontier.rollout.deploy import deploy, rollback
from frontier.rollout.rolling import RolloutFailed
from frontier.targets import load_stack
from frontier.targets.kubernetes import manifests as m
from frontier.targets.kubernetes import shares
from frontier.targets.kubernetes.autoscaling import scaled_object
from frontier.targets.kubernetes.backend import KubernetesBackend
from frontier.targets.kubernetes.deploy_access import deploy_rules
from frontier.targets.kubernetes.weighted import WeightedKubernetesRollout

STEPS = (25, 50, 100)
#: eks-prod's pool: node group h100's desired_size, one replica per node.
POOL_REPLICAS = 6


@pytest.fixture
def settings(eks_prod: Settings, tmp_path: Path) -> Settings:
    """eks-prod rolled by traffic share, its canary verified (as the stack file asks)."""
    verify_set = tmp_path / "pod-set.yaml"
    verify_set.write_text(POD_SET)
    stack = on_fake_cluster(eks_prod, tmp_path)
    return stack.model_copy(
        update={
            "rollout": stack.rollout.model_copy(update={"traffic_steps": STEPS}),
            "verify": stack.verify.model_copy(update={"file": str(verify_set)}),
        }
    )


@pytest.fixture
def fake(settings: Settings, answers) -> Iterator[FakeCluster]:
    def forwards(image: str, to: int) -> tuple[str, int] | None:
        # The Service's ready endpoints as each port-forward opens: what verification saw.
        ready = [e["targetRef"]["name"] for e in cluster.ready_endpoints(m.app_name(settings))]
        forwarded.append((image, ready))
        return answers["right"] if to == settings.runtime.port else None

    forwarded: list[tuple[str, list[str]]] = []

    cluster = FakeCluster(
        namespace=settings.kubernetes.namespace,
        behaviour=behaviour,
        forwards=forwards,
        rules=deploy_rules(settings),
    )
    with FakeApiServer(cluster) as server:
        Path(settings.kubernetes.cluster.kubeconfig).write_text(server.kubeconfig("fake"))
        # What `pulumi up` left: the Service, the ScaledObject, the Deployment at the pool's replicas.
        service = m.service(settings, settings.only_pool)
        cluster.services[service.name] = service.body["spec"]["selector"]
        scaler = scaled_object(settings, settings.only_pool).to_dict()
        cluster.scaled_objects[scaler["metadata"]["name"]] = scaler
        config = render_runtime_config(settings, settings.only_pool)
        manifest = m.deployment(settings, settings.only_pool, GOOD_A, config, replicas=POOL_REPLICAS)
        cluster.put_deployment(manifest.to_dict())
        cluster.timeline.clear()
        cluster.forwarded = forwarded  # type: ignore[attr-defined]
        yield cluster


@pytest.fixture
def backend(settings, fake, store) -> KubernetesBackend:
    for digest in (ERRORS, STUCK):  # an image whose pods answer 500s, one whose pods never get ready
        store.put_artifact(Artifact(digest=digest, kind="image", image=f"repo@{digest}"), None)
    return KubernetesBackend(settings, settings.only_pool, clock=VirtualClock())


def counts(fake: FakeCluster, settings: Settings) -> list[tuple[int, int]]:
    """(stable replicas, canary replicas) after each write that changed either."""
    stable, canary = m.app_name(settings), m.canary_name(settings)
    seen: list[tuple[int, int]] = []
    for moment in fake.timeline:
        pair = (moment.get(stable, 0), moment.get(canary, 0))
        if not seen or seen[-1] != pair:
            seen.append(pair)
    return seen


def ready_endpoints(fake: FakeCluster, settings: Settings) -> list[int]:
    return [moment[f"service/{m.app_name(settings)}"] for moment in fake.timeline]


def paused(fake: FakeCluster, settings: Settings) -> list[int]:
    return [moment[f"paused/{m.app_name(settings)}"] for moment in fake.timeline]


def image_of(fake: FakeCluster, name: str) -> str:
    return fake.deployments[name]["spec"]["template"]["spec"]["containers"][0]["image"]


# --- at load --------------------------------------------------------------------------------------


def test_a_kubernetes_stack_with_steps_its_replicas_can_realise_loads(k8s_stack):
    settings = load_stack("eks-prod", path=k8s_stack({"rollout.traffic_steps": list(STEPS)}))
    assert settings.rollout.traffic_steps == STEPS


def test_a_step_the_pools_replicas_cannot_realise_is_refused_naming_the_step_the_replicas_and_the_nearest_share(
    k8s_stack,
):
    with pytest.raises(StackError) as refused:
        load_stack("eks-prod", path=k8s_stack({"rollout.traffic_steps": [5, 25, 50, 100]}))
    message = str(refused.value)
    assert "rollout.traffic_steps = [5, 25, 50, 100]" in message
    assert "runs 6 replicas (its replicas, else node group 'h100''s desired_size)" in message
    assert "step 5 %: 0 of 6 replicas is 0 %; nearest realisable share: 17 % (1 of 6 replicas)" in message


def test_two_steps_that_round_to_one_count_of_replicas_are_refused(k8s_stack):
    with pytest.raises(StackError) as refused:
        load_stack("eks-prod", path=k8s_stack({"rollout.traffic_steps": [30, 40, 100]}))
    # 30 % and 40 % of 6 replicas are both 2: the second step would repeat the first.
    assert "step 40 %: 2 of 6 replicas is 33 %; nearest realisable share: 50 % (3 of 6 replicas)" in str(
        refused.value
    )


def test_a_pool_whose_replica_spans_nodes_refuses_traffic_steps(multinode_stack):
    with pytest.raises(StackError) as refused:
        load_stack("eks-multinode", path=multinode_stack({"rollout.traffic_steps": [50, 100]}))
    assert "runs as a LeaderWorkerSet, with no canary Deployment beside it" in str(refused.value)


def test_the_backend_hands_the_weighted_rollout_the_pool_it_acts_for(backend, settings):
    rollout = backend.rollout()
    assert isinstance(rollout, WeightedKubernetesRollout) and rollout.pool == settings.only_pool


# --- the rollout ----------------------------------------------------------------------------------


def test_each_step_raises_the_canary_before_the_stable_deployment_falls_room_pods_at_a_time(
    backend, fake, settings
):
    result = deploy(backend, GOOD_A)
    assert result.outcome == "succeeded"
    # eks-prod keeps room for max_surge 1 + canary_hosts 1 = 2 pods beyond the pool's 6.
    assert counts(fake, settings) == [
        (6, 0),  # the canary made at 0 replicas
        (6, 2),  # 25 %: 2 of 6 replicas, 33 % realised
        (4, 2),
        (4, 3),  # 50 %: 3 of 6
        (3, 3),
        (3, 5),  # 100 %: 6 of 6, two pods at a time
        (1, 5),
        (1, 6),
        (0, 6),
        (2, 6),  # the stable Deployment on the new template takes the pods back
        (2, 4),
        (4, 4),
        (4, 2),
        (6, 2),
        (6, 0),
    ]
    assert max(stable + canary for stable, canary in counts(fake, settings)) <= POOL_REPLICAS + 2
    assert m.canary_name(settings) not in fake.deployments
    assert image_of(fake, m.app_name(settings)).endswith("@" + GOOD_A)


def test_every_step_reports_its_realised_share_beside_the_asked_one_and_its_routable_endpoints(
    backend, settings
):
    events = []
    result = deploy(backend, GOOD_A, reporter=events.append)
    assert [(s.percent, round(s.realised), s.outcome) for s in result.steps] == [
        (25, 33, "passed"),
        (50, 50, "passed"),
        (100, 100, "passed"),
    ]
    assert [s.routable for s in result.steps] == [6, 6, 6]
    assert "25 % asked: 2 of 6 replicas on the new release (33 % realised)" in [e.detail for e in events]
    assert "25 % (33 % realised)" in result.strategy
    # Each step judged on both releases' own series: the canary's pods and the stable's, summed.
    assert result.steps[0].new.startswith("200 requests") and result.steps[0].old.startswith("400 requests")


def test_a_deploys_summary_shows_the_realised_share_beside_the_asked_one(backend):
    from rich.console import Console

    from frontier.cli.ops import _summary

    console = Console(record=True, width=200)
    _summary(console, deploy(backend, GOOD_A))
    steps = console.export_text().partition("traffic steps of deploy")[2]
    rows = [line.replace("│", " ").split()[:6] for line in steps.splitlines() if line.startswith("│")]
    assert rows[0] == ["25", "%", "(33", "%", "realised)", "passed"]
    assert rows[1][:3] == ["50", "%", "passed"]  # realised as asked: shown once


def test_the_service_keeps_a_ready_endpoint_after_every_write_of_a_rollout(backend, fake, settings):
    deploy(backend, GOOD_A)
    deploy(backend, GOOD_B)
    assert fake.timeline and min(ready_endpoints(fake, settings)) >= 1


def test_the_scaled_object_is_paused_while_the_rollout_holds_the_counts_and_resumed_after(
    backend, fake, settings
):
    deploy(backend, GOOD_A)
    states = paused(fake, settings)
    assert states[0] == 1 and states[-1] == 0
    assert fake.scaled_objects[m.app_name(settings)]["metadata"].get("annotations", {}) == {}


def test_a_pool_the_autoscaler_left_below_its_count_is_raised_before_the_first_step(backend, fake, settings):
    live = fake.deployments[m.app_name(settings)]
    fake.put_deployment({**live, "spec": {**live["spec"], "replicas": 4}})
    fake.timeline.clear()
    deploy(backend, GOOD_A)
    assert counts(fake, settings)[:4] == [(4, 0), (6, 0), (6, 2), (4, 2)]


# --- the revert -----------------------------------------------------------------------------------


def test_a_failed_step_raises_the_stable_deployment_back_before_the_canary_is_removed(
    backend, fake, settings
):
    deploy(backend, GOOD_A)
    fake.timeline.clear()
    with pytest.raises(RolloutFailed) as failed:
        deploy(backend, ERRORS)
    result = failed.value.result
    assert result.outcome == "rolled_back"
    assert "traffic step 25 %" in result.reason and "rollout.gate.max_error_rate" in result.reason
    # The step at 25 % (stable 4, canary 2) fails its gate: the stable rises to 6 first.
    assert counts(fake, settings) == [(6, 0), (6, 2), (4, 2), (6, 2), (6, 0)]
    failed_at = counts(fake, settings).index((4, 2))
    assert all(stable >= 4 for stable, _ in counts(fake, settings)[failed_at:])
    assert min(ready_endpoints(fake, settings)) >= 1 and paused(fake, settings)[-1] == 0
    assert m.canary_name(settings) not in fake.deployments
    assert image_of(fake, m.app_name(settings)).endswith("@" + GOOD_A)
    assert [(s.percent, s.outcome) for s in result.steps] == [(25, "failed")]


def test_a_canary_that_never_becomes_ready_is_removed_without_the_stable_deployment_losing_a_pod(
    backend, fake, settings
):
    deploy(backend, GOOD_A)
    fake.timeline.clear()
    with pytest.raises(RolloutFailed) as failed:
        deploy(backend, STUCK)
    assert failed.value.result.outcome == "rolled_back"
    assert counts(fake, settings) == [(6, 0), (6, 2), (6, 0)]
    assert m.canary_name(settings) not in fake.deployments


def test_the_first_steps_canary_pods_are_verified_out_of_the_service_then_admitted(backend, fake, settings):
    deploy(backend, GOOD_A)
    fake.forwarded.clear()
    fake.requests.clear()
    deploy(backend, GOOD_B)
    canary = m.canary_name(settings)
    on_canary = [ready for image, ready in fake.forwarded if image.endswith("@" + GOOD_B)]
    assert on_canary and all(not any(pod.startswith(canary) for pod in ready) for ready in on_canary)
    admitted = [
        i for i, (method, path) in enumerate(fake.requests) if method == "PATCH" and path.endswith("/status")
    ]
    tunnels = [i for i, (_, path) in enumerate(fake.requests) if path.endswith("/portforward")]
    # Every canary pod the steps raised was admitted, each once, the first after the verification.
    assert max(tunnels) < min(admitted)
    assert len(admitted) == shares.canary_replicas(STEPS[-1], POOL_REPLICAS)


def test_a_rollback_rolls_by_traffic_share_too(backend, fake, settings):
    deploy(backend, GOOD_A)
    deploy(backend, GOOD_B)
    fake.timeline.clear()
    result = rollback(backend)
    assert result.outcome == "succeeded" and [s.percent for s in result.steps] == list(STEPS)
    assert image_of(fake, m.app_name(settings)).endswith("@" + GOOD_A)
    assert min(ready_endpoints(fake, settings)) >= 1


# --- what the deploy Role grants ------------------------------------------------------------------


def test_rollouts_by_traffic_share_use_every_verb_the_role_grants_and_no_other(backend, fake, settings):
    # One release kept: each rollout prunes the ConfigMap of the one before.
    settings = settings.model_copy(
        update={"rollout": settings.rollout.model_copy(update={"keep_releases": 1})}
    )
    backend = KubernetesBackend(settings, settings.only_pool, clock=VirtualClock())
    deploy(backend, GOOD_A)  # the provisioned image's first release: nothing to record from
    deploy(backend, GOOD_B)  # its canary verified over port-forward at the first step
    with pytest.raises(RolloutFailed):
        deploy(backend, ERRORS)  # a failed step, reverted
    rollback(backend)
    # A changed runtime setting is a new ConfigMap; the one before it is pruned.
    halved = halved_batch(settings)
    deploy(KubernetesBackend(halved, halved.only_pool, clock=VirtualClock()), GOOD_B)
    assert all(allowed for *_, allowed in fake.authorized)
    used = {(verb, group, resource) for verb, group, resource, _ in fake.authorized}
    granted = {(verb, r.api_group, r.resource) for r in deploy_rules(settings) for verb in r.verbs}
    # The portforward upgrade is a GET; API servers from 1.31 also ask create of it.
    assert used | {("create", "", "pods/portforward")} == granted
