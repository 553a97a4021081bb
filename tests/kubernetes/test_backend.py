"""``deploy`` and ``rollback`` on the Kubernetes target, against the API the client library speaks.

Real here: the ``kubernetes`` client (kubeconfig loading, requests, errors) over a TCP socket; the
deploy path of :mod:`frontier.rollout.deploy` (release, lock, history record); the history bucket
on moto's S3 (in process). Mocked: the Kubernetes API server and its Deployment controller, played
by ``fake_apiserver`` (a small HTTP server with the endpoints the rollout uses; see its docstring
for what it simulates); time, by a virtual clock, so gate windows and polls do not wait.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import boto3
import pytest
from fake_apiserver import FakeApiServer, FakeCluster
from frontier_hostside import names
from moto import mock_aws

from frontier.config.schema import Settings
from frontier.release.artifact import Artifact
from frontier.release.history import HistoryStore, LockHeld
from frontier.render.host import render_runtime_config
from frontier.rollout.deploy import deploy, rollback
from frontier.rollout.rolling import RolloutFailed
from frontier.targets import backend_for, load_stack
from frontier.targets.kubernetes import manifests as m
from frontier.targets.kubernetes.backend import KubernetesBackend
from frontier.targets.kubernetes.deploy_access import deploy_rules
from frontier.targets.kubernetes.rollout import Clock
from tests.openai_standin import API_KEY as STANDIN_KEY
from tests.openai_standin import openai_standin

GOOD_A = "sha256:" + "a" * 64
GOOD_B = "sha256:" + "b" * 64
ERRORS = "sha256:" + "e" * 64
STUCK = "sha256:" + "5" * 64
BUCKET = "frontier-eks-prod-history"
REPLICAS = 3


@dataclass
class VirtualClock(Clock):
    t: float = 0.0
    slept: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.now = lambda: self.t
        self.sleep = self._sleep

    def _sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.t += seconds


def behaviour(image: str) -> str:
    digest = image.rpartition("@")[2]
    return {ERRORS: "errors", STUCK: "stuck"}.get(digest, "good")


def on_fake_cluster(stack: Settings, tmp_path: Path) -> Settings:
    """``stack`` as an existing cluster reached through a kubeconfig file (the fake API server's,
    written per test into ``tmp_path``)."""
    k = stack.kubernetes
    cluster = k.cluster.model_copy(
        update={"mode": "existing", "kubeconfig": str(tmp_path / "kubeconfig"), "context": "fake"}
    )
    return stack.model_copy(update={"kubernetes": k.model_copy(update={"cluster": cluster})})


def unverified(stack: Settings) -> Settings:
    """``stack`` with its canary's verification off: these tests are of the rollout's Kubernetes
    steps; the verification's own are in test_canary_gates.py."""
    return stack.model_copy(update={"rollout": stack.rollout.model_copy(update={"verify_canary": False})})


@pytest.fixture
def settings(eks_prod: Settings, tmp_path) -> Settings:
    return unverified(on_fake_cluster(eks_prod, tmp_path))


@pytest.fixture
def cluster(settings: Settings) -> Iterator[FakeApiServer]:
    fake = FakeCluster(namespace=settings.kubernetes.namespace, behaviour=behaviour, rules=deploy_rules(settings))
    with FakeApiServer(fake) as server:
        Path(settings.kubernetes.cluster.kubeconfig).write_text(server.kubeconfig("fake"))
        # What `pulumi up` left: the Deployment with the stack's first image, scaled by KEDA to 3.
        pool = settings.only_pool
        first = m.deployment(settings, pool, GOOD_A, render_runtime_config(settings, pool), replicas=REPLICAS)
        fake.put_deployment(first.to_dict())
        fake.requests.clear()
        yield server


@pytest.fixture
def s3(settings, saved_outputs) -> Iterator[object]:
    saved_outputs.kubernetes(settings, history_bucket=BUCKET, history_prefix="history/eks-prod/")
    with mock_aws():
        client = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket=BUCKET)
        store = HistoryStore(client, BUCKET, "eks-prod", "history/eks-prod/")
        for digest in (GOOD_A, GOOD_B, ERRORS, STUCK):
            store.put_artifact(Artifact(digest=digest, kind="image", image=f"repo@{digest}"), None)
        yield client


@pytest.fixture
def clock() -> VirtualClock:
    return VirtualClock()


@pytest.fixture
def backend(settings, cluster, s3, clock) -> KubernetesBackend:
    """As the factory builds it, with the virtual clock handed to it."""
    return KubernetesBackend(settings, settings.only_pool, clock=clock)


def _stable(cluster: FakeApiServer, settings: Settings) -> dict:
    return cluster.cluster.deployments[m.app_name(settings)]


def _image(deployment: dict) -> str:
    return deployment["spec"]["template"]["spec"]["containers"][0]["image"]


