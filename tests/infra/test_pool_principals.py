"""Each pool's principal reads its own pool's weights, API-keys secret and history, and not another
pool's; the gateway, which calls every pool, reads every pool's secret: the eks-gateway stack (two
pools on EKS, a service account and role per pool) and a two-model EC2 stack (an instance role and
profile per pool), each program run under Pulumi's mocks, its rendered role documents evaluated as
AWS would, conditions included, by ``@cloud-copilot/iam-simulate`` (``tools/iam-simulate``, through
``tests/e2e/iam_simulation.py``)."""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from typing import Any

import pytest
from infra_mocks import Graph, run_program
from k8s_mocks import run_kubernetes

from frontier.config.schema import PoolSettings
from frontier.identity.cloud import Cloud
from frontier.identity.pools import principal_suffix, weights_prefix
from frontier.release.history import pool_history_prefix
from frontier.render.boot import render_cloud_init
from frontier.targets import load_stack
from frontier.targets.kubernetes.manifests import pool_service_account
from tests.e2e.iam_simulation import Call, simulate
from tests.gateway.stacks import dev_gateway_document, write_stack

ROLE = "aws:iam/role:Role"
ROLE_POLICY = "aws:iam/rolePolicy:RolePolicy"
BUCKET = "aws:s3/bucket:Bucket"
SECRET = "aws:secretsmanager/secret:Secret"
SMALL = "llama-3.1-8b-instruct"


@dataclass(frozen=True)
class Principal:
    pool: PoolSettings
    arn: str
    document: dict[str, Any]


def principals(graph: Graph, name_of: str) -> dict[str, Principal]:
    """Each pool's runtime role (``name_of`` formats its resource name with ``suffix``) and its document."""
    found = {}
    for pool in graph.settings.pools:
        name = name_of.format(stack=graph.stack, suffix=principal_suffix(graph.settings, pool))
        role = graph.one(ROLE, name)
        document = json.loads(graph.one(ROLE_POLICY, name).inputs["policy"])
        found[pool.name] = Principal(pool, role.outputs["arn"], document)
    return found


def bucket_arn(graph: Graph, purpose: str) -> str:
    return graph.one(BUCKET, f"{graph.stack}-storage-{purpose}").outputs["arn"]


def decisions(graph: Graph, found: dict[str, Principal], calls: list[Call]) -> list[str]:
    policies = {p.arn: [{"name": "runtime", "policy": p.document}] for p in found.values()}
    return [d["decision"] for d in simulate({"all": policies}, calls)["all"]]


def weights_read(graph: Graph, principal: Principal, pool: PoolSettings) -> Call:
    key = f"{bucket_arn(graph, 'weights')}/{weights_prefix(pool)}/model-00001-of-00002.safetensors"
    return Call(principal.arn, "s3:GetObject", key, (), "GetObject")


def secret_arn(graph: Graph, pool: PoolSettings) -> str:
    """The ARN of ``pool``'s API-keys secret, the one secret the stack made under its name."""
    (secret,) = [
        s.outputs["arn"]
        for s in graph.of_type(SECRET)
        if s.outputs["arn"].split(":secret:")[1].rsplit("-", 1)[0] == pool.runtime.api_keys_secret
    ]
    return str(secret)


def secret_read(graph: Graph, principal: Principal, pool: PoolSettings) -> Call:
    return Call(principal.arn, "secretsmanager:GetSecretValue", secret_arn(graph, pool), (), "GetSecretValue")


def every_secret_read_by(graph: Graph, role: str, policy: str, action: str) -> list[str]:
    """The decisions on ``action`` of each pool's secret by the role and inline policy named."""
    arn = graph.one(ROLE, role).outputs["arn"]
    document = json.loads(graph.one(ROLE_POLICY, policy).inputs["policy"])
    calls = [Call(arn, action, secret_arn(graph, pool), (), action) for pool in graph.settings.pools]
    found = simulate({"all": {arn: [{"name": policy, "policy": document}]}}, calls)["all"]
    return [d["decision"] for d in found]


def history_read(graph: Graph, principal: Principal, pool: PoolSettings) -> Call:
    prefix = pool_history_prefix(graph.settings, pool.name, f"history/{graph.stack}/")
    key = f"{bucket_arn(graph, 'history')}/{prefix}releases/r-1/manifest.json"
    return Call(principal.arn, "s3:GetObject", key, (), "GetObject")


