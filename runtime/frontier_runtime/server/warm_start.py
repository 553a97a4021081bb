"""A start through the prepared-weights cache: map what an earlier host prepared, or prepare it once.

``model_source`` asks the cache (``storage/prepared.py``) for this engine's key: the weights
version's content × the runtime × the device kind × dtype, quantization and placement. On a hit
the start fetches the prepared directory instead of the checkpoint and the loader maps it
(``models/llama/prepared.py``); on a miss it fetches the checkpoint, loads it as before, and once
ready writes what the load computed and publishes it for the next host. A prepared file the loader
refuses (made for another engine) costs one extra fetch: the checkpoint is loaded and the cache
entry rewritten.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

import torch

from frontier_runtime.config import RuntimeConfig
from frontier_runtime.engine.api import EngineClient
from frontier_runtime.engine.loop import AsyncEngine
from frontier_runtime.models.llama import prepared
from frontier_runtime.ops import cpu_kernel
from frontier_runtime.storage import kernel_cache, prepared_eviction
from frontier_runtime.storage import prepared as cache
from frontier_runtime.storage.weights import FetchReport, fetch_weights, is_s3_uri

log = logging.getLogger("frontier_runtime.warm_start")

PhaseSink = Callable[[str, float], None]

#: The prepared entries this process loads from, held (a shared lock) for its whole life so that no
#: other start's eviction removes them.
_HELD: list[IO[str]] = []


def engine_spec(config: RuntimeConfig) -> str:
    """The key's engine half, from the settings alone (the checkpoint is not fetched yet): the
    runtime's identity, the device kind, and the dtype and quantization settings; a dtype of
    "auto" resolves from the weights, which the key's other half fixes. The prepared file records
    the resolved spec, which the loader checks."""
    cpu_kernel.use_native_kernels(config.native_kernels)  # the device kind depends on the switch
    device = torch.device("cuda" if config.device == "cuda" else "cpu")
    return json.dumps(
        {
            "runtime": prepared.runtime_identity(),
            "device": prepared.device_kind(device),
            "dtype": config.model.dtype,
            "quantization": config.model.quantization,
            "ranks": config.ranks,
        },
        sort_keys=True,
    )


def model_source(config: RuntimeConfig, phase: PhaseSink) -> cache.ModelSource:
    """Where this start loads from: the prepared directory of its key, else the checkpoint."""
    spec = engine_spec(config)
    cache_root = Path(config.weights_cache_dir)
    if not is_s3_uri(config.model.weights_uri):
        return cache.from_directory(Path(config.model.weights_uri), cache_root, spec)
    source = cache.from_s3(
        config.model.weights_uri,
        config.model.version,
        cache_root,
        spec,
        concurrency=config.weights_fetch_concurrency,
    )
    phase("fetch", sum(r.fetch_seconds for r in source.reports))
    phase("verify", sum(r.verify_seconds for r in source.reports))
    return source


def kernels(config: RuntimeConfig, remote: bool = True) -> kernel_cache.KernelCache:
    """Triton's cache for this engine, restored from beside the weights version where a host of the
    same kind kept one (storage/kernel_cache.py); ``remote=False`` keeps it on this host only."""
    uri = config.model.weights_uri if remote else config.weights_cache_dir
    return kernel_cache.open_cache(uri, config.model.version, Path(config.weights_cache_dir), engine_spec(config))


def prefetch(config: RuntimeConfig) -> dict[str, object]:
    """Warm this host's weights cache with exactly what a start of ``config`` will read, and return
    what it fetched: the prepared directory of the start's key where S3 holds it, else the
    checkpoint (a replica of several ranks: the checkpoint), every file verified as a start
    verifies it. Nothing is loaded. The fetcher's lock makes a start that comes meanwhile wait,
    then find every file verified (one ``stat`` each). A local weights directory has nothing to fetch."""
    started = time.monotonic()
    uri = config.model.weights_uri
    if not is_s3_uri(uri):
        return {"weights": uri, "fetched": False, "reason": "a local weights directory: nothing to fetch"}
    if config.ranks > 1:
        report = fetch_weights(
            uri,
            config.model.version,
            Path(config.weights_cache_dir),
            concurrency=config.weights_fetch_concurrency,
        )
        reports: tuple[FetchReport, ...] = (report,)
        key, hit = "", False
    else:
        source = model_source(config, lambda phase, seconds: None)
        reports, key, hit = source.reports, source.key, source.hit
    compiled = kernels(config)
    return {
        "weights": uri,
        "version": config.model.version,
        "fetched": True,
        "key": key,
        "prepared": hit,
        "model_dir": str(reports[-1].model_dir) if reports else "",
        "files_downloaded": sum(len(r.files_downloaded) for r in reports),
        "files_reused": sum(len(r.files_reused) for r in reports),
        "bytes_downloaded": sum(r.bytes_downloaded for r in reports),
        "kernel_files": len(compiled.restored),
        "seconds": round(time.monotonic() - started, 3),
    }


def build(
    config: RuntimeConfig,
    source: cache.ModelSource,
    build_engine: Callable[[RuntimeConfig, Path], EngineClient],
) -> tuple[EngineClient, Callable[[], None] | None]:
    """The engine from ``source``, and what to run once it is ready (publish what it prepared)."""
    checkpoint_dir = source.model_dir
    try:
        engine = build_engine(config, source.model_dir)
    except prepared.PreparedMismatch as exc:
        if source.checkpoint is None:
            raise
        log.warning(
            f"prepared weights refused, loading the checkpoint: {exc}",
            extra={"event": "prepared_refused", "key": source.key, "error": str(exc)},
        )
        checkpoint_dir = source.checkpoint()
        engine = build_engine(config, checkpoint_dir)
        return engine, _publisher(engine, source, checkpoint_dir, config)
    if source.hit:
        use_entry(config, source.model_dir)
        return engine, None
    return engine, _publisher(engine, source, checkpoint_dir, config)


def use_entry(config: RuntimeConfig, entry: Path) -> prepared_eviction.Eviction:
    """Hold ``entry`` for this process and evict others beyond ``prepared_cache_max_bytes``."""
    _HELD.append(prepared_eviction.hold(entry))
    return prepared_eviction.evict(
        Path(config.weights_cache_dir), config.prepared_cache_max_bytes, keep=entry
    )


def let_go() -> None:
    """Release the entries this process holds (its engine is shut down; the process's end does the same)."""
    while _HELD:
        _HELD.pop().close()


def _publisher(
    engine: EngineClient, source: cache.ModelSource, checkpoint_dir: Path, config: RuntimeConfig
) -> Callable[[], None] | None:
    staging, publish = source.staging, source.publish
    if staging is None or publish is None or not isinstance(engine, AsyncEngine):
        return None
    runner = engine.engine.runner

    def run() -> None:
        started = time.monotonic()
        try:
            shutil.rmtree(staging, ignore_errors=True)
            spec = prepared.spec_for(
                runner.device, runner.dtype, runner.config.quantization, runner.placement
            )
            prepared.save_prepared(runner.model, staging, spec)
            entry = publish(checkpoint_dir)
        except Exception as exc:  # the replica serves either way; the next host prepares it again
            log.warning(
                f"prepared weights not published: {exc}",
                extra={"event": "prepared_publish_failed", "key": source.key, "error": str(exc)},
            )
            return
        use_entry(config, entry)
        log.info(
            "prepared weights kept",
            extra={
                "event": "prepared_kept",
                "key": source.key,
                "seconds": round(time.monotonic() - started, 3),
            },
        )

    return run
