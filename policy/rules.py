"""The rules of Frontier's policy pack, importable on their own (the pack is ``policy/__main__.py``).

Each rule is a plain function ``check(args, report_violation)`` wrapped in a pulumi-policy
``ResourceValidationPolicy`` (one resource's inputs) or ``StackValidationPolicy`` (every resource's
outputs, for properties that pulumi-aws 7 spreads over several resources, such as a bucket and its
encryption, versioning, public access block and policy). Properties arrive under their wire names
(camelCase); numbers may arrive as floats and booleans of some resources as the strings
``"true"``/``"false"``, so every comparison here tolerates both.

Enforcement is mandatory, except for the few rules marked advisory: some are about hygiene rather
than exposure, and the rest each report one case the stack's own programs still have, named next to
the rule (tests/infra/test_policy.py's KNOWN_BREAKS), until that case is fixed and the rule folded
into its mandatory sibling.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from frontier_hostside.names import (
    DIGEST_PATTERN,
    DISCOVERY_TAGS,
    GPU_RESOURCE,
    PURPOSE_TAG,
    ROLE_TAG,
    RUNTIME_ROLE,
    STACK_TAG,
)
from pulumi_policy import (
    EnforcementLevel,
    PolicyConfigSchema,
    PolicyResource,
    ReportViolation,
    ResourceValidationArgs,
    ResourceValidationPolicy,
    StackValidationArgs,
    StackValidationPolicy,
)

ANYWHERE = ("0.0.0.0/0", "::/0")
PUBLIC_PORTS = (80, 443)
MAX_METADATA_HOPS = 2
# Services whose actions read or write data; a wildcard action on any of them is refused.
DATA_SERVICES = (
    "s3",
    "secretsmanager",
    "kms",
    "dynamodb",
    "ssm",
    "ecr",
    "logs",
    "sqs",
    "sns",
    "rds",
    "rds-data",
)
# Of those, the ones whose data actions must also name their resources (never "Resource": "*").
SCOPED_DATA_SERVICES = ("s3", "secretsmanager", "kms", "dynamodb")
TLS12_POLICY = re.compile(r"TLS13|TLS-1-2|FS-1-2")
KMS_PURPOSES = ("weights", "history")
VERSIONED_PURPOSES = ("weights", "history")

BUCKET = ("aws:s3/bucket:Bucket", "aws:s3/bucketV2:BucketV2")
BUCKET_SSE = (
    "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration",
    "aws:s3/bucketServerSideEncryptionConfigurationV2:BucketServerSideEncryptionConfigurationV2",
)
BUCKET_VERSIONING = (
    "aws:s3/bucketVersioning:BucketVersioning",
    "aws:s3/bucketVersioningV2:BucketVersioningV2",
)
BUCKET_PUBLIC_ACCESS_BLOCK = ("aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock",)
BUCKET_POLICY = ("aws:s3/bucketPolicy:BucketPolicy",)
LAUNCH_TEMPLATE = ("aws:ec2/launchTemplate:LaunchTemplate",)
INSTANCE = ("aws:ec2/instance:Instance",)
VOLUME = ("aws:ebs/volume:Volume",)
SECRET = ("aws:secretsmanager/secret:Secret",)
KMS_KEY = ("aws:kms/key:Key",)
ECR_REPOSITORY = ("aws:ecr/repository:Repository",)
SECURITY_GROUP = ("aws:ec2/securityGroup:SecurityGroup",)
SECURITY_GROUP_RULE = ("aws:ec2/securityGroupRule:SecurityGroupRule",)
INGRESS_RULE = ("aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule",)
IAM_POLICY = (
    "aws:iam/policy:Policy",
    "aws:iam/rolePolicy:RolePolicy",
    "aws:iam/userPolicy:UserPolicy",
    "aws:iam/groupPolicy:GroupPolicy",
)
IAM_ROLE = ("aws:iam/role:Role",)
LISTENER = ("aws:lb/listener:Listener", "aws:alb/listener:Listener")
LOAD_BALANCER = ("aws:lb/loadBalancer:LoadBalancer", "aws:alb/loadBalancer:LoadBalancer")
LOG_GROUP = ("aws:cloudwatch/logGroup:LogGroup",)
AUTOSCALING_GROUP = ("aws:autoscaling/group:Group",)
# Kubernetes objects that run pods, and where each keeps its pod spec.
K8S_POD = ("kubernetes:core/v1:Pod",)
K8S_CRON_JOB = ("kubernetes:batch/v1:CronJob",)
K8S_TEMPLATED = (
    "kubernetes:apps/v1:Deployment",
    "kubernetes:apps/v1:StatefulSet",
    "kubernetes:apps/v1:DaemonSet",
    "kubernetes:apps/v1:ReplicaSet",
    "kubernetes:batch/v1:Job",
)
# A replica over several nodes: a leader's and a worker's pod template (sigs.k8s.io/lws).
K8S_LEADER_WORKER_SET = ("kubernetes:leaderworkerset.x-k8s.io/v1:LeaderWorkerSet",)
K8S_POD_OWNERS = K8S_POD + K8S_CRON_JOB + K8S_TEMPLATED + K8S_LEADER_WORKER_SET
# Long-running workloads: each needs a disruption budget and a network policy of its own.
K8S_WORKLOADS = ("kubernetes:apps/v1:Deployment", "kubernetes:apps/v1:StatefulSet", *K8S_LEADER_WORKER_SET)
K8S_PDB = ("kubernetes:policy/v1:PodDisruptionBudget",)
K8S_NETWORK_POLICY = ("kubernetes:networking.k8s.io/v1:NetworkPolicy",)


# --- reading properties ---------------------------------------------------------------------------


def get(props: Any, *path: str | int, default: Any = None) -> Any:
    """``get(props, "metadataOptions", "httpTokens")``; ``default`` where any step is missing."""
    value = props
    for step in path:
        if isinstance(step, int):
            if not is_list(value) or step >= len(value):
                return default
        elif not isinstance(value, Mapping) or step not in value:
            return default
        value = value[step]
    return default if value is None else value


def is_list(value: Any) -> bool:
    return isinstance(value, Sequence) and not isinstance(value, str | bytes)


def as_list(value: Any) -> list[Any]:
    """A block that providers model either as one object or as a list of them."""
    if value is None:
        return []
    return list(value) if is_list(value) else [value]


def truthy(value: Any) -> bool:
    return value is True or (isinstance(value, str) and value.strip().lower() == "true")


def as_int(value: Any) -> int | None:
    try:
        return int(float(value))
    except (TypeError, ValueError):
        return None


def tags_of(props: Mapping[str, Any]) -> Mapping[str, Any]:
    return get(props, "tags", default={}) or get(props, "tagsAll", default={})


def policy_document(value: Any) -> Mapping[str, Any]:
    """An IAM/S3 policy given as JSON text or as a structured document."""
    if isinstance(value, Mapping):
        return value
    if isinstance(value, str) and value.strip():
        return json.loads(value)
    return {}


def statements(document: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [s for s in as_list(get(document, "Statement")) if isinstance(s, Mapping)]


# --- resource rules -------------------------------------------------------------------------------


def _resource_policy(
    name: str,
    description: str,
    types: Sequence[str],
    check: Callable[[Mapping[str, Any], ResourceValidationArgs], Iterable[str]],
    enforcement: EnforcementLevel = EnforcementLevel.MANDATORY,
    config_schema: PolicyConfigSchema | None = None,
) -> ResourceValidationPolicy:
    def validate(args: ResourceValidationArgs, report_violation: ReportViolation) -> None:
        if args.resource_type not in types:
            return
        for message in check(args.props, args):
            report_violation(f"{args.name}: {message}", args.urn)

    return ResourceValidationPolicy(
        name=name,
        description=description,
        validate=validate,
        enforcement_level=enforcement,
        config_schema=config_schema,
    )


def check_kms_rotation(props: Mapping[str, Any], _: ResourceValidationArgs) -> Iterator[str]:
    # Only symmetric encryption keys can rotate automatically.
    symmetric = get(props, "customerMasterKeySpec", default="SYMMETRIC_DEFAULT") == "SYMMETRIC_DEFAULT"
    encrypts = get(props, "keyUsage", default="ENCRYPT_DECRYPT") == "ENCRYPT_DECRYPT"
    if symmetric and encrypts and not truthy(get(props, "enableKeyRotation")):
        yield "KMS key without automatic rotation: set enable_key_rotation=True"


def check_ecr_immutable(props: Mapping[str, Any], _: ResourceValidationArgs) -> Iterator[str]:
    mutability = get(props, "imageTagMutability", default="MUTABLE")
    if mutability != "IMMUTABLE":
        yield f"ECR repository with imageTagMutability = {mutability!r}: releases are deployed by digest; use IMMUTABLE"


def check_ecr_scan(props: Mapping[str, Any], _: ResourceValidationArgs) -> Iterator[str]:
    if not truthy(get(props, "imageScanningConfiguration", "scanOnPush")):
        yield "ECR repository does not scan images on push"


def check_imdsv2(props: Mapping[str, Any], args: ResourceValidationArgs) -> Iterator[str]:
    options = get(props, "metadataOptions", default={})
    if get(options, "httpEndpoint", default="enabled") == "disabled":
        return
    if get(options, "httpTokens") != "required":
        yield "instance metadata allows IMDSv1: set metadata_options.http_tokens = 'required'"
    hops = as_int(get(options, "httpPutResponseHopLimit"))
    if hops is not None and hops > MAX_METADATA_HOPS:
        yield f"metadata hop limit {hops} lets tokens travel beyond the host's containers (at most {MAX_METADATA_HOPS})"


def check_ebs_encrypted(props: Mapping[str, Any], args: ResourceValidationArgs) -> Iterator[str]:
    if args.resource_type in VOLUME:
        if not truthy(get(props, "encrypted")):
            yield "EBS volume is not encrypted"
        return
    if args.resource_type in INSTANCE:
        devices = [("root", get(props, "rootBlockDevice", default={}))]
        devices += [(get(d, "deviceName", default="?"), d) for d in as_list(get(props, "ebsBlockDevices"))]
        for device, block in devices:
            if block and not truthy(get(block, "encrypted")):
                yield f"EBS volume {device} is not encrypted"
        return
    for mapping in as_list(get(props, "blockDeviceMappings")):
        ebs = get(mapping, "ebs")
        if ebs is not None and not truthy(get(ebs, "encrypted")):
            yield f"launch template volume {get(mapping, 'deviceName', default='?')} is not encrypted"


def check_no_public_ip(props: Mapping[str, Any], args: ResourceValidationArgs) -> Iterator[str]:
    if args.resource_type in INSTANCE:
        if truthy(get(props, "associatePublicIpAddress")):
            yield "instance gets a public IP address; hosts live in private subnets behind the ALB"
        return
    for interface in as_list(get(props, "networkInterfaces")):
        if truthy(get(interface, "associatePublicIpAddress")):
            yield "launch template gives hosts a public IP address; hosts live in private subnets behind the ALB"


def check_secret_kms(props: Mapping[str, Any], _: ResourceValidationArgs) -> Iterator[str]:
    if not get(props, "kmsKeyId"):
        yield "secret is encrypted with the AWS managed key; use the stack's KMS key (kms_key_id)"


def _public_ingress_problem(protocol: Any, from_port: Any, to_port: Any, cidrs: Iterable[Any]) -> str | None:
    public = sorted({str(c) for c in cidrs if str(c) in ANYWHERE})
    if not public:
        return None
    low, high = as_int(from_port), as_int(to_port)
    if str(protocol).lower() in ("tcp", "6") and low == high and low in PUBLIC_PORTS:
        return None
    span = "all ports" if str(protocol) in ("-1", "all") else f"{protocol} {low}-{high}"
    return (
        f"ingress from {', '.join(public)} on {span}: only TCP 80 and 443 (the load balancer) may be public"
    )


def check_no_public_ingress(props: Mapping[str, Any], args: ResourceValidationArgs) -> Iterator[str]:
    if args.resource_type in SECURITY_GROUP:
        for rule in as_list(get(props, "ingress")):
            cidrs = [*as_list(get(rule, "cidrBlocks")), *as_list(get(rule, "ipv6CidrBlocks"))]
            problem = _public_ingress_problem(
                get(rule, "protocol"), get(rule, "fromPort"), get(rule, "toPort"), cidrs
            )
            if problem:
                yield problem
        return
    if args.resource_type in SECURITY_GROUP_RULE:
        if get(props, "type") != "ingress":
            return
        cidrs = [*as_list(get(props, "cidrBlocks")), *as_list(get(props, "ipv6CidrBlocks"))]
        protocol = get(props, "protocol")
    else:
        cidrs = [c for c in (get(props, "cidrIpv4"), get(props, "cidrIpv6")) if c]
        protocol = get(props, "ipProtocol")
    problem = _public_ingress_problem(protocol, get(props, "fromPort"), get(props, "toPort"), cidrs)
    if problem:
        yield problem


def _wildcard_problems(document: Mapping[str, Any], where: str) -> Iterator[str]:
    for index, statement in enumerate(statements(document)):
        if get(statement, "Effect") != "Allow":
            continue
        sid = get(statement, "Sid", default=f"#{index}")
        if get(statement, "NotAction") is not None:
            yield f"{where} statement {sid}: Allow with NotAction grants everything not listed"
            continue
        actions = [str(a) for a in as_list(get(statement, "Action"))]
        resources = [str(r) for r in as_list(get(statement, "Resource"))]
        for action in actions:
            service, _, verb = action.partition(":")
            if action == "*" or (service.lower() in DATA_SERVICES and "*" in verb):
                yield f"{where} statement {sid}: wildcard action {action!r} on a data service"
            elif service.lower() in SCOPED_DATA_SERVICES and "*" in resources:
                yield f"{where} statement {sid}: {action} on every resource ('*'); name the bucket, secret or key"


def check_no_wildcard_data_actions(props: Mapping[str, Any], args: ResourceValidationArgs) -> Iterator[str]:
    if args.resource_type in IAM_ROLE:
        for inline in as_list(get(props, "inlinePolicies")):
            yield from _wildcard_problems(
                policy_document(get(inline, "policy")), f"inline policy {get(inline, 'name')}"
            )
        return
    yield from _wildcard_problems(policy_document(get(props, "policy")), "policy")


def check_http_redirects(props: Mapping[str, Any], _: ResourceValidationArgs) -> Iterator[str]:
    if str(get(props, "protocol", default="")).upper() != "HTTP":
        return
    for action in as_list(get(props, "defaultActions")):
        kind = get(action, "type")
        target = str(get(action, "redirect", "protocol", default="")).upper()
        if kind != "redirect" or target != "HTTPS":
            yield f"HTTP listener {kind!r} action serves plain HTTP; it must redirect to HTTPS"


def check_tls_policy(props: Mapping[str, Any], _: ResourceValidationArgs) -> Iterator[str]:
    if str(get(props, "protocol", default="")).upper() not in ("HTTPS", "TLS"):
        return
    policy = str(get(props, "sslPolicy", default=""))
    if not TLS12_POLICY.search(policy):
        yield f"listener TLS policy {policy or '(default)'!r} allows TLS older than 1.2"


def check_lb_access_logs(props: Mapping[str, Any], _: ResourceValidationArgs) -> Iterator[str]:
    logs = get(props, "accessLogs", default={})
    if not truthy(get(logs, "enabled")) or not get(logs, "bucket"):
        yield "load balancer does not write access logs"


def check_lb_deletion_protection(props: Mapping[str, Any], args: ResourceValidationArgs) -> Iterator[str]:
    production = get(args.get_config(), "productionStacks", default=PRODUCTION_STACKS)
    stack = get(tags_of(props), STACK_TAG)
    if stack in production and not truthy(get(props, "enableDeletionProtection")):
        yield f"load balancer of production stack {stack!r} has no deletion protection"


def check_log_group(props: Mapping[str, Any], _: ResourceValidationArgs) -> Iterator[str]:
    if not get(props, "kmsKeyId"):
        yield "log group is not encrypted with a KMS key"
    if not as_int(get(props, "retentionInDays", default=0)):
        yield "log group keeps logs forever; set retention_in_days"


def check_discovery_tags(props: Mapping[str, Any], _: ResourceValidationArgs) -> Iterator[str]:
    propagated = {
        get(tag, "key"): get(tag, "value")
        for tag in as_list(get(props, "tags"))
        if truthy(get(tag, "propagateAtLaunch"))
    }
    missing = [key for key in DISCOVERY_TAGS if not propagated.get(key)]
    if missing:
        yield f"auto scaling group does not tag its instances with {', '.join(missing)}: `fab` cannot find them"


def check_launch_hook(props: Mapping[str, Any], _: ResourceValidationArgs) -> Iterator[str]:
    """A serving group's hosts join the target group only once they say they are ready."""
    if not as_list(get(props, "targetGroupArns")):
        return
    launching = [
        hook
        for hook in as_list(get(props, "initialLifecycleHooks"))
        if get(hook, "lifecycleTransition") == "autoscaling:EC2_INSTANCE_LAUNCHING"
    ]
    if not launching:
        yield "auto scaling group behind a load balancer has no launch lifecycle hook: hosts would serve before they are ready"
    elif any(get(hook, "defaultResult") != "ABANDON" for hook in launching):
        yield "launch lifecycle hook continues by default: a host that never reports ready would join the target group"


