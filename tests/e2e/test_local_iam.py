"""``local.up`` under IAM enforcement: moto refuses keys it did not issue, and each actor signs as its own user."""

from __future__ import annotations

import boto3
import pytest
from botocore.exceptions import ClientError
from fabric import Config, Connection
from frontier_hostside.names import LOCAL_AWS_KEY_ID, LOCAL_AWS_SECRET

from frontier.targets import backend_for, load_stack
from frontier.targets.local import cluster as local
from frontier.targets.local import iam
from tests.e2e.stackcopy import write_local_stack

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def running(tmp_path_factory):
    """One private local stack, up once."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FRONTIER_STACKS_DIR", str(write_local_stack(tmp_path_factory.mktemp("iam"), hosts=2)))
        mp.delenv(local.CONNECTION_ENV, raising=False)
        settings = load_stack("local")
        local.up(settings)
        yield settings
        local.down(settings)


def caller(settings, key: iam.AccessKey) -> str:
    sts = boto3.client(
        "sts", endpoint_url=local.moto_endpoint(settings), region_name=settings.region, **key.boto3_kwargs()
    )
    return sts.get_caller_identity()["Arn"]


def test_moto_refuses_a_key_the_stack_did_not_issue(running):
    s3 = boto3.client(
        "s3",
        endpoint_url=local.moto_endpoint(running),
        region_name=running.region,
        aws_access_key_id=LOCAL_AWS_KEY_ID,
        aws_secret_access_key=LOCAL_AWS_SECRET,
    )
    with pytest.raises(ClientError, match="InvalidAccessKeyId"):
        s3.list_buckets()


def test_fab_signs_as_the_deploy_role(running):
    arn = backend_for(running).aws_client("sts").get_caller_identity()["Arn"]
    assert arn.endswith(f":user/{iam.user_name(running, 'deploy')}")


def test_a_host_slot_hands_its_processes_the_host_roles_key(running):
    host = running.inventory.hosts[0]
    env_file = dict(
        line.split("=", 1) for line in (local.host_root(host) / "env").read_text().splitlines() if "=" in line
    )
    key = iam.AccessKey(env_file["AWS_ACCESS_KEY_ID"], env_file["AWS_SECRET_ACCESS_KEY"])
    assert caller(running, key).endswith(f":user/{iam.user_name(running, 'host')}")
    conn = Connection(
        host.address,
        user=running.inventory.ssh_user,
        port=host.ssh_port,
        config=Config(overrides={"load_ssh_configs": False}),
        connect_kwargs={
            "key_filename": str(local.ssh_key_file(running)),
            "look_for_keys": False,
            "allow_agent": False,
        },
    )
    with conn:
        over_ssh = conn.run("echo $AWS_ACCESS_KEY_ID", hide=True, in_stream=False).stdout.strip()
    assert over_ssh == key.key_id


def test_the_deploy_role_is_refused_what_its_policy_does_not_grant_by_name(running):
    with pytest.raises(ClientError) as refused:
        backend_for(running).aws_client("secretsmanager").create_secret(Name="not-fabs", SecretString="x")
    assert iam.refusal(refused.value).endswith("is not authorized to perform: secretsmanager:CreateSecret")


def test_a_second_up_keeps_the_users_and_their_keys(running):
    before = iam.read_keys(local.state_dir(running))
    states = {c.name: c.state for c in local.up(running)}
    assert states["iam"] == "exists" and iam.read_keys(local.state_dir(running)) == before
