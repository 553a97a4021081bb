"""GPU node groups: launch template and auto scaling group sized and secured from the stack."""

from __future__ import annotations

import base64

import frontier_hostside
import pytest
from frontier_hostside.names import CACHE_DEVICE_NAME
from infra_mocks import ROOT_DEVICE, run_program

from frontier.capacity.startup import instance_warmup
from frontier.render.boot import render_cloud_init, render_mount_cache
from frontier.targets import load_stack
from infra.nodes import architecture, launch_timeout_s, needs_efa

LAUNCH_TEMPLATE = "aws:ec2/launchTemplate:LaunchTemplate"
ASG = "aws:autoscaling/group:Group"


def template(graph):
    return graph.one(LAUNCH_TEMPLATE, f"{graph.stack}-{graph.settings.serving_group.name}-lt")


def asg(graph):
    return graph.one(ASG, f"{graph.stack}-{graph.settings.serving_group.name}-asg")


def volume(graph, device):
    return next(m["ebs"] for m in template(graph).inputs["blockDeviceMappings"] if m["deviceName"] == device)


def security_group_id(graph, key):
    return graph.one("aws:ec2/securityGroup:SecurityGroup", f"{graph.stack}-sg-{key}").id


_efa_graph = {}


@pytest.fixture
def efa():
    """Staging with EFA asked for on its node group: the placement-group path."""
    if not _efa_graph:
        settings = load_stack("staging")
        group = settings.serving_group.model_copy(update={"efa": True})
        _efa_graph["graph"] = run_program(settings.model_copy(update={"node_groups": (group,)}))
    return _efa_graph["graph"]


def test_launch_template_uses_the_stacks_instance_type(graph):
    assert template(graph).inputs["instanceType"] == graph.settings.serving_group.instance_type


def test_launch_template_boots_the_ami_pinned_in_the_stack_never_latest(graph):
    assert template(graph).inputs["imageId"] == graph.settings.serving_group.ami_id
    # No "latest" lookup at `pulumi up`: the SSM parameter is read only by `fab ami.latest`.
    assert not [token for token, _ in graph.invokes if token == "aws:ssm/getParameter:getParameter"]
    [(_, ami_lookup)] = [i for i in graph.invokes if i[0] == "aws:ec2/getAmi:getAmi"]
    assert ami_lookup["filters"] == [{"name": "image-id", "values": [graph.settings.serving_group.ami_id]}]


def test_instance_metadata_requires_imdsv2_within_two_hops(graph):
    options = template(graph).inputs["metadataOptions"]
    assert options["httpTokens"] == "required"
    assert options["httpPutResponseHopLimit"] in (1, 2)


def test_root_volume_is_encrypted_gp3_of_the_configured_size_on_the_amis_root_device(graph):
    root = volume(graph, ROOT_DEVICE)
    assert root == {
        "volumeType": "gp3",
        "volumeSize": graph.settings.serving_group.root_volume_gb,
        "encrypted": "true",
        "deleteOnTermination": "true",
    }


def test_model_cache_is_instance_store_nvme_where_the_type_has_it_else_gp3(graph):
    devices = [m["deviceName"] for m in template(graph).inputs["blockDeviceMappings"]]
    script = render_mount_cache(graph.settings, graph.settings.serving_group)
    if graph.settings.serving_group.model_cache == "instance_store":
        # p5 / g6e: no EBS cache volume; the host stripes its NVMe disks at boot.
        assert devices == [ROOT_DEVICE]
        assert "mdadm --create" in script and "--level=0" in script
    else:
        assert devices == [ROOT_DEVICE, CACHE_DEVICE_NAME]
        assert "Elastic Block Store" in script and "mdadm" not in script


def test_the_shipped_stacks_use_nvme_on_p5_and_g6e_and_gp3_on_g5(prod, staging, dev):
    assert [g.settings.serving_group.model_cache for g in (prod, staging, dev)] == [
        "instance_store",
        "instance_store",
        "ebs",
    ]


