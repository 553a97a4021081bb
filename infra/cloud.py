"""Facts about the AWS account and region the stack deploys into, read by invokes.

Every lookup the program makes lives here or in :mod:`infra.nodes` (the AMI), so the tests know the
complete list of invokes to mock. Invokes run synchronously: their results are plain values, which
keeps names and policy documents free of ``apply``.
"""

from __future__ import annotations

import pulumi_aws as aws

from frontier.identity.cloud import Cloud

__all__ = ["Cloud", "look_up"]


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
