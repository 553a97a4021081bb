"""Shared test setup: every test runs from the repository root with a clean AWS environment."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:  # the runtime's and the gateway's tests run without the toolkit's imports
    from frontier.config.outputs import Ec2Outputs, KubernetesOutputs
    from frontier.config.schema import Settings

REPO = Path(__file__).resolve().parent.parent
ACCOUNT_ID = "123456789012"


@pytest.fixture(autouse=True)
def _no_real_aws(monkeypatch: pytest.MonkeyPatch) -> None:
    """No test may reach a real AWS account: dummy credentials, a fixed region."""
    for var in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", os.environ.get("FRONTIER_TEST_KEY", "testing"))
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")


class SavedOutputs:
    """A stack's Pulumi outputs as ``pulumi up`` exports them, saved where ``fab`` reads them."""

    def __init__(self, path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.path, self.monkeypatch = path, monkeypatch

    def _save(self, outputs: Ec2Outputs[str] | KubernetesOutputs[str]) -> None:
        self.path.write_text(outputs.model_dump_json())
        self.monkeypatch.setenv("FRONTIER_STACK_OUTPUTS", str(self.path))

    @staticmethod
    def _common(settings: Settings) -> dict[str, Any]:
        stack, region = settings.stack, settings.region
        weights_bucket, _, weights_prefix = settings.model.weights_uri.removeprefix("s3://").partition("/")
        arn = f"{region}:{ACCOUNT_ID}"
        return {
            "region": region,
            "weights_bucket": weights_bucket,
            "weights_prefix": weights_prefix,
            "history_bucket": f"frontier-{stack}-history-{ACCOUNT_ID}-{region}",
            "history_prefix": f"history/{stack}/",
            "ecr_repository_url": settings.runtime.image_repository,
            "api_keys_secret_arn": f"arn:aws:secretsmanager:{arn}:secret:{settings.runtime.api_keys_secret}",
            "kms_key_arn": f"arn:aws:kms:{arn}:key/0a1b2c3d",
            "deploy_role_arn": f"arn:aws:iam::{ACCOUNT_ID}:role/{stack}-iam-deploy",
            "runtime_role_arn": f"arn:aws:iam::{ACCOUNT_ID}:role/{stack}-iam-runtime",
        }

    def ec2(self, settings: Settings, **changes: Any) -> Ec2Outputs[str]:
        from frontier.config.outputs import Ec2Outputs

        stack, region = settings.stack, settings.region
        alb = f"{stack}-edge-alb-0a1b2c3.{region}.elb.amazonaws.com"
        outputs = Ec2Outputs[str](
            **self._common(settings),
            endpoint=f"https://{alb}",
            target_group_arn=f"arn:aws:elasticloadbalancing:{region}:{ACCOUNT_ID}:targetgroup/{stack}-tg/0a1b",
            asg_names=[f"{stack}-{group.name}" for group in settings.node_groups],
            alb_dns_name=alb,
            alb_zone_id="Z35SXDOTRQ7X7K",
            alarm_topic_arn=f"arn:aws:sns:{region}:{ACCOUNT_ID}:{stack}-alarms",
            dashboard_name=f"frontier-{stack}",
            vpc_id="vpc-0a1b2c3d",
            private_subnet_ids=["subnet-0a1b2c3d"],
            host_access="bastion" if settings.inventory.ssh_gateway else "ssm",
            bastion_security_group_id="sg-0b" if settings.inventory.ssh_gateway else None,
            monitoring_security_group_id="sg-0c",
        ).model_copy(update=changes)
        self._save(outputs)
        return outputs

    def kubernetes(self, settings: Settings, **changes: Any) -> KubernetesOutputs[str]:
        from frontier.config.outputs import KubernetesOutputs

        k = settings.kubernetes
        assert k is not None
        outputs = KubernetesOutputs[str](
            **self._common(settings),
            endpoint=f"https://{k.ingress.host}",
            cluster_name=k.cluster.name,
            namespace=k.namespace,
            deployment=f"frontier-{settings.model.name}",
        ).model_copy(update=changes)
        self._save(outputs)
        return outputs


@pytest.fixture
def saved_outputs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> SavedOutputs:
    """``saved_outputs.ec2(settings, history_bucket=...)``: the stack's outputs, with changes, saved."""
    return SavedOutputs(tmp_path / "stack-outputs.json", monkeypatch)
