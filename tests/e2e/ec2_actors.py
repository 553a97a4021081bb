"""The EC2 stack's paths the local stack never takes, each run by its actor against moto's server
enforcing the prod stack's IAM documents, every allowed call logged for ``iam_simulation``.

moto's server runs as the local stack's does (:mod:`frontier.targets.local.moto_calls`, with
``INITIAL_NO_AUTH_ACTION_COUNT``), in a process of its own started by this module's ``__main__``,
which first puts the AMI ids AWS publishes under ``/aws/service/`` into moto's SSM store (moto, like
AWS, refuses a put there). The users and their documents are the prod stack's: ``frontier/identity/``'s
functions with the names ``pulumi up`` gives prod's resources (:func:`documents`), widened for moto
by :func:`frontier.targets.local.iam.for_moto`; the administrator (standing in for ``pulumi up``)
makes the resources those names point at.

Who runs what (:func:`exercise`):

- the deploy role, as ``fab`` does in process (boto3 from the environment): ``fab scale``; a rollout
  that surges the node group, protects its hosts, suspends AZRebalance and retires the old hosts
  (behind the gateway it drains no target: the ALB's target group holds the gateway's hosts); EC2
  Instance Connect's key push; ``fab ami.latest``;
  ``fab image.push`` (the container engine a stand-in that makes the registry's calls a
  ``docker push`` makes, as ECR authorises them); ``fab gateway.roll``; ``fab usage`` of metering in S3;
  ``fab status``, which lists the spot notice waiting on the stack's interruption queue (prod's node
  group buys spot above its on-demand base here, so the stack has that queue);
- the runtime hosts' role, through the real AWS CLI as a host's bootstrap does: read the current
  release, record its boot, see its lifecycle state, complete its lifecycle action, publish its
  metrics, and the calls the CloudWatch agent (its logs) and ECR's credential helper (the image
  pull) make on a host.

moto authorises a call before it looks for the operation, so the calls it does not implement
(StartInstanceRefresh, DescribeInstanceRefreshes, CompleteLifecycleAction, GetDownloadUrlForLayer)
are still checked and logged; moto then answers an error, and where a task waits on the answer
(``fab gateway.roll``) a stand-in gives AWS's documented one.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

import boto3
import pytest
import yaml
from botocore.config import Config
from botocore.exceptions import ClientError
from botocore.parsers import ResponseParserError
from frontier_hostside import node_boot
from frontier_hostside.aws_cli import Aws, BootError
from frontier_hostside.names import (
    CLOUDWATCH_NAMESPACE,
    NODE_GROUP_TAG,
    ROLE_TAG,
    STACK_TAG,
)
from frontier_hostside.node_boot import NodeConfig
from invoke import Context

from frontier import project
from frontier.cli import access, ami, ops
from frontier.config.hardware import ami_parameter
from frontier.config.outputs import Ec2Outputs
from frontier.config.purchase import notice_queue_name
from frontier.config.schema import Settings
from frontier.hosts.gateway_fronted import GatewayFronted
from frontier.identity.documents import deploy_policy, lifecycle_policy, runtime_policy
from frontier.identity.pools import StackResources, pool_identity, stack_identity
from frontier.release.artifact import Artifact
from frontier.release.history import iso, now, stack_history
from frontier.release.release import Release
from frontier.render.boot import node_env, shipped_logs
from frontier.rollout.rolling import HostResult, RolloutResult
from frontier.targets import load_stack
from frontier.targets.ec2.access import InstanceConnectKey
from frontier.targets.ec2.backend import Ec2Backend
from frontier.targets.local import iam, moto_calls, services
from tests.aws_host import MetricsPage, publish_parameter
from tests.e2e import iam_simulation

ACCOUNT = iam.ACCOUNT_ID
NODE_GROUP_ASG = "prod-h100-asg-1a2b3c"
GATEWAY_ASG = "prod-gateway-asg-9f8e7d"
KEY_ARN = f"arn:aws:kms:us-east-1:{ACCOUNT}:key/0a1b2c3d"
LAUNCH_HOOK = "frontier-launch"
IMAGE_TAG = "src-0123456789ab"
# What EventBridge puts on the interruption queue for a spot notice (the EC2 user guide's example).
SPOT_WARNING_EVENT = {
    "version": "0", "id": "12345678-1234-1234-1234-123456789012",
    "detail-type": "EC2 Spot Instance Interruption Warning", "source": "aws.ec2",
    "account": "123456789012", "time": "2026-12-06T09:41:12Z", "region": "us-east-1",
    "resources": ["arn:aws:ec2:us-east-1:123456789012:instance/i-1234567890abcdef0"],
    "detail": {"instance-id": "i-1234567890abcdef0", "instance-action": "terminate"},
}  # fmt: skip
# No retries: a call moto authorises but does not implement is answered once, with an error.
ONCE = Config(retries={"max_attempts": 1, "mode": "standard"})


# --- the stack and its documents ------------------------------------------------------------------


def write_prod_stack(stacks: Path) -> Settings:
    """The prod stack with a gateway that meters to S3 and its node group buying spot above an
    on-demand base, in ``stacks`` (``$FRONTIER_STACKS_DIR``)."""
    document = yaml.safe_load((project.root() / "stacks" / "Pulumi.prod.yaml").read_text())
    config = document["config"]
    config["frontier:node_groups"][0]["capacity"] = {"market": "spot", "on_demand_base": 2}
    region = config.get("aws:region", "us-east-1")
    config["frontier:gateway"] = {
        "port": 8090,
        "metering": {"uri": f"s3://frontier-prod-metering-{ACCOUNT}-{region}/metering"},
        "ami_id": "ami-0123456789abcdef0",
        "instance_type": "c7i.large",
        "request_timeout_s": 110,
    }
    config["frontier:tenants"] = [
        {
            "name": "acme",
            "api_key_secret": "frontier/prod/tenants/acme",
            "models": [pool["model"]["name"] for pool in config.get("frontier:pools", [])]
            or [config["frontier:model"]["name"]],
            "requests_per_minute": 600,
            "tokens_per_minute": 100000,
            "max_concurrent_requests": 16,
            "priority": "interactive",
        }
    ]
    stacks.mkdir(parents=True, exist_ok=True)
    path = stacks / "Pulumi.prod.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return load_stack("prod", path=path)


def outputs(settings: Settings, target_group_arn: str) -> Ec2Outputs[str]:
    """What ``pulumi up`` of prod exports, with the target group moto made."""
    region = settings.region
    weights = settings.pools[0].model.weights_uri
    weights_bucket, _, weights_prefix = weights.removeprefix("s3://").partition("/")
    return Ec2Outputs[str](
        region=region,
        weights_bucket=weights_bucket,
        weights_prefix=weights_prefix,
        history_bucket=f"frontier-{settings.stack}-history-{ACCOUNT}-{region}",
        history_prefix=f"history/{settings.stack}/",
        ecr_repository_url=settings.pools[0].runtime.image_repository,
        api_keys_secret_arn=f"arn:aws:secretsmanager:{region}:{ACCOUNT}:secret:{settings.pools[0].runtime.api_keys_secret}",
        kms_key_arn=KEY_ARN,
        deploy_role_arn=f"arn:aws:iam::{ACCOUNT}:role/{settings.stack}-iam-deploy",
        runtime_role_arn=f"arn:aws:iam::{ACCOUNT}:role/{settings.stack}-iam-runtime",
        endpoint=f"https://{settings.stack}-edge-alb.{region}.elb.amazonaws.com",
        target_group_arn=target_group_arn,
        asg_names=[NODE_GROUP_ASG],
        alb_dns_name=f"{settings.stack}-edge-alb.{region}.elb.amazonaws.com",
        alb_zone_id="Z35SXDOTRQ7X7K",
        alarm_topic_arn=f"arn:aws:sns:{region}:{ACCOUNT}:{settings.stack}-alarms",
        dashboard_name=f"frontier-{settings.stack}",
        vpc_id="vpc-0a1b2c3d",
        private_subnet_ids=["subnet-0a1b2c3d"],
        host_access="ssm" if not settings.inventory.ssh_gateway else "bastion",
        monitoring_security_group_id="sg-0a1b2c3d",
    )


def documents(
    settings: Settings, saved: Ec2Outputs[str], release_key_arn: str = ""
) -> dict[str, dict[str, dict[str, Any]]]:
    """Each actor's documents as ``pulumi up`` of ``settings`` grants them (:mod:`frontier.identity`,
    with the saved outputs' ARNs and the stack's release key, if it has one), named as the local
    stack names its own: each pool's host actor with its runtime and lifecycle documents, and the
    deploy role's."""
    cloud = iam._cloud(settings)
    repository = saved.ecr_repository_url.split("/", 1)[1]
    weights_bucket, _, weights_prefix = settings.weights_root.removeprefix("s3://").partition("/")
    found = StackResources(
        weights_bucket_arn=f"arn:aws:s3:::{weights_bucket}",
        weights_prefix=weights_prefix.strip("/"),
        history_bucket_arn=f"arn:aws:s3:::{saved.history_bucket}",
        history_prefix=saved.history_prefix,
        kms_key_arn=saved.kms_key_arn,
        api_keys_secret_arns={
            settings.only_pool.runtime.api_keys_secret or "": f"{saved.api_keys_secret_arn}-*"
        },
        repository_arn=cloud.arn("ecr", f"repository/{repository}"),
        target_group_arn=saved.target_group_arn,
        release_key_arn=release_key_arn,
        canary_target_group_arn=saved.canary_target_group_arn or "",
        api_rule_arn=saved.api_rule_arn or "",
    )
    stack = stack_identity(settings, cloud, found, ssm_access=saved.host_access == "ssm")
    found_documents: dict[str, dict[str, dict[str, Any]]] = {}
    for pool in settings.pools:
        found_documents[iam.host_actor(settings, pool)] = {
            "lifecycle": lifecycle_policy(cloud, settings.stack).as_dict(),
            f"runtime-{pool.name}": runtime_policy(
                pool_identity(settings, pool, stack, found), hosts=True
            ).as_dict(),
        }
    found_documents["deploy"] = {"deploy": deploy_policy(stack).as_dict()}
    return found_documents


