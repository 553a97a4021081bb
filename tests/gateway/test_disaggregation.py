"""The gateway's two hops for a disaggregated pool, over real runtime processes: a colocated
replica, a prefill replica (``kv_transfer.role: prefill``) and a decode replica
(``kv_transfer.role: decode``) of one tiny model. The prefill answers one token and where its KV
waits; the decode pulls it and its answer streams to the client, token for token what the
colocated replica answers; with no prefill or no decode replica ready the colocated one serves."""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from frontier_hostside import names
from frontier_hostside.names import PREFIX_CACHE_HITS_METRIC

from tests.gateway.disaggregated import AUTH, answered, disaggregated_config, request, streamed
from tests.gateway.harness import RuntimeProcess, free_port, running_gateway, start_runtime, wait_ready

pytestmark = pytest.mark.slow

PROMPT = [random.Random(9).randrange(1, 500) for _ in range(120)]  # 7 full blocks of 16 to hand over


@pytest.fixture(scope="module")
def roles(
    tiny_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, RuntimeProcess]]:
    work = tmp_path_factory.mktemp("disaggregation")
    model = tiny_models["tiny-a"]
    procs = {
        "colocated": start_runtime("tiny-a", model, work),
        "prefill": start_runtime(
            "tiny-a",
            model,
            work,
            {"kv_transfer": {"role": "prefill", "host": "127.0.0.1", "port": free_port()}},
        ),
        "decode": start_runtime("tiny-a", model, work, {"kv_transfer": {"role": "decode"}}),
    }
    try:
        wait_ready(list(procs.values()))
        yield procs
    finally:
        for rt in procs.values():
            rt.kill()


def config(roles: dict[str, RuntimeProcess], metering: Path, probe_interval_s: float = 0.2) -> Any:
    return disaggregated_config(
        [roles["colocated"].url],
        [roles["prefill"].url],
        [roles["decode"].url],
        metering,
        probe={"interval_s": probe_interval_s, "timeout_s": 0.5},
    )


def streamed_text(url: str) -> tuple[str, httpx.Headers]:
    return streamed(url, PROMPT)


def colocated_text(roles: dict[str, RuntimeProcess]) -> str:
    return answered(roles["colocated"].url, PROMPT)


def test_a_request_goes_to_the_prefill_then_streams_from_the_decode_as_a_colocated_replica_answers(
    roles: dict[str, RuntimeProcess], tmp_path: Path
) -> None:
    hits_before = roles["decode"].metric(PREFIX_CACHE_HITS_METRIC + "_total")
    with running_gateway(config(roles, tmp_path / "m.jsonl")) as gw:
        pd = gw.gateway.pools.get("tiny-a").disaggregated
        text, headers = streamed_text(gw.url)
        assert text == colocated_text(roles)
        assert headers[names.REPLICA_HEADER] == pd.decode.replicas[0].id
        assert (pd.handed_over, pd.prefill_failed) == (1, 0)
        unary = httpx.post(f"{gw.url}/v1/completions", json=request(PROMPT), headers=AUTH, timeout=60)
        assert unary.json()["choices"][0]["text"] == text
        assert "kv_transfer_params" not in unary.json()
    # The decode side computed only the prompt's tail: the 7 pulled blocks were prefix-cache hits.
    assert roles["decode"].metric(PREFIX_CACHE_HITS_METRIC + "_total") - hits_before >= 7 * 16


def test_a_chat_request_is_handed_over_too(roles: dict[str, RuntimeProcess], tmp_path: Path) -> None:
    chat = {
        "model": "tiny-a",
        "messages": [{"role": "user", "content": "a prompt long enough to fill blocks " * 12}],
        "max_completion_tokens": 8,
        "temperature": 0,
        "ignore_eos": True,
    }
    with running_gateway(config(roles, tmp_path / "m.jsonl")) as gw:
        pd = gw.gateway.pools.get("tiny-a").disaggregated
        handed = httpx.post(f"{gw.url}/v1/chat/completions", json=chat, headers=AUTH, timeout=60)
        assert handed.status_code == 200, handed.text
        assert pd.handed_over == 1
    direct = httpx.post(f"{roles['colocated'].url}/v1/chat/completions", json=chat, timeout=60)
    assert handed.json()["choices"][0]["message"] == direct.json()["choices"][0]["message"]
    assert handed.json()["usage"]["completion_tokens"] == 8


def test_a_prefill_replica_that_died_unnoticed_leaves_the_decode_computing_the_prompt(
    roles: dict[str, RuntimeProcess], tmp_path: Path
) -> None:
    with running_gateway(config(roles, tmp_path / "m.jsonl", probe_interval_s=60)) as gw:
        pd = gw.gateway.pools.get("tiny-a").disaggregated
        # Both halves seen ready first: a kill before the first probe would leave no ready prefill,
        # and the colocated fallback (not the decode) would answer.
        deadline = time.monotonic() + 30
        while not (pd.prefill.ready_count and pd.decode.ready_count) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert pd.prefill.ready_count and pd.decode.ready_count
        roles["prefill"].kill()  # the gateway's probe will not look again for a minute
        text, headers = streamed_text(gw.url)
        assert text == colocated_text(roles)
        assert headers[names.REPLICA_HEADER] == pd.decode.replicas[0].id
        assert (pd.handed_over, pd.prefill_failed) == (0, 1)


def test_with_no_ready_prefill_or_decode_replica_the_colocated_replica_serves(
    roles: dict[str, RuntimeProcess], tmp_path: Path
) -> None:
    roles["prefill"].kill()
    with running_gateway(config(roles, tmp_path / "m.jsonl")) as gw:
        pool = gw.gateway.pools.get("tiny-a")
        text, headers = streamed_text(gw.url)
        assert text == colocated_text(roles)
        assert headers[names.REPLICA_HEADER] == pool.replicas[0].id
        assert pool.disaggregated.handed_over == 0
