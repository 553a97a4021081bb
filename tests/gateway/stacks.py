"""A two-model, two-tenant copy of the local stack, the shape the gateway tests and the demo use."""

from __future__ import annotations

import copy
from pathlib import Path

import yaml

from frontier import project

# A second tiny model of a different shape from the local stack's (hidden 128, 2 layers, 4/2 heads).
SECOND_MODEL = {
    "name": "tiny-llama-small",
    "weights_uri": "s3://frontier-local-weights/tiny-llama-small",
    "version": "v1",
    "num_layers": 2,
    "hidden_size": 128,
    "intermediate_size": 344,
    "num_attention_heads": 4,
    "num_kv_heads": 2,
    "vocab_size": 4096,
    "tie_word_embeddings": False,
    "dtype": "float32",
    "max_seq_len": 512,
}


def two_model_config(stack: str = "local") -> dict:
    """The ``config:`` mapping of ``stack`` turned into two model pools behind a gateway."""
    document = yaml.safe_load((project.root() / "stacks" / f"Pulumi.{stack}.yaml").read_text())
    config = document["config"]
    first = {
        "model": config.pop("frontier:model"),
        "runtime": config.pop("frontier:runtime"),
        "hosts": ["host-1", "host-2"],
    }
    second = {
        "model": dict(SECOND_MODEL),
        "runtime": {
            **copy.deepcopy(first["runtime"]),
            "api_keys_secret": "frontier/local/tiny-llama-small/api-keys",
        },
        "hosts": ["host-3"],
    }
    config["frontier:models"] = [first, second]
    config["frontier:gateway"] = {
        "port": 8090,
        "metering": {"uri": ".frontier/local/metering.jsonl"},
        # Below every shipped stack's edge.idle_timeout_s (dev's is 120 s): on EC2 the ALB fronts the gateway.
        "request_timeout_s": 100,
    }
    config["frontier:tenants"] = [
        {
            "name": "acme",
            "api_key_secret": "frontier/local/tenants/acme",
            "models": ["tiny-llama", "tiny-llama-small"],
            "requests_per_minute": 600,
            "tokens_per_minute": 100_000,
            "max_concurrent_requests": 16,
            "priority": "interactive",
        },
        {
            "name": "nightly",
            "api_key_secret": "frontier/local/tenants/nightly",
            "models": ["tiny-llama-small"],
            "requests_per_minute": 120,
            "tokens_per_minute": 20_000,
            "max_concurrent_requests": 4,
            "priority": "batch",
        },
    ]
    return document


def write_stack(directory: Path, document: dict, stack: str = "local") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"Pulumi.{stack}.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def dev_gateway_document(tenant: dict | None = None, **gateway: object) -> dict:
    """dev's stack document with a gateway on EC2 (``gateway`` adds to or replaces its fields) and one
    interactive tenant, acme, of dev's model (``tenant`` adds to or replaces its fields)."""
    document = yaml.safe_load((project.root() / "stacks" / "Pulumi.dev.yaml").read_text())
    config = document["config"]
    config["frontier:gateway"] = {
        "port": 8090,
        "metering": {"uri": "s3://frontier-dev-metering-123456789012-us-west-2/metering"},
        "ami_id": "ami-0123456789abcdef0",
        "request_timeout_s": 110,  # below dev's edge.idle_timeout_s (120 s): the ALB fronts the gateway
        **gateway,
    }
    config["frontier:tenants"] = [
        {
            "name": "acme",
            "api_key_secret": "frontier/dev/tenants/acme",
            "models": [config["frontier:model"]["name"]],
            "requests_per_minute": 600,
            "tokens_per_minute": 100000,
            "max_concurrent_requests": 16,
            "priority": "interactive",
            **(tenant or {}),
        }
    ]
    return document
