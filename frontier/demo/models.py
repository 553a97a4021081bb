"""The demo's last part: two models of different shapes behind the gateway, with two tenants.

The local stack's file is copied with its one model turned into two pools — the stack's own model
on every host slot but the last, a smaller model (hidden 128, 2 layers) on the last — plus a
gateway and two tenants: ``acme`` (interactive, both models) and ``nightly`` (batch, the small
model only). Each pool is rolled on its own (``deploy --model``), the gateway starts in front of
them, and traffic goes through it: acme on both models, nightly as a batch job. The phases join
the demo's closing table, and the gateway's metering is summed into the usage table.
"""

from __future__ import annotations

import asyncio
import copy
import time
from pathlib import Path

import httpx

from frontier.access import batch as batches
from frontier.access.usage import output_token_prices, read_records, sum_usage
from frontier.config.schema import PoolSettings, Settings
from frontier.demo.variants import load_variant, stack_document
from frontier.errors import FrontierError
from frontier.hosts.inventory import static_hosts
from frontier.loadtest.client import Target
from frontier.loadtest.stats import RequestSample
from frontier.targets.local import cluster
from frontier.targets.local import gateway as local_gateway
from frontier.targets.local.group import read_state

SMALL_MODEL = "tiny-llama-small"
# The runtime's tiny checkpoint fields for the small model, and the stack's model block for it.
SMALL_SHAPE = {
    "hidden_size": 128,
    "num_layers": 2,
    "num_heads": 4,
    "num_kv_heads": 2,
    "intermediate_size": 344,
}
SMALL_MAX_SEQ_LEN = 512


def two_model_settings(settings: Settings) -> Settings:
    """The stack file as two pools behind a gateway with two tenants, written under the demo folder."""
    document = stack_document(settings)
    config = document["config"]
    # The slots in service are split between the pools; spare slots stay out of this copy.
    serving = set(read_state(settings, cluster.state_dir(settings)).in_service)
    hosts = [h.name for h in settings.inventory.hosts if h.name in serving]
    if len(hosts) < 2:
        raise FrontierError("the two-model part of the demo needs at least two host slots in service")
    inventory = config["frontier:inventory"]
    inventory["hosts"] = [h for h in inventory["hosts"] if h["name"] in serving]
    for group in config["frontier:node_groups"]:
        group["max_size"] = min(group["max_size"], len(hosts))
        group["min_size"] = min(group["min_size"], group["max_size"])
        group["desired_size"] = min(max(group["desired_size"], group["min_size"]), group["max_size"])
    model, runtime = config.pop("frontier:model"), config.pop("frontier:runtime")
    small = {
        **copy.deepcopy(model),
        "name": SMALL_MODEL,
        "weights_uri": model["weights_uri"].rsplit("/", 1)[0] + f"/{SMALL_MODEL}",
        "num_layers": SMALL_SHAPE["num_layers"],
        "hidden_size": SMALL_SHAPE["hidden_size"],
        "intermediate_size": SMALL_SHAPE["intermediate_size"],
        "num_attention_heads": SMALL_SHAPE["num_heads"],
        "num_kv_heads": SMALL_SHAPE["num_kv_heads"],
        "max_seq_len": SMALL_MAX_SEQ_LEN,
    }
    config["frontier:models"] = [
        {"model": model, "runtime": runtime, "hosts": hosts[:-1]},
        {
            "model": small,
            # Each pool's runtimes read a key secret of their own.
            "runtime": {
                **copy.deepcopy(runtime),
                "api_keys_secret": f"frontier/{settings.stack}/{SMALL_MODEL}/api-keys",
            },
            "hosts": hosts[-1:],
        },
    ]
    state = cluster.require_local(settings, "the demo's two models run on the local stack").state_dir
    config["frontier:gateway"] = {
        "port": 8090,
        "metering": {"uri": f"{state}/metering/{settings.stack}.jsonl", "flush_s": 1},
    }
    config["frontier:tenants"] = [
        {
            "name": "acme",
            "api_key_secret": f"frontier/{settings.stack}/tenants/acme",
            "models": [model["name"], SMALL_MODEL],
            "requests_per_minute": 600,
            "tokens_per_minute": 200_000,
            "max_concurrent_requests": 16,
            "priority": "interactive",
        },
        {
            "name": "nightly",
            "api_key_secret": f"frontier/{settings.stack}/tenants/nightly",
            "models": [SMALL_MODEL],
            "requests_per_minute": 300,
            "tokens_per_minute": 50_000,
            "max_concurrent_requests": 4,
            "priority": "batch",
        },
    ]
    return load_variant(
        settings,
        document,
        cluster.state_dir(settings) / "demo" / "models" / Path(settings.source).name,
        "The demo's two models and two tenants: the stack file as two pools behind a gateway.",
    )


