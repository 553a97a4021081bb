"""A group whose replica spans hosts gives up whole replicas: its custom termination policy (a Lambda
function auto scaling asks before it terminates) answers from the replicas' slots, and never with
half a replica.

Real: the policy's code, its archive unpacked and imported by a bare interpreter as Lambda would, the
slots written with the host side's own rendezvous records, and read from moto's S3. Mocked: auto
scaling itself, which no local service runs — ``Group`` below plays its scale-in: capacity asked in
the whole-replica step, the policy's answer terminated.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass, field

import boto3
import pytest
from frontier_hostside.rendezvous import Holder, slot_key
from infra_mocks import graph_for
from moto import mock_aws

from infra.functions import replica_terminator as rt
from infra.replica_scaling import FUNCTION_FILES, TIMEOUT_S

ASG = "aws:autoscaling/group:Group"
FUNCTION = "aws:lambda/function:Function"
PERMISSION = "aws:lambda/permission:Permission"
SLR = "arn:aws:iam::123456789012:role/aws-service-role/autoscaling.amazonaws.com/AWSServiceRoleForAutoScaling"


@dataclass
class Group:
    """An auto scaling group of 2-host replicas as the rendezvous fills it: replica i node k."""

    nodes: int = 2
    slots: list[rt.Slot] = field(default_factory=list)
    loose: list[str] = field(default_factory=list)  # booted, no slot claimed yet

    @classmethod
    def of(cls, replicas: int, nodes: int = 2) -> Group:
        slots = [rt.Slot(r, k, f"i-{r}{k}") for r in range(replicas) for k in range(nodes)]
        return cls(nodes, slots)

    @property
    def instances(self) -> list[str]:
        return [s.instance_id for s in self.slots] + self.loose

    def scale_in(self, capacity: int) -> list[str]:
        chosen = rt.choose(self.instances, capacity, self.slots, self.nodes)
        assert len(set(chosen)) == len(chosen) and set(chosen) <= set(self.instances)
        self.slots = [s for s in self.slots if s.instance_id not in chosen]
        self.loose = [i for i in self.loose if i not in chosen]
        return chosen

    def replicas(self) -> dict[int, int]:
        counts: dict[int, int] = {}
        for slot in self.slots:
            counts[slot.replica] = counts.get(slot.replica, 0) + 1
        return counts


def test_a_two_host_replica_group_scaling_from_4_to_2_hosts_gives_up_one_whole_replica():
    group = Group.of(replicas=2)
    assert sorted(group.scale_in(2)) == ["i-10", "i-11"]
    assert group.replicas() == {0: 2}


def test_scaling_in_step_by_step_never_leaves_half_a_replica():
    group = Group.of(replicas=4)
    while len(group.instances) > 2:
        group.scale_in(2)
        assert all(count == group.nodes for count in group.replicas().values()), group.replicas()
    assert group.replicas() == {0: 2}


def test_a_request_for_less_than_a_replica_is_left_unanswered_rather_than_split_one():
    # Auto scaling asks again while desired < current; the step policies ask in whole replicas.
    group = Group.of(replicas=2)
    assert group.scale_in(1) == []
    assert sorted(group.scale_in(3)) == ["i-10", "i-11"]


def test_hosts_without_a_slot_go_first_then_the_members_of_a_broken_replica():
    group = Group.of(replicas=3)
    group.slots = [s for s in group.slots if s.instance_id != "i-01"]  # replica 0 lost a node
    group.loose = ["i-booting"]
    assert group.scale_in(2) == ["i-booting", "i-00"]
    assert group.replicas() == {1: 2, 2: 2}


def test_a_slot_naming_a_host_the_group_no_longer_has_counts_for_nothing():
    # Replica 0's node 0 was terminated (its slot still names it): replica 0 is broken, its survivor
    # goes first, and no whole replica fits in what is left of the capacity.
    slots = [rt.Slot(0, 0, "i-gone"), rt.Slot(0, 1, "i-a"), rt.Slot(1, 0, "i-b"), rt.Slot(1, 1, "i-c")]
    assert rt.choose(["i-a", "i-b", "i-c"], 2, slots, 2) == ["i-a"]


PREFIX = "history/prod-multinode/"
BUCKET = "frontier-prod-multinode-history"


@pytest.fixture
def slots_in_s3(monkeypatch):
    with mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket=BUCKET)
        for replica in range(2):
            for node in range(2):
                holder = Holder(f"i-{replica}{node}", f"10.0.0.{replica * 2 + node}", "2026-12-06T00:00:00Z")
                s3.put_object(Bucket=BUCKET, Key=slot_key(PREFIX, "h100", replica, node), Body=holder.to_bytes())
        s3.put_object(Bucket=BUCKET, Key=slot_key(PREFIX, "h100", 2, 0), Body=b"not a record")
        for env, value in (
            (rt.BUCKET_ENV, BUCKET),
            (rt.PREFIX_ENV, PREFIX),
            (rt.GROUP_ENV, "h100"),
            (rt.NODES_ENV, "2"),
            ("AWS_DEFAULT_REGION", "us-east-1"),
        ):
            monkeypatch.setenv(env, value)
        yield s3


def test_the_function_answers_auto_scalings_call_from_the_slots_in_the_history_bucket(slots_in_s3):
    event = {
        "AutoScalingGroupName": "prod-multinode-h100",
        "CapacityToTerminate": [{"AvailabilityZone": "us-east-1a", "Capacity": 2, "InstanceMarketOption": "on-demand"}],
        "Instances": [
            {"AvailabilityZone": "us-east-1a", "InstanceId": f"i-{r}{k}", "InstanceMarketOption": "on-demand"}
            for r in range(2)
            for k in range(2)
        ],
        "Cause": "SCALE_IN",
        "HasMoreInstances": False,
    }
    assert sorted(rt.handler(event)["InstanceIDs"]) == ["i-10", "i-11"]


def test_the_functions_archive_imports_in_a_bare_interpreter(tmp_path):
    # Lambda runs it with nothing of the toolkit: only the archive's files and the runtime's boto3.
    for path, source in FUNCTION_FILES.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_bytes(source.read_bytes())
    # No site-packages (-S): the toolkit's host side resolves to the archive's copy or nowhere.
    probe = "import sys; sys.path.insert(0, '.'); import replica_terminator as t; print(t.handler.__name__, t.Holder.__module__)"
    done = subprocess.run([sys.executable, "-I", "-S", "-c", probe], cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.split() == ["handler", "frontier_hostside.rendezvous"], done.stderr


def terminators(graph):
    """The termination policies' functions (the stack's synthetic probe is a function too)."""
    return [f for f in graph.of_type(FUNCTION) if f.inputs["handler"] == "replica_terminator.handler"]


def test_a_spanning_group_terminates_through_its_function_first():
    graph = graph_for("prod-multinode")
    [function] = terminators(graph)
    [asg] = [a for a in graph.of_type(ASG) if "gateway" not in a.name]
    assert asg.inputs["terminationPolicies"] == [function.outputs["arn"], "OldestLaunchTemplate", "OldestInstance"]
    assert function.inputs["timeout"] == TIMEOUT_S and function.inputs["handler"] == "replica_terminator.handler"
    variables = function.inputs["environment"]["variables"]
    assert variables[rt.NODES_ENV] == "2" and variables[rt.GROUP_ENV] == graph.settings.node_groups[0].name


def test_only_auto_scalings_service_linked_role_may_call_it():
    permissions = graph_for("prod-multinode").of_type(PERMISSION)
    [permission] = [p for p in permissions if "terminator" in p.inputs["function"]]
    assert (permission.inputs["action"], permission.inputs["principal"]) == ("lambda:InvokeFunction", SLR)


def test_the_function_reads_only_its_groups_slots():
    graph = graph_for("prod-multinode")
    [policy] = [p for p in graph.of_type("aws:iam/rolePolicy:RolePolicy") if "terminator" in p.name]
    statements = {s["Sid"]: s for s in json.loads(policy.inputs["policy"])["Statement"]}
    group = graph.settings.node_groups[0].name
    assert statements["ReadItsGroupsSlots"]["Resource"].endswith(f"/history/prod-multinode/replicas/{group}/*")
    assert statements["ListItsGroupsSlots"]["Condition"] == {
        "StringLike": {"s3:prefix": [f"history/prod-multinode/replicas/{group}/*"]}
    }


def test_a_spanning_groups_hosts_are_not_replaced_on_the_balancers_check():
    # The survivors of a replica that lost a node fail the ALB's check until the rendezvous re-forms
    # them; replacing them then would break the replica it is re-forming.
    [asg] = [a for a in graph_for("prod-multinode").of_type(ASG) if "gateway" not in a.name]
    assert asg.inputs["healthCheckType"] == "EC2"


def test_a_single_node_group_keeps_auto_scalings_own_policies():
    graph = graph_for("prod")
    assert not terminators(graph)
    [asg] = [a for a in graph.of_type(ASG) if "gateway" not in a.name]
    assert asg.inputs["terminationPolicies"] == ["OldestLaunchTemplate", "OldestInstance"]
    assert asg.inputs["healthCheckType"] == "ELB"