def account(settings: Settings, saved: Ec2Outputs[str]) -> iam_simulation.Account:
    weights = {p.model.weights_uri.removeprefix("s3://").split("/", 1)[0] for p in settings.pools}
    return iam_simulation.Account(
        documents(settings, saved), saved.kms_key_arn, frozenset({saved.history_bucket, *weights})
    )


# --- moto's server, enforcing -------------------------------------------------------------------


def serve(argv: list[str]) -> None:
    """``python -m tests.e2e.ec2_actors --log FILE --region R [--publish NAME=VALUE]... <moto.server
    arguments>``: moto's server, logging what it allows, with the published parameters in place."""
    log, region, rest, published = "", "us-east-1", [], []
    args = iter(argv)
    for arg in args:
        if arg == "--log":
            log = next(args)
        elif arg == "--region":
            region = next(args)
        elif arg == "--publish":
            published.append(next(args).split("=", 1))
        else:
            rest.append(arg)
    for name, value in published:
        publish_parameter(name, value, region)
    moto_calls.main(["--log", log, *rest])


@dataclass
class Server:
    endpoint: str
    log: Path
    process: subprocess.Popen


@contextlib.contextmanager
def enforcing_moto(state: Path, region: str, published: dict[str, str]) -> Iterator[Server]:
    port = services.free_port("127.0.0.1")
    log = state / "moto-calls.jsonl"
    argv = [sys.executable, "-m", "tests.e2e.ec2_actors", "--log", str(log), "--region", region]
    for name, value in published.items():
        argv += ["--publish", f"{name}={value}"]
    argv += ["-H", "127.0.0.1", "-p", str(port)]
    env = {**os.environ, **iam.MOTO_ENV, "MOTO_EC2_LOAD_DEFAULT_AMIS": "false"}
    with (state / "moto.log").open("w") as out:
        process = subprocess.Popen(argv, cwd=project.root(), env=env, stdout=out, stderr=subprocess.STDOUT)
    endpoint = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(OSError):
                urllib.request.urlopen(f"{endpoint}/moto-api/data.json", timeout=1).read()
                break
            assert process.poll() is None, (state / "moto.log").read_text()
            assert time.monotonic() < deadline, "moto's server did not answer in 30 s"
            time.sleep(0.2)
        yield Server(endpoint, log, process)
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


