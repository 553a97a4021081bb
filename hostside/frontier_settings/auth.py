"""The bearer key of an ``Authorization`` header, read one way by the runtime and the gateway.

Both hold only digests of their keys and judge the key this returns against them: the runtime
compares its digest with every stored one in constant time (frontier_runtime.server.auth), the
gateway looks its digest up (frontier_gateway.tenants). One reader, so a header that one of them
takes is never refused by the other.
"""

from __future__ import annotations


def bearer_token(authorization: str | None) -> str | None:
    """The key of ``Bearer <key>`` (the scheme in any case, spaces around either trimmed); None for
    no header, another scheme, or an empty key."""
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        return None
    return token
