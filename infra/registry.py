"""Registry: the ECR repository of the runtime image, deployed by digest only.

Tags are immutable (a tag can never be repointed to other bytes), every push is scanned, and images
are encrypted with the stack's KMS key. The lifecycle policy keeps far more images than
``rollout.keep_releases`` so a rollback never finds its digest gone.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws

KEEP_IMAGES = 200


def repository_name(image_repository: str) -> str:
    """``<account>.dkr.ecr.<region>.amazonaws.com/frontier-runtime`` → ``frontier-runtime``."""
    host, _, path = image_repository.partition("/")
    return path if path and ".dkr.ecr." in host else image_repository


def lifecycle_policy(keep: int = KEEP_IMAGES) -> str:
    return json.dumps(
        {
            "rules": [
                {
                    "rulePriority": 1,
                    "description": f"keep the newest {keep} images; releases reference them by digest",
                    "selection": {"tagStatus": "any", "countType": "imageCountMoreThan", "countNumber": keep},
                    "action": {"type": "expire"},
                }
            ]
        }
    )


@dataclass(frozen=True)
class RegistryArgs:
    image_repository: str
    kms_key_arn: pulumi.Input[str]
    tags: Mapping[str, str]


class Registry(pulumi.ComponentResource):
    repository_url: pulumi.Output[str]
    repository_arn: pulumi.Output[str]

    def __init__(self, name: str, args: RegistryArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("frontier:registry:Registry", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        repo = aws.ecr.Repository(
            f"{name}-runtime",
            name=repository_name(args.image_repository),
            image_tag_mutability="IMMUTABLE",
            image_scanning_configuration={"scan_on_push": True},
            encryption_configurations=[{"encryption_type": "KMS", "kms_key": args.kms_key_arn}],
            force_delete=False,
            tags=dict(args.tags),
            opts=child,
        )
        aws.ecr.LifecyclePolicy(
            f"{name}-runtime", repository=repo.name, policy=lifecycle_policy(), opts=child
        )
        self.repository_url, self.repository_arn = repo.repository_url, repo.arn
        self.register_outputs({"repository_url": repo.repository_url})
