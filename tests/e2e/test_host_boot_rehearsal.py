"""A host boots as a stock host does: in a container from a stock base, on a network that is cut.

The base is Debian's minbase (``scripts/build-debian-base.sh``), which carries none of what a host
runs: no docker, no AWS CLI, no HAProxy. Every container here runs with ``--network none``, what
``network.egress: endpoints`` leaves a host of a package mirror.

* The prod stack's rendered bootstrap on the stock base stops at its preflight within a minute with
  one line that names what is missing and the bake command, and installs nothing.
* ``fab ami.bake``'s sequence (:func:`frontier.targets.ec2.bake.bake`) runs against moto, its builder
  instance played by a container of that base running the rendered bake script as the instance's
  user data. The mirror and vendor downloads are shims (recorded, and "installing" a command the
  way the package would); everything else is the real script in a real Debian. The container is
  committed as the image the bake makes, and the same bootstrap on it passes its preflight and goes on
  to fetch its host tools.

What needs a real account: the packages' names and versions on Ubuntu and NVIDIA's repositories, the
driver's DKMS build, and the AMI itself.
"""

from __future__ import annotations

import base64
import subprocess
import time
from pathlib import Path

import boto3
import pytest
import yaml

from frontier.config import host_image as image
from frontier.render.boot import host_tools, image_role, render_cloud_init
from frontier.targets import load_stack
from frontier.targets.ec2.bake import BakeError, BakeRequest, bake

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
PODMAN = [
    "podman", "--runtime", "runc", "--cgroup-manager=cgroupfs", "run",
    "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1000:1000", "--network", "none",
]  # fmt: skip
PATH = "/shim:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# What each package "installs": the command (or file) that the host's preflight looks for.
PROVIDES = {
    "docker.io": "/usr/local/bin/docker",
    "haproxy": "/usr/local/sbin/haproxy",
    "amazon-ecr-credential-helper": "/usr/local/bin/docker-credential-ecr-login",
    "nvidia-driver-*": "/usr/local/bin/nvidia-smi",
    "nvidia-container-toolkit=*": "/usr/local/bin/nvidia-ctk",
    "datacenter-gpu-manager": "/usr/local/bin/dcgmi",
}
RECORD = 'echo "$(basename "$0") $*" >> /record/log'
SHIMS = {
    "apt-get": RECORD
    + """
[ "$1" = install ] || exit 0
for pkg in "$@"; do
  case "$pkg" in -*|install) continue;; esac
  [ "$pkg" = "${FAIL_PACKAGE:-}" ] && { echo "E: Unable to locate package $pkg" >&2; exit 100; }
  case "$pkg" in
"""
    + "".join(
        f"    {pattern}) mkdir -p \"$(dirname {path})\"; printf '#!/bin/sh\\nexit 0\\n' > {path}; chmod +x {path};;\n"
        for pattern, path in PROVIDES.items()
    )
    + """  esac
done
""",
    "curl": RECORD + '\nwhile [ $# -gt 0 ]; do [ "$1" = -o ] && { touch "$2"; shift; }; shift; done',
    "gpg": RECORD + '\nwhile [ $# -gt 0 ]; do [ "$1" = -o ] && { touch "$2"; shift; }; shift; done',
    "dpkg": RECORD
    + """
case "$1" in
  -s) exit 1;;
  --print-architecture) echo amd64;;
  -i) case "$*" in *cwagent.deb*)
        mkdir -p /opt/aws/amazon-cloudwatch-agent/bin
        printf '#!/bin/sh\\nexit 0\\n' > /opt/aws/amazon-cloudwatch-agent/bin/amazon-cloudwatch-agent-ctl
        chmod +x /opt/aws/amazon-cloudwatch-agent/bin/amazon-cloudwatch-agent-ctl;;
      esac;;
esac""",
    # AWS's installer zip: ./aws/install puts a v2 CLI on PATH (one that records what it is asked).
    "unzip": RECORD
    + """
mkdir -p aws
cat > aws/install <<'EOF'
#!/bin/sh
cat > /usr/local/bin/aws <<'CLI'
#!/bin/sh
[ "$1" = --version ] && { echo "aws-cli/2.27.50 Python/3.13.4 Linux/6.8.0 exe/x86_64.ubuntu.24"; exit 0; }
echo "aws $*" >> /record/log
CLI
chmod +x /usr/local/bin/aws
EOF
chmod +x aws/install""",
    "systemctl": RECORD,
    "poweroff": RECORD,
    "cloud-init": RECORD,
}


