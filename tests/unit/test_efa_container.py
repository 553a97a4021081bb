"""A replica that talks over EFA gets it inside its container: the group's devices and libfabric's
efa provider (the image carries libfabric and the OFI NCCL plugin); other groups get neither."""

from __future__ import annotations

import re

from frontier import project
from frontier.config.hardware import uses_efa
from frontier.render.host import render_systemd_unit
from frontier.targets import load_stack

DIGEST = "sha256:" + "a" * 64


def unit_of(stack: str) -> str:
    settings = load_stack(stack)
    return render_systemd_unit(settings, settings.pools[0], DIGEST)


def test_a_multinode_replicas_container_gets_the_efa_devices_and_provider():
    settings = load_stack("prod-multinode")
    assert uses_efa(settings.pools[0].group, [settings.pools[0].runtime])
    unit = unit_of("prod-multinode")
    assert "--device /dev/infiniband \\" in unit and "--env FI_PROVIDER=efa \\" in unit


def test_a_single_node_replicas_container_gets_neither():
    unit = unit_of("prod")
    assert "/dev/infiniband" not in unit and "FI_PROVIDER" not in unit


def test_a_cpu_hosts_container_gets_neither_even_where_the_group_asks_for_efa():
    settings = load_stack("local")
    pool = settings.pools[0]
    pool = pool.model_copy(update={"group": pool.group.model_copy(update={"efa": True})})
    assert "/dev/infiniband" not in render_systemd_unit(settings, pool, DIGEST)


def test_the_image_installs_a_pinned_efa_userspace_and_the_cpu_variant_none():
    dockerfile = (project.root() / "runtime" / "Dockerfile").read_text()
    [version] = re.findall(r"^ARG EFA_INSTALLER_VERSION=(\S+)$", dockerfile, re.M)
    assert re.fullmatch(r"\d+\.\d+\.\d+", version)  # a release, never "latest"
    assert "efa_installer.sh -y -g --skip-kmod --skip-limit-conf --no-verify" in dockerfile
    assert "/opt/amazon/ofi-nccl/lib" in dockerfile
    image_test = (project.root() / "tests" / "e2e" / "test_runtime_image.py").read_text()
    assert '"EFA_INSTALLER_VERSION": ""' in image_test
