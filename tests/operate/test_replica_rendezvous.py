"""The nodes of a replica meet in S3: the rendezvous run for real, the AWS CLI against moto's server.

Hosts are instances of a real (moto) auto scaling group; their slots are claimed through the
bootstrap's :class:`Aws` (the ``aws`` command, with ``put-object --if-none-match`` / ``--if-match``),
exactly as a booting host claims them. The provider behaviours the rendezvous relies on come first,
each a test of its own.
"""

from __future__ import annotations

import json
import threading
import urllib.request
from pathlib import Path

import boto3
import pytest
from frontier_hostside.aws_cli import Aws
from frontier_hostside.names import (
    LEADER_ADDRESS_ENV,
    NODE_RANK_ENV,
    REPLICA_KEY_ENV,
    RUNTIME_COMMAND_ENV,
)
from frontier_hostside.node_boot import NodeConfig, replica_env
from frontier_hostside.rendezvous import Claim, Holder, Rendezvous, slot_key, write_env

from frontier.render.boot import node_env
from frontier.targets import load_stack
from frontier.targets.local import services
from tests.aws_host import aws_cli

# Each AWS CLI call costs a second or so here.
pytestmark = pytest.mark.slow

BUCKET = "frontier-replicas-history-123456789012-us-east-1"
PREFIX = "history/prod-multinode/"
GROUP = "p5"


AWS_CLI = aws_cli("hosts claim their slots through it")


def _group(name: str, size: int) -> list[str]:
    """An auto scaling group of ``size`` running instances; their ids."""
    ec2 = boto3.client("ec2", region_name="us-east-1")
    template = ec2.create_launch_template(
        LaunchTemplateName=f"lt-{name}",
        LaunchTemplateData={"ImageId": "ami-12345678", "InstanceType": "p5.48xlarge"},
    )["LaunchTemplate"]["LaunchTemplateId"]
    autoscaling = boto3.client("autoscaling", region_name="us-east-1")
    autoscaling.create_auto_scaling_group(
        AutoScalingGroupName=name,
        LaunchTemplate={"LaunchTemplateId": template},
        MinSize=0,
        MaxSize=size + 1,
        DesiredCapacity=size,
        AvailabilityZones=["us-east-1a"],
    )
    [group] = autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=[name])["AutoScalingGroups"]
    return sorted(instance["InstanceId"] for instance in group["Instances"])


@pytest.fixture(scope="module")
def account(tmp_path_factory: pytest.TempPathFactory):
    """moto's server with the history bucket and a group of three running instances (their ids),
    made once: each test starts from an empty bucket (``cloud``) and terminates none of them."""
    moto = services.start_moto(0, tmp_path_factory.mktemp("moto"), in_process=True)
    env = {
        "AWS_ENDPOINT_URL": moto.endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "MOTO_EC2_LOAD_DEFAULT_AMIS": "false",
    }
    with pytest.MonkeyPatch.context() as patch:
        for key, value in env.items():
            patch.setenv(key, value)
        # In-process servers share moto's state: start from an empty account.
        urllib.request.urlopen(
            urllib.request.Request(f"{moto.endpoint}/moto-api/reset", method="POST"), timeout=10
        )
        boto3.client("s3", region_name="us-east-1").create_bucket(Bucket=BUCKET)
        yield _group("frontier-prod-multinode-p5", 3)


@pytest.fixture
def cloud(account: list[str]) -> list[str]:
    """The group's three instance ids, and no slot claimed yet."""
    s3 = boto3.client("s3", region_name="us-east-1")
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET):
        for item in page.get("Contents", []):
            s3.delete_object(Bucket=BUCKET, Key=item["Key"])
    return account


def _aws() -> Aws:
    return Aws("us-east-1", command=AWS_CLI, bucket=BUCKET)


def _host(instance_id: str, address: str, nodes: int = 2) -> Rendezvous:
    return Rendezvous(_aws(), PREFIX, GROUP, nodes, instance_id, address)


def _terminate(instance_id: str) -> None:
    boto3.client("autoscaling", region_name="us-east-1").terminate_instance_in_auto_scaling_group(
        InstanceId=instance_id, ShouldDecrementDesiredCapacity=True
    )


def _seed(replica: int, node: int, instance_id: str, address: str, key: str = "") -> Holder:
    """A slot some host claimed before the test (written with boto3: the claims under test use the CLI)."""
    holder = Holder(instance_id, address, "2026-12-01T00:00:00Z", key)
    boto3.client("s3", region_name="us-east-1").put_object(
        Bucket=BUCKET, Key=slot_key(PREFIX, GROUP, replica, node), Body=holder.to_bytes()
    )
    return holder


