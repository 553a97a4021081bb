"""OpenAI-shaped errors: ``{"error": {"message", "type", "param", "code"}}`` with the right status."""

from __future__ import annotations

from typing import Any

from starlette.responses import JSONResponse

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    429: "rate_limit_error",
    500: "internal_server_error",
    503: "service_unavailable_error",
}


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
        return _TYPES.get(self.status, "invalid_request_error" if self.status < 500 else "server_error")

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self, request_id: str | None = None) -> JSONResponse:
        headers = dict(self.headers)
        if request_id:
            headers["X-Request-Id"] = request_id
        return JSONResponse(self.body(), status_code=self.status, headers=headers)


def invalid(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code, reason="invalid")
