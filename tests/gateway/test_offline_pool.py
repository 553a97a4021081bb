"""An offline pool: a model's batch work on replicas of its own (``PoolConfig.offline``), so it never
takes the replicas interactive requests wait for. Over real sockets against stand-ins for runtimes,
then against real runtime processes, the offline one answering to the model's name as an alias."""

from __future__ import annotations

import httpx
import pytest
import yaml
from frontier_gateway.config import ConfigError, GatewayConfig, load_config
from frontier_hostside import names

from tests.gateway.harness import StandIn, gateway_config, running_gateway, start_runtime, tenant, wait_ready

ACME, NIGHTLY = "sk-acme-0123456789", "sk-nightly-0123456789"


@pytest.fixture
def pools(standins, tmp_path):
    """model-a on a1 and a2 (interactive), its batch work on b1 (the pool ``model-a-batch``)."""

    def config(**extra):
        models = {"model-a": [standins["a1"].url, standins["a2"].url], "model-a-batch": [standins["b1"].url]}
        tenants = [
            tenant("acme", ACME, ["model-a"]),
            tenant("nightly", NIGHTLY, ["model-a"], priority="batch"),
        ]
        built = gateway_config(models, tenants, tmp_path / "m.jsonl", affinity={"mode": "off"}, **extra)
        data = built.model_dump()
        data["models"][0]["offline"] = "model-a-batch"
        return GatewayConfig.model_validate(data)

    return config


def _complete(url: str, key: str, **body) -> httpx.Response:
    payload = {"model": "model-a", "prompt": "hello", "max_tokens": 4, **body}
    return httpx.post(
        f"{url}/v1/completions", json=payload, headers={"Authorization": f"Bearer {key}"}, timeout=10
    )


def _served(standins: dict[str, StandIn]) -> dict[str, int]:
    return {name: len(server.requests) for name, server in standins.items()}


def test_batch_work_goes_to_the_offline_pool_and_interactive_work_never_does(standins, pools) -> None:
    with running_gateway(pools()) as gw:
        interactive = [_complete(gw.url, ACME, prompt=f"chat {i}") for i in range(4)]
        batch_tenant = [_complete(gw.url, NIGHTLY, prompt=f"job {i}") for i in range(3)]
        asked = _complete(gw.url, ACME, **{names.PRIORITY_FIELD: names.BATCH})
    assert [a.status_code for a in interactive + batch_tenant + [asked]] == [200] * 8
    assert {a.json()["served_by"] for a in interactive} <= {"a1", "a2"}
    assert {a.json()["served_by"] for a in batch_tenant + [asked]} == {"b1"}
    # The body reaches the offline pool as the client wrote it: its runtimes answer to the model's name.
    assert {body["model"] for _, body, _ in standins["b1"].requests} == {"model-a"}
    assert _served(standins) == {"a1": 2, "a2": 2, "b1": 4}


def test_batch_work_waits_for_the_offline_pool_rather_than_take_an_interactive_replica(
    standins, pools
) -> None:
    standins["b1"].ready = False
    with running_gateway(pools(hold={"model-a-batch": {"max_requests": 4, "timeout_s": 0.5}})) as gw:
        assert gw.gateway.pools.ready()  # an offline pool with nothing ready leaves the gateway ready
        refused = _complete(gw.url, NIGHTLY)
        assert _complete(gw.url, ACME).status_code == 200
    assert refused.status_code == 503 and "Retry-After" in refused.headers
    assert [len(s.requests) for s in (standins["a1"], standins["a2"])].count(1) == 1  # the interactive one


@pytest.mark.parametrize(
    ("offline", "says"),
    [
        ("model-z", "must be another pool of models"),
        ("model-a", "must be another pool of models"),
    ],
)
def test_an_offline_pool_that_is_not_another_pool_is_refused(standins, pools, offline, says) -> None:
    data = pools().model_dump()
    data["models"][0]["offline"] = offline
    with pytest.raises(ValueError, match=says):
        GatewayConfig.model_validate(data)


def test_an_offline_pool_that_passes_batch_work_on_is_refused(standins, pools) -> None:
    data = pools().model_dump()
    data["models"][1]["offline"] = "model-a"
    with pytest.raises(ValueError, match="does not pass it on"):
        GatewayConfig.model_validate(data)


def test_the_refusal_names_the_field_in_the_file(standins, pools, tmp_path) -> None:
    data = pools().model_dump(mode="json")
    data["models"][0]["offline"] = "model-z"
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match="gateway.yaml.*model-z"):
        load_config(path)


def test_a_real_offline_runtime_answers_batch_work_under_the_models_name(tiny_models, tmp_path) -> None:
    interactive = start_runtime("tiny-a", tiny_models["tiny-a"], tmp_path)
    offline = start_runtime(
        "tiny-a-batch",
        tiny_models["tiny-a"],
        tmp_path,
        {
            "model": {
                "name": "tiny-a-batch",
                "aliases": ["tiny-a"],
                "weights_uri": str(tiny_models["tiny-a"]),
                "max_seq_len": 512,
            }
        },
    )
    try:
        wait_ready([interactive, offline])
        models = {"tiny-a": [interactive.url], "tiny-a-batch": [offline.url]}
        tenants = [tenant("acme", ACME, ["tiny-a"]), tenant("nightly", NIGHTLY, ["tiny-a"], priority="batch")]
        data = gateway_config(models, tenants, tmp_path / "m.jsonl").model_dump()
        data["models"][0]["offline"] = "tiny-a-batch"
        with running_gateway(GatewayConfig.model_validate(data)) as gw:
            body = {"model": "tiny-a", "prompt": "hello", "max_tokens": 3, "temperature": 0}
            answers = {
                key: httpx.post(
                    f"{gw.url}/v1/completions",
                    json=body,
                    headers={"Authorization": f"Bearer {key}"},
                    timeout=60,
                )
                for key in (ACME, NIGHTLY)
            }
            ids = {name: pool.replicas[0].id for name, pool in gw.gateway.pools.by_model.items()}
        assert answers[ACME].headers[names.REPLICA_HEADER] == ids["tiny-a"]
        assert answers[NIGHTLY].headers[names.REPLICA_HEADER] == ids["tiny-a-batch"]
        for answer in answers.values():
            assert answer.status_code == 200, answer.text
            assert answer.json()["model"] == "tiny-a"  # the name asked, from either pool
        # Same weights, greedy: the same text whichever pool answered.
        assert answers[ACME].json()["choices"][0]["text"] == answers[NIGHTLY].json()["choices"][0]["text"]
    finally:
        interactive.kill()
        offline.kill()
