"""The error answers of both servers (the runtime and the gateway), shaped as OpenAI's API shapes
them: ``{"error": {"message", "type", "param", "code"}}``.

OpenAI's ``type`` is coarse, and clients rely on it being so: every mistake of the client's (a bad
key, an unknown model, a malformed body) is an ``invalid_request_error``, a refusal for rate says
which limit (``requests`` or ``tokens``), and whatever is the server's own is a ``server_error``. The
status and the ``code`` (``invalid_api_key``, ``model_not_found``, ``rate_limit_exceeded``…) tell
the cases apart. One table here, so a client hears the same from a runtime and from a gateway.
"""

from __future__ import annotations

from typing import Any

INVALID_REQUEST = "invalid_request_error"
SERVER_ERROR = "server_error"
# A 429 that names no limit is a refusal for requests (the runtime's full queue among them).
RATE_LIMITED = "requests"


def error_type(status: int) -> str:
    """OpenAI's ``type`` for an answer of ``status``."""
    if status == 429:
        return RATE_LIMITED
    return INVALID_REQUEST if status < 500 else SERVER_ERROR


def error_body(
    message: str,
    status: int,
    *,
    param: str | None = None,
    code: str | None = None,
    type_: str | None = None,
) -> dict[str, Any]:
    """The JSON body of an error answer (and of an SSE error event: the same object)."""
    return {"error": {"message": message, "type": type_ or error_type(status), "param": param, "code": code}}
