"""IAM proven by enforcement: moto's server checks every call against the cloud roles' documents.

moto runs as the local stack runs it (``INITIAL_NO_AUTH_ACTION_COUNT``: only the admin user's
creation goes unchecked); the local target makes the host, deploy and admin users with the documents
``frontier/identity/`` renders. ``fab``'s part (the history) is written with the deploy role's key,
and a host's bootstrap reads it through the real AWS CLI with the host role's key, as a host slot's
``env`` file hands it over. Taking one action out of the host role's document fails exactly the
call that needs it, and the error names it.
"""

from __future__ import annotations

import copy
import hashlib
import json
import sys
import tempfile
import threading
from dataclasses import dataclass, replace
from http.server import ThreadingHTTPServer
from pathlib import Path

import boto3
import pytest
import yaml
from botocore.exceptions import ClientError
from frontier_hostside import node_boot
from frontier_hostside.aws_cli import Aws, BootError
from frontier_hostside.node_boot import NodeConfig
from frontier_hostside.rendezvous import Rendezvous, slot_key

from frontier import project
from frontier.config.schema import Settings
from frontier.identity.documents import replica_slot_statements
from frontier.release.artifact import Artifact
from frontier.release.history import HistoryStore, iso, now
from frontier.release.release import Release
from frontier.render.boot import node_env
from frontier.targets import load_stack
from frontier.targets.local import cluster as local
from frontier.targets.local import iam, services
from tests.aws_host import MetricsPage, aws_cli
from tests.gateway.stacks import dev_gateway_document

# Each AWS CLI call costs a second or two.
pytestmark = pytest.mark.slow


@dataclass
class Account:
    settings: Settings
    endpoint: str
    keys: dict[str, iam.AccessKey]
    store: HistoryStore
    release: Release
    config: NodeConfig
    aws: Aws

    def client(self, actor: str, service: str):  # noqa: ANN201 - a boto3 client
        return boto3.client(
            service, endpoint_url=self.endpoint, region_name="us-east-1", **self.keys[actor].boto3_kwargs()
        )

    def host_policy(self) -> tuple[str, dict]:
        name = f"runtime-{self.settings.model.name}"
        return name, iam.documents(self.settings, self.store.bucket, self.store.prefix)["host"][name]

    def host_without(self, action: str) -> None:
        """The host role's runtime document with ``action`` taken out, put by the admin."""
        name, document = self.host_policy()
        self.client("admin", "iam").put_user_policy(
            UserName=iam.user_name(self.settings, "host"),
            PolicyName=name,
            PolicyDocument=json.dumps(iam.for_moto(without(document, action))),
        )


def without(document: dict, action: str) -> dict:
    trimmed = copy.deepcopy(document)
    for statement in trimmed["Statement"]:
        actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
        statement["Action"] = [a for a in actions if a != action]
    trimmed["Statement"] = [s for s in trimmed["Statement"] if s["Action"]]
    return trimmed


