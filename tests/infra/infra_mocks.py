"""Run the Pulumi program under mocks and keep what it created as plain data.

No Pulumi CLI or engine exists here, so ``pulumi.runtime.set_mocks`` stands in for the engine and
:class:`CloudMocks` for AWS: it answers every invoke the program makes (and fails loudly on any
other), and returns for each resource its inputs plus the computed outputs AWS would add (ARNs,
ids, DNS names, ...). Each program run happens in a fresh :class:`contextvars.Context`, because
Pulumi keeps its settings and root stack in context variables: runs for dev, staging and prod share
one interpreter and one import of the program without seeing each other.
"""

from __future__ import annotations

import asyncio
import contextvars
import hashlib
import runpy
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pulumi
from pulumi.runtime.mocks import MockCallArgs, MockMonitor, MockResourceArgs
from pulumi.runtime.proto import resource_pb2
from pulumi.runtime.stack import run_pulumi_func
from pulumi.runtime.sync_await import _sync_await

from frontier.config.schema import Settings
from frontier.targets import load_stack
from infra.outputs import StackOutputs, as_dict
from infra.program import build

MAIN = Path(__file__).resolve().parents[2] / "infra" / "__main__.py"
CLOUD_STACKS = ("dev", "staging", "prod")

ACCOUNT_ID = "123456789012"
ELB_ACCOUNTS = {"us-east-1": "127311923021", "us-west-2": "797873946194"}
ZONE_LETTERS = "abcdef"
ROOT_SNAPSHOT_GB = 75
ROOT_DEVICE = "/dev/sda1"


def fake_ami(parameter: str) -> str:
    return "ami-" + hashlib.sha256(parameter.encode()).hexdigest()[:17]


