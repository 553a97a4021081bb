"""The rollout end to end on a real cluster: three sshd hosts on loopback aliases, HAProxy driven
through its admin socket, moto's server for S3 and Secrets Manager, and the runtime started for real
from the staged wheel.

The scenarios share one cluster and run in order, as an operator's day would: deploy release A,
a release that fails readiness on the canary, a canary that fails its gate, a host that becomes
unreachable mid-rollout, release B, a rollback to A, and the history that recorded it all.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import httpx
import pytest
from harness import API_KEY, Cluster, push_model, register_wheel, start_cluster

from frontier.errors import FrontierError
from frontier.hosts.inventory import HostSpec
from frontier.release.artifact import Artifact
from frontier.release.history import LockHeld
from frontier.render.release import build_release
from frontier.rollout.deploy import deploy, deploy_plan
from frontier.rollout.rolling import Event, RolloutFailed

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
RELEASE_B = {"runtime.batch.max_batch_size": 8}
NEVER_READY = {"model.version": "no-such-version"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path):
    c = start_cluster(tmp_path_factory.mktemp("operate"), 3)
    try:
        push_model(c, tiny_model)
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="module")
def wheel(cluster: Cluster) -> Artifact:
    return register_wheel(cluster, cache=cluster.base / "artifacts")


@pytest.fixture(scope="module")
def release_a(cluster: Cluster, wheel: Artifact):
    return build_release(cluster.settings, cluster.settings.only_pool, wheel)


# --- helpers: what a host runs, observed from the outside -------------------------------------------


def current_release(host: HostSpec) -> str:
    return os.path.basename(os.readlink(Path(host.root) / "current"))


def runtime_pid(host: HostSpec) -> int:
    return int((Path(host.root) / "run" / "runtime.pid").read_text())


def runtime_pythonpath(host: HostSpec) -> str:
    environ = Path(f"/proc/{runtime_pid(host)}/environ").read_bytes().split(b"\0")
    return next(e.decode() for e in environ if e.startswith(b"PYTHONPATH="))


def is_ready(cluster: Cluster, host: HostSpec) -> bool:
    url = f"http://{host.address}:{cluster.settings.runtime.port}{cluster.settings.health.readiness_path}"
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def haproxy_status(cluster: Cluster, host: HostSpec) -> str:
    return cluster.backend().balancer().state(host)


def assert_runs(cluster: Cluster, host: HostSpec, release) -> None:
    root = Path(host.root)
    assert current_release(host) == release.id
    assert json.loads((root / "current" / "release.json").read_text())["digest"] == release.digest
    for name, text in release.files.items():
        assert (root / "current" / name).read_bytes() == text.encode(), name
    assert runtime_pythonpath(host) == f"PYTHONPATH={root / 'releases' / release.id / 'site'}"
    assert is_ready(cluster, host)
    assert haproxy_status(cluster, host) == "UP"


def fab_command(task: str) -> list[str]:
    return [sys.executable, "-m", "fabric", task, "-s", "local"]


def fab_env(cluster: Cluster) -> dict[str, str]:
    """`fab` as an operator runs it, against this cluster's copy of the local stack."""
    return {**os.environ, "FRONTIER_STACKS_DIR": str(cluster.stack_file.parent)}


# --- the scenarios, in order ---------------------------------------------------------------------


def test_full_deploy_puts_every_host_on_the_release_and_serves_through_haproxy(cluster, wheel, release_a):
    refused: list[Exception] = []

    def report(event: Event) -> None:
        # While host-2 is being staged, a second deploy of the stack must be refused.
        if event.host == "host-2" and event.phase == "stage" and event.status == "start":
            try:
                deploy(cluster.backend(), wheel.digest)
            except LockHeld as exc:
                refused.append(exc)

    result = deploy(cluster.backend(), wheel.digest, reporter=report)

    assert result.outcome == "succeeded"
    assert [h.outcome for h in result.hosts] == ["updated", "updated", "updated"]
    for host in cluster.hosts:
        assert_runs(cluster, host, release_a)
    assert len(refused) == 1 and "locked by another deploy" in str(refused[0]) and "since" in str(refused[0])
    reply = httpx.post(
        f"http://127.0.0.1:{cluster.settings.local.balancer_port}/v1/completions",
        headers={"Authorization": f"Bearer {API_KEY}"},
        json={"model": cluster.settings.model.name, "prompt": "the model", "max_tokens": 4},
        timeout=30,
    )
    assert reply.status_code == 200, reply.text
    assert cluster.store().read_lock() is None


