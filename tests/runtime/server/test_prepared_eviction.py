"""The host's prepared-weights entries stay within ``runtime.prepared_cache_max_bytes``: the least
recently used go first, never the entry the evicting start uses, one another process holds, or one
being fetched; the checkpoints themselves are not the budget's to remove.

A lock another process holds is stood in for by a second open file description in this process:
``flock`` locks belong to the open file description, so the two conflict exactly as two processes'
would."""

from __future__ import annotations

import fcntl
import os
import shutil
from pathlib import Path

import pytest
import yaml
from frontier_runtime.config import RuntimeConfig, parse_config
from frontier_runtime.server import warm_start
from frontier_runtime.server.serve import build_engine
from frontier_runtime.storage import prepared as cache
from frontier_runtime.storage import prepared_eviction as eviction
from frontier_runtime.storage.manifest import MANIFEST_NAME
from frontier_runtime.storage.weights import LOCK_NAME
from frontier_settings import ConfigError
from server_harness import MODEL

MB = 1024 * 1024


def _entry(root: Path, relative: str, size: int, last_used: float) -> Path:
    """A prepared directory of ``size`` bytes of tensors, last used at ``last_used`` (epoch s)."""
    directory = root / relative
    directory.mkdir(parents=True)
    (directory / "prepared-00000.safetensors").write_bytes(b"\0" * size)
    (directory / MANIFEST_NAME).write_text("{}")
    (directory / eviction.LAST_USED_NAME).touch()
    os.utime(directory / eviction.LAST_USED_NAME, (last_used, last_used))
    return directory


def _s3_entry(root: Path, key: str, size: int, last_used: float) -> Path:
    return _entry(root, f"bucket/tiny/v1/{cache.PREPARED_DIR}/{key}", size, last_used)


def test_the_least_recently_used_entries_go_until_the_rest_fit_the_budget(tmp_path: Path) -> None:
    oldest = _s3_entry(tmp_path, "a", MB, 1000)
    middle = _entry(tmp_path, f"{cache.LOCAL_PREPARED_DIR}/b", MB, 2000)
    newest = _s3_entry(tmp_path, "c", MB, 3000)
    result = eviction.evict(tmp_path, budget_bytes=2 * MB + 4096)
    assert not oldest.exists() and middle.exists() and newest.exists()
    assert result.evicted == [str(oldest.relative_to(tmp_path))]
    assert result.kept_bytes <= 2 * MB + 4096


def test_a_start_that_uses_an_entry_makes_it_the_most_recently_used(tmp_path: Path) -> None:
    first = _s3_entry(tmp_path, "a", MB, 1000)
    second = _s3_entry(tmp_path, "b", MB, 2000)
    with eviction.hold(first):  # a start maps the older one again
        pass
    eviction.evict(tmp_path, budget_bytes=MB + 4096)
    assert first.exists() and not second.exists()


def test_the_entry_the_start_uses_stays_even_alone_over_the_budget(tmp_path: Path) -> None:
    mine = _s3_entry(tmp_path, "mine", 2 * MB, 1000)
    other = _s3_entry(tmp_path, "other", MB, 2000)
    result = eviction.evict(tmp_path, budget_bytes=0, keep=mine)
    assert mine.exists() and not other.exists()
    assert result.kept_bytes > 0 and not result.busy


def test_an_entry_another_process_holds_is_never_removed(tmp_path: Path) -> None:
    held = _s3_entry(tmp_path, "held", MB, 1000)
    free = _s3_entry(tmp_path, "free", MB, 2000)
    with eviction.hold(held):
        result = eviction.evict(tmp_path, budget_bytes=0)
    assert held.exists() and not free.exists()
    assert result.busy == [str(held.relative_to(tmp_path))]


def test_an_entry_being_fetched_is_never_removed(tmp_path: Path) -> None:
    fetching = _s3_entry(tmp_path, "fetching", MB, 1000)
    with (fetching / LOCK_NAME).open("a") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)  # as the weights fetcher holds it
        eviction.evict(tmp_path, budget_bytes=0)
    assert fetching.exists()


def test_the_checkpoint_versions_are_not_entries(tmp_path: Path) -> None:
    checkpoint = tmp_path / "bucket" / "tiny" / "v1"
    checkpoint.mkdir(parents=True)
    (checkpoint / "model.safetensors").write_bytes(b"\0" * MB)
    (checkpoint / MANIFEST_NAME).write_text("{}")
    entry = _s3_entry(tmp_path, "a", MB, 1000)
    assert [e.path for e in eviction.entries(tmp_path)] == [entry]
    eviction.evict(tmp_path, budget_bytes=0)
    assert (checkpoint / "model.safetensors").is_file()


def test_a_local_entry_still_being_published_is_not_an_entry(tmp_path: Path) -> None:
    _entry(tmp_path, f"{cache.LOCAL_PREPARED_DIR}/k.staging-4242", MB, 1000)
    assert eviction.entries(tmp_path) == []


def test_a_negative_budget_is_refused_naming_the_setting(tiny_model: Path, tmp_path: Path) -> None:
    with pytest.raises(
        ConfigError, match="prepared_cache_max_bytes = -1: Input should be greater than or equal to 0"
    ):
        _config(tiny_model, tmp_path, budget=-1)


def _config(weights: Path, cache_dir: Path, budget: int) -> RuntimeConfig:
    return parse_config(
        yaml.safe_dump(
            {
                "model": {"name": MODEL, "weights_uri": str(weights), "version": "v1", "max_seq_len": 128},
                "weights_cache_dir": str(cache_dir),
                "prepared_cache_max_bytes": budget,
                "cpu_kv_cache_bytes": 4 * 1024 * 1024,
                "device": "cpu",
            }
        )
    )


def _start(config: RuntimeConfig) -> cache.ModelSource:
    """One start as serve makes it, through the publish it runs once ready, to its shutdown."""
    source = warm_start.model_source(config, lambda phase, seconds: None)
    engine, after_ready = warm_start.build(config, source, build_engine)
    try:
        engine.warmup()
        if after_ready is not None:
            after_ready()
    finally:
        engine.shutdown()
        warm_start.let_go()
    return source


def test_a_start_over_the_budget_evicts_the_entry_of_the_weights_it_no_longer_serves(
    tiny_model: Path, tmp_path: Path
) -> None:
    older_weights = tmp_path / "older"
    shutil.copytree(tiny_model, older_weights)
    cache_dir = tmp_path / "cache"
    roomy = _config(older_weights, cache_dir, budget=2**40)
    _start(roomy)  # prepares the older weights' entry
    older = _start(roomy)  # and maps it
    assert older.hit
    size = sum(e.size for e in eviction.entries(cache_dir))
    # Room for one entry: the start that prepares the newer weights' entry keeps only that one.
    newer = _start(_config(tiny_model, cache_dir, budget=size + size // 2))
    entries = [e.path for e in eviction.entries(cache_dir)]
    assert entries == [cache_dir / cache.LOCAL_PREPARED_DIR / newer.key]
    assert not older.model_dir.exists()