class CloudMocks(pulumi.runtime.Mocks):
    """AWS as the program sees it: one account, a region with six AZs, the published AMIs."""

    def __init__(self, region: str, *, zones: int = 6, root_snapshot_gb: int = ROOT_SNAPSHOT_GB) -> None:
        self.region = region
        self.zones = [f"{region}{letter}" for letter in ZONE_LETTERS[:zones]]
        self.root_snapshot_gb = root_snapshot_gb
        self.invokes: list[tuple[str, dict[str, Any]]] = []
        self.images: dict[str, str] = {}
        self.arm_images: set[str] = set()

    # --- invokes ----------------------------------------------------------------------------------

    def call(self, args: MockCallArgs) -> dict[str, Any]:
        self.invokes.append((args.token, dict(args.args)))
        handlers: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
            "aws:index/getCallerIdentity:getCallerIdentity": self._caller_identity,
            "aws:index/getPartition:getPartition": self._partition,
            "aws:index/getAvailabilityZones:getAvailabilityZones": self._zones,
            "aws:elb/getServiceAccount:getServiceAccount": self._elb_account,
            "aws:ssm/getParameter:getParameter": self._parameter,
            "aws:ec2/getAmi:getAmi": self._ami,
        }
        if args.token not in handlers:
            raise NotImplementedError(f"the program made an invoke the mocks do not know: {args.token}")
        return handlers[args.token](dict(args.args))

    def _caller_identity(self, _: dict) -> dict:
        return {
            "accountId": ACCOUNT_ID,
            "arn": f"arn:aws:iam::{ACCOUNT_ID}:user/operator",
            "userId": "AIDAEXAMPLE",
            "id": ACCOUNT_ID,
        }

    def _partition(self, _: dict) -> dict:
        return {
            "partition": "aws",
            "dnsSuffix": "amazonaws.com",
            "reverseDnsPrefix": "com.amazonaws",
            "id": "aws",
        }

    def _zones(self, _: dict) -> dict:
        return {
            "names": self.zones,
            "zoneIds": [f"use1-az{i}" for i in range(len(self.zones))],
            "id": self.region,
        }

    def _elb_account(self, args: dict) -> dict:
        account = ELB_ACCOUNTS[args.get("region") or self.region]
        return {"arn": f"arn:aws:iam::{account}:root", "id": account}

    def _parameter(self, args: dict) -> dict:
        name = args["name"]
        image = fake_ami(name)
        self.images[image] = "arm64" if "/arm64/" in name else "x86_64"
        return {
            "name": name,
            "value": image,
            "insecureValue": image,
            "type": "String",
            "version": 1,
            "id": name,
            "arn": f"arn:aws:ssm:{self.region}::parameter{name}",
            "withDecryption": True,
        }

    def _ami(self, args: dict) -> dict:
        image = args["filters"][0]["values"][0]
        return {
            "id": image,
            "imageId": image,
            # A pinned AMI of the stack file, or one the SSM parameter named.
            "architecture": self.images.get(image, "arm64" if image in self.arm_images else "x86_64"),
            "rootDeviceName": ROOT_DEVICE,
            "blockDeviceMappings": [
                {
                    "deviceName": ROOT_DEVICE,
                    "ebs": {
                        "volume_size": str(self.root_snapshot_gb),
                        "volume_type": "gp3",
                        "encrypted": "false",
                    },
                    "noDevice": "",
                    "virtualName": "",
                }
            ],
        }

    # --- resources --------------------------------------------------------------------------------

    def new_resource(self, args: MockResourceArgs) -> tuple[str, dict[str, Any]]:
        outputs = dict(args.inputs)
        resource_id, computed = self._computed(args)
        outputs.update({key: value for key, value in computed.items() if key not in outputs})
        outputs["id"] = resource_id
        return resource_id, outputs

    def _computed(self, args: MockResourceArgs) -> tuple[str, dict[str, Any]]:
        """The id and the outputs AWS fills in that the program reads back."""
        inputs, typ = args.inputs, args.typ
        suffix = hashlib.sha256(f"{typ}/{args.name}".encode()).hexdigest()[:7]
        physical = inputs.get("name") or f"{args.name}-{suffix}"
        service = typ.split(":")[1].split("/")[0]
        arn = f"arn:aws:{service}:{self.region}:{ACCOUNT_ID}:{physical}"
        if typ == "aws:s3/bucket:Bucket":
            bucket = inputs.get("bucket") or physical
            return bucket, {"bucket": bucket, "arn": f"arn:aws:s3:::{bucket}"}
        if typ == "aws:lb/loadBalancer:LoadBalancer":
            return arn, {
                "arn": f"arn:aws:elasticloadbalancing:{self.region}:{ACCOUNT_ID}:loadbalancer/app/{physical}/{suffix}",
                "arnSuffix": f"app/{physical}/{suffix}",
                "dnsName": f"{physical}-{suffix}.{self.region}.elb.amazonaws.com",
                "zoneId": "Z35SXDOTRQ7X7K",
            }
        if typ == "aws:lb/targetGroup:TargetGroup":
            return arn, {
                "arn": f"arn:aws:elasticloadbalancing:{self.region}:{ACCOUNT_ID}:targetgroup/{physical}/{suffix}",
                "arnSuffix": f"targetgroup/{physical}/{suffix}",
            }
        if typ == "aws:ecr/repository:Repository":
            return physical, {
                "arn": f"arn:aws:ecr:{self.region}:{ACCOUNT_ID}:repository/{physical}",
                "repositoryUrl": f"{ACCOUNT_ID}.dkr.ecr.{self.region}.amazonaws.com/{physical}",
                "registryId": ACCOUNT_ID,
            }
        if typ == "aws:kms/key:Key":
            return suffix, {"arn": f"arn:aws:kms:{self.region}:{ACCOUNT_ID}:key/{suffix}", "keyId": suffix}
        if typ == "aws:secretsmanager/secret:Secret":
            return physical, {
                "arn": f"arn:aws:secretsmanager:{self.region}:{ACCOUNT_ID}:secret:{physical}-AbCdEf"
            }
        if typ == "aws:iam/role:Role":
            return physical, {"arn": f"arn:aws:iam::{ACCOUNT_ID}:role/{physical}", "name": physical}
        if typ == "aws:iam/instanceProfile:InstanceProfile":
            return physical, {
                "arn": f"arn:aws:iam::{ACCOUNT_ID}:instance-profile/{physical}",
                "name": physical,
            }
        if typ == "aws:cloudwatch/logGroup:LogGroup":
            return physical, {
                "arn": f"arn:aws:logs:{self.region}:{ACCOUNT_ID}:log-group:{physical}",
                "name": physical,
            }
        if typ == "aws:ec2/launchTemplate:LaunchTemplate":
            return f"lt-{suffix}", {"arn": arn, "latestVersion": 1, "defaultVersion": 1}
        if typ in ("aws:autoscaling/group:Group", "aws:ec2/placementGroup:PlacementGroup"):
            return physical, {"arn": arn, "name": physical}
        return f"{typ.split(':')[-1].lower()}-{suffix}", {"arn": arn}