def _writes(cluster: FakeApiServer) -> list[tuple[str, str]]:
    return [(method, path.rsplit("/", 1)[-1]) for method, path in cluster.cluster.requests if method != "GET"]


def test_the_factory_gives_kubernetes_stacks_the_kubernetes_backend(settings, cluster, s3):
    backend = backend_for(settings)
    assert isinstance(backend, KubernetesBackend) and backend.kind == "kubernetes"
    assert backend.balancer() is None
    pods = backend.hosts()
    assert len(pods) == REPLICAS and all(p.name.startswith(m.app_name(settings)) for p in pods)
    facts = backend.session(pods[0]).status()
    assert facts.running and facts.ready and facts.live and facts.digest == GOOD_A
    assert backend.history_store().bucket == BUCKET


def test_deploy_goes_through_a_canary_and_the_gate_then_rolls_the_deployment(
    backend, cluster, settings, s3, clock
):
    events = []
    result = deploy(backend, GOOD_B, reporter=events.append)
    assert result.outcome == "succeeded"
    stable = _stable(cluster, settings)
    assert _image(stable).endswith("@" + GOOD_B)
    annotations = stable["spec"]["template"]["metadata"]["annotations"]
    assert annotations[names.K8S_RELEASE_ANNOTATION] == result.release
    # The release's config as an immutable ConfigMap, named in the new template.
    (config,) = cluster.cluster.config_maps.values()
    assert config["immutable"] is True and config["data"]["runtime.yaml"] == render_runtime_config(
        settings, settings.only_pool
    )
    assert stable["spec"]["template"]["spec"]["volumes"][0]["configMap"]["name"] == config["metadata"]["name"]
    # canary created, gated, then the Deployment patched, gated, and the canary removed: in that order.
    canary = m.canary_name(settings)
    assert _writes(cluster) == [
        ("POST", "configmaps"),
        ("DELETE", canary),  # a leftover canary would be removed first (none here: 404)
        ("POST", "deployments"),
        ("PATCH", m.app_name(settings)),
        ("DELETE", canary),
    ]
    assert canary not in cluster.cluster.deployments
    gates = [e for e in events if e.phase == "gate" and e.status == "ok"]
    assert [g.host for g in gates] == [f"deployment/{canary}", f"deployment/{m.app_name(settings)}"]
    assert "requests, error rate 0.00%" in gates[0].detail
    assert settings.rollout.gate.window_s in clock.slept  # the gate waited its window (virtually)
    (record,) = HistoryStore(s3, BUCKET, "eks-prod", "history/eks-prod/").records()
    assert (record["kind"], record["outcome"], record["digest"]) == ("deploy", "succeeded", GOOD_B)
    assert [h["name"] for h in record["hosts"]] == [
        f"deployment/{canary}",
        f"deployment/{m.app_name(settings)}",
    ]
    assert [h["outcome"] for h in record["hosts"]] == ["updated", "updated"]


def test_a_canary_that_fails_the_gate_is_removed_and_the_deployment_never_changes(
    backend, cluster, settings, s3
):
    before = json.dumps(_stable(cluster, settings)["spec"]["template"], sort_keys=True)
    with pytest.raises(RolloutFailed) as err:
        deploy(backend, ERRORS)
    result = err.value.result
    assert result.outcome == "rolled_back"
    assert "gate on pod" in result.reason and "rollout.gate.max_error_rate" in result.reason
    assert json.dumps(_stable(cluster, settings)["spec"]["template"], sort_keys=True) == before
    assert ("PATCH", m.app_name(settings)) not in _writes(cluster)
    assert m.canary_name(settings) not in cluster.cluster.deployments
    (record,) = HistoryStore(s3, BUCKET, "eks-prod", "history/eks-prod/").records()
    assert record["outcome"] == "rolled_back" and "gate on pod" in record["reason"]


def _without_canary(settings: Settings) -> Settings:
    return settings.model_copy(update={"rollout": settings.rollout.model_copy(update={"canary_hosts": 0})})


def test_a_gate_failure_after_the_roll_puts_the_previous_revision_back(settings, cluster, s3, clock):
    settings = _without_canary(settings)
    backend = KubernetesBackend(settings, settings.only_pool, clock=clock)
    before = _stable(cluster, settings)["spec"]["template"]
    with pytest.raises(RolloutFailed) as err:
        deploy(backend, ERRORS)
    result = err.value.result
    assert result.outcome == "rolled_back" and "gate on pod" in result.reason
    stable = _stable(cluster, settings)
    assert stable["spec"]["template"] == before and _image(stable).endswith("@" + GOOD_A)
    patches = [w for w in _writes(cluster) if w[0] == "PATCH"]
    assert len(patches) == 2  # the release, then the previous template back
    assert result.hosts[1].outcome == "restored"


