"""A gateway host boots as a stock host does: in a container from a stock base, with no network.

The base is Debian's minbase (``scripts/build-debian-base.sh``), as for the runtime hosts
(tests/e2e/test_host_boot_rehearsal.py, whose shims and builder this reuses). Every container runs
with ``--network none``: a gateway's boot must not need a package mirror, whatever the stack's egress.
cloud-init is played by its two modules the gateway's user data uses: ``write_files`` (each file
written with its permissions) and ``runcmd`` (run in order by bash).

* On the stock base the rendered boot stops at its preflight with one line naming what the image
  lacks and the bake command, and fetches and installs nothing.
* ``fab ami.bake --group gateway`` (:func:`frontier.targets.ec2.bake.bake`) runs against moto, its
  builder a container of that base running the rendered bake script as its user data. The Python
  package index is a wheelhouse of the lock's exact wheels, downloaded once from PyPI on this
  machine and handed to the builder's pip as its only index (``PIP_NO_INDEX``, ``PIP_FIND_LINKS``),
  so the locked set is installed for real into the image's virtual environment; the AWS CLI and
  CloudWatch agent downloads are the runtime rehearsal's recorded shims. The container, committed,
  is the baked image: on it the same boot passes its preflight, takes the wheels and gateway.yaml
  from the stack's bucket (a folder here, served by a stand-in ``aws s3 cp``), installs them with no
  index, and the gateway starts as its unit's ``ExecStart`` runs it, answering its liveness path
  over TLS with the certificate the boot made.

What needs a real account: Ubuntu's python3-venv and openssl, the real AWS CLI and agent, and an
instance of the image behind the load balancer.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import boto3
import pytest
import yaml
from frontier_settings import to_yaml

from frontier.access.gateway import build_gateway_wheels
from frontier.config import host_image as image
from frontier.render.boot import gateway_lock, image_role, render_gateway_cloud_init
from frontier.targets import load_stack
from frontier.targets.ec2.bake import BakeRequest, bake
from tests.e2e.test_host_boot_rehearsal import PATH, PODMAN, Builder, account, aws_in_process, base, record
from tests.gateway.harness import gateway_config, tenant
from tests.gateway.stacks import dev_gateway_document, write_stack

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

__all__ = ["account", "aws_in_process", "base", "record"]  # the fixtures this module borrows

KEY = "sk-acme-0123456789"
HISTORY_PREFIX = "history/dev/"
# `aws s3 cp --recursive s3://BUCKET/KEY DEST`, from the bucket's folder under /record/bucket; every
# other call goes to the image's own CLI (none on the stock base).
AWS_STAND_IN = """#!/bin/bash
if [ "$1" = s3 ]; then
  echo "aws $*" >> /record/log
  args=(); for a in "$@"; do case "$a" in --*) ;; *) args+=("$a");; esac; done
  src=${args[2]#s3://}; mkdir -p "${args[3]}"; cp -r "/record/bucket/${src}." "${args[3]}"
  exit 0
fi
[ -x /usr/local/bin/aws ] || exit 127
exec /usr/local/bin/aws "$@"
"""


@pytest.fixture(scope="module")
def settings(tmp_path_factory: pytest.TempPathFactory):
    """The dev stack with a gateway: the EC2 shape a gateway's group boots."""
    return load_stack(
        "dev", path=write_stack(tmp_path_factory.mktemp("stacks"), dev_gateway_document(), "dev")
    )


@pytest.fixture(scope="module")
def wheelhouse() -> Path:
    """The lock's wheels, exactly its pins: the builder's package index (made once per lock)."""
    lock = gateway_lock()
    folder = Path("/var/tmp/frontier-gateway-wheels") / lock.digest.removeprefix("sha256:")[:16]
    if not (folder / ".complete").exists():
        pins = folder.with_suffix(".txt")
        folder.mkdir(parents=True, exist_ok=True)
        pins.write_text("\n".join(lock.pins) + "\n")
        done = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
             "-r", str(pins), "-d", str(folder)],
            capture_output=True, text=True, timeout=900,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-2000:]
        (folder / ".complete").touch()
    return folder


def cloud_init(user_data: str, record: Path) -> str:
    """cloud-init's ``write_files`` and ``runcmd`` for this user data, as one bash script."""
    document = yaml.safe_load(user_data)
    files = record / "files"
    files.mkdir(exist_ok=True)
    lines = ["set -e"]
    for index, entry in enumerate(document["write_files"]):
        (files / str(index)).write_text(entry["content"])
        lines.append(
            f"install -D -m {entry['permissions']} /record/files/{index} {shlex.quote(entry['path'])}"
        )
    lines.append("set +e")
    for command in document["runcmd"]:
        lines.append(shlex.join(command) if isinstance(command, list) else command)
        lines.append('rc=$?; [ "$rc" -eq 0 ] || exit "$rc"')
    return "\n".join(lines) + "\n"


