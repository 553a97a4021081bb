"""The stack outputs: what ``fab`` and operators read after ``pulumi up`` (``pulumi stack output --json``)."""

from __future__ import annotations

from dataclasses import dataclass, fields

import pulumi


@dataclass(frozen=True)
class StackOutputs:
    region: str
    weights_bucket: pulumi.Output[str]
    weights_prefix: str
    history_bucket: pulumi.Output[str]
    history_prefix: str
    target_group_arn: pulumi.Output[str]
    asg_names: list[pulumi.Output[str]]
    ecr_repository_url: pulumi.Output[str]
    api_keys_secret_arn: pulumi.Output[str]
    alb_dns_name: pulumi.Output[str]
    alb_zone_id: pulumi.Output[str]
    kms_key_arn: pulumi.Output[str]
    deploy_role_arn: pulumi.Output[str]
    runtime_role_arn: pulumi.Output[str]
    alarm_topic_arn: pulumi.Output[str]
    dashboard_name: pulumi.Output[str]
    vpc_id: pulumi.Output[str]
    private_subnet_ids: list[pulumi.Output[str]]
    host_access: str  # "bastion" or "ssm"
    bastion_security_group_id: pulumi.Output[str] | None
    # The group a metrics scraper joins: the only source besides the ALB of the runtime port.
    monitoring_security_group_id: pulumi.Output[str]

    def export(self) -> None:
        for field in fields(self):
            pulumi.export(field.name, getattr(self, field.name))

    def as_dict(self) -> dict[str, object]:
        return {field.name: getattr(self, field.name) for field in fields(self)}
