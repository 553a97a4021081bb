"""What a tenant (or anyone without a key) can learn from the gateway: its own answers, nothing of
other tenants, no replica address, no say in the id that keys the metering record. The figures
are on the admin port only."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from frontier_gateway.config import ConfigError, PoolConfig, parse_config
from frontier_gateway.pools import Pools
from frontier_hostside import names
from frontier_settings import to_yaml

from tests.gateway.harness import StandIn, gateway_config, running_gateway, tenant

ACME, NIGHTLY = "sk-acme-0123456789", "sk-nightly-0123456789"
UUID_HEX = re.compile(r"^[0-9a-f]{32}$")

# Every path a caller might try for figures, the admin ones included.
PROBED_PATHS = (
    names.METRICS_PATH,
    names.METRICS_PATH + "/",
    "/v1" + names.METRICS_PATH,
    "/admin" + names.METRICS_PATH,
    names.READINESS_PATH,
    names.LIVENESS_PATH,
    names.MODELS_PATH,
    "/",
    "/v1/usage",
)


def _auth(key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"} if key else {}


def _config(standins: dict[str, StandIn], metering: Path):
    return gateway_config(
        {"model-a": [standins["a1"].url], "model-b": [standins["b1"].url]},
        [tenant("acme", ACME, ["model-a", "model-b"]), tenant("nightly", NIGHTLY, ["model-b"])],
        metering,
    )


def _complete(url: str, key: str, model: str, headers: dict[str, str] | None = None) -> httpx.Response:
    return httpx.post(
        f"{url}/v1/completions",
        json={"model": model, "prompt": "hello", "max_tokens": 4},
        headers={**_auth(key), **(headers or {})},
        timeout=10,
    )


@pytest.mark.parametrize("key", [NIGHTLY, None], ids=["other-tenants-key", "no-key"])
def test_no_path_on_the_public_port_shows_another_tenants_figures(standins, tmp_path, key) -> None:
    with running_gateway(_config(standins, tmp_path / "m.jsonl")) as gw:
        for _ in range(3):
            assert _complete(gw.url, ACME, "model-a").status_code == 200
        for path in PROBED_PATHS:
            for method in ("GET", "POST"):
                answer = httpx.request(method, gw.url + path, headers=_auth(key), timeout=10)
                text = answer.text + json.dumps(dict(answer.headers))
                assert "acme" not in text, (method, path, answer.status_code, text)
                assert "frontier_gateway_" not in text, (method, path)
                assert "model-a" not in text, (method, path)  # a model this caller may not use


def test_the_admin_port_serves_every_tenants_figures(standins, tmp_path) -> None:
    with running_gateway(_config(standins, tmp_path / "m.jsonl")) as gw:
        assert _complete(gw.url, ACME, "model-a").status_code == 200
        metrics = httpx.get(gw.admin_url + names.METRICS_PATH, timeout=10).text
        detail = httpx.get(gw.admin_url + names.READINESS_PATH, timeout=10).json()
        api = _complete(gw.admin_url, ACME, "model-a")
    assert 'frontier_gateway_requests_total{model="model-a",status="200",tenant="acme"} 1.0' in metrics
    assert detail["models"]["model-a"] == {"ready": 1, "replicas": 1}
    assert api.status_code == 404  # the API is not served where the figures are


def test_the_replica_header_names_an_opaque_id_not_an_address(standins, tmp_path) -> None:
    with running_gateway(_config(standins, tmp_path / "m.jsonl")) as gw:
        answer = _complete(gw.url, ACME, "model-a")
        metrics = httpx.get(gw.admin_url + names.METRICS_PATH, timeout=10).text
    shown = answer.headers[names.REPLICA_HEADER]
    assert re.fullmatch(r"[0-9a-f]{12}", shown)
    port = str(standins["a1"].server_address[1])
    for value in answer.headers.values():
        assert "127.0.0.1" not in value and port not in value
    # Operators map the id back to the address on the admin port.
    assert f'replica="{standins["a1"].url}",replica_id="{shown}"' in metrics


def test_the_gateway_chooses_the_request_id_that_keys_metering(standins, tmp_path) -> None:
    metering = tmp_path / "m.jsonl"
    with running_gateway(_config(standins, metering)) as gw:
        # A client tries to make two requests share one metering key (or take another's).
        answers = [
            _complete(gw.url, ACME, "model-a", {names.REQUEST_ID_HEADER: "chosen-by-client"})
            for _ in range(2)
        ]
    ids = [a.headers[names.REQUEST_ID_HEADER] for a in answers]
    assert all(UUID_HEX.match(i) for i in ids) and ids[0] != ids[1]
    assert [a.headers[names.CLIENT_REQUEST_ID_HEADER] for a in answers] == ["chosen-by-client"] * 2
    # The runtime hears the gateway's id, never the client's.
    assert [h[names.REQUEST_ID_HEADER] for _, _, h in standins["a1"].requests] == ids
    records = [json.loads(line) for line in metering.read_text().splitlines()]
    assert [(r["request_id"], r["client_request_id"]) for r in records] == [
        (ids[0], "chosen-by-client"),
        (ids[1], "chosen-by-client"),
    ]


@pytest.mark.parametrize("supplied", ["x" * 129, "two words", "<script>alert(1)</script>"])
def test_a_long_or_odd_client_request_id_is_dropped(standins, tmp_path, supplied: str) -> None:
    metering = tmp_path / "m.jsonl"
    with running_gateway(_config(standins, metering)) as gw:
        answer = _complete(gw.url, ACME, "model-a", {names.CLIENT_REQUEST_ID_HEADER: supplied})
    assert answer.status_code == 200
    assert names.CLIENT_REQUEST_ID_HEADER not in answer.headers
    assert UUID_HEX.match(answer.headers[names.REQUEST_ID_HEADER])
    [record] = [json.loads(line) for line in metering.read_text().splitlines()]
    assert record["client_request_id"] is None


BASE = """
host: 127.0.0.1
models: [{name: m, replicas: ["http://10.0.0.1:8000"]}]
tenants: [{name: t, key_sha256: ["%s"], models: [m], requests_per_minute: 1, tokens_per_minute: 1,
           max_concurrent_requests: 1, priority: interactive}]
