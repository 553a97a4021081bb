"""A rebalance recommendation on the local stack: the group warms a spare slot for the current release
(release staged, weights cache filled with what its start reads) while the host at risk keeps
serving, and the replacement that then launches on that slot fetches no weights.

The local stack as ``fab local.up`` brings it up, on three slots of which two serve: real sshd,
HAProxy, moto's server as S3, the real runtime on the tiny model, and per slot the IMDS stand-in with
the agent's interruption watcher polling it. ``fab spot.notice --rebalance`` posts the
recommendation as an operator would and, once host-1's watcher has recorded it, stands in for the
group's answer. What the replacement's start fetched is read from its own runtime log: the
fetcher's ``weights_ready`` line counts the files and bytes each fetch downloaded.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from frontier_hostside.interruption import read_record

from frontier.release import weights
from frontier.release.artifact import build_wheel
from frontier.rollout.deploy import deploy
from frontier.targets import backend_for, load_stack
from frontier.targets.local import cluster as local
from frontier.targets.local.group import read_state
from tests.e2e.stackcopy import write_local_stack
from tests.fab_program import fab

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def _stack(root: Path) -> Path:
    """The local stack on three slots, two in service: host-3 is the group's spare."""
    stacks = write_local_stack(root, hosts=3)
    path = stacks / "Pulumi.local.yaml"
    document = yaml.safe_load(path.read_text())
    for group in document["config"]["frontier:node_groups"]:
        group["min_size"], group["desired_size"], group["max_size"] = 1, 2, 3
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return stacks


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """The stack up, a release deployed on host-1 and host-2, its prepared weights published."""
    tmp_path = tmp_path_factory.mktemp("rebalance")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FRONTIER_STACKS_DIR", str(_stack(tmp_path)))
        mp.delenv(local.CONNECTION_ENV, raising=False)
        settings = load_stack("local")
        try:
            model_dir = tmp_path / "model"
            subprocess.run(
                [sys.executable, "-m", "frontier_runtime.tiny", "--out", str(model_dir)],
                check=True,
                capture_output=True,
            )
            local.up(settings)
            backend = backend_for(settings)
            s3 = backend.aws_client("s3")
            model = settings.model
            weights.push(s3, model_dir, model.weights_uri, model.name, model.version)
            artifact, wheel = build_wheel()
            backend.history_store().put_artifact(artifact, wheel)
            deploy(backend, artifact.digest)
            _wait_for_prepared_weights(s3, model.weights_uri, model.version)
            yield settings
        finally:
            local.down(settings)


def _wait_for_prepared_weights(s3, uri: str, version: str, timeout_s: float = 120) -> None:
    """The first start publishes its prepared weights after readiness, off the request path."""
    bucket, _, prefix = uri[len("s3://") :].partition("/")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        listed = s3.list_objects_v2(Bucket=bucket, Prefix=f"{prefix}/{version}/prepared/").get("Contents", [])
        if any(o["Key"].endswith("/manifest.json") for o in listed):
            return
        time.sleep(0.5)
    raise AssertionError(f"no prepared weights under {uri}/{version}/prepared/ after {timeout_s:g} s")


def _fetches(host_root: Path, word: str) -> list[dict]:
    """The runtime's ``weights_ready`` lines of the last ``word`` (start, prefetch) in its log."""
    sections: list[tuple[str, list[dict]]] = []
    for line in (host_root / "logs" / "runtime.log").read_text().splitlines():
        if line.startswith("=== "):
            sections.append((line.split()[2], []))
        elif line.startswith("{") and sections:
            entry = json.loads(line)
            if entry.get("event") == "weights_ready":
                sections[-1][1].append(entry)
    return next(fetched for said, fetched in reversed(sections) if said == word)


def test_a_rebalance_warms_a_spare_and_the_replacement_it_launches_fetches_no_weights(stack, capsys):
    host_1, _, spare = stack.inventory.hosts
    code, out, err = fab(capsys, "spot.notice", "--stack", "local", "--host", host_1.name, "--rebalance")
    assert code == 0, out + err
    (recorded,) = read_record(local.host_root(host_1) / "run")
    assert recorded["notice"]["kind"] == "rebalance" and not recorded["out_of_service"]
    state = read_state(stack, local.state_dir(stack))
    assert state.warm == [spare.name] and spare.name not in state.in_service  # warm, not serving
    assert host_1.name in state.in_service  # the host at risk keeps serving meanwhile
    (prefetched,) = _fetches(local.host_root(spare), "prefetch")
    assert prefetched["bytes_downloaded"] > 0  # the prepared weights, fetched on the signal

    fleet = backend_for(stack).fleet()
    (replacement,) = fleet.grow(1, stack.rollout.readiness_timeout_s + 60)
    assert replacement.name == spare.name
    started = _fetches(local.host_root(spare), "start")
    assert started and all(f["downloaded"] == 0 and f["bytes_downloaded"] == 0 for f in started)
    print(
        f"\n  e2e: rebalance on {host_1.name}: {spare.name} warmed ({prefetched['bytes_downloaded']} bytes "
        f"in {prefetched['seconds']} s on the signal); its launch downloaded 0 bytes "
        f"({len(started)} fetch(es), {sum(f['reused'] for f in started)} file(s) reused)"
    )
