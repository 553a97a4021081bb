"""The Kubernetes stacks' Pulumi program, asserted on the resource graph it builds under mocks.

Mocked: the Pulumi engine and the AWS and Kubernetes providers (``pulumi.runtime.set_mocks``, see
``k8s_mocks``): resources are recorded with the inputs the program gives them; nothing is created.
"""

from __future__ import annotations

import contextvars
import ipaddress
import json
from typing import Any

import pytest
import yaml
from infra_mocks import Graph, _run
from k8s_mocks import CA_DATA, EKS_ENDPOINT, OIDC_ISSUER, EksMocks, run_kubernetes
from pulumi.runtime import rpc
from pulumi.runtime.mocks import MockResourceArgs

from frontier import project
from frontier.config.schema import Settings
from frontier.render.host import render_runtime_config
from frontier.targets import load_stack
from frontier.targets.kubernetes import gateway as gw
from frontier.targets.kubernetes import leader_workers as lw
from frontier.targets.kubernetes import manifests as m
from frontier.targets.kubernetes.monitoring import DCGM_NAME, monitoring_objects
from frontier.targets.kubernetes.network import control_plane_subnets, public_range
from infra.addons import CHARTS, GPU_NODE_LABEL, LB_CLUSTER_TAG, LB_CONTROLLER_SERVICE_ACCOUNT
from infra.program import build
from infra.workloads import (
    LB_ATTRIBUTES,
    NOT_APPLIED,
    REPLICA_KEY_LENGTH,
    SKIP_AWAIT,
    WAF_ACL_ANNOTATION,
    applied_logging_objects,
    applied_monitoring_objects,
    monitoring_namespace,
    release_digest,
)

HELM_RELEASE = "kubernetes:helm.sh/v3:Release"

EXISTING = {
    "mode": "existing",
    "kubeconfig": "~/.kube/config",
    "context": "prod",
    "api_server_cidrs": ["10.60.240.0/28"],
}


