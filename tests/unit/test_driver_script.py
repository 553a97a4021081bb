"""The rendered NVIDIA driver script, run against shim package tools (this machine has no GPU).

The shims keep a fake host's state in files: installed packages and their versions, holds, whether
the kernel module is loaded (a "reboot" loads it). Files the script writes go under
FRONTIER_DRIVERS_ROOT.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from frontier.config.load import load_stack
from frontier.render.files import render_driver_script

DRIVER_VERSION = "550.127.05"

SHIMS = {
    "lspci": """
        for i in $(seq 1 "$(cat "$SHIM/gpus")"); do echo "0$i:00.0 3D controller: NVIDIA Corporation GH100 [H100 SXM5 80GB]"; done
    """,
    "dpkg-query": """
        pkg="${@: -1}"
        [ -f "$SHIM/pkgs/$pkg" ] || { echo "dpkg-query: no packages found matching $pkg" >&2; exit 1; }
        echo "install ok installed $(cat "$SHIM/pkgs/$pkg")"
    """,
    "apt-get": """
        echo "apt-get $*" >> "$SHIM/log"
        [ "$1" = install ] || exit 0
        for arg in "$@"; do
          case "$arg" in -*|install) continue;; esac
          name="${arg%%=*}"; version="${arg#*=}"
          [ "$version" = "$arg" ] && version="@DRIVER@-0ubuntu0.22.04.1"
          echo "$version" > "$SHIM/pkgs/$name"
        done
    """,
    "apt-mark": """
        if [ "$1" = showhold ]; then cat "$SHIM/holds" 2>/dev/null; exit 0; fi
        echo "apt-mark $*" >> "$SHIM/log"; echo "$2" >> "$SHIM/holds"
    """,
    "update-initramfs": 'echo "update-initramfs $*" >> "$SHIM/log"',
    "curl": 'echo "-----BEGIN PGP PUBLIC KEY BLOCK-----"',
    "gpg": """
        while [ $# -gt 0 ]; do [ "$1" = -o ] && out="$2"; shift; done
        cat > "$out"
    """,
    "nvidia-ctk": """
        echo "nvidia-ctk $*" >> "$SHIM/log"
        for arg in "$@"; do case "$arg" in --config=*) config="${arg#--config=}";; esac; done
        echo '{"runtimes": {"nvidia": {"path": "nvidia-container-runtime", "args": []}}}' > "$config"
    """,
    "systemctl": """
        echo "systemctl $*" >> "$SHIM/log"
        case "$1" in
          is-enabled) [ -f "$SHIM/persistenced" ];;
          enable) touch "$SHIM/persistenced";;
        esac
    """,
    "nvidia-smi": """
        [ -f "$SHIM/pkgs/nvidia-utils-550-server" ] && [ -f "$SHIM/module" ] || {
          echo "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver." >&2; exit 9; }
        for i in $(seq 0 $(( $(cat "$SHIM/gpus") - 1 ))); do echo "$i, $(cat "$SHIM/module")"; done
    """,
}


class FakeHost:
    def __init__(self, base: Path, script: str) -> None:
        self.root = base / "root"
        self.shim = base / "shim"
        self.bin = base / "bin"
        self.script = base / "install-nvidia.sh"
        for d in (self.root, self.shim / "pkgs", self.bin):
            d.mkdir(parents=True)
        self.script.write_text(script)
        self.script.chmod(0o755)
        for name, body in SHIMS.items():
            tool = self.bin / name
            tool.write_text("#!/usr/bin/env bash\n" + body.replace("@DRIVER@", DRIVER_VERSION).strip() + "\n")
            tool.chmod(0o755)
        self.set_gpus(8)

    def set_gpus(self, n: int) -> None:
        (self.shim / "gpus").write_text(str(n))

    def reboot(self, loaded_version: str = DRIVER_VERSION) -> None:
        (self.shim / "module").write_text(loaded_version)

    def install(self, package: str, version: str) -> None:
        (self.shim / "pkgs" / package).write_text(version)

    def log(self) -> list[str]:
        path = self.shim / "log"
        return path.read_text().splitlines() if path.exists() else []

    def run(self) -> subprocess.CompletedProcess:
        env = {
            "PATH": f"{self.bin}:/usr/bin:/bin",
            "SHIM": str(self.shim),
            "FRONTIER_DRIVERS_ROOT": str(self.root),
        }
        return subprocess.run(["bash", str(self.script)], env=env, capture_output=True, text=True, timeout=60)


def status(result: subprocess.CompletedProcess) -> str:
    return result.stdout.strip().splitlines()[-1]


@pytest.fixture
def host(tmp_path) -> FakeHost:
    return FakeHost(tmp_path, render_driver_script(load_stack("prod")))


def test_fresh_host_gets_driver_and_toolkit_and_asks_for_a_reboot(host):
    result = host.run()
    assert result.returncode == 0, result.stderr
    assert status(result) == "frontier-drivers: changed=1 reboot_required=1 gpus=0 driver=none toolkit=1.17.3"
    log = host.log()
    assert (
        "apt-get install -y -qq --no-install-recommends nvidia-headless-550-server nvidia-utils-550-server"
        in log
    )
    assert any(
        line.startswith("apt-get install") and "nvidia-container-toolkit=1.17.3-1" in line for line in log
    )
    assert "apt-mark hold nvidia-headless-550-server" in log
    assert "systemctl restart docker" in log
    assert (host.root / "etc/modprobe.d/blacklist-nouveau.conf").read_text() == (
        "blacklist nouveau\noptions nouveau modeset=0\n"
    )
    assert '"nvidia"' in (host.root / "etc/docker/daemon.json").read_text()
    assert (
        "signed-by=/usr/share/keyrings/nvidia-container-toolkit-keyring.gpg"
        in (host.root / "etc/apt/sources.list.d/nvidia-container-toolkit.list").read_text()
    )


def test_second_run_after_the_reboot_changes_nothing_and_says_so(host):
    host.run()
    host.reboot()
    before = host.log()
    result = host.run()
    assert result.returncode == 0, result.stderr
    assert "nothing to change" in result.stdout
    assert status(result) == (
        f"frontier-drivers: changed=0 reboot_required=0 gpus=8 driver={DRIVER_VERSION} toolkit=1.17.3"
    )
    new = host.log()[len(before) :]
    assert not [
        line for line in new if line.startswith(("apt-get", "apt-mark", "nvidia-ctk", "systemctl restart"))
    ]


def test_only_a_stale_toolkit_is_upgraded(host):
    host.run()
    host.reboot()
    host.install("nvidia-container-toolkit", "1.16.2-1")
    before = host.log()
    result = host.run()
    assert status(result).startswith("frontier-drivers: changed=1 reboot_required=0 gpus=8")
    new = host.log()[len(before) :]
    assert [line for line in new if line.startswith("apt-get install")] == [
        "apt-get install -y -qq --no-install-recommends --allow-downgrades nvidia-container-toolkit=1.17.3-1 "
        "nvidia-container-toolkit-base=1.17.3-1 libnvidia-container-tools=1.17.3-1 libnvidia-container1=1.17.3-1"
    ]


def test_a_host_without_nvidia_gpus_is_refused(host):
    host.set_gpus(0)
    result = host.run()
    assert result.returncode == 1
    assert "no NVIDIA GPU on the PCI bus" in result.stderr
    assert status(result).startswith("frontier-drivers: changed=0")
    assert host.log() == []


def test_a_driver_of_another_branch_still_loaded_fails_verification(host):
    host.run()
    host.reboot(loaded_version="535.183.01")
    result = host.run()
    assert result.returncode == 1
    assert (
        "nvidia-smi sees driver 535.183.01 and 8 GPU(s); expected driver 550.x and 8 GPU(s)" in result.stderr
    )


def test_a_missing_gpu_fails_verification(host):
    host.run()
    host.reboot()
    (host.shim / "gpus").write_text("7")
    result = host.run()
    assert result.returncode == 1
    assert "expected driver 550.x and 8 GPU(s)" in result.stderr


def test_loaded_nouveau_asks_for_a_reboot(host):
    host.run()
    host.reboot()
    (host.root / "sys/module/nouveau").mkdir(parents=True)
    result = host.run()
    assert result.returncode == 0
    assert "reboot_required=1" in status(result)


def test_the_script_uses_only_tools_from_path(host):
    # Every command the script runs resolves through PATH: the shims above stand in for all of them.
    assert os.access(host.script, os.X_OK)
    assert "/usr/bin/" not in host.script.read_text().replace("#!/usr/bin/env bash", "")
