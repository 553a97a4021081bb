"""S3 bucket names are global: a stack's buckets carry its account and region on every target."""

from __future__ import annotations

import pytest
from infra_mocks import run_program
from k8s_mocks import run_kubernetes

from frontier.config.schema import Settings
from frontier.targets import load_stack
from infra.errors import ProvisionError

CLOUD_STACKS = (
    "dev",
    "staging",
    "prod",
    "prod-multinode",
    "moe-prod",
    "eks-prod",
    "eks-gateway",
    "eks-multinode",
)


def run(settings: Settings):
    return run_kubernetes(settings) if settings.kubernetes else run_program(settings)


def unsuffixed(settings: Settings) -> Settings:
    pools = tuple(
        pool.model_copy(
            update={
                "model": pool.model.model_copy(
                    update={"weights_uri": f"s3://frontier-{settings.stack}-weights/{pool.model.name}"}
                )
            }
        )
        for pool in settings.pools
    )
    return settings.model_copy(update={"pools": pools})


@pytest.mark.parametrize("stack", CLOUD_STACKS)
def test_every_cloud_stacks_weights_bucket_carries_its_account_and_region(stack):
    settings = load_stack(stack)
    bucket = settings.weights_root.removeprefix("s3://").split("/", 1)[0]
    assert bucket.endswith(f"-123456789012-{settings.region}")


@pytest.mark.parametrize("stack", ["dev", "eks-prod"])
def test_a_weights_bucket_without_account_and_region_is_refused_on_every_target(stack):
    with pytest.raises(
        ProvisionError,
        match=r"model\.weights_uri = 's3://frontier-[a-z-]+-weights/.*S3 bucket names are global",
    ):
        run(unsuffixed(load_stack(stack)))