def test_a_progress_deadline_rolls_back(settings, cluster, s3, clock):
    settings = _without_canary(settings)
    backend = KubernetesBackend(settings, settings.only_pool, clock=clock)
    with pytest.raises(RolloutFailed) as err:
        deploy(backend, STUCK)
    result = err.value.result
    assert result.outcome == "rolled_back"
    assert "progress deadline exceeded" in result.reason
    assert _image(_stable(cluster, settings)).endswith("@" + GOOD_A)


def test_a_deploy_is_refused_while_another_holds_the_lock(backend, cluster, settings, s3):
    backend.history_store().acquire("deploy r-000000000000", holder="ci@elsewhere")
    with pytest.raises(LockHeld, match="locked by another deploy: ci@elsewhere"):
        deploy(backend, GOOD_B)
    assert _writes(cluster) == []  # nothing touched the cluster
    assert _image(_stable(cluster, settings)).endswith("@" + GOOD_A)
    assert HistoryStore(s3, BUCKET, "eks-prod", "history/eks-prod/").records() == []


def test_rollback_returns_to_the_previous_good_release_by_the_same_path(backend, cluster, settings, s3):
    first = deploy(backend, GOOD_A)  # records the release pulumi started with
    assert first.outcome == "succeeded"
    second = deploy(backend, GOOD_B)
    assert _image(_stable(cluster, settings)).endswith("@" + GOOD_B)
    back = rollback(backend)
    assert back.outcome == "succeeded" and back.release == first.release != second.release
    assert _image(_stable(cluster, settings)).endswith("@" + GOOD_A)
    kinds = [r["kind"] for r in HistoryStore(s3, BUCKET, "eks-prod", "history/eks-prod/").records()]
    assert kinds == ["deploy", "deploy", "rollback"]


def test_deploying_the_release_that_runs_changes_nothing(backend, cluster, settings):
    deploy(backend, GOOD_B)
    cluster.cluster.requests.clear()
    result = deploy(backend, GOOD_B)
    assert [h.outcome for h in result.hosts] == ["skipped", "skipped"]
    assert _writes(cluster) == []


def test_a_changed_pod_shape_rolls_even_when_the_release_is_the_same(settings, cluster, s3, clock):
    """The release names the digest and runtime.yaml; a pod-only change (here /dev/shm) rolls too."""
    backend = KubernetesBackend(settings, settings.only_pool, clock=clock)
    first = deploy(backend, GOOD_B)
    bigger = settings.kubernetes.model_copy(update={"shm_gb": 128})
    changed = settings.model_copy(update={"kubernetes": bigger})
    backend = KubernetesBackend(changed, changed.only_pool, clock=clock)
    again = deploy(backend, GOOD_B)
    assert again.release == first.release and [h.outcome for h in again.hosts] == ["updated", "updated"]
    volumes = {v["name"]: v for v in _stable(cluster, settings)["spec"]["template"]["spec"]["volumes"]}
    assert volumes["dshm"]["emptyDir"]["sizeLimit"] == "128Gi"


def test_a_missing_deployment_says_to_provision_first(backend, cluster, settings):
    cluster.cluster.deployments.clear()
    with pytest.raises(RolloutFailed, match="does not exist: provision the stack first"):
        deploy(backend, GOOD_B)


# --- the same through `fab`, as an operator types it ------------------------------------------------


def _fab(capsys, *args: str) -> tuple[int, str]:
    from fabric.main import program

    try:
        program.run(["fab", *args])
        code = 0
    except SystemExit as exc:
        code = exc.code or 0
    out = capsys.readouterr()
    return code, out.out + out.err


def test_fab_deploy_history_and_rollback_on_a_kubernetes_stack(capsys, monkeypatch, tmp_path, s3):
    """`fab` reads the stack file, the saved outputs and the kubeconfig like on a real cluster."""
    # The canary's verification (a production stack's) reaches each pod over port-forward: here a
    # stand-in of the runtime's API answers for every pod, and the stack names a set of two cases.
    verify_set = tmp_path / "pod-set.yaml"
    verify_set.write_text(POD_SET)
    s3_secrets = boto3.client("secretsmanager", region_name="us-east-1")
    with openai_standin("the sea is wide") as answers:
        fake = FakeCluster(
            namespace="frontier-prod",
            behaviour=behaviour,
            rules=deploy_rules(load_stack("eks-prod")),
            settle_reads=0,
            forwards=lambda image, port: answers,
        )
        with FakeApiServer(fake) as server:
            _fab_on_cluster(capsys, monkeypatch, tmp_path, server, fake, verify_set, s3_secrets)


POD_SET = """
cases:
  - {name: answered, kind: normal, request: {messages: [{role: user, content: hi}], max_tokens: 4}, expect: {status: 200}}
  - {name: greedy, kind: golden, route: completions, request: {prompt: once, max_tokens: 4}}
"""


