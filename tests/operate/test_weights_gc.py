"""weights.gc against moto's S3 server: versions a kept release needs and the last N pushed stay,
the rest go (manifest first), a dry run deletes nothing, and deleting what a kept release needs
is refused, naming the release. On a host, pruning releases evicts the cached versions (fetched by
the runtime's own fetcher) that no release left there names."""

from __future__ import annotations

import datetime as dt
import fcntl
import json
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest
import yaml
from frontier_hostside.agent import Agent, AgentConfig
from frontier_runtime.config import parse_config
from frontier_runtime.storage.weights import WeightsError as FetchError
from frontier_runtime.storage.weights import cache_dir_for, fetch_weights
from frontier_settings import to_yaml
from pydantic import ValidationError

from frontier.config.schema import Rollout
from frontier.hosts.session import Pruned
from frontier.release.artifact import Artifact
from frontier.release.history import HistoryStore, iso
from frontier.release.release import Release
from frontier.release.weights import (
    WeightsError,
    apply_gc,
    kept_releases,
    plan_gc,
    push,
    stored_versions,
)
from frontier.render.host import render_agent_config
from frontier.targets import load_stack
from tests.moto_server import moto_server

WEIGHTS = "frontier-test-weights"
URI = f"s3://{WEIGHTS}/tiny"
HISTORY = "frontier-test-history"
ARTIFACT = Artifact("sha256:" + "c" * 64, "wheel", "frontier_runtime-0.1-py3-none-any.whl", 1)


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    with moto_server() as url:
        yield url