def own_and_others(graph: Graph, found: dict[str, Principal], read) -> dict[tuple[str, str], str]:  # noqa: ANN001
    """(principal's pool, read pool) -> decision, for every pair."""
    pairs = [(p, q) for p in found for q in found]
    calls = [read(graph, found[p], found[q].pool) for p, q in pairs]
    return dict(zip(pairs, decisions(graph, found, calls), strict=True))


def allowed_exactly_on_the_diagonal(results: dict[tuple[str, str], str]) -> bool:
    return all((decision == "Allowed") == (p == q) for (p, q), decision in results.items())


# --- eks-gateway: a service account and a role per pool ------------------------------------------


@pytest.fixture(scope="module")
def eks_gateway() -> Graph:
    return run_kubernetes(load_stack("eks-gateway"))


@pytest.fixture(scope="module")
def eks_principals(eks_gateway: Graph) -> dict[str, Principal]:
    return principals(eks_gateway, "{stack}-pods{suffix}-runtime")


def test_eks_gateway_has_a_runtime_role_per_pool(eks_principals):
    assert sorted(eks_principals) == ["llama-3.1-70b-instruct", SMALL]
    assert len({p.arn for p in eks_principals.values()}) == 2


def test_each_eks_pools_service_account_is_associated_with_its_own_role(eks_gateway, eks_principals):
    associations = {
        a.inputs["serviceAccount"]: a.inputs["roleArn"]
        for a in eks_gateway.of_type("aws:eks/podIdentityAssociation:PodIdentityAssociation")
    }
    for principal in eks_principals.values():
        account = pool_service_account(eks_gateway.settings, principal.pool)
        assert associations[account] == principal.arn


def test_each_eks_pools_pods_run_as_its_own_service_account(eks_gateway, eks_principals):
    accounts = {
        d.inputs["spec"]["template"]["spec"]["serviceAccountName"]
        for d in eks_gateway.of_type("kubernetes:apps/v1:Deployment")
        if d.inputs["metadata"]["name"] != "frontier-gateway"
    }
    assert accounts == {pool_service_account(eks_gateway.settings, p.pool) for p in eks_principals.values()}
    assert len(accounts) == 2


def test_each_eks_pool_reads_its_own_weights_and_not_the_other_pools(eks_gateway, eks_principals):
    results = own_and_others(eks_gateway, eks_principals, weights_read)
    assert allowed_exactly_on_the_diagonal(results), results


def test_eks_gateway_makes_a_secret_per_pool_each_under_its_own_name(eks_gateway):
    names = sorted(s.inputs["name"] for s in eks_gateway.of_type(SECRET))
    assert names == sorted(eks_gateway.settings.api_keys_secrets.values())
    assert len(names) == 2


def test_each_eks_pool_reads_its_own_secret_and_not_the_other_pools(eks_gateway, eks_principals):
    results = own_and_others(eks_gateway, eks_principals, secret_read)
    assert allowed_exactly_on_the_diagonal(results), results


def test_the_eks_gateways_pods_read_every_pools_secret(eks_gateway):
    name = f"{eks_gateway.stack}-gw-gateway"
    assert every_secret_read_by(eks_gateway, name, name, "secretsmanager:GetSecretValue") == ["Allowed"] * 2


def test_the_eks_deploy_role_rotates_every_pools_secret(eks_gateway):
    name = f"{eks_gateway.stack}-k8s-deploy"
    assert every_secret_read_by(eks_gateway, name, name, "secretsmanager:PutSecretValue") == ["Allowed"] * 2


def test_each_eks_pools_probe_presents_its_own_pools_key(eks_gateway):
    from frontier_hostside import probe

    for job in eks_gateway.of_type("kubernetes:batch/v1:CronJob"):
        pod = job.inputs["spec"]["jobTemplate"]["spec"]["template"]["spec"]
        env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
        pool = eks_gateway.settings.pool(env[probe.MODELS_ENV])
        assert env[probe.KEY_SECRET_ENV] == pool.runtime.api_keys_secret
        assert pod["serviceAccountName"] == pool_service_account(eks_gateway.settings, pool)


# --- a two-model EC2 stack: an instance role and profile per pool ---------------------------------