# --- the account: users, keys and the resources pulumi up makes -----------------------------------


@dataclass
class Prod:
    settings: Settings
    endpoint: str
    keys: dict[str, iam.AccessKey]
    saved: Ec2Outputs[str]
    root: Path
    region: str
    notes: list[str] = field(default_factory=list)
    #: The stack's release key (frontier.release.signing), where the account has one.
    release_key_arn: str = ""

    def client(self, actor: str, service: str, config: Config | None = None) -> Any:
        return boto3.client(
            service,
            endpoint_url=self.endpoint,
            region_name=self.region,
            config=config,
            **self.keys[actor].boto3_kwargs(),
        )


def admin_key(settings: Settings, endpoint: str, region: str) -> dict[str, iam.AccessKey]:
    """The administrator, made by moto's unchecked calls (as the local stack's is)."""
    bootstrap = boto3.client(
        "iam", endpoint_url=endpoint, region_name=region,
        aws_access_key_id="bootstrap", aws_secret_access_key="bootstrap",
    )  # fmt: skip
    admin = iam.user_name(settings, "admin")
    bootstrap.create_user(UserName=admin)
    bootstrap.put_user_policy(
        UserName=admin, PolicyName="admin", PolicyDocument=json.dumps(iam.ADMIN_DOCUMENT)
    )
    made = bootstrap.create_access_key(UserName=admin)["AccessKey"]
    return {"admin": iam.AccessKey(made["AccessKeyId"], made["SecretAccessKey"])}


