"""Every AWS-touching ``fab`` task of the local stack, run as its real caller: the ``fab`` command in a
process of its own, signing as the deploy user (``iam.json``), against moto's server enforcing the
stack's IAM documents. Then the calls moto allowed are evaluated as AWS would evaluate them
(``tests/e2e/iam_simulation.py``): the unwidened documents, conditions included, with the KMS calls
AWS makes on the caller's behalf; none may be denied. Taking each statement out in turn says which
statements no recorded call needs (the report printed here, and kept in docs/infrastructure.md).

The tests run in file order on one stack: push, build, deploy, status and history, rotate under load, deploy B and
roll back, collect weights; the evaluation comes last and reads everything before it. The mutation
report also runs the EC2 stack's paths (``tests/e2e/ec2_actors.py``: auto scaling, target groups,
Instance Connect, the AMI parameters, ECR, the gateway's refresh, metering in S3, a host's boot,
logs, metrics and lifecycle action) and counts their calls with these.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import boto3
import httpx
import pytest

from frontier import project
from frontier.config.schema import Settings
from frontier.targets import load_stack
from frontier.targets.local import cluster as local
from frontier.targets.local import iam, moto_calls, services
from tests.aws_host import aws_cli
from tests.e2e import ec2_actors, iam_simulation
from tests.e2e.conftest import stack_variant
from tests.e2e.stackcopy import write_local_stack

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

RELOAD_S = 5  # the runtimes read their key set this often: the shortest interval allowed
OLD_WEIGHTS = "retired-1"  # a weights version no release names: weights.gc's to delete

# Statements no recorded call needs, with the reason each stays: the local stack's calls here and the
# EC2 stack's (tests/e2e/test_ec2_actors.py, run again by the report) together. A statement that
# stops being needed fails the report until it is removed or justified here (and in docs/demo.md's
# table).
_BACKUP = "fab restore --from backup: moto replicates nothing, so no run here has a backup copy to read"
JUSTIFIED: dict[tuple[str, str], str] = {
    # The local stack's documents are those of an EC2 stack without a gateway, whose rollout drains
    # runtimes in the ALB's target group; the EC2 paths run prod behind its gateway, which has none.
    ("deploy", "DrainAndEnableTargets"): (
        "an EC2 stack without a gateway drains its runtimes in the target group "
        "(tests/operate/test_balancer.py); the EC2 paths run prod behind its gateway"
    ),
    # A CPU start compiles no GPU kernel, so none publishes a kernel cache.
    ("host", "KeepItsCompiledKernels"): (
        "a GPU start publishes the Triton kernels it compiled (tests/runtime/server/test_kernel_cache.py "
        "puts one into S3 as a start does); no start here runs on a GPU"
    ),
    ("deploy", "ListTheBackupCopy"): _BACKUP,
    ("deploy", "ReadTheBackupCopy"): _BACKUP,
    ("deploy", "DecryptTheBackupCopy"): _BACKUP,
}


@dataclass
class Stack:
    settings: Settings
    root: Path
    model: Path
    env: dict[str, str]
    outputs: dict[str, str] = field(default_factory=dict)


def fab(stack: Stack, *args: str, env: dict[str, str] | None = None, timeout: float = 600) -> str:
    """``fab <args> -s local`` as an operator runs it; fails the test with its output if it fails."""
    done = subprocess.run(
        [str(Path(sys.executable).parent / "fab"), *args, "-s", "local"],
        cwd=project.root(),
        env={**stack.env, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, (
        f"fab {' '.join(args)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    )
    return done.stdout


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    root = tmp_path_factory.mktemp("actors")
    stacks = write_local_stack(root, hosts=2, edit={"runtime": {"api_keys_reload_s": RELOAD_S}})
    # The operator's shell: no AWS credentials or endpoint of its own; fab finds the stack's.
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_") and k != "FRONTIER_STACK"}
    env |= {"FRONTIER_STACKS_DIR": str(stacks), "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop(local.CONNECTION_ENV, None)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FRONTIER_STACKS_DIR", str(stacks))
        mp.delenv(local.CONNECTION_ENV, raising=False)
        settings = load_stack("local")
        model = root / "model"
        subprocess.run(
            [sys.executable, "-m", "frontier_runtime.tiny", "--out", str(model)],
            check=True,
            capture_output=True,
        )
        running = Stack(settings, root, model, env)
        try:
            fab(running, "local.up")  # the administrator's part, as `pulumi up` is on a cloud stack
            yield running
        finally:
            local.down(settings)


def deploy_user(stack: Stack) -> str:
    return iam.user_name(stack.settings, "deploy")


def test_fab_signs_as_the_deploy_user(stack):
    key = iam.read_keys(local.state_dir(stack.settings))["deploy"]
    sts = boto3.client(
        "sts",
        endpoint_url=local.moto_endpoint(stack.settings),
        region_name=stack.settings.region,
        **key.boto3_kwargs(),
    )
    assert sts.get_caller_identity()["Arn"].endswith(f":user/{deploy_user(stack)}")


def test_weights_push(stack):
    pushed = fab(stack, "weights.push", "--src", str(stack.model))
    assert "manifest written" in pushed
    again = fab(stack, "weights.push", "--src", str(stack.model))
    assert "uploaded 0 file(s)" in again and "manifest already in place" in again
    fab(stack, "weights.push", "--src", str(stack.model), "--version", OLD_WEIGHTS)


def test_release_build_and_deploy(stack):
    built = fab(stack, "release.build")
    digest = re.search(r"digest: (sha256:[0-9a-f]{64})", built)
    assert digest, built
    stack.outputs["digest"] = digest.group(1)
    deployed = fab(stack, "deploy", "--digest", digest.group(1))
    assert "succeeded" in deployed, deployed


def test_status_and_history(stack):
    status = fab(stack, "status")
    assert all(host.name in status for host in stack.settings.inventory.hosts), status
    history = fab(stack, "history")
    assert "deploy" in history and "succeeded" in history, history


def _first_key(stack: Stack) -> str:
    """The secret's first key, as a client that reads the secret (like the gateway) takes it."""
    admin = iam.read_keys(local.state_dir(stack.settings))["admin"]
    secrets = boto3.client(
        "secretsmanager",
        endpoint_url=local.moto_endpoint(stack.settings),
        region_name=stack.settings.region,
        **admin.boto3_kwargs(),
    )
    secret = stack.settings.pools[0].runtime.api_keys_secret
    return json.loads(secrets.get_secret_value(SecretId=secret)["SecretString"])["keys"][0]