def _fab_on_cluster(capsys, monkeypatch, tmp_path, server, fake, verify_set, secrets) -> None:
    import yaml

    from frontier import project

    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(server.kubeconfig("prod"))
    stacks = tmp_path / "stacks"
    stacks.mkdir()
    document = yaml.safe_load((project.stacks_dir() / "Pulumi.eks-prod.yaml").read_text())
    block = document["config"]["frontier:kubernetes"]
    block["cluster"].update(
        mode="existing", kubeconfig=str(kubeconfig), context="prod", api_server_cidrs=["10.60.240.0/28"]
    )
    block["runtime_role_arn"] = "arn:aws:iam::123456789012:role/frontier-runtime"
    block["ingress"]["source_cidrs"] = ["10.60.128.0/20"]
    document["config"]["frontier:rollout"]["gate"]["window_s"] = 0.2  # real seconds here
    document["config"]["frontier:verify"] = {"file": str(verify_set)}
    secret = document["config"]["frontier:runtime"]["api_keys_secret"]
    secrets.create_secret(Name=secret, SecretString=json.dumps({"keys": [STANDIN_KEY]}))
    (stacks / "Pulumi.eks-prod.yaml").write_text(yaml.safe_dump(document))
    monkeypatch.setenv("FRONTIER_STACKS_DIR", str(stacks))
    monkeypatch.chdir(project.root())
    from frontier.targets import load_stack

    settings = load_stack("eks-prod")
    pool = settings.only_pool
    first = m.deployment(settings, pool, GOOD_A, render_runtime_config(settings, pool), replicas=REPLICAS)
    fake.put_deployment(first.to_dict())

    code, out = _fab(capsys, "deploy", "-s", "eks-prod", "--digest", GOOD_A)
    assert code == 0, out
    code, out = _fab(capsys, "deploy", "-s", "eks-prod", "--digest", GOOD_B)
    assert code == 0, out
    assert "succeeded" in out and f"deployment/{m.app_name(settings)}" in out
    assert _image(fake.deployments[m.app_name(settings)]).endswith("@" + GOOD_B)
    # Its canary was verified against a pod still on release A, over port-forward streams.
    assert any(path.endswith("/portforward") for _, path in fake.requests)

    code, out = _fab(capsys, "deploy", "-s", "eks-prod", "--digest", ERRORS)
    assert code == 1 and "rolled back" in out and "gate on pod" in out
    assert _image(fake.deployments[m.app_name(settings)]).endswith("@" + GOOD_B)

    code, out = _fab(capsys, "rollback", "-s", "eks-prod")
    assert code == 0, out
    assert _image(fake.deployments[m.app_name(settings)]).endswith("@" + GOOD_A)

    code, out = _fab(capsys, "history", "-s", "eks-prod")
    assert code == 0 and out.count("succeeded") == 3 and "rolled_back" in out

    code, out = _fab(capsys, "status", "-s", "eks-prod")
    pods = [line for line in out.splitlines() if m.app_name(settings)[:20] in line]
    assert code == 0 and len(pods) == REPLICAS, out
    assert "unreachable" not in out  # every pod answers from its own object
    assert "deploy lock: free" in out

    code, out = _fab(capsys, "deploy", "-s", "eks-prod", "--digest", GOOD_B, "--plan")
    assert code == 0 and out.count("update") == REPLICAS, out


def test_config_maps_beyond_keep_releases_are_pruned_never_the_one_in_use(settings, cluster, s3, clock):
    names = []
    for drain in (30, 40, 50, 60):  # four configs: four ConfigMaps
        variant = settings.model_copy(
            update={
                "runtime": settings.runtime.model_copy(update={"drain_timeout_s": drain}),
                "rollout": settings.rollout.model_copy(update={"keep_releases": 2}),
            }
        )
        backend = KubernetesBackend(variant, variant.only_pool, clock=clock)
        assert deploy(backend, GOOD_B).outcome == "succeeded"
        names.append(m.config_map_name(variant, render_runtime_config(variant, variant.only_pool)))
    assert sorted(cluster.cluster.config_maps) == sorted(names[-2:])
    volume = _stable(cluster, settings)["spec"]["template"]["spec"]["volumes"][0]
    assert volume["configMap"]["name"] == names[-1]


def test_an_unreachable_api_server_fails_the_deploy_with_the_reason_recorded(backend, cluster, s3):
    cluster.httpd.shutdown()
    cluster.httpd.server_close()
    with pytest.raises(RolloutFailed) as err:
        deploy(backend, GOOD_B)
    assert "Connection refused" in err.value.result.reason or "MaxRetryError" in err.value.result.reason
    (record,) = HistoryStore(s3, BUCKET, "eks-prod", "history/eks-prod/").records()
    assert record["reason"] == err.value.result.reason
