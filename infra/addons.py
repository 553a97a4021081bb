"""The cluster add-ons a created EKS cluster needs before the runtime's objects can work.

- **NVIDIA device plugin**: a node advertises ``nvidia.com/gpu`` only once it runs; without it a pod
  that requests GPUs never schedules. It runs on the GPU nodes only (the label ``infra.eks`` gives
  them), tolerating their taints.
- **AWS Load Balancer Controller**: the ``alb`` Ingress class, and the webhook that injects the pods'
  ALB readiness gates. Its IAM role is assumed by its service account the way the runtime's is (Pod
  Identity or IRSA), scoped to this account and region and, for everything it changes, to the
  resources it tagged with this cluster's name.
- **KEDA**: the ScaledObject's CRD and the operator that acts on it.
- **Prometheus Operator CRDs**: the ServiceMonitor and PrometheusRule kinds. Only the CRDs: the
  Prometheus that scrapes and alerts is the cluster's monitoring stack's.
- **AWS Node Termination Handler** in queue mode, where a node group buys spot: it drains a node
  on its interruption notice from the stack's queue (frontier/targets/kubernetes/interruption.py).
- **LeaderWorkerSet** (sigs.k8s.io/lws), where a model pool's replica spans several nodes: the CRD,
  and the controller and webhooks that turn each group into a leader and its workers' StatefulSet
  and inject the group's env (leader address, worker index). From its OCI chart.

Each is a pinned Helm chart from :data:`CHARTS`; Pulumi waits for each release to be ready (its
pods up, its webhooks answering) before anything that :func:`ClusterAddons.needed_by` names as
depending on it is created. They run on the untainted system node group.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_aws as aws
import pulumi_kubernetes as k8s

from frontier.config.schema import Kubernetes, Settings
from infra.cloud import Cloud
from infra.workload_identity import service_account_trust

# A label the GPU node groups carry; the device plugin's chart selects nodes by it.
GPU_NODE_LABEL = "nvidia.com/gpu.present"
LB_CONTROLLER_SERVICE_ACCOUNT = "aws-load-balancer-controller"
NTH_SERVICE_ACCOUNT = "aws-node-termination-handler"
IRSA_ROLE_ANNOTATION = "eks.amazonaws.com/role-arn"
# The tag the load balancer controller puts on every ALB, target group and security group it makes.
LB_CLUSTER_TAG = "elbv2.k8s.aws/cluster"


@dataclass(frozen=True)
class Chart:
    #: The chart's name in ``repository``, or a whole ``oci://`` reference (no repository then).
    chart: str
    version: str
    repository: str
    namespace: str


# Every chart the program installs, pinned: a version change is a reviewed change of this table.
CHARTS: Mapping[str, Chart] = {
    "device-plugin": Chart(
        "nvidia-device-plugin", "0.17.1", "https://nvidia.github.io/k8s-device-plugin", "kube-system"
    ),
    "load-balancer-controller": Chart(
        "aws-load-balancer-controller", "1.13.0", "https://aws.github.io/eks-charts", "kube-system"
    ),
    "keda": Chart("keda", "2.17.0", "https://kedacore.github.io/charts", "keda"),
    "prometheus-crds": Chart(
        "prometheus-operator-crds",
        "19.0.0",
        "https://prometheus-community.github.io/helm-charts",
        "kube-system",
    ),
    "lws": Chart("oci://registry.k8s.io/lws/charts/lws", "0.10.0", "", "lws-system"),
    # NTH v1.25.0's chart, in queue mode (frontier/targets/kubernetes/interruption.py says why NTH).
    "node-termination-handler": Chart(
        "oci://public.ecr.aws/aws-ec2/helm/aws-node-termination-handler", "0.27.0", "", "kube-system"
    ),
}
# Which add-ons a workload object needs in place (and answering) before it is created.
NEEDED_BY: Mapping[str, tuple[str, ...]] = {
    # GPUs to request; and, behind an ALB, the controller's pod webhook adds the readiness gate at pod
    # creation, failing open: a pod created before the controller runs silently goes without it.
    "Deployment": ("device-plugin", "load-balancer-controller"),
    # The controller's Service webhook fails closed while it is not answering.
    "Service": ("load-balancer-controller",),
    "Ingress": ("load-balancer-controller",),
    "ScaledObject": ("keda",),
    "ServiceMonitor": ("prometheus-crds",),
    # Its CRD and its pod webhook (the group's env); and GPUs and readiness gates as a Deployment's pods.
    "LeaderWorkerSet": ("lws", "device-plugin", "load-balancer-controller"),
    "PrometheusRule": ("prometheus-crds",),
}


@dataclass(frozen=True)
class ClusterAddonsArgs:
    settings: Settings
    cloud: Cloud
    provider: k8s.Provider
    cluster_name: pulumi.Input[str]
    vpc_id: pulumi.Input[str]
    #: What must exist before any release: the nodes they run on, the Pod Identity agent.
    after: Sequence[pulumi.Resource]
    tags: Mapping[str, str]
    #: IRSA only: the cluster's OIDC provider and issuer.
    oidc_provider_arn: pulumi.Input[str] | None = None
    oidc_issuer: pulumi.Input[str] | None = None
    #: Where a node group buys spot: the stack's notice queue (infra/interruptions.py), which the
    #: Node Termination Handler drains nodes from.
    notice_queue_url: pulumi.Input[str] | None = None
    notice_queue_arn: pulumi.Input[str] | None = None


def has_web_acl(settings: Settings) -> bool:
    """An ALB Ingress of a stack with a rate limit: the stack makes a web ACL the Ingress names."""
    k = settings.kubernetes
    return k is not None and k.ingress.kind == "alb" and settings.edge.waf_rate_limit > 0


def load_balancer_controller_policy(
    cloud: Cloud, cluster_name: str, vpc_id: str, waf: bool = False
) -> dict[str, Any]:
    """The controller's permissions: read the account's network and load balancers, create ALBs,
    target groups and security groups tagged with this cluster, and change only those (and, in the
    cluster's VPC, the node security groups' rules that admit them); with ``waf``, put the stack's
    web ACL in front of its ALBs."""
    elb, ec2 = "elasticloadbalancing", "ec2"
    tagged = {"StringEquals": {f"aws:ResourceTag/{LB_CLUSTER_TAG}": cluster_name}}
    tagging = {"StringEquals": {f"aws:RequestTag/{LB_CLUSTER_TAG}": cluster_name}}
    load_balancers = [cloud.arn(elb, "loadbalancer/app/*/*"), cloud.arn(elb, "targetgroup/*/*")]
    security_groups = cloud.arn(ec2, "security-group/*")

    def statement(sid: str, actions: list[str], resource: Any, condition: dict | None = None) -> dict:
        out = {"Sid": sid, "Effect": "Allow", "Action": actions, "Resource": resource}
        return out | ({"Condition": condition} if condition else {})

    return {
        "Version": "2012-10-17",
        "Statement": [
            statement(
                "CreateTheElbServiceLinkedRole",
                ["iam:CreateServiceLinkedRole"],
                "*",
                {"StringEquals": {"iam:AWSServiceName": f"{elb}.{cloud.dns_suffix}"}},
            ),
            # Describe calls take no resource ARNs.
            statement(
                "SeeTheNetworkAndLoadBalancers",
                [
                    "ec2:DescribeAccountAttributes",
                    "ec2:DescribeAddresses",
                    "ec2:DescribeAvailabilityZones",
                    "ec2:DescribeInternetGateways",
                    "ec2:DescribeVpcs",
                    "ec2:DescribeSubnets",
                    "ec2:DescribeSecurityGroups",
                    "ec2:DescribeInstances",
                    "ec2:DescribeNetworkInterfaces",
                    "ec2:DescribeTags",
                    "ec2:DescribeRouteTables",
                    "ec2:GetSecurityGroupsForVpc",
                    f"{elb}:DescribeLoadBalancers",
                    f"{elb}:DescribeLoadBalancerAttributes",
                    f"{elb}:DescribeListeners",
                    f"{elb}:DescribeListenerAttributes",
                    f"{elb}:DescribeListenerCertificates",
                    f"{elb}:DescribeSSLPolicies",
                    f"{elb}:DescribeRules",
                    f"{elb}:DescribeTargetGroups",
                    f"{elb}:DescribeTargetGroupAttributes",
                    f"{elb}:DescribeTargetHealth",
                    f"{elb}:DescribeTags",
                    f"{elb}:DescribeTrustStores",
                    "acm:ListCertificates",
                    "acm:DescribeCertificate",
                ],
                "*",
            ),
            statement(
                "CreateSecurityGroupsInItsVpc",
                ["ec2:CreateSecurityGroup"],
                [security_groups, cloud.arn(ec2, f"vpc/{vpc_id}")],
            ),
            statement(
                "TagTheSecurityGroupsItCreates",
                ["ec2:CreateTags"],
                security_groups,
                {"StringEquals": {"ec2:CreateAction": "CreateSecurityGroup"}} | tagging,
            ),
            statement(
                "ChangeItsSecurityGroups",
                [
                    "ec2:AuthorizeSecurityGroupIngress",
                    "ec2:RevokeSecurityGroupIngress",
                    "ec2:DeleteSecurityGroup",
                    "ec2:CreateTags",
                    "ec2:DeleteTags",
                ],
                security_groups,
                tagged,
            ),
            # The node security group admits the ALB: a group the controller did not create.
            statement(
                "OpenNodesToItsLoadBalancers",
                ["ec2:AuthorizeSecurityGroupIngress", "ec2:RevokeSecurityGroupIngress"],
                security_groups,
                {"ArnEquals": {"ec2:Vpc": cloud.arn(ec2, f"vpc/{vpc_id}")}},
            ),
            statement(
                "CreateTaggedLoadBalancers",
                [f"{elb}:CreateLoadBalancer", f"{elb}:CreateTargetGroup", f"{elb}:AddTags"],
                load_balancers,
                tagging,
            ),
            statement(
                "ChangeItsLoadBalancers",
                [
                    f"{elb}:ModifyLoadBalancerAttributes",
                    f"{elb}:SetIpAddressType",
                    f"{elb}:SetSecurityGroups",
                    f"{elb}:SetSubnets",
                    f"{elb}:DeleteLoadBalancer",
                    f"{elb}:ModifyTargetGroup",
                    f"{elb}:ModifyTargetGroupAttributes",
                    f"{elb}:DeleteTargetGroup",
                    f"{elb}:AddTags",
                    f"{elb}:RemoveTags",
                ],
                load_balancers,
                tagged,
            ),
            # Listeners and rules carry no tag conditions of their own; they live under its ALBs.
            statement(
                "ManageListenersAndRules",
                [
                    f"{elb}:CreateListener",
                    f"{elb}:DeleteListener",
                    f"{elb}:ModifyListener",
                    f"{elb}:ModifyListenerAttributes",
                    f"{elb}:AddListenerCertificates",
                    f"{elb}:RemoveListenerCertificates",
                    f"{elb}:CreateRule",
                    f"{elb}:DeleteRule",
                    f"{elb}:ModifyRule",
                    f"{elb}:SetRulePriorities",
                    f"{elb}:AddTags",
                ],
                [
                    *load_balancers,
                    cloud.arn(elb, "listener/app/*/*/*"),
                    cloud.arn(elb, "listener-rule/app/*/*/*/*"),
                ],
            ),
            statement(
                "RegisterPodsAsTargets",
                [f"{elb}:RegisterTargets", f"{elb}:DeregisterTargets"],
                cloud.arn(elb, "targetgroup/*/*"),
            ),
            # The Ingress names the stack's web ACL; associating one needs both the ACL and the ALB.
            *(
                [
                    statement(
                        "PutTheStacksWebAclInFrontOfItsAlbs",
                        [
                            "wafv2:GetWebACL",
                            "wafv2:GetWebACLForResource",
                            "wafv2:AssociateWebACL",
                            "wafv2:DisassociateWebACL",
                            f"{elb}:SetWebAcl",
                        ],
                        [cloud.arn("wafv2", "regional/webacl/*/*"), load_balancers[0]],
                    )
                ]
                if waf
                else []
            ),
        ],
    }


def termination_handler_policy(queue_arn: str) -> dict[str, Any]:
    """What NTH's queue processor calls: the stack's queue only; the instance and group lookups
    that map a notice's instance to its node (these take no resource-level scope)."""
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Sid": "NoticeQueue",
                "Effect": "Allow",
                "Action": ["sqs:ReceiveMessage", "sqs:DeleteMessage"],
                "Resource": queue_arn,
            },
            {
                "Sid": "FindTheNode",
                "Effect": "Allow",
                "Action": [
                    "ec2:DescribeInstances",
                    "autoscaling:DescribeAutoScalingInstances",
                    "autoscaling:DescribeTags",
                ],
                "Resource": "*",
            },
        ],
    }


