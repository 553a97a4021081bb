"""A gateway started from the ``gateway.yaml`` a stack renders routes a pool by its runtime's KV
events: it fetches the model's tokenizer from the pool's weights version in S3 (moto's server, the
weights pushed by ``weights.push``), subscribes on the ports the pool's runtime section names, and a
real runtime's events make the second turn of a conversation a hit. A tokenizer it cannot fetch
leaves the pool routed by load, counted, and serving."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import httpx
import pytest
from frontier_gateway.config import parse_config
from frontier_hostside import names

from frontier.access.gateway import new_tenant_key, render_gateway_config
from frontier.config.schema import Settings
from frontier.release.weights import push
from frontier.targets import load_stack
from tests.gateway.harness import free_port, running_gateway, start_runtime, wait_ready
from tests.gateway.stacks import two_model_config, write_stack
from tests.moto_server import moto_server

pytestmark = pytest.mark.e2e

POOL = "tiny-llama-small"  # the two-model stack's pool on one local slot (host-3)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Settings:
    """The local two-model stack with POOL's runtimes publishing KV events on ports of their own."""
    document = two_model_config()
    runtime = document["config"]["frontier:models"][1]["runtime"]
    runtime["kv_events"] = {"enabled": True, "port": free_port(), "replay_port": free_port()}
    return load_stack("local", path=write_stack(tmp_path_factory.mktemp("stack"), document))


@pytest.fixture(scope="module")
def account(stack: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """moto's server holding POOL's weights (tokenizer files included) and the stack's secrets."""
    from frontier_runtime.tiny import make_tiny_checkpoint

    model_dir = make_tiny_checkpoint(tmp_path_factory.mktemp("model") / POOL, seed=3)
    with moto_server() as endpoint, pytest.MonkeyPatch.context() as env:
        env.setenv("AWS_ENDPOINT_URL", endpoint)
        env.setenv("AWS_DEFAULT_REGION", stack.region)
        env.setenv("AWS_ACCESS_KEY_ID", "testing")
        env.setenv("AWS_SECRET_ACCESS_KEY", "testing")
        pool = stack.pool(POOL)
        push(
            boto3.client("s3"),
            model_dir,
            pool.model.weights_uri,
            POOL,
            pool.model.version,
            create_bucket=True,
        )
        sm = boto3.client("secretsmanager")
        keys = {}
        for tenant in stack.tenants:
            keys[tenant.name], secret = new_tenant_key()
            sm.create_secret(Name=tenant.api_key_secret, SecretString=secret)
        for each in stack.pools:
            sm.create_secret(Name=each.runtime.api_keys_secret, SecretString=json.dumps({"keys": ["sk-rt"]}))
        yield {"model_dir": model_dir, "keys": keys}


@pytest.fixture(scope="module")
def runtime(
    stack: Settings, account: dict[str, Any], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """POOL's runtime as its pool's runtime section runs it: its KV events and block size."""
    pool = stack.pool(POOL)
    events = {"kv_events": pool.runtime.kv_events.model_dump(), "block_size": pool.runtime.block_size}
    process = start_runtime(POOL, account["model_dir"], tmp_path_factory.mktemp("runtime"), events)
    try:
        wait_ready([process])
        yield process.url
    finally:
        process.kill()


def _gateway_yaml(stack: Settings, runtime: str, work: Path) -> str:
    # The runtime runs here rather than on host-3's address; the other pool's replica never answers.
    replicas = {POOL: [runtime], "tiny-llama": [f"http://127.0.0.1:{free_port()}"]}
    return render_gateway_config(stack, replicas, metering_uri=str(work / "metering.jsonl"))


def _kv_decisions(admin_url: str) -> dict[str, float]:
    counts = {}
    for line in httpx.get(admin_url + "/metrics", timeout=5).text.splitlines():
        if line.startswith(names.GATEWAY_KV_ROUTING_METRIC) and f'model="{POOL}"' in line:
            outcome = line.split('outcome="', 1)[1].split('"', 1)[0]
            counts[outcome] = float(line.rsplit(" ", 1)[1])
    return counts


def _chat(url: str, key: str, messages: list[dict[str, str]]) -> httpx.Response:
    body = {"model": POOL, "messages": messages, "max_tokens": 4, "temperature": 0}
    return httpx.post(
        f"{url}/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}, timeout=60
    )


def _ready(gw: Any) -> None:
    import time

    deadline = time.monotonic() + 30
    while not gw.gateway.pools.get(POOL).ready_count:
        assert time.monotonic() < deadline, gw.gateway.pools.summary()
        time.sleep(0.05)


def test_the_rendered_config_routes_the_pool_by_its_runtimes_kv_events(
    stack, account, runtime, tmp_path
) -> None:
    config = parse_config(_gateway_yaml(stack, runtime, tmp_path))
    routing = config.models[[p.name for p in config.models].index(POOL)].kv_routing
    assert routing is not None and routing.events_port == stack.pool(POOL).runtime.kv_events.port
    system = "You are a careful assistant who answers in one short line. " * 8  # several blocks
    messages = [{"role": "system", "content": system}, {"role": "user", "content": "first question"}]
    with running_gateway(config, wait_ready=False) as gw:
        _ready(gw)
        kv = gw.gateway.pools.get(POOL).kv
        assert kv is not None and kv.tokenizer_problem == ""
        assert _chat(gw.url, account["keys"]["acme"], messages).status_code == 200
        # The runtime's events, not the speculative entry, must hold the prompt's blocks.
        import time

        deadline = time.monotonic() + 10
        while not kv.index.summary().get(runtime):
            assert time.monotonic() < deadline, "no KV event reached the gateway's index"
            time.sleep(0.05)
        messages += [{"role": "assistant", "content": "an answer"}, {"role": "user", "content": "and then?"}]
        assert _chat(gw.url, account["keys"]["acme"], messages).status_code == 200
        decisions = _kv_decisions(gw.admin_url)
    assert decisions.get("kv_hit") == 1, decisions
    assert decisions.get("no_tokenizer", 0) == 0, decisions


def test_a_tokenizer_it_cannot_fetch_leaves_the_pool_routed_by_load_and_serving(
    stack, account, runtime, tmp_path, monkeypatch
) -> None:
    # The weights version the config names does not exist (nothing was pushed under v9).
    text = _gateway_yaml(stack, runtime, tmp_path).replace(f"{POOL}/v1", f"{POOL}/v9")
    config = parse_config(text)
    with running_gateway(config, wait_ready=False) as gw:
        _ready(gw)
        kv = gw.gateway.pools.get(POOL).kv
        assert kv is not None and "cannot fetch the tokenizer" in kv.tokenizer_problem
        messages = [{"role": "user", "content": "hello"}]
        assert _chat(gw.url, account["keys"]["acme"], messages).status_code == 200
        assert _kv_decisions(gw.admin_url).get("no_tokenizer") == 1
