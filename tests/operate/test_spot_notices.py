"""Spot notices: the IMDS stand-in on loopback, and the host agent taking its host out of service.

Real sockets and real processes throughout: the stand-in serves IMDSv2 over HTTP, and the host
agent's ``interruptions`` command polls it while the agent's supervisor runs the runtime stand-in
(``runtime_standin.py``, which fails readiness the instant SIGTERM starts its drain).
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from datetime import UTC, datetime
from pathlib import Path

import pytest
from frontier_hostside import agent
from frontier_hostside.interruption import (
    REBALANCE,
    SPOT,
    Imds,
    ImdsError,
    InterruptionWatcher,
    read_record,
)

from frontier.render.host import render_agent_config
from frontier.targets import load_stack
from frontier.targets.local import services
from frontier.targets.local.imds import ImdsServer, Instance
from tests.gateway.harness import gateway_config, running_gateway, tenant
from tests.operate.test_host_agent import release, staged, write_config

OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@pytest.fixture
def config(tmp_path: Path) -> agent.AgentConfig:
    """The local stack's rendered agent configuration for a scratch root, on a free port."""
    settings = load_stack("local")
    text = render_agent_config(
        settings, settings.only_pool, host="host-t", root=str(tmp_path / "root"), python=sys.executable,
        address="127.0.0.1",
    )  # fmt: skip
    (tmp_path / "root").mkdir()
    return dataclasses.replace(agent.AgentConfig.from_dict(json.loads(text)), port=services.free_port())


@pytest.fixture
def host(tmp_path: Path, config: agent.AgentConfig):
    """An agent on the scratch root; whatever runtime a test leaves running is stopped after it."""
    a = agent.Agent(config, str(write_config(config, tmp_path / "agent.json")))
    yield a
    a.stop()


@pytest.fixture
def imds():
    server = ImdsServer("127.0.0.1", 0, Instance(instance_id="i-0feedfacecafe0001")).start()
    yield server
    server.stop()


