"""Two pools on the local stack under IAM enforcement: each pool's host slot signs as its own pool's
principal, both pools serve, each with the key of its own secret, and one pool's host cannot read the
other pool's weights or API-keys secret.

moto's server enforces the documents (``frontier/identity``) the cloud programs render: pool B's
host role holds ``s3:GetObject`` on ``<weights bucket>/<B's prefix>/*`` only, so a GET of pool A's
weights with B's host key is AccessDenied while B reads its own; and ``secretsmanager:GetSecretValue``
on B's secret only, which the local stack's moto server checks against the secret's ARN
(``frontier/targets/local/moto_calls.py``), so B's host is refused A's secret.
"""

from __future__ import annotations

import copy
import json
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path

import boto3
import pytest
import yaml
from botocore.exceptions import ClientError
from frontier_runtime.tiny import make_tiny_checkpoint

from frontier.config.schema import Host, PoolSettings, Settings
from frontier.release import weights
from frontier.release.artifact import build_wheel
from frontier.rollout.deploy import deploy
from frontier.targets import backend_for, load_stack
from frontier.targets.local import cluster as local
from frontier.targets.local import iam
from frontier.targets.local.group import STATE_FILE as GROUP_STATE_FILE
from frontier.targets.local.group import read_state
from tests.e2e.stackcopy import free_port, write_local_stack
from tests.gateway.stacks import SECOND_MODEL

pytestmark = pytest.mark.e2e

SMALL_SHAPE = {
    "hidden_size": 128,
    "num_layers": 2,
    "num_heads": 4,
    "num_kv_heads": 2,
    "intermediate_size": 344,
}