def two_model_ec2_document() -> dict:
    """dev with a gateway, serving its model on its node group and an 8B model on a group of its own."""
    document = dev_gateway_document()
    config = document["config"]
    (group,) = config["frontier:node_groups"]
    small_group = {**copy.deepcopy(group), "name": "small"}
    config["frontier:node_groups"] = [group, small_group]
    model, runtime = config.pop("frontier:model"), config.pop("frontier:runtime")
    bucket = model["weights_uri"].removeprefix("s3://").split("/", 1)[0]
    small = {**copy.deepcopy(model), "name": SMALL, "weights_uri": f"s3://{bucket}/{SMALL}"}
    config["frontier:models"] = [
        {"model": model, "runtime": runtime, "node_group": group["name"]},
        {
            "model": small,
            "runtime": {**copy.deepcopy(runtime), "api_keys_secret": f"frontier/dev/{SMALL}/api-keys"},
            "node_group": "small",
        },
    ]
    config["frontier:tenants"][0]["models"] = [model["name"], SMALL]
    return document


@pytest.fixture(scope="module")
def two_model_ec2(tmp_path_factory) -> Graph:
    path = write_stack(tmp_path_factory.mktemp("stacks"), two_model_ec2_document(), "dev")
    return run_program(load_stack("dev", path=path))  # the whole EC2 program


@pytest.fixture(scope="module")
def ec2_principals(two_model_ec2: Graph) -> dict[str, Principal]:
    return principals(two_model_ec2, "{stack}-iam-runtime{suffix}")


def test_a_two_model_ec2_stack_has_a_runtime_role_and_instance_profile_per_pool(
    two_model_ec2, ec2_principals
):
    assert len({p.arn for p in ec2_principals.values()}) == 2
    profiles = {
        p.name: p.inputs["role"] for p in two_model_ec2.of_type("aws:iam/instanceProfile:InstanceProfile")
    }
    roles = {r.name: r.outputs["name"] for r in two_model_ec2.of_type(ROLE)}
    for principal in ec2_principals.values():
        name = f"{two_model_ec2.stack}-iam-runtime{principal_suffix(two_model_ec2.settings, principal.pool)}"
        assert profiles[name] == roles[name]


def test_each_ec2_pool_reads_its_own_weights_and_not_the_other_pools(two_model_ec2, ec2_principals):
    results = own_and_others(two_model_ec2, ec2_principals, weights_read)
    assert allowed_exactly_on_the_diagonal(results), results


def test_each_ec2_pools_hosts_boot_from_its_own_history_and_not_the_other_pools(
    two_model_ec2, ec2_principals
):
    results = own_and_others(two_model_ec2, ec2_principals, history_read)
    assert allowed_exactly_on_the_diagonal(results), results


def test_a_two_model_ec2_stack_makes_a_secret_per_pool_named_after_its_model(two_model_ec2):
    found = {s.name: s.inputs["name"] for s in two_model_ec2.of_type(SECRET)}
    settings = two_model_ec2.settings
    assert found == {
        f"dev-secrets-api-keys{principal_suffix(settings, pool)}": pool.runtime.api_keys_secret
        for pool in settings.pools
    }
    assert two_model_ec2.outputs["api_keys_secret_arns"] == {
        pool.name: secret_arn(two_model_ec2, pool) for pool in settings.pools
    }


def test_each_ec2_pool_reads_its_own_secret_and_not_the_other_pools(two_model_ec2, ec2_principals):
    results = own_and_others(two_model_ec2, ec2_principals, secret_read)
    assert allowed_exactly_on_the_diagonal(results), results


def test_the_ec2_gateways_hosts_read_every_pools_secret(two_model_ec2):
    decided = every_secret_read_by(
        two_model_ec2, "dev-gateway-role", "dev-gateway-policy", "secretsmanager:GetSecretValue"
    )
    assert decided == ["Allowed"] * 2


def test_the_ec2_deploy_role_rotates_every_pools_secret(two_model_ec2):
    decided = every_secret_read_by(
        two_model_ec2, "dev-iam-deploy", "dev-iam-deploy", "secretsmanager:PutSecretValue"
    )
    assert decided == ["Allowed"] * 2


def test_the_ec2_probe_reads_every_pools_secret_and_asks_each_model_with_its_own(two_model_ec2):
    from frontier_hostside import probe

    settings = two_model_ec2.settings
    env = two_model_ec2.one("aws:lambda/function:Function").inputs["environment"]["variables"]
    assert probe.key_secrets(env, env[probe.MODELS_ENV].split(",")) == {
        pool.name: secret_arn(two_model_ec2, pool) for pool in settings.pools
    }
    assert (
        every_secret_read_by(
            two_model_ec2,
            "dev-monitoring-probe-role",
            "dev-monitoring-probe-role",
            "secretsmanager:GetSecretValue",
        )
        == ["Allowed"] * 2
    )


