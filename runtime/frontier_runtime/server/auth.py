"""Bearer API keys, compared in constant time.

Only SHA-256 digests of the keys are kept. A presented key is hashed and compared with *every*
stored digest (no early exit), so neither which key matched nor how much of it matched shows in
the response time.

A set is immutable: a reload builds a whole new ``ApiKeys`` and swaps the one reference the app
reads, so a request is judged against the old set or the new one, never a mix.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Iterable

from frontier_settings.auth import bearer_token


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8", errors="surrogatepass")).digest()


class ApiKeys:
    def __init__(self, keys: Iterable[str]) -> None:
        self._digests = tuple(_digest(k) for k in keys)
        if not self._digests:
            raise ValueError("at least one API key is required when auth is on")

    def __len__(self) -> int:
        return len(self._digests)

    @property
    def fingerprint(self) -> str:
        """Names the set, not its keys: a hash over the sorted digests, the same for the same keys
        in any order, so an operator can see which set each replica holds without seeing a key."""
        return key_set_fingerprint(self._digests)

    def __repr__(self) -> str:  # never show key material, not even digests
        return f"ApiKeys({len(self._digests)} keys)"

    def check(self, authorization: str | None) -> bool:
        """True when the ``Authorization`` header carries a known ``Bearer`` key."""
        token = bearer_token(authorization)
        presented = _digest(token or "")
        matched = False
        for digest in self._digests:
            matched |= secrets.compare_digest(presented, digest)
        return matched and token is not None


def key_set_fingerprint(digests: Iterable[bytes]) -> str:
    whole = hashlib.sha256(b"frontier-key-set\0")
    for digest in sorted(set(digests)):
        whole.update(digest)
    return whole.hexdigest()[:16]


def fingerprint_of(keys: Iterable[str]) -> str:
    """The fingerprint a runtime reports for ``keys`` (what ``fab keys.rotate`` waits for)."""
    return key_set_fingerprint(_digest(k) for k in keys)
