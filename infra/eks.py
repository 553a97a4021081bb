"""An EKS cluster for a ``kubernetes`` stack with ``cluster: create``, and its managed GPU node groups.

- The control plane's network interfaces get two /28 subnets of their own at the top of the VPC
  range (:func:`frontier.targets.kubernetes.network.control_plane_subnets`), so the runtime's NetworkPolicy
  can admit the API server without admitting pods. With ``private_endpoint`` the API is reachable
  only from inside the VPC.
- Secrets are envelope-encrypted with the stack's KMS key; the API, audit and authenticator logs go
  to CloudWatch.
- The VPC CNI runs with network policy enforcement on (without it NetworkPolicies are ignored);
  the Pod Identity agent is installed when the runtime uses Pod Identity.
- Node groups run the NVIDIA-accelerated AL2023 AMI (driver and container toolkit included), from a
  launch template that requires IMDSv2 with a hop limit of 1 (pods cannot reach the node's
  credentials even before the NetworkPolicy does its part) and encrypts the root volume.
- Access entries (API authentication mode): whoever runs ``pulumi up`` is cluster admin; the deploy
  role may edit only the runtime's namespace.
- An untainted system node group of small CPU instances (``kubernetes.system_pool``) runs CoreDNS,
  the controllers and the add-ons: the GPU pools are tainted, so without it nothing of the cluster's
  own would schedule. GPU nodes carry the label the device plugin selects them by.
- The Kubernetes provider of the new cluster is made here, so the add-ons (:mod:`infra.addons`) and
  the workloads (:mod:`infra.workloads`) talk to it through one provider.
- Nodes keep the cluster security group EKS makes (their launch templates name none), and with it
  its egress to anywhere: unlike the EC2 hosts', theirs is not narrowed to the VPC. What nodes need
  is the control plane (443, and it reaches the kubelets on 10250 and the controllers' webhooks),
  each other (pods and CoreDNS on the VPC CNI), STS, ECR (``ecr.api``, ``ecr.dkr``) and S3 (image
  layers) — all reachable through the VPC's endpoints — but also the registries the add-ons' charts
  pull from (``nvcr.io`` for the device plugin and the DCGM exporter, ``public.ecr.aws`` for the
  load balancer controller, ``ghcr.io`` for KEDA), which no endpoint serves. Narrowing the group would need those images mirrored into the stack's ECR first; a pod's
  own egress is confined by its NetworkPolicy meanwhile.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws
import pulumi_kubernetes as k8s

from frontier.config.schema import Kubernetes, NodeGroup, NodePool
from frontier.targets.kubernetes.deploy_access import DEPLOY_GROUP
from frontier.targets.kubernetes.network import control_plane_subnets
from frontier.targets.kubernetes.rules import SYSTEM_POOL
from infra.addons import GPU_NODE_LABEL
from infra.cloud import Cloud
from infra.identity import service_role
from infra.interruptions import eks_capacity_type, eks_instance_types

NVIDIA_AMI_TYPE = "AL2023_x86_64_NVIDIA"
CPU_AMI_TYPE = "AL2023_x86_64_STANDARD"
LOG_TYPES = ("api", "audit", "authenticator")
NODE_POLICIES = ("AmazonEKSWorkerNodePolicy", "AmazonEC2ContainerRegistryReadOnly", "AmazonEKS_CNI_Policy")
TAINT_EFFECTS = {
    "NoSchedule": "NO_SCHEDULE",
    "PreferNoSchedule": "PREFER_NO_SCHEDULE",
    "NoExecute": "NO_EXECUTE",
}
CLUSTER_ADMIN_POLICY = "AmazonEKSClusterAdminPolicy"
# Where the AWS Load Balancer Controller looks for the subnets of an internet-facing ALB, and of an
# internal one (an Ingress with ``alb.ingress.kubernetes.io/scheme: internal``). Both go to the
# public subnets: they hold no pod, so the runtime's NetworkPolicy admits the ALB's range
# (frontier.targets.kubernetes.network.public_range) without admitting a pod. An internal ALB has
# private addresses only, wherever it sits; in the private subnets it would share its range with
# every pod on the VPC CNI.
ALB_SUBNET_TAG = "kubernetes.io/role/elb"
INTERNAL_ALB_SUBNET_TAG = "kubernetes.io/role/internal-elb"
# gp3 allows 0.25 MiB/s per provisioned IOPS, and gives 3000 IOPS without charge.
GP3_BASELINE_IOPS = 3000
GP3_IOPS_PER_MIBPS = 4


def gp3_iops(throughput_mibps: int) -> int:
    """The fewest IOPS a gp3 volume may carry at ``throughput_mibps``."""
    return max(GP3_BASELINE_IOPS, GP3_IOPS_PER_MIBPS * throughput_mibps)


@dataclass(frozen=True)
class EksArgs:
    stack: str
    cloud: Cloud
    kubernetes: Kubernetes
    node_groups: Sequence[NodeGroup]
    vpc_id: pulumi.Input[str]
    vpc_cidr: str
    zones: Sequence[str]
    # Each node pool's zones: those offering every instance type it may launch (infra.placement).
    pool_zones: Mapping[str, tuple[str, ...]]
    private_subnet_ids: Sequence[pulumi.Input[str]]
    public_subnet_ids: Sequence[pulumi.Input[str]]
    kms_key_arn: pulumi.Input[str]
    deploy_role_arn: pulumi.Input[str]
    tags: Mapping[str, str]


def managed_policy(cloud: Cloud, name: str) -> str:
    return f"arn:{cloud.partition}:iam::aws:policy/{name}"


def kubeconfig(
    name: pulumi.Input[str], endpoint: pulumi.Input[str], ca: pulumi.Input[str], region: str
) -> pulumi.Output[str]:
    """A kubeconfig that gets a token from ``aws eks get-token`` with the caller's credentials."""

    def document(args: list[str]) -> str:
        cluster, server, data = args
        return json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {"name": cluster, "cluster": {"server": server, "certificate-authority-data": data}}
                ],
                "contexts": [{"name": cluster, "context": {"cluster": cluster, "user": cluster}}],
                "current-context": cluster,
                "users": [
                    {
                        "name": cluster,
                        "user": {
                            "exec": {
                                "apiVersion": "client.authentication.k8s.io/v1beta1",
                                "command": "aws",
                                "args": ["eks", "get-token", "--cluster-name", cluster, "--region", region],
                            }
                        },
                    }
                ],
            }
        )

    return pulumi.Output.all(name, endpoint, ca).apply(document)