def test_keys_rotate_under_load_moves_every_replica_and_fails_no_request(stack, capsys):
    settings = stack.settings
    before = _first_key(stack)
    assert local.api_key(settings, settings.only_pool) == before
    statuses: list[int] = []
    stop = threading.Event()
    key = [before]

    def reader() -> None:
        while not stop.is_set():
            key[0] = _first_key(stack)
            stop.wait(1.0)

    def client() -> None:
        with httpx.Client(base_url=local.balancer_url(settings), timeout=60) as http:
            while not stop.is_set():
                reply = http.post(
                    "/v1/completions",
                    json={"model": settings.pools[0].model.name, "prompt": "hello", "max_tokens": 4},
                    headers={"Authorization": f"Bearer {key[0]}"},
                )
                statuses.append(reply.status_code)
                stop.wait(0.3)

    threads = [threading.Thread(target=reader), *(threading.Thread(target=client) for _ in range(2))]
    for thread in threads:
        thread.start()
    try:
        time.sleep(1.0)  # traffic flows before the secret changes
        rotated = fab(stack, "keys.rotate", "--wait-s", "60", "--overlap-s", str(2 * RELOAD_S))
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    after = _first_key(stack)
    with capsys.disabled():
        print(
            f"\n  keys.rotate under load: {len(statuses)} requests, {sum(s != 200 for s in statuses)} failed"
        )
    assert after != before
    # The task's own table: each replica served the set with the new key, then the set without the old.
    for step in ("new key served", "old key refused"):
        rows = [line for line in rotated.splitlines() if step in line]
        for host in settings.inventory.hosts:
            assert any(host.name in row for row in rows), (step, host.name, rotated)
    assert "1 old key(s) retired" in rotated
    assert len(statuses) >= 10 and [s for s in statuses if s != 200] == []
    # The local stack's client copy (demo, loadtest) follows the rotation.
    assert local.api_key(settings, settings.only_pool) == after
    assert "client copy of the new key" in rotated


def test_deploy_b_and_roll_back(stack):
    variant = stack_variant(stack.settings, "b", "runtime.batch", window_ms=10)
    deployed = fab(
        stack,
        "deploy",
        "--digest",
        stack.outputs["digest"],
        env={"FRONTIER_STACKS_DIR": str(Path(variant.source).parent)},
    )
    stack.outputs["release_b"] = _rolled(deployed, "deploy")
    rolled = fab(stack, "rollback")
    assert "succeeded" in rolled, rolled
    stack.outputs["release_a"] = _rolled(rolled, "rollback")


def _rolled(output: str, kind: str) -> str:
    """The release a deploy or rollback's summary says it rolled, successfully."""
    found = re.search(rf"{kind} (r-[0-9a-f]+): succeeded", output)
    assert found, output
    return found.group(1)


def _keys(s3, bucket: str, prefix: str) -> list[str]:
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    return sorted(obj["Key"] for page in pages for obj in page.get("Contents", []))


