"""The GPU hosts (infra/nodes.py, infra/gateway.py): how a launch template boots them and how their
auto scaling group brings them into service.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from frontier_hostside.names import DISCOVERY_TAGS
from pulumi_policy import EnforcementLevel, ResourceValidationArgs

from policy.rules.reading import as_int, as_list, get, truthy
from policy.rules.validation import resource_policy

MAX_METADATA_HOPS = 2
LAUNCH_TEMPLATE = ("aws:ec2/launchTemplate:LaunchTemplate",)
INSTANCE = ("aws:ec2/instance:Instance",)
VOLUME = ("aws:ebs/volume:Volume",)
AUTOSCALING_GROUP = ("aws:autoscaling/group:Group",)


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


def check_launch_template_devices(props: Mapping[str, Any], _: ResourceValidationArgs) -> Iterator[str]:
    # Without mappings the AMI's own apply: an unencrypted root of the AMI's size and speed.
    if not as_list(get(props, "blockDeviceMappings")):
        yield "launch template has no block device mappings: the AMI's unencrypted default root applies"


def check_no_public_ip(props: Mapping[str, Any], args: ResourceValidationArgs) -> Iterator[str]:
    if args.resource_type in INSTANCE:
        if truthy(get(props, "associatePublicIpAddress")):
            yield "instance gets a public IP address; hosts live in private subnets behind the ALB"
        return
    for interface in as_list(get(props, "networkInterfaces")):
        if truthy(get(interface, "associatePublicIpAddress")):
            yield "launch template gives hosts a public IP address; hosts live in private subnets behind the ALB"


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


POLICIES = [
    resource_policy(
        "imdsv2-required",
        "Instances require IMDSv2 with a small hop limit.",
        LAUNCH_TEMPLATE + INSTANCE,
        check_imdsv2,
    ),
    resource_policy(
        "ebs-encrypted",
        "EBS volumes (launch templates, instances, volumes) are encrypted.",
        LAUNCH_TEMPLATE + INSTANCE + VOLUME,
        check_ebs_encrypted,
    ),
    resource_policy(
        "launch-template-block-devices",
        "Launch templates map their volumes (size, speed, encryption) rather than take the AMI's.",
        LAUNCH_TEMPLATE,
        check_launch_template_devices,
    ),
    resource_policy(
        "no-public-ip-on-hosts",
        "Hosts get no public IP address.",
        LAUNCH_TEMPLATE + INSTANCE,
        check_no_public_ip,
    ),
    resource_policy(
        "asg-discovery-tags",
        "Auto scaling groups tag instances so `fab` can discover them.",
        AUTOSCALING_GROUP,
        check_discovery_tags,
        EnforcementLevel.ADVISORY,
    ),
    resource_policy(
        "asg-launch-hook",
        "Serving auto scaling groups hold new hosts in a launch lifecycle hook that abandons by default.",
        AUTOSCALING_GROUP,
        check_launch_hook,
    ),
    resource_policy(
        "asg-waits-for-capacity",
        "Auto scaling groups make `pulumi up` wait for capacity.",
        AUTOSCALING_GROUP,
        check_waits_for_capacity,
    ),
]
