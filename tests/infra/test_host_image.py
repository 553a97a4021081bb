"""The image a node group pins must carry what its hosts run when its network reaches no mirror.

A stock AMI (AWS's Deep Learning AMI, Canonical's Ubuntu) lacks HAProxy and the ECR credential
helper, among others; with ``network.egress: endpoints`` a host cannot install them at boot. The
program refuses such a stack before any instance launches, naming what is missing and the bake
command, instead of letting the group relaunch hosts that stop at their preflight.
"""

from __future__ import annotations

import pytest
from infra_mocks import run_program

from frontier.config import host_image as image
from frontier.targets import load_stack
from infra.errors import ProvisionError
from tests.infra.cloud_mocks import BAKED_TOOLS, HOST_TOOLS_TAG


def test_the_mocks_baked_images_carry_exactly_what_the_bake_installs() -> None:
    assert HOST_TOOLS_TAG == image.CONTENTS_TAG
    assert image.contents_value(image.TOOLS) == BAKED_TOOLS


def test_the_accounts_own_images_are_looked_up_beside_amazons_and_canonicals(prod) -> None:
    [lookup] = [args for token, args in prod.invokes if token == "aws:ec2/getAmi:getAmi"]
    assert lookup["owners"] == ["self", "amazon", "099720109477"]


def test_a_stock_image_on_a_closed_network_is_refused_before_any_host_launches() -> None:
    settings = load_stack("prod")
    group = settings.node_groups[0]
    with pytest.raises(ProvisionError) as refused:
        run_program(settings, stock_images=(group.ami_id,))
    message = str(refused.value)
    assert f"node_groups[0].ami_id = '{group.ami_id}': a stock image (no frontier:host-tools tag)" in message
    for tool in ("haproxy", "amazon-ecr-credential-helper", "aws-cli-v2", "nvidia-driver"):
        assert tool in message
    assert f"`fab ami.bake -s prod --group {group.name}`" in message


def test_a_stock_image_is_accepted_where_hosts_may_install_from_the_internet() -> None:
    settings = load_stack("prod")
    group = settings.node_groups[0]
    opened = settings.model_copy(
        update={"network": settings.network.model_copy(update={"egress": "internet"})}
    )
    graph = run_program(opened, stock_images=(group.ami_id,))
    assert graph.of_type("aws:autoscaling/group:Group")


def test_an_image_baked_for_another_kind_of_host_names_what_it_lacks() -> None:
    gpu = load_stack("prod").node_groups[0]
    assert image.missing_from("docker,aws-cli-v2,haproxy", image.needs(gpu, multi_node=False)) == [
        "amazon-ecr-credential-helper",
        "amazon-cloudwatch-agent",
        "nvidia-driver",
        "nvidia-container-toolkit",
        "dcgm",
    ]
    without_efa = BAKED_TOOLS.replace(",efa", "")
    assert image.missing_from(without_efa, image.needs(gpu, multi_node=True)) == ["efa"]
    assert image.missing_from(without_efa, image.needs(gpu, multi_node=False)) == []
