"""Reading a cloud stack's saved Pulumi outputs into its target's model."""

from __future__ import annotations

import json
import re

import pytest

from frontier.errors import FrontierError
from frontier.targets import backend_for, load_stack


def rewrite(path, change) -> None:
    document = json.loads(path.read_text())
    change(document)
    path.write_text(json.dumps(document))


def test_outputs_saved_without_one_the_target_exports_fail_naming_it_and_how_to_save_them_again(
    saved_outputs,
):
    prod = load_stack("prod")
    saved_outputs.ec2(prod)
    rewrite(saved_outputs.path, lambda outputs: outputs.pop("endpoint"))
    with pytest.raises(
        FrontierError, match=r"\(endpoint: Field required\).*`pulumi stack output --json -s prod >"
    ):
        backend_for(prod).endpoint()


def test_outputs_this_toolkit_does_not_know_are_ignored(saved_outputs):
    prod = load_stack("prod")
    saved = saved_outputs.ec2(prod)
    rewrite(saved_outputs.path, lambda outputs: outputs.update(waf_acl_arn="arn:aws:wafv2:acl"))
    assert backend_for(prod).endpoint() == saved.endpoint


def test_outputs_that_are_not_a_json_object_fail_naming_the_file(saved_outputs):
    prod = load_stack("prod")
    saved_outputs.ec2(prod)
    saved_outputs.path.write_text('["not", "outputs"]')
    with pytest.raises(
        FrontierError,
        match=rf"{re.escape(str(saved_outputs.path))}: the saved outputs of stack 'prod' are not",
    ):
        backend_for(prod).endpoint()


def test_a_stack_without_a_bastion_may_leave_its_bastion_group_out(saved_outputs):
    dev = load_stack("dev")
    saved_outputs.ec2(dev, host_access="ssm", bastion_security_group_id=None)
    rewrite(saved_outputs.path, lambda outputs: outputs.pop("bastion_security_group_id"))
    assert backend_for(dev).outputs().bastion_security_group_id is None
