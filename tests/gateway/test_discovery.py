"""EC2 discovery of a pool's runtimes, against moto's server (no AWS account here)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from frontier_gateway.config import Ec2Discovery, PoolConfig
from frontier_gateway.discovery import discover
from frontier_gateway.pools import Pool, Pools
from frontier_gateway.serve import discovered
from frontier_hostside import names
from moto.server import ThreadedMotoServer
from pydantic import ValidationError

from tests.moto_server import moto_server, reset


@pytest.fixture
def ec2(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """An empty account on moto's server. moto's backends are this process's, shared by every server
    and mock an earlier test ran: whatever it left (its instances, an EC2 backend built without
    moto's default images) is reset away, and the hosts boot an image registered here."""
    monkeypatch.setenv("MOTO_EC2_LOAD_DEFAULT_AMIS", "false")  # none is needed; loading them is slow
    with moto_server() as endpoint:
        reset(endpoint)
        client = boto3.client("ec2", region_name="us-east-1", endpoint_url=endpoint)
        client.register_image(Name="runtime", RootDeviceName="/dev/sda1")
        yield client


def _launch(ec2, stack: str, group: str, count: int = 1) -> list[str]:
    [image] = [i["ImageId"] for i in ec2.describe_images(Owners=["self"])["Images"]]
    tags = {
        names.STACK_TAG: stack,
        names.NODE_GROUP_TAG: group,
        names.ROLE_TAG: names.RUNTIME_ROLE,
    }
    reply = ec2.run_instances(
        ImageId=image,
        MinCount=count,
        MaxCount=count,
        InstanceType="g5.xlarge",
        TagSpecifications=[
            {"ResourceType": "instance", "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}
        ],
    )
    return [i["InstanceId"] for i in reply["Instances"]]


def test_discovery_finds_the_running_hosts_of_one_pool_only(ec2) -> None:
    mine = _launch(ec2, "prod", "h100", count=2)
    _launch(ec2, "prod", "l40s")  # another pool's group
    _launch(ec2, "staging", "h100")  # another stack
    spec = Ec2Discovery(stack="prod", node_group="h100", port=8000, region="us-east-1")
    found = discover(ec2, spec)
    addresses = {
        i["PrivateIpAddress"]
        for r in ec2.describe_instances(InstanceIds=mine)["Reservations"]
        for i in r["Instances"]
    }
    assert found == sorted(f"http://{a}:8000" for a in addresses)
    ec2.terminate_instances(InstanceIds=mine[:1])
    assert len(discover(ec2, spec)) == 1


def test_a_pool_keeps_what_it_knew_of_a_replica_across_discoveries() -> None:
    pool = Pool("m", ["http://10.0.0.1:8000"])
    pool.replicas[0].ready = True
    pool.set_urls(["http://10.0.0.2:8000", "http://10.0.0.1:8000"])
    assert [(r.url, r.ready) for r in pool.replicas] == [
        ("http://10.0.0.2:8000", False),
        ("http://10.0.0.1:8000", True),
    ]


def test_a_pool_names_replicas_or_discovery() -> None:
    with pytest.raises(ValidationError, match="either replicas"):
        PoolConfig(name="m")


def test_gateway_publish_uploads_a_config_that_finds_replicas_by_tag_and_the_wheels(tmp_path) -> None:
    import yaml as yaml_lib
    from frontier_gateway.config import parse_config

    from frontier import project
    from frontier.access.gateway import build_gateway_wheels, publish, render_gateway_config
    from frontier.targets import load_stack

    document = yaml_lib.safe_load((project.root() / "stacks" / "Pulumi.dev.yaml").read_text())
    config = document["config"]
    config["frontier:gateway"] = {
        "metering": {"uri": "s3://metering-bucket/metering"},
        "ami_id": "ami-0123456789abcdef0",
        "request_timeout_s": 110,  # below dev's edge.idle_timeout_s (120 s): the ALB fronts the gateway
    }
    config["frontier:tenants"] = [
        {
            "name": "acme",
            "api_key_secret": "frontier/dev/tenants/acme",
            "models": [config["frontier:model"]["name"]],
            "requests_per_minute": 60,
            "tokens_per_minute": 10000,
            "max_concurrent_requests": 4,
            "priority": "interactive",
        }
    ]
    path = tmp_path / "Pulumi.dev.yaml"
    path.write_text(yaml_lib.safe_dump(document, sort_keys=False))
    settings = load_stack("dev", path=path)
    text = render_gateway_config(settings, None)
    [pool] = parse_config(text).models
    assert pool.discovery == Ec2Discovery(
        stack="dev",
        node_group=settings.serving_group.name,
        port=settings.runtime.port,
        region=settings.region,
    )
    # The gateway's wheel and the hostside wheel it depends on, which no package index has: gateway
    # hosts run `pip install *.whl` on what was published.
    wheels = build_gateway_wheels(tmp_path / "dist")
    assert sorted(w.name.split("-")[0] for w in wheels) == ["frontier_gateway", "frontier_hostside"]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        s3 = boto3.client("s3", region_name="us-east-1", endpoint_url=f"http://{host}:{port}")
        s3.create_bucket(Bucket="history")
        uris = publish(s3, "history", "history/dev/", text, wheels)
        keys = sorted(o["Key"] for o in s3.list_objects_v2(Bucket="history")["Contents"])
    finally:
        server.stop()
    assert keys == sorted(
        ["history/dev/gateway/gateway.yaml", *(f"history/dev/gateway/{w.name}" for w in wheels)]
    )
    assert uris[0] == "s3://history/history/dev/gateway/gateway.yaml"


# --- a disaggregated pool: each half found on its own node group ------------------------------------


def _halves(**roles: object) -> PoolConfig:
    return PoolConfig.model_validate({"name": "m", "disaggregation": roles})


def _on(group: str) -> dict[str, object]:
    return {"stack": "prod", "node_group": group, "port": 8000, "region": "us-east-1"}


def test_a_disaggregated_pools_halves_are_found_each_on_its_node_group(ec2) -> None:
    prefill = _launch(ec2, "prod", "l40s-prefill")
    decode = _launch(ec2, "prod", "l40s", count=2)
    config = _halves(prefill_discovery=_on("l40s-prefill"), decode_discovery=_on("l40s"))
    pools = Pools([config])
    found = discovered([config], pools)
    disaggregated = pools.by_model["m"].disaggregated
    assert disaggregated is not None
    assert [(pool.name, spec.node_group) for pool, spec in found] == [
        ("m/prefill", "l40s-prefill"),
        ("m/decode", "l40s"),
    ]
    for pool, spec in found:
        pool.set_urls(discover(ec2, spec))

    def urls(ids: list[str]) -> list[str]:
        reply = ec2.describe_instances(InstanceIds=ids)["Reservations"]
        return sorted(f"http://{i['PrivateIpAddress']}:8000" for r in reply for i in r["Instances"])

    assert [r.url for r in disaggregated.prefill.replicas] == urls(prefill)
    assert [r.url for r in disaggregated.decode.replicas] == urls(decode)
    assert pools.by_model["m"].replicas == []  # no colocated replica: nothing was found for one


def test_a_half_is_given_by_addresses_or_found_not_both() -> None:
    with pytest.raises(ValidationError, match="disaggregation.prefill: give its replicas either"):
        _halves(prefill=["http://10.0.0.1:8000"], prefill_discovery=_on("p"), decode_discovery=_on("d"))
    with pytest.raises(ValidationError, match="disaggregation.decode: give its replicas either"):
        _halves(prefill_discovery=_on("p"))


def test_both_halves_found_on_one_node_group_are_refused() -> None:
    with pytest.raises(ValidationError, match="found on one node group"):
        _halves(prefill_discovery=_on("l40s"), decode_discovery=_on("l40s"))
