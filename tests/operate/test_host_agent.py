"""The host agent on a scratch root: called as functions and run as the command hosts run.

The runtime is a real process: ``runtime_standin.py`` installed into the release's ``site/`` as
``frontier_runtime``, so the agent starts it exactly as it starts the runtime (``python -m
frontier_runtime serve ...`` with PYTHONPATH on the release) and it answers the health paths over
real HTTP. systemd cannot run here; its path is covered in test_host.py with a systemctl stand-in.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import frontier_hostside
import pytest
from frontier_hostside import agent
from frontier_hostside.agent import Agent, AgentConfig, terminate_then_kill
from frontier_hostside.names import AGENT_CONFIG_NAME, AGENT_FILE_NAME, UNIT_NAME, WATCHDOG_UNIT

from frontier.config.schema import Host
from frontier.release.artifact import Artifact
from frontier.release.release import MANIFEST, Release
from frontier.render.host import render_agent_config
from frontier.targets import load_stack
from frontier.targets.local import cluster as local_cluster
from frontier.targets.local import services

STANDIN = Path(__file__).with_name("runtime_standin.py")


@pytest.fixture
def config(tmp_path: Path) -> AgentConfig:
    """The rendered configuration of a host slot on a scratch root, on a free port."""
    settings = load_stack("local")
    text = render_agent_config(
        settings,
        settings.only_pool,
        host="host-t",
        root=str(tmp_path / "root"),
        python=sys.executable,
        address="127.0.0.1",
    )
    cfg = dataclasses.replace(AgentConfig.from_dict(json.loads(text)), port=services.free_port())
    (tmp_path / "root").mkdir()
    return cfg


@pytest.fixture
def host(tmp_path: Path, config: AgentConfig):
    """An agent on the scratch root; whatever runtime a test leaves running is stopped after it."""
    a = Agent(config, str(write_config(config, tmp_path / "agent.json")))
    yield a
    a.stop()


def write_config(config: AgentConfig, path: Path) -> Path:
    path.write_text(config.to_json())
    return path


def cli(config_file: Path, *args: str) -> tuple[int, dict]:
    """The agent as hosts run it: its own file, its config, one command; exit status and JSON answer."""
    done = subprocess.run(
        [sys.executable, agent.__file__, "--config", str(config_file), *args], capture_output=True, text=True
    )
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 1, (done.stdout, done.stderr)
    return done.returncode, json.loads(lines[0])


def release(config: AgentConfig, n: int, **behaviour: object) -> Release:
    """A release whose runtime.yaml tells the stand-in how to behave (JSON is YAML too)."""
    runtime = {
        "n": n,
        "readiness_path": config.readiness_path,
        "liveness_path": config.liveness_path,
        **behaviour,
    }
    return Release(
        Artifact("sha256:" + f"{n:x}" * 64, "image"),
        {"runtime.yaml": json.dumps(runtime, sort_keys=True) + "\n", UNIT_NAME: "[Unit]\n"},
    )


def upload(a: Agent, r: Release, *, standin: bool = True) -> Path:
    """What HostSession uploads: the files and release.json, plus the 'installed wheel' (site/)."""
    incoming = a.releases_dir / f".incoming-{r.id}"
    incoming.mkdir(parents=True)
    for name, text in r.files.items():
        (incoming / name).write_text(text)
    (incoming / MANIFEST).write_text(r.manifest())
    if standin:
        package = incoming / "site" / "frontier_runtime"
        package.mkdir(parents=True)
        (package / "__init__.py").write_text("")
        shutil.copyfile(STANDIN, package / "__main__.py")
    return incoming


def staged(a: Agent, r: Release) -> Release:
    a.stage(r.id, str(upload(a, r)))
    return r


# --- configuration --------------------------------------------------------------------------------


def test_the_agent_config_is_rendered_purely_from_the_stack():
    settings = load_stack("local")
    kwargs = {"host": "h", "root": "/opt/frontier/", "python": "/usr/bin/python3", "address": "10.0.0.5"}
    one, two = (
        render_agent_config(settings, settings.only_pool, **kwargs),
        render_agent_config(settings, settings.only_pool, **kwargs),
    )
    assert one == two
    config = AgentConfig.from_dict(json.loads(one))
    assert (config.root, config.port, config.readiness_path) == (
        "/opt/frontier",
        settings.runtime.port,
        settings.health.readiness_path,
    )
    assert config.drain_timeout_s == settings.runtime.drain_timeout_s and config.unit == UNIT_NAME


def test_a_config_without_a_field_is_refused_naming_it(tmp_path, config):
    data = json.loads(config.to_json())
    del data["port"]
    (tmp_path / "bad.json").write_text(json.dumps(data))
    rc, answer = cli(tmp_path / "bad.json", "facts")
    assert rc == 2 and answer["ok"] is False and "lacks port" in answer["error"]


def test_the_agent_runs_from_the_files_that_travel_with_it_alone(tmp_path, config):
    """A host's python3 has none of our packages: the agent finds its names in the copy shipped
    beside it. ``-S -E``: no site-packages (so no installed frontier_hostside), no PYTHONPATH."""
    bin_dir = tmp_path / "bin"
    for name, data in frontier_hostside.agent_files().items():
        (bin_dir / name).parent.mkdir(parents=True, exist_ok=True)
        (bin_dir / name).write_bytes(data)
    write_config(config, bin_dir / AGENT_CONFIG_NAME)  # where the agent looks by default
    done = subprocess.run(
        [sys.executable, "-S", "-E", str(bin_dir / AGENT_FILE_NAME), "facts"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["ok"] is True


# --- stage, activate, prune ------------------------------------------------------------------------


def test_stage_verifies_every_file_and_moves_the_upload_into_releases(host, config):
    r = release(config, 1)
    assert host.stage(r.id, str(upload(host, r))) == {"staged": r.id}
    assert (host.releases_dir / r.id / "runtime.yaml").read_text() == r.files["runtime.yaml"]
    assert not list(host.releases_dir.glob(".incoming-*"))
    facts = host.facts(r.id)
    assert facts.releases == [r.id] and facts.staged_manifest


def test_a_tampered_or_incomplete_upload_is_never_staged(host, config):
    r = release(config, 2)
    incoming = upload(host, r)
    (incoming / "runtime.yaml").write_text("n: 999\n")
    with pytest.raises(agent.AgentError, match="runtime.yaml has sha256 .*, release.json says"):
        host.stage(r.id, str(incoming))
    (incoming / MANIFEST).unlink()
    with pytest.raises(agent.AgentError, match="release.json is missing"):
        host.stage(r.id, str(incoming))
    assert not (host.releases_dir / r.id).exists()


def test_activate_swaps_current_and_previous_and_refuses_what_is_not_staged(host, config):
    one, two = staged(host, release(config, 1)), staged(host, release(config, 2))
    host.activate(one.id)
    assert host.activate(two.id) == {"current": two.id, "previous": one.id}
    assert (host.link("current"), host.link("previous")) == (two.id, one.id)
    assert os.readlink(host.root / "current") == f"releases/{two.id}"
    with pytest.raises(agent.AgentError, match="release r-000000000000 is not staged"):
        host.activate("r-000000000000")
    with pytest.raises(agent.AgentError, match="is not a release id"):
        host.activate("../../etc")
    assert host.link("current") == two.id


def test_the_release_order_is_recorded_not_read_from_file_times(tmp_path, host, config):
    a = host
    r1, r2, r3 = (staged(a, release(config, n)) for n in (1, 2, 3))
    a.activate(r1.id)  # activating makes a release the most recent, as staging does
    # File times say r2 is the newest: the recorded order does not care.
    future = time.time() + 3600
    os.utime(a.releases_dir / r2.id, (future, future))
    # A new process (the next SSH command) reads the same order from releases.json.
    rc, facts = cli(write_config(config, tmp_path / "agent.json"), "facts")
    assert rc == 0 and facts["releases"] == [r1.id, r3.id, r2.id]
    assert json.loads((a.root / "releases.json").read_text()) == {"releases": [r1.id, r3.id, r2.id]}


def test_prune_keeps_the_most_recent_and_never_current_or_previous(host, config):
    rs = [staged(host, release(config, n)) for n in range(1, 7)]
    host.activate(rs[0].id)
    host.activate(rs[1].id)  # current = 2, previous = 1; order now 2, 1, 6, 5, 4, 3
    (host.releases_dir / ".incoming-leftover").mkdir()
    # A directory staged before the order was kept counts as the oldest.
    (host.releases_dir / "r-0000000000aa").mkdir()

    assert host.prune(3) == {"pruned": [rs[4].id, rs[3].id, rs[2].id, "r-0000000000aa"]}
    assert sorted(p.name for p in host.releases_dir.iterdir()) == sorted([rs[0].id, rs[1].id, rs[5].id])
    assert host.order() == [rs[1].id, rs[0].id, rs[5].id]
    with pytest.raises(agent.AgentError, match="keep is 0; it must be at least 1"):
        host.prune(0)


def test_prune_keeps_current_and_previous_even_when_they_are_the_oldest(host, config):
    one, two = staged(host, release(config, 1)), staged(host, release(config, 2))
    host.activate(one.id)
    host.activate(two.id)
    three, four = staged(host, release(config, 3)), staged(host, release(config, 4))  # order: 4, 3, 2, 1
    assert host.prune(1) == {"pruned": [three.id]}
    assert host.order() == [four.id, two.id, one.id]


# --- start, status, stop, restore ---------------------------------------------------------------


def test_start_status_stop_with_a_real_process(tmp_path, host, config):
    (host.root / "env").write_text("export FRONTIER_TEST_MARK='from env'\n# a comment\n")
    r = staged(host, release(config, 1))
    host.activate(r.id)
    started = host.start()
    assert started["started"] == r.id and started["launcher"] == "process"
    assert host.wait_ready(30)["ready"] is True

    environ = Path(f"/proc/{started['pid']}/environ").read_bytes().split(b"\0")
    assert f"PYTHONPATH={host.root / 'releases' / r.id / 'site'}".encode() in environ
    assert b"FRONTIER_TEST_MARK=from env" in environ
    status = host.status()
    assert (status.running, status.ready, status.live, status.running_release) == (True, True, True, r.id)
    assert status.runs(r.id) and status.digest == r.digest
    assert "frontier_standin_pid" in host.metrics()["metrics"]
    with pytest.raises(agent.AgentError, match=f"already runs \\(pid {started['pid']}\\)"):
        host.start()

    stopped = host.stop()
    assert stopped == {"stopped": True, "pid": started["pid"], "outcome": "terminated"}
    assert not services.pid_alive(started["pid"]) and not services.pid_alive(started["supervisor"])
    assert [e["event"] for e in history(host)] == ["start", "stop"]
    after = host.facts()
    assert (after.running, after.running_release, after.current) == (False, "", r.id)
    assert not after.runs(r.id)
    assert "=== " in (host.root / "logs" / "runtime.log").read_text()


def test_restore_brings_back_the_release_that_ran_before(host, config):
    """What the rollout does on failure: stop, activate the release the host ran before, start."""
    good, bad = staged(host, release(config, 1)), staged(host, release(config, 2, mode="die"))
    host.activate(good.id)
    host.start()
    host.wait_ready(30)
    host.stop()
    host.activate(bad.id)
    host.start()
    with pytest.raises(agent.AgentError, match="the runtime exited during start-up") as failed:
        host.wait_ready(30)
    assert failed.value.code == 3 and "cannot load the model" in failed.value.extra["log_tail"]
    restart = wait_for(lambda: next((e for e in history(host) if e["event"] == "restart"), None))
    assert restart["reason"] == "the runtime exited with status 1 before it was ready"

    host.stop()
    host.activate(good.id)
    host.start()
    assert host.wait_ready(30)["ready"] is True
    assert host.facts().runs(good.id) and host.link("previous") == bad.id


def test_the_cli_answers_in_json_with_the_phase_and_exit_status(tmp_path, host, config):
    cfg = write_config(config, tmp_path / "agent.json")
    r = release(config, 1, mode="never-ready")
    incoming = upload(host, r)
    assert cli(cfg, "stage", r.id, str(incoming)) == (0, {"ok": True, "phase": "stage", "staged": r.id})
    rc, answer = cli(cfg, "start", "--activate", r.id)
    assert rc == 0 and answer["current"] == r.id and answer["started"] == r.id
    rc, answer = cli(cfg, "wait-ready", "1")
    assert rc == 4 and answer["ok"] is False and answer["phase"] == "wait-ready"
    assert answer["error"] == "not ready after 1s" and "stand-in runtime pid" in answer["log_tail"]
    rc, answer = cli(cfg, "stop")
    assert rc == 0 and answer["outcome"] == "terminated"
    rc, answer = cli(cfg, "start")
    assert rc == 0
    rc, answer = cli(cfg, "prune", "1")
    assert (rc, answer["pruned"]) == (0, [])
    rc, answer = cli(tmp_path / "missing.json", "status")
    assert rc == 2 and "cannot read the agent config" in answer["error"]


def test_start_without_a_release_fails_with_the_reason(host):
    with pytest.raises(agent.AgentError, match="start: no current release under"):
        host.start()


# --- the supervisor ---------------------------------------------------------------------------------


def history(a: Agent) -> list[dict]:
    return [json.loads(line) for line in a.history_file.read_text().splitlines()]


def wait_for(predicate, timeout: float = 30.0, step: float = 0.02):
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        assert time.monotonic() < deadline, "timed out"
        time.sleep(step)
    return value


def test_a_runtime_killed_with_sigkill_is_restarted_and_ready_again(tmp_path, host, config, capsys):
    r = staged(host, release(config, 1))
    host.activate(r.id)
    first = host.start()["pid"]
    host.wait_ready(30)
    wait_for(lambda: host.supervisor_state().get("state") == "serving")  # it has seen the runtime serve

    os.kill(first, signal.SIGKILL)
    killed = time.monotonic()
    wait_for(
        lambda: (host.running_pid() or first) != first and host.http_status(config.readiness_path) == 200
    )
    recovery_s = time.monotonic() - killed

    rc, status = cli(Path(host.config_path), "status")
    assert rc == 0 and status["ready"] and status["live"] and status["supervised"]
    assert status["restarts"] == 1 and "the runtime exited with status -9" in status["last_restart"]
    assert status["running_release"] == r.id
    events = wait_for(
        lambda: (e := [e for e in history(host) if e["event"] in ("restart", "recovered")])[1:] and e
    )
    assert [e["event"] for e in events] == ["restart", "recovered"]
    assert events[0]["old_pid"] == first and events[0]["pid"] == host.running_pid()
    with capsys.disabled():
        print(
            f"\n  supervisor: kill -9 → ready again in {recovery_s:.2f}s (the supervisor measured {events[1]['after_s']:.2f}s)"
        )
    assert recovery_s < 10


def test_a_hung_runtime_is_restarted_after_failed_liveness_probes(tmp_path, config):
    hang = tmp_path / "hang"
    config = dataclasses.replace(config, liveness_interval_s=0.2, liveness_failures=2)
    a = Agent(config, str(write_config(config, tmp_path / "agent.json")))
    try:
        # The stand-in fails liveness while the hang file exists; the restarted one has its own file.
        r = staged(a, release(config, 1, hang_file=str(hang)))
        a.activate(r.id)
        first = a.start()["pid"]
        a.wait_ready(30)
        hang.write_text("")
        wait_for(lambda: a.facts().restarts == 1)
        hang.unlink()
        wait_for(lambda: a.status().live and a.running_pid() != first)
        restart = next(e for e in history(a) if e["event"] == "restart")
        # It was asked to stop first (SIGTERM), as a hung runtime in Kubernetes is.
        assert (
            restart["reason"] == "liveness failed 2 times in a row" and restart["old_outcome"] == "terminated"
        )
        assert a.facts().restarts == 1
    finally:
        a.stop()


def test_stopping_the_supervisor_stops_the_runtime_and_restarts_nothing(host, config):
    r = staged(host, release(config, 1))
    host.activate(r.id)
    started = host.start()
    host.wait_ready(30)
    assert host.stop()["outcome"] == "terminated"
    assert host.http_status(config.readiness_path) == 0  # nothing listens any more
    time.sleep(0.3)
    assert not services.pid_alive(started["supervisor"]) and host.running_pid() is None
    assert history(host)[-1] == {**history(host)[-1], "event": "stop", "restarts": 0, "outcome": "terminated"}


def test_a_supervisor_whose_record_is_gone_stops_its_runtime_and_exits(host, config):
    """An orphan (its root cleared or removed under it) must not keep a runtime alive for ever."""
    r = staged(host, release(config, 1))
    host.activate(r.id)
    started = host.start()
    host.wait_ready(30)
    host.supervisor_pid_file.unlink()
    wait_for(lambda: not services.pid_alive(started["supervisor"]), timeout=10)
    assert not services.pid_alive(started["pid"])
    assert history(host)[-1]["event"] == "stop" and history(host)[-1]["outcome"] == "terminated"


def test_local_down_stops_supervisors_first_and_clears_the_slot(host, config):
    """The local stack's `down` path: the supervisor stops its runtime; nothing is restarted."""
    r = staged(host, release(config, 1))
    host.activate(r.id)
    started = host.start()
    host.wait_ready(30)

    report = local_cluster._stop_runtimes((Host(name="host-t", address="127.0.0.1", root=str(host.root)),))

    assert {c.name: c.detail for c in report} == {
        "host-t supervisor": f"pid {started['supervisor']} (terminated)",
        "host-t runtime": f"pid {started['pid']} (stopped by its supervisor)",
    }
    assert not services.pid_alive(started["pid"]) and not list(host.run_dir.iterdir())
    assert [e["event"] for e in history(host)] == ["start", "stop"]