def _plain(value: Any) -> Any:
    """Mocks hand numbers back as floats: compare whole numbers as ints."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


@pytest.fixture(scope="module")
def eks() -> Graph:
    return run_kubernetes(load_stack("eks-prod"))


def _variant(tmp_path, changes: dict[str, Any]) -> Settings:
    document = yaml.safe_load((project.stacks_dir() / "Pulumi.eks-prod.yaml").read_text())
    block = document["config"]["frontier:kubernetes"]
    for key, value in changes.items():
        section, _, field = key.rpartition(".")
        (block[section] if section else block)[field] = value
    path = tmp_path / "Pulumi.eks-prod.yaml"
    path.write_text(yaml.safe_dump(document))
    return load_stack("eks-prod", path=path)


def _policy(resource) -> dict:
    policy = resource.inputs["policy"]
    return json.loads(policy) if isinstance(policy, str) else policy


def test_the_eks_cluster_is_private_encrypted_logged_and_in_its_own_subnets(eks):
    settings = eks.settings
    cluster = eks.one("aws:eks/cluster:Cluster")
    inputs = cluster.inputs
    assert inputs["name"] == "frontier-eks-prod" and inputs["version"] == "1.33"
    vpc = inputs["vpcConfig"]
    assert vpc["endpointPrivateAccess"] is True and vpc["endpointPublicAccess"] is False
    subnets = [eks.by_id(i) for i in vpc["subnetIds"]]
    assert sorted(s.inputs["cidrBlock"] for s in subnets) == sorted(
        control_plane_subnets(settings.network.vpc_cidr)
    )
    assert len({s.inputs["availabilityZone"] for s in subnets}) == 2
    assert inputs["encryptionConfig"]["resources"] == ["secrets"]
    key = next(k for k in eks.of_type("aws:kms/key:Key") if k.name.endswith("-secrets-key"))
    assert inputs["encryptionConfig"]["provider"]["keyArn"] == key.outputs["arn"]
    assert inputs["enabledClusterLogTypes"] == ["api", "audit", "authenticator"]
    assert inputs["accessConfig"]["authenticationMode"] == "API"


def test_the_cni_enforces_network_policies_and_pod_identity_runs(eks):
    addons = {a.inputs["addonName"]: a.inputs for a in eks.of_type("aws:eks/addon:Addon")}
    assert json.loads(addons["vpc-cni"]["configurationValues"]) == {"enableNetworkPolicy": "true"}
    assert "eks-pod-identity-agent" in addons


def _node_group(graph: Graph, pool: str) -> Any:
    return next(
        g
        for g in graph.of_type("aws:eks/nodeGroup:NodeGroup")
        if g.inputs["nodeGroupName"] == f"eks-prod-{pool}"
    )


def test_gpu_node_groups_run_the_nvidia_ami_with_taints_labels_and_imdsv2(eks):
    settings = eks.settings
    group, pool = settings.serving_group, settings.kubernetes.node_pools[0]
    nodes = _node_group(eks, pool.name)
    inputs = _plain(nodes.inputs)
    assert inputs["amiType"] == "AL2023_x86_64_NVIDIA"
    assert inputs["instanceTypes"] == ["p5.48xlarge"]
    assert inputs["scalingConfig"] == {
        "minSize": group.min_size,
        "desiredSize": group.desired_size,
        "maxSize": group.max_size,
    }
    assert inputs["labels"] == pool.labels | {GPU_NODE_LABEL: "true"}
    assert inputs["taints"] == [{"key": "nvidia.com/gpu", "value": "present", "effect": "NO_SCHEDULE"}]
    subnets = [eks.by_id(i).inputs["cidrBlock"] for i in inputs["subnetIds"]]
    vpc = ipaddress.ip_network(settings.network.vpc_cidr)
    first_half = next(vpc.subnets(prefixlen_diff=1))
    assert all(ipaddress.ip_network(c).subnet_of(first_half) for c in subnets)  # private tier
    template = _plain(eks.by_id(inputs["launchTemplate"]["id"]).inputs)
    assert template["metadataOptions"] == {
        "httpEndpoint": "enabled",
        "httpTokens": "required",
        "httpPutResponseHopLimit": 1,
    }
    ebs = template["blockDeviceMappings"][0]["ebs"]
    assert ebs["encrypted"] == "true" and ebs["volumeSize"] == group.root_volume_gb + group.cache_volume_gb


def test_the_node_role_has_the_eks_node_policies(eks):
    node_role = next(r for r in eks.of_type("aws:iam/role:Role") if r.name == "eks-prod-eks-node")
    attached = sorted(
        a.inputs["policyArn"].rsplit("/", 1)[1]
        for a in eks.of_type("aws:iam/rolePolicyAttachment:RolePolicyAttachment")
        if a.inputs["role"] == node_role.outputs["name"]
    )
    assert attached == [
        "AmazonEC2ContainerRegistryReadOnly",
        "AmazonEKSWorkerNodePolicy",
        "AmazonEKS_CNI_Policy",
    ]


def test_the_runtime_pods_assume_a_least_privilege_role_through_pod_identity(eks):
    settings = eks.settings
    role = next(r for r in eks.of_type("aws:iam/role:Role") if r.name == "eks-prod-pods-runtime")
    trust = json.loads(role.inputs["assumeRolePolicy"])["Statement"][0]
    assert trust["Principal"] == {"Service": "pods.eks.amazonaws.com"}
    assert trust["Action"] == ["sts:AssumeRole", "sts:TagSession"]
    policy = _policy(eks.one("aws:iam/rolePolicy:RolePolicy", "eks-prod-pods-runtime"))
    sids = {s["Sid"]: s for s in policy["Statement"]}
    assert set(sids) == {
        "ReadItsModelWeights",
        "KeepItsPreparedWeights",
        "KeepItsCompiledKernels",
        "ReadItsApiKeys",
        "DecryptWeightsAndSecret",
        "EncryptWhatItWrites",
        "WriteItsLogs",
        "PutRuntimeMetrics",
    }
    assert (
        sids["ReadItsModelWeights"]["Resource"]
        == "arn:aws:s3:::frontier-eks-prod-weights-123456789012-us-east-1/llama-3.1-70b-instruct/*"
    )
    secret = eks.one("aws:secretsmanager/secret:Secret")
    assert sids["ReadItsApiKeys"]["Resource"] == secret.outputs["arn"]
    association = eks.one("aws:eks/podIdentityAssociation:PodIdentityAssociation", "eks-prod-pods-runtime")
    assert association.inputs["namespace"] == settings.kubernetes.namespace
    assert association.inputs["serviceAccount"] == settings.kubernetes.service_account
    assert association.inputs["roleArn"] == role.outputs["arn"]
    assert association.inputs["clusterName"] == "frontier-eks-prod"


def test_the_deploy_role_reaches_history_and_only_its_namespace(eks):
    policy = _policy(eks.one("aws:iam/rolePolicy:RolePolicy", "eks-prod-k8s-deploy"))
    sids = {s["Sid"]: s for s in policy["Statement"]}
    assert set(sids) == {
        "ReadWriteDeployHistoryAndLocks",
        "ListDeployHistory",
        "ListDeployHistoryVersions",
        "ReadDeployHistoryVersions",
        "ListTheBackupCopy",
        "ReadTheBackupCopy",
        "DecryptTheBackupCopy",
        "PushModelWeights",
        "ListModelWeights",
        "CollectUnusedModelWeights",
        "EncryptHistoryAndWeights",
        "PushRuntimeImages",
        "LogInToTheRegistry",
        "SeeItsCluster",
        "SignReleases",
        "RotateItsApiKeys",
    }
    assert sids["SeeItsCluster"]["Resource"] == "arn:aws:eks:us-east-1:123456789012:cluster/frontier-eks-prod"
    # `fab keys.rotate` and the canary's key: the pool's own secret, no other.
    (secret,) = eks.of_type("aws:secretsmanager/secret:Secret")
    assert sids["RotateItsApiKeys"]["Resource"] == secret.outputs["arn"]
    assert sids["ReadWriteDeployHistoryAndLocks"]["Resource"].endswith("/history/eks-prod/*")
    deploy = eks.one("aws:iam/role:Role", "eks-prod-k8s-deploy")
    # In the cluster it is a member of the group the stack's Role binds (deploy_access.py), no more.
    entry = eks.one("aws:eks/accessEntry:AccessEntry")
    assert entry.inputs["principalArn"] == deploy.outputs["arn"]
    assert entry.inputs["kubernetesGroups"] == ["frontier:deploy"]
    assert not eks.of_type("aws:eks/accessPolicyAssociation:AccessPolicyAssociation")


def test_public_subnets_are_tagged_for_the_load_balancer_controller(eks):
    tags = [t for t in eks.of_type("aws:ec2/tag:Tag") if t.inputs["key"] == "kubernetes.io/role/elb"]
    assert len(tags) == eks.settings.network.availability_zones
    for tag in tags:
        assert tag.inputs["value"] == "1"
        cidr = ipaddress.ip_network(eks.by_id(tag.inputs["resourceId"]).inputs["cidrBlock"])
        assert cidr.subnet_of(ipaddress.ip_network(public_range(eks.settings.network.vpc_cidr)))


def test_the_provider_talks_to_the_new_cluster_with_an_eks_token(eks):
    provider = eks.one("pulumi:providers:kubernetes")
    kubeconfig = json.loads(provider.inputs["kubeconfig"])
    cluster = kubeconfig["clusters"][0]["cluster"]
    assert cluster == {"server": EKS_ENDPOINT, "certificate-authority-data": CA_DATA}
    assert kubeconfig["users"][0]["user"]["exec"]["args"][:4] == [
        "eks",
        "get-token",
        "--cluster-name",
        "frontier-eks-prod",
    ]


def test_every_rendered_object_is_a_typed_resource_with_the_rendered_properties(eks):
    """The workloads on the graph are exactly the renderer's objects (no Helm, no YAML groups)."""
    settings = eks.settings
    workload = m.render_workload(settings, release_digest(settings))
    rendered = [
        *workload.all(),
        monitoring_namespace(settings),
        *applied_monitoring_objects(settings),
        *applied_logging_objects(settings),
    ]
    k8s_resources = [r for r in eks.resources if r.type.startswith("kubernetes:") and r.type != HELM_RELEASE]
    assert len(k8s_resources) == len(rendered)
    by_name = {(r.type.rsplit(":", 1)[1], r.inputs["metadata"]["name"]): r for r in k8s_resources}
    for manifest in rendered:
        resource = by_name[(manifest.kind, manifest.name)]
        group_version = "core/v1" if manifest.api_version == "v1" else manifest.api_version
        assert resource.type == f"kubernetes:{group_version}:{manifest.kind}"
        expected = manifest.to_dict()
        metadata = _plain(resource.inputs["metadata"])
        if manifest.kind == "Ingress":  # Pulumi adds the access-log bucket it made (see below)
            attributes = metadata["annotations"][LB_ATTRIBUTES]
            assert attributes.startswith(manifest.annotations[LB_ATTRIBUTES] + ",access_logs.s3.enabled=true")
            metadata["annotations"][LB_ATTRIBUTES] = manifest.annotations[LB_ATTRIBUTES]
            # ... and the web ACL it made for the stack's rate limit.
            assert (
                metadata["annotations"].pop(WAF_ACL_ANNOTATION)
                == eks.one("aws:wafv2/webAcl:WebAcl").outputs["arn"]
            )
        if manifest.kind == "Deployment":
            assert metadata["annotations"].pop(SKIP_AWAIT) == "true"
            if not metadata["annotations"]:
                metadata.pop("annotations")
        assert metadata == expected["metadata"]
        for field, value in manifest.body.items():
            assert _plain(resource.inputs[field]) == _plain(value), (manifest.kind, field)


