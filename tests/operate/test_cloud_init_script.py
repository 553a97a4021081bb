"""The bootstrap script cloud-init installs, run for real in a private mount namespace.

The script is rendered from ``templates/cloud-init.yaml.j2`` for the prod stack (a p5 on the image
``fab ami.bake`` makes from the Deep Learning AMI) and runs with bash as on a host, writing its log under /var/log and the host tools
under /opt/frontier: both are fresh tmpfs mounts in a mount namespace of its own (``unshare -m``),
so nothing of this machine is touched. The rendered cache and driver scripts it runs are the real
ones (their files go under FRONTIER_CACHE_ROOT / FRONTIER_DRIVERS_ROOT); the tools they and the
script call (aws, lsblk, mdadm, nvidia-smi, systemctl, python3 for the bootstrap, ...) are shims on
PATH that record their calls: there is no S3, NVMe, GPU or systemd here. The bootstrap module
itself runs for real in test_bootstrap.py.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest
import yaml

from frontier.render.boot import (
    render_cloud_init,
    render_cloudwatch_agent,
    render_driver_script,
    render_mount_cache,
)
from frontier.targets import load_stack

BUCKET = "frontier-prod-history-123456789012-us-east-1"
DRIVER = "580.105.08"

SHIMS = {
    # `aws s3 cp --quiet --recursive s3://BUCKET/PREFIX DEST`: a folder stands in for the bucket.
    "aws": (
        '[ "$1" = --version ] && { echo "aws-cli/2.27.50 Python/3.13.4 Linux/6.8.0 exe/x86_64.ubuntu.24"; exit 0; }; '
        'echo "aws $*" >> "$SHIM/log"; src="${@: -2:1}"; cp -r "$S3/${src#s3://}". "${@: -1}"'
    ),
    "python3": 'echo "python3 $*" >> "$SHIM/log"; [ "$3" = boot ] && exit "${BOOT_RC:-0}"; exit 0',
    "systemctl": 'echo "systemctl $*" >> "$SHIM/log"; case "$1" in is-active) [ -f "$SHIM/active-${@: -1}" ];; esac',
    "apt-get": 'echo "apt-get $*" >> "$SHIM/log"',
    "snap": 'echo "snap $*" >> "$SHIM/log"',
    "curl": 'echo "curl $*" >> "$SHIM/log"',
    "dpkg": 'echo "dpkg $*" >> "$SHIM/log"',
    "docker": 'echo "docker $*" >> "$SHIM/log"',
    "docker-credential-ecr-login": "exit 0",
    # what the bake adds to the Deep Learning AMI (frontier/config/host_image.py)
    "haproxy": 'echo "haproxy $*" >> "$SHIM/log"',
    "dcgmi": "exit 0",
    # the model cache: eight NVMe instance-store disks
    "lsblk": 'for i in 1 2 3 4 5 6 7 8; do echo "/dev/nvme${i}n1 Amazon EC2 NVMe Instance Storage"; done',
    "mdadm": 'echo "mdadm $*" >> "$SHIM/log"; [ "$1" = --assemble ] && exit 1; exit 0',
    "blkid": '[ -f "$SHIM/formatted" ]',
    "mkfs.xfs": 'echo "mkfs.xfs $*" >> "$SHIM/log"; touch "$SHIM/formatted"',
    "mountpoint": '[ -f "$SHIM/mounted" ]',
    "findmnt": "echo /dev/md/frontier-cache",
    "mount": 'echo "mount $*" >> "$SHIM/log"; touch "$SHIM/mounted"',
    # the Deep Learning AMI's driver, toolkit and fabric manager
    "lspci": 'for i in $(seq 1 "$(cat "$SHIM/gpus")"); do echo "0$i:00.0 3D controller: NVIDIA Corporation GH100"; done',
    "dpkg-query": "exit 1",
    "modinfo": "exit 1",
    "nvidia-smi": f"""
        case "$*" in
          -L) echo "GPU 0: NVIDIA H100 80GB HBM3";;
          -pm\\ 1) echo "nvidia-smi $*" >> "$SHIM/log"; touch "$SHIM/persistence";;
          *persistence_mode*) for i in 1 2 3 4 5 6 7 8; do [ -f "$SHIM/persistence" ] && echo Enabled || echo Disabled; done;;
          *) for i in $(seq 0 $(( $(cat "$SHIM/gpus") - 1 ))); do echo "$i, {DRIVER}"; done;;
        esac
    """,
    "nvidia-ctk": """
        [ "$1" = --version ] && { echo "NVIDIA Container Toolkit CLI version 1.17.8"; exit 0; }
        echo "nvidia-ctk $*" >> "$SHIM/log"
        for a in "$@"; do case "$a" in --config=*) echo '{"runtimes": {"nvidia": {}}}' > "${a#--config=}";; esac; done
    """,
    "nv-fabricmanager": f'echo "Fabric Manager version is : {DRIVER}"',
}
CLOUDWATCH_CTL = 'echo "amazon-cloudwatch-agent-ctl $*" >> "$SHIM/log"'


class Host:
    def __init__(self, base: Path) -> None:
        settings = load_stack("prod")
        group = settings.serving_group
        user_data = yaml.safe_load(render_cloud_init(settings, group, history_bucket=BUCKET))
        files = {f["path"]: f["content"] for f in user_data["write_files"]}
        self.script = base / "frontier-bootstrap"
        self.script.write_text(files["/usr/local/sbin/frontier-bootstrap"])
        self.shim, self.bin, self.root, self.out = base / "shim", base / "bin", base / "root", base / "out"
        for d in (self.shim, self.bin, self.root, self.out):
            d.mkdir()
        tools = base / "s3" / BUCKET / "history" / "prod" / "host" / group.name
        tools.mkdir(parents=True)
        (tools / "frontier-bootstrap.py").write_text("# the bootstrap (python3 is a shim here)\n")
        (tools / "mount-cache.sh").write_text(render_mount_cache(settings, group))
        (tools / "install-nvidia.sh").write_text(render_driver_script(settings, group))
        (tools / "cloudwatch-agent.json").write_text(
            render_cloudwatch_agent(settings, settings.serving_group)
        )
        self.s3 = base / "s3"
        for name, body in {**SHIMS, "amazon-cloudwatch-agent-ctl": CLOUDWATCH_CTL}.items():
            (self.bin / name).write_text("#!/bin/bash\n" + body.strip() + "\n")
            (self.bin / name).chmod(0o755)
        (self.shim / "gpus").write_text("8")
        (self.shim / "active-nvidia-fabricmanager").touch()

    def stock(self) -> None:
        """The Deep Learning AMI as AWS publishes it: no HAProxy, no ECR credential helper, no DCGM,
        and the AWS CLI it ships is older than the rendezvous needs."""
        for tool in ("haproxy", "docker-credential-ecr-login", "dcgmi"):
            (self.bin / tool).unlink()
        aws = (self.bin / "aws").read_text().replace("aws-cli/2.27.50", "aws-cli/2.15.30")
        (self.bin / "aws").write_text(aws)

    def run(self, **env: str) -> subprocess.CompletedProcess:
        # /opt and /var/log are private tmpfs mounts; the CloudWatch agent "is installed" there.
        inner = (
            # The real mount (a shim of that name is on PATH for the cache script); stop at once if
            # the private mounts fail, before anything could be written outside them.
            "set -e; /usr/bin/mount -t tmpfs frontier-opt /opt && /usr/bin/mount -t tmpfs frontier-log /var/log && "
            "/usr/bin/findmnt -no FSTYPE /opt | grep -qx tmpfs && set +e && "
            "mkdir -p /opt/aws/amazon-cloudwatch-agent/bin && "
            f"cp {self.bin}/amazon-cloudwatch-agent-ctl /opt/aws/amazon-cloudwatch-agent/bin/ && "
            f"bash {self.script}; rc=$?; cp /var/log/frontier-bootstrap.log {self.out}/; ls /opt/frontier/bin > {self.out}/bin; exit $rc"
        )
        environment = {
            # No sbin: this machine's own HAProxy (the local stack's balancer) must not stand in for the image's.
            "PATH": f"{self.bin}:/usr/bin:/bin",
            "SHIM": str(self.shim),
            "S3": str(self.s3),
            "FRONTIER_CACHE_ROOT": str(self.root),
            "FRONTIER_DRIVERS_ROOT": str(self.root),
            **env,
        }
        return subprocess.run(
            ["unshare", "-m", "--propagation", "private", "bash", "-c", inner],
            env=environment,
            capture_output=True,
            text=True,
            timeout=120,
        )

    def log(self) -> list[str]:
        path = self.shim / "log"
        return path.read_text().splitlines() if path.exists() else []

    def boot_log(self) -> str:
        return (self.out / "frontier-bootstrap.log").read_text()


@pytest.fixture
def host(tmp_path: Path) -> Host:
    return Host(tmp_path)


def test_a_p5_on_its_baked_image_boots_in_order_and_installs_nothing(host):
    done = host.run()
    assert done.returncode == 0, done.stderr + host.boot_log()
    log = host.log()
    steps = [
        next(i for i, line in enumerate(log) if line.startswith(prefix))
        for prefix in (
            f"aws s3 cp --quiet --recursive s3://{BUCKET}/history/prod/host/h100/",  # the host tools
            "mdadm --create",  # the NVMe cache
            "nvidia-smi -pm 1",  # the drivers checked, persistence mode on
            "amazon-cloudwatch-agent-ctl -a fetch-config",  # logs shipped
            "python3 /opt/frontier/bin/frontier-bootstrap.py boot",  # serve, then the launch hook
            "systemctl enable --now frontier-node.service",  # publish metrics, drain on scale-in
        )
    ]
    assert steps == sorted(steps)
    assert not [line for line in log if line.startswith(("apt-get", "snap", "curl", "dpkg "))]
    assert "--raid-devices=8" in next(line for line in log if line.startswith("mdadm --create"))
    assert "frontier-cache: changed=1 kind=raid0" in host.boot_log()
    assert f"frontier-drivers: changed=1 reboot_required=0 gpus=8 driver={DRIVER}" in host.boot_log()
    assert (host.out / "bin").read_text().split() == [
        "cloudwatch-agent.json",
        "frontier-bootstrap.py",
        "install-nvidia.sh",
        "mount-cache.sh",
    ]


def test_a_second_boot_changes_nothing(host):
    assert host.run().returncode == 0
    before = len(host.log())
    done = host.run()
    assert done.returncode == 0, done.stderr
    again = host.log()[before:]
    assert not [
        line
        for line in again
        if line.startswith(("mdadm --create", "mkfs.xfs", "nvidia-smi -pm", "nvidia-ctk"))
    ]
    assert "frontier-cache: changed=0" in host.boot_log()
    assert "frontier-drivers: changed=0" in host.boot_log()


def test_a_missing_gpu_abandons_the_launch_with_the_reason_and_never_serves(host):
    (host.shim / "gpus").write_text("7")
    done = host.run()
    assert done.returncode == 1
    log = host.log()
    [abandon] = [line for line in log if "frontier-bootstrap.py abandon" in line]
    assert "--reason drivers:" in abandon
    assert not [line for line in log if line.endswith("frontier-bootstrap.py boot")]
    assert "expected 8 GPU(s)" in host.boot_log()


def test_an_image_with_containerd_but_no_docker_is_abandoned_not_given_a_second_engine(host):
    (host.bin / "docker").unlink()
    (host.bin / "containerd").write_text('#!/bin/bash\necho "containerd $*" >> "$SHIM/log"\n')
    (host.bin / "containerd").chmod(0o755)
    done = host.run()
    assert done.returncode == 1
    assert not [line for line in host.log() if "docker.io" in line]  # never a second engine
    assert any("abandon --reason frontier: this image lacks docker;" in line for line in host.log())


def test_the_stock_deep_learning_ami_stops_at_its_preflight_with_one_line_and_installs_nothing(host):
    host.stock()
    started = time.monotonic()
    done = host.run()
    took = time.monotonic() - started
    assert done.returncode == 1
    assert took < 60
    [line] = [line for line in host.boot_log().splitlines() if line.startswith("frontier:")]
    assert line == (
        "frontier: this image lacks aws-cli-v2 haproxy amazon-ecr-credential-helper dcgm; network.egress is "
        "endpoints, so no package mirror is reachable: bake an image with 'fab ami.bake -s prod --group h100' "
        "and pin it in node_groups[h100].ami_id"
    )
    log = host.log()
    assert not [
        entry for entry in log if entry.startswith(("apt-get", "snap", "curl", "dpkg ", "mdadm", "nvidia"))
    ]
    # The launch is abandoned at once with that line (the AWS CLI could still fetch the tool that says so).
    [abandon] = [entry for entry in log if "frontier-bootstrap.py abandon" in entry]
    assert abandon.endswith(f"--reason {line}")
    assert not [entry for entry in log if entry.endswith("frontier-bootstrap.py boot")]
