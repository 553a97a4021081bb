"""boto3 clients for a stack, and the Pulumi stack outputs the operate tasks read.

Endpoints and credentials come from the standard AWS environment (``AWS_ENDPOINT_URL`` and
friends), so moto's server stands in for AWS without special code paths. Which AWS a stack talks
to is its backend's answer (``Backend.aws_client``): the local stack's defaults to its moto server.

Cloud stacks name their buckets and target groups in Pulumi stack outputs. The Pulumi CLI is not
needed to read them: save them once with ``pulumi stack output --json -s <stack> >
.frontier/outputs/<stack>.json`` (or point ``$FRONTIER_STACK_OUTPUTS`` at such a file). They are
read into the target's model of :mod:`frontier.config.outputs`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, TypeVar

import boto3
from botocore.config import Config
from pydantic import ValidationError

from frontier import project
from frontier.config.outputs import StackOutputs
from frontier.config.schema import Settings
from frontier.errors import FrontierError


def client(settings: Settings, service: str, *, region: str = "", **kwargs: Any) -> Any:
    """A boto3 client in the stack's region (or ``region``: the backup copy's); ``kwargs`` (an
    endpoint, credentials) go to boto3."""
    config = Config(retries={"max_attempts": 5, "mode": "standard"}, connect_timeout=5, read_timeout=60)
    return boto3.client(service, region_name=region or settings.region, config=config, **kwargs)


def outputs_file(settings: Settings) -> Path:
    override = os.environ.get("FRONTIER_STACK_OUTPUTS")
    return Path(override) if override else project.state_dir() / "outputs" / f"{settings.stack}.json"


Outputs = TypeVar("Outputs", bound=StackOutputs[str])


def stack_outputs(settings: Settings, model: type[Outputs]) -> Outputs:
    """The Pulumi stack outputs saved for this stack, as ``model`` (its target's outputs)."""
    path = outputs_file(settings)
    save = f"`pulumi stack output --json -s {settings.stack} > {path}` (or set $FRONTIER_STACK_OUTPUTS)"
    if not path.exists():
        raise FrontierError(f"stack {settings.stack!r}: no stack outputs saved; save them with {save}")
    try:
        return model.model_validate_json(path.read_bytes())
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(part) for part in error['loc']) or 'outputs'}: {error['msg']}"
            for error in exc.errors()
        )
        raise FrontierError(
            f"{path}: the saved outputs of stack {settings.stack!r} are not what its program exports "
            f"({problems}); after `pulumi up -s {settings.stack}` save them again with {save}"
        ) from None