def call(url: str, method: str = "GET", headers: dict[str, str] | None = None, body: dict | None = None):
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    try:
        with OPENER.open(request, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def token(imds: ImdsServer) -> str:
    status, body = call(f"{imds.url}/latest/api/token", "PUT", {"X-aws-ec2-metadata-token-ttl-seconds": "60"})
    assert status == 200
    return body


# --- the stand-in ---------------------------------------------------------------------------------


def test_the_stand_in_answers_metadata_only_with_an_imdsv2_token(imds):
    url = f"{imds.url}/latest/meta-data/instance-id"
    assert call(url)[0] == 401
    assert call(url, headers={"X-aws-ec2-metadata-token": "forged"})[0] == 401
    assert call(f"{imds.url}/latest/api/token", "PUT")[0] == 400
    too_long = {"X-aws-ec2-metadata-token-ttl-seconds": "21601"}
    assert call(f"{imds.url}/latest/api/token", "PUT", too_long)[0] == 400
    headers = {"X-aws-ec2-metadata-token": token(imds)}
    assert call(url, headers=headers) == (200, "i-0feedfacecafe0001")
    assert call(f"{imds.url}/latest/meta-data/placement/availability-zone", headers=headers) == (
        200,
        "us-east-1a",
    )
    assert call(f"{imds.url}/latest/meta-data/placement/region", headers=headers) == (200, "us-east-1")


def test_spot_and_rebalance_answer_404_until_a_notice_is_posted(imds):
    headers = {"X-aws-ec2-metadata-token": token(imds)}
    spot = f"{imds.url}/latest/meta-data/spot/instance-action"
    rebalance = f"{imds.url}/latest/meta-data/events/recommendations/rebalance"
    assert call(spot, headers=headers)[0] == 404 and call(rebalance, headers=headers)[0] == 404

    status, _ = call(f"{imds.url}/control/spot", "POST", body={"action": "terminate", "in_s": 120})
    assert status == 200
    status, body = call(spot, headers=headers)
    notice = json.loads(body)
    when = datetime.strptime(notice["time"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    assert status == 200 and notice["action"] == "terminate"
    assert 118 <= (when - datetime.now(UTC)).total_seconds() <= 121

    call(f"{imds.url}/control/rebalance", "POST", body={})
    assert "noticeTime" in json.loads(call(rebalance, headers=headers)[1])
    call(f"{imds.url}/control/clear", "POST", body={})
    assert call(spot, headers=headers)[0] == 404


def test_a_notice_with_an_unknown_action_or_time_is_refused_naming_it(imds):
    status, body = call(f"{imds.url}/control/spot", "POST", body={"action": "explode"})
    assert status == 400 and "action is 'explode'" in body and "terminate, stop, hibernate" in body
    status, body = call(f"{imds.url}/control/spot", "POST", body={"in_s": -1})
    assert status == 400 and "in_s is -1" in body and "between 0 and 3600" in body
    assert json.loads(call(f"{imds.url}/control/state")[1]) == {"spot": None, "rebalance": None}


def test_the_client_renews_a_token_the_service_no_longer_knows(imds):
    client = Imds(imds.url)
    assert client.get("/latest/meta-data/instance-id") == "i-0feedfacecafe0001"
    imds.instance.tokens.clear()  # the service forgot it (a restart): 401, one fresh token
    assert client.get("/latest/meta-data/instance-id") == "i-0feedfacecafe0001"
    assert client.notices() == []


def test_an_unreachable_imds_is_an_error_never_a_notice(tmp_path, host):
    closed = ImdsServer("127.0.0.1", 0)
    url = closed.url
    closed.server_close()
    with pytest.raises(ImdsError, match="api/token"):
        Imds(url, timeout_s=0.5).notices()
    watcher = InterruptionWatcher(host, Imds(url, timeout_s=0.5), interval_s=0.05)
    assert watcher.run(rounds=2) == {"polls": 2, "errors": 2, "notices": [], "out_of_service": False}
    assert read_record(host.run_dir) == []


def test_a_poll_interval_out_of_range_is_refused_naming_it(tmp_path, host, config):
    with pytest.raises(ValueError, match="interval_s is 0; it must be between 0.05 and 60"):
        InterruptionWatcher(host, Imds("http://127.0.0.1:9"), interval_s=0)
    done = subprocess.run(
        [sys.executable, agent.__file__, "--config", str(write_config(config, tmp_path / "a.json")),
         "interruptions", "--imds", "http://127.0.0.1:9", "--interval", "600", "--rounds", "1"],
        capture_output=True, text=True,
    )  # fmt: skip
    answer = json.loads(done.stdout)
    assert done.returncode == 2 and "interval_s is 600" in answer["error"]


# --- the host agent on a notice -------------------------------------------------------------------


def serving(a: agent.Agent, config: agent.AgentConfig) -> None:
    r = staged(a, release(config, 1))
    a.activate(r.id)
    a.start()
    assert a.wait_ready(30)["ready"] is True


def test_a_spot_notice_takes_the_host_out_of_service_within_one_poll(tmp_path, host, config, imds):
    serving(host, config)
    interval = 0.5
    watcher = subprocess.Popen(
        [sys.executable, agent.__file__, "--config", str(write_config(config, tmp_path / "a.json")),
         "interruptions", "--imds", imds.url, "--interval", str(interval)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        time.sleep(2 * interval)
        assert host.http_status(config.readiness_path) == 200  # no notice: it keeps serving
        posted = time.monotonic()
        call(f"{imds.url}/control/spot", "POST", body={"action": "terminate", "in_s": 120})
        while host.http_status(config.readiness_path, timeout=0.5) == 200:
            assert time.monotonic() - posted < 5, "the host still answers ready 5 s after the notice"
            time.sleep(0.02)
        out_after = time.monotonic() - posted
        assert out_after < interval + 1.0
        deadline = time.monotonic() + 30
        while not any("stop" in r for r in read_record(host.run_dir)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not host.facts().running and host.supervisor_pid() is None  # drained, nothing restarts it
        record = read_record(host.run_dir)
        assert [(r["notice"]["kind"], r["notice"]["action"], r["out_of_service"]) for r in record] == [
            (SPOT, "terminate", True)
        ]
        assert record[0]["stop"]["outcome"] == "terminated"
        events = [
            json.loads(line)["event"]
            for line in (host.root / "logs" / "agent.jsonl").read_text().splitlines()
        ]
        assert "interruption_notice" in events and "interruption_drained" in events
    finally:
        watcher.terminate()
        _, stderr = watcher.communicate(timeout=10)
    assert '"event": "interruption_notice"' in stderr


def test_a_rebalance_recommendation_is_recorded_and_the_host_keeps_serving(tmp_path, host, config, imds):
    serving(host, config)
    call(f"{imds.url}/control/rebalance", "POST", body={})
    watcher = InterruptionWatcher(host, Imds(imds.url), interval_s=0.05)
    answer = watcher.run(rounds=3)
    assert answer["out_of_service"] is False and [n["kind"] for n in answer["notices"]] == [REBALANCE]
    assert host.http_status(config.readiness_path) == 200 and host.facts().running
    assert [r["notice"]["kind"] for r in read_record(host.run_dir)] == [REBALANCE]


def test_a_rebalance_recommendation_drains_where_the_setting_asks(tmp_path, host, config, imds):
    serving(host, config)
    call(f"{imds.url}/control/rebalance", "POST", body={})
    answer = InterruptionWatcher(host, Imds(imds.url), interval_s=0.05, drain_on_rebalance=True).run(rounds=1)
    assert answer["out_of_service"] is True and not host.facts().running


def test_each_notice_is_handled_once_however_often_imds_repeats_it(tmp_path, host, config, imds):
    serving(host, config)
    call(f"{imds.url}/control/spot", "POST", body={"action": "stop", "in_s": 60})
    watcher = InterruptionWatcher(host, Imds(imds.url), interval_s=0.05)
    answer = watcher.run(rounds=4)
    assert [(n["kind"], n["action"]) for n in answer["notices"]] == [(SPOT, "stop")]
    lines = (host.root / "logs" / "agent.jsonl").read_text().splitlines()
    assert sum(json.loads(line)["event"] == "interruption_notice" for line in lines) == 1


def test_the_agent_files_that_travel_include_the_interruption_watcher():
    import frontier_hostside

    assert "frontier_hostside/interruption.py" in frontier_hostside.agent_files()
    assert Path(frontier_hostside.__file__).with_name("interruption.py").is_file()


def test_on_a_spot_notice_the_gateway_is_told_before_the_drain_and_takes_the_replica_out(
    tmp_path, host, config, imds
):
    serving(host, config)
    replica = f"http://{config.address}:{config.port}"
    gateway = gateway_config({"tiny": [replica]}, [tenant("acme", "sk-acme", ["tiny"])], tmp_path / "m.jsonl")
    with running_gateway(gateway) as gw:
        call(f"{imds.url}/control/spot", "POST", body={"action": "terminate", "in_s": 120})
        watcher = InterruptionWatcher(host, Imds(imds.url), interval_s=0.05, gateway_admin=(gw.admin_url,))
        answer = watcher.run(rounds=1)
        assert answer["out_of_service"] is True
        (told,) = read_record(host.run_dir)[0]["gateways"]
        assert (told["gateway"], told["status"], told["replica"]) == (gw.admin_url, 200, replica)
        assert gw.gateway.pools.get("tiny").ready_count == 0


def test_an_unreachable_gateway_is_logged_and_the_drain_goes_on(tmp_path, host, config, imds):
    serving(host, config)
    call(f"{imds.url}/control/spot", "POST", body={"action": "terminate", "in_s": 120})
    closed = ImdsServer("127.0.0.1", 0)
    nowhere = closed.url
    closed.server_close()
    answer = InterruptionWatcher(host, Imds(imds.url), interval_s=0.05, gateway_admin=(nowhere,)).run(
        rounds=1
    )
    assert answer["out_of_service"] is True and not host.facts().running
    (told,) = read_record(host.run_dir)[0]["gateways"]
    assert told["status"] == 0 and told["error"]
