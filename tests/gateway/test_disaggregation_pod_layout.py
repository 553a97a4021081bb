"""A disaggregated pool as its Kubernetes pods run it (eks-gateway's 8B pool, rendered): both
runtimes serve one ``runtime.yaml`` (``kv_transfer.role: both``) with the command-line tail their
Deployment gives them (``--kv-role``, and a prefill's ``--kv-host $(POD_IP)`` as the kubelet expands
it), and the gateway runs with the model entry the Kubernetes renderer writes: the prefill Service
and the decode Service as the two hops, the decode Service as the colocated fallback.

Real: the runtime processes of one tiny model and the gateway on loopback sockets. Mocked: the
cluster (each Service is the one process behind it; a pod's address is 127.0.0.1) and the pool's key
secret (the runtimes take no key)."""

from __future__ import annotations

import random
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from frontier_gateway.config import parse_config
from frontier_hostside import names
from frontier_hostside.names import PREFIX_CACHE_HITS_METRIC

from frontier.targets import load_stack
from frontier.targets.kubernetes import gateway as gw
from frontier.targets.kubernetes import manifests as m
from tests.gateway.disaggregated import answered, disaggregated_config, streamed
from tests.gateway.harness import RuntimeProcess, free_port, running_gateway, runtime_yaml, wait_ready

pytestmark = pytest.mark.slow

SMALL = "llama-3.1-8b-instruct"
PROMPT = [random.Random(11).randrange(1, 500) for _ in range(120)]  # 7 full blocks of 16 to hand over
DIGEST = "sha256:" + "ab" * 32


@pytest.fixture(scope="module")
def rendered() -> tuple[dict[str, list[str]], dict[str, Any]]:
    """Each half's command-line tail after ``--config``, and the pool's entry in gateway.yaml."""
    workload = m.render_workload(load_stack("eks-gateway"), DIGEST)
    tails = {}
    for half in ("prefill", "decode"):
        deployment = next(p.deployment for p in workload.pools if p.deployment.name.endswith(f"-{half}"))
        command = deployment.to_dict()["spec"]["template"]["spec"]["containers"][0]["command"]
        tails[half] = command[command.index("--config") + 2 :]
    assert workload.gateway is not None
    config = parse_config(workload.gateway.config_map.to_dict()["data"][gw.GATEWAY_CONFIG_FILE])
    (entry,) = [p.model_dump() for p in config.models if p.name == SMALL]
    return tails, entry


def start_pod(model_dir: Path, workdir: Path, config: Path, tail: list[str]) -> RuntimeProcess:
    """A runtime as its container starts it, its $(POD_IP) the loopback address."""
    port = free_port()
    log = workdir / f"{port}.log"
    args = [arg.replace("$(POD_IP)", "127.0.0.1") for arg in tail]
    process = subprocess.Popen(
        [sys.executable, "-m", "frontier_runtime", "serve", "--config", str(config), *args]
        + ["--host", "127.0.0.1", "--port", str(port), "--model-dir", str(model_dir)],
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        cwd=workdir,
    )
    return RuntimeProcess("tiny-a", f"http://127.0.0.1:{port}", process, log)


@pytest.fixture(scope="module")
def pods(
    tiny_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory, rendered
) -> Iterator[dict[str, RuntimeProcess]]:
    tails, _ = rendered
    work = tmp_path_factory.mktemp("pod-layout")
    model = tiny_models["tiny-a"]
    # The release's one config for the pair: a colocated runtime.yaml with its transfer port.
    config = work / "runtime.yaml"
    config.write_text(
        yaml.safe_dump(
            {**runtime_yaml("tiny-a", model), "kv_transfer": {"role": "both", "port": free_port()}}
        )
    )
    started = {half: start_pod(model, work, config, tails[half]) for half in ("prefill", "decode")}
    try:
        wait_ready(list(started.values()))
        yield started
    finally:
        for rt in started.values():
            rt.kill()


def pool_config(rendered, pods: dict[str, RuntimeProcess], metering: Path) -> Any:
    """The gateway's config with the rendered entry of the pool, each Service URL the process behind it."""
    _, entry = rendered
    services = {
        url: pods[half].url for half in ("prefill", "decode") for url in entry["disaggregation"][half]
    }

    def behind(urls: list[str]) -> list[str]:
        return [services[url] for url in urls]

    hops = entry["disaggregation"]
    # The pods here take no key: no Secrets Manager holds the pool's, so the gateway presents none.
    keyless = {**entry, "api_keys_secret": ""}
    return disaggregated_config(
        behind(entry["replicas"]), behind(hops["prefill"]), behind(hops["decode"]), metering, entry=keyless
    )


def computed_by_the_decode(pods: dict[str, RuntimeProcess]) -> str:
    return answered(pods["decode"].url, PROMPT)


def test_the_rendered_entry_sends_the_decode_service_both_hops_fallback(rendered):
    _, entry = rendered
    assert entry["replicas"] == entry["disaggregation"]["decode"]
    assert entry["disaggregation"]["prefill"] != entry["disaggregation"]["decode"]


def test_a_prompt_goes_to_the_prefill_pod_and_its_blocks_to_the_decode_pod(pods, rendered, tmp_path):
    hits_before = pods["decode"].metric(PREFIX_CACHE_HITS_METRIC + "_total")
    with running_gateway(pool_config(rendered, pods, tmp_path / "m.jsonl")) as gateway:
        pool = gateway.gateway.pools.get("tiny-a")
        text, headers = streamed(gateway.url, PROMPT)
        assert (pool.disaggregated.handed_over, pool.disaggregated.prefill_failed) == (1, 0)
        assert headers[names.REPLICA_HEADER] == pool.disaggregated.decode.replicas[0].id
    # The pulled blocks came from the prefill's listener at the address its command line gave it.
    assert pods["decode"].metric(PREFIX_CACHE_HITS_METRIC + "_total") - hits_before >= 7 * 16
    assert text == computed_by_the_decode(pods)


def test_with_the_prefill_down_the_decode_service_serves_as_the_fallback(pods, rendered, tmp_path):
    expected = computed_by_the_decode(pods)
    pods["prefill"].kill()
    with running_gateway(pool_config(rendered, pods, tmp_path / "m.jsonl")) as gateway:
        pool = gateway.gateway.pools.get("tiny-a")
        text, headers = streamed(gateway.url, PROMPT)
        assert headers[names.REPLICA_HEADER] == pool.replicas[0].id
        assert pool.disaggregated.handed_over == 0
    assert text == expected
