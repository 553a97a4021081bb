"""`drivers` over SSH is idempotent and reports reboots without rebooting.

There is no GPU on this machine: the GPU host is a real sshd on 127.0.1.9 whose sessions have
shims on PATH for the package and GPU tools (apt-get, apt-mark, dpkg-query, lspci, nvidia-smi,
nvidia-ctk, systemctl, update-initramfs, curl, gpg, reboot; see tests/operate/shims/). The shims
keep the "installed" state in files, and every file the driver script writes lands under a
scratch root (FRONTIER_DRIVERS_ROOT), never in this machine's /etc.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from harness import SSH_PORT

from frontier import project
from frontier.hosts import drivers
from frontier.targets import backend_for, load_stack
from frontier.targets.local import services

SHIMS = Path(__file__).parent / "shims"
ADDRESS = "127.0.1.9"
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def gpu_host(tmp_path: Path):
    """A GPU-shaped stack with one host over SSH, and its shim state and scratch root."""
    key = tmp_path / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    state, root = tmp_path / "shim-state", tmp_path / "host-root"
    state.mkdir()
    (root / "sys" / "module" / "nouveau").mkdir(parents=True)  # nouveau is loaded: a reboot is due
    document = yaml.safe_load(((project.root() / "stacks") / "Pulumi.local.yaml").read_text())
    config = document["config"]
    config["frontier:node_groups"][0].update(
        accelerator="gpu", gpu_type="H100-SXM-80GB", min_size=1, desired_size=1, max_size=1
    )
    config["frontier:inventory"].update(
        ssh_key_file=str(key),
        hosts=[{"name": "gpu-1", "address": ADDRESS, "ssh_port": SSH_PORT, "root": str(root)}],
    )
    config["frontier:local"]["state_dir"] = str(tmp_path / "state")
    stack = tmp_path / "stacks" / "Pulumi.local.yaml"
    stack.parent.mkdir()
    stack.write_text(yaml.safe_dump(document))
    sshd = services.start_sshd(
        ADDRESS, SSH_PORT, tmp_path / "sshd", key.with_suffix(".pub").read_text(), name="sshd-gpu",
        set_env={"PATH": f"{SHIMS}:/usr/bin:/bin", "SHIM_STATE": str(state), "FRONTIER_DRIVERS_ROOT": str(root)},
    )  # fmt: skip
    try:
        yield load_stack("local", path=stack), state, root
    finally:
        services.stop(sshd)


def run(settings):
    return drivers.run(settings, backend_for(settings).hosts(), backend_for(settings).connect)


def test_the_first_run_installs_and_reports_the_reboot_it_does_not_do(gpu_host):
    settings, state, root = gpu_host
    [result] = run(settings)

    assert result.ok and result.changed and result.reboot_required
    assert (result.gpus, result.driver, result.toolkit) == (1, "580.95.05", "1.17.3")
    assert (state / "pkgs" / "nvidia-headless-580-server").exists()
    assert '"nvidia"' in (root / "etc" / "docker" / "daemon.json").read_text()
    assert not (state / "REBOOTED").exists()


def test_a_second_run_changes_nothing_and_says_so(gpu_host):
    settings, state, _ = gpu_host
    run(settings)
    calls_after_first = (state / "calls").read_text()

    [again] = run(settings)

    assert again.ok and not again.changed
    assert "nothing to change" in again.log
    assert again.reboot_required  # still not rebooted, so still reported
    new_calls = (state / "calls").read_text()[len(calls_after_first) :]
    assert "apt-get install" not in new_calls and "nvidia-ctk" not in new_calls and "restart" not in new_calls
    assert not (state / "REBOOTED").exists()


def test_the_drivers_task_prints_the_table_and_the_hosts_to_reboot(gpu_host):
    settings, _, _ = gpu_host
    env = {**os.environ, "FRONTIER_STACKS_DIR": str(Path(settings.source).parent)}
    done = subprocess.run(
        [sys.executable, "-m", "fabric", "drivers", "-s", "local"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert "gpu-1" in done.stdout and "REBOOT REQUIRED" in done.stdout
    assert "not rebooted (do it in a maintenance window): gpu-1" in done.stdout


def test_a_host_without_a_gpu_fails_clearly():
    with pytest.raises(Exception, match="no GPU hosts"):
        drivers.gpu_hosts(load_stack("local"), backend_for(load_stack("local")).hosts())