def check_waits_for_capacity(props: Mapping[str, Any], _: ResourceValidationArgs) -> Iterator[str]:
    timeout = str(get(props, "waitForCapacityTimeout", default="10m"))
    if timeout in ("0", "0s", "0m"):
        yield "wait_for_capacity_timeout is 0: `pulumi up` would end green with no hosts in service"


def check_listener_forwards_only_api(props: Mapping[str, Any], _: ResourceValidationArgs) -> Iterator[str]:
    if str(get(props, "protocol", default="")).upper() not in ("HTTPS", "TLS"):
        return
    for action in as_list(get(props, "defaultActions")):
        if get(action, "type") == "forward":
            yield "HTTPS listener forwards every path by default: /metrics and /health/* would answer the internet"


# --- Kubernetes: pods, as the typed pulumi_kubernetes resources carry them -------------------------


def pod_specs(resource_type: str, props: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """Every pod spec the object carries (a LeaderWorkerSet: its leader's and its workers')."""
    if resource_type in K8S_POD:
        return [get(props, "spec", default={})]
    if resource_type in K8S_CRON_JOB:
        return [get(props, "spec", "jobTemplate", "spec", "template", "spec", default={})]
    if resource_type in K8S_LEADER_WORKER_SET:
        group = get(props, "spec", "leaderWorkerTemplate", default={})
        return [
            get(group, t, "spec", default={}) for t in ("leaderTemplate", "workerTemplate") if get(group, t)
        ]
    return [get(props, "spec", "template", "spec", default={})]


def pod_template_labels(resource_type: str, props: Mapping[str, Any]) -> Mapping[str, Any]:
    """The labels a workload's pods carry (a LeaderWorkerSet's: its worker template's, which its
    leader's include)."""
    if resource_type in K8S_LEADER_WORKER_SET:
        group = get(props, "spec", "leaderWorkerTemplate", default={})
        return get(group, "workerTemplate", "metadata", "labels", default={})
    return get(props, "spec", "template", "metadata", "labels", default={})


def pod_containers(spec: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [
        c for key in ("initContainers", "containers", "ephemeralContainers") for c in as_list(get(spec, key))
    ]


def check_k8s_digest_images(props: Mapping[str, Any], args: ResourceValidationArgs) -> Iterator[str]:
    for container in (c for spec in pod_specs(args.resource_type, props) for c in pod_containers(spec)):
        image = str(get(container, "image", default=""))
        _, _, digest = image.partition("@")
        if not DIGEST_PATTERN.match(digest):
            yield (
                f"container {get(container, 'name')!r} runs {image!r}: images must be pinned by digest "
                "(<repository>@sha256:<64 hex>), never a tag"
            )


def check_k8s_not_privileged(props: Mapping[str, Any], args: ResourceValidationArgs) -> Iterator[str]:
    for spec in pod_specs(args.resource_type, props):
        yield from _privileges(spec)


def _privileges(spec: Mapping[str, Any]) -> Iterator[str]:
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if truthy(get(spec, key)):
            yield f"pod shares the node's namespaces ({key}: true)"
    for volume in as_list(get(spec, "volumes")):
        if get(volume, "hostPath") is not None:
            yield f"volume {get(volume, 'name')!r} mounts a path of the node (hostPath)"
    pod_non_root = truthy(get(spec, "securityContext", "runAsNonRoot"))
    for container in pod_containers(spec):
        name, security = get(container, "name"), get(container, "securityContext", default={})
        if truthy(get(security, "privileged")):
            yield f"container {name!r} is privileged"
        if get(security, "allowPrivilegeEscalation") not in (False, "false"):
            yield f"container {name!r} does not set allowPrivilegeEscalation: false"
        if as_list(get(security, "capabilities", "add")):
            yield f"container {name!r} adds capabilities {as_list(get(security, 'capabilities', 'add'))}"
        if not (pod_non_root or truthy(get(security, "runAsNonRoot"))):
            yield f"container {name!r} may run as root (no runAsNonRoot: true on it or its pod)"
        user = get(security, "runAsUser", default=get(spec, "securityContext", "runAsUser"))
        if as_int(user) == 0:
            yield f"container {name!r} runs as root (runAsUser: 0)"


def check_k8s_gpu_requests_equal_limits(
    props: Mapping[str, Any], args: ResourceValidationArgs
) -> Iterator[str]:
    for container in (c for spec in pod_specs(args.resource_type, props) for c in pod_containers(spec)):
        request = get(container, "resources", "requests", GPU_RESOURCE)
        limit = get(container, "resources", "limits", GPU_RESOURCE)
        if (request is not None or limit is not None) and as_int(request) != as_int(limit):
            yield (
                f"container {get(container, 'name')!r} requests {request} {GPU_RESOURCE} but is limited to "
                f"{limit}: GPUs are not shared, requests must equal limits"
            )


# The stacks infra/ treats as production (infra/program.py, infra/kubernetes_program.py).
PRODUCTION_STACKS = ["prod", "eks-prod"]
PRODUCTION_SCHEMA = PolicyConfigSchema(
    properties={
        "productionStacks": {"type": "array", "items": {"type": "string"}, "default": PRODUCTION_STACKS}
    }
)

RESOURCE_POLICIES = [
    _resource_policy("kms-key-rotation", "KMS keys rotate automatically.", KMS_KEY, check_kms_rotation),
    _resource_policy(
        "ecr-immutable-tags", "ECR repositories have immutable tags.", ECR_REPOSITORY, check_ecr_immutable
    ),
    _resource_policy(
        "ecr-scan-on-push",
        "ECR repositories scan every pushed image.",
        ECR_REPOSITORY,
        check_ecr_scan,
        EnforcementLevel.ADVISORY,
    ),
    _resource_policy(
        "imdsv2-required",
        "Instances require IMDSv2 with a small hop limit.",
        LAUNCH_TEMPLATE + INSTANCE,
        check_imdsv2,
    ),
    _resource_policy(
        "ebs-encrypted",
        "EBS volumes (launch templates, instances, volumes) are encrypted.",
        LAUNCH_TEMPLATE + INSTANCE + VOLUME,
        check_ebs_encrypted,
    ),
    _resource_policy(
        "no-public-ip-on-hosts",
        "Hosts get no public IP address.",
        LAUNCH_TEMPLATE + INSTANCE,
        check_no_public_ip,
    ),
    _resource_policy(
        "secrets-use-kms", "Secrets are encrypted with a customer managed KMS key.", SECRET, check_secret_kms
    ),
    _resource_policy(
        "no-public-ingress",
        "Nothing but TCP 80/443 accepts traffic from 0.0.0.0/0 or ::/0.",
        SECURITY_GROUP + SECURITY_GROUP_RULE + INGRESS_RULE,
        check_no_public_ingress,
    ),
    _resource_policy(
        "no-wildcard-iam-on-data",
        "IAM policies grant no wildcard actions on data services.",
        IAM_POLICY + IAM_ROLE,
        check_no_wildcard_data_actions,
    ),
    _resource_policy(
        "alb-http-redirects-to-https",
        "HTTP listeners only redirect to HTTPS.",
        LISTENER,
        check_http_redirects,
    ),
    _resource_policy(
        "alb-tls-1-2", "HTTPS listeners use a TLS 1.2+ security policy.", LISTENER, check_tls_policy
    ),
    _resource_policy(
        "lb-access-logs", "Load balancers write access logs.", LOAD_BALANCER, check_lb_access_logs
    ),
    _resource_policy(
        "lb-deletion-protection",
        "Production load balancers are protected from deletion.",
        LOAD_BALANCER,
        check_lb_deletion_protection,
        EnforcementLevel.ADVISORY,
        PRODUCTION_SCHEMA,
    ),
    _resource_policy(
        "log-groups-encrypted-with-retention",
        "Log groups use a KMS key and a retention period.",
        LOG_GROUP,
        check_log_group,
        EnforcementLevel.ADVISORY,
    ),
    _resource_policy(
        "asg-discovery-tags",
        "Auto scaling groups tag instances so `fab` can discover them.",
        AUTOSCALING_GROUP,
        check_discovery_tags,
        EnforcementLevel.ADVISORY,
    ),
    _resource_policy(
        "asg-launch-hook",
        "Serving auto scaling groups hold new hosts in a launch lifecycle hook that abandons by default.",
        AUTOSCALING_GROUP,
        check_launch_hook,
    ),
    _resource_policy(
        "asg-waits-for-capacity",
        "Auto scaling groups make `pulumi up` wait for capacity.",
        AUTOSCALING_GROUP,
        check_waits_for_capacity,
    ),
    _resource_policy(
        "alb-forwards-only-api",
        "HTTPS listeners forward nothing by default (listener rules name the API paths).",
        LISTENER,
        check_listener_forwards_only_api,
    ),
    _resource_policy(
        "k8s-images-by-digest",
        "Kubernetes workloads run images pinned by digest.",
        K8S_POD_OWNERS,
        check_k8s_digest_images,
    ),
    _resource_policy(
        "k8s-no-privileged-pods",
        "Kubernetes pods run unprivileged, as non-root, without the node's namespaces or paths.",
        K8S_POD_OWNERS,
        check_k8s_not_privileged,
    ),
    _resource_policy(
        "k8s-gpu-requests-equal-limits",
        "GPU requests equal GPU limits.",
        K8S_POD_OWNERS,
        check_k8s_gpu_requests_equal_limits,
    ),
]


# --- stack rules: a bucket and the resources that configure it -------------------------------------


def _of_type(resources: Iterable[PolicyResource], types: Sequence[str]) -> list[PolicyResource]:
    return [r for r in resources if r.resource_type in types]


def _bucket_keys(bucket: PolicyResource) -> set[str]:
    """What a configuration resource's ``bucket`` property may hold: the bucket's name or id."""
    return {str(v) for v in (get(bucket.props, "bucket"), get(bucket.props, "id")) if v}


def _configs(
    resources: Sequence[PolicyResource], types: Sequence[str], bucket: PolicyResource
) -> list[PolicyResource]:
    keys = _bucket_keys(bucket)
    return [r for r in _of_type(resources, types) if str(get(r.props, "bucket", default="")) in keys]


def _purpose(bucket: PolicyResource) -> str:
    return str(get(tags_of(bucket.props), PURPOSE_TAG, default=""))


def _stack_policy(
    name: str,
    description: str,
    check: Callable[[Sequence[PolicyResource]], Iterable[tuple[PolicyResource, str]]],
    enforcement: EnforcementLevel = EnforcementLevel.MANDATORY,
) -> StackValidationPolicy:
    def validate(args: StackValidationArgs, report_violation: ReportViolation) -> None:
        for resource, message in check(list(args.resources)):
            report_violation(f"{resource.name}: {message}", resource.urn)

    return StackValidationPolicy(
        name=name, description=description, validate=validate, enforcement_level=enforcement
    )


def _sse_algorithms(resources: Sequence[PolicyResource], bucket: PolicyResource) -> set[str]:
    rules = [
        rule
        for config in _configs(resources, BUCKET_SSE, bucket)
        for rule in as_list(get(config.props, "rules"))
    ]
    rules += as_list(get(bucket.props, "serverSideEncryptionConfiguration", "rule"))
    return {
        str(get(rule, "applyServerSideEncryptionByDefault", "sseAlgorithm", default="")) for rule in rules
    } - {""}


def check_s3_encryption(resources: Sequence[PolicyResource]) -> Iterator[tuple[PolicyResource, str]]:
    for bucket in _of_type(resources, BUCKET):
        algorithms = _sse_algorithms(resources, bucket)
        if not algorithms:
            yield bucket, "bucket has no default encryption configuration"
        elif _purpose(bucket) in KMS_PURPOSES and not algorithms <= {"aws:kms", "aws:kms:dsse"}:
            yield (
                bucket,
                f"{_purpose(bucket)} bucket is encrypted with {sorted(algorithms)}, not the stack's KMS key",
            )


def check_s3_versioning(resources: Sequence[PolicyResource]) -> Iterator[tuple[PolicyResource, str]]:
    for bucket in _of_type(resources, BUCKET):
        if _purpose(bucket) not in VERSIONED_PURPOSES:
            continue
        statuses = [
            get(c.props, "versioningConfiguration", "status")
            for c in _configs(resources, BUCKET_VERSIONING, bucket)
        ]
        if "Enabled" not in statuses and not truthy(get(bucket.props, "versioning", "enabled")):
            yield (
                bucket,
                f"{_purpose(bucket)} bucket is not versioned: an overwrite or delete would lose data",
            )


def check_s3_public_access(resources: Sequence[PolicyResource]) -> Iterator[tuple[PolicyResource, str]]:
    flags = ("blockPublicAcls", "blockPublicPolicy", "ignorePublicAcls", "restrictPublicBuckets")
    for bucket in _of_type(resources, BUCKET):
        blocks = _configs(resources, BUCKET_PUBLIC_ACCESS_BLOCK, bucket)
        if not any(all(truthy(get(b.props, flag)) for flag in flags) for b in blocks):
            yield bucket, "bucket does not block public access (all four public access block settings)"


def _denies_insecure_transport(document: Mapping[str, Any]) -> bool:
    for statement in statements(document):
        condition = get(statement, "Condition", "Bool", "aws:SecureTransport")
        if get(statement, "Effect") == "Deny" and str(condition).lower() == "false":
            return True
    return False


def check_s3_tls_only(resources: Sequence[PolicyResource]) -> Iterator[tuple[PolicyResource, str]]:
    for bucket in _of_type(resources, BUCKET):
        documents = [
            policy_document(get(p.props, "policy")) for p in _configs(resources, BUCKET_POLICY, bucket)
        ]
        documents.append(policy_document(get(bucket.props, "policy")))
        if not any(_denies_insecure_transport(d) for d in documents):
            yield bucket, "bucket policy does not deny requests without TLS (aws:SecureTransport = false)"


def check_runtime_ingress(resources: Sequence[PolicyResource]) -> Iterator[tuple[PolicyResource, str]]:
    """Runtime hosts accept traffic only from other security groups (the ALB, the bastion, EFA peers)."""
    runtime_ids = {
        str(get(sg.props, "id"))
        for sg in _of_type(resources, SECURITY_GROUP)
        if get(tags_of(sg.props), ROLE_TAG) == "runtime" and get(sg.props, "id")
    }
    for sg in _of_type(resources, SECURITY_GROUP):
        if get(tags_of(sg.props), ROLE_TAG) == "runtime":
            for rule in as_list(get(sg.props, "ingress")):
                if as_list(get(rule, "cidrBlocks")) or as_list(get(rule, "ipv6CidrBlocks")):
                    yield (
                        sg,
                        "runtime security group accepts an address range; only security groups may reach it",
                    )
    for rule in _of_type(resources, INGRESS_RULE + SECURITY_GROUP_RULE):
        if str(get(rule.props, "securityGroupId", default="")) not in runtime_ids:
            continue
        if rule.resource_type in SECURITY_GROUP_RULE and get(rule.props, "type") != "ingress":
            continue
        ranges = [get(rule.props, key) for key in ("cidrIpv4", "cidrIpv6", "prefixListId")]
        ranges += as_list(get(rule.props, "cidrBlocks")) + as_list(get(rule.props, "ipv6CidrBlocks"))
        if any(ranges):
            yield (
                rule,
                "runtime hosts accept an address range; only security groups (ALB, bastion) may reach them",
            )


def _selects(selector: Any, labels: Mapping[str, Any]) -> bool:
    """A label selector's matchLabels against a pod's labels (an empty selector selects every pod)."""
    wanted = get(selector, "matchLabels", default={})
    return all(labels.get(key) == value for key, value in wanted.items())


def check_k8s_pdb_and_network_policy(
    resources: Sequence[PolicyResource],
) -> Iterator[tuple[PolicyResource, str]]:
    """Every workload has a disruption budget and a network policy that select its pods by their labels."""
    for workload in _of_type(resources, K8S_WORKLOADS):
        namespace = get(workload.props, "metadata", "namespace")
        labels = pod_template_labels(workload.resource_type, workload.props)
        near = [r for r in resources if get(r.props, "metadata", "namespace") == namespace]
        if not any(_selects(get(p.props, "spec", "selector"), labels) for p in _of_type(near, K8S_PDB)):
            yield workload, "no PodDisruptionBudget selects its pods: a node drain may take them all at once"
        own = [
            p
            for p in _of_type(near, K8S_NETWORK_POLICY)
            if get(p.props, "spec", "podSelector", "matchLabels")
            and _selects(get(p.props, "spec", "podSelector"), labels)
        ]
        if not own:
            yield workload, "no NetworkPolicy selects its pods: what may reach them is not declared"


STACK_POLICIES = [
    _stack_policy(
        "s3-encrypted", "Buckets are encrypted by default; weights and history with KMS.", check_s3_encryption
    ),
    _stack_policy("s3-weights-versioned", "Weights and history buckets are versioned.", check_s3_versioning),
    _stack_policy(
        "s3-public-access-blocked", "Buckets block every form of public access.", check_s3_public_access
    ),
    _stack_policy("s3-tls-only", "Bucket policies refuse requests without TLS.", check_s3_tls_only),
    _stack_policy(
        "runtime-ingress-from-security-groups",
        "Runtime hosts are reachable only from the ALB's (and bastion's) security groups.",
        check_runtime_ingress,
    ),
    _stack_policy(
        "k8s-pdb-and-network-policy-per-workload",
        "Every Kubernetes workload has a PodDisruptionBudget and a NetworkPolicy of its own.",
        check_k8s_pdb_and_network_policy,
    ),
]


# --- exposure rules (IAM scope, resource policies, network reach, protection, EKS) ------------------
#
# Each names what it refuses and why; the few the stack's own programs break today are advisory,
# each for that one case, with the resource that breaks it named next to the rule.

IAM_ATTACHMENT = (
    "aws:iam/rolePolicyAttachment:RolePolicyAttachment",
    "aws:iam/policyAttachment:PolicyAttachment",
    "aws:iam/userPolicyAttachment:UserPolicyAttachment",
    "aws:iam/groupPolicyAttachment:GroupPolicyAttachment",
)
SECRET_POLICY = ("aws:secretsmanager/secretPolicy:SecretPolicy",)
ECR_REPOSITORY_POLICY = ("aws:ecr/repositoryPolicy:RepositoryPolicy",)
EGRESS_RULE = ("aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule",)
LISTENER_RULE = ("aws:lb/listenerRule:ListenerRule", "aws:alb/listenerRule:ListenerRule")
EKS_CLUSTER = ("aws:eks/cluster:Cluster",)
K8S_SERVICE = ("kubernetes:core/v1:Service",)
K8S_INGRESS = ("kubernetes:networking.k8s.io/v1:Ingress",)
# What outlives a release: losing one loses weights, history, keys, secrets, images or the cluster.
STATEFUL = BUCKET + KMS_KEY + SECRET + ECR_REPOSITORY + EKS_CLUSTER
STATEFUL_MANDATORY = tuple(t for t in STATEFUL if t not in ECR_REPOSITORY)
# Actions that amount to administering the account when granted on every resource: handing any role
# to a service (iam:PassRole), rewriting IAM itself, or assuming any role.
ESCALATING_ACTIONS = ("*", "iam:*", "sts:*")
PASS_ROLE = "iam:PassRole"
ADMIN_MANAGED_POLICY = re.compile(
    r"^arn:aws[\w-]*:iam::aws:policy/(AdministratorAccess|PowerUserAccess|IAMFullAccess)$"
)
LOAD_BALANCER_ROLE = "load-balancer"  # infra/security_groups.py tags the ALB's group with this role
PUBLIC_LB_PORT = 443
# Only the API is public; /metrics and /health/* answer inside the VPC alone.
PUBLIC_PATH_PREFIX = "/v1/"
EXPOSING_SERVICE_TYPES = ("LoadBalancer", "NodePort")
SECCOMP_CONFINED = ("RuntimeDefault", "Localhost")


def _matches(pattern: str, action: str) -> bool:
    """An IAM action pattern (``*`` and ``?`` wildcards, case-insensitive) against one action."""
    regex = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern.lower())
    return re.fullmatch(regex, action.lower()) is not None


def _principals(statement: Mapping[str, Any]) -> list[str]:
    principal = get(statement, "Principal")
    if isinstance(principal, Mapping):
        return [str(p) for value in principal.values() for p in as_list(value)]
    return [str(p) for p in as_list(principal)]


def _escalation_problems(document: Mapping[str, Any], where: str) -> Iterator[str]:
    for index, statement in enumerate(statements(document)):
        if get(statement, "Effect") != "Allow":
            continue
        sid = get(statement, "Sid", default=f"#{index}")
        resources = [str(r) for r in as_list(get(statement, "Resource"))]
        if "*" not in resources and get(statement, "NotResource") is None:
            continue
        for action in (str(a) for a in as_list(get(statement, "Action"))):
            if action.lower() in ESCALATING_ACTIONS or _matches(action, PASS_ROLE):
                yield f"{where} statement {sid}: {action!r} on every resource lets its holder administer the account"


def _trust_problems(document: Mapping[str, Any]) -> Iterator[str]:
    for index, statement in enumerate(statements(document)):
        if get(statement, "Effect") == "Allow" and "*" in _principals(statement):
            sid = get(statement, "Sid", default=f"#{index}")
            yield f"trust policy statement {sid}: Principal '*' lets any AWS account assume the role"


def check_no_account_admin(props: Mapping[str, Any], args: ResourceValidationArgs) -> Iterator[str]:
    if args.resource_type in IAM_ATTACHMENT:
        arn = str(get(props, "policyArn", default=""))
        if ADMIN_MANAGED_POLICY.match(arn):
            yield f"attaches the AWS managed policy {arn.rsplit('/', 1)[-1]}"
        return
    if args.resource_type in IAM_ROLE:
        yield from _trust_problems(policy_document(get(props, "assumeRolePolicy")))
        for arn in (str(a) for a in as_list(get(props, "managedPolicyArns"))):
            if ADMIN_MANAGED_POLICY.match(arn):
                yield f"attaches the AWS managed policy {arn.rsplit('/', 1)[-1]}"
        for inline in as_list(get(props, "inlinePolicies")):
            yield from _escalation_problems(
                policy_document(get(inline, "policy")), f"inline policy {get(inline, 'name')}"
            )
        return
    yield from _escalation_problems(policy_document(get(props, "policy")), "policy")


def check_resource_policy_not_public(props: Mapping[str, Any], _: ResourceValidationArgs) -> Iterator[str]:
    # A Deny to everyone (the TLS-only statement) is how a policy narrows access, so only Allow counts.
    for index, statement in enumerate(statements(policy_document(get(props, "policy")))):
        if get(statement, "Effect") != "Allow" or "*" not in _principals(statement):
            continue
        if not get(statement, "Condition"):
            sid = get(statement, "Sid", default=f"#{index}")
            yield f"resource policy statement {sid}: Principal '*' with no Condition grants anyone on the internet"


def _stack_of(urn: str) -> str:
    """``urn:pulumi:<stack>::<project>::...``: the stack a resource belongs to."""
    return urn.split("::", 1)[0].removeprefix("urn:pulumi:")


def check_production_protected(props: Mapping[str, Any], args: ResourceValidationArgs) -> Iterator[str]:
    production = get(args.get_config(), "productionStacks", default=PRODUCTION_STACKS)
    stack = _stack_of(args.urn)
    if stack not in production:
        return
    protect = getattr(args.opts, "protect", None)
    if not protect:
        yield (
            f"stateful resource of production stack {stack!r} is not protected: "
            "set protect=True (directly or on its component) so `pulumi destroy` cannot delete it"
        )


def check_eks_private_endpoint(props: Mapping[str, Any], _: ResourceValidationArgs) -> Iterator[str]:
    # EKS makes the endpoint public unless told otherwise, so a missing flag is a public endpoint.
    if get(props, "vpcConfig", "endpointPublicAccess") in (None, True, "true"):
        yield "EKS API endpoint is public: set vpc_config.endpoint_public_access=False"


def check_launch_template_devices(props: Mapping[str, Any], _: ResourceValidationArgs) -> Iterator[str]:
    # Without mappings the AMI's own apply: an unencrypted root of the AMI's size and speed.
    if not as_list(get(props, "blockDeviceMappings")):
        yield "launch template has no block device mappings: the AMI's unencrypted default root applies"


def _not_api(path: Any) -> bool:
    # "/v1" is the API too: an Ingress Prefix path matches by whole path elements (/v1, /v1/...).
    text = str(path or "")
    return not (text.startswith(PUBLIC_PATH_PREFIX) or text == PUBLIC_PATH_PREFIX.rstrip("/"))


def check_listener_rules_api_only(props: Mapping[str, Any], _: ResourceValidationArgs) -> Iterator[str]:
    if not any(get(a, "type") == "forward" for a in as_list(get(props, "actions"))):
        return
    paths = [p for c in as_list(get(props, "conditions")) for p in as_list(get(c, "pathPattern", "values"))]
    if not paths:
        yield f"listener rule forwards without a path condition: only {PUBLIC_PATH_PREFIX}* may be public"
    for path in filter(_not_api, paths):
        yield f"listener rule forwards {path!r}: only {PUBLIC_PATH_PREFIX}* may be public"


def check_ingress_api_only(props: Mapping[str, Any], _: ResourceValidationArgs) -> Iterator[str]:
    backend = get(props, "spec", "defaultBackend")
    if backend:
        yield f"Ingress has a default backend: it forwards every path, only {PUBLIC_PATH_PREFIX}* may be public"
    for rule in as_list(get(props, "spec", "rules")):
        for entry in as_list(get(rule, "http", "paths")):
            path = get(entry, "path")
            if _not_api(path):
                yield f"Ingress forwards {path or '(every path)'!r}: only {PUBLIC_PATH_PREFIX}* may be public"


def check_service_not_exposed(props: Mapping[str, Any], _: ResourceValidationArgs) -> Iterator[str]:
    kind = get(props, "spec", "type", default="ClusterIP")
    if kind in EXPOSING_SERVICE_TYPES:
        yield f"Service of type {kind} opens the nodes or a load balancer of its own; use ClusterIP behind the Ingress"


def _all_containers(spec: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [*as_list(get(spec, "initContainers")), *as_list(get(spec, "containers"))]


def check_k8s_containers_hardened(props: Mapping[str, Any], args: ResourceValidationArgs) -> Iterator[str]:
    for spec in pod_specs(args.resource_type, props):
        yield from _hardening(spec)


def _hardening(spec: Mapping[str, Any]) -> Iterator[str]:
    pod_seccomp = get(spec, "securityContext", "seccompProfile", "type")
    for container in _all_containers(spec):
        name, security = get(container, "name"), get(container, "securityContext", default={})
        if not truthy(get(security, "readOnlyRootFilesystem")):
            yield f"container {name!r} has a writable root file system (readOnlyRootFilesystem: true)"
        if get(security, "seccompProfile", "type", default=pod_seccomp) not in SECCOMP_CONFINED:
            yield f"container {name!r} runs without a seccomp profile (seccompProfile.type: RuntimeDefault)"


def check_k8s_containers_limited(props: Mapping[str, Any], args: ResourceValidationArgs) -> Iterator[str]:
    for container in (c for spec in pod_specs(args.resource_type, props) for c in _all_containers(spec)):
        limits = get(container, "resources", "limits", default={})
        missing = [r for r in ("cpu", "memory") if get(limits, r) is None]
        if missing:
            yield f"container {get(container, 'name')!r} has no {' or '.join(missing)} limit"


EXPOSURE_POLICIES = [
    _resource_policy(
        "iam-no-account-admin",
        "No IAM grant of iam:PassRole, iam:*, sts:* or * on every resource, no trust of Principal '*', "
        "no AWS managed admin policies.",
        IAM_POLICY + IAM_ROLE + IAM_ATTACHMENT,
        check_no_account_admin,
    ),
    _resource_policy(
        "resource-policies-not-public",
        "Bucket, key, secret and repository policies grant Principal '*' only under a Condition.",
        BUCKET_POLICY + BUCKET + KMS_KEY + SECRET_POLICY + ECR_REPOSITORY_POLICY,
        check_resource_policy_not_public,
    ),
    _resource_policy(
        "production-stateful-protected",
        "Production buckets, keys, secrets, repositories and clusters are protected from deletion.",
        STATEFUL_MANDATORY + ECR_REPOSITORY,
        check_production_protected,
        config_schema=PRODUCTION_SCHEMA,
    ),
    _resource_policy(
        "eks-private-endpoint", "The EKS API endpoint is private.", EKS_CLUSTER, check_eks_private_endpoint
    ),
    _resource_policy(
        "launch-template-block-devices",
        "Launch templates map their volumes (size, speed, encryption) rather than take the AMI's.",
        LAUNCH_TEMPLATE,
        check_launch_template_devices,
    ),
    _resource_policy(
        "alb-listener-rules-forward-only-api",
        "ALB listener rules forward only /v1/ paths.",
        LISTENER_RULE,
        check_listener_rules_api_only,
    ),
    _resource_policy(
        "k8s-ingress-forwards-only-api",
        "Ingresses forward only /v1/ paths.",
        K8S_INGRESS,
        check_ingress_api_only,
    ),
    _resource_policy(
        "k8s-services-not-exposed",
        "Kubernetes Services are neither LoadBalancer nor NodePort: the Ingress is the only way in.",
        K8S_SERVICE,
        check_service_not_exposed,
    ),
    _resource_policy(
        "k8s-containers-hardened",
        "Containers have a read-only root file system and a RuntimeDefault seccomp profile.",
        K8S_POD_OWNERS,
        check_k8s_containers_hardened,
    ),
    _resource_policy(
        "k8s-containers-limited",
        "Containers have CPU and memory limits.",
        K8S_POD_OWNERS,
        check_k8s_containers_limited,
    ),
]


# --- network reach: which groups may talk to the internet, and on what ------------------------------


def _group_roles(resources: Sequence[PolicyResource]) -> dict[str, str]:
    """Security group id -> its ``frontier:role`` tag (runtime, load-balancer, ...)."""
    return {
        str(get(sg.props, "id")): str(get(tags_of(sg.props), ROLE_TAG, default=""))
        for sg in _of_type(resources, SECURITY_GROUP)
        if get(sg.props, "id")
    }


def _open_rules(
    resources: Sequence[PolicyResource], direction: str
) -> Iterator[tuple[PolicyResource, str, str, int | None, int | None, list[str]]]:
    """Every rule in ``direction`` ("ingress"/"egress") open to 0.0.0.0/0 or ::/0: (the resource
    holding it, its group's role, protocol, from port, to port, the open ranges), whether the rule is
    inline in the group, a SecurityGroupRule or one of the vpc ingress/egress rule resources."""
    roles = _group_roles(resources)
    for sg in _of_type(resources, SECURITY_GROUP):
        role = str(get(tags_of(sg.props), ROLE_TAG, default=""))
        for rule in as_list(get(sg.props, direction)):
            ranges = [*as_list(get(rule, "cidrBlocks")), *as_list(get(rule, "ipv6CidrBlocks"))]
            public = [str(c) for c in ranges if str(c) in ANYWHERE]
            if public:
                yield sg, role, str(get(rule, "protocol")), *_ports(rule), public
    separate = (INGRESS_RULE if direction == "ingress" else EGRESS_RULE) + SECURITY_GROUP_RULE
    for rule in _of_type(resources, separate):
        if rule.resource_type in SECURITY_GROUP_RULE:
            if get(rule.props, "type") != direction:
                continue
            ranges = [*as_list(get(rule.props, "cidrBlocks")), *as_list(get(rule.props, "ipv6CidrBlocks"))]
            protocol = get(rule.props, "protocol")
        else:
            ranges = [get(rule.props, "cidrIpv4"), get(rule.props, "cidrIpv6")]
            protocol = get(rule.props, "ipProtocol")
        public = [str(c) for c in ranges if str(c) in ANYWHERE]
        if public:
            role = roles.get(str(get(rule.props, "securityGroupId", default="")), "")
            yield rule, role, str(protocol), *_ports(rule.props), public


def _ports(rule: Any) -> tuple[int | None, int | None]:
    return as_int(get(rule, "fromPort")), as_int(get(rule, "toPort"))


def _single_tcp_port(protocol: str, low: int | None, high: int | None) -> int | None:
    return low if protocol.lower() in ("tcp", "6") and low == high else None


# The runtime hosts' HTTPS/HTTP to anywhere (infra/security_groups.py: runtime-out-443, runtime-out-80,
# for packages, images, weights and AWS APIs) exists only where a stack sets network.egress: internet
# (an AMI that installs its packages at boot); reported by the advisory rule below, and refused on
# production stacks (production-runtime-egress-to-endpoints).
RUNTIME_WEB_PORTS = (443, 80)


def check_runtime_egress(resources: Sequence[PolicyResource]) -> Iterator[tuple[PolicyResource, str]]:
    for holder, role, protocol, low, high, public in _open_rules(resources, "egress"):
        if role == RUNTIME_ROLE and _single_tcp_port(protocol, low, high) not in RUNTIME_WEB_PORTS:
            yield holder, f"runtime hosts may send {protocol} {low}-{high} to {', '.join(public)}"


def check_runtime_web_egress(resources: Sequence[PolicyResource]) -> Iterator[tuple[PolicyResource, str]]:
    for holder, role, protocol, low, high, public in _open_rules(resources, "egress"):
        if role == RUNTIME_ROLE and _single_tcp_port(protocol, low, high) in RUNTIME_WEB_PORTS:
            yield (
                holder,
                f"runtime hosts may send TCP {low} to {', '.join(public)}, not only to AWS endpoints",
            )


# The ALB's port 80 from anywhere (infra/security_groups.py: alb-80) only redirects to HTTPS
# (alb-http-redirects-to-https); it is reported by the advisory rule below rather than refused.
LB_REDIRECT_PORT = 80


def check_public_ingress(resources: Sequence[PolicyResource]) -> Iterator[tuple[PolicyResource, str]]:
    for holder, role, protocol, low, high, public in _open_rules(resources, "ingress"):
        port = _single_tcp_port(protocol, low, high)
        if role == LOAD_BALANCER_ROLE and port in (PUBLIC_LB_PORT, LB_REDIRECT_PORT):
            continue
        yield (
            holder,
            f"{role or 'untagged'} group takes {protocol} {low}-{high} from {', '.join(public)}: "
            f"only the load balancer's {PUBLIC_LB_PORT} is public",
        )


def check_lb_redirect_port(resources: Sequence[PolicyResource]) -> Iterator[tuple[PolicyResource, str]]:
    for holder, role, protocol, low, high, public in _open_rules(resources, "ingress"):
        if role == LOAD_BALANCER_ROLE and _single_tcp_port(protocol, low, high) == LB_REDIRECT_PORT:
            yield (
                holder,
                f"load balancer takes TCP {LB_REDIRECT_PORT} from {', '.join(public)} (a redirect only)",
            )


REACH_POLICIES = [
    _stack_policy(
        "runtime-egress-not-anywhere",
        "Runtime hosts send nothing to 0.0.0.0/0 or ::/0 (but HTTPS/HTTP, see the advisory rule).",
        check_runtime_egress,
        EnforcementLevel.MANDATORY,
    ),
    _stack_policy(
        "runtime-web-egress-to-anywhere",
        "Runtime hosts' HTTPS/HTTP to 0.0.0.0/0 or ::/0, reported until they reach AWS through endpoints.",
        check_runtime_web_egress,
        EnforcementLevel.ADVISORY,
    ),
    _stack_policy(
        "public-ingress-only-to-load-balancer",
        "Only the load balancer's group takes traffic from 0.0.0.0/0 or ::/0, and only on 443.",
        check_public_ingress,
        EnforcementLevel.MANDATORY,
    ),
    _stack_policy(
        "lb-redirect-port-public",
        "The load balancer's HTTP redirect port taking traffic from anywhere, reported.",
        check_lb_redirect_port,
        EnforcementLevel.ADVISORY,
    ),
]


# --- closed doors on production stacks: who reaches the balancer, how it reaches the hosts, where ---
# --- the hosts may send (infra/edge.py, infra/security_groups.py) --------------------------------

TARGET_GROUP = ("aws:lb/targetGroup:TargetGroup", "aws:alb/targetGroup:TargetGroup")
WEB_ACL_ASSOCIATION = ("aws:wafv2/webAclAssociation:WebAclAssociation",)


def _production_stacks(config: Mapping[str, Any] | None) -> list[str]:
    return list(get(config or {}, "productionStacks", default=PRODUCTION_STACKS))


def check_production_targets_https(props: Mapping[str, Any], args: ResourceValidationArgs) -> Iterator[str]:
    stack = _stack_of(args.urn)
    if stack not in _production_stacks(args.get_config()):
        return
    # Lambda targets have no protocol; only a plain HTTP hop from the balancer is refused.
    if str(get(props, "protocol", default="")).upper() == "HTTP":
        yield (
            f"target group of production stack {stack!r} forwards plain HTTP to its targets: use HTTPS "
            "(runtime hosts terminate TLS on their own proxy)"
        )
    if str(get(props, "healthCheck", "protocol", default="")).upper() == "HTTP":
        yield f"target group of production stack {stack!r} checks its targets' health over plain HTTP: use HTTPS"


def _production_stack_policy(
    name: str,
    description: str,
    check: Callable[[Sequence[PolicyResource], Sequence[str]], Iterable[tuple[PolicyResource, str]]],
) -> StackValidationPolicy:
    def validate(args: StackValidationArgs, report_violation: ReportViolation) -> None:
        for resource, message in check(list(args.resources), _production_stacks(args.get_config())):
            report_violation(f"{resource.name}: {message}", resource.urn)

    return StackValidationPolicy(
        name=name,
        description=description,
        validate=validate,
        enforcement_level=EnforcementLevel.MANDATORY,
        config_schema=PRODUCTION_SCHEMA,
    )


def _open_group_ids(resources: Sequence[PolicyResource]) -> set[str]:
    """The security groups that take traffic from 0.0.0.0/0 or ::/0, on any port."""
    ids = set()
    for holder, *_ in _open_rules(resources, "ingress"):
        group = get(holder.props, "id") if holder.resource_type in SECURITY_GROUP else None
        ids.add(str(group or get(holder.props, "securityGroupId", default="")))
    return ids


def check_production_lb_allowlisted(
    resources: Sequence[PolicyResource], production: Sequence[str]
) -> Iterator[tuple[PolicyResource, str]]:
    """A production balancer open to the internet needs a WAF in front (where a public API's own
    rules live) or an allowlist; a rate limit or an IP set in the WAF is the operator's choice."""
    open_groups = _open_group_ids(resources)
    guarded = {str(get(a.props, "resourceArn")) for a in _of_type(resources, WEB_ACL_ASSOCIATION)}
    for lb in _of_type(resources, LOAD_BALANCER):
        stack = _stack_of(lb.urn)
        if (
            stack not in production
            or truthy(get(lb.props, "internal"))
            or str(get(lb.props, "arn")) in guarded
        ):
            continue
        if any(str(group) in open_groups for group in as_list(get(lb.props, "securityGroups"))):
            yield (
                lb,
                f"internet-facing load balancer of production stack {stack!r} admits 0.0.0.0/0 with no WAF: "
                "set edge.allow_cidrs, edge.scheme: internal, or a WAF (edge.waf_rate_limit)",
            )


def check_production_runtime_egress(
    resources: Sequence[PolicyResource], production: Sequence[str]
) -> Iterator[tuple[PolicyResource, str]]:
    for holder, role, protocol, low, high, public in _open_rules(resources, "egress"):
        stack = _stack_of(holder.urn)
        if role == RUNTIME_ROLE and stack in production:
            yield (
                holder,
                f"runtime hosts of production stack {stack!r} may send {protocol} {low}-{high} to "
                f"{', '.join(public)}: they reach only the VPC and its endpoints (network.egress: endpoints)",
            )


DOOR_POLICIES = [
    _resource_policy(
        "production-targets-https",
        "Production target groups forward to and check their targets over HTTPS.",
        TARGET_GROUP,
        check_production_targets_https,
        config_schema=PRODUCTION_SCHEMA,
    ),
    _production_stack_policy(
        "production-lb-allowlisted",
        "A production load balancer open to 0.0.0.0/0 is internal, allowlisted or behind a WAF.",
        check_production_lb_allowlisted,
    ),
    _production_stack_policy(
        "production-runtime-egress-to-endpoints",
        "Production runtime hosts send nothing to 0.0.0.0/0 or ::/0, on any port.",
        check_production_runtime_egress,
    ),
]

# --- the quota store (infra/quota_store.py) ---------------------------------------------------------

CACHE_GROUP = ("aws:elasticache/replicationGroup:ReplicationGroup",)


def check_cache_closed(props: Mapping[str, Any], _: ResourceValidationArgs) -> Iterator[str]:
    if not truthy(get(props, "transitEncryptionEnabled")):
        yield "ElastiCache group without encryption in transit: set transit_encryption_enabled=True"
    if not truthy(get(props, "atRestEncryptionEnabled")):
        yield "ElastiCache group without encryption at rest: set at_rest_encryption_enabled=True"
    if not get(props, "authToken"):
        yield "ElastiCache group takes clients without an AUTH token: set auth_token"


# Checked on every stack: the store holds no data worth less protection outside production.
STORE_POLICIES = [
    _resource_policy(
        "cache-encrypted-with-auth",
        "ElastiCache groups encrypt in transit and at rest and require an AUTH token.",
        CACHE_GROUP,
        check_cache_closed,
    ),
]

POLICIES = (
    RESOURCE_POLICIES + EXPOSURE_POLICIES + STACK_POLICIES + REACH_POLICIES + DOOR_POLICIES + STORE_POLICIES
)