@dataclass(frozen=True)
class Resource:
    type: str
    name: str
    urn: str
    id: str
    inputs: dict[str, Any]
    outputs: dict[str, Any]
    custom: bool
    options: pulumi.ResourceOptions | None = None
    # The URNs the engine is told this resource waits for: explicit ``depends_on`` (a component
    # expanded to its resources) and every resource whose outputs feed an input.
    dependencies: frozenset[str] = frozenset()

    @property
    def ignored_changes(self) -> list[str]:
        return list((self.options.ignore_changes if self.options else None) or [])

    @property
    def parent_types(self) -> list[str]:
        """The component types above this resource, from its URN (``...::parent$child::name``)."""
        qualified = self.urn.split("::")[-2]
        return qualified.split("$")[:-1]


@dataclass
class Graph:
    """Everything one program run created, resolved to plain values."""

    settings: Settings
    resources: list[Resource]
    outputs: dict[str, Any]
    invokes: list[tuple[str, dict[str, Any]]]
    seconds: float
    cpu_seconds: float

    @property
    def stack(self) -> str:
        return self.settings.stack

    def of_type(self, *types: str) -> list[Resource]:
        return [r for r in self.resources if r.type in types]

    def one(self, typ: str, name: str | None = None) -> Resource:
        found = [r for r in self.of_type(typ) if name is None or r.name == name]
        assert len(found) == 1, f"expected one {typ} named {name!r}, found {[r.name for r in found]}"
        return found[0]

    def by_id(self, resource_id: str) -> Resource:
        found = [r for r in self.resources if r.id == resource_id]
        assert len(found) == 1, f"expected one resource with id {resource_id!r}, found {len(found)}"
        return found[0]


class _Recorder(CloudMocks):
    def __init__(self, region: str, **kwargs: Any) -> None:
        super().__init__(region, **kwargs)
        self.created: list[tuple[MockResourceArgs, str, dict[str, Any]]] = []

    def new_resource(self, args: MockResourceArgs) -> tuple[str, dict[str, Any]]:
        resource_id, outputs = super().new_resource(args)
        self.created.append((args, resource_id, outputs))
        return resource_id, outputs


def _resolve(value: Any) -> Any:
    if isinstance(value, pulumi.Output):
        return _sync_await(value.future())
    if isinstance(value, list | tuple):
        return [_resolve(v) for v in value]
    if isinstance(value, dict):
        return {k: _resolve(v) for k, v in value.items()}
    return value


class DependencyMonitor(MockMonitor):
    """The mock monitor, keeping what the engine orders creation by: each resource's dependencies."""

    def __init__(self, mocks: pulumi.runtime.Mocks) -> None:
        super().__init__(mocks)
        self.dependencies: dict[str, frozenset[str]] = {}

    def RegisterResource(self, request: Any) -> Any:  # noqa: N802 (the gRPC method's name)
        response = super().RegisterResource(request)
        self.dependencies[response.urn] = frozenset(request.dependencies)
        return response


