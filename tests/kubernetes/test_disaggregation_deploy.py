"""``fab deploy --model`` and ``fab rollback --model`` on a disaggregated pool (eks-gateway's 8B):
both halves' Deployments roll, prefill first, each through its canary and gate; a decode that fails
puts the prefill back too, so the pair never stays on two releases; every request the rollouts make
is one the deploy Role grants.

Real and mocked as in ``test_backend``: the ``kubernetes`` client over a real socket, the deploy
path and its history on moto's S3; the API server and its Deployment controller are
``fake_apiserver`` (mocked: no cluster runs here), authorizing as RBAC does; time a virtual clock.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest
from fake_apiserver import FakeApiServer, FakeCluster
from moto import mock_aws
from test_backend import GOOD_A, GOOD_B, REPLICAS, VirtualClock, behaviour, on_fake_cluster, unverified

from frontier.config.schema import Settings
from frontier.release.artifact import Artifact
from frontier.release.history import HistoryStore
from frontier.render.host import render_runtime_config
from frontier.rollout.deploy import deploy, rollback
from frontier.rollout.rolling import RolloutFailed
from frontier.targets import backend_for
from frontier.targets.kubernetes import disaggregation as pd
from frontier.targets.kubernetes import manifests as m
from frontier.targets.kubernetes.backend import KubernetesBackend
from frontier.targets.kubernetes.deploy_access import deploy_rules
from tests.openai_standin import API_KEY, openai_standin

BUCKET = "frontier-eks-gateway-history"
PREFIX = "history/eks-gateway/"
SMALL = "llama-3.1-8b-instruct"
PREFILL, DECODE = "frontier-llama-3-1-8b-instruct-prefill", "frontier-llama-3-1-8b-instruct-decode"


@pytest.fixture
def settings(eks_gateway: Settings, tmp_path: Path) -> Settings:
    return unverified(on_fake_cluster(eks_gateway, tmp_path))


@pytest.fixture
def fake(settings: Settings) -> Iterator[FakeCluster]:
    cluster = FakeCluster(
        namespace=settings.kubernetes.namespace, behaviour=behaviour, rules=deploy_rules(settings)
    )
    with FakeApiServer(cluster) as server:
        Path(settings.kubernetes.cluster.kubeconfig).write_text(server.kubeconfig("fake"))
        # What `pulumi up` left: each half's Deployment on the stack's first image.
        pool = settings.pool(SMALL)
        for half in pd.role_pools(pool):
            config = render_runtime_config(settings, pd.released_runtime(pool))
            cluster.put_deployment(m.deployment(settings, half, GOOD_A, config, replicas=REPLICAS).to_dict())
        cluster.requests.clear()
        yield cluster


@pytest.fixture
def backend(settings, fake, saved_outputs) -> Iterator[KubernetesBackend]:
    saved_outputs.kubernetes(settings, history_bucket=BUCKET, history_prefix=PREFIX)
    with mock_aws():
        client = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket=BUCKET)
        store = HistoryStore(client, BUCKET, "eks-gateway", PREFIX)
        for digest in (GOOD_A, GOOD_B):
            store.put_artifact(Artifact(digest=digest, kind="image", image=f"repo@{digest}"), None)
        pool = backend_for(settings.for_pool(SMALL))  # what `fab deploy --model` holds
        assert isinstance(pool, KubernetesBackend)
        pool.clock = VirtualClock()
        yield pool


def _container(fake: FakeCluster, name: str) -> dict:
    return fake.deployments[name]["spec"]["template"]["spec"]["containers"][0]


def _template(fake: FakeCluster, name: str) -> str:
    return json.dumps(fake.deployments[name]["spec"]["template"], sort_keys=True)


def test_a_deploy_rolls_the_prefill_then_the_decode_each_through_its_canary_and_gate(backend, fake):
    events: list = []
    result = deploy(backend, GOOD_B, reporter=events.append)
    assert result.outcome == "succeeded"
    assert [e.host for e in events if e.phase == "gate" and e.status == "ok"] == [
        f"deployment/{PREFILL}-canary",
        f"deployment/{PREFILL}",
        f"deployment/{DECODE}-canary",
        f"deployment/{DECODE}",
    ]
    assert [h.name for h in result.hosts] == [
        f"deployment/{PREFILL}-canary",
        f"deployment/{PREFILL}",
        f"deployment/{DECODE}-canary",
        f"deployment/{DECODE}",
    ]
    for name, role in ((PREFILL, "prefill"), (DECODE, "decode")):
        container = _container(fake, name)
        assert container["image"].endswith("@" + GOOD_B)
        assert container["command"][container["command"].index("--kv-role") + 1] == role


def test_both_halves_run_the_releases_one_runtime_config(backend, fake):
    deploy(backend, GOOD_B)
    mounted = {
        name: fake.deployments[name]["spec"]["template"]["spec"]["volumes"][0]["configMap"]["name"]
        for name in (PREFILL, DECODE)
    }
    texts = {fake.config_maps[config]["data"]["runtime.yaml"] for config in mounted.values()}
    assert len(texts) == 1 and "role: both" in texts.pop()


def test_a_decode_failing_on_the_new_pair_puts_the_prefill_back_too(backend, fake):
    before = {name: _template(fake, name) for name in (PREFILL, DECODE)}
    fake.owner_behaviour[f"{DECODE}-canary"] = "errors"  # the new decode fails its gate
    events: list = []
    with pytest.raises(RolloutFailed) as err:
        deploy(backend, GOOD_B, reporter=events.append)
    result = err.value.result
    assert result.outcome == "rolled_back"
    assert "gate on pod" in result.reason
    assert {name: _template(fake, name) for name in (PREFILL, DECODE)} == before
    assert _container(fake, PREFILL)["image"].endswith("@" + GOOD_A)
    restored = [e.host for e in events if e.phase == "restore" and e.status == "ok"]
    assert f"deployment/{PREFILL}" in restored
    assert [h.outcome for h in result.hosts if h.name == f"deployment/{PREFILL}"] == ["restored"]


def test_a_prefill_that_fails_leaves_the_decode_untouched(backend, fake):
    before = _template(fake, DECODE)
    fake.owner_behaviour[f"{PREFILL}-canary"] = "errors"
    with pytest.raises(RolloutFailed) as err:
        deploy(backend, GOOD_B)
    assert err.value.result.outcome == "rolled_back"
    assert _template(fake, DECODE) == before
    assert not [path for method, path in fake.requests if method != "GET" and DECODE in path]


def test_a_rollback_rolls_both_halves_back_prefill_first(backend, fake):
    deploy(backend, GOOD_A)  # the provisioned image's first release
    deploy(backend, GOOD_B)
    events: list = []
    result = rollback(backend, reporter=events.append)
    assert result.outcome == "succeeded"
    rolled = [e.host for e in events if e.phase == "roll" and e.status == "ok"]
    assert rolled == [f"deployment/{PREFILL}", f"deployment/{DECODE}"]
    for name in (PREFILL, DECODE):
        assert _container(fake, name)["image"].endswith("@" + GOOD_A)


def test_every_request_of_the_pairs_rollouts_is_one_the_deploy_role_grants(backend, fake, settings):
    deploy(backend, GOOD_A)
    deploy(backend, GOOD_B)
    fake.owner_behaviour[f"{DECODE}-canary"] = "errors"
    with pytest.raises(RolloutFailed):
        deploy(backend, GOOD_A)
    fake.owner_behaviour.clear()
    rollback(backend)
    assert fake.authorized and all(allowed for *_, allowed in fake.authorized)
    granted = {(v, r.api_group, r.resource) for r in deploy_rules(settings) for v in r.verbs}
    assert {(verb, group, resource) for verb, group, resource, _ in fake.authorized} <= granted


def test_the_pools_pods_are_both_halves_each_on_its_group_in_the_order_they_roll(backend, fake):
    pods = backend.hosts()
    assert [p.group for p in pods] == ["l40s-prefill"] * REPLICAS + ["l40s"] * REPLICAS
    assert all(p.name.startswith(PREFILL + "-") for p in pods[:REPLICAS])
    assert all(p.name.startswith(DECODE + "-") for p in pods[REPLICAS:])


# --- with the canaries' verification (rollout.verify_canary on) ------------------------------------

POD_SET = """
cases:
  - {name: answered, kind: normal, request: {messages: [{role: user, content: hi}], max_tokens: 4}, expect: {status: 200}}
  - {name: greedy, kind: golden, route: completions, request: {prompt: once, max_tokens: 4}}