def add_users(prod: Prod) -> None:
    """Each actor's user with its documents as moto can check them, and its key, by the admin."""
    client = prod.client("admin", "iam")
    for actor, policies in documents(prod.settings, prod.saved, prod.release_key_arn).items():
        name = iam.user_name(prod.settings, actor)
        client.create_user(UserName=name)
        for policy_name, document in policies.items():
            client.put_user_policy(
                UserName=name, PolicyName=policy_name, PolicyDocument=json.dumps(iam.for_moto(document))
            )
        made = client.create_access_key(UserName=name)["AccessKey"]
        prod.keys[actor] = iam.AccessKey(made["AccessKeyId"], made["SecretAccessKey"])


def tagged_group(ec2: Any, autoscaling: Any, name: str, subnet: str, size: tuple, tags: dict) -> None:
    template = ec2.create_launch_template(
        LaunchTemplateName=name,
        LaunchTemplateData={"ImageId": "ami-0123456789abcdef0", "InstanceType": "c7i.large"},
    )["LaunchTemplate"]["LaunchTemplateId"]
    low, desired, high = size
    autoscaling.create_auto_scaling_group(
        AutoScalingGroupName=name,
        LaunchTemplate={"LaunchTemplateId": template},
        MinSize=low,
        MaxSize=high,
        DesiredCapacity=desired,
        VPCZoneIdentifier=subnet,
        Tags=[
            {"Key": k, "Value": v, "PropagateAtLaunch": True, "ResourceId": name,
             "ResourceType": "auto-scaling-group"}
            for k, v in tags.items()
        ],
    )  # fmt: skip


