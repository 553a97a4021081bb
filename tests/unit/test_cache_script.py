"""The model-cache script, run for real against shim disk tools (no NVMe or EBS here).

The shims keep the fake host's disks in files: what ``lsblk`` lists, the md array ``mdadm``
creates, the file systems ``mkfs.xfs`` makes, what is mounted. Files the script writes
(``/etc/fstab``, the mount point) go under FRONTIER_CACHE_ROOT; the tools come from PATH.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from frontier_hostside.names import RUNTIME_UID

from frontier.render.boot import render_mount_cache
from frontier.targets import load_stack

SHIMS = {
    "lsblk": 'cat "$SHIM/disks"',
    "mdadm": """
        echo "mdadm $*" >> "$SHIM/log"
        case "$1" in
          --assemble) [ -f "$SHIM/array" ] || exit 1;;
          --create) mkdir -p "$ROOT/dev/md"; touch "$ROOT/dev/md/frontier-cache" "$SHIM/array";;
        esac
    """,
    "blkid": '[ -f "$SHIM/fs-$(basename "$1")" ]',
    "mkfs.xfs": 'echo "mkfs.xfs $*" >> "$SHIM/log"; touch "$SHIM/fs-$(basename "${@: -1}")"',
    # The Deep Learning AMI's own instance-store mount exists where the test puts $SHIM/dlami.
    "mountpoint": 'if [ "$2" = /opt/dlami/nvme ]; then [ -f "$SHIM/dlami" ]; else [ -f "$SHIM/mounted" ]; fi',
    "findmnt": 'cat "$SHIM/mounted"',
    "mount": 'echo "mount $*" >> "$SHIM/log"; awk -v m="$1" \'$2 == m {print $1}\' "$ROOT/etc/fstab" > "$SHIM/mounted"',
}
NVME = "Amazon EC2 NVMe Instance Storage"


class FakeDisks:
    def __init__(self, base: Path, script: str, disks: str) -> None:
        self.root, self.shim, self.bin = base / "root", base / "shim", base / "bin"
        for d in (self.root, self.shim, self.bin):
            d.mkdir()
        self.script = base / "mount-cache.sh"
        self.script.write_text(script)
        (self.shim / "disks").write_text(disks)
        for name, body in SHIMS.items():
            (self.bin / name).write_text("#!/usr/bin/env bash\n" + body.strip() + "\n")
            (self.bin / name).chmod(0o755)

    def log(self) -> list[str]:
        path = self.shim / "log"
        return path.read_text().splitlines() if path.exists() else []

    def run(self) -> subprocess.CompletedProcess:
        env = {
            "PATH": f"{self.bin}:/usr/bin:/bin",
            "SHIM": str(self.shim),
            "ROOT": str(self.root),
            "FRONTIER_CACHE_ROOT": str(self.root),
        }
        return subprocess.run(["bash", str(self.script)], env=env, capture_output=True, text=True, timeout=30)


def last(result: subprocess.CompletedProcess) -> str:
    return result.stdout.strip().splitlines()[-1]


@pytest.fixture
def p5(tmp_path) -> FakeDisks:
    settings = load_stack("prod")
    disks = "/dev/nvme0n1 Amazon Elastic Block Store\n" + "".join(
        f"/dev/nvme{i}n1 {NVME}\n" for i in range(1, 9)
    )
    return FakeDisks(tmp_path, render_mount_cache(settings, settings.serving_group), disks)


def test_the_p5s_eight_nvme_disks_become_one_raid0_formatted_and_mounted(p5):
    result = p5.run()
    assert result.returncode == 0, result.stderr
    assert (
        last(result)
        == "frontier-cache: changed=1 kind=raid0 device=/dev/md/frontier-cache mount=/var/cache/frontier"
    )
    create = next(line for line in p5.log() if line.startswith("mdadm --create"))
    assert "--level=0" in create and "--raid-devices=8" in create
    assert create.endswith(" ".join(f"/dev/nvme{i}n1" for i in range(1, 9)))
    assert "/dev/nvme0n1" not in create  # the EBS root volume is never striped
    assert "mkfs.xfs -q -f -L frontier-cache /dev/md/frontier-cache" in p5.log()
    assert "LABEL=frontier-cache /var/cache/frontier xfs defaults,noatime,nofail 0 2" in (
        (p5.root / "etc/fstab").read_text()
    )
    assert (p5.root / "var/cache/frontier/weights").is_dir()


def test_a_second_run_changes_nothing(p5):
    p5.run()
    before = p5.log()
    result = p5.run()
    assert result.returncode == 0, result.stderr
    assert last(result).startswith("frontier-cache: changed=0 kind=raid0")
    assert p5.log() == before
    assert (p5.root / "etc/fstab").read_text().count("frontier-cache") == 1


def test_after_a_reboot_the_array_is_assembled_not_created_again(p5):
    p5.run()
    (p5.shim / "mounted").unlink()  # a reboot: nothing mounted, the array and its file system remain
    (p5.root / "dev/md/frontier-cache").unlink()
    result = p5.run()
    assert result.returncode == 0, result.stderr
    assert [line for line in p5.log() if line.startswith("mdadm")][-1].startswith("mdadm --assemble")
    assert sum(line.startswith("mdadm --create") for line in p5.log()) == 1
    assert sum(line.startswith("mkfs.xfs") for line in p5.log()) == 1


def test_a_type_with_no_instance_store_disks_visible_fails_naming_them(tmp_path):
    settings = load_stack("prod")
    host = FakeDisks(
        tmp_path,
        render_mount_cache(settings, settings.serving_group),
        "/dev/nvme0n1 Amazon Elastic Block Store\n",
    )
    result = host.run()
    assert result.returncode == 1
    assert "no NVMe instance-store disk" in result.stderr


def test_gp3_where_the_stack_asks_for_ebs(tmp_path):
    settings = load_stack("dev")
    group = settings.serving_group
    size = group.cache_volume_gb * 1024**3
    disks = f"/dev/nvme0n1 {100 * 1024**3} Amazon Elastic Block Store\n/dev/nvme1n1 {size} Amazon Elastic Block Store\n/dev/nvme2n1 250000000000 {NVME}\n"
    host = FakeDisks(tmp_path, render_mount_cache(settings, group), disks)
    result = host.run()
    assert result.returncode == 0, result.stderr
    assert last(result) == "frontier-cache: changed=1 kind=ebs device=/dev/nvme1n1 mount=/var/cache/frontier"
    assert not [line for line in host.log() if line.startswith("mdadm")]
    assert last(host.run()).startswith("frontier-cache: changed=0 kind=ebs")


def owner(path: Path) -> tuple[int, int]:
    stat = path.stat()
    return stat.st_uid, stat.st_gid


def test_the_weights_cache_belongs_to_the_user_the_runtime_image_runs_as(p5):
    # The container runs as RUNTIME_UID (the image's user; the unit's --user): a cache directory
    # left to root makes the weights download fail with EACCES.
    result = p5.run()
    assert result.returncode == 0, result.stderr
    weights = p5.root / "var/cache/frontier/weights"
    assert owner(weights) == (RUNTIME_UID, RUNTIME_UID)
    assert owner(p5.root / "var/cache/frontier") == (0, 0)  # the mount point itself stays root's


def test_a_mounted_cache_with_a_weights_directory_of_roots_is_handed_to_the_runtime_user(p5):
    p5.run()
    weights = p5.root / "var/cache/frontier/weights"
    os.chown(weights, 0, 0)
    result = p5.run()
    assert result.returncode == 0, result.stderr
    assert owner(weights) == (RUNTIME_UID, RUNTIME_UID)


def test_on_the_deep_learning_ami_the_cache_is_its_instance_store_mount_not_a_second_array(p5):
    # The Deep Learning AMI stripes the instance-store disks itself and mounts them at
    # /opt/dlami/nvme: they are busy, and a second array over them fails.
    (p5.shim / "dlami").touch()
    result = p5.run()
    assert result.returncode == 0, result.stderr
    assert (
        last(result)
        == "frontier-cache: changed=1 kind=dlami device=/opt/dlami/nvme mount=/var/cache/frontier"
    )
    assert not [line for line in p5.log() if line.startswith(("mdadm", "mkfs"))]
    fstab = (p5.root / "etc/fstab").read_text()
    assert (
        "/opt/dlami/nvme /var/cache/frontier none bind,nofail,x-systemd.requires-mounts-for=/opt/dlami/nvme 0 0"
        in fstab
    )
    assert "mount /var/cache/frontier" in p5.log()
    assert owner(p5.root / "var/cache/frontier/weights") == (RUNTIME_UID, RUNTIME_UID)
    second = p5.run()
    assert (
        last(second)
        == "frontier-cache: changed=0 kind=dlami device=/opt/dlami/nvme mount=/var/cache/frontier"
    )
    assert fstab == (p5.root / "etc/fstab").read_text()
