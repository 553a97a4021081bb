"""Facts about the AWS account and region a stack's ARNs name (read by invokes in ``infra/cloud.py``)."""

from __future__ import annotations

from dataclasses import dataclass


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