def make_resources(prod: Prod) -> str:
    """What ``pulumi up`` of prod makes, as the administrator; the target group's ARN."""
    settings, admin = prod.settings, (lambda service: prod.client("admin", service))
    ec2, autoscaling = admin("ec2"), admin("autoscaling")
    vpc = ec2.create_vpc(CidrBlock="10.40.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.40.1.0/24", AvailabilityZone=f"{prod.region}a")[
        "Subnet"
    ]["SubnetId"]
    group = settings.serving_group
    node_tags = {STACK_TAG: settings.stack, NODE_GROUP_TAG: group.name, ROLE_TAG: "runtime"}
    sizes = (group.min_size, group.desired_size, group.max_size)
    tagged_group(ec2, autoscaling, NODE_GROUP_ASG, subnet, sizes, {**node_tags, "Name": "frontier-prod-h100"})
    tagged_group(
        ec2, autoscaling, GATEWAY_ASG, subnet, (1, 1, 2), {STACK_TAG: settings.stack, ROLE_TAG: "gateway"}
    )
    target_group = admin("elbv2").create_target_group(
        Name=f"{settings.stack}-tg", Protocol="HTTP", Port=settings.gateway.port, VpcId=vpc,
        TargetType="instance",
    )["TargetGroups"][0]["TargetGroupArn"]  # fmt: skip
    # The ALB fronts the gateway: its group's hosts are the target group's, the runtimes never are.
    instances = autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=[GATEWAY_ASG])[
        "AutoScalingGroups"
    ][0]["Instances"]
    admin("elbv2").register_targets(
        TargetGroupArn=target_group,
        Targets=[{"Id": i["InstanceId"], "Port": settings.gateway.port} for i in instances],
    )
    repository = settings.pools[0].runtime.image_repository.split("/", 1)[1]
    admin("ecr").create_repository(repositoryName=repository)
    s3 = admin("s3")
    saved = outputs(settings, target_group)
    metering_bucket = settings.gateway.metering.uri.removeprefix("s3://").split("/", 1)[0]
    for bucket in (saved.history_bucket, saved.weights_bucket, metering_bucket):
        s3.create_bucket(Bucket=bucket)
    # What the gateway's role writes (infra/gateway.py's WriteMetering), for `fab usage` to read.
    record = {
        "time": time.time(), "request_id": "r-1", "tenant": "acme", "model": settings.pools[0].model.name,
        "priority": "interactive", "status": 200, "prompt_tokens": 12, "completion_tokens": 30,
        "latency_ms": 420.0, "ttft_ms": 80.0, "stream": False, "replica": "http://10.40.1.9:8080",
    }  # fmt: skip
    s3.put_object(
        Bucket=metering_bucket, Key="metering/2026/12/06/gw-1.jsonl", Body=json.dumps(record) + "\n"
    )
    for log in shipped_logs(settings):
        with contextlib.suppress(ClientError):
            admin("logs").create_log_group(logGroupName=log.group)
    # The stack's interruption queue (infra/interruptions.py) with a spot warning EventBridge put there.
    sqs = admin("sqs")
    queue = sqs.create_queue(QueueName=notice_queue_name(settings.stack))["QueueUrl"]
    sqs.send_message(QueueUrl=queue, MessageBody=json.dumps(SPOT_WARNING_EVENT))
    # The runtimes' key set, as an operator puts it after `pulumi up`: a deploy reads it to verify
    # its canary (rollout.verify_canary, on for prod).
    admin("secretsmanager").create_secret(
        Name=settings.pools[0].runtime.api_keys_secret, SecretString=json.dumps({"keys": ["actors-test-key"]})
    )
    return target_group


# --- the deploy role's paths ---------------------------------------------------------------------


class DrainingRollout:
    """Stands in for the per-host rollout (:class:`frontier.rollout.rolling.Rollout`): moto's
    instances have no sshd, so each host is reported updated. prod runs behind its gateway, so the
    rollout's balancer drains a runtime through its host's agent (:class:`GatewayFronted`) and makes
    no AWS call: the ALB's target group holds the gateway's hosts and no rollout touches it
    (tests/operate/test_disaggregated_roll_ec2.py rolls through that balancer)."""

    def __init__(self, settings, pool, hosts, balancer, connect, reporter, verification=None) -> None:  # noqa: ANN001
        assert isinstance(balancer, GatewayFronted), type(balancer).__name__
        self.hosts = hosts

    def run(self, release: Release, wheel: Any, kind: str) -> RolloutResult:
        return RolloutResult(
            kind,
            release.id,
            hosts=[HostResult(h.name, to_release=release.id, outcome="updated") for h in self.hosts],
        )