def test_the_workloads_carry_every_runtime_property(eks):
    """Spot checks of the Deployment as Pulumi would send it."""
    settings = eks.settings
    deployment = next(r for r in eks.resources if r.type == "kubernetes:apps/v1:Deployment")
    pod = _plain(deployment.inputs["spec"]["template"])
    container = pod["spec"]["containers"][0]
    assert container["image"].endswith("@" + release_digest(settings))
    assert container["resources"]["requests"] == container["resources"]["limits"]
    assert container["resources"]["requests"] == {
        "nvidia.com/gpu": "8",
        **m.cpu_and_memory(settings, settings.only_pool),
    }
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    sleep = int(container["lifecycle"]["preStop"]["exec"]["command"][1])
    assert sleep >= settings.rollout.deregistration_delay_s
    assert pod["spec"]["terminationGracePeriodSeconds"] >= sleep + settings.runtime.drain_timeout_s
    assert pod["spec"]["nodeSelector"] == settings.kubernetes.node_pools[0].labels
    config = next(
        r
        for r in eks.resources
        if r.type == "kubernetes:core/v1:ConfigMap"
        and r.inputs["metadata"]["name"].startswith(m.app_name(settings))
    )
    assert config.inputs["data"]["runtime.yaml"] == render_runtime_config(settings, settings.only_pool)
    assert pod["spec"]["volumes"][0]["configMap"]["name"] == config.inputs["metadata"]["name"]
    sa = next(r for r in eks.resources if r.type == "kubernetes:core/v1:ServiceAccount")
    assert sa.inputs["automountServiceAccountToken"] is False