@pytest.fixture
def account(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """moto enforcing IAM, the stack's users, and the history with one release written by `fab`."""
    settings = load_stack("local")
    moto = services.start_moto(0, tmp_path / "moto", env=iam.MOTO_ENV)
    bucket, prefix = local.history_bucket(settings), local.history_prefix(settings)
    try:
        _, keys = iam.provision(settings, moto.endpoint, tmp_path, bucket, prefix, fresh=True)
        admin_s3 = boto3.client(
            "s3", endpoint_url=moto.endpoint, region_name="us-east-1", **keys["admin"].boto3_kwargs()
        )
        admin_s3.create_bucket(Bucket=bucket)
        deploy_s3 = boto3.client(
            "s3", endpoint_url=moto.endpoint, region_name="us-east-1", **keys["deploy"].boto3_kwargs()
        )
        store = HistoryStore(deploy_s3, bucket, settings.stack, prefix)
        artifact = Artifact("sha256:" + hashlib.sha256(b"runtime").hexdigest(), "image")
        release = Release(artifact, {"runtime.yaml": "mode: serve\n"})
        store.put_release(release)
        store.append(
            {"kind": "deploy", "started_at": iso(now()), "release": release.id, "outcome": "succeeded"}
        )
        env = dict(node_env(settings, settings.serving_group, history_bucket=bucket, history_prefix=prefix))
        env |= {
            "AWS_REGION": "us-east-1",
            "FRONTIER_ROOT": str(tmp_path / "host"),
            "FRONTIER_READINESS_TIMEOUT_S": "30",
            "FRONTIER_INSTANCE_ID": "host-1",
            "FRONTIER_ADDRESS": "127.0.0.1",
        }
        env_file = tmp_path / "node.env"
        env_file.write_text("".join(f"{k}={v}\n" for k, v in env.items()))
        # What a host slot's env file gives its bootstrap, agent, publisher and runtime.
        for key, value in {"AWS_ENDPOINT_URL": moto.endpoint, **keys["host"].env()}.items():
            monkeypatch.setenv(key, value)
        yield Account(
            settings,
            moto.endpoint,
            keys,
            store,
            release,
            NodeConfig.load(str(env_file)),
            Aws("us-east-1", aws_cli()),
        )
    finally:
        services.stop(moto)


def test_the_host_role_reads_the_current_release_and_records_its_boot(account):
    record = node_boot.current_release(account.aws, account.config)
    assert record is not None and record["release"] == account.release.id
    incoming = Path(account.config.root) / "incoming" / account.release.id
    manifest = node_boot.fetch_release(account.aws, account.config, account.release.id, incoming)
    assert manifest["id"] == account.release.id
    key = f"{account.store.prefix}boots/host-1.json"
    account.aws.put(account.store.bucket, key, b"{}")
    assert account.store.s3.get_object(Bucket=account.store.bucket, Key=key)["Body"].read() == b"{}"


def _with_replica_slots(account) -> None:
    """The host role of a stack whose replica spans nodes: the runtime document and the slot grants."""
    name, document = account.host_policy()
    bucket_arn = f"arn:aws:s3:::{account.store.bucket}"
    document = {
        **document,
        "Statement": [
            *document["Statement"],
            *(s.as_dict() for s in replica_slot_statements(bucket_arn, account.store.prefix)),
        ],
    }
    account.client("admin", "iam").put_user_policy(
        UserName=iam.user_name(account.settings, "host"),
        PolicyName=name,
        PolicyDocument=json.dumps(iam.for_moto(document)),
    )


def test_the_host_role_claims_a_replica_slot_and_reads_its_leaders(account):
    _with_replica_slots(account)
    host = Aws("us-east-1", account.aws.command, bucket=account.store.bucket)
    group = account.settings.serving_group.name
    leader = Rendezvous(host, account.store.prefix, group, 2, "host-1", "127.0.0.1").claim()
    assert (leader.replica, leader.node) == (0, 0)
    assert host.read(slot_key(account.store.prefix, group, 0, 0)) is not None


def test_without_its_replica_slot_grants_a_host_cannot_claim_a_slot(account):
    host = Aws("us-east-1", account.aws.command, bucket=account.store.bucket)
    with pytest.raises(BootError, match="PutObject"):
        Rendezvous(
            host, account.store.prefix, account.settings.serving_group.name, 2, "host-1", "127.0.0.1"
        ).claim()


def test_the_host_role_publishes_its_runtime_metrics(account):
    server = ThreadingHTTPServer(("127.0.0.1", 0), MetricsPage)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    config = replace(account.config, metrics_url=f"http://127.0.0.1:{server.server_address[1]}/metrics")
    try:
        published = node_boot.publish(config, account.aws)
    finally:
        server.shutdown()
    assert (published["queue_depth"], published["running"]) == (2, 1)
    names = {m["MetricName"] for m in account.client("admin", "cloudwatch").list_metrics()["Metrics"]}
    assert {"QueueDepth", "RunningRequests"} <= names


def test_without_s3_get_object_the_host_is_refused_its_release_naming_the_call(account):
    account.host_without("s3:GetObject")
    with pytest.raises(BootError) as refused:
        node_boot.current_release(account.aws, account.config)
    # S3 names the call (GetObject, authorised as s3:GetObject) and the refusal, not the policy.
    assert "AccessDenied" in str(refused.value) and "GetObject operation" in str(refused.value)


def test_without_describe_auto_scaling_instances_the_host_cannot_see_its_lifecycle_state(account):
    account.host_without("autoscaling:DescribeAutoScalingInstances")
    with pytest.raises(
        BootError, match="not authorized to perform: autoscaling:DescribeAutoScalingInstances"
    ):
        account.aws.group_of("host-1")


def test_the_host_role_cannot_make_a_release_current(account):
    # The resource is checked: s3:PutObject is granted under boots/ only, never records/.
    with pytest.raises(BootError, match=r"AccessDenied.*PutObject operation"):
        account.aws.put(account.store.bucket, f"{account.store.prefix}records/forged.json", b"{}")


def test_moto_takes_a_condition_as_met(account):
    # The host's s3:ListBucket is conditioned on s3:prefix (its history sub-prefixes); AWS would
    # refuse this listing, moto allows it: conditions are pinned by tests/infra/test_access.py.
    assert account.aws.keys(account.store.bucket, "elsewhere/") == []


def test_a_refusal_reads_as_one_line_naming_the_action(account):
    with pytest.raises(ClientError) as refused:
        account.client("deploy", "secretsmanager").create_secret(Name="anything", SecretString="x")
    assert iam.refusal(refused.value) == (
        "AccessDenied on CreateSecret: User: arn:aws:iam::123456789012:user/frontier-local-deploy "
        "is not authorized to perform: secretsmanager:CreateSecret"
    )


def test_moto_checks_resources_of_s3_and_secrets_manager_calls_so_other_statements_are_widened():
    document = {
        "Statement": [
            {"Effect": "Allow", "Action": "s3:ListBucket", "Resource": "arn:aws:s3:::b"},
            {"Effect": "Allow", "Action": ["s3:GetObject"], "Resource": ["arn:aws:s3:::b/p/*"]},
            {
                "Effect": "Allow",
                "Action": "secretsmanager:GetSecretValue",
                "Resource": "arn:aws:secretsmanager:x",
            },
            {"Effect": "Allow", "Action": "logs:PutLogEvents", "Resource": "arn:aws:logs:x"},
        ]
    }
    listing, reading, secret, logs = iam.for_moto(document)["Statement"]
    assert listing == {
        "Effect": "Allow",
        "Action": ["s3:ListBucket", "s3:HeadBucket"],
        "Resource": "arn:aws:s3:::b",
    }
    assert reading["Resource"] == ["arn:aws:s3:::b/p/*"]
    # The local stack's moto server authorises a Secrets Manager call on its secret's ARN.
    assert (secret["Action"], secret["Resource"]) == (
        "secretsmanager:GetSecretValue",
        "arn:aws:secretsmanager:x",
    )
    assert (logs["Action"], logs["Resource"]) == ("logs:PutLogEvents", "*")


def test_the_local_gateway_is_granted_what_the_cloud_gateway_role_is():
    # infra/gateway.py writes its role's statements inline; run it under Pulumi's mocks and compare.
    sys.path.insert(0, str(project.root() / "tests" / "infra"))
    from infra_mocks import run_program

    document = dev_gateway_document(instance_type="c7i.large")
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "Pulumi.dev.yaml"
        path.write_text(yaml.safe_dump(document, sort_keys=False))
        settings = load_stack("dev", path=path)
    graph = run_program(settings)
    cloud = json.loads(graph.one("aws:iam/rolePolicy:RolePolicy", "dev-gateway-policy").inputs["policy"])
    local_document = iam.gateway_policy(settings)

    def granted(document: dict) -> list[tuple]:
        # The stack's KMS key is a resource of the cloud only; the local stack names none.
        return [
            (
                s["Sid"],
                s["Action"],
                None if s["Sid"] in ("DecryptSecrets", "EncryptMetering") else s["Resource"],
            )
            for s in document["Statement"]
        ]

    # What the gateway process does; the rest is its EC2 host's (boot from the history bucket, ship
    # its log, publish its metrics), which the local stack's gateway, started by `fab`, has no part of.
    process = ["ReadKeyDigests", "DecryptSecrets", "DiscoverRuntimes", "WriteMetering", "EncryptMetering"]
    host = ["ReadWhatItBoots", "ListWhatItBoots", "ShipItsLogs", "PutGatewayMetrics"]
    assert [sid for sid, *_ in granted(cloud)] == process + host
    assert granted(local_document) == [g for g in granted(cloud) if g[0] in process]


def test_cloudwatch_actions_are_also_granted_under_the_name_moto_checks():
    document = {"Statement": [{"Effect": "Allow", "Action": "cloudwatch:PutMetricData", "Resource": "*"}]}
    [statement] = iam.for_moto(document)["Statement"]
    assert statement["Action"] == ["cloudwatch:PutMetricData", "monitoring:PutMetricData"]
