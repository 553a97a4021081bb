"""The deploy pointer under IAM enforcement: moto's server checks each call against the documents
``frontier/identity/`` renders (the ``account`` of test_iam_enforcement.py).

`fab`, as the deploy role, names the release it rolls and withdraws the name; a host, as the host
role, reads it through the real AWS CLI, and cannot write it: a host must not choose what the
hosts after it boot.
"""

from __future__ import annotations

import pytest
from frontier_hostside import node_boot
from frontier_hostside.aws_cli import BootError
from frontier_hostside.names import DEPLOYING_POINTER
from test_iam_enforcement import account  # noqa: F401 - the fixture

from frontier.targets.ec2.backend import name_the_release_being_rolled, withdraw_the_release_being_rolled

pytestmark = pytest.mark.slow


def test_the_deploy_role_names_the_release_being_rolled_and_the_host_role_reads_it(account):  # noqa: F811
    name_the_release_being_rolled(account.store, account.release, "deploy")
    pointer = node_boot.deploying_release(account.aws, account.config)
    assert pointer is not None and pointer["release"] == account.release.id
    withdraw_the_release_being_rolled(account.store)
    assert node_boot.deploying_release(account.aws, account.config) is None


def test_the_host_role_cannot_name_a_release_for_the_hosts_after_it(account):  # noqa: F811
    with pytest.raises(BootError, match=r"AccessDenied.*PutObject operation"):
        account.aws.put(account.store.bucket, account.store.prefix + DEPLOYING_POINTER, b"{}")