class EngineUrnMonitor(DependencyMonitor):
    """A monitor that makes URNs and aliases as the engine does, and keeps each resource's aliases.

    The engine's URN holds the types of all the resource's parents below the stack; the mock
    monitor's keeps only the nearest, so moving a component under another would not show in it.
    Aliases come as whole URNs (the SDK resolves a resource's own); a child inherits each of its
    parent's, renamed as the engine renames them (its step generator's ``generateAliases``): the
    parent's type chain, and the parent's old name in place of its new one where the child's name
    starts with it.
    """

    def __init__(self, mocks: pulumi.runtime.Mocks) -> None:
        super().__init__(mocks)
        self.aliases: dict[str, list[str]] = {}

    def make_urn(self, parent: str, type_: str, name: str) -> str:
        qualified = parent.split("::")[2] if parent else ""
        if qualified and qualified != "pulumi:pulumi:Stack":
            type_ = f"{qualified}${type_}"
        return "::".join([f"urn:pulumi:{pulumi.get_stack()}", pulumi.get_project(), type_, name])

    def GetDeploymentInfo(self, request: Any) -> Any:  # noqa: N802 (the gRPC method's name)
        features = super().GetDeploymentInfo(request).supportedFeatures
        return resource_pb2.DeploymentInfo(
            supportedFeatures=[f for f in features if f != resource_pb2.RESOURCE_MONITOR_FEATURE_ALIAS_SPECS]
        )

    def RegisterResource(self, request: Any) -> Any:  # noqa: N802
        response = super().RegisterResource(request)
        parent_name = request.parent.split("::")[-1]
        inherited = []
        for alias in self.aliases.get(request.parent, []):
            prefix, project, qualified, alias_name = alias.split("::")
            name = request.name
            if name.startswith(parent_name):
                name = alias_name + name.removeprefix(parent_name)
            inherited.append("::".join([prefix, project, f"{qualified}${request.type}", name]))
        self.aliases[response.urn] = [*request.aliasURNs, *inherited]
        return response


def _run(
    settings: Settings,
    program: Callable[[Settings], Any],
    mocks: _Recorder,
    monitor: DependencyMonitor | None = None,
) -> Graph:
    monitor = monitor or DependencyMonitor(mocks)
    pulumi.runtime.set_mocks(mocks, project="frontier", stack=settings.stack, preview=False, monitor=monitor)
    result: dict[str, Any] = {}
    started, cpu_started = time.perf_counter(), time.process_time()
    options: dict[tuple[str, str], pulumi.ResourceOptions] = {}

    def record(args: pulumi.ResourceTransformationArgs) -> None:
        # The engine, not the mocks, sees resource options: keep them for the tests here.
        options[(args.type_, args.name)] = args.opts

    def main() -> None:
        pulumi.runtime.register_stack_transformation(record)
        result.setdefault("outputs", program(settings))

    _sync_await(run_pulumi_func(main))
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu_started

    urns = {}
    for urn in monitor.resources:
        qualified, name = urn.split("::")[-2:]
        urns[(qualified.split("$")[-1], name)] = urn
    resources = [
        Resource(
            args.typ,
            args.name,
            urns[(args.typ, args.name)],
            resource_id,
            dict(args.inputs),
            outputs,
            bool(args.custom),
            options.get((args.typ, args.name)),
            monitor.dependencies.get(urns[(args.typ, args.name)], frozenset()),
        )
        for args, resource_id, outputs in mocks.created
    ]
    produced = result.get("outputs")
    if isinstance(produced, StackOutputs):  # build() called directly
        outputs = _resolve(as_dict(produced))
    else:  # the entry point ran: what it exported
        outputs = _resolve(dict(pulumi.runtime.settings.get_root_resource().outputs))
    return Graph(settings, resources, outputs, list(mocks.invokes), elapsed, cpu)


def run_program(settings: Settings, program: Callable[[Settings], Any] = build, **mock_options: Any) -> Graph:
    """Run ``program(settings)`` under fresh mocks: :func:`infra.program.build` or the entry point."""
    mocks = _Recorder(settings.region, **mock_options)
    _ensure_event_loop()
    return contextvars.Context().run(_run, settings, program, mocks)


def _ensure_event_loop() -> None:
    """Pulumi's mocks register resources on the thread's current event loop; an ``asyncio.run``
    earlier in the session (the gateway's tests) leaves none set, and then they find none."""
    try:
        asyncio.get_event_loop_policy().get_event_loop()
    except RuntimeError:
        asyncio.set_event_loop(asyncio.new_event_loop())


def run_main(stack: str, settings: Settings | None = None) -> Graph:
    """Run ``infra/__main__.py`` as ``pulumi up -s <stack>`` does; ``settings`` only sets up the mocks."""
    settings = (settings or load_stack(stack)).model_copy(update={"stack": stack})
    return run_program(settings, program=lambda _: runpy.run_path(str(MAIN)))


run_graphs: dict[str, Graph] = {}


def graph_for(stack: str) -> Graph:
    """The program's resources and exported outputs for a stack, built once per test session."""
    if stack not in run_graphs:
        run_graphs[stack] = run_main(stack)
    return run_graphs[stack]
