"""The runtime's cached weights on a host, and the versions of them no release still names.

``prune`` (the host agent's) evicts those after it removed old releases. Standard library only,
Python 3.8 and later: it travels beside ``frontier-agent.py`` (``frontier_hostside.IMPORTED_FILES``).
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
from pathlib import Path
from typing import Any

#: The lock file the runtime's weights fetcher keeps in each cached version's directory.
WEIGHTS_LOCK_NAME = ".lock"


def evict_weights(host_root: Path, releases_dir: Path) -> dict[str, Any]:
    """Remove the cached weights versions that no release left on this host names.

    The cache is the runtime's (frontier_runtime/storage/weights.py): one directory per version,
    ``<cache root>/<bucket>/<prefix>/<version>/``, holding the fetcher's lock file. A release's
    ``runtime.yaml`` names its version (``model.weights_uri``, ``model.version``) and cache root
    (``weights_cache_dir``). A version whose lock is held (a fetch under way) stays; when any
    release's weights cannot be read, nothing is evicted (what it needs is unknown). The result
    names what was evicted, and is empty when nothing was (so ``prune``'s answer is unchanged).
    """
    needed: set[Path] = set()
    roots: set[Path] = set()
    releases = sorted(p for p in releases_dir.glob("*") if p.is_dir() and not p.name.startswith("."))
    for release in releases:
        weights = _release_weights(release / "runtime.yaml")
        if weights is None:
            return {}
        cache_dir, uri, version = weights
        root = Path(cache_dir) if os.path.isabs(cache_dir) else host_root / cache_dir
        bucket, _, prefix = uri[len("s3://") :].partition("/")
        roots.add(root)
        needed.add(root.joinpath(bucket, *(part for part in prefix.split("/") if part), version))
    evicted = []
    for root in sorted(roots):
        for lock in sorted(root.rglob(WEIGHTS_LOCK_NAME)):
            version_dir = lock.parent
            # A version's prepared directories (``<version>/prepared/<key>/``, the runtime's
            # storage/prepared.py) hold their own lock and go with their version.
            kept = version_dir in needed or any(parent in needed for parent in version_dir.parents)
            if kept or not lock.exists() or not _lock_free(lock):
                continue
            shutil.rmtree(version_dir, ignore_errors=True)
            evicted.append(str(version_dir.relative_to(root)))
    return {"weights_evicted": evicted} if evicted else {}


def _release_weights(runtime_yaml: Path) -> tuple[str, str, str] | None:
    """(weights_cache_dir, model.weights_uri, model.version) of a rendered runtime.yaml, or None.

    The file is yaml.safe_dump's block style (frontier_settings.to_yaml): top-level keys at column
    0, the model's at column 2, scalars plain or quoted; the standard library reads that much.
    """
    try:
        text = runtime_yaml.read_text()
    except OSError:
        return None
    top: dict[str, str] = {}
    model: dict[str, str] = {}
    section = ""
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        key, colon, value = stripped.partition(":")
        if not colon:
            continue
        indent = len(line) - len(line.lstrip(" "))
        if indent == 0:
            section = key
            top[key] = _yaml_scalar(value.strip())
        elif indent == 2 and section == "model":
            model[key] = _yaml_scalar(value.strip())
    uri, version, cache_dir = (
        model.get("weights_uri", ""),
        model.get("version", ""),
        top.get("weights_cache_dir", ""),
    )
    if not (uri.startswith("s3://") and version and cache_dir):
        return None
    return cache_dir, uri, version


def _yaml_scalar(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] == "'":
        return value[1:-1].replace("''", "'")
    if len(value) >= 2 and value[0] == value[-1] == '"':
        return str(json.loads(value))
    return value


def _lock_free(lock: Path) -> bool:
    """True when no fetcher holds the version's lock (taken and let go at once)."""
    try:
        with lock.open("a") as fh:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)
    except OSError:
        return False
    return True