def device_plugin_values(settings: Settings) -> dict[str, Any]:
    """On GPU nodes only, through every taint the GPU pools carry."""
    k = settings.section(Kubernetes)
    taints = {(t.key, t.effect) for pool in k.node_pools for t in pool.taints}
    return {
        "tolerations": [
            {"key": key, "operator": "Exists", "effect": effect} for key, effect in sorted(taints)
        ],
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": GPU_NODE_LABEL, "operator": "In", "values": ["true"]}]}
                    ]
                }
            }
        },
    }


class ClusterAddons(pulumi.ComponentResource):
    releases: dict[str, k8s.helm.v3.Release]

    def __init__(
        self, name: str, args: ClusterAddonsArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("frontier:kubernetes:ClusterAddons", name, None, opts)
        s, k = args.settings, args.settings.section(Kubernetes)
        self.releases = {}
        if any(pool.group.accelerator == "gpu" for pool in s.pools):
            self._release(name, args, "device-plugin", device_plugin_values(s))
        if k.ingress.kind == "alb":
            values, after = self._controller(name, args)
            self._release(name, args, "load-balancer-controller", values, after)
        self._release(name, args, "keda", {})
        self._release(name, args, "prometheus-crds", {})
        if any(pool.runtime.nodes_per_replica > 1 for pool in s.pools):
            self._release(name, args, "lws", {})
        if args.notice_queue_url is not None:
            values, after = self._termination_handler(name, args)
            self._release(name, args, "node-termination-handler", values, after)
        self.register_outputs({})

    def needed_by(self, kind: str) -> list[pulumi.Resource]:
        """The releases an object of ``kind`` needs running before it is created."""
        return [self.releases[a] for a in NEEDED_BY.get(kind, ()) if a in self.releases]

    def _release(
        self, name: str, args: ClusterAddonsArgs, key: str, values: dict, after: Sequence = ()
    ) -> None:
        chart = CHARTS[key]
        self.releases[key] = k8s.helm.v3.Release(
            f"{name}-{key}",
            name=key,
            chart=chart.chart,
            version=chart.version,
            repository_opts=k8s.helm.v3.RepositoryOptsArgs(repo=chart.repository)
            if chart.repository
            else None,
            namespace=chart.namespace,
            create_namespace=chart.namespace != "kube-system",
            values=values,
            # A failed install is rolled back rather than left half-applied.
            atomic=True,
            opts=pulumi.ResourceOptions(
                parent=self, provider=args.provider, depends_on=[*args.after, *after]
            ),
        )

    def _service_account_role(
        self,
        name: str,
        args: ClusterAddonsArgs,
        namespace: str,
        service_account: str,
        what: str,
        policy: pulumi.Input[str],
    ) -> tuple[dict[str, Any], list[pulumi.Resource]]:
        """An add-on's role for its chart's service account (trusted through Pod Identity or IRSA)
        with ``policy``; the service account's annotations, and what its pods need to exist when they
        start (with Pod Identity, credentials come only if the association exists then)."""
        k = args.settings.section(Kubernetes)
        child = pulumi.ResourceOptions(parent=self)
        role = aws.iam.Role(
            name,
            description=f"Frontier {args.settings.stack}: {what}",
            assume_role_policy=service_account_trust(
                k.identity, namespace, service_account, args.oidc_provider_arn, args.oidc_issuer
            ),
            tags=dict(args.tags),
            opts=child,
        )
        aws.iam.RolePolicy(name, role=role.id, policy=policy, opts=child)
        if k.identity == "irsa":
            return {IRSA_ROLE_ANNOTATION: role.arn}, [role]
        association = aws.eks.PodIdentityAssociation(
            name,
            cluster_name=args.cluster_name,
            namespace=namespace,
            service_account=service_account,
            role_arn=role.arn,
            tags=dict(args.tags),
            opts=child,
        )
        return {}, [role, association]

    def _termination_handler(
        self, name: str, args: ClusterAddonsArgs
    ) -> tuple[dict[str, Any], list[pulumi.Resource]]:
        """NTH's queue processor: its role (read and delete the stack's notices, find the instance's
        node) and the values that put it in queue mode on that queue."""
        assert args.notice_queue_arn is not None
        annotations, after = self._service_account_role(
            f"{name}-nth",
            args,
            CHARTS["node-termination-handler"].namespace,
            NTH_SERVICE_ACCOUNT,
            "the AWS Node Termination Handler",
            pulumi.Output.from_input(args.notice_queue_arn).apply(
                lambda arn: json.dumps(termination_handler_policy(arn))
            ),
        )
        values = {
            "enableSqsTerminationDraining": True,
            "queueURL": args.notice_queue_url,
            "awsRegion": args.cloud.region,
            # The rule is the account's: an instance that is no node of this cluster is skipped
            # (NTH finds no node for it), so no instance tag is needed to tell ours apart.
            "checkTagBeforeDraining": False,
            # Each pod keeps its own grace period (preStop + drain, sized to the notice).
            "podTerminationGracePeriod": -1,
            "serviceAccount": {"create": True, "name": NTH_SERVICE_ACCOUNT, "annotations": annotations},
        }
        return values, after

    def _controller(self, name: str, args: ClusterAddonsArgs) -> tuple[dict[str, Any], list[pulumi.Resource]]:
        """The controller's role (Pod Identity or IRSA), the values that name its cluster, and what
        its pods need to exist when they start."""
        annotations, after = self._service_account_role(
            f"{name}-lb-controller",
            args,
            CHARTS["load-balancer-controller"].namespace,
            LB_CONTROLLER_SERVICE_ACCOUNT,
            "the AWS Load Balancer Controller",
            pulumi.Output.all(args.cluster_name, args.vpc_id).apply(
                lambda a: json.dumps(
                    load_balancer_controller_policy(args.cloud, a[0], a[1], waf=has_web_acl(args.settings))
                )
            ),
        )
        values = {
            "clusterName": args.cluster_name,
            "region": args.cloud.region,
            "vpcId": args.vpc_id,
            "replicaCount": 2,
            "serviceAccount": {
                "create": True,
                "name": LB_CONTROLLER_SERVICE_ACCOUNT,
                "annotations": annotations,
            },
            # The stack's Ingress names a WAFv2 ACL where it has one (edge.waf_rate_limit); Shield
            # Advanced and WAF Classic never: their API calls stay out of the role.
            "enableShield": False,
            "enableWaf": False,
            "enableWafv2": has_web_acl(args.settings),
        }
        return values, after