class Refreshes:
    """The deploy role's auto scaling client for ``fab gateway.roll``: each instance refresh call goes
    to moto first (which checks and logs it, then answers that it does not implement it), and the
    answer is AWS's documented one."""

    def __init__(self, client: Any, once: Any) -> None:
        self.client, self.once = client, once
        self.unimplemented: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)

    def _through_moto(self, call: str, **kwargs: Any) -> None:
        # A refusal is an AccessDenied error (a ClientError, raised on); moto's "not implemented" is
        # a 500 page that botocore cannot parse.
        with contextlib.suppress(ResponseParserError):
            getattr(self.once, call)(**kwargs)
            raise AssertionError(f"moto answered {call}: the stand-in is no longer needed")
        self.unimplemented.append(call)

    def start_instance_refresh(self, **kwargs: Any) -> dict[str, Any]:
        self._through_moto("start_instance_refresh", **kwargs)
        return {"InstanceRefreshId": "refresh-1"}

    def describe_instance_refreshes(self, **kwargs: Any) -> dict[str, Any]:
        self._through_moto("describe_instance_refreshes", **kwargs)
        done = {"Status": "Successful", "PercentageComplete": 100, "InstancesToUpdate": 0}
        return {"InstanceRefreshes": [{"InstanceRefreshId": "refresh-1", **done}]}


DOCKER = """\
#!{python}
# Stands in for the container engine fab image.push drives: ``push`` makes the registry calls a docker
# push makes, through ECR's API with the caller's credentials, as ECR authorises them.
import hashlib, json, sys
import boto3

args = sys.argv[1:]
if args[:1] == ["info"]:
    print("27.0.0")
elif args[:1] == ["login"]:
    sys.stdin.read()
elif args[:1] == ["push"]:
    repository, tag = args[1].rsplit(":", 1)
    name = repository.split("/", 1)[1]
    ecr = boto3.client("ecr")
    layer = b"a layer of the runtime image"
    digest = "sha256:" + hashlib.sha256(layer).hexdigest()
    ecr.batch_check_layer_availability(repositoryName=name, layerDigests=[digest])
    upload = ecr.initiate_layer_upload(repositoryName=name)["uploadId"]
    ecr.upload_layer_part(
        repositoryName=name, uploadId=upload, partFirstByte=0, partLastByte=len(layer) - 1,
        layerPartBlob=layer,
    )
    ecr.complete_layer_upload(repositoryName=name, uploadId=upload, layerDigests=[digest])
    manifest = {{
        "schemaVersion": 2, "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
        "config": {{"mediaType": "application/vnd.docker.container.image.v1+json", "size": 2,
                   "digest": "sha256:" + hashlib.sha256(b"{{}}").hexdigest()}},
        "layers": [{{"mediaType": "application/vnd.docker.image.rootfs.diff.tar.gzip",
                    "size": len(layer), "digest": digest}}],
    }}
    ecr.put_image(repositoryName=name, imageManifest=json.dumps(manifest), imageTag=tag)
else:
    sys.exit("unexpected: docker " + " ".join(args))
"""


def as_actor(prod: Prod, actor: str, mp: pytest.MonkeyPatch) -> None:
    """The environment of ``actor``'s process: its key, and moto's server as AWS.

    ``fab``'s tasks run here in this process, where boto3's default session keeps the credentials it
    first read from the environment (another actor's, another server's key, or an earlier test's):
    the session is dropped, so the next client reads this actor's key as a fresh ``fab`` would."""
    mp.setattr(boto3, "DEFAULT_SESSION", None)
    for key, value in {
        "AWS_ENDPOINT_URL": prod.endpoint, "AWS_REGION": prod.region, "AWS_DEFAULT_REGION": prod.region,
        **prod.keys[actor].env(),
    }.items():  # fmt: skip
        mp.setenv(key, value)
    mp.delenv("AWS_SESSION_TOKEN", raising=False)
    mp.delenv("AWS_PROFILE", raising=False)


