"""The rendered NVIDIA driver script, run for real against shim tools (this machine has no GPU).

The shims keep a fake host's state in files: installed packages and their versions, holds, whether
the kernel module is loaded (a "reboot" loads it), whether fabric manager runs, persistence mode,
and which container engine exists. Two kinds of host: a plain Ubuntu image (no NVIDIA software:
the script installs the pinned branch) and a Deep Learning AMI (a newer driver, the toolkit and a
matching fabric manager already there: the script trusts them and only verifies). Files the
script writes go under FRONTIER_DRIVERS_ROOT; every command it runs resolves through PATH.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from frontier.config.image_cuda import image_cuda
from frontier.render.boot import render_driver_script
from frontier.targets import load_stack


def _grouped(settings):
    """The stack and its one node group, as the driver script is rendered for a group."""
    (group,) = settings.node_groups
    return settings, group


DRIVER_VERSION = "580.95.05"
AMI_DRIVER = "580.105.08"

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
          # The utilities bring nvidia-smi, the toolkit nvidia-ctk, fabric manager nv-fabricmanager.
          case "$name" in
            nvidia-utils-*) cp "$SHIM/stash/nvidia-smi" "$BIN/";;
            nvidia-container-toolkit) cp "$SHIM/stash/nvidia-ctk" "$BIN/";;
            nvidia-fabricmanager-*) cp "$SHIM/stash/nv-fabricmanager" "$BIN/";;
          esac
        done
    """,
    "apt-mark": """
        if [ "$1" = showhold ]; then cat "$SHIM/holds" 2>/dev/null; exit 0; fi
        echo "apt-mark $*" >> "$SHIM/log"; echo "$2" >> "$SHIM/holds"
    """,
    "update-initramfs": 'echo "update-initramfs $*" >> "$SHIM/log"',
    "modinfo": '[ -f "$SHIM/ami-module" ] && cat "$SHIM/ami-module" || exit 1',
    "curl": 'echo "-----BEGIN PGP PUBLIC KEY BLOCK-----"',
    "gpg": """
        while [ $# -gt 0 ]; do [ "$1" = -o ] && out="$2"; shift; done
        cat > "$out"
    """,
    "systemctl": """
        echo "systemctl $*" >> "$SHIM/log"
        unit="${@: -1}"
        case "$1" in
          is-active) [ -f "$SHIM/active-$unit" ];;
          enable) [ -f "$SHIM/broken-$unit" ] && exit 1; touch "$SHIM/active-$unit";;
        esac
    """,
}
# Tools that exist only once installed (plain Ubuntu) or from the start (the Deep Learning AMI).
STASH = {
    "nvidia-smi": """
        [ -f "$SHIM/module" ] || {
          echo "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver." >&2; exit 9; }
        case "$*" in
          -pm\\ 1) echo "nvidia-smi $*" >> "$SHIM/log"; touch "$SHIM/persistence";;
          -L) echo "GPU 0: NVIDIA H100 80GB HBM3";;
          *persistence_mode*)
            for i in $(seq 1 "$(cat "$SHIM/gpus")"); do
              [ -f "$SHIM/persistence" ] && echo Enabled || echo Disabled
            done;;
          *) for i in $(seq 0 $(( $(cat "$SHIM/gpus") - 1 ))); do echo "$i, $(cat "$SHIM/module")"; done;;
        esac
    """,
    "nvidia-ctk": """
        if [ "$1" = --version ]; then echo "NVIDIA Container Toolkit CLI version 1.17.8"; exit 0; fi
        echo "nvidia-ctk $*" >> "$SHIM/log"
        for arg in "$@"; do case "$arg" in --config=*) config="${arg#--config=}";; esac; done
        echo '{"runtimes": {"nvidia": {"path": "nvidia-container-runtime", "args": []}}}' > "$config"
    """,
    "nv-fabricmanager": 'echo "Fabric Manager version is : $(cat "$SHIM/fabricmanager")"',
    "docker": 'echo "docker $*" >> "$SHIM/log"',
    "containerd": 'echo "containerd $*" >> "$SHIM/log"',
}