def test_model_cache_volume_is_encrypted_gp3_where_cloud_init_mounts_it(dev):
    graph = dev
    cache = volume(graph, CACHE_DEVICE_NAME)
    assert cache["volumeType"] == "gp3" and cache["encrypted"] == "true"
    assert cache["volumeSize"] == graph.settings.serving_group.cache_volume_gb
    assert cache["throughput"] > 125  # above gp3's baseline: weights load at volume speed


def test_hosts_get_no_public_address_and_only_the_runtime_security_group(graph):
    [interface] = template(graph).inputs["networkInterfaces"]
    assert interface["associatePublicIpAddress"] == "false"
    assert interface["securityGroups"] == [security_group_id(graph, "runtime")]


def test_hosts_run_with_the_runtime_instance_profile(graph):
    profile = graph.one("aws:iam/instanceProfile:InstanceProfile")
    assert template(graph).inputs["iamInstanceProfile"] == {"arn": profile.outputs["arn"]}
    assert (
        profile.inputs["role"] == graph.one("aws:iam/role:Role", f"{graph.stack}-iam-runtime").outputs["name"]
    )


def test_user_data_is_the_cloud_init_rendered_for_the_group(graph):
    user_data = base64.b64decode(template(graph).inputs["userData"]).decode()
    history = graph.outputs["history_bucket"]
    assert user_data == render_cloud_init(
        graph.settings,
        graph.settings.serving_group,
        history_bucket=history,
        history_prefix=graph.outputs["history_prefix"],
        launch_timeout_s=launch_timeout_s(graph.settings.rollout.readiness_timeout_s),
    )
    # Thin: the host tools come from the history bucket, where `pulumi up` puts them.
    assert f"s3://{history}/history/{graph.stack}/host/{graph.settings.serving_group.name}/" in user_data
    # No package list: docker.io is installed only where the AMI has no container engine at all.
    assert "packages:" not in user_data
    assert user_data.count("apt-get install -y -qq docker.io") == 1
    assert "if ! command -v docker >/dev/null; then" in user_data


def test_the_host_tools_are_uploaded_beside_the_history(graph):
    group = graph.settings.serving_group.name
    keys = {o.inputs["key"] for o in graph.of_type("aws:s3/bucketObjectv2:BucketObjectv2")}
    prefix = f"history/{graph.stack}/host/{group}/"
    assert {k for k in keys if k.startswith(prefix)} == {
        prefix + name
        for name in (
            "frontier-agent.py",
            "frontier-bootstrap.py",
            "frontier_hostside/__init__.py",  # the names the agent and the bootstrap import
            "frontier_hostside/names.py",
            "frontier_hostside/processes.py",  # the agent's and its keepers' pids and records
            "frontier_hostside/keeper.py",
            "frontier_hostside/supervisor.py",
            "frontier_hostside/watchdog.py",
            "frontier_hostside/interruption.py",  # the agent's spot-notice watcher
            "frontier_hostside/weights_cache.py",
            "frontier_hostside/aws_cli.py",  # the bootstrap's modules
            "frontier_hostside/node_boot.py",
            "frontier_hostside/gateway_boot.py",
            "frontier_hostside/rendezvous.py",  # the bootstrap's replica slots
            "frontier_hostside/release_signature.py",  # the agent's check of a release's signature
            "frontier-agent.json",
            "install-nvidia.sh",
            "mount-cache.sh",
            "cloudwatch-agent.json",
            "haproxy-tls.cfg",  # the TLS proxy the ALB reaches (infra/edge.py)
        )
    }
    objects = graph.of_type("aws:s3/bucketObjectv2:BucketObjectv2")
    assert {o.inputs["bucket"] for o in objects} == {graph.outputs["history_bucket"]}
    assert all(o.inputs["serverSideEncryption"] == "aws:kms" for o in objects)
    for name, data in frontier_hostside.host_tools().items():
        [uploaded] = [o for o in objects if o.inputs["key"] == prefix + name]
        assert uploaded.inputs["content"] == data.decode(), name


