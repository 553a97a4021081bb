"""AWS as the Pulumi program sees it, for the engine mocks: invokes answered, computed outputs filled.

This module imports nothing of the project, only Pulumi and the standard library, so that the
language-host rehearsal (``language_host.py``) can install these mocks in a fresh interpreter before
the program's first import, exactly where the Pulumi CLI's engine would be.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import pulumi
from pulumi.runtime.mocks import MockCallArgs, MockResourceArgs

ACCOUNT_ID = "123456789012"
ELB_ACCOUNTS = {"us-east-1": "127311923021", "us-west-2": "797873946194"}
ZONE_LETTERS = "abcdef"
ROOT_SNAPSHOT_GB = 75
ROOT_DEVICE = "/dev/sda1"


# The images the stacks pin are the account's own, baked by `fab ami.bake`: their tag says what they
# carry (frontier.config.host_image; a test holds this equal to what the bake installs). Any image an SSM
# parameter publishes, or one a test names in ``stock_images``, is a stock image with no such tag.
HOST_TOOLS_TAG = "frontier:host-tools"
BAKED_TOOLS = (
    "amazon-cloudwatch-agent,amazon-ecr-credential-helper,aws-cli-v2,dcgm,docker,efa,haproxy,"
    "nvidia-container-toolkit,nvidia-driver"
)
# What `fab ami.bake --group gateway` installs: the tag of an image looked up for the gateway's hosts,
# which the program asks of the account and Canonical only (never a Deep Learning AMI).
GATEWAY_BAKED_TOOLS = "amazon-cloudwatch-agent,aws-cli-v2,gateway-venv,openssl"


def fake_ami(parameter: str) -> str:
    return "ami-" + hashlib.sha256(parameter.encode()).hexdigest()[:17]


class CloudMocks(pulumi.runtime.Mocks):
    """AWS as the program sees it: one account, a region with six AZs, the published AMIs."""

    def __init__(
        self,
        region: str,
        *,
        zones: int = 6,
        root_snapshot_gb: int = ROOT_SNAPSHOT_GB,
        stock_images: tuple[str, ...] = (),
        unoffered: dict[str, set[str]] | None = None,
        vcpu_quotas: dict[str, float] | None = None,
        fresh_account: bool = False,
    ) -> None:
        self.region = region
        self.zones = [f"{region}{letter}" for letter in ZONE_LETTERS[:zones]]
        self.root_snapshot_gb = root_snapshot_gb
        self.invokes: list[tuple[str, dict[str, Any]]] = []
        self.images: dict[str, str] = {}
        self.arm_images: set[str] = set()
        self.stock_images = set(stock_images)
        # Every instance type is offered in every zone but those named here (type -> zones).
        self.unoffered = unoffered or {}
        # Service Quotas' values by quota code; an account with room for every stack's max_size else.
        self.vcpu_quotas = vcpu_quotas or {}
        # A fresh account has no auto scaling service-linked role yet (AWS makes it with a first group).
        self.fresh_account = fresh_account

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
            "aws:ec2/getInstanceTypeOfferings:getInstanceTypeOfferings": self._offerings,
            "aws:servicequotas/getServiceQuota:getServiceQuota": self._quota,
            "aws:iam/getRoles:getRoles": self._roles,
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

    def _offerings(self, args: dict) -> dict:
        assert args.get("locationType") == "availability-zone", args
        (types,) = [f["values"] for f in args.get("filters", []) if f["name"] == "instance-type"]
        pairs = [(t, zone) for t in types for zone in self.zones if zone not in self.unoffered.get(t, set())]
        return {
            "instanceTypes": [t for t, _ in pairs],
            "locations": [zone for _, zone in pairs],
            "locationTypes": ["availability-zone"] * len(pairs),
            "id": self.region,
        }

    def _quota(self, args: dict) -> dict:
        code = args["quotaCode"]
        return {
            "serviceCode": args["serviceCode"],
            "quotaCode": code,
            "value": self.vcpu_quotas.get(code, 100_000.0),
            "adjustable": True,
            "id": f"{args['serviceCode']}/{code}",
        }

    def _roles(self, args: dict) -> dict:
        # Only the service-linked roles AWS makes on an account's behalf are asked for.
        path, pattern = args["pathPrefix"], args["nameRegex"]
        assert path.startswith("/aws-service-role/"), args
        name = pattern.strip("^$")
        arns = [] if self.fresh_account else [f"arn:aws:iam::{ACCOUNT_ID}:role{path}{name}"]
        return {"arns": arns, "names": [name] * len(arns), "pathPrefix": path, "nameRegex": pattern, "id": path}

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
            "tags": {}
            if image in self.images or image in self.stock_images
            else {HOST_TOOLS_TAG: BAKED_TOOLS if "amazon" in args["owners"] else GATEWAY_BAKED_TOOLS},
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
        if typ == "aws:sqs/queue:Queue":
            url = f"https://sqs.{self.region}.amazonaws.com/{ACCOUNT_ID}/{physical}"
            return url, {"arn": arn, "url": url, "name": physical}
        if typ in ("aws:autoscaling/group:Group", "aws:ec2/placementGroup:PlacementGroup"):
            return physical, {"arn": arn, "name": physical}
        return f"{typ.split(':')[-1].lower()}-{suffix}", {"arn": arn}


OIDC_ISSUER = "https://oidc.eks.us-east-1.amazonaws.com/id/EXAMPLED539D4633E53DE1B71EXAMPLE"
EKS_ENDPOINT = "https://EXAMPLE0123.gr7.us-east-1.eks.amazonaws.com"
CA_DATA = "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCg=="


class EksCloudMocks(CloudMocks):
    """The same account with EKS: a cluster's endpoint, certificate and OIDC issuer, its provider."""

    def _computed(self, args: MockResourceArgs) -> tuple[str, dict[str, Any]]:
        name = args.inputs.get("name") or args.name
        if args.typ == "aws:eks/cluster:Cluster":
            return name, {
                "arn": f"arn:aws:eks:{self.region}:{ACCOUNT_ID}:cluster/{name}",
                "name": name,
                "endpoint": EKS_ENDPOINT,
                "certificateAuthority": {"data": CA_DATA},
                "identities": [{"oidcs": [{"issuer": OIDC_ISSUER}]}],
            }
        if args.typ == "aws:iam/openIdConnectProvider:OpenIdConnectProvider":
            host = OIDC_ISSUER.removeprefix("https://")
            return host, {"arn": f"arn:aws:iam::{ACCOUNT_ID}:oidc-provider/{host}"}
        if args.typ == "aws:ec2/subnet:Subnet":
            return f"subnet-{hashlib.sha256(args.name.encode()).hexdigest()[:8]}", {}
        return super()._computed(args)