def boot(on: str, record: Path, settings, then: str = "") -> subprocess.CompletedProcess:  # noqa: ANN001
    """The gateway's user data on image ``on`` (no network), then ``then`` in the same container."""
    user_data = render_gateway_cloud_init(
        settings, history_bucket="frontier-dev-history", history_prefix=HISTORY_PREFIX
    )
    (record / "cloud-init").write_text(cloud_init(user_data, record))
    (record / "then").write_text(then)
    (record / "shim" / "aws").write_text(AWS_STAND_IN)
    (record / "shim" / "aws").chmod(0o755)
    return subprocess.run(
        [*PODMAN, "--rm", "-v", f"{record}:/record", "-v", f"{record / 'shim'}:/shim", "-e", f"PATH={PATH}",
         on, "bash", "-c", "bash /record/cloud-init && bash /record/then"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def test_the_stock_base_stops_at_the_gateways_preflight_with_one_line(base, record, settings):
    done = boot(base, record, settings)
    assert done.returncode == 1
    lines = [line for line in done.stdout.splitlines() if line.startswith("frontier:")]
    # The base carries openssl (ca-certificates needs it): the rest of what a gateway runs it lacks.
    assert lines == [
        "frontier: this image lacks gateway-venv aws-cli-v2 amazon-cloudwatch-agent; gateway hosts install "
        "nothing at boot: bake an image with 'fab ami.bake -s dev --group gateway' and pin it in gateway.ami_id"
    ]
    assert (record / "log").read_text() == ""  # nothing fetched, nothing installed


def published(record: Path, tmp_path: Path) -> None:
    """What `fab gateway.publish` leaves in the bucket: the two wheels and a gateway.yaml."""
    folder = record / "bucket" / "frontier-dev-history" / HISTORY_PREFIX / "gateway"
    folder.mkdir(parents=True)
    for wheel in build_gateway_wheels(tmp_path / "wheels"):
        (folder / wheel.name).write_bytes(wheel.read_bytes())
    config = gateway_config(
        {"model-a": ["http://127.0.0.1:9"]},
        [tenant("acme", KEY, ["model-a"])],
        Path("/opt/frontier-gateway/metering.jsonl"),
    )
    (folder / "gateway.yaml").write_text(to_yaml(config))


def started(unit: str) -> str:
    """The unit's ExecStart run as its user, and its liveness asked over TLS from the host itself."""
    command = next(line.split("=", 1)[1] for line in unit.splitlines() if line.startswith("ExecStart="))
    probe = (
        "import httpx, time\n"
        "for _ in range(300):\n"
        "    try:\n"
        "        r = httpx.get('https://127.0.0.1:8090/health/live', verify=False, timeout=1)\n"
        "        print('gateway answered', r.status_code); break\n"
        "    except httpx.TransportError:\n"
        "        time.sleep(0.2)\n"
        "else:\n"
        "    print('gateway never answered')\n"
    )
    return (
        f"cd /opt/frontier-gateway && runuser -u frontier -- {command} >/tmp/gateway.out 2>&1 &\n"
        f"/opt/frontier-gateway/venv/bin/python -c {shlex.quote(probe)}\n"
        "kill %1 2>/dev/null; tail -n 5 /tmp/gateway.out\n"
    )


def test_the_gateway_bake_makes_an_image_on_which_the_boot_installs_nothing_and_starts_the_gateway(
    base, record, account, settings, wheelhouse, tmp_path
):
    ec2, subnet, source = account
    wheels = record / "wheels"
    wheels.mkdir()
    for wheel in wheelhouse.glob("*.whl"):
        (wheels / wheel.name).write_bytes(wheel.read_bytes())
    builder = Builder(ec2, base, record, PIP_NO_INDEX="1", PIP_FIND_LINKS="/record/wheels")
    role = image_role(settings, image.GATEWAY_IMAGE)
    request = BakeRequest(settings, role, subnet, source_image=source, poll_s=0)
    baked = bake(ec2, boto3.client("ssm", region_name="us-east-1"), request, builder.say, builder.console)

    contents = image.contents_value(role.tools)
    assert f"frontier-bake: ok {contents}" in builder.consoles[baked.builder], builder.consoles[
        baked.builder
    ][-3000:]
    assert baked.field == "gateway.ami_id"
    [made] = ec2.describe_images(ImageIds=[baked.image_id])["Images"]
    assert {t["Key"]: t["Value"] for t in made["Tags"]}[image.CONTENTS_TAG] == contents

    (record / "log").write_text("")
    published(record, tmp_path)
    user_data = yaml.safe_load(
        render_gateway_cloud_init(
            settings, history_bucket="frontier-dev-history", history_prefix=HISTORY_PREFIX
        )
    )
    unit = {f["path"]: f["content"] for f in user_data["write_files"]}[
        "/etc/systemd/system/frontier-gateway.service"
    ]
    try:
        done = boot(builder.images[baked.builder], record, settings, then=started(unit))
    finally:
        subprocess.run(["podman", "rmi", "-f", builder.images[baked.builder]], capture_output=True)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert "this image lacks" not in done.stdout
    assert "gateway answered 200" in done.stdout, (done.stdout + done.stderr)[-3000:]
    calls = (record / "log").read_text().splitlines()
    assert (
        f"aws s3 cp --quiet --recursive s3://frontier-dev-history/{HISTORY_PREFIX}gateway/ /opt/frontier-gateway/release/"
        in calls
    )
    assert "systemctl enable --now frontier-gateway.service" in calls
    # Nothing from a mirror: no apt, curl or dpkg ran at boot (the shims would have recorded them).
    assert not [c for c in calls if c.split()[0] in ("apt-get", "curl", "dpkg", "gpg", "unzip")]
