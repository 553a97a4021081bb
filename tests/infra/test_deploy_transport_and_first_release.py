"""What `fab deploy` needs from the account to reach hosts that take no inbound SSH, and what the
serving group does with hosts that have no release yet.

Session Manager: the host's SSM agent opens its channels outward (no inbound port), the deploy role
may start the SSH document's sessions only on instances tagged with its stack. EC2 Instance Connect:
the deploy role may push a key only to its stack's instances. Before the first deploy, hosts fail
the load balancer's check: the serving group does not replace them for it until a release exists.
"""

from __future__ import annotations

import json

from infra_mocks import ACCOUNT_ID

from frontier.identity.documents import SSM_AGENT

INGRESS = "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule"
ASG = "aws:autoscaling/group:Group"


def policy(graph, name):
    document = json.loads(
        graph.one("aws:iam/rolePolicy:RolePolicy", f"{graph.stack}-iam-{name}").inputs["policy"]
    )
    return {statement["Sid"]: statement for statement in document["Statement"]}


def test_without_a_bastion_no_security_group_takes_ssh_from_anywhere(dev):
    assert dev.outputs["host_access"] == "ssm"
    ssh = [rule.inputs for rule in dev.of_type(INGRESS) if rule.inputs.get("fromPort") == 22]
    assert ssh == []


def test_the_deploy_role_starts_sessions_only_on_its_stacks_instances_and_only_the_ssh_document(dev):
    granted = policy(dev, "deploy")
    instances = granted["SshOverSessionManager"]
    assert (instances["Action"], instances["Resource"]) == (
        "ssm:StartSession",
        f"arn:aws:ec2:{dev.settings.region}:{ACCOUNT_ID}:instance/*",
    )
    assert instances["Condition"] == {"StringEquals": {"ssm:resourceTag/frontier:stack": dev.stack}}
    document = granted["UseTheSshSessionDocument"]
    assert document["Resource"] == f"arn:aws:ssm:{dev.settings.region}::document/AWS-StartSSHSession"
    # Its own sessions only: the session id starts with the caller's user id.
    assert granted["EndItsSessions"]["Resource"].endswith(":session/${aws:userid}-*")


def test_the_deploy_role_pushes_ssh_keys_only_to_its_stacks_instances(graph):
    push = policy(graph, "deploy")["PushItsSshKeyToItsInstances"]
    assert push["Action"] == "ec2-instance-connect:SendSSHPublicKey"
    assert push["Resource"] == f"arn:aws:ec2:{graph.settings.region}:{ACCOUNT_ID}:instance/*"
    assert push["Condition"]["StringEquals"]["aws:ResourceTag/frontier:stack"] == graph.stack


def test_hosts_reached_through_session_manager_run_its_agent_and_nothing_more_of_ssm(dev):
    agent = policy(dev, "runtime")["RunTheSessionManagerAgent"]
    assert set(agent["Action"]) == set(SSM_AGENT)
    # The agent's channels and registration; no command, parameter or document reads.
    assert {a.split(":")[0] for a in agent["Action"]} == {"ssm", "ssmmessages", "ec2messages"}
    assert [a for a in agent["Action"] if a.startswith("ssm:")] == ["ssm:UpdateInstanceInformation"]


def test_hosts_behind_a_bastion_do_not_run_the_session_manager_agent(prod):
    assert prod.outputs["host_access"] == "bastion"
    assert "RunTheSessionManagerAgent" not in policy(prod, "runtime")


def test_a_serving_group_does_not_replace_unhealthy_hosts_until_a_release_exists(graph):
    group = graph.one(ASG, f"{graph.stack}-{graph.settings.serving_group.name}-asg")
    # The load balancer's check still marks an empty host unhealthy (it takes no traffic) ...
    assert group.inputs["healthCheckType"] == "ELB"
    # ... but the group keeps it, until the first deploy that succeeds resumes the replacement,
    # which later updates leave alone.
    assert group.inputs["suspendedProcesses"] == ["ReplaceUnhealthy"]
    assert "suspendedProcesses" in group.ignored_changes