class FakeHost:
    def __init__(self, base: Path, script: str) -> None:
        self.root = base / "root"
        self.shim = base / "shim"
        self.bin = base / "bin"
        self.script = base / "install-nvidia.sh"
        for d in (self.root, self.shim / "pkgs", self.shim / "stash", self.bin):
            d.mkdir(parents=True)
        self.script.write_text(script)
        self.script.chmod(0o755)
        for folder, tools in ((self.bin, SHIMS), (self.shim / "stash", STASH)):
            for name, body in tools.items():
                tool = folder / name
                tool.write_text(
                    "#!/usr/bin/env bash\n" + body.replace("@DRIVER@", DRIVER_VERSION).strip() + "\n"
                )
                tool.chmod(0o755)
        (self.shim / "fabricmanager").write_text(DRIVER_VERSION)
        self.set_gpus(8)
        self.provide("docker")

    def provide(self, tool: str) -> None:
        """Put a stashed tool on PATH (what the AMI ships)."""
        (self.bin / tool).write_bytes((self.shim / "stash" / tool).read_bytes())
        (self.bin / tool).chmod(0o755)

    def remove(self, tool: str) -> None:
        (self.bin / tool).unlink()

    def deep_learning_ami(self, *, fabricmanager_running: bool = True) -> FakeHost:
        """The AMI's own driver loaded, its toolkit and a matching fabric manager on PATH."""
        for tool in ("nvidia-smi", "nvidia-ctk", "nv-fabricmanager"):
            self.provide(tool)
        self.reboot(AMI_DRIVER)
        (self.shim / "fabricmanager").write_text(AMI_DRIVER)
        if fabricmanager_running:
            (self.shim / "active-nvidia-fabricmanager").touch()
        return self

    def set_gpus(self, n: int) -> None:
        (self.shim / "gpus").write_text(str(n))

    def reboot(self, loaded_version: str = DRIVER_VERSION) -> None:
        (self.shim / "module").write_text(loaded_version)
        (self.shim / "persistence").unlink(missing_ok=True)  # persistence mode does not survive a reboot

    def install(self, package: str, version: str) -> None:
        (self.shim / "pkgs" / package).write_text(version)

    def log(self) -> list[str]:
        path = self.shim / "log"
        return path.read_text().splitlines() if path.exists() else []

    def run(self) -> subprocess.CompletedProcess:
        env = {
            "PATH": f"{self.bin}:/usr/bin:/bin",
            "SHIM": str(self.shim),
            "BIN": str(self.bin),
            "FRONTIER_DRIVERS_ROOT": str(self.root),
        }
        return subprocess.run(["bash", str(self.script)], env=env, capture_output=True, text=True, timeout=60)


def status(result: subprocess.CompletedProcess) -> str:
    return result.stdout.strip().splitlines()[-1]


def changes(host: FakeHost, before: list[str]) -> list[str]:
    return [
        line
        for line in host.log()[len(before) :]
        if line.startswith(
            ("apt-get", "apt-mark", "nvidia-ctk", "systemctl restart", "systemctl enable", "nvidia-smi")
        )
    ]


@pytest.fixture
def host(tmp_path) -> FakeHost:
    """A p5.48xlarge of the prod stack (8 GPUs joined by NVSwitch) booted from plain Ubuntu."""
    return FakeHost(tmp_path, render_driver_script(*_grouped(load_stack("prod"))))


@pytest.fixture
def ami_host(tmp_path) -> FakeHost:
    return FakeHost(tmp_path, render_driver_script(*_grouped(load_stack("prod")))).deep_learning_ami()


# --- plain Ubuntu: install the pinned branch -------------------------------------------------------


def test_plain_ubuntu_gets_driver_fabric_manager_and_toolkit_and_asks_for_a_reboot(host):
    result = host.run()
    assert result.returncode == 0, result.stderr
    assert status(result) == "frontier-drivers: changed=1 reboot_required=1 gpus=0 driver=none toolkit=1.17.3"
    log = host.log()
    assert (
        "apt-get install -y -qq --no-install-recommends nvidia-headless-580-server nvidia-utils-580-server "
        "nvidia-fabricmanager-580" in log
    )
    assert any(
        line.startswith("apt-get install") and "nvidia-container-toolkit=1.17.3-1" in line for line in log
    )
    assert "apt-mark hold nvidia-fabricmanager-580" in log
    assert "systemctl restart docker" in log
    assert not any(
        "docker.io" in line or "containerd" in line.split()[2:3] for line in log if line.startswith("apt-get")
    )
    assert (host.root / "etc/modprobe.d/blacklist-nouveau.conf").read_text() == (
        "blacklist nouveau\noptions nouveau modeset=0\n"
    )
    assert '"nvidia"' in (host.root / "etc/docker/daemon.json").read_text()


