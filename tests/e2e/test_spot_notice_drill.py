"""A spot notice on the local stack: the slot leaves HAProxy's rotation within 5 s, the streams it
served move to the other slot through the gateway, and no client sees it.

The whole local stack as ``fab local.up`` brings it up: two host slots over real sshd, HAProxy with
readiness checks, moto, the real runtime serving the tiny model, the gateway in front of the slots,
and — per slot — the IMDSv2 stand-in and the host agent's ``interruptions`` watcher polling it (from
the slot's ``bin/``, as a spot host's unit does on EC2). Long greedy streams run through the gateway
and a steady load through HAProxy; ``fab spot.notice --host host-1`` posts the notice as an operator
would. The "instance" ends ``NOTICE_S`` after the notice (120 s on EC2, shortened here): the test then
SIGKILLs whatever of host-1's runtime is left, as EC2 would.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest
import yaml
from frontier_hostside import names
from frontier_hostside.interruption import read_record

from frontier.demo.migration import Stream, greedy, metric, replica_urls, stream
from frontier.loadtest.client import BackgroundLoad, Target
from frontier.targets import backend_for, load_stack
from frontier.targets.local import cluster as local
from frontier.targets.local import gateway as local_gateway
from tests.e2e.deployed import up_with_first_release
from tests.e2e.stackcopy import free_port, write_local_stack
from tests.fab_program import fab

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

RATE = 1.5  # requests/s through the balancer
NOTICE_S = 20  # notice to the instance's end (EC2: 120 s)
STREAMS = 16  # long greedy streams through the gateway: 8 a slot, all 16 fit on one (runtime.max_concurrency)
MAX_TOKENS = 960  # long enough to be mid-stream when the notice arrives (a poll later)


def _drill_stack(root: Path) -> Path:
    """The local stack on two slots with the gateway in front of them."""
    stacks = write_local_stack(root, hosts=2)
    path = stacks / "Pulumi.local.yaml"
    document = yaml.safe_load(path.read_text())
    config = document["config"]
    config["frontier:gateway"] = {
        "port": free_port(),
        "admin_port": free_port(),
        "metering": {"uri": str(root / "metering.jsonl"), "flush_s": 1},
        "probe": {"interval_s": 0.3, "timeout_s": 1},
        # The streams spread over both slots (least outstanding first), whatever their prompts hash to.
        "affinity": {"mode": "off"},
    }
    config["frontier:tenants"] = [
        {
            "name": "acme",
            "api_key_secret": "frontier/local/tenants/acme",
            "models": [config["frontier:model"]["name"]],
            "requests_per_minute": 600,
            "tokens_per_minute": 400_000,
            "max_concurrent_requests": 32,
            "priority": "interactive",
        }
    ]
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return stacks


def _streams(url: str, key: str, bodies: list[dict]) -> tuple[list[Stream], list[threading.Thread]]:
    results = [Stream() for _ in bodies]
    threads = [
        threading.Thread(target=stream, args=(url, key, b, s), kwargs={"timeout_s": 120})
        for b, s in zip(bodies, results, strict=True)
    ]
    for thread in threads:
        thread.start()
    return results, threads


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """The drill's stack up, release A deployed on both slots, the gateway started."""
    tmp_path = tmp_path_factory.mktemp("spot")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FRONTIER_STACKS_DIR", str(_drill_stack(tmp_path)))
        mp.delenv(local.CONNECTION_ENV, raising=False)
        yield from _up(tmp_path)


def _up(tmp_path: Path):
    settings = load_stack("local")
    try:
        up_with_first_release(settings, tmp_path)
        local_gateway.start(settings)
        yield settings
    finally:
        local_gateway.stop(settings)
        local.down(settings)


def test_local_up_runs_an_imds_stand_in_and_a_watcher_polling_it_for_every_slot(stack):
    for host in stack.inventory.hosts:
        imds = local.services.find(local.state_dir(stack), local.imds_service(host))
        watcher = local.services.find(local.state_dir(stack), local.watcher_service(host))
        assert imds is not None and imds.address == host.address
        assert watcher is not None and watcher.command[watcher.command.index("--imds") + 1] == imds.endpoint
        token = httpx.put(
            imds.endpoint + "/latest/api/token", headers={"X-aws-ec2-metadata-token-ttl-seconds": "60"}
        ).text
        instance = httpx.get(
            imds.endpoint + "/latest/meta-data/instance-id", headers={"X-aws-ec2-metadata-token": token}
        )
        assert instance.text == local.instance_id(stack, host)