def test_lifecycle_hooks_hold_a_new_host_until_it_serves_and_drain_one_on_scale_in(graph):
    hooks = {h["name"]: h for h in asg(graph).inputs["initialLifecycleHooks"]}
    launch, terminate = hooks["frontier-launch"], hooks["frontier-terminate"]
    assert launch["lifecycleTransition"] == "autoscaling:EC2_INSTANCE_LAUNCHING"
    assert launch["defaultResult"] == "ABANDON"  # a host that never says it is ready never serves
    assert launch["heartbeatTimeout"] >= graph.settings.rollout.readiness_timeout_s
    assert terminate["lifecycleTransition"] == "autoscaling:EC2_INSTANCE_TERMINATING"
    assert terminate["defaultResult"] == "CONTINUE"
    rollout, runtime = graph.settings.rollout, graph.settings.runtime
    assert terminate["heartbeatTimeout"] >= rollout.deregistration_delay_s + runtime.drain_timeout_s


def test_a_target_tracking_policy_scales_on_the_published_queue_depth_per_host(graph):
    group = graph.settings.serving_group
    policy = graph.one("aws:autoscaling/policy:Policy", f"{graph.stack}-{group.name}-queue-depth").inputs
    assert policy["autoscalingGroupName"] == asg(graph).outputs["name"]
    assert policy["policyType"] == "TargetTrackingScaling"
    tracking = policy["targetTrackingConfiguration"]
    assert tracking["targetValue"] == group.target_queue_depth
    assert tracking["disableScaleIn"] is True  # infra/scale_in.py decides when hosts go
    metric = tracking["customizedMetricSpecification"]
    assert (metric["namespace"], metric["metricName"], metric["statistic"]) == (
        "Frontier/Runtime",
        "QueueDepth",
        "Average",
    )
    assert metric["metricDimensions"] == [
        {"name": "Stack", "value": graph.stack},
        {"name": "NodeGroup", "value": group.name},
    ]


def test_a_step_policy_adds_a_replica_while_the_groups_ttft_p90_stays_over_the_slo(graph):
    group = graph.settings.serving_group
    name = f"{graph.stack}-{group.name}-ttft-out"
    policy = graph.one("aws:autoscaling/policy:Policy", name)
    assert policy.inputs["policyType"] == "StepScaling"
    assert policy.inputs["adjustmentType"] == "ChangeInCapacity"
    assert policy.inputs["stepAdjustments"] == [{"scalingAdjustment": 1, "metricIntervalLowerBound": "0"}]
    alarm = graph.one("aws:cloudwatch/metricAlarm:MetricAlarm", name).inputs
    # The percentile of every request the group's hosts timed (values with counts), not of hosts.
    assert (alarm["namespace"], alarm["metricName"], alarm["extendedStatistic"]) == (
        "Frontier/Runtime",
        "TimeToFirstToken",
        "p90",
    )
    assert alarm["dimensions"] == {"Stack": graph.stack, "NodeGroup": group.name}
    assert alarm["threshold"] == graph.settings.slo.ttft_ms  # ms, as hosts publish it
    assert (alarm["evaluationPeriods"], alarm["datapointsToAlarm"], alarm["period"]) == (3, 3, 60)
    assert alarm["treatMissingData"] == "notBreaching"  # no traffic publishes no TTFT
    assert alarm["alarmActions"] == [policy.outputs["arn"]]


def test_pulumi_leaves_the_desired_capacity_to_the_scaling_policy(graph):
    assert "desiredCapacity" in asg(graph).ignored_changes


def test_pulumi_up_fails_when_the_gpus_never_come(graph):
    timeout = asg(graph).inputs["waitForCapacityTimeout"]
    assert timeout != "0" and timeout.endswith("m")
    assert int(timeout[:-1]) * 60 >= launch_timeout_s(graph.settings.rollout.readiness_timeout_s)