def test_irsa_trusts_only_the_runtime_service_account(tmp_path):
    graph = run_kubernetes(_variant(tmp_path, {"identity": "irsa"}))
    provider = graph.one("aws:iam/openIdConnectProvider:OpenIdConnectProvider")
    assert provider.inputs["url"] == OIDC_ISSUER and provider.inputs["clientIdLists"] == ["sts.amazonaws.com"]
    role = next(r for r in graph.of_type("aws:iam/role:Role") if r.name == "eks-prod-pods-runtime")
    statement = json.loads(role.inputs["assumeRolePolicy"])["Statement"][0]
    host = OIDC_ISSUER.removeprefix("https://")
    assert statement["Action"] == "sts:AssumeRoleWithWebIdentity"
    assert statement["Principal"] == {"Federated": provider.outputs["arn"]}
    assert (
        statement["Condition"]["StringEquals"][f"{host}:sub"]
        == "system:serviceaccount:frontier-prod:frontier-runtime"
    )
    runtime_account = m.pool_service_account(graph.settings, graph.settings.pools[0])
    sa = next(
        r
        for r in graph.of_type("kubernetes:core/v1:ServiceAccount")
        if r.inputs["metadata"]["name"] == runtime_account
    )
    assert sa.inputs["metadata"]["annotations"] == {"eks.amazonaws.com/role-arn": role.outputs["arn"]}
    assert not graph.of_type("aws:eks/podIdentityAssociation:PodIdentityAssociation")


def test_an_existing_cluster_gets_only_the_workloads_and_the_stacks_aws_resources(tmp_path):
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("apiVersion: v1\nkind: Config\n")
    changes = {f"cluster.{k}": v for k, v in EXISTING.items()} | {
        "cluster.kubeconfig": str(kubeconfig),
        "runtime_role_arn": "arn:aws:iam::123456789012:role/frontier-runtime",
        "ingress.source_cidrs": ["10.60.128.0/20"],
    }
    graph = run_kubernetes(_variant(tmp_path, changes))
    for absent in ("aws:eks/cluster:Cluster", "aws:eks/nodeGroup:NodeGroup", "aws:ec2/vpc:Vpc"):
        assert not graph.of_type(absent), absent
    provider = graph.one("pulumi:providers:kubernetes")
    assert (provider.inputs["kubeconfig"], provider.inputs["context"]) == (str(kubeconfig), "prod")
    association = graph.one(
        "aws:eks/podIdentityAssociation:PodIdentityAssociation", f"{graph.stack}-pods-runtime"
    )
    assert association.inputs["roleArn"] == "arn:aws:iam::123456789012:role/frontier-runtime"
    assert graph.of_type("aws:s3/bucket:Bucket") and graph.of_type("aws:ecr/repository:Repository")
    # The workload's objects, the Prometheus stack's part in that stack's own namespace, and the pods'
    # log shipper's.
    rendered = m.render_workload(graph.settings, release_digest(graph.settings)).all()
    expected = (
        len(rendered)
        + len(applied_monitoring_objects(graph.settings))
        + len(applied_logging_objects(graph.settings))
    )
    assert len([r for r in graph.resources if r.type.startswith("kubernetes:")]) == expected
    assert not [r for r in graph.resources if r.name.endswith("-monitoring-namespace")]


def test_an_existing_cluster_without_its_kubeconfig_is_refused_before_anything_is_created(tmp_path):
    from infra.errors import ProvisionError

    changes = {f"cluster.{k}": v for k, v in EXISTING.items()} | {
        "cluster.kubeconfig": str(tmp_path / "missing"),
        "runtime_role_arn": "arn:aws:iam::123456789012:role/frontier-runtime",
        "ingress.source_cidrs": ["10.60.128.0/20"],
    }
    with pytest.raises(ProvisionError, match=r"kubernetes.cluster.kubeconfig = .*missing': no such file"):
        run_kubernetes(_variant(tmp_path, changes))


def test_the_outputs_tell_fab_where_the_history_and_the_workload_are(eks):
    outputs = eks.outputs
    assert outputs["history_prefix"] == "history/eks-prod/"
    assert outputs["namespace"] == "frontier-prod"
    assert outputs["deployment"] == m.app_name(eks.settings)
    assert outputs["cluster_name"] == "frontier-eks-prod"
    assert outputs["endpoint"] == "https://api.eks-prod.frontier.example"


def test_every_resource_is_a_child_of_a_frontier_component_named_after_it(eks):
    components = {(r.type, r.name) for r in eks.resources if not r.custom}
    for resource in eks.resources:
        if resource.custom:
            assert resource.parent_types and resource.parent_types[0].startswith("frontier:"), resource.urn
            parent = resource.parent_types[-1]
            assert any(t == parent and resource.name.startswith(f"{n}-") for t, n in components), (
                resource.name
            )


def test_the_kubernetes_objects_use_the_clusters_provider(eks):
    provider = eks.one("pulumi:providers:kubernetes")
    assert provider.parent_types == ["frontier:kubernetes:EksCluster"]
    assert provider.inputs["enableServerSideApply"] in (True, "true")


def test_the_entry_point_exports_what_fab_reads_for_a_kubernetes_stack():
    graph = run_kubernetes(load_stack("eks-prod"), entry_point=True)
    for key in ("history_bucket", "history_prefix", "endpoint", "namespace", "deployment", "cluster_name"):
        assert graph.outputs[key], key
    assert "target_group_arn" not in graph.outputs  # nothing of the EC2 edge on this target