"""
WRONG = "sha256:" + "d" * 64


@pytest.fixture
def verified(
    eks_gateway: Settings, tmp_path: Path, saved_outputs
) -> Iterator[tuple[KubernetesBackend, FakeCluster]]:
    """The pool with its canaries verified over port-forward against stand-in runtimes: release A's
    answers, and one that says something else (``WRONG``)."""
    verify_set = tmp_path / "pod-set.yaml"
    verify_set.write_text(POD_SET)
    stack = on_fake_cluster(eks_gateway, tmp_path)
    settings = stack.model_copy(
        update={
            "verify": stack.verify.model_copy(update={"file": str(verify_set)}),
            "rollout": stack.rollout.model_copy(update={"verify_canary": True}),
        }
    )
    pool = settings.pool(SMALL)
    with openai_standin("the sea is wide") as right, openai_standin("the sea is narrow") as wrong:

        def forwards(image: str, port: int) -> tuple[str, int] | None:
            if port != pool.runtime.port:
                return None
            return wrong if image.endswith("@" + WRONG) else right

        cluster = FakeCluster(
            namespace=settings.kubernetes.namespace,
            behaviour=behaviour,
            forwards=forwards,
            rules=deploy_rules(settings),
        )
        with FakeApiServer(cluster) as server, mock_aws():
            Path(settings.kubernetes.cluster.kubeconfig).write_text(server.kubeconfig("fake"))
            for half in pd.role_pools(pool):
                config = render_runtime_config(settings, pd.released_runtime(pool))
                manifest = m.deployment(settings, half, GOOD_A, config, replicas=REPLICAS)
                cluster.put_deployment(manifest.to_dict())
            saved_outputs.kubernetes(settings, history_bucket=BUCKET, history_prefix=PREFIX)
            s3 = boto3.client("s3", region_name="us-east-1")
            s3.create_bucket(Bucket=BUCKET)
            boto3.client("secretsmanager", region_name="us-east-1").create_secret(
                Name=pool.runtime.api_keys_secret, SecretString=json.dumps({"keys": [API_KEY]})
            )
            store = HistoryStore(s3, BUCKET, "eks-gateway", PREFIX)
            for digest in (GOOD_A, GOOD_B, WRONG):
                store.put_artifact(Artifact(digest=digest, kind="image", image=f"repo@{digest}"), None)
            backend = backend_for(settings.for_pool(SMALL))
            assert isinstance(backend, KubernetesBackend)
            backend.clock = VirtualClock()
            yield backend, cluster


def test_both_canaries_are_verified_against_one_recording_of_the_old_release(verified):
    backend, _ = verified
    deploy(backend, GOOD_A)  # over the provisioned image: no release to record from
    events: list = []
    deploy(backend, GOOD_B, reporter=events.append)
    recorded = [e.host for e in events if e.phase == "verify" and "golden outputs recorded" in e.detail]
    assert len(recorded) == 1 and recorded[0].startswith(PREFILL + "-")
    passed = [e.host for e in events if e.phase == "verify" and e.status == "ok"]
    assert passed == [f"deployment/{PREFILL}-canary", f"deployment/{DECODE}-canary"]


def test_a_release_that_answers_otherwise_fails_on_the_prefill_canary_and_touches_no_decode(verified):
    backend, cluster = verified
    deploy(backend, GOOD_A)
    before = _template(cluster, DECODE)
    with pytest.raises(RolloutFailed) as err:
        deploy(backend, WRONG)
    assert err.value.result.outcome == "rolled_back"
    assert "verify on pod" in err.value.result.reason and PREFILL in err.value.result.reason
    assert _template(cluster, DECODE) == before