@dataclass
class Serving:
    settings: Settings
    model_dirs: dict[str, Path]

    def pool(self, name: str) -> PoolSettings:
        return self.settings.pool(name)

    def host_key(self, host: Host) -> iam.AccessKey:
        """The key a slot's env file hands its bootstrap, agent and runtime."""
        env = dict(
            line.split("=", 1)
            for line in (local.host_root(host) / "env").read_text().splitlines()
            if "=" in line
        )
        return iam.AccessKey(env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"])

    def s3_as(self, host: Host):  # noqa: ANN201 - a boto3 client
        return self.client_as(host, "s3")

    def client_as(self, host: Host, service: str):  # noqa: ANN201 - a boto3 client
        return boto3.client(
            service,
            endpoint_url=local.moto_endpoint(self.settings),
            region_name=self.settings.region,
            **self.host_key(host).boto3_kwargs(),
        )


def as_two_pools(stacks: Path, root: Path) -> None:
    """The private local stack copy rewritten with its model as pool A on host-1 and a smaller model
    as pool B on host-2, both listed (``frontier:models``), each with its own weights prefix."""
    path = stacks / "Pulumi.local.yaml"
    document = yaml.safe_load(path.read_text())
    config = document["config"]
    first = {
        "model": config.pop("frontier:model"),
        "runtime": config.pop("frontier:runtime"),
        "hosts": ["host-1"],
    }
    runtime = {
        **copy.deepcopy(first["runtime"]),
        "api_keys_secret": f"frontier/local/{SECOND_MODEL['name']}/api-keys",
    }
    second = {"model": dict(SECOND_MODEL), "runtime": runtime, "hosts": ["host-2"]}
    config["frontier:models"] = [first, second]
    # Two models route by model through a gateway (not started here: each pool is asked directly).
    config["frontier:gateway"] = {"port": free_port(), "metering": {"uri": str(root / "metering.jsonl")}}
    config["frontier:tenants"] = [
        {
            "name": "acme",
            "api_key_secret": "frontier/local/tenants/acme",
            "models": [first["model"]["name"], SECOND_MODEL["name"]],
            "requests_per_minute": 600,
            "tokens_per_minute": 100_000,
            "max_concurrent_requests": 16,
            "priority": "interactive",
        }
    ]
    path.write_text(yaml.safe_dump(document, sort_keys=False))


@pytest.fixture(scope="module")
def serving(tmp_path_factory) -> Serving:
    """Both pools deployed on their slots, over real sshd and moto enforcing IAM."""
    root = tmp_path_factory.mktemp("pools")
    with pytest.MonkeyPatch.context() as mp:
        stacks = write_local_stack(root, hosts=2)
        mp.setenv("FRONTIER_STACKS_DIR", str(stacks))
        mp.delenv(local.CONNECTION_ENV, raising=False)
        # As the demo does: the stack comes up serving one model, then its file lists two, and
        # `local.identities` with `local.host_slots` give each pool's slot its pool's principal.
        one = load_stack("local")
        try:
            local.up(one)
            # The slots the one-model stack serves, recorded as its group's state (the demo's earlier
            # parts leave it so): a pool's view counts its own slots among them. Without it the
            # first pool's deploy records its view's slots alone, and the second pool finds none.
            state = local.state_dir(one)
            (state / GROUP_STATE_FILE).write_text(json.dumps(asdict(read_state(one, state))))
            as_two_pools(stacks, root)
            settings = load_stack("local")
            local.identities(settings)
            local.api_key_secrets(settings)  # the second pool's own secret, as `pulumi up` adds it
            local.host_slots(settings)
            big, small = settings.pools
            dirs = {big.name: root / "model-a", small.name: root / "model-b"}
            make_tiny_checkpoint(dirs[big.name])
            make_tiny_checkpoint(
                dirs[small.name], seed=3, max_position_embeddings=SECOND_MODEL["max_seq_len"], **SMALL_SHAPE
            )
            s3 = backend_for(settings.for_pool(big.name)).aws_client("s3")
            for pool in settings.pools:
                weights.push(s3, dirs[pool.name], pool.model.weights_uri, pool.name, pool.model.version)
            artifact, wheel = build_wheel()
            backend_for(settings.for_pool(big.name)).history_store().put_artifact(artifact, wheel)
            for pool in settings.pools:
                result = deploy(backend_for(settings.for_pool(pool.name)), artifact.digest)
                assert result.outcome == "succeeded", result
            yield Serving(settings, dirs)
        finally:
            local.down(one)


def _weights_key(pool: PoolSettings, name: str = "config.json") -> tuple[str, str]:
    bucket, _, prefix = pool.model.weights_uri.removeprefix("s3://").partition("/")
    return bucket, f"{prefix.strip('/')}/{pool.model.version}/{name}"


def test_each_pools_slot_signs_as_its_own_pools_principal(serving):
    for pool in serving.settings.pools:
        (host,) = pool.hosts
        sts = boto3.client(
            "sts",
            endpoint_url=local.moto_endpoint(serving.settings),
            region_name=serving.settings.region,
            **serving.host_key(host).boto3_kwargs(),
        )
        actor = iam.host_actor(serving.settings, pool)
        assert actor == f"host-{pool.name}"
        assert sts.get_caller_identity()["Arn"].endswith(f":user/{iam.user_name(serving.settings, actor)}")


def _models(pool: PoolSettings, key: str) -> list[str]:
    (host,) = pool.hosts
    url = f"http://{host.address}:{pool.runtime.port}/v1/models"
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"})
    with urllib.request.urlopen(request, timeout=10) as answer:
        return [m["id"] for m in json.load(answer)["data"]]


def test_both_pools_serve_each_with_the_key_of_its_own_secret(serving):
    for pool in serving.settings.pools:
        assert _models(pool, local.api_key(serving.settings, pool)) == [pool.name]


def test_each_pools_runtimes_refuse_the_other_pools_key(serving):
    a, b = serving.settings.pools
    assert local.api_key(serving.settings, a) != local.api_key(serving.settings, b)
    with pytest.raises(urllib.error.HTTPError) as refused:
        _models(b, local.api_key(serving.settings, a))
    assert refused.value.code == 401


def _denied_secret_read(exc: ClientError, reader: PoolSettings) -> bool:
    """Whether ``exc`` is IAM refusing ``reader``'s host user the read (moto's words, which name the
    user and the action)."""
    line = iam.refusal(exc)
    return (
        line.startswith("AccessDenied")
        and f"host-{reader.name}" in line
        and line.endswith("is not authorized to perform: secretsmanager:GetSecretValue")
    )


def test_pool_bs_host_reads_its_own_secret_and_is_denied_pool_as(serving):
    a, b = serving.settings.pools
    (b_host,) = b.hosts
    sm = serving.client_as(b_host, "secretsmanager")
    own = json.loads(sm.get_secret_value(SecretId=b.runtime.api_keys_secret)["SecretString"])
    assert own["keys"] == [local.api_key(serving.settings, b)]
    with pytest.raises(ClientError) as refused:
        sm.get_secret_value(SecretId=a.runtime.api_keys_secret)
    assert _denied_secret_read(refused.value, b)


def test_pool_as_host_is_denied_pool_bs_secret(serving):
    a, b = serving.settings.pools
    (a_host,) = a.hosts
    with pytest.raises(ClientError) as refused:
        serving.client_as(a_host, "secretsmanager").get_secret_value(SecretId=b.runtime.api_keys_secret)
    assert _denied_secret_read(refused.value, a)


def test_pool_bs_host_reads_its_own_weights_and_is_denied_pool_as(serving):
    a, b = serving.settings.pools
    (b_host,) = b.hosts
    s3 = serving.s3_as(b_host)
    own_bucket, own_key = _weights_key(b)
    assert (
        s3.get_object(Bucket=own_bucket, Key=own_key)["Body"].read()
        == (serving.model_dirs[b.name] / "config.json").read_bytes()
    )
    other_bucket, other_key = _weights_key(a)
    with pytest.raises(ClientError) as refused:
        s3.get_object(Bucket=other_bucket, Key=other_key)
    assert refused.value.response["Error"]["Code"] == "AccessDenied"


def test_pool_as_host_is_denied_pool_bs_weights(serving):
    a, b = serving.settings.pools
    (a_host,) = a.hosts
    bucket, key = _weights_key(b)
    with pytest.raises(ClientError) as refused:
        serving.s3_as(a_host).get_object(Bucket=bucket, Key=key)
    assert refused.value.response["Error"]["Code"] == "AccessDenied"