def _record(replica: int, node: int) -> dict:
    body = boto3.client("s3", region_name="us-east-1").get_object(
        Bucket=BUCKET, Key=slot_key(PREFIX, GROUP, replica, node)
    )["Body"]
    return json.loads(body.read())


# --- what S3 and Auto Scaling do that the rendezvous relies on -----------------------------------


def test_s3_refuses_a_second_create_of_the_same_key_with_if_none_match(cloud: list[str]) -> None:
    aws = _aws()
    assert aws.create(f"{PREFIX}probe.json", b"first")
    assert not aws.create(f"{PREFIX}probe.json", b"second")
    assert aws.read(f"{PREFIX}probe.json")[0] == b"first"


def test_s3_refuses_a_write_with_if_match_once_the_object_changed(cloud: list[str]) -> None:
    aws = _aws()
    aws.create(f"{PREFIX}probe.json", b"first")
    _, etag = aws.read(f"{PREFIX}probe.json")
    assert aws.replace(f"{PREFIX}probe.json", b"second", etag)
    assert not aws.replace(f"{PREFIX}probe.json", b"third", etag)
    assert aws.read(f"{PREFIX}probe.json")[0] == b"second"


def test_reading_a_missing_object_is_none_not_an_error(cloud: list[str]) -> None:
    assert _aws().read(f"{PREFIX}absent.json") is None


def test_auto_scaling_stops_listing_an_instance_its_group_terminated(cloud: list[str]) -> None:
    first, second = _group("terminating", 2)
    _terminate(first)
    assert _aws().live([first, second]) == {second}


# --- slots ----------------------------------------------------------------------------------------


def test_the_first_host_of_a_replica_is_its_leader_and_makes_the_key(cloud: list[str]) -> None:
    claim = _host(cloud[0], "10.0.1.10").claim()
    assert (claim.replica, claim.node, claim.command) == (0, 0, "serve")
    assert claim.leader_address == "10.0.1.10"
    assert len(claim.key) == 64 and claim.key == _record(0, 0)["key"]


def test_two_hosts_booting_at_once_take_different_slots(cloud: list[str]) -> None:
    claims: dict[str, Claim] = {}
    barrier = threading.Barrier(2)

    def boot(instance_id: str, address: str) -> None:
        host = _host(instance_id, address)
        barrier.wait()
        claims[instance_id] = host.claim()

    threads = [threading.Thread(target=boot, args=(i, f"10.0.1.{n}")) for n, i in enumerate(cloud[:2])]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert sorted((c.replica, c.node) for c in claims.values()) == [(0, 0), (0, 1)]
    assert len({c.key for c in claims.values()}) == 1  # the worker has the leader's key
    assert {_record(0, 0)["instance_id"], _record(0, 1)["instance_id"]} == set(cloud[:2])


def test_a_third_host_of_a_two_node_group_starts_replica_one_and_leaves_live_holders_be(
    cloud: list[str],
) -> None:
    _seed(0, 0, cloud[0], "10.0.1.10", key="a" * 64)
    _seed(0, 1, cloud[1], "10.0.1.11")
    third = _host(cloud[2], "10.0.1.12").claim()
    assert (third.replica, third.node, third.command, third.leader_address) == (1, 0, "serve", "10.0.1.12")
    assert _record(0, 0)["instance_id"] == cloud[0] and _record(0, 1)["instance_id"] == cloud[1]


def test_a_host_that_boots_again_keeps_its_slot_and_its_key(cloud: list[str]) -> None:
    _seed(0, 0, cloud[0], "10.0.1.10", key="a" * 64)
    _seed(0, 1, cloud[1], "10.0.1.11")
    again = _host(cloud[0], "10.0.1.10").claim()
    assert (again.replica, again.node, again.key) == (0, 0, "a" * 64)


def test_a_leader_back_with_a_new_address_rewrites_its_record(cloud: list[str]) -> None:
    _seed(0, 0, cloud[0], "10.0.1.10", key="a" * 64)
    again = _host(cloud[0], "10.0.1.99").claim()
    assert (again.node, again.leader_address, again.key) == (0, "10.0.1.99", "a" * 64)
    assert _record(0, 0)["address"] == "10.0.1.99"


def test_a_dead_holders_slot_is_taken_over_with_a_new_key(cloud: list[str]) -> None:
    # Its holder is no member of the group: what a terminated instance is (the provider test above).
    old = _seed(0, 0, "i-0000000000000dead", "10.0.1.10", key="a" * 64)
    _seed(0, 1, cloud[1], "10.0.1.11")
    taker = _host(cloud[2], "10.0.1.12").claim()
    assert (taker.replica, taker.node, taker.leader_address) == (0, 0, "10.0.1.12")
    assert taker.key != old.key and _record(0, 0)["instance_id"] == cloud[2]