def test_an_ami_or_template_change_rolls_as_an_instance_refresh(graph):
    refresh = asg(graph).inputs["instanceRefresh"]
    assert refresh["strategy"] == "Rolling"
    preferences = refresh["preferences"]
    group, rollout = graph.settings.serving_group, graph.settings.rollout
    if rollout.max_surge and group.max_size > group.desired_size:
        # Surge: new hosts first (each through the launch hook), then old ones retire.
        assert preferences["minHealthyPercentage"] == 100 and preferences["maxHealthyPercentage"] > 100
    else:
        assert preferences["maxHealthyPercentage"] == 100 and preferences["minHealthyPercentage"] < 100
    assert preferences["skipMatching"] is True and preferences["autoRollback"] is True


def test_auto_scaling_group_follows_the_stacks_sizes(graph):
    group, inputs = graph.settings.serving_group, asg(graph).inputs
    assert (inputs["minSize"], inputs["desiredCapacity"], inputs["maxSize"]) == (
        group.min_size,
        group.desired_size,
        group.max_size,
    )


def test_auto_scaling_group_spreads_over_the_private_subnets(graph):
    assert asg(graph).inputs["vpcZoneIdentifiers"] == graph.outputs["private_subnet_ids"]


def test_auto_scaling_group_launches_the_templates_latest_version(graph):
    lt = template(graph)
    assert asg(graph).inputs["launchTemplate"] == {"id": lt.id, "version": str(lt.outputs["latestVersion"])}


def test_serving_hosts_join_the_target_group_and_are_replaced_when_unhealthy(graph):
    inputs = asg(graph).inputs
    assert inputs["targetGroupArns"] == [graph.outputs["target_group_arn"]]
    assert inputs["healthCheckType"] == "ELB"
    assert inputs["healthCheckGracePeriod"] >= graph.settings.rollout.readiness_timeout_s


def test_instances_carry_the_tags_fab_discovers_them_by(graph):
    tags = {t["key"]: t["value"] for t in asg(graph).inputs["tags"] if t["propagateAtLaunch"]}
    assert tags["frontier:stack"] == graph.stack
    assert tags["frontier:node-group"] == graph.settings.serving_group.name
    assert tags["frontier:role"] == "runtime"
    instance_tags = next(
        t["tags"] for t in template(graph).inputs["tagSpecifications"] if t["resourceType"] == "instance"
    )
    assert {k: instance_tags[k] for k in tags} == tags


def test_groups_without_efa_spread_without_a_placement_group(graph):
    assert not graph.of_type("aws:ec2/placementGroup:PlacementGroup")
    assert "placementGroup" not in asg(graph).inputs
    assert "interfaceType" not in template(graph).inputs["networkInterfaces"][0]


def test_efa_groups_get_a_cluster_placement_group_in_one_zone(efa):
    placement = efa.one("aws:ec2/placementGroup:PlacementGroup")
    assert placement.inputs["strategy"] == "cluster"
    assert asg(efa).inputs["placementGroup"] == placement.outputs["name"]
    assert asg(efa).inputs["vpcZoneIdentifiers"] == efa.outputs["private_subnet_ids"][:1]
    assert template(efa).inputs["placement"] == {"groupName": placement.outputs["name"]}


def test_efa_groups_attach_an_efa_interface_and_talk_to_their_peers(efa):
    assert template(efa).inputs["networkInterfaces"][0]["interfaceType"] == "efa"
    runtime = security_group_id(efa, "runtime")
    for kind in ("Ingress", "Egress"):
        rules = [
            r.inputs
            for r in efa.of_type(f"aws:vpc/securityGroup{kind}Rule:SecurityGroup{kind}Rule")
            if r.inputs["securityGroupId"] == runtime and r.inputs["ipProtocol"] == "-1"
        ]
        assert [r["referencedSecurityGroupId"] for r in rules] == [runtime]


