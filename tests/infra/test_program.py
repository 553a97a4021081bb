"""The program as a whole: composition, invokes, outputs, the entry point, and settings it refuses."""

from __future__ import annotations

from pathlib import Path

import pytest
from infra_mocks import ACCOUNT_ID, run_main, run_program

from frontier.targets import load_stack
from infra.errors import ProvisionError
from infra.outputs import Ec2Outputs

COMPONENTS = {
    "frontier:foundation:Foundation",
    "frontier:network:Network",
    "frontier:security:SecurityGroups",
    "frontier:secrets:Secrets",
    "frontier:storage:Storage",
    "frontier:registry:Registry",
    "frontier:release:ReleaseKey",
    "frontier:edge:Edge",
    "frontier:identity:Identity",
    "frontier:monitoring:Monitoring",
    "frontier:nodes:GpuNodeGroup",
    "frontier:hosts:HostTools",
}
INVOKES = {
    "aws:index/getCallerIdentity:getCallerIdentity",
    "aws:index/getPartition:getPartition",
    "aws:index/getAvailabilityZones:getAvailabilityZones",
    "aws:elb/getServiceAccount:getServiceAccount",
    "aws:ec2/getAmi:getAmi",
    "aws:ec2/getInstanceTypeOfferings:getInstanceTypeOfferings",
    "aws:servicequotas/getServiceQuota:getServiceQuota",
    "aws:iam/getRoles:getRoles",
}


def with_changes(settings, **sections):
    """A copy of the settings with some fields of some sections replaced, e.g. edge={"waf_rate_limit": 5}."""
    updates = {name: getattr(settings, name).model_copy(update=fields) for name, fields in sections.items()}
    return settings.model_copy(update=updates)


# --- composition ----------------------------------------------------------------------------------


def components_of(graph) -> set[str]:
    """The program's components: the common set, and the backup copy where backup.region is set."""
    return COMPONENTS | ({"frontier:backup:Backup"} if graph.settings.backup.region else set())


def test_one_component_per_concern_and_one_node_group_component_per_group(graph):
    components = [r.type for r in graph.resources if not r.custom]
    assert set(components) == components_of(graph)
    assert components.count("frontier:nodes:GpuNodeGroup") == len(graph.settings.node_groups)
    assert all(components.count(t) == 1 for t in components_of(graph) - {"frontier:nodes:GpuNodeGroup"})


def test_every_cloud_resource_is_a_child_of_a_frontier_component(graph):
    for resource in graph.resources:
        if resource.custom:
            assert resource.parent_types and resource.parent_types[0] in components_of(graph), resource.urn


def test_children_are_named_after_their_component(graph):
    component_names = {(r.type, r.name) for r in graph.resources if not r.custom}
    for resource in graph.resources:
        if resource.custom:
            parent = resource.parent_types[-1]
            assert any(t == parent and resource.name.startswith(f"{n}-") for t, n in component_names), (
                resource.name
            )


def test_the_program_makes_only_invokes_the_mocks_answer(graph):
    assert {token for token, _ in graph.invokes} == INVOKES


def test_a_node_groups_pinned_ami_is_looked_up_once_per_group(graph):
    images = [
        args["filters"][0]["values"] for token, args in graph.invokes if token == "aws:ec2/getAmi:getAmi"
    ]
    assert images == [[group.ami_id] for group in graph.settings.node_groups]


# --- outputs --------------------------------------------------------------------------------------


def test_outputs_name_what_fab_needs(graph):
    out, stack = graph.outputs, graph.stack
    tg = graph.one("aws:lb/targetGroup:TargetGroup")
    asgs = graph.of_type("aws:autoscaling/group:Group")
    assert out["region"] == graph.settings.region
    assert f"s3://{out['weights_bucket']}/{out['weights_prefix']}" == graph.settings.model.weights_uri
    # Globally unique: S3 bucket names are shared by every account and region.
    assert out["history_bucket"] == f"frontier-{stack}-history-{ACCOUNT_ID}-{graph.settings.region}"
    assert out["weights_bucket"].endswith(f"-{ACCOUNT_ID}-{graph.settings.region}")
    assert out["history_prefix"] == f"history/{stack}/"
    assert out["target_group_arn"] == tg.outputs["arn"]
    assert sorted(out["asg_names"]) == sorted(a.outputs["name"] for a in asgs)
    assert out["ecr_repository_url"] == graph.settings.runtime.image_repository
    assert out["api_keys_secret_arn"] == graph.one("aws:secretsmanager/secret:Secret").outputs["arn"]
    assert out["alb_dns_name"] == graph.one("aws:lb/loadBalancer:LoadBalancer").outputs["dnsName"]


def test_hosts_are_reached_through_the_bastion_when_the_stack_names_one(graph):
    bastion = bool(graph.settings.inventory.ssh_gateway)
    assert graph.outputs["host_access"] == ("bastion" if bastion else "ssm")
    assert (graph.outputs["bastion_security_group_id"] is not None) == bastion