def small_model_dir(settings: Settings) -> Path:
    from frontier_runtime.tiny import make_tiny_checkpoint

    out = cluster.state_dir(settings) / "model" / SMALL_MODEL
    if not (out / "config.json").exists():
        make_tiny_checkpoint(out, seed=3, max_position_embeddings=SMALL_MAX_SEQ_LEN, **SMALL_SHAPE)
    return out


def keep_out_of_balancer(settings: Settings, pool: PoolSettings, multi: Settings, balancer) -> None:  # noqa: ANN001
    """The small model's slot leaves HAProxy, which fronts the first model (``pool``, the stack's
    own) only; the gateway routes by model."""
    group = pool.group.name
    small_hosts = {h.name for h in multi.pool(SMALL_MODEL).hosts}
    for host in static_hosts(settings, group, python="python3", resolve_root=str):
        if host.name in small_hosts:
            balancer.drain(host, timeout=5)


def gateway_requests(
    url: str, key: str, model: str, count: int, *, session: str | None = None
) -> list[RequestSample]:
    """``count`` streamed chats through the gateway, timed like the load test's requests."""
    from frontier.loadtest.client import stream_request

    target = Target(url, model, api_key=key, endpoint="chat", prompt_tokens=24, max_tokens=24, timeout_s=30)

    async def run() -> list[RequestSample]:
        async with httpx.AsyncClient(timeout=30) as client:
            return list(
                await asyncio.gather(
                    *(stream_request(client, target, f"question {i} about the weather") for i in range(count))
                )
            )

    return asyncio.run(run())


def refused(url: str, key: str, model: str) -> int:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    return httpx.post(
        f"{url}/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}, timeout=10
    ).status_code


def batch_job(settings: Settings, url: str, key: str, lines: int) -> tuple[batches.Summary, float]:
    folder = cluster.state_dir(settings) / "demo" / "batch"
    folder.mkdir(parents=True, exist_ok=True)
    source, output = folder / "requests.jsonl", folder / "results.jsonl"
    output.unlink(missing_ok=True)
    rows = [
        {
            "custom_id": f"doc-{i}",
            "method": "POST",
            "url": "/v1/completions",
            "body": {"prompt": f"summarise document {i}", "max_tokens": 16},
        }
        for i in range(lines)
    ]
    import json

    source.write_text("".join(json.dumps(r) + "\n" for r in rows))
    requests, bad, _ = batches.read_input(source, SMALL_MODEL)
    results = batches.ResultFile(output)
    started = time.perf_counter()
    try:
        summary = asyncio.run(batches.run_batch(url, key, requests, bad, results, concurrency=4))
    finally:
        results.close()
    return summary, time.perf_counter() - started


def usage_rows(multi: Settings):  # noqa: ANN201
    uri = str(cluster.resolve(multi.gateway.metering.uri)) if multi.gateway else ""
    found = read_records(uri)
    prices = output_token_prices(multi)
    return sum_usage(found.records, prices), prices, uri


def start_gateway(multi: Settings) -> list[cluster.Component]:
    metering = cluster.resolve(multi.gateway.metering.uri) if multi.gateway else None
    if metering is not None:
        metering.unlink(missing_ok=True)  # this run's usage only
    return local_gateway.start(multi)
