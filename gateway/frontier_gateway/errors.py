"""The gateway's error answers: the body both servers answer (:mod:`frontier_settings.openai_errors`)."""

from __future__ import annotations

from frontier_settings.openai_errors import error_body, error_type
from starlette.responses import JSONResponse


class GatewayError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        *,
        code: str,
        param: str | None = None,
        type_: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param
        self.type = type_ or error_type(status)
        self.headers = dict(headers or {})

    def response(self, extra_headers: dict[str, str] | None = None) -> JSONResponse:
        body = error_body(self.message, self.status, param=self.param, code=self.code, type_=self.type)
        return JSONResponse(body, status_code=self.status, headers={**self.headers, **(extra_headers or {})})


def invalid(message: str, param: str | None = None) -> GatewayError:
    return GatewayError(400, message, code="invalid_request", param=param)