def test_on_a_systemd_host_the_watchdog_restarts_a_unit_that_fails_liveness(tmp_path, config):
    """systemd cannot run here: systemctl is a stand-in that records its calls, answers is-active
    from a file, and 'restarts' the runtime by ending its hang. The runtime (the container the unit
    would run) is the stand-in process, started here."""
    calls, hang, active = tmp_path / "calls", tmp_path / "hang", tmp_path / "active"
    shims = tmp_path / "shims"
    shims.mkdir()
    (shims / "systemctl").write_text(
        f'#!/bin/sh\necho "$*" >> {calls}\n'
        f'case "$1" in\n  is-active) test -f {active}; exit $? ;;\n  restart) rm -f {hang} ;;\n  show) echo 3 ;;\nesac\nexit 0\n'
    )
    (shims / "systemctl").chmod(0o755)
    (tmp_path / "run-systemd").mkdir()
    env = {
        **os.environ,
        "PATH": f"{shims}:{os.environ['PATH']}",
        agent.SYSTEMD_RUN_DIR_ENV: str(tmp_path / "run-systemd"),
        agent.UNIT_DIR_ENV: str(tmp_path / "units"),
    }
    config = dataclasses.replace(config, liveness_interval_s=0.2, liveness_failures=2)
    cfg = write_config(config, tmp_path / "agent.json")
    runtime_yaml = tmp_path / "runtime.yaml"
    runtime_yaml.write_text(
        json.dumps(
            {
                "readiness_path": config.readiness_path,
                "liveness_path": config.liveness_path,
                "hang_file": str(hang),
            }
        )
    )
    runtime = subprocess.Popen(
        [
            sys.executable,
            str(STANDIN),
            "serve",
            "--config",
            str(runtime_yaml),
            "--host",
            config.address,
            "--port",
            str(config.port),
        ],
        stdout=subprocess.DEVNULL,
    )
    watchdog = subprocess.Popen([sys.executable, agent.__file__, "--config", str(cfg), "supervise"], env=env)
    a = Agent(config, str(cfg), environ=env)
    try:
        active.write_text("")
        wait_for(lambda: a.http_status(config.readiness_path) == 200)
        time.sleep(0.5)  # the watchdog has seen it ready
        hang.write_text("")
        wait_for(lambda: a.supervisor_state().get("restarts") == 1)
        assert f"restart {WATCHDOG_UNIT}" not in calls.read_text()
        assert "restart frontier-runtime" in calls.read_text().splitlines()
        assert not hang.exists() and a.http_status(config.liveness_path) == 200
        events = wait_for(lambda: (e := [x["event"] for x in history(a)])[1:] and e)
        assert events == ["restart", "recovered"]
        assert a.supervisor_state()["last_restart"]["reason"] == "liveness failed 2 times in a row"
        # status adds systemd's own count of the unit's automatic restarts (NRestarts: 3 here).
        facts = a.facts()
        assert facts.supervised and facts.restarts == 1 + 3 and "liveness failed" in facts.last_restart
        # A stopped unit (a rollout's stop phase) is left alone, and stopping the watchdog leaves the runtime.
        active.unlink()
        hang.write_text("")
        time.sleep(1.0)
        assert a.supervisor_state()["restarts"] == 1
        assert terminate_then_kill(watchdog.pid, 5, process=watchdog) == "terminated"
        assert runtime.poll() is None
    finally:
        watchdog.kill()
        watchdog.wait()
        runtime.terminate()
        runtime.wait()