def test_the_alb_logs_to_the_stacks_access_log_bucket(eks):
    ingress = next(r for r in eks.resources if r.type == "kubernetes:networking.k8s.io/v1:Ingress")
    bucket = next(
        b
        for b in eks.of_type("aws:s3/bucket:Bucket")
        if b.inputs["tags"]["frontier:purpose"] == "access-logs"
    )
    attributes = dict(
        a.split("=", 1) for a in ingress.inputs["metadata"]["annotations"][LB_ATTRIBUTES].split(",")
    )
    assert attributes["access_logs.s3.enabled"] == "true"
    assert attributes["access_logs.s3.bucket"] == bucket.outputs["bucket"]
    assert attributes["access_logs.s3.prefix"] == "alb"
    assert attributes["idle_timeout.timeout_seconds"] == str(eks.settings.edge.idle_timeout_s)


def test_the_stack_key_admits_the_auto_scaling_service_linked_role_to_encrypt_root_volumes(eks):
    # A managed node group's hosts are launched by the auto scaling service-linked role: with a root
    # volume encrypted by a customer managed key, the key's policy must let that role use the key and
    # grant its use to EBS (an IAM policy cannot: the role's own policy is AWS's), or every launch fails.
    key = next(k for k in eks.of_type("aws:kms/key:Key") if k.name.endswith("-secrets-key"))
    for template in eks.of_type("aws:ec2/launchTemplate:LaunchTemplate"):  # GPU pools and the system pool
        [root] = template.inputs["blockDeviceMappings"]
        assert root["ebs"]["kmsKeyId"] == key.outputs["arn"]
    role = "arn:aws:iam::123456789012:role/aws-service-role/autoscaling.amazonaws.com/AWSServiceRoleForAutoScaling"
    statements = [s for s in json.loads(key.inputs["policy"])["Statement"] if s["Principal"] == {"AWS": role}]
    use = [s for s in statements if "Condition" not in s]
    grant = [s for s in statements if "Condition" in s]
    assert [(s["Effect"], sorted(s["Action"]), s["Resource"]) for s in use] == [
        (
            "Allow",
            ["kms:Decrypt", "kms:DescribeKey", "kms:Encrypt", "kms:GenerateDataKey*", "kms:ReEncrypt*"],
            "*",
        )
    ]
    assert [(s["Effect"], s["Action"], s["Resource"], s["Condition"]) for s in grant] == [
        ("Allow", "kms:CreateGrant", "*", {"Bool": {"kms:GrantIsForAWSResource": "true"}})
    ]


# --- the cluster's add-ons and its system node group ------------------------------------------------


def _release(graph: Graph, key: str) -> Any:
    return next(r for r in graph.of_type(HELM_RELEASE) if r.inputs["name"] == key)


def _workload(graph: Graph, kind: str) -> Any:
    return next(r for r in graph.resources if r.type.endswith(f":{kind}") and r.type != HELM_RELEASE)


def test_no_gpu_workload_is_created_before_the_device_plugin_advertises_gpus(eks):
    # The kubelet offers nvidia.com/gpu only once the device plugin registers it: a pod requesting
    # GPUs before that stays Pending.
    plugin = _release(eks, "device-plugin")
    assert plugin.urn in _workload(eks, "Deployment").dependencies