def test_the_entry_point_exports_every_documented_output(graph):
    assert set(graph.outputs) == set(Ec2Outputs.model_fields)


# --- what the program refuses ---------------------------------------------------------------------


def test_the_local_stack_is_refused_before_anything_is_created():
    with pytest.raises(ProvisionError, match="never provisioned by Pulumi") as refused:
        run_main("local")
    assert "'local'" in str(refused.value)


def test_a_broken_stack_file_fails_with_the_loaders_message(tmp_path, monkeypatch):
    dev = load_stack("dev")
    text = Path(dev.source).read_text().replace("nat: single", "nat: sometimes")
    (tmp_path / "Pulumi.broken.yaml").write_text(text)
    monkeypatch.setenv("FRONTIER_STACKS_DIR", str(tmp_path))
    with pytest.raises(ProvisionError, match=r"network\.nat = 'sometimes'"):
        run_main("broken", settings=dev)


def test_more_availability_zones_than_the_region_has_are_refused():
    with pytest.raises(ProvisionError, match=r"network\.availability_zones = 3: region us-east-1 offers 2"):
        run_program(load_stack("prod"), zones=2)


def test_a_static_inventory_is_refused_for_a_provisioned_stack():
    settings = with_changes(load_stack("dev"), inventory={"source": "static"})
    with pytest.raises(ProvisionError, match=r"inventory\.source = 'static': .* use 'aws'"):
        run_program(settings)


def test_a_certificate_from_another_region_is_refused():
    settings = load_stack("dev")
    other = settings.edge.certificate_arn.replace("us-west-2", "eu-west-1")
    with pytest.raises(
        ProvisionError, match=r"edge\.certificate_arn = .*eu-west-1.*its own region \(us-west-2\)"
    ):
        run_program(with_changes(settings, edge={"certificate_arn": other}))


def test_an_image_repository_outside_the_stacks_registry_is_refused():
    settings = with_changes(load_stack("dev"), runtime={"image_repository": "ghcr.io/frontier/runtime"})
    with pytest.raises(ProvisionError, match=r"runtime\.image_repository = 'ghcr\.io/frontier/runtime'"):
        run_program(settings)


def test_health_thresholds_an_alb_cannot_use_are_refused():
    settings = with_changes(load_stack("staging"), health={"healthy_threshold": 1})
    with pytest.raises(
        ProvisionError, match=r"health\.healthy_threshold = 1: an ALB target group needs 2 to 10"
    ):
        run_program(settings)


def test_a_waf_rate_limit_below_the_minimum_is_refused():
    settings = with_changes(load_stack("prod"), edge={"waf_rate_limit": 5})
    with pytest.raises(ProvisionError, match=r"edge\.waf_rate_limit = 5: WAF rate limits start at 10"):
        run_program(settings)


def test_a_root_volume_smaller_than_the_ami_is_refused():
    with pytest.raises(
        ProvisionError, match=r"node_groups\[0\]\.root_volume_gb = 100: .* needs at least 500 GB"
    ):
        run_program(load_stack("dev"), root_snapshot_gb=500)


def test_a_cache_volume_cloud_init_cannot_tell_from_the_root_volume_is_refused():
    settings = load_stack("dev")
    group = settings.serving_group.model_copy(
        update={"cache_volume_gb": settings.serving_group.root_volume_gb}
    )
    with pytest.raises(ProvisionError, match=r"node_groups\[0\]\.cache_volume_gb = 100: must differ"):
        run_program(settings.model_copy(update={"node_groups": (group,)}))


def test_user_data_beyond_ec2s_limit_is_refused(monkeypatch):
    monkeypatch.setattr("infra.ec2_program.render_cloud_init", lambda settings, group, **_: "#" * 17_000)
    with pytest.raises(
        ProvisionError, match=r"node_groups\[0\] \(a10g\): .* is 17000 bytes; EC2 accepts at most 16384"
    ):
        run_program(load_stack("dev"))


def test_every_problem_is_reported_at_once():
    settings = with_changes(
        load_stack("staging"), health={"healthy_threshold": 1}, edge={"waf_rate_limit": 3}
    )
    with pytest.raises(ProvisionError, match=r"2 problem\(s\)"):
        run_program(settings)


def test_a_weights_bucket_without_account_and_region_in_its_name_is_refused():
    settings = load_stack("prod")
    model = settings.model.model_copy(update={"weights_uri": "s3://frontier-prod-weights/llama"})
    with pytest.raises(
        ProvisionError,
        match=r"model\.weights_uri = 's3://frontier-prod-weights/llama': S3 bucket names are global; .*"
        r"frontier-prod-weights-123456789012-us-east-1",
    ):
        run_program(settings.model_copy(update={"model": model}))
