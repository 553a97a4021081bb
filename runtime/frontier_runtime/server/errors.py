"""OpenAI-shaped errors with the right status; their body is the one both servers answer
(:mod:`frontier_settings.openai_errors`)."""

from __future__ import annotations

from typing import Any

from frontier_settings.openai_errors import error_body, error_type
from starlette.responses import JSONResponse


class APIError(Exception):
    """An error answered to the client. ``reason`` labels the failure metric when it is a refusal."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        reason: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.reason = reason
        self.headers = headers or {}

    @property
    def type(self) -> str:
        return error_type(self.status)

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.status, param=self.param, code=self.code)

    def response(self, request_id: str | None = None) -> JSONResponse:
        headers = dict(self.headers)
        if request_id:
            headers["X-Request-Id"] = request_id
        return JSONResponse(self.body(), status_code=self.status, headers=headers)


def invalid(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code, reason="invalid")
