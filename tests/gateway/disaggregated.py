"""What the gateway's tests of a disaggregated pool share: the tenant, one greedy request of a prompt
to the model ``tiny-a``, its text streamed through a gateway or answered by a runtime directly, and
the gateway's config whose model has a prefill and a decode hop beside its colocated replicas."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
from frontier_gateway.config import GatewayConfig

from tests.gateway.harness import gateway_config, tenant

MODEL = "tiny-a"
KEY = "sk-acme-0123456789"
AUTH = {"Authorization": f"Bearer {KEY}"}


def request(prompt: list[int], **fields: Any) -> dict[str, Any]:
    """A greedy completion of 12 tokens: the same text from every replica that computes it right."""
    return {
        "model": MODEL,
        "prompt": prompt,
        "max_tokens": 12,
        "temperature": 0,
        "ignore_eos": True,
        **fields,
    }


def streamed(url: str, prompt: list[int]) -> tuple[str, httpx.Headers]:
    """The text of the request streamed through the gateway at ``url``, as acme, and the headers."""
    text = []
    with httpx.stream(
        "POST", f"{url}/v1/completions", json=request(prompt, stream=True), headers=AUTH, timeout=60
    ) as answer:
        assert answer.status_code == 200
        for line in answer.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                text += [c["text"] for c in json.loads(line[6:]).get("choices", [])]
        return "".join(text), answer.headers


def answered(url: str, prompt: list[int]) -> str:
    """The text of the request as the runtime at ``url`` answers it itself."""
    answer = httpx.post(f"{url}/v1/completions", json=request(prompt), timeout=60)
    return str(answer.json()["choices"][0]["text"])


def disaggregated_config(
    replicas: list[str],
    prefill: list[str],
    decode: list[str],
    metering: Path,
    *,
    entry: dict[str, Any] | None = None,
    **extra: Any,
) -> GatewayConfig:
    """The gateway's config with acme as the tenant of its one model: ``entry`` (a rendered model
    entry; by default the harness's) serving ``replicas`` colocated, ``prefill`` then ``decode`` as
    the two hops. ``extra``: the gateway's other fields (its probe, ...)."""
    config = gateway_config({MODEL: replicas}, [tenant("acme", KEY, [MODEL])], metering, **extra)
    data = config.model_dump()
    data["models"] = [
        {
            **(entry or data["models"][0]),
            "name": MODEL,
            "replicas": replicas,
            "disaggregation": {"prefill": prefill, "decode": decode},
        }
    ]
    return GatewayConfig.model_validate(data)
