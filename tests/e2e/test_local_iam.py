"""``local.up`` under IAM enforcement: moto refuses keys it did not issue, and each actor signs as its own user."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import boto3
import pytest
from botocore.exceptions import ClientError
from fabric import Config, Connection
from frontier_hostside import node_boot
from frontier_hostside.aws_cli import Aws, BootError
from frontier_hostside.names import LOCAL_AWS_KEY_ID, LOCAL_AWS_SECRET
from frontier_hostside.node_boot import NodeConfig

from frontier.config.schema import Settings
from frontier.release.artifact import Artifact, sha256_digest
from frontier.release.history import HistoryStore, iso, now, stack_history
from frontier.release.release import Release
from frontier.render.boot import node_env
from frontier.targets import backend_for, load_stack
from frontier.targets.local import cluster as local
from frontier.targets.local import iam, services
from tests.aws_host import aws_cli
from tests.e2e.stackcopy import write_local_stack
from tests.gateway.stacks import SECOND_MODEL, two_model_config, write_stack

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


# --- a stack of two models: the second pool's host slot boots under enforcement --------------------


@dataclass
class TwoPools:
    """moto enforcing IAM, the users of a two-pool stack, and the small pool's first release."""

    settings: Settings
    keys: dict[str, iam.AccessKey]
    pool: HistoryStore  # the small pool's history, written with the deploy role's key
    release: Release
    wheel: Path
    config: NodeConfig  # the small pool's slot, as a relaunch writes its node.env
    aws: Aws

    @property
    def host_key(self) -> iam.AccessKey:
        """The small pool's host slots' key: that pool's principal."""
        return self.keys[iam.host_actor(self.settings, self.settings.pool(SECOND_MODEL["name"]))]

    def host_s3(self, endpoint: str):  # noqa: ANN201 - a boto3 client
        return boto3.client(
            "s3", endpoint_url=endpoint, region_name="us-east-1", **self.host_key.boto3_kwargs()
        )


@pytest.fixture
def two_pools(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("FRONTIER_STACKS_DIR", str(tmp_path / "stacks"))
    write_stack(tmp_path / "stacks", two_model_config())
    settings = load_stack("local")
    moto = services.start_moto(0, tmp_path / "moto", env=iam.MOTO_ENV)
    bucket, prefix = local.history_bucket(settings), local.history_prefix(settings)
    try:
        _, keys = iam.provision(settings, moto.endpoint, tmp_path, bucket, prefix, fresh=True)
        client = {
            actor: boto3.client(
                "s3", endpoint_url=moto.endpoint, region_name="us-east-1", **keys[actor].boto3_kwargs()
            )
            for actor in ("admin", "deploy")
        }
        client["admin"].create_bucket(Bucket=bucket)
        # `fab deploy --model tiny-llama-small`: the wheel under the stack's artifacts, the release and
        # its record under the pool's own prefix.
        pool = stack_history(settings, SECOND_MODEL["name"], client["deploy"], bucket, prefix)
        wheel = tmp_path / "frontier_runtime-0-py3-none-any.whl"
        wheel.write_bytes(b"the runtime wheel")
        artifact = Artifact(sha256_digest(wheel), "wheel", wheel.name, wheel.stat().st_size)
        pool.put_artifact(artifact, wheel)
        release = Release(artifact, {"runtime.yaml": "mode: serve\n"})
        pool.put_release(release)
        pool.append(
            {"kind": "deploy", "started_at": iso(now()), "release": release.id, "outcome": "succeeded"}
        )
        # The slot is host-3, which the small pool lists: its node.env is that pool's, though the
        # node group 'cpu' runs both pools' hosts.
        env = dict(
            node_env(
                settings,
                settings.pool(SECOND_MODEL["name"]),
                history_bucket=bucket,
                history_prefix=pool.prefix,
            )
        )
        env |= {
            "AWS_REGION": "us-east-1",
            "FRONTIER_ROOT": str(tmp_path / "host-3"),
            "FRONTIER_READINESS_TIMEOUT_S": "30",
            "FRONTIER_INSTANCE_ID": "host-3",
            "FRONTIER_ADDRESS": "127.0.0.1",
            "FRONTIER_ARTIFACTS_PREFIX": pool.artifacts_prefix,
        }
        env_file = tmp_path / "node.env"
        env_file.write_text("".join(f"{k}={v}\n" for k, v in env.items()))
        # What the slot's env file gives its bootstrap: the host role's key and the stack's moto.
        small_host = keys[iam.host_actor(settings, settings.pool(SECOND_MODEL["name"]))]
        for key, value in {"AWS_ENDPOINT_URL": moto.endpoint, **small_host.env()}.items():
            monkeypatch.setenv(key, value)
        yield TwoPools(
            settings, keys, pool, release, wheel, NodeConfig.load(str(env_file)), Aws("us-east-1", aws_cli())
        )
    finally:
        services.stop(moto)


def test_a_second_pools_host_boots_its_pools_release_with_the_stacks_wheel(two_pools):
    record = node_boot.current_release(two_pools.aws, two_pools.config)
    assert record is not None and record["release"] == two_pools.release.id
    incoming = Path(two_pools.config.root) / "incoming" / two_pools.release.id
    manifest = node_boot.fetch_release(two_pools.aws, two_pools.config, two_pools.release.id, incoming)
    wheel = node_boot.fetch_wheel(two_pools.aws, two_pools.config, manifest["artifact"], incoming.parent)
    assert Path(wheel).read_bytes() == two_pools.wheel.read_bytes()
    two_pools.aws.put(two_pools.pool.bucket, f"{two_pools.pool.prefix}boots/host-3.json", b"{}")


def test_a_second_pools_host_cannot_make_a_release_current(two_pools):
    with pytest.raises(BootError, match=r"AccessDenied.*PutObject operation"):
        two_pools.aws.put(two_pools.pool.bucket, f"{two_pools.pool.prefix}records/forged.json", b"{}")


def test_a_second_pools_host_reads_exactly_its_pools_history_and_the_stacks_artifacts(two_pools):
    stack_prefix, pool_prefix = two_pools.pool.artifacts_prefix, two_pools.pool.prefix
    small = two_pools.settings.pool(SECOND_MODEL["name"])
    document = iam.documents(two_pools.settings, two_pools.pool.bucket, stack_prefix)[
        iam.host_actor(two_pools.settings, small)
    ]
    reads = next(
        s
        for s in document[f"runtime-{SECOND_MODEL['name']}"]["Statement"]
        if s["Sid"] == "ReadTheCurrentRelease"
    )
    bucket_arn = f"arn:aws:s3:::{two_pools.pool.bucket}"
    assert sorted(reads["Resource"]) == sorted(
        [
            f"{bucket_arn}/{stack_prefix}artifacts/*",
            f"{bucket_arn}/{pool_prefix}host/*",
            f"{bucket_arn}/{pool_prefix}records/*",
            f"{bucket_arn}/{pool_prefix}releases/*",
        ]
    )
