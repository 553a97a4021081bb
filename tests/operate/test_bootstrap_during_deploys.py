"""Hosts that boot before the first deploy, and while a deploy runs: the bootstrap run for real.

The AWS CLI talks to moto's server, the host agent starts the stand-in runtime (see
test_bootstrap.py, whose fixture this reuses). A deploy names the release it rolls in the history
(``releases/deploying.json``) before it starts, with the expiry of its lock; the bootstrap of a
host that launches meanwhile serves that release, not the one being replaced. A failed deploy
withdraws the name; one whose ``fab`` died stops counting when its lock would have expired.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

import pytest
from frontier_hostside import node_boot
from frontier_hostside.aws_cli import Aws
from frontier_hostside.names import DEPLOYING_POINTER, UNIT_NAME
from test_bootstrap import AWS_CLI, BUCKET, HookedAws, boots, cloud  # noqa: F401 - fixture

from frontier.release.release import Release
from frontier.targets.ec2.backend import name_the_release_being_rolled, withdraw_the_release_being_rolled

pytestmark = pytest.mark.slow


def second_release(store, first: Release) -> Release:
    """Another release of the same wheel (a config change): what the deploy in progress rolls."""
    runtime = json.loads(first.files["runtime.yaml"]) | {"note": "the second release"}
    release = Release(first.artifact, {"runtime.yaml": json.dumps(runtime) + "\n", UNIT_NAME: "[Unit]\n"})
    store.put_release(release)
    return release


def test_a_host_launched_mid_deploy_boots_the_release_being_deployed(cloud):  # noqa: F811
    config, store, current, port, _, instance_id = cloud
    rolling = second_release(store, current)
    with store.locked(f"deploy {rolling.id}", ttl_s=3600) as lock:
        name_the_release_being_rolled(store, rolling, "deploy")
        pointer = json.loads(
            store.s3.get_object(Bucket=BUCKET, Key=store.prefix + DEPLOYING_POINTER)["Body"].read()
        )
        # It lasts as long as the deploy's lock: a dead `fab` cannot pin hosts to its release.
        assert (pointer["release"], pointer["expires"]) == (rolling.id, lock.expires)
        aws = HookedAws(config.region, "Pending:Wait")
        answer = node_boot.boot(config, aws)
    assert answer["ok"] is True, answer
    assert (answer["outcome"], answer["release"]) == ("continued", rolling.id)
    assert store.last_good()["release"] == current.id  # the history still says the old one is current
    assert node_boot.agent(config, "status")["current"] == rolling.id
    assert aws.completed == [("frontier-local-asg", "frontier-launch", instance_id, "CONTINUE")]
    [record] = boots(store)
    assert record["release"] == rolling.id


def test_after_a_failed_deploy_withdraws_its_release_hosts_boot_the_last_good_one(cloud):  # noqa: F811
    config, store, current, *_ = cloud
    rolling = second_release(store, current)
    name_the_release_being_rolled(store, rolling, "deploy")
    withdraw_the_release_being_rolled(store)
    chosen = node_boot.release_to_boot(Aws(config.region, command=AWS_CLI or "aws"), config)
    assert chosen is not None and chosen["release"] == current.id


def test_a_deploy_whose_lock_expired_no_longer_decides_what_hosts_boot(cloud):  # noqa: F811
    config, store, current, *_ = cloud
    rolling = second_release(store, current)
    with store.locked(f"deploy {rolling.id}", ttl_s=60):
        name_the_release_being_rolled(store, rolling, "deploy")
    aws = Aws(config.region, command=AWS_CLI or "aws")
    assert node_boot.deploying_release(aws, config)["release"] == rolling.id
    # Two minutes on, the lock of that deploy would have expired: its pointer is ignored.
    assert node_boot.deploying_release(aws, config, now=time.time() + 120) is None


def test_a_pointer_that_names_no_release_is_ignored(cloud):  # noqa: F811
    config, store, current, *_ = cloud
    store.s3.put_object(
        Bucket=BUCKET,
        Key=store.prefix + DEPLOYING_POINTER,
        Body=json.dumps({"release": "latest", "expires": "2999-01-01T00:00:00Z"}).encode(),
    )
    chosen = node_boot.release_to_boot(Aws(config.region, command=AWS_CLI or "aws"), config)
    assert chosen is not None and chosen["release"] == current.id


def test_a_host_with_no_release_continues_its_launch_hook_and_serves_nothing(cloud):  # noqa: F811
    config, store, _, port, _, instance_id = cloud
    for key in store._keys("records/"):
        store.s3.delete_object(Bucket=BUCKET, Key=store.prefix + key)
    aws = HookedAws(config.region, "Pending:Wait")
    answer = node_boot.boot(config, aws)
    # CONTINUE, not ABANDON: abandoning would terminate it and launch another empty host.
    assert (answer["ok"], answer["outcome"]) == (True, "empty")
    assert aws.completed == [("frontier-local-asg", "frontier-launch", instance_id, "CONTINUE")]
    # Nothing answers the readiness path: the target group's check keeps it out of service.
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/health/ready", timeout=2)
    [record] = boots(store)
    assert record["outcome"] == "empty"