def test_a_slot_whose_record_is_not_a_record_is_taken_over(cloud: list[str]) -> None:
    boto3.client("s3", region_name="us-east-1").put_object(
        Bucket=BUCKET, Key=slot_key(PREFIX, GROUP, 0, 0), Body=b"{not json"
    )
    claim = _host(cloud[0], "10.0.1.10").claim()
    assert (claim.replica, claim.node) == (0, 0) and _record(0, 0)["instance_id"] == cloud[0]


def test_a_survivor_of_a_broken_replica_moves_to_complete_an_earlier_one(cloud: list[str]) -> None:
    # A scale-in took one node from each replica: replica 0 keeps its leader, replica 1 its worker.
    _seed(0, 0, cloud[0], "10.0.1.10", key="a" * 64)
    _seed(0, 1, "i-0000000000000dead", "10.0.1.11")
    _seed(1, 0, "i-0000000000001dead", "10.0.1.12", key="b" * 64)
    _seed(1, 1, cloud[1], "10.0.1.13")
    moved = _host(cloud[1], "10.0.1.13").claim()
    assert (moved.replica, moved.node, moved.leader_address, moved.key) == (0, 1, "10.0.1.10", "a" * 64)
    assert _record(0, 1)["instance_id"] == cloud[1] and _record(1, 1)["instance_id"] == ""


def test_a_host_of_a_whole_replica_stays_though_an_earlier_slot_is_free(cloud: list[str]) -> None:
    _seed(0, 0, "i-0000000000000dead", "10.0.1.10", key="a" * 64)
    _seed(1, 0, cloud[0], "10.0.1.12", key="b" * 64)
    _seed(1, 1, cloud[1], "10.0.1.13")
    stays = _host(cloud[1], "10.0.1.13").claim()
    assert (stays.replica, stays.node, stays.key) == (1, 1, "b" * 64)


# --- what the runtime unit reads -------------------------------------------------------------------


def test_the_replica_env_file_is_readable_by_its_owner_only(tmp_path: Path) -> None:
    claim = Claim(replica=0, node=1, leader_address="10.0.1.10", key="k" * 64)
    path = write_env(claim, tmp_path / "run" / "replica.env")
    assert path.stat().st_mode & 0o777 == 0o600
    env = dict(line.split("=", 1) for line in path.read_text().splitlines())
    assert env[RUNTIME_COMMAND_ENV] == "node" and env[NODE_RANK_ENV] == "1"
    assert env[LEADER_ADDRESS_ENV] == "10.0.1.10" and env[REPLICA_KEY_ENV] == "k" * 64


# --- the bootstrap's replica-env, as the runtime unit runs it before each start ------------------------


def _node_config(tmp_path: Path, instance_id: str, address: str) -> NodeConfig:
    settings = load_stack("prod-multinode")
    env = dict(node_env(settings, settings.serving_group, history_bucket=BUCKET, history_prefix=PREFIX))
    env |= {"FRONTIER_NODE_GROUP": GROUP, "FRONTIER_INSTANCE_ID": instance_id, "FRONTIER_ADDRESS": address}
    (tmp_path / "node.env").write_text("".join(f"{k}={v}\n" for k, v in env.items()))
    return NodeConfig.load(str(tmp_path / "node.env"))


def test_a_worker_learns_its_leaders_address_and_key_and_points_its_leader_proxy_there(
    cloud: list[str], tmp_path: Path
) -> None:
    _seed(0, 0, cloud[0], "10.0.1.10", key="a" * 64)
    out, leader_env = tmp_path / "run" / "replica.env", tmp_path / "run" / "leader.env"
    answer = replica_env(_node_config(tmp_path, cloud[1], "10.0.1.11"), _aws(), out, leader_env)
    assert answer == {"ok": True, "replica": 0, "node": 1, "leader": "10.0.1.10", "command": "node"}
    assert "a" * 64 not in json.dumps(answer)  # the key stays in the file
    assert "key" not in _record(0, 1)  # only the leader's record holds it
    assert f"{REPLICA_KEY_ENV}={'a' * 64}" in out.read_text()
    assert leader_env.read_text() == f"{LEADER_ADDRESS_ENV}=10.0.1.10\n"


def test_replica_env_on_a_leader_leaves_no_leader_proxy_address(cloud: list[str], tmp_path: Path) -> None:
    out, leader_env = tmp_path / "run" / "replica.env", tmp_path / "run" / "leader.env"
    leader_env.parent.mkdir(parents=True)
    leader_env.write_text(f"{LEADER_ADDRESS_ENV}=10.0.1.99\n")  # from a boot as a worker long ago
    answer = replica_env(_node_config(tmp_path, cloud[0], "10.0.1.10"), _aws(), out, leader_env)
    assert (answer["node"], answer["command"]) == (0, "serve")
    assert not leader_env.exists()