@pytest.fixture(scope="module")
def base() -> str:
    done = subprocess.run(
        ["bash", str(REPO / "scripts" / "build-debian-base.sh")], capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip().splitlines()[-1]


@pytest.fixture
def record(tmp_path: Path) -> Path:
    """/record in the containers: the shims' log, and the scripts they run."""
    shims = tmp_path / "shim"
    shims.mkdir()
    for name, body in SHIMS.items():
        (shims / name).write_text("#!/bin/bash\n" + body.strip() + "\n")
        (shims / name).chmod(0o755)
    (tmp_path / "log").touch()
    return tmp_path


def bootstrap_script(settings) -> str:  # noqa: ANN001
    group = settings.node_groups[0]
    user_data = yaml.safe_load(render_cloud_init(settings, group, history_bucket="frontier-prod-history"))
    return {f["path"]: f["content"] for f in user_data["write_files"]}["/usr/local/sbin/frontier-bootstrap"]


def boot(on: str, record: Path) -> tuple[subprocess.CompletedProcess, str, float]:
    (record / "bootstrap").write_text(bootstrap_script(load_stack("prod")))
    started = time.monotonic()
    done = subprocess.run(
        [*PODMAN, "--rm", "-v", f"{record}:/record", on, "bash", "-c",
         "bash /record/bootstrap; rc=$?; cat /var/log/frontier-bootstrap.log; exit $rc"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    return done, done.stdout, time.monotonic() - started


def test_the_stock_base_stops_at_its_preflight_within_a_minute_with_one_line(base, record):
    done, log, took = boot(base, record)
    assert done.returncode == 1
    assert took < 60
    lines = [line for line in log.splitlines() if line.startswith("frontier:")]
    assert lines == [
        "frontier: this image lacks docker aws-cli-v2 haproxy amazon-ecr-credential-helper amazon-cloudwatch-agent "
        "nvidia-driver nvidia-container-toolkit dcgm; network.egress is endpoints, so no package mirror is "
        "reachable: bake an image with 'fab ami.bake -s prod --group h100' and pin it in node_groups[h100].ami_id"
    ]
    assert (record / "log").read_text() == ""  # nothing fetched, nothing installed


class Builder:
    """The bake's builder instance: the instance's user data run in a container of the stock base."""

    def __init__(self, ec2, base: str, record: Path, **env: str) -> None:  # noqa: ANN001
        self.ec2, self.base, self.record, self.env = ec2, base, record, env
        self.consoles: dict[str, str] = {}
        self.images: dict[str, str] = {}

    def say(self, line: str) -> None:
        """The bake's progress: on the first "running", the instance runs its user data, then stops."""
        if not line.endswith(": running") or self.consoles:
            return
        instance = line.split()[1].rstrip(":")
        user_data = self.ec2.describe_instance_attribute(InstanceId=instance, Attribute="userData")
        (self.record / "user-data").write_text(base64.b64decode(user_data["UserData"]["Value"]).decode())
        env = [arg for key, value in self.env.items() for arg in ("-e", f"{key}={value}")]
        done = subprocess.run(
            [*PODMAN, "--name", f"bake-{instance}", "-v", f"{self.record}:/record", *env,
             "-e", f"PATH={PATH}", "-v", f"{self.record / 'shim'}:/shim", self.base, "bash", "/record/user-data"],
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        self.consoles[instance] = done.stdout + done.stderr
        if done.returncode == 0:
            self.images[instance] = f"localhost/frontier-baked:{instance}"
            subprocess.run(["podman", "commit", "-q", f"bake-{instance}", self.images[instance]], check=True)
        subprocess.run(["podman", "rm", "-f", f"bake-{instance}"], capture_output=True)
        self.ec2.stop_instances(InstanceIds=[instance])

    def console(self, _ec2, instance: str) -> str:  # noqa: ANN001
        return self.consoles[instance]


@pytest.fixture
def account(aws_in_process):  # noqa: ANN001
    ec2 = boto3.client("ec2", region_name="us-east-1")
    vpc = ec2.create_vpc(CidrBlock="10.99.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.99.0.0/24")["Subnet"]["SubnetId"]
    source = ec2.register_image(Name="deep-learning-base", RootDeviceName="/dev/sda1")["ImageId"]
    return ec2, subnet, source


@pytest.fixture
def aws_in_process(monkeypatch):  # noqa: ANN001
    from moto import mock_aws

    monkeypatch.setenv("MOTO_EC2_LOAD_DEFAULT_AMIS", "false")
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    with mock_aws():
        yield


def test_the_bake_makes_an_image_that_boots_past_its_preflight(base, record, account):
    ec2, subnet, source = account
    settings = load_stack("prod")
    group = settings.node_groups[0]
    builder = Builder(ec2, base, record)
    request = BakeRequest(settings, image_role(settings, group.name), subnet, source_image=source, poll_s=0)
    baked = bake(ec2, boto3.client("ssm", region_name="us-east-1"), request, builder.say, builder.console)

    contents = image.contents_value(host_tools(settings, group))
    assert baked.contents == contents
    assert f"frontier-bake: ok {contents}" in builder.consoles[baked.builder]
    [made] = ec2.describe_images(ImageIds=[baked.image_id])["Images"]
    tags = {t["Key"]: t["Value"] for t in made["Tags"]}
    assert tags[image.CONTENTS_TAG] == contents
    assert tags["frontier:source-image"] == source
    [reservation] = ec2.describe_instances(InstanceIds=[baked.builder])["Reservations"]
    assert reservation["Instances"][0]["State"]["Name"] == "terminated"

    (record / "log").write_text("")
    done, log, _ = boot(builder.images[baked.builder], record)
    assert "this image lacks" not in log
    assert (
        "aws s3 cp --quiet --recursive s3://frontier-prod-history/history/prod/host/h100/"
        in (record / "log").read_text()
    )
    subprocess.run(["podman", "rmi", "-f", builder.images[baked.builder]], capture_output=True)


def test_a_failed_install_ends_the_bake_with_its_step_and_leaves_no_builder_and_no_image(
    base, record, account
):
    ec2, subnet, source = account
    settings = load_stack("prod")
    builder = Builder(ec2, base, record, FAIL_PACKAGE="haproxy")
    request = BakeRequest(settings, image_role(settings, None), subnet, source_image=source, poll_s=0)
    with pytest.raises(BakeError, match=r"did not finish the bake: failed: haproxy: step 1 of its install"):
        bake(ec2, boto3.client("ssm", region_name="us-east-1"), request, builder.say, builder.console)
    assert [i["ImageId"] for i in ec2.describe_images(Owners=["self"])["Images"]] == [source]  # none baked
    reservations = ec2.describe_instances()["Reservations"]
    assert {r["Instances"][0]["State"]["Name"] for r in reservations} == {"terminated"}