def test_the_device_plugin_runs_on_the_gpu_nodes_through_their_taints(eks):
    values = _plain(_release(eks, "device-plugin").inputs["values"])
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in values["tolerations"]
    [term] = values["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert term["matchExpressions"] == [{"key": GPU_NODE_LABEL, "operator": "In", "values": ["true"]}]


def test_the_ingress_service_and_pods_wait_for_the_load_balancer_controllers_webhooks(eks):
    # The controller serves the alb Ingress class, fails Service creation closed while its webhook is
    # down, and injects the pods' ALB readiness gates only if it runs when they are created.
    controller = _release(eks, "load-balancer-controller")
    for kind in ("Ingress", "Service", "Deployment"):
        assert controller.urn in _workload(eks, kind).dependencies, kind


def test_a_scaled_object_is_created_only_after_keda_installs_its_crd(eks):
    assert _release(eks, "keda").urn in _workload(eks, "ScaledObject").dependencies


def test_service_monitors_and_rules_are_created_only_after_the_prometheus_operator_crds(eks):
    crds = _release(eks, "prometheus-crds")
    for kind in ("ServiceMonitor", "PrometheusRule"):
        assert crds.urn in _workload(eks, kind).dependencies, kind


def test_every_addon_is_a_pinned_chart_from_one_table(eks):
    releases = eks.of_type(HELM_RELEASE)
    # LWS: only on a cluster with a replica over several nodes (test_the_lws_controller_is_...); the
    # termination handler only where a node group buys spot (tests/kubernetes/test_spot_nodes.py).
    only_some = ("lws", "node-termination-handler")
    assert sorted(r.inputs["name"] for r in releases) == sorted(c for c in CHARTS if c not in only_some)
    for release in releases:
        chart = CHARTS[release.inputs["name"]]
        assert release.inputs["chart"] == chart.chart and release.inputs["version"] == chart.version
        assert release.inputs["repositoryOpts"]["repo"] == chart.repository
        assert release.inputs["namespace"] == chart.namespace
        assert all(part.isdigit() for part in chart.version.split(".")), chart  # no ranges, no "latest"


def test_the_addons_wait_for_the_untainted_system_nodes_they_run_on(eks):
    system = _node_group(eks, "system")
    agent = next(
        a for a in eks.of_type("aws:eks/addon:Addon") if a.inputs["addonName"] == "eks-pod-identity-agent"
    )
    for release in eks.of_type(HELM_RELEASE):
        assert {system.urn, agent.urn} <= release.dependencies, release.name


def test_the_system_node_group_is_untainted_cpu_and_the_gpu_groups_keep_their_taint(eks):
    k = eks.settings.kubernetes
    system = _plain(_node_group(eks, "system").inputs)
    assert system["amiType"] == "AL2023_x86_64_STANDARD"
    assert system["instanceTypes"] == [k.system_pool.instance_type]
    assert not system.get("taints")
    assert system["scalingConfig"]["minSize"] == k.system_pool.min_size >= 2
    for pool in k.node_pools:
        taints = _plain(_node_group(eks, pool.name).inputs)["taints"]
        assert {"key": "nvidia.com/gpu", "value": "present", "effect": "NO_SCHEDULE"} in taints


def test_the_gpu_root_volume_reads_at_the_pools_throughput_with_the_iops_gp3_requires(eks):
    # gp3 caps throughput at 0.25 MiB/s per provisioned IOPS: 1000 MiB/s needs 4000 IOPS.
    pool = eks.settings.kubernetes.node_pools[0]
    template = eks.by_id(_node_group(eks, pool.name).inputs["launchTemplate"]["id"])
    ebs = _plain(template.inputs["blockDeviceMappings"][0]["ebs"])
    assert ebs["throughput"] == pool.root_volume_throughput_mibps == 1000
    assert ebs["iops"] == 4000


def test_the_load_balancer_controller_changes_only_what_it_tagged_with_this_cluster(eks):
    role = next(r for r in eks.of_type("aws:iam/role:Role") if r.name == "eks-prod-addons-lb-controller")
    assert json.loads(role.inputs["assumeRolePolicy"])["Statement"][0]["Principal"] == {
        "Service": "pods.eks.amazonaws.com"
    }
    [policy] = [p for p in eks.of_type("aws:iam/rolePolicy:RolePolicy") if p.name == role.name]
    statements = {s["Sid"]: s for s in _policy(policy)["Statement"]}
    for sid in ("ChangeItsSecurityGroups", "ChangeItsLoadBalancers"):
        assert statements[sid]["Condition"] == {
            "StringEquals": {f"aws:ResourceTag/{LB_CLUSTER_TAG}": "frontier-eks-prod"}
        }
    assert statements["CreateTaggedLoadBalancers"]["Condition"] == {
        "StringEquals": {f"aws:RequestTag/{LB_CLUSTER_TAG}": "frontier-eks-prod"}
    }
    for statement in statements.values():
        actions = statement["Action"]
        assert not any(a.endswith("*") for a in actions), statement["Sid"]
        resources = (
            statement["Resource"] if isinstance(statement["Resource"], list) else [statement["Resource"]]
        )
        if any(not a.split(":")[1].startswith(("Describe", "List", "Get")) for a in actions):
            assert statement.get("Condition") or all(r != "*" for r in resources), statement["Sid"]
    association = next(
        a
        for a in eks.of_type("aws:eks/podIdentityAssociation:PodIdentityAssociation")
        if a.inputs["serviceAccount"] == LB_CONTROLLER_SERVICE_ACCOUNT
    )
    assert association.inputs["namespace"] == "kube-system"
    assert association.inputs["roleArn"] == role.outputs["arn"]
    assert association.urn in _release(eks, "load-balancer-controller").dependencies


def test_with_irsa_the_log_shipper_trusts_only_its_service_account(tmp_path):
    graph = run_kubernetes(_variant(tmp_path, {"identity": "irsa"}))
    role = graph.one("aws:iam/role:Role", "eks-prod-logs-shipper")
    condition = json.loads(role.inputs["assumeRolePolicy"])["Statement"][0]["Condition"]["StringEquals"]
    host = OIDC_ISSUER.removeprefix("https://")
    assert condition[f"{host}:sub"] == "system:serviceaccount:frontier-logging:frontier-fluent-bit"
    sa = next(
        r
        for r in graph.of_type("kubernetes:core/v1:ServiceAccount")
        if r.inputs["metadata"]["name"] == "frontier-fluent-bit"
    )
    assert sa.inputs["metadata"]["annotations"] == {"eks.amazonaws.com/role-arn": role.outputs["arn"]}


def test_with_irsa_the_load_balancer_controller_trusts_only_its_service_account(tmp_path):
    graph = run_kubernetes(_variant(tmp_path, {"identity": "irsa"}))
    role = next(r for r in graph.of_type("aws:iam/role:Role") if r.name == "eks-prod-addons-lb-controller")
    condition = json.loads(role.inputs["assumeRolePolicy"])["Statement"][0]["Condition"]["StringEquals"]
    host = OIDC_ISSUER.removeprefix("https://")
    assert condition[f"{host}:sub"] == f"system:serviceaccount:kube-system:{LB_CONTROLLER_SERVICE_ACCOUNT}"
    values = _plain(_release(graph, "load-balancer-controller").inputs["values"])
    assert values["serviceAccount"]["annotations"] == {"eks.amazonaws.com/role-arn": role.outputs["arn"]}


# --- a gateway and two model pools; the Prometheus stack's part -------------------------------------


@pytest.fixture(scope="module")
def eks_gateway() -> Graph:
    return run_kubernetes(load_stack("eks-gateway"))


def _k8s(graph: Graph, kind: str) -> dict[str, Any]:
    """The graph's Kubernetes objects of ``kind``, by their object name."""
    return {
        r.inputs["metadata"]["name"]: r
        for r in graph.resources
        if r.type.endswith(f":{kind}") and r.type.startswith("kubernetes:") and r.type != HELM_RELEASE
    }


def test_every_pool_and_the_gateway_get_their_objects(eks_gateway):
    settings = eks_gateway.settings
    workload = m.render_workload(settings, release_digest(settings))
    deployments = _k8s(eks_gateway, "Deployment")
    assert set(deployments) == {*(p.deployment.name for p in workload.pools), gw.GATEWAY_NAME}
    for kind in ("Service", "PodDisruptionBudget"):
        assert set(_k8s(eks_gateway, kind)) >= {*(p.deployment.name for p in workload.pools), gw.GATEWAY_NAME}
    assert set(_k8s(eks_gateway, "ScaledObject")) == {p.deployment.name for p in workload.pools}
    ingress = _plain(next(iter(_k8s(eks_gateway, "Ingress").values())).inputs["spec"])
    assert ingress["rules"][0]["http"]["paths"][0]["backend"]["service"]["name"] == gw.GATEWAY_NAME


def test_pulumi_leaves_pool_releases_to_fab_deploy_but_rolls_the_gateway_itself(eks_gateway):
    deployments = _k8s(eks_gateway, "Deployment")
    gateway = deployments.pop(gw.GATEWAY_NAME)
    assert gateway.ignored_changes == []  # a changed gateway.yaml is a changed template: it rolls
    for name, runtime in deployments.items():
        assert runtime.ignored_changes == ["spec.template", "spec.replicas"], name
    config = gateway.inputs["spec"]["template"]["spec"]["volumes"][0]["configMap"]["name"]
    assert config in _k8s(eks_gateway, "ConfigMap")


def test_the_gateway_reads_only_its_tenants_and_runtimes_keys_and_writes_only_its_metering(eks_gateway):
    settings = eks_gateway.settings
    role = next(r for r in eks_gateway.of_type("aws:iam/role:Role") if r.name == "eks-gateway-gw-gateway")
    trust = json.loads(role.inputs["assumeRolePolicy"])["Statement"][0]
    assert trust["Principal"] == {"Service": "pods.eks.amazonaws.com"}
    policy = next(
        p for p in eks_gateway.of_type("aws:iam/rolePolicy:RolePolicy") if p.name == "eks-gateway-gw-gateway"
    )
    statements = {s["Sid"]: s for s in _policy(policy)["Statement"]}
    secrets = {
        r.split(":secret:")[1].removesuffix("-??????") for r in statements["ReadKeyDigests"]["Resource"]
    }
    assert secrets == {t.api_key_secret for t in settings.tenants} | {
        p.runtime.api_keys_secret for p in settings.pools
    }
    assert (
        statements["WriteMetering"]["Resource"]
        == "arn:aws:s3:::frontier-eks-gateway-metering-123456789012-us-east-1/metering/*"
    )
    assert statements["DecryptSecrets"]["Condition"]["StringEquals"]["kms:ViaService"].startswith(
        "secretsmanager."
    )
    association = next(
        a
        for a in eks_gateway.of_type("aws:eks/podIdentityAssociation:PodIdentityAssociation")
        if a.inputs["serviceAccount"] == gw.GATEWAY_SERVICE_ACCOUNT
    )
    assert association.inputs["namespace"] == settings.kubernetes.namespace
    assert association.inputs["roleArn"] == role.outputs["arn"]


def test_the_monitoring_objects_are_applied_in_the_prometheus_namespace(eks):
    settings = eks.settings
    namespace = settings.kubernetes.monitoring.prometheus_namespace
    created = next(r for r in eks.resources if r.name == "eks-prod-runtime-monitoring-namespace")
    assert created.inputs["metadata"]["name"] == namespace
    applied = applied_monitoring_objects(settings)
    assert {(m.kind, m.name) for m in applied} == {
        ("Service", DCGM_NAME),
        ("ServiceMonitor", DCGM_NAME),
        ("PrometheusRule", "frontier-eks-prod-resource-alerts"),
        ("AlertmanagerConfig", "frontier-eks-prod-alert-routes"),
        ("ConfigMap", "frontier-eks-prod-dashboard"),
    }
    for manifest in applied:
        (resource,) = [
            r
            for r in eks.resources
            if r.type.endswith(f":{manifest.kind}")
            and r.inputs["metadata"]["name"] == manifest.name
            and r.inputs["metadata"].get("namespace") == manifest.namespace
        ]
        if manifest.namespace == namespace:
            assert created.urn in resource.dependencies, manifest.name


def test_the_gpu_exporter_daemonset_is_not_applied_while_the_policy_pack_refuses_node_agents(eks):
    # hostPath (the kubelet's pod-resources socket), root, SYS_ADMIN, an image by tag: what the
    # mandatory k8s-no-privileged-pods and k8s-images-by-digest refuse. `fab render` writes it.
    (daemon_set,) = [o for o in monitoring_objects(eks.settings) if o.kind == "DaemonSet"]
    assert ("DaemonSet", daemon_set.name) in NOT_APPLIED
    assert not eks.of_type("kubernetes:apps/v1:DaemonSet")
    assert any(
        "daemonset-frontier-dcgm-exporter" in f for f in m.manifest_files(eks.settings, "sha256:" + "ab" * 32)
    )


def test_alert_routes_wait_for_the_prometheus_operator_crds_like_rules_do(eks):
    crds = _release(eks, "prometheus-crds")
    (routes,) = _k8s(eks, "AlertmanagerConfig").values()
    assert crds.urn in routes.dependencies


def test_every_policy_rule_passes_on_the_gateway_stacks_resources(eks_gateway):
    # The policy pack's rules, mandatory and advisory, over the gateway stack's whole graph.
    from test_policy import BY_NAME, graph_violations, unexplained

    found = {name: unexplained(name, graph_violations(rule, eks_gateway)) for name, rule in BY_NAME.items()}
    assert {name: v for name, v in found.items() if v} == {}


# --- a replica over several nodes (eks-multinode: a LeaderWorkerSet per such pool) ----------------------


PASSWORD = "random:index/randomPassword:RandomPassword"
REPLICA_KEY = "k" * REPLICA_KEY_LENGTH  # what the random provider would make


class ReplicaKeyMocks(EksMocks):
    """EKS's mocks, plus the value the random provider computes at creation."""

    def new_resource(self, args: MockResourceArgs) -> tuple[str, dict[str, Any]]:
        resource_id, outputs = super().new_resource(args)
        if args.typ == PASSWORD:
            outputs["result"] = REPLICA_KEY
        return resource_id, outputs


@pytest.fixture(scope="module")
def eks_multinode() -> Graph:
    settings = load_stack("eks-multinode")
    return contextvars.Context().run(_run, settings, build, ReplicaKeyMocks(settings.region))


def test_the_lws_controller_is_a_pinned_oci_chart_installed_only_where_a_replica_spans_nodes(
    eks, eks_multinode
):
    release = _release(eks_multinode, "lws")
    chart = CHARTS["lws"]
    assert release.inputs["chart"] == chart.chart == "oci://registry.k8s.io/lws/charts/lws"
    assert release.inputs["version"] == chart.version and all(p.isdigit() for p in chart.version.split("."))
    assert "repositoryOpts" not in release.inputs  # the OCI reference is the whole address
    assert release.inputs["namespace"] == "lws-system" and release.inputs["createNamespace"] is True
    assert "lws" not in {r.inputs["name"] for r in eks.of_type(HELM_RELEASE)}


def test_the_leader_worker_set_is_created_only_after_the_lws_controller_and_the_gpu_plugin(eks_multinode):
    group = _workload(eks_multinode, "LeaderWorkerSet")
    assert group.type == "kubernetes:leaderworkerset.x-k8s.io/v1:LeaderWorkerSet"
    for addon in ("lws", "device-plugin", "load-balancer-controller"):
        assert _release(eks_multinode, addon).urn in group.dependencies, addon
    assert not _k8s(eks_multinode, "Deployment")


def test_the_replica_key_is_made_by_pulumi_random_into_the_pools_secret_before_the_group(eks_multinode):
    settings = eks_multinode.settings
    secret = _k8s(eks_multinode, "Secret")[lw.replica_key_secret(settings)]
    (password,) = eks_multinode.of_type("random:index/randomPassword:RandomPassword")
    assert password.inputs["length"] == REPLICA_KEY_LENGTH and password.inputs["special"] is False
    assert password.urn in secret.dependencies  # its value is the password's result
    # The password's result is a secret: the whole map reaches the engine marked so (kept encrypted
    # in the state, shown by no preview).
    data = secret.inputs["stringData"]
    assert data.get(rpc._special_sig_key) == rpc._special_secret_sig
    assert data["value"] == {lw.REPLICA_KEY_FIELD: REPLICA_KEY}
    assert secret.inputs["metadata"]["namespace"] == settings.kubernetes.namespace
    assert secret.urn in _workload(eks_multinode, "LeaderWorkerSet").dependencies


def test_pulumi_leaves_the_groups_templates_to_fab_deploy_and_their_count_to_keda(eks_multinode):
    group = _workload(eks_multinode, "LeaderWorkerSet")
    assert group.ignored_changes == [
        "spec.leaderWorkerTemplate.leaderTemplate",
        "spec.leaderWorkerTemplate.workerTemplate",
        "spec.replicas",
    ]
    settings = eks_multinode.settings
    expected = m.render_workload(settings, release_digest(settings)).deployment.to_dict()["spec"]
    assert _plain(group.inputs["spec"]) == expected


def test_the_scaled_object_targets_the_leader_worker_set_that_pulumi_creates(eks_multinode):
    (scaled,) = _k8s(eks_multinode, "ScaledObject").values()
    target = scaled.inputs["spec"]["scaleTargetRef"]
    group = _workload(eks_multinode, "LeaderWorkerSet")
    assert (target["kind"], target["name"]) == ("LeaderWorkerSet", group.inputs["metadata"]["name"])
