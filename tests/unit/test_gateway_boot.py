"""A gateway host installs nothing from a package mirror at boot: its image carries what it runs.

Read on the rendered cloud-init of every shipped stack with a gateway and of the dev stack given one
(the EC2 shape): no cloud-init package module, no apt, snap, curl or wget, and no pip that reads an
index; the boot's first step is the preflight of what the image carries. The boot itself, on a stock
base and on the baked stand-in, is rehearsed in tests/e2e/test_gateway_boot_rehearsal.py.
"""

from __future__ import annotations

import re

import pytest
import yaml

from frontier import project
from frontier.config import host_image as image
from frontier.errors import FrontierError
from frontier.render.boot import (
    GATEWAY_VENV,
    gateway_lock,
    image_role,
    render_bake_script,
    render_gateway_cloud_init,
)
from frontier.targets import load_stack
from tests.gateway.stacks import dev_gateway_document, write_stack

BOOT = "/usr/local/sbin/frontier-gateway-boot"
# What reaches a package mirror or a vendor's download: none of it may run at a gateway's boot.
MIRROR_COMMANDS = re.compile(r"\b(apt-get|apt|snap|curl|wget|dpkg|easy_install)\b")


def shipped_with_gateway() -> list[str]:
    return sorted(
        path.name.removeprefix("Pulumi.").removesuffix(".yaml")
        for path in (project.root() / "stacks").glob("Pulumi.*.yaml")
        if "frontier:gateway" in yaml.safe_load(path.read_text())["config"]
    )


@pytest.fixture(scope="module")
def dev_gateway(tmp_path_factory: pytest.TempPathFactory):
    return load_stack(
        "dev", path=write_stack(tmp_path_factory.mktemp("stacks"), dev_gateway_document(), "dev")
    )


def gateway_stacks(dev_gateway) -> list:  # noqa: ANN001
    return [*(load_stack(name) for name in shipped_with_gateway()), dev_gateway]


def booted_commands(settings) -> list[str]:  # noqa: ANN001
    """Every shell line the gateway's cloud-init runs: its runcmd and the boot script it calls."""
    user_data = yaml.safe_load(
        render_gateway_cloud_init(settings, history_bucket="b", history_prefix=f"history/{settings.stack}/")
    )
    files = {f["path"]: f["content"] for f in user_data["write_files"]}
    runcmd = [" ".join(c) if isinstance(c, list) else c for c in user_data["runcmd"]]
    return [*runcmd, *files[BOOT].splitlines()]


def test_the_shipped_stacks_with_a_gateway_are_checked():
    assert shipped_with_gateway()  # eks-gateway at least: the check below reads something


def test_no_gateway_cloud_init_asks_cloud_init_for_packages(dev_gateway):
    for settings in gateway_stacks(dev_gateway):
        user_data = yaml.safe_load(
            render_gateway_cloud_init(settings, history_bucket="b", history_prefix="h/")
        )
        assert not {"packages", "package_update", "package_upgrade", "snap", "apt"} & set(user_data), (
            settings.stack
        )


def test_no_gateway_boot_runs_apt_snap_curl_or_wget(dev_gateway):
    for settings in gateway_stacks(dev_gateway):
        commands = [line for line in booted_commands(settings) if not line.lstrip().startswith("#")]
        assert [line for line in commands if MIRROR_COMMANDS.search(line)] == [], settings.stack
        assert [line for line in commands if re.search(r"https?://(?!127\.0\.0\.1)", line)] == [], (
            settings.stack
        )


def test_a_gateway_boots_pip_only_on_the_stacks_own_wheels_with_no_index(dev_gateway):
    for settings in gateway_stacks(dev_gateway):
        pips = [
            (m.group(1), line) for line in booted_commands(settings) if (m := re.search(r" pip (\w+)", line))
        ]
        assert {verb for verb, _ in pips} == {"install", "check"}, settings.stack
        for verb, line in pips:
            assert verb == "check" or (
                "--no-index" in line and "--no-deps" in line and "release/*.whl" in line
            )


def test_the_gateway_boot_starts_with_the_preflight_of_what_the_image_carries(dev_gateway):
    lines = booted_commands(dev_gateway)
    first = next(i for i, line in enumerate(lines) if "missing=()" in line)
    fetched = next(i for i, line in enumerate(lines) if "aws s3 cp" in line)
    assert first < fetched
    assert (
        "gateway hosts install nothing at boot: bake an image with 'fab ami.bake -s dev --group gateway' "
        "and pin it in gateway.ami_id" in "\n".join(lines)
    )
    for tool in ("gateway-venv", "openssl", "aws-cli-v2", "amazon-cloudwatch-agent"):
        assert f"missing+=({tool})" in "\n".join(lines)


def test_the_gateway_image_is_a_bake_role_pinned_in_gateway_ami_id(dev_gateway):
    role = image_role(dev_gateway, image.GATEWAY_IMAGE)
    assert role.field == "gateway.ami_id"
    assert role.pinned == dev_gateway.gateway.ami_id
    assert image.contents_value(role.tools) == "amazon-cloudwatch-agent,aws-cli-v2,gateway-venv,openssl"
    assert "/canonical/ubuntu/" in role.stock_parameter and not role.gpu


def test_the_gateway_bake_installs_exactly_the_locked_set_and_stamps_its_digest(dev_gateway):
    lock = gateway_lock()
    script = render_bake_script(dev_gateway, image_role(dev_gateway, "gateway"), "ami-0123456789abcdef0")
    assert f"printf '%s\\n' {' '.join(lock.pins)} > /tmp/frontier-gateway-lock.txt" in script
    assert f"{GATEWAY_VENV}/bin/pip install --quiet --no-deps --no-cache-dir -r" in script
    assert f"echo {lock.digest} > {GATEWAY_VENV}/{image.LOCK_STAMP}" in script
    assert len(script.encode()) < 16 * 1024  # EC2's user-data limit
    assert "nvidia" not in script.split('say "baking')[1].lower()  # no GPU repositories for a CPU host


def test_the_locked_set_is_the_lock_files_pins_in_order_without_hashes():
    text = (project.root() / "requirements" / "gateway.txt").read_text()
    lock = image.locked_set(text)
    assert lock.pins[0] == "annotated-types==0.8.0" and all("--hash" not in pin for pin in lock.pins)
    assert len(lock.pins) == len([line for line in text.splitlines() if re.match(r"^[A-Za-z0-9]", line)])
    assert image.locked_set(text).digest == lock.digest  # same lock, same digest
    assert image.locked_set(text.replace("anyio==4.16.0", "anyio==4.17.0")).digest != lock.digest


def test_a_lock_that_pins_nothing_is_refused():
    with pytest.raises(ValueError, match="pins no distribution"):
        image.locked_set("# only comments\n")


def test_a_bake_for_a_role_the_stack_lacks_names_its_groups_and_gateway(dev_gateway):
    with pytest.raises(FrontierError, match=r"stack 'dev' has node groups a10g and a gateway \('gateway'\)"):
        image_role(dev_gateway, "a100")
    with pytest.raises(FrontierError, match=r"stack 'prod' has node groups h100$"):
        image_role(load_stack("prod"), "gateway")


def test_a_gateway_boot_line_stays_under_the_user_data_limit(dev_gateway):
    for settings in gateway_stacks(dev_gateway):
        rendered = render_gateway_cloud_init(settings, history_bucket="b" * 63, history_prefix="history/x/")
        assert len(rendered.encode()) < 16 * 1024, settings.stack