def test_after_the_reboot_fabric_manager_and_persistence_come_up_then_nothing_changes(host):
    host.run()
    host.reboot()
    result = host.run()
    assert result.returncode == 0, result.stderr
    assert status(result) == (
        f"frontier-drivers: changed=1 reboot_required=0 gpus=8 driver={DRIVER_VERSION} toolkit=1.17.3"
    )
    assert "systemctl enable --now nvidia-fabricmanager" in host.log()
    assert "nvidia-smi -pm 1" in host.log()
    before = host.log()
    again = host.run()
    assert again.returncode == 0, again.stderr
    assert "nothing to change" in again.stdout
    assert status(again) == (
        f"frontier-drivers: changed=0 reboot_required=0 gpus=8 driver={DRIVER_VERSION} toolkit=1.17.3"
    )
    assert changes(host, before) == []


def test_only_a_stale_toolkit_is_upgraded(host):
    host.run()
    host.reboot()
    host.run()
    host.install("nvidia-container-toolkit", "1.16.2-1")
    before = host.log()
    result = host.run()
    assert status(result).startswith("frontier-drivers: changed=1 reboot_required=0 gpus=8")
    assert [line for line in changes(host, before) if line.startswith("apt-get install")] == [
        "apt-get install -y -qq --no-install-recommends --allow-downgrades nvidia-container-toolkit=1.17.3-1 "
        "nvidia-container-toolkit-base=1.17.3-1 libnvidia-container-tools=1.17.3-1 libnvidia-container1=1.17.3-1"
    ]


def test_a_driver_of_another_branch_still_loaded_fails_verification(host):
    host.run()
    host.reboot(loaded_version="535.183.01")
    result = host.run()
    assert result.returncode == 1
    assert "nvidia-smi sees driver 535.183.01 and 8 GPU(s); expected driver 580.x" in result.stderr


def test_loaded_nouveau_asks_for_a_reboot(host):
    (host.root / "sys/module/nouveau").mkdir(parents=True)
    result = host.run()
    assert result.returncode == 0
    assert "reboot_required=1" in status(result)


# --- the Deep Learning AMI: trust its driver -------------------------------------------------------


def test_the_amis_driver_is_trusted_and_nothing_is_installed_over_it(ami_host):
    result = ami_host.run()
    assert result.returncode == 0, result.stderr
    assert "trusting it" in result.stdout
    assert (
        status(result)
        == f"frontier-drivers: changed=1 reboot_required=0 gpus=8 driver={AMI_DRIVER} toolkit=1.17.8"
    )
    log = ami_host.log()
    assert not [line for line in log if line.startswith(("apt-get", "apt-mark", "update-initramfs"))]
    assert "nvidia-smi -pm 1" in log  # persistence mode was off
    assert not (ami_host.root / "etc/modprobe.d/blacklist-nouveau.conf").exists()


def test_a_second_run_on_the_ami_changes_nothing(ami_host):
    ami_host.run()
    before = ami_host.log()
    result = ami_host.run()
    assert result.returncode == 0, result.stderr
    assert "nothing to change" in result.stdout
    assert status(result).startswith("frontier-drivers: changed=0 reboot_required=0 gpus=8")
    assert changes(ami_host, before) == []


def test_a_stopped_fabric_manager_is_started_on_nvswitch_hosts(tmp_path):
    host = FakeHost(tmp_path, render_driver_script(*_grouped(load_stack("prod")))).deep_learning_ami(
        fabricmanager_running=False
    )
    result = host.run()
    assert result.returncode == 0, result.stderr
    assert "systemctl enable --now nvidia-fabricmanager" in host.log()