def deploy_paths(prod: Prod, mp: pytest.MonkeyPatch) -> dict[str, str]:
    """Every deploy-role path of an EC2 stack the local stack lacks; what each printed or returned."""
    settings, seen = prod.settings, {}
    as_actor(prod, "deploy", mp)
    group = settings.serving_group
    ops.scale(Context(), stack="prod", replicas=group.desired_size + 1)
    ops.scale(Context(), stack="prod", replicas=group.desired_size)
    # A deploy's rollout: surge, protect, suspend AZRebalance, drain and enable, retire, resume.
    mp.setattr("frontier.rollout.strategy.Rollout", DrainingRollout)
    backend = Ec2Backend(settings, settings.only_pool)
    release = Release(Artifact("sha256:" + "a" * 64, "image"), {"runtime.yaml": "x: 1\n"})
    backend.history_store().put_release(release)
    rolled = backend.roll(release, "deploy", None)
    seen["rollout"] = f"{rolled.outcome}: {rolled.strategy}"
    # A connection's key, pushed by EC2 Instance Connect right before it opens.
    host = backend.hosts()[0]
    InstanceConnectKey(settings, backend.aws_client).push(host)
    seen["instance connect"] = f"{settings.inventory.ssh_user}@{host.instance_id}"
    ami.ami_latest(Context(), stack="prod")
    # fab image.push, the container engine a stand-in on PATH.
    bin_dir = prod.root / "bin"
    bin_dir.mkdir(exist_ok=True)
    docker = bin_dir / "docker"
    docker.write_text(DOCKER.format(python=sys.executable))
    docker.chmod(0o755)
    mp.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    ops.image_push(Context(), stack="prod", tag=IMAGE_TAG)
    # fab gateway.roll: moto checks and logs the instance refresh calls, the stand-in answers.
    real = Ec2Backend.aws_client
    refreshes = Refreshes(real(backend, "autoscaling"), prod.client("deploy", "autoscaling", ONCE))
    mp.setattr(
        Ec2Backend,
        "aws_client",
        lambda self, service: refreshes if service == "autoscaling" else real(self, service),
    )
    mp.setattr("frontier.targets.ec2.gateway.POLL_S", 0.0)
    access.gateway_roll(Context(), stack="prod", timeout=60)
    mp.setattr(Ec2Backend, "aws_client", real)
    seen["gateway.roll"] = ", ".join(refreshes.unimplemented)
    access.usage(Context(), stack="prod")
    # fab status: moto's instances have no sshd, so each host's row says it is unreachable (the
    # sessions' calls are the local stack's tests'); the lock and the notices on the queue are read.
    mp.setattr(Ec2Backend, "session", _unreachable)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        ops.status(Context(), stack="prod")
    seen["status"] = printed.getvalue()
    return seen


def _unreachable(backend: Ec2Backend, host: Any) -> Any:
    raise ConnectionError(f"{host.name}: no sshd on moto's instances")


# --- the runtime hosts' role, through the AWS CLI -----------------------------------------------


