"""The synthetic probe's Lambda handler (``infra/probe.py`` packages it with the host side's probe,
``frontier_hostside/probe.py``): probe the public endpoint, publish the outcome, answer it.

A failed probe is data, not an error of the function: the alarm reads ``ProbeSuccess``, and a
function that did not run at all publishes nothing, which that alarm counts as failing too.
boto3 is the Lambda runtime's own.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from typing import Any

import boto3
from frontier_hostside.probe import KEY_ENV, key_from_secret, key_secrets, probe, publish, settings_from


def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:  # noqa: ARG001 - Lambda's signature
    endpoint, models, stack, timeout = settings_from(os.environ)
    key: str | dict[str, str] | None = os.environ.get(KEY_ENV) or None
    secrets = key_secrets(os.environ, models)
    if not key and secrets:
        # Each model is asked with its own pool's key; a secret several models name is read once.
        client = boto3.client("secretsmanager")
        read = {
            secret: key_from_secret(client.get_secret_value(SecretId=secret)["SecretString"])
            for secret in dict.fromkeys(secrets.values())
        }
        key = {model: read[secret] for model, secret in secrets.items()}
    result = probe(endpoint, models, key, timeout)
    publish(boto3.client("cloudwatch"), stack, result)
    print(json.dumps(asdict(result)))
    return asdict(result)