def test_a_model_sharded_across_nodes_turns_efa_on(staging):
    settings = staging.settings
    group = settings.serving_group
    assert not needs_efa(settings, group)
    wide = settings.model_copy(
        update={"runtime": settings.runtime.model_copy(update={"pipeline_parallel_size": 4})}
    )
    assert needs_efa(wide, group)


@pytest.mark.parametrize(
    ("instance_type", "arch"),
    [("p5.48xlarge", "x86_64"), ("g5g.xlarge", "arm64"), ("g6e.12xlarge", "x86_64")],
)
def test_architecture_follows_the_instance_family(instance_type, arch):
    assert architecture(instance_type) == arch


# --- what a booting host needs, in the resource graph ---------------------------------------------


def needs(graph, resource) -> set[str]:
    """Every URN the engine creates before ``resource``: its dependencies, and theirs."""
    by_urn = {r.urn: r for r in graph.resources}
    seen: set[str] = set()
    todo = list(resource.dependencies)
    while todo:
        urn = todo.pop()
        if urn not in seen:
            seen.add(urn)
            todo.extend(by_urn[urn].dependencies if urn in by_urn else ())
    return seen


def test_the_permission_to_complete_a_lifecycle_action_exists_before_any_group_waits_for_capacity(graph):
    # A group's create waits for healthy capacity, and its hosts pass the launch hook only by completing
    # the lifecycle action: a permission created after the group leaves every host to the hook's
    # ABANDON, and the `pulumi up` waits until it fails.
    lifecycle = graph.one("aws:iam/rolePolicy:RolePolicy", f"{graph.stack}-iam-lifecycle")
    for group in graph.of_type(ASG):
        assert lifecycle.urn in needs(graph, group), f"{group.name} may launch hosts before {lifecycle.name}"


def test_what_a_booting_host_reads_exists_before_any_group_launches_one(graph):
    # A host's instance profile gives it its role at once, but the role's policies only once they are
    # attached; the history bucket (its release, its tools) and the API keys' secret are read at boot.
    stack = graph.stack
    booting = [
        graph.one("aws:iam/rolePolicy:RolePolicy", f"{stack}-iam-runtime"),
        graph.one("aws:iam/instanceProfile:InstanceProfile", f"{stack}-iam-runtime"),
        graph.one("aws:s3/bucket:Bucket", f"{stack}-storage-history"),
        graph.one("aws:s3/bucketPolicy:BucketPolicy", f"{stack}-storage-history"),
        graph.one("aws:secretsmanager/secret:Secret", f"{stack}-secrets-api-keys"),
        *graph.of_type("aws:s3/bucketObjectv2:BucketObjectv2"),
    ]
    for group in graph.of_type(ASG):
        missing = [r.name for r in booting if r.urn not in needs(graph, group)]
        assert not missing, f"{group.name} may launch hosts before {missing}"


def test_the_scale_out_policy_waits_the_groups_estimated_start_before_counting_a_new_host(graph):
    group = graph.settings.serving_group
    policy = graph.one("aws:autoscaling/policy:Policy", f"{graph.stack}-{group.name}-queue-depth").inputs
    estimate = instance_warmup(graph.settings, group)
    assert (estimate.source, policy["estimatedInstanceWarmup"]) == ("estimate", estimate.seconds)
    # prod's model takes minutes to fetch at S3's rate per connection, not AWS's default 300 s.
    assert estimate.runtime_s > 0 and estimate.seconds != 300


def test_a_groups_instance_warmup_setting_is_what_its_scale_out_policy_waits():
    settings = load_stack("staging")
    group = settings.serving_group.model_copy(update={"instance_warmup_s": 777})
    graph = run_program(settings.model_copy(update={"node_groups": (group,)}))
    policy = graph.one("aws:autoscaling/policy:Policy", f"staging-{group.name}-queue-depth").inputs
    assert policy["estimatedInstanceWarmup"] == 777
