"""A stack's golden outputs, kept in its history beside the release they were recorded from.

A verification set (``stacks/verify/*.yaml``) is shared by every stack that names it, but its
golden outputs are one model's answers from one release: they live in that stack's history (each
pool's own, on a stack of several models), and the last recording made is the reference that
``fab verify`` and a canary hold the golden cases to. Under the history's prefix::

    releases/<id>/verify/<set>.golden.json    the outputs recorded from release <id>
    verify/<set>.json                         which recording is the reference (written last)

``<set>`` is the set file's stem (``default`` for ``stacks/verify/default.yaml``).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from frontier.errors import FrontierError
from frontier.release.history import HistoryStore, get_if_present
from frontier.release.release import check_release_id
from frontier.verify import GoldenOutput, Recording, VerifySet, golden_text, read_set

SET_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")


def set_name(set_path: Path) -> str:
    """The name a set's recordings are kept under: its file's stem."""
    name = set_path.stem
    if not SET_NAME.match(name):
        raise FrontierError(
            f"verify.file = {str(set_path)!r}: its name {name!r} names the set's recordings in the "
            "history: letters, digits, '_', '.', '-' only (1-100 characters)"
        )
    return name


def uri(store: HistoryStore, key: str) -> str:
    return f"s3://{store.bucket}/{store.prefix}{key}"


def stored_recording(store: HistoryStore, set_path: Path) -> Recording | None:
    """The reference recording of the set at ``set_path`` in ``store``, or None if none was made."""
    pointer_key = f"verify/{set_name(set_path)}.json"
    pointer = get_if_present(store.s3, store.bucket, store.prefix + pointer_key)
    if pointer is None:
        return None
    key = str(json.loads(pointer["Body"].read())["key"])
    found = get_if_present(store.s3, store.bucket, store.prefix + key)
    if found is None:
        raise FrontierError(
            f"{uri(store, pointer_key)} names {uri(store, key)}, which is gone: "
            "record again with `fab verify --record`"
        )
    return Recording(where=uri(store, key), text=found["Body"].read().decode())


def load_for_stack(store: HistoryStore, set_path: Path, *, model: str) -> VerifySet:
    """The set, its golden cases held to the stack's reference recording (not recorded: none)."""
    return read_set(set_path, model=model, golden=stored_recording(store, set_path))


def store_recording(
    store: HistoryStore, set_path: Path, *, model: str, release: str, outputs: dict[str, GoldenOutput]
) -> str:
    """Keep ``outputs`` (recorded from ``release``) beside that release and name them the set's
    reference; returns where they were written (an ``s3://`` URI)."""
    check_release_id(release)
    name = set_name(set_path)
    key = f"releases/{release}/verify/{name}.golden.json"
    text = golden_text(model, release, outputs)
    store.s3.put_object(Bucket=store.bucket, Key=store.prefix + key, Body=text.encode())
    pointer = json.dumps({"release": release, "key": key}) + "\n"
    # The pointer last: a reader never sees a reference whose outputs are not all written.
    store.s3.put_object(Bucket=store.bucket, Key=f"{store.prefix}verify/{name}.json", Body=pointer.encode())
    return uri(store, key)
