"""An immutable release: the runtime artifact's digest plus the files rendered for the stack.

The release id derives from both (``r-`` + 12 hex of a sha256 over the digest and every file's
hash), so the same digest and settings always name the same release, and any change to either
names a new one. ``release.json`` travels with the files to every host and into the history bucket.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from frontier_hostside.names import RELEASE_ID_PATTERN as RELEASE_ID
from frontier_hostside.names import RELEASE_MANIFEST as MANIFEST

from frontier.errors import FrontierError
from frontier.release.artifact import Artifact


class ReleaseError(FrontierError):
    """A release that is malformed, unknown, or whose files do not match its manifest."""


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class Release:
    artifact: Artifact
    files: Mapping[str, str] = field(default_factory=dict)
    #: ``release.sig`` (frontier.release.signing): the stack's release key over this release's
    #: manifest; "" until signed. Not part of the id or the manifest, which it covers.
    signature: str = field(default="", compare=False)

    def signed(self, signature: str) -> Release:
        return replace(self, signature=signature)

    @property
    def digest(self) -> str:
        return self.artifact.digest

    @property
    def file_hashes(self) -> dict[str, str]:
        return {name: sha256_text(text) for name, text in sorted(self.files.items())}

    @property
    def config_hash(self) -> str:
        lines = "".join(f"{name} {h}\n" for name, h in self.file_hashes.items())
        return f"sha256:{sha256_text(lines)}"

    @property
    def id(self) -> str:
        return release_id(self.digest, self.file_hashes)

    def manifest(self) -> str:
        """``release.json``: pure (no clock), so re-staging it anywhere gives the same bytes."""
        data = {
            "id": self.id,
            "digest": self.digest,
            "config_hash": self.config_hash,
            "artifact": json.loads(self.artifact.to_json()),
            "files": self.file_hashes,
        }
        return json.dumps(data, indent=2, sort_keys=True) + "\n"


def release_id(digest: str, file_hashes: Mapping[str, str]) -> str:
    material = digest + "\n" + "".join(f"{name} {h}\n" for name, h in sorted(file_hashes.items()))
    return "r-" + sha256_text(material)[:12]


def check_release_id(value: str) -> str:
    if not RELEASE_ID.match(value):
        raise ReleaseError(
            f"release id {value!r} is malformed: expected 'r-' followed by 12 lowercase hex digits"
        )
    return value


def release_from_manifest(manifest: str, files: Mapping[str, str], signature: str = "") -> Release:
    """Rebuild a stored release and prove its files are the ones its manifest names."""
    try:
        data = json.loads(manifest)
        artifact = Artifact.from_json(json.dumps(data["artifact"]))
        expected = dict(data["files"])
        stored_id = data["id"]
    except (ValueError, KeyError, TypeError) as exc:
        raise ReleaseError(f"{MANIFEST} is malformed: {exc}") from exc
    release = Release(artifact=artifact, files=dict(sorted(files.items())), signature=signature)
    if release.file_hashes != expected or release.id != stored_id:
        raise ReleaseError(f"release {stored_id}: stored files do not match {MANIFEST} (corrupt or altered)")
    return release