def test_a_release_that_fails_readiness_on_the_canary_is_rolled_back_and_other_hosts_never_change(
    cluster, wheel, release_a
):
    canary, *others = cluster.hosts
    before = {h.name: (runtime_pid(h), current_release(h)) for h in others}
    settings = cluster.variant("never-ready", NEVER_READY)

    with pytest.raises(RolloutFailed) as failed:
        deploy(cluster.backend(settings), wheel.digest)

    result = failed.value.result
    assert result.outcome == "rolled_back"
    assert "host-1" in result.reason and "readiness" in result.reason
    assert [h.outcome for h in result.hosts] == ["restored", "untouched", "untouched"]
    assert_runs(cluster, canary, release_a)
    for host in others:
        assert (runtime_pid(host), current_release(host)) == before[host.name]
        assert_runs(cluster, host, release_a)


def test_a_canary_that_fails_its_gate_is_rolled_back(cluster, wheel, release_a):
    # A new release (another batching window) whose stack demands traffic in the gate window; none comes.
    settings = cluster.variant("strict-gate", {"runtime.batch.window_ms": 3, "rollout.gate.min_requests": 1})
    others = {h.name: runtime_pid(h) for h in cluster.hosts[1:]}

    with pytest.raises(RolloutFailed) as failed:
        deploy(cluster.backend(settings), wheel.digest)

    result = failed.value.result
    assert result.outcome == "rolled_back"
    assert "host-1: gate failed" in result.reason and "rollout.gate.min_requests is 1" in result.reason
    assert [h.outcome for h in result.hosts] == ["restored", "untouched", "untouched"]
    for host in cluster.hosts:
        assert_runs(cluster, host, release_a)
    assert {h.name: runtime_pid(h) for h in cluster.hosts[1:]} == others


def test_a_host_unreachable_mid_rollout_stops_it_and_every_host_stays_on_a_working_release(
    cluster, wheel, release_a
):
    first, second, third = cluster.hosts
    pids = {h.name: runtime_pid(h) for h in (second, third)}

    def report(event: Event) -> None:
        # The canary passed; the next batch begins and host-2's SSH goes away.
        if event.host == "host-2" and event.phase == "check" and event.status == "start":
            cluster.kill_sshd("host-2")

    try:
        with pytest.raises(RolloutFailed) as failed:
            deploy(cluster.backend(cluster.variant("b", RELEASE_B)), wheel.digest, reporter=report)
    finally:
        if "host-2" not in cluster.sshd:
            cluster.start_sshd(second)

    result = failed.value.result
    assert result.outcome == "rolled_back"
    assert "host-2" in result.reason
    assert [h.outcome for h in result.hosts] == ["restored", "untouched", "untouched"]
    assert result.hosts[0].phases["gate"] > 0  # the canary had been updated and gated before the failure
    for host in (first, second, third):
        assert_runs(cluster, host, release_a)
    assert {h.name: runtime_pid(h) for h in (second, third)} == pids