def test_a_spot_notice_takes_the_slot_out_of_rotation_within_5_s_and_its_streams_migrate_with_none_failed(
    stack, capsys
):
    settings = stack
    backend = backend_for(settings)
    host = backend.hosts()[0]
    balancer = backend.balancer()
    assert all(balancer.state(h) == "UP" for h in backend.hosts())
    assert settings.gateway is not None
    url = local_gateway.gateway_url(settings)
    admin = f"http://{settings.gateway.admin_host}:{settings.gateway.admin_port}"
    key = local_gateway.tenant_key(settings, "acme")
    bodies = [
        greedy(settings.model.name, f"stream {i} of the spot drill: a long story", MAX_TOKENS)
        for i in range(STREAMS)
    ]
    reference, threads = _streams(url, key, bodies)
    for thread in threads:
        thread.join(180)
    assert all(r.done and not r.errors for r in reference), [r.errors for r in reference]

    target = Target(
        base_url=local.balancer_url(settings),
        model=settings.model.name,
        api_key=local.api_key(settings, settings.only_pool),
        prompt_tokens=16,
        max_tokens=16,
        timeout_s=60,
    )
    load = BackgroundLoad(target, RATE, seed=41).start()
    left_rotation: list[float] = []

    def watch_rotation() -> None:
        while balancer.state(host) == "UP":
            time.sleep(0.05)
        left_rotation.append(time.monotonic())

    try:
        results, threads = _streams(url, key, bodies)
        # Mid-stream: every stream has tokens, none has finished.
        deadline = time.monotonic() + 60
        while not all(len(s.arrivals) >= 8 for s in results):
            assert time.monotonic() < deadline, "the streams sent no tokens within 60 s"
            time.sleep(0.01)
        watcher = threading.Thread(target=watch_rotation, daemon=True)
        watcher.start()
        noticed = time.monotonic()
        code, out, err = fab(
            capsys, "spot.notice", "--stack", "local", "--host", host.name, "--in-s", str(NOTICE_S)
        )
        assert code == 0, out + err
        watcher.join(NOTICE_S)
        for thread in threads:
            thread.join(180)
        # The instance ends: what is left of host-1's runtime is killed, as EC2 would.
        time.sleep(max(0.0, NOTICE_S - (time.monotonic() - noticed)))
        pid_file = Path(host.root) / "run" / "runtime.pid"
        left = int(pid_file.read_text().split()[0]) if pid_file.exists() else None
        alive = left is not None and Path(f"/proc/{left}").exists()
        if alive:
            os.kill(left, signal.SIGKILL)
        time.sleep(2)  # requests sent after the end go to host-2 alone
        samples = load.stop()
        migrations = metric(admin, names.GATEWAY_MIGRATIONS_METRIC + "_total")
        urls = replica_urls(admin)
    finally:
        load.stop()

    record = read_record(Path(host.root) / "run")
    failed = [s.error for s in samples if not s.ok]
    broken = [i for i, s in enumerate(results) if s.errors or not s.done]
    out_s = left_rotation[0] - noticed if left_rotation else float("inf")
    moved = record[0].get("gateways", [{}])[0].get("moved", 0) if record else 0
    on_host = [s for s in results if urls.get(s.replica) == f"http://{host.address}:{settings.runtime.port}"]
    # The streams host-1 still served after the notice (one may finish in the poll before it acts).
    stalls = []
    for s in on_host:
        gaps = [b - a for a, b in zip(s.arrivals, s.arrivals[1:], strict=False) if b > noticed]
        if gaps:
            stalls.append(max(gaps))
    with capsys.disabled():
        print(
            f"\n  e2e: spot notice on {host.name} (fab spot.notice): out of HAProxy's rotation {out_s:.2f}s after "
            f"it, drained {record[0].get('drained_after_s') if record else '?'}s after its agent saw it; "
            f"{moved} of {STREAMS} streams moved by the gateway ({migrations:.0f} migrations), stall per "
            f"moved stream (ms): {', '.join(f'{x * 1000:.0f}' for x in sorted(stalls))}; "
            f"{len(samples)} requests through HAProxy, {len(failed)} failed"
        )
    assert [(r["notice"]["kind"], r["out_of_service"]) for r in record] == [("spot", True)]
    assert out_s < 5.0
    assert not alive, "the runtime still ran when the instance ended: the drain did not finish in time"
    assert broken == [], [results[i].errors for i in broken]
    assert [s.text for s in results] == [r.text for r in reference]
    assert 1 <= moved <= len(on_host) and migrations == moved, (record, migrations, len(on_host))
    assert samples and failed == []
