"""boto3 clients for a stack, and the Pulumi stack outputs the operate tasks read.

Endpoints and credentials come from the standard AWS environment (``AWS_ENDPOINT_URL`` and
friends), so moto's server stands in for AWS without special code paths. The one default added
here: on the local stack, with no endpoint set, the moto server of ``local.moto_port`` is used.

Cloud stacks name their buckets and target groups in Pulumi stack outputs. The Pulumi CLI is not
needed to read them: save them once with ``pulumi stack output --json -s <stack> >
.frontier/outputs/<stack>.json`` (or point ``$FRONTIER_STACK_OUTPUTS`` at such a file).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import boto3
from botocore.config import Config

from frontier import project
from frontier.config.schema import Settings
from frontier.contracts import LOCAL_AWS_KEY_ID, LOCAL_AWS_SECRET
from frontier.errors import FrontierError


def local_endpoint(settings: Settings) -> str | None:
    if os.environ.get("AWS_ENDPOINT_URL") or settings.local is None:
        return None
    return f"http://127.0.0.1:{settings.local.moto_port}"


def client(settings: Settings, service: str, **kwargs: Any) -> Any:
    """A boto3 client in the stack's region (the local stack defaults to its moto server)."""
    endpoint = kwargs.pop("endpoint_url", None) or local_endpoint(settings)
    extra: dict[str, Any] = {}
    if endpoint:
        extra["endpoint_url"] = endpoint
    if settings.local is not None and not os.environ.get("AWS_ACCESS_KEY_ID"):
        # moto accepts any credentials; a fresh shell on the local stack has none.
        extra.update(aws_access_key_id=LOCAL_AWS_KEY_ID, aws_secret_access_key=LOCAL_AWS_SECRET)
    config = Config(retries={"max_attempts": 5, "mode": "standard"}, connect_timeout=5, read_timeout=60)
    return boto3.client(service, region_name=settings.region, config=config, **extra, **kwargs)


def outputs_file(settings: Settings) -> Path:
    override = os.environ.get("FRONTIER_STACK_OUTPUTS")
    return Path(override) if override else project.state_dir() / "outputs" / f"{settings.stack}.json"


def stack_outputs(settings: Settings) -> dict[str, Any]:
    """The Pulumi stack outputs saved for this stack ({} when none were saved)."""
    path = outputs_file(settings)
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise FrontierError(f"{path}: stack outputs are not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise FrontierError(f"{path}: expected a JSON object of stack outputs")
    return data


def stack_output(settings: Settings, key: str) -> str:
    value = stack_outputs(settings).get(key)
    if not value:
        path = outputs_file(settings)
        raise FrontierError(
            f"stack {settings.stack!r}: output {key!r} is unknown; save the Pulumi stack outputs with "
            f"`pulumi stack output --json -s {settings.stack} > {path}` (or set $FRONTIER_STACK_OUTPUTS)"
        )
    return str(value)