def host_paths(prod: Prod, mp: pytest.MonkeyPatch, aws_cli: str) -> dict[str, str]:
    """A host's boot, metrics, logs, image pull and lifecycle action, as the host role."""
    settings, saved, seen = prod.settings, prod.saved, {}
    # The deploy role's record of a good release, for the host to boot.
    as_actor(prod, "deploy", mp)
    store = stack_history(settings, settings.only_pool.name, prod.client("deploy", "s3"), saved.history_bucket, saved.history_prefix)
    release = Release(Artifact("sha256:" + hashlib.sha256(b"runtime").hexdigest(), "image"), {"x": "1\n"})
    store.put_release(release)
    store.append({"kind": "deploy", "started_at": iso(now()), "release": release.id, "outcome": "succeeded"})
    instance = prod.client("admin", "autoscaling").describe_auto_scaling_groups(
        AutoScalingGroupNames=[NODE_GROUP_ASG]
    )["AutoScalingGroups"][0]["Instances"][0]["InstanceId"]
    env = dict(
        node_env(settings, settings.serving_group, history_bucket=store.bucket, history_prefix=store.prefix)
    )
    env |= {
        "AWS_REGION": prod.region, "FRONTIER_ROOT": str(prod.root / "host"),
        "FRONTIER_READINESS_TIMEOUT_S": "30", "FRONTIER_INSTANCE_ID": instance,
        "FRONTIER_ADDRESS": "127.0.0.1",
    }  # fmt: skip
    env_file = prod.root / "node.env"
    env_file.write_text("".join(f"{k}={v}\n" for k, v in env.items()))
    config = NodeConfig.load(str(env_file))
    as_actor(prod, "host", mp)
    # One try per call: what moto authorises but does not implement fails at once.
    mp.setenv("AWS_MAX_ATTEMPTS", "1")
    mp.setenv("AWS_RETRY_MODE", "standard")
    host = Aws(prod.region, aws_cli)
    record = node_boot.current_release(host, config)
    assert record is not None and record["release"] == release.id
    node_boot.fetch_release(host, config, release.id, prod.root / "host" / "incoming" / release.id)
    host.put(store.bucket, f"{store.prefix}boots/{instance}.json", b"{}")
    group, state = host.group_of(instance)
    seen["lifecycle state"] = f"{group} {state}"
    with contextlib.suppress(BootError):  # moto 5.2 authorises it, then answers 500
        host.complete(group, LAUNCH_HOOK, instance, "CONTINUE")
    server = ThreadingHTTPServer(("127.0.0.1", 0), MetricsPage)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        published = node_boot.publish(
            replace(config, metrics_url=f"http://127.0.0.1:{server.server_address[1]}/metrics"), host
        )
    finally:
        server.shutdown()
    seen["metrics"] = f"{CLOUDWATCH_NAMESPACE}: {sorted(published)}"
    # The CloudWatch agent's calls for each log it ships (templates/cloudwatch-agent.json.j2).
    for log in shipped_logs(settings)[:1]:
        stream = f"{instance}/{log.stream}"
        host.run("logs", "describe-log-streams", "--log-group-name", log.group,
                 "--log-stream-name-prefix", stream)  # fmt: skip
        host.run("logs", "create-log-stream", "--log-group-name", log.group, "--log-stream-name", stream)
        events = json.dumps([{"timestamp": int(time.time() * 1000), "message": "runtime started"}])
        host.run("logs", "put-log-events", "--log-group-name", log.group, "--log-stream-name", stream,
                 "--log-events", events)  # fmt: skip
    # ECR's credential helper (docker-credential-ecr-login) logs in; the pull reads the image.
    repository = settings.pools[0].runtime.image_repository.split("/", 1)[1]
    host.run("ecr", "get-authorization-token")
    host.run(
        "ecr", "batch-get-image", "--repository-name", repository, "--image-ids", f"imageTag={IMAGE_TAG}"
    )
    layers = host.run("ecr", "batch-check-layer-availability", "--repository-name", repository,
                      "--layer-digests", "sha256:" + hashlib.sha256(b"a layer of the runtime image").hexdigest())  # fmt: skip
    seen["image pull"] = f"{len(layers.get('layers', []))} layer(s) available"
    with contextlib.suppress(BootError):  # moto 5.2 authorises it, then answers 500
        host.run("ecr", "get-download-url-for-layer", "--repository-name", repository,
                 "--layer-digest", "sha256:" + hashlib.sha256(b"a layer of the runtime image").hexdigest())  # fmt: skip
    return seen


def exercise(root: Path, aws_cli: str) -> tuple[Prod, list[dict[str, Any]], dict[str, str]]:
    """Run every EC2 path as its actor against moto enforcing prod's documents; the call log."""
    with pytest.MonkeyPatch.context() as mp:
        stacks = root / "stacks"
        mp.setenv("FRONTIER_STACKS_DIR", str(stacks))
        settings = write_prod_stack(stacks)
        region = settings.region
        published = {ami_parameter(g): "ami-0fedcba9876543210" for g in settings.node_groups}
        with enforcing_moto(root, region, published) as server:
            # The deploy document names the target group's ARN: the resources come first and the
            # actors' users after them, as the roles follow what they are granted in `pulumi up`.
            keys = admin_key(settings, server.endpoint, region)
            prod = Prod(settings, server.endpoint, keys, outputs(settings, ""), root, region)
            prod.saved = outputs(settings, make_resources(prod))
            saved_file = root / "outputs.json"
            saved_file.write_text(prod.saved.model_dump_json())
            mp.setenv("FRONTIER_STACK_OUTPUTS", str(saved_file))
            add_users(prod)
            seen = deploy_paths(prod, mp)
            seen |= host_paths(prod, mp, aws_cli)
            time.sleep(0.2)  # the server's last log lines
            return prod, moto_calls.read(server.log), seen


def evaluate(prod: Prod, log: list[dict[str, Any]]) -> iam_simulation.Evaluation:
    return iam_simulation.evaluate(prod.settings, log, account(prod.settings, prod.saved))


if __name__ == "__main__":
    serve(sys.argv[1:])