# --- terminate_then_kill ----------------------------------------------------------------------------


def _spawn(code: str) -> subprocess.Popen:
    process = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    assert process.stdout is not None
    process.stdout.readline()  # the child says when its signal handlers are in place
    return process


def test_terminate_then_kill_kills_a_process_that_ignores_sigterm():
    process = _spawn(
        "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print(1, flush=True); time.sleep(60)"
    )
    started = time.monotonic()
    assert terminate_then_kill(process.pid, 0.5) == "killed"
    assert 0.5 <= time.monotonic() - started < 5
    assert process.wait(5) == -signal.SIGKILL


def test_terminate_then_kill_lets_a_process_exit_on_sigterm_and_reaps_it():
    process = _spawn("import time; print(1, flush=True); time.sleep(60)")
    assert terminate_then_kill(process.pid, 5, process=process) == "terminated"
    assert process.returncode == -signal.SIGTERM


def test_terminate_then_kill_leaves_dead_zombie_and_recycled_pids_alone():
    zombie = _spawn("print(1, flush=True)")
    deadline = time.monotonic() + 5
    while Path(f"/proc/{zombie.pid}/stat").read_text().rsplit(")", 1)[-1].split()[0] != "Z":
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert terminate_then_kill(zombie.pid, 1) == "absent"  # a zombie is dead: nothing to signal
    assert zombie.wait(1) == 0
    assert terminate_then_kill(zombie.pid, 1) == "absent"  # reaped: gone

    other = _spawn("import time; print(1, flush=True); time.sleep(60)")
    try:
        # The pid now belongs to a program that is not the one we started: never signalled.
        assert terminate_then_kill(other.pid, 1, still_ours=lambda: False) == "absent"
        assert other.poll() is None
    finally:
        other.kill()
        other.wait()