def test_an_amis_driver_older_than_the_images_cuda_needs_fails(tmp_path):
    host = FakeHost(tmp_path, render_driver_script(*_grouped(load_stack("prod"))))
    for tool in ("nvidia-smi", "nvidia-ctk", "nv-fabricmanager"):
        host.provide(tool)
    host.reboot("570.172.08")
    (host.shim / "fabricmanager").write_text("570.172.08")
    (host.shim / "active-nvidia-fabricmanager").touch()
    result = host.run()
    assert result.returncode == 1
    needed = image_cuda()
    assert (
        f"driver 570.172.08 is older than branch {needed.min_driver_branch}, "
        f"which the runtime image's CUDA {needed} needs" in result.stderr
    )


def test_a_fabric_manager_of_another_version_than_the_driver_fails(ami_host):
    (ami_host.shim / "fabricmanager").write_text("580.95.05")
    result = ami_host.run()
    assert result.returncode == 1
    assert f"fabric manager 580.95.05 does not match driver {AMI_DRIVER}: CUDA cannot start" in result.stderr


def test_an_nvswitch_host_without_fabric_manager_fails(ami_host):
    ami_host.remove("nv-fabricmanager")
    result = ami_host.run()
    assert result.returncode == 1
    assert "p5.48xlarge has NVSwitch but no fabric manager" in result.stderr


def test_a_host_without_nvswitch_needs_no_fabric_manager(tmp_path):
    # g6e.12xlarge (staging): L40S over PCIe.
    host = FakeHost(tmp_path, render_driver_script(*_grouped(load_stack("staging")))).deep_learning_ami()
    host.remove("nv-fabricmanager")
    host.set_gpus(4)
    result = host.run()
    assert result.returncode == 0, result.stderr
    assert "fabricmanager" not in " ".join(host.log())


def test_an_ami_driver_installed_but_not_loaded_is_an_error_not_a_second_install(tmp_path):
    host = FakeHost(tmp_path, render_driver_script(*_grouped(load_stack("prod"))))
    (host.shim / "ami-module").write_text(AMI_DRIVER)  # modinfo finds the AMI's module; nvidia-smi absent
    result = host.run()
    assert result.returncode == 1
    assert "refusing to install a second driver" in result.stderr
    assert not [line for line in host.log() if line.startswith("apt-get")]


def test_containerd_alone_is_configured_and_no_engine_is_installed(ami_host):
    ami_host.remove("docker")
    ami_host.provide("containerd")
    result = ami_host.run()
    assert result.returncode == 0, result.stderr
    assert "systemctl restart containerd" in ami_host.log()
    assert "nvidia" in (ami_host.root / "etc/containerd/config.toml").read_text()
    assert not [line for line in ami_host.log() if line.startswith("apt-get")]


def test_no_container_engine_at_all_is_refused_not_installed(ami_host):
    ami_host.remove("docker")
    result = ami_host.run()
    assert result.returncode == 1
    assert "no container engine (docker or containerd)" in result.stderr
    assert not [line for line in ami_host.log() if line.startswith("apt-get")]


# --- both -------------------------------------------------------------------------------------------


def test_a_host_without_nvidia_gpus_is_refused(host):
    host.set_gpus(0)
    result = host.run()
    assert result.returncode == 1
    assert "no NVIDIA GPU on the PCI bus" in result.stderr
    assert status(result).startswith("frontier-drivers: changed=0")
    assert host.log() == []


def test_a_missing_gpu_fails_verification(ami_host):
    ami_host.set_gpus(7)
    (ami_host.shim / "gpus").write_text("7")
    ami_host.script.write_text(ami_host.script.read_text())
    result = subprocess.run(
        ["bash", str(ami_host.script)],
        env={
            "PATH": f"{ami_host.bin}:/usr/bin:/bin",
            "SHIM": str(ami_host.shim),
            "BIN": str(ami_host.bin),
            "FRONTIER_DRIVERS_ROOT": str(ami_host.root),
            "FRONTIER_EXPECTED_GPUS": "8",
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    assert "nvidia-smi sees driver" in result.stderr and "expected 8 GPU(s)" in result.stderr


def test_the_script_uses_only_tools_from_path(host):
    assert os.access(host.script, os.X_OK)
    assert "/usr/bin/" not in host.script.read_text().replace("#!/usr/bin/env bash", "")