class EksCluster(pulumi.ComponentResource):
    name: pulumi.Output[str]
    arn: pulumi.Output[str]
    kubeconfig: pulumi.Output[str]
    oidc_issuer: pulumi.Output[str]
    provider: k8s.Provider
    #: The add-ons' place to run (the system node group) and the Pod Identity agent, if any.
    system_ready: list[pulumi.Resource]

    def __init__(self, name: str, args: EksArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("frontier:kubernetes:EksCluster", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        tags, cloud, k = dict(args.tags), args.cloud, args.kubernetes

        control_plane = [
            aws.ec2.Subnet(
                f"{name}-control-plane-{i}",
                vpc_id=args.vpc_id,
                cidr_block=cidr,
                availability_zone=zone,
                map_public_ip_on_launch=False,
                tags=tags | {"Name": f"{name}-control-plane-{zone}", "frontier:tier": "control-plane"},
                opts=child,
            )
            for i, (cidr, zone) in enumerate(
                zip(control_plane_subnets(args.vpc_cidr), args.zones, strict=False)
            )
        ]
        role = service_role(
            f"{name}-cluster", "eks", f"Frontier {args.stack}: the EKS control plane", cloud, tags, self
        )
        attachment = aws.iam.RolePolicyAttachment(
            f"{name}-cluster",
            role=role.name,
            policy_arn=managed_policy(cloud, "AmazonEKSClusterPolicy"),
            opts=child,
        )
        aws.iam.RolePolicy(
            f"{name}-cluster-kms",
            role=role.id,
            policy=pulumi.Output.json_dumps(
                {
                    "Version": "2012-10-17",
                    "Statement": [
                        {
                            "Sid": "EncryptClusterSecrets",
                            "Effect": "Allow",
                            "Action": ["kms:Encrypt", "kms:Decrypt", "kms:DescribeKey", "kms:CreateGrant"],
                            "Resource": args.kms_key_arn,
                        }
                    ],
                }
            ),
            opts=child,
        )
        cluster = aws.eks.Cluster(
            f"{name}-cluster",
            name=k.cluster.name,
            version=k.cluster.version,
            role_arn=role.arn,
            vpc_config=aws.eks.ClusterVpcConfigArgs(
                subnet_ids=[s.id for s in control_plane],
                endpoint_private_access=True,
                endpoint_public_access=not k.cluster.private_endpoint,
            ),
            access_config=aws.eks.ClusterAccessConfigArgs(
                authentication_mode="API", bootstrap_cluster_creator_admin_permissions=True
            ),
            encryption_config=aws.eks.ClusterEncryptionConfigArgs(
                resources=["secrets"],
                provider=aws.eks.ClusterEncryptionConfigProviderArgs(key_arn=args.kms_key_arn),
            ),
            enabled_cluster_log_types=list(LOG_TYPES),
            tags=tags,
            opts=pulumi.ResourceOptions(parent=self, depends_on=[attachment]),
        )
        addons = [
            aws.eks.Addon(
                f"{name}-vpc-cni",
                cluster_name=cluster.name,
                addon_name="vpc-cni",
                # NetworkPolicies are only enforced when the CNI's policy agent runs.
                configuration_values=json.dumps({"enableNetworkPolicy": "true"}),
                resolve_conflicts_on_update="OVERWRITE",
                tags=tags,
                opts=child,
            )
        ]
        if k.identity == "pod_identity":
            addons.append(
                aws.eks.Addon(
                    f"{name}-pod-identity-agent",
                    cluster_name=cluster.name,
                    addon_name="eks-pod-identity-agent",
                    tags=tags,
                    opts=child,
                )
            )
        system_nodes = self._node_groups(name, args, cluster, addons)
        self.system_ready = [system_nodes, *addons]
        for i, subnet_id in enumerate(args.public_subnet_ids):
            aws.ec2.Tag(
                f"{name}-public-{i}-elb", resource_id=subnet_id, key=ALB_SUBNET_TAG, value="1", opts=child
            )
        for i, subnet_id in enumerate(args.public_subnet_ids):
            aws.ec2.Tag(
                f"{name}-public-{i}-internal-elb",
                resource_id=subnet_id,
                key=INTERNAL_ALB_SUBNET_TAG,
                value="1",
                opts=child,
            )

        # The deploy role is a member of the group the stack's Role binds (what fab does in the
        # namespace, deploy_access.py): EKS's namespaced access policies cover built-in API groups
        # only, and a LeaderWorkerSet's patch is refused under them.
        aws.eks.AccessEntry(
            f"{name}-deploy",
            cluster_name=cluster.name,
            principal_arn=args.deploy_role_arn,
            kubernetes_groups=[DEPLOY_GROUP],
            tags=tags,
            opts=child,
        )
        for index, admin in enumerate(k.cluster.admins):
            entry = aws.eks.AccessEntry(
                f"{name}-admin-{index}", cluster_name=cluster.name, principal_arn=admin, tags=tags, opts=child
            )
            aws.eks.AccessPolicyAssociation(
                f"{name}-admin-{index}",
                cluster_name=cluster.name,
                principal_arn=admin,
                policy_arn=f"arn:{cloud.partition}:eks::aws:cluster-access-policy/{CLUSTER_ADMIN_POLICY}",
                access_scope=aws.eks.AccessPolicyAssociationAccessScopeArgs(type="cluster"),
                # EKS associates a policy only with a principal that has an entry; both name the
                # principal by the same ARN, so only this orders them.
                opts=pulumi.ResourceOptions(parent=self, depends_on=[entry]),
            )

        self.name, self.arn = cluster.name, cluster.arn
        self.oidc_issuer = cluster.identities.apply(lambda ids: ids[0].oidcs[0].issuer if ids else "")
        self.kubeconfig = kubeconfig(
            cluster.name,
            cluster.endpoint,
            cluster.certificate_authority.apply(lambda ca: ca.data),
            cloud.region,
        )
        self.provider = k8s.Provider(
            f"{name}-api", kubeconfig=self.kubeconfig, enable_server_side_apply=True, opts=child
        )
        self.register_outputs({"name": cluster.name, "arn": cluster.arn})

    def _node_groups(
        self, name: str, args: EksArgs, cluster: aws.eks.Cluster, addons: list
    ) -> aws.eks.NodeGroup:
        """The GPU node groups, and the system node group (returned)."""
        child = pulumi.ResourceOptions(parent=self)
        tags, cloud = dict(args.tags), args.cloud
        role = service_role(f"{name}-node", "ec2", f"Frontier {args.stack}: EKS nodes", cloud, tags, self)
        attachments = [
            aws.iam.RolePolicyAttachment(
                f"{name}-node-{policy}", role=role.name, policy_arn=managed_policy(cloud, policy), opts=child
            )
            for policy in NODE_POLICIES
        ]
        groups = {group.name: group for group in args.node_groups}
        for pool in args.kubernetes.node_pools:
            group = groups[pool.node_group]
            self._node_group(name, args, cluster, role, pool, group, [*attachments, *addons])
        return self._system_group(name, args, cluster, role, [*attachments, *addons])

    def _launch_template(
        self, name: str, args: EksArgs, what: str, volume_gb: int, throughput_mibps: int | None = None
    ) -> aws.ec2.LaunchTemplate:
        tags = dict(args.tags)
        speed = (
            {}
            if throughput_mibps is None
            else {"throughput": throughput_mibps, "iops": gp3_iops(throughput_mibps)}
        )
        return aws.ec2.LaunchTemplate(
            name,
            description=f"Frontier {args.stack}: EKS {what}",
            metadata_options=aws.ec2.LaunchTemplateMetadataOptionsArgs(
                http_endpoint="enabled", http_tokens="required", http_put_response_hop_limit=1
            ),
            block_device_mappings=[
                aws.ec2.LaunchTemplateBlockDeviceMappingArgs(
                    device_name="/dev/xvda",
                    ebs=aws.ec2.LaunchTemplateBlockDeviceMappingEbsArgs(
                        volume_size=volume_gb,
                        volume_type="gp3",
                        encrypted="true",
                        kms_key_id=args.kms_key_arn,
                        delete_on_termination="true",
                        **speed,
                    ),
                )
            ],
            tag_specifications=[
                aws.ec2.LaunchTemplateTagSpecificationArgs(resource_type="instance", tags=tags),
                aws.ec2.LaunchTemplateTagSpecificationArgs(resource_type="volume", tags=tags),
            ],
            tags=tags,
            opts=pulumi.ResourceOptions(parent=self),
        )

    def _system_group(
        self, name: str, args: EksArgs, cluster: aws.eks.Cluster, role: aws.iam.Role, after: list
    ) -> aws.eks.NodeGroup:
        """Untainted CPU nodes: whatever tolerates no GPU taint (CoreDNS, controllers) runs here."""
        pool = args.kubernetes.system_pool
        template = self._launch_template(
            f"{name}-{SYSTEM_POOL}", args, "system node group", pool.root_volume_gb
        )
        return aws.eks.NodeGroup(
            f"{name}-{SYSTEM_POOL}",
            cluster_name=cluster.name,
            node_group_name=f"{args.stack}-{SYSTEM_POOL}",
            node_role_arn=role.arn,
            subnet_ids=list(args.private_subnet_ids),
            ami_type=CPU_AMI_TYPE,
            instance_types=[pool.instance_type],
            scaling_config=aws.eks.NodeGroupScalingConfigArgs(
                min_size=pool.min_size, desired_size=pool.desired_size, max_size=pool.max_size
            ),
            update_config=aws.eks.NodeGroupUpdateConfigArgs(max_unavailable=1),
            labels={"frontier.dev/pool": SYSTEM_POOL},
            launch_template=aws.eks.NodeGroupLaunchTemplateArgs(
                id=template.id, version=template.latest_version.apply(str)
            ),
            tags=dict(args.tags),
            opts=pulumi.ResourceOptions(
                parent=self, depends_on=after, ignore_changes=["scalingConfig.desiredSize"]
            ),
        )

    def _node_group(
        self,
        name: str,
        args: EksArgs,
        cluster: aws.eks.Cluster,
        role: aws.iam.Role,
        pool: NodePool,
        group: NodeGroup,
        after: list,
    ) -> None:
        tags = dict(args.tags)
        gpu = group.accelerator == "gpu"
        # The weights cache is an emptyDir: it lives on the node's root volume, read at the pool's rate.
        template = self._launch_template(
            f"{name}-{pool.name}",
            args,
            f"node pool {pool.name}",
            group.root_volume_gb + group.cache_volume_gb,
            pool.root_volume_throughput_mibps,
        )
        aws.eks.NodeGroup(
            f"{name}-{pool.name}",
            cluster_name=cluster.name,
            node_group_name=f"{args.stack}-{pool.name}",
            node_role_arn=role.arn,
            subnet_ids=[
                subnet
                for subnet, zone in zip(args.private_subnet_ids, args.zones, strict=True)
                if zone in args.pool_zones[pool.name]
            ],
            ami_type=NVIDIA_AMI_TYPE if gpu else CPU_AMI_TYPE,
            instance_types=eks_instance_types(pool.instance_types, group),
            # A spot group's nodes are all spot (frontier/targets/kubernetes/interruption.py).
            capacity_type=eks_capacity_type(group),
            scaling_config=aws.eks.NodeGroupScalingConfigArgs(
                min_size=group.min_size, desired_size=group.desired_size, max_size=group.max_size
            ),
            # Node replacement during an AMI update: one node at a time, like a rollout batch.
            update_config=aws.eks.NodeGroupUpdateConfigArgs(max_unavailable=1),
            # The device plugin's chart runs on nodes with this label only.
            labels=dict(pool.labels) | ({GPU_NODE_LABEL: "true"} if gpu else {}),
            taints=[
                aws.eks.NodeGroupTaintArgs(key=t.key, value=t.value or None, effect=TAINT_EFFECTS[t.effect])
                for t in pool.taints
            ],
            launch_template=aws.eks.NodeGroupLaunchTemplateArgs(
                id=template.id, version=template.latest_version.apply(str)
            ),
            tags=tags,
            # The cluster autoscaler (or Karpenter) moves desired_size; Pulumi keeps min and max.
            opts=pulumi.ResourceOptions(
                parent=self, depends_on=after, ignore_changes=["scalingConfig.desiredSize"]
            ),
        )