# --- prefetch ----------------------------------------------------------------------------------------


def _runtime_release(n: int, runtime_yaml: str) -> Release:
    """A release of the real runtime: its site/ is left empty, so ``python -m frontier_runtime``
    imports the runtime installed beside this interpreter, as a wheel installed there would."""
    return Release(
        Artifact("sha256:" + f"{n:x}" * 64, "image"), {"runtime.yaml": runtime_yaml, UNIT_NAME: "[Unit]\n"}
    )


def _stage_runtime(a: Agent, r: Release) -> Release:
    incoming = upload(a, r, standin=False)
    (incoming / "site").mkdir()
    a.stage(r.id, str(incoming))
    return r


def test_prefetch_runs_the_releases_runtime_on_its_config_and_starts_nothing(tmp_path, host, config):
    model = {"name": "tiny", "weights_uri": str(tmp_path / "weights"), "version": "v1", "max_seq_len": 128}
    r = _stage_runtime(host, _runtime_release(7, json.dumps({"model": model, "device": "cpu"})))
    code, answer = cli(write_config(config, tmp_path / "agent.json"), "prefetch", "--release", r.id)
    assert code == 0, answer
    assert (answer["prefetched"], answer["fetched"]) == (r.id, False)  # a local directory: nothing to fetch
    assert not host.is_running() and host.facts().current == ""
    assert f"prefetch {r.id}" in (host.root / "logs" / "runtime.log").read_text()


def test_prefetch_of_a_release_without_its_runtime_beside_it_is_refused_naming_the_path(host, config):
    r = release(config, 8)
    host.stage(r.id, str(upload(host, r, standin=False)))
    with pytest.raises(agent.AgentError, match=f"{r.id}/site"):
        host.prefetch(r.id)


def test_a_prefetch_the_runtime_refuses_fails_with_its_reason_in_the_log_tail(host, config):
    r = _stage_runtime(host, _runtime_release(9, "model: {}\n"))
    with pytest.raises(agent.AgentError, match="prefetch exited 2") as refused:
        host.prefetch(r.id)
    assert "model.name" in refused.value.extra["log_tail"]