def test_deploy_then_rollback_restores_the_previous_digest_and_config_byte_for_byte(
    cluster, wheel, release_a
):
    settings_b = cluster.variant("b", RELEASE_B)
    release_b = build_release(settings_b, settings_b.only_pool, wheel)
    assert release_b.id != release_a.id

    deploy(cluster.backend(settings_b), wheel.digest)
    for host in cluster.hosts:
        assert_runs(cluster, host, release_b)

    done = subprocess.run(
        fab_command("rollback"), cwd=REPO, env=fab_env(cluster), capture_output=True, text=True
    )

    assert done.returncode == 0, done.stdout + done.stderr
    assert f"rollback {release_a.id}: succeeded" in done.stdout
    for phase in ("drain", "stop", "start", "readiness", "enable", "gate"):
        assert sum(1 for line in done.stdout.splitlines() if f" {phase} " in line and " ok " in line) >= 3, (
            phase
        )
    for host in cluster.hosts:
        assert_runs(cluster, host, release_a)
        assert (Path(host.root) / "current" / "release.json").read_text() == release_a.manifest()
        assert os.path.basename(os.readlink(Path(host.root) / "previous")) == release_b.id


def test_history_records_every_deploy_and_rollback(cluster, wheel, release_a):
    records = cluster.store().records()

    assert [(r["kind"], r["outcome"]) for r in records] == [
        ("deploy", "succeeded"),
        ("deploy", "rolled_back"),
        ("deploy", "rolled_back"),
        ("deploy", "rolled_back"),
        ("deploy", "succeeded"),
        ("rollback", "succeeded"),
    ]
    for record in records:
        assert record["digest"] == wheel.digest
        assert record["who"] and record["started_at"] < record["finished_at"]
        assert record["config_hash"].startswith("sha256:")
        assert [h["name"] for h in record["hosts"]] == ["host-1", "host-2", "host-3"]
    assert records[0]["release"] == records[-1]["release"] == release_a.id
    assert (
        "readiness" in records[1]["reason"]
        and "gate" in records[2]["reason"]
        and "host-2" in records[3]["reason"]
    )


def test_a_mutable_tag_is_refused_before_anything_is_touched(cluster):
    pids = [runtime_pid(h) for h in cluster.hosts]
    count = len(cluster.store().records())

    with pytest.raises(FrontierError, match="mutable tags"):
        deploy(cluster.backend(), "frontier-runtime:latest")

    assert [runtime_pid(h) for h in cluster.hosts] == pids
    assert len(cluster.store().records()) == count
    assert cluster.store().read_lock() is None


def test_a_deploy_while_the_stack_is_locked_is_refused_naming_the_holder(cluster, wheel):
    store = cluster.store()
    held = store.acquire("deploy r-000000000000", holder="alice@build-box")
    try:
        with pytest.raises(LockHeld, match=r"alice@build-box \(deploy r-000000000000\) since 20"):
            deploy(cluster.backend(), wheel.digest)
    finally:
        store.release_lock(held)


def test_status_and_history_tasks_print_what_each_host_runs(cluster, release_a):
    command = fab_command("status") + fab_command("history")[3:]
    done = subprocess.run(command, cwd=REPO, env=fab_env(cluster), capture_output=True, text=True)

    assert done.returncode == 0, done.stderr
    status, _, history = done.stdout.partition("history of stack local")
    rows = [line for line in status.splitlines() if "host-" in line]
    assert len(rows) == 3 and all(release_a.id in row and "yes" in row for row in rows)
    assert "deploy lock: free" in status
    assert history.count("rolled_back") == 3 and "rollback" in history


def test_a_deploy_plan_shows_each_host_and_changes_nothing(cluster, wheel, release_a):
    pids = [runtime_pid(h) for h in cluster.hosts]

    release_b, rows = deploy_plan(cluster.backend(cluster.variant("b", RELEASE_B)), wheel.digest)
    _, same = deploy_plan(cluster.backend(), wheel.digest)

    assert [(p.wave, p.host, p.current, p.target, p.action) for p in rows] == [
        ("canary", "host-1", release_a.id, release_b.id, "update"),
        ("batch 1", "host-2", release_a.id, release_b.id, "update"),
        ("batch 1", "host-3", release_a.id, release_b.id, "update"),
    ]
    assert {p.action for p in same} == {"skip (already runs it)"}
    assert [runtime_pid(h) for h in cluster.hosts] == pids