metering: {uri: m.jsonl}
""" % ("0" * 64)


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        (
            "port: 8090\nadmin_port: 8090",
            "admin_port = 8090: Value error, must differ from port (8090)",
        ),
        ("admin_port: 70000", "admin_port = 70000: Input should be less than or equal to 65535"),
        ("quota: {store: redis}", "quota.redis_url = '': Value error, store 'redis' needs a redis_url"),
        (
            "quota: {store: memory, redis_url: 'redis://r:6379'}",
            "quota.redis_url = 'redis://r:6379': Value error, is set but store is 'memory'",
        ),
        (
            "quota: {store: redis, redis_url: 'redis://user:secret@r:6379'}",
            "quota.redis_url = 'redis://user:secret@r:6379': Value error, must look like redis://host:6379/0",
        ),
        ("breaker: {error_rate: 0}", "breaker.error_rate = 0: Input should be greater than 0"),
        (
            "breaker: {min_requests: 0}",
            "breaker.min_requests = 0: Input should be greater than or equal to 1",
        ),
        ("breaker: {cool_off_s: 0}", "breaker.cool_off_s = 0: Input should be greater than 0"),
    ],
)
def test_a_bad_admin_quota_or_breaker_setting_is_refused_by_name(extra: str, named: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(BASE + extra)
    assert named in str(info.value)


def test_gateways_sharing_the_runtimes_key_show_one_id_per_replica() -> None:
    pools = [PoolConfig(name="m", replicas=("http://10.0.1.7:8000", "http://10.0.1.8:8000"))]
    ids = [[r.id for r in Pools(pools, id_key=key).get("m").replicas] for key in (b"k1", b"k1", b"k2")]
    assert ids[0] == ids[1] and len(set(ids[0])) == 2
    assert set(ids[0]).isdisjoint(ids[2])  # another key, other ids: the address cannot be hashed back


def test_the_gateway_process_serves_metrics_only_on_its_admin_socket(standins, tmp_path) -> None:
    config = tmp_path / "gateway.yaml"
    config.write_text(to_yaml(_config(standins, tmp_path / "m.jsonl")))
    command = [sys.executable, "-m", "frontier_gateway", "serve", "--config", str(config)]
    process = subprocess.Popen(
        [*command, "--port", "0", "--admin-port", "0"], stdout=subprocess.PIPE, text=True
    )
    try:
        listening = [process.stdout.readline() for _ in range(2)]
        public, admin = (line.rsplit(" on ", 1)[1].strip() for line in listening)
        assert "admin" in listening[1] and admin.startswith("127.0.0.1:")
        _until_listening(f"http://{admin}{names.LIVENESS_PATH}")
        assert httpx.get(f"http://{admin}{names.METRICS_PATH}", timeout=10).status_code == 200
        assert httpx.get(f"http://{public}{names.METRICS_PATH}", timeout=10).status_code == 404
    finally:
        process.terminate()
        process.wait(timeout=30)


def _until_listening(url: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            httpx.get(url, timeout=1)
            return
        except httpx.TransportError:
            assert time.monotonic() < deadline, f"nothing listens on {url}"
            time.sleep(0.05)