def test_each_ec2_groups_node_env_names_its_pools_history(two_model_ec2):
    settings = two_model_ec2.settings
    for pool in settings.pools:
        user_data = render_cloud_init(settings, pool.group, history_bucket="b", history_prefix="history/dev/")
        prefix = pool_history_prefix(settings, pool.name, "history/dev/")
        assert prefix == f"history/dev/models/{pool.name}/"
        assert f"FRONTIER_HISTORY_PREFIX={prefix}" in user_data
        assert "FRONTIER_ARTIFACTS_PREFIX=history/dev/" in user_data
        assert f"s3://b/{prefix}host/{pool.group.name}/" in user_data


def test_the_eks_deploy_role_pushes_every_pools_weights_and_nothing_else_in_the_bucket(eks_gateway):
    # The pools' weights share no prefix (their root is the whole bucket): the role names each one.
    role = eks_gateway.one(ROLE, f"{eks_gateway.stack}-k8s-deploy").outputs["arn"]
    document = json.loads(eks_gateway.one(ROLE_POLICY, f"{eks_gateway.stack}-k8s-deploy").inputs["policy"])
    bucket = bucket_arn(eks_gateway, "weights")
    keys = [f"{weights_prefix(pool)}/v1/model.safetensors" for pool in eks_gateway.settings.pools]
    calls = [Call(role, "s3:PutObject", f"{bucket}/{key}", (), "PutObject") for key in [*keys, "elsewhere/x"]]
    found = simulate({"all": {role: [{"name": "deploy", "policy": document}]}}, calls)["all"]
    assert [d["decision"] for d in found] == ["Allowed", "Allowed", "ImplicitlyDenied"]


@pytest.mark.slow
def test_eks_gateway_run_as_pulumi_up_runs_it_declares_a_role_and_association_per_pool(tmp_path):
    """The same program in a fresh interpreter, as the CLI's language host runs it."""
    from test_language_host import run_as_language_host

    run = run_as_language_host("eks-gateway", tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    settings = load_stack("eks-gateway")
    for pool in settings.pools:
        name = f"{settings.stack}-pods{principal_suffix(settings, pool)}-runtime"
        assert (ROLE, name) in run.resources
        assert ("aws:eks/podIdentityAssociation:PodIdentityAssociation", name) in run.resources
    assert set(run.outputs["runtime_role_arns"]) == {pool.name for pool in settings.pools}
    assert run.outputs["runtime_role_arn"] == ""  # a stack of several models has no one runtime role
    for pool in settings.pools:
        assert (
            SECRET,
            f"{settings.stack}-secrets-api-keys{principal_suffix(settings, pool)}",
        ) in run.resources
    assert set(run.outputs["api_keys_secret_arns"]) == {pool.name for pool in settings.pools}
    assert run.outputs["api_keys_secret_arn"] == ""  # nor one secret


def test_the_ec2_gateway_writes_metering_into_the_bucket_the_stack_makes_with_its_data_key(tmp_path):
    from infra.secret_store import key_policy

    path = write_stack(tmp_path, dev_gateway_document(), "dev")
    graph = run_program(load_stack("dev", path=path))
    role = graph.one(ROLE, "dev-gateway-role").outputs["arn"]
    document = json.loads(graph.one(ROLE_POLICY, "dev-gateway-policy").inputs["policy"])
    key = graph.one("aws:kms/key:Key", "dev-secrets-key").outputs["arn"]
    metering = graph.one(BUCKET, "dev-storage-metering").outputs["arn"]
    via = (("kms:ViaService", "s3.us-west-2.amazonaws.com"),)
    calls = [
        Call(role, "s3:PutObject", f"{metering}/metering/2026/12/06/gw-1.jsonl", (), "PutObject"),
        Call(role, "kms:GenerateDataKey", key, via, "PutObject (KMS)"),
    ]
    cloud = Cloud("123456789012", "aws", "us-west-2", "amazonaws.com", (), "")
    found = simulate(
        {"all": {role: [{"name": "gateway", "policy": document}]}},
        calls,
        {key: json.loads(key_policy(cloud))},
    )["all"]
    assert [d["decision"] for d in found] == ["Allowed", "Allowed"]
