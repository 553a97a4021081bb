"""The host's prepared-weights entries within a byte budget: least recently used out first, never one in use.

Every start of a new runtime build or engine setting makes a new key (``storage/prepared.py``), so
without a bound the prepared directories of past releases pile up on the host's cache disk beside
the checkpoint, one model's worth each. The entries are the directories that loader maps:

    <weights_cache_dir>/<bucket>/<prefix>/<version>/prepared/<key>/    (from S3)
    <weights_cache_dir>/local-prepared/<key>/                          (of a local weights directory)

A start that loads an entry (or publishes the one it prepared) holds it (:func:`hold`): a shared
lock on its ``.in-use`` file for the process's life, and a touch of its ``.last-used`` file, whose
mtime is the entry's last use. :func:`evict` then removes the least recently used entries until the
rest fit ``runtime.prepared_cache_max_bytes``. It skips an entry another process holds (its
``.in-use`` lock cannot be taken) or fetches (the fetcher's ``.lock``), and the caller's own
entry: an entry larger than the budget alone stays and the budget is exceeded by it, never by two.
The weights versions themselves (the checkpoints) are the host agent's to evict, by the releases
left on the host (``frontier_hostside/weights_cache.py``); their prepared entries go with them.
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from frontier_runtime.storage.manifest import MANIFEST_NAME
from frontier_runtime.storage.prepared import LOCAL_PREPARED_DIR, PREPARED_DIR
from frontier_runtime.storage.weights import LOCK_NAME

log = logging.getLogger("frontier_runtime.prepared")

IN_USE_NAME = ".in-use"
LAST_USED_NAME = ".last-used"


@dataclass(frozen=True)
class Entry:
    """One prepared directory on the host: its bytes on disk and when a start last used it."""

    path: Path
    size: int
    last_used: float


@dataclass
class Eviction:
    """What one pass of :func:`evict` did."""

    budget_bytes: int
    evicted: list[str] = field(default_factory=list)
    freed_bytes: int = 0
    #: The entries' bytes once it was done: above the budget only where the rest are held.
    kept_bytes: int = 0
    #: Entries over the budget that stayed because another process holds or fetches them.
    busy: list[str] = field(default_factory=list)


def hold(directory: Path) -> IO[str]:
    """Mark ``directory`` in use for as long as the returned file stays open, and touch its last use.

    Keep the file object for the process's life: the shared lock goes when it is closed."""
    directory.mkdir(parents=True, exist_ok=True)
    handle = (directory / IN_USE_NAME).open("a")
    fcntl.flock(handle.fileno(), fcntl.LOCK_SH)
    (directory / LAST_USED_NAME).touch()
    return handle


def entries(cache_root: Path) -> list[Entry]:
    """The prepared directories under ``cache_root``, least recently used first."""
    found: set[Path] = set()
    for manifest in cache_root.rglob(MANIFEST_NAME):
        directory = manifest.parent
        parent = directory.parent
        from_s3 = parent.name == PREPARED_DIR
        # A local entry being published is staged beside its final name (``<key>.staging-<pid>``).
        local = parent == cache_root / LOCAL_PREPARED_DIR and ".staging-" not in directory.name
        if from_s3 or local:
            found.add(directory)
    listed = [Entry(d, _size(d), _last_used(d)) for d in found]
    return sorted(listed, key=lambda e: (e.last_used, str(e.path)))


def evict(cache_root: Path, budget_bytes: int, keep: Path | None = None) -> Eviction:
    """Remove least recently used entries until the rest fit ``budget_bytes`` (``keep`` stays)."""
    if budget_bytes < 0:
        raise ValueError(f"prepared_cache_max_bytes = {budget_bytes}: must be 0 or more")
    listed = entries(cache_root)
    result = Eviction(budget_bytes, kept_bytes=sum(e.size for e in listed))
    kept = keep.resolve() if keep is not None else None
    for entry in listed:
        if result.kept_bytes <= budget_bytes:
            break
        if entry.path.resolve() == kept:
            continue
        if not _remove_unless_busy(entry.path):
            result.busy.append(str(entry.path.relative_to(cache_root)))
            continue
        result.evicted.append(str(entry.path.relative_to(cache_root)))
        result.freed_bytes += entry.size
        result.kept_bytes -= entry.size
    if result.evicted:
        log.info(
            f"prepared weights evicted: {len(result.evicted)} entries, {result.freed_bytes} bytes",
            extra={
                "event": "prepared_evicted",
                "evicted": result.evicted,
                "freed_bytes": result.freed_bytes,
                "kept_bytes": result.kept_bytes,
                "budget_bytes": budget_bytes,
            },
        )
    if result.kept_bytes > budget_bytes:
        log.warning(
            f"prepared weights hold {result.kept_bytes} bytes, over the budget of {budget_bytes}: "
            "what is left is in use or being fetched",
            extra={"event": "prepared_over_budget", "kept_bytes": result.kept_bytes, "busy": result.busy},
        )
    return result


def _remove_unless_busy(directory: Path) -> bool:
    """Remove ``directory`` unless a process holds it or fetches into it; whether it was removed.

    Both locks are taken without waiting and kept while the directory goes, so a start that comes
    for it now waits on the fetcher's lock and then fetches it anew."""
    with _try_exclusive(directory / IN_USE_NAME) as free_of_users:
        if not free_of_users:
            return False
        with _try_exclusive(directory / LOCK_NAME) as free_of_fetchers:
            if not free_of_fetchers:
                return False
            shutil.rmtree(directory, ignore_errors=True)
    return not directory.exists()


@contextmanager
def _try_exclusive(path: Path) -> Iterator[bool]:
    """An exclusive lock on ``path`` if one can be had at once (True), else False; a missing file
    is created (no one holds it). The lock goes with the descriptor, on leaving."""
    try:
        handle = path.open("a")
    except OSError:  # its directory went meanwhile
        yield False
        return
    with handle:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            yield False
            return
        yield True


def _size(directory: Path) -> int:
    total = 0
    for path in directory.rglob("*"):
        try:
            if path.is_file() and not path.is_symlink():
                total += path.stat().st_size
        except OSError:
            continue  # removed while listed
    return total


def _last_used(directory: Path) -> float:
    """The mtime of its ``.last-used`` (touched by each start that held it); else of its manifest."""
    for name in (LAST_USED_NAME, MANIFEST_NAME):
        try:
            return os.stat(directory / name).st_mtime
        except OSError:
            continue
    return 0.0