@pytest.fixture
def s3(endpoint: str, monkeypatch: pytest.MonkeyPatch):
    urllib.request.urlopen(urllib.request.Request(f"{endpoint}/moto-api/reset", method="POST")).read()
    for name, value in {
        "AWS_ACCESS_KEY_ID": "t",
        "AWS_SECRET_ACCESS_KEY": "t",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(name, value)
    client = boto3.client("s3", endpoint_url=endpoint)
    client.create_bucket(Bucket=WEIGHTS)
    client.create_bucket(Bucket=HISTORY)
    return client


@pytest.fixture
def store(s3) -> HistoryStore:
    return HistoryStore(s3, HISTORY, "test")


def push_versions(s3, tmp_path: Path, *versions: str) -> None:
    """Each version its own two files, pushed in this order (so the last is the newest)."""
    for version in versions:
        src = tmp_path / f"model-{version}"
        src.mkdir()
        (src / "config.json").write_text(f'{{"version": "{version}"}}')
        (src / "model.safetensors").write_bytes(version.encode() * 1000)
        push(s3, src, URI, "tiny", version)


def deploy(store: HistoryStore, version: str, minute: int, outcome: str = "succeeded") -> str:
    """A release whose runtime.yaml names ``version``, recorded as deployed at ``minute``."""
    runtime = {"model": {"name": "tiny", "weights_uri": URI, "version": version}}
    release = Release(ARTIFACT, {"runtime.yaml": yaml.safe_dump(runtime)})
    store.put_release(release)
    started = dt.datetime(2026, 1, 1, 12, minute, tzinfo=dt.UTC)
    store.append({"kind": "deploy", "release": release.id, "outcome": outcome, "started_at": iso(started)})
    return release.id


def remaining(s3) -> list[str]:
    return [v.version for v in stored_versions(s3, URI)]


def test_gc_keeps_what_kept_releases_need_and_the_last_pushed_and_deletes_the_rest(s3, store, tmp_path):
    push_versions(s3, tmp_path, "v1", "v2", "v3", "v4", "v5")
    deploy(store, "v1", 1)
    deploy(store, "v2", 2)
    plan = plan_gc(s3, URI, kept_releases(store, keep_releases=2), keep_last=1)
    assert [v.version for v in plan.doomed] == ["v4", "v3"]
    assert apply_gc(s3, plan) == ["v4", "v3"]
    assert sorted(remaining(s3)) == ["v1", "v2", "v5"]


def test_a_dry_run_says_why_for_every_version_and_deletes_nothing(s3, store, tmp_path):
    push_versions(s3, tmp_path, "v1", "v2", "v3")
    release = deploy(store, "v1", 1)
    before = s3.list_objects_v2(Bucket=WEIGHTS)["KeyCount"]
    plan = plan_gc(s3, URI, kept_releases(store, keep_releases=2), keep_last=1)
    why = {v.version: (v.keep, v.why) for v in plan.verdicts}
    assert why["v1"] == (True, f"kept release {release} needs it")
    assert why["v3"] == (True, "one of the last 1 pushed")
    assert why["v2"] == (False, "no kept release needs it; older than the last 1 pushed")
    assert s3.list_objects_v2(Bucket=WEIGHTS)["KeyCount"] == before


def test_a_release_beyond_keep_releases_no_longer_protects_its_weights(s3, store, tmp_path):
    push_versions(s3, tmp_path, "v1", "v2", "v3")
    deploy(store, "v1", 1)
    deploy(store, "v2", 2)
    deploy(store, "v3", 3)
    plan = plan_gc(s3, URI, kept_releases(store, keep_releases=2), keep_last=0)
    assert [v.version for v in plan.doomed] == ["v1"]


def test_the_last_good_release_is_kept_behind_failed_deploys(s3, store, tmp_path):
    push_versions(s3, tmp_path, "v1", "v2", "v3")
    good = deploy(store, "v1", 1)
    deploy(store, "v2", 2, outcome="rolled_back")
    deploy(store, "v3", 3, outcome="rolled_back")
    kept = kept_releases(store, keep_releases=2)
    assert good in [k.release_id for k in kept]
    assert plan_gc(s3, URI, kept, keep_last=0).doomed == ()


def test_deleting_a_version_a_kept_release_needs_is_refused_naming_the_release(s3, store, tmp_path):
    push_versions(s3, tmp_path, "v1", "v2")
    release = deploy(store, "v1", 1)
    with pytest.raises(WeightsError, match=rf"refusing to delete {URI}/v1: kept release {release} needs it"):
        plan_gc(s3, URI, kept_releases(store, keep_releases=2), keep_last=0, only=["v2", "v1"])
    assert sorted(remaining(s3)) == ["v1", "v2"]


def test_an_explicit_version_deletes_only_that_version(s3, store, tmp_path):
    push_versions(s3, tmp_path, "v1", "v2", "v3")
    plan = plan_gc(s3, URI, kept_releases(store, keep_releases=2), keep_last=0, only=["v2"])
    assert apply_gc(s3, plan) == ["v2"]
    assert sorted(remaining(s3)) == ["v1", "v3"]


def test_an_unknown_version_is_refused_naming_the_versions_there(s3, store, tmp_path):
    push_versions(s3, tmp_path, "v1")
    with pytest.raises(WeightsError, match=r"weights version\(s\) v9 not found under .*\(there: v1\)"):
        plan_gc(s3, URI, [], keep_last=0, only=["v9"])


def test_a_version_without_a_manifest_is_left_alone(s3, store, tmp_path):
    push_versions(s3, tmp_path, "v1")
    s3.put_object(Bucket=WEIGHTS, Key="tiny/v2/model.safetensors", Body=b"a push under way")
    plan = plan_gc(s3, URI, [], keep_last=0)
    assert [v.version for v in plan.doomed] == ["v1"]
    assert {v.version: v.why for v in plan.verdicts}["v2"].startswith("no manifest")


def test_a_version_is_deleted_manifest_first(s3, store, tmp_path):
    push_versions(s3, tmp_path, "v1", "v2")
    calls: list[str] = []
    s3.meta.events.register(
        "before-call.s3.DeleteObject", lambda params, **_: calls.append(params["url_path"])
    )
    s3.meta.events.register("before-call.s3.DeleteObjects", lambda **_: calls.append("DeleteObjects"))
    apply_gc(s3, plan_gc(s3, URI, [], keep_last=1))
    assert calls[0].endswith("/tiny/v1/manifest.json") and calls[1:] == ["DeleteObjects"]


def test_a_runtime_cannot_start_on_a_collected_version(s3, store, tmp_path):
    push_versions(s3, tmp_path, "v1", "v2")
    apply_gc(s3, plan_gc(s3, URI, [], keep_last=1))
    with pytest.raises(FetchError, match=r"cannot read the weights manifest s3://.*/tiny/v1/manifest.json"):
        fetch_weights(URI, "v1", tmp_path / "cache", s3_client=s3)


def test_a_release_without_runtime_config_is_refused_naming_it(s3, store):
    release = Release(ARTIFACT, {"frontier-runtime.service": "[Unit]\n"})
    store.put_release(release)
    store.append(
        {
            "kind": "deploy",
            "release": release.id,
            "outcome": "succeeded",
            "started_at": iso(dt.datetime(2026, 1, 1, tzinfo=dt.UTC)),
        }
    )
    with pytest.raises(WeightsError, match=rf"release {release.id} has no runtime.yaml"):
        kept_releases(store, keep_releases=2)


# --- the host cache -------------------------------------------------------------------------------


def host_with_releases(tmp_path: Path, s3, *versions: str) -> Agent:
    """A host root holding one release per version (newest last), each version fetched into its cache."""
    root = tmp_path / "root"
    settings = load_stack("local")
    text = render_agent_config(
        settings, settings.only_pool, host="host-t", root=str(root), python=sys.executable, address="127.0.0.1"
    )
    agent = Agent(AgentConfig.from_dict(json.loads(text)))
    order = []
    for n, version in enumerate(versions, start=1):
        release_id = f"r-{n:012x}"
        runtime = parse_config(
            yaml.safe_dump(
                {
                    "model": {"name": "tiny", "weights_uri": URI, "version": version, "max_seq_len": 256},
                    "weights_cache_dir": "cache/weights",
                }
            )
        )
        (root / "releases" / release_id).mkdir(parents=True)
        (root / "releases" / release_id / "runtime.yaml").write_text(to_yaml(runtime))
        fetch_weights(URI, version, root / "cache" / "weights", s3_client=s3)
        order.insert(0, release_id)
    (root / "releases.json").write_text(json.dumps({"releases": order}))
    return agent


def cached(tmp_path: Path, version: str) -> bool:
    return cache_dir_for(URI, version, tmp_path / "root" / "cache" / "weights").is_dir()


def test_pruning_a_host_evicts_the_cached_weights_no_release_left_needs(s3, tmp_path):
    push_versions(s3, tmp_path, "v1", "v2", "v3")
    agent = host_with_releases(tmp_path, s3, "v1", "v2", "v3")
    result = agent.prune(2)
    assert result["pruned"] == ["r-000000000001"]
    assert result["weights_evicted"] == [f"{WEIGHTS}/tiny/v1"]
    assert [cached(tmp_path, v) for v in ("v1", "v2", "v3")] == [False, True, True]


def test_a_cached_version_being_fetched_is_not_evicted(s3, tmp_path):
    push_versions(s3, tmp_path, "v1", "v2", "v3")
    agent = host_with_releases(tmp_path, s3, "v1", "v2", "v3")
    lock = cache_dir_for(URI, "v1", tmp_path / "root" / "cache" / "weights") / ".lock"
    with lock.open("a") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)  # as the runtime's fetcher holds it
        assert agent.prune(2) == {"pruned": ["r-000000000001"]}
    assert cached(tmp_path, "v1")


