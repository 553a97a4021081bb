"""Facts about the AWS account and region the stack deploys into, read by invokes.

Every lookup the program makes lives here or in :mod:`infra.nodes` (the AMI), so the tests know the
complete list of invokes to mock. Invokes run synchronously: their results are plain values, which
keeps names and policy documents free of ``apply``.
"""

from __future__ import annotations

from dataclasses import dataclass

import pulumi_aws as aws


@dataclass(frozen=True)
class Cloud:
    account_id: str
    partition: str
    region: str
    dns_suffix: str
    availability_zones: tuple[str, ...]
    elb_account_arn: str

    def arn(self, service: str, resource: str, *, regional: bool = True, account: bool = True) -> str:
        region = self.region if regional else ""
        owner = self.account_id if account else ""
        return f"arn:{self.partition}:{service}:{region}:{owner}:{resource}"

    def service_principal(self, service: str) -> str:
        return f"{service}.{self.dns_suffix}"

    @property
    def account_root(self) -> str:
        return f"arn:{self.partition}:iam::{self.account_id}:root"


def look_up(region: str) -> Cloud:
    """Caller identity, partition, the region's opted-in AZs and its ELB log-delivery account."""
    identity = aws.get_caller_identity()
    partition = aws.get_partition()
    zones = aws.get_availability_zones(
        state="available",
        # Local Zones and Wavelength Zones are opt-in; node groups and NAT belong in the region's own AZs.
        filters=[aws.GetAvailabilityZonesFilterArgs(name="opt-in-status", values=["opt-in-not-required"])],
    )
    elb = aws.elb.get_service_account(region=region)
    return Cloud(
        account_id=identity.account_id,
        partition=partition.partition,
        region=region,
        dns_suffix=partition.dns_suffix,
        availability_zones=tuple(sorted(zones.names)),
        elb_account_arn=elb.arn,
    )