def test_restore_drill_history_deleted_restored_and_rolled_back(stack):
    """The history prefix deleted (a delete marker per key, as `aws s3 rm --recursive` leaves in a
    versioned bucket), `fab restore` brings it back from the object versions, and `fab rollback`
    then rolls the release before the current one and the hosts serve it."""
    admin = iam.read_keys(local.state_dir(stack.settings))["admin"]
    s3 = boto3.client(
        "s3",
        endpoint_url=local.moto_endpoint(stack.settings),
        region_name=stack.settings.region,
        **admin.boto3_kwargs(),
    )
    bucket, prefix = local.history_bucket(stack.settings), local.history_prefix(stack.settings)
    keys = _keys(s3, bucket, prefix)
    assert any("/records/" in k for k in keys) and any("/artifacts/" in k for k in keys), keys
    for start in range(0, len(keys), 1000):
        s3.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": k} for k in keys[start : start + 1000]]})
    assert "deploy" not in fab(stack, "history")

    restored = fab(stack, "restore")
    assert "0 newer" in restored and set(keys) <= set(_keys(s3, bucket, prefix)), restored
    again = fab(stack, "restore")
    assert "0 restored" in again and "nothing to do" in again, again
    history = fab(stack, "history")
    assert stack.outputs["release_a"] in history and stack.outputs["release_b"] in history, history

    rolled = fab(stack, "rollback")
    assert _rolled(rolled, "rollback") == stack.outputs["release_b"], rolled
    status = fab(stack, "status")
    for host in stack.settings.inventory.hosts:
        row = next(line for line in status.splitlines() if host.name in line)
        assert stack.outputs["release_b"] in row.split(host.address, 1)[1][:40], status


def test_weights_gc_deletes_the_version_no_release_needs(stack):
    planned = fab(stack, "weights.gc", "--keep-last", "0", "--dry-run")
    assert OLD_WEIGHTS in planned and "would delete" in planned, planned
    collected = fab(stack, "weights.gc", "--keep-last", "0")
    assert "deleted 1 version(s)" in collected and OLD_WEIGHTS in collected, collected


def test_scale_holds_the_slots_within_the_group(stack):
    hosts = len(stack.settings.inventory.hosts)
    scaled = fab(stack, "scale", "--replicas", str(hosts))
    assert f"-> {hosts}" in scaled, scaled


# --- what AWS would have said ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def evaluation(stack):
    path = services.call_log(local.state_dir(stack.settings))
    # Kept beside the test's stack (the state dir goes with local.down) for a failure's reading.
    (stack.root / path.name).write_bytes(path.read_bytes())
    return iam_simulation.evaluate(stack.settings, moto_calls.read(path))


def test_every_recorded_call_is_allowed_by_the_unwidened_documents(stack, evaluation, capsys):
    actors = {call.principal.rsplit("-", 1)[-1] for call in evaluation.calls}
    with capsys.disabled():
        print(
            f"\n  iam-simulate: {len(evaluation.calls)} distinct calls of {sorted(actors)}, "
            f"{len(evaluation.denied)} denied"
        )
        for call, decision in evaluation.denied:
            print(f"    DENIED {call.describe()} ({decision['decision']}, {call.operation})")
    # The deploy user's calls are the tasks'; the host user's are the slots' bootstraps and runtimes.
    assert {"deploy", "host"} <= actors
    assert evaluation.denied == []


@pytest.fixture(scope="module")
def ec2_evaluation(tmp_path_factory):
    """The EC2 stack's paths, run as their actors against moto enforcing prod's documents."""
    prod, log, _ = ec2_actors.exercise(tmp_path_factory.mktemp("ec2-actors"), aws_cli())
    return ec2_actors.evaluate(prod, log)


def test_mutation_report_every_statement_is_needed_by_a_recorded_call(evaluation, ec2_evaluation, capsys):
    assert ec2_evaluation.denied == []
    needed = iam_simulation.needed_across(evaluation, ec2_evaluation)
    local_calls = {(s.actor, s.sid): len(calls) for s, calls in evaluation.needed_by.items()}
    ec2_calls = {(s.actor, s.sid): len(calls) for s, calls in ec2_evaluation.needed_by.items()}
    with capsys.disabled():
        print("\n  statement taken out                        local  ec2  denied calls, e.g. / why it stays")
        for (actor, sid), calls in needed.items():
            why = ", ".join(sorted({c.operation for c in calls})[:3]) or JUSTIFIED.get(
                (actor, sid), "NOT NEEDED BY ANY RECORDED CALL"
            )
            counts = f"{local_calls.get((actor, sid), '-'):>5} {ec2_calls.get((actor, sid), '-'):>4}"
            print(f"  {actor:7} {sid:34} {counts}  {why}")
    unneeded = {key for key, calls in needed.items() if not calls}
    assert unneeded == set(JUSTIFIED), sorted(unneeded)