def test_a_versions_prepared_weights_stay_while_it_is_needed_and_go_with_it(s3, tmp_path):
    push_versions(s3, tmp_path, "v1", "v2", "v3")
    agent = host_with_releases(tmp_path, s3, "v1", "v2", "v3")
    for version in ("v1", "v3"):  # as the runtime's storage/prepared.py keeps them, each with its lock
        prepared = cache_dir_for(URI, f"{version}/prepared/k0", tmp_path / "root" / "cache" / "weights")
        prepared.mkdir(parents=True)
        (prepared / ".lock").touch()
        (prepared / "prepared.json").write_text("{}")
    result = agent.prune(2)
    assert result["weights_evicted"] == [f"{WEIGHTS}/tiny/v1"]
    assert [cached(tmp_path, f"{v}/prepared/k0") for v in ("v1", "v3")] == [False, True]


def test_a_release_whose_weights_cannot_be_read_stops_any_eviction(s3, tmp_path):
    push_versions(s3, tmp_path, "v1", "v2", "v3")
    agent = host_with_releases(tmp_path, s3, "v1", "v2", "v3")
    (tmp_path / "root" / "releases" / "r-000000000002" / "runtime.yaml").unlink()
    assert agent.prune(2) == {"pruned": ["r-000000000001"]}
    assert cached(tmp_path, "v1")


def test_keep_weight_versions_below_zero_is_refused_naming_the_field() -> None:
    rollout = load_stack("local").rollout.model_dump()
    assert rollout["keep_weight_versions"] == 2  # the default when a stack does not set it
    with pytest.raises(ValidationError, match=r"keep_weight_versions\n.*greater than or equal to 0"):
        Rollout.model_validate({**rollout, "keep_weight_versions": -1})


def test_a_rollout_reports_the_weights_a_host_evicted_beside_the_releases_it_pruned(s3, tmp_path):
    push_versions(s3, tmp_path, "v1", "v2", "v3")
    agent = host_with_releases(tmp_path, s3, "v1", "v2", "v3")
    pruned = Pruned.from_answer(agent.prune(2))
    assert str(pruned) == f"r-000000000001; weights evicted: {WEIGHTS}/tiny/v1"
    assert str(Pruned.from_answer(agent.prune(2))) == "nothing to prune"
