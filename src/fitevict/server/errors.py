"""OpenAI's error envelope, used for every error fitevict answers."""

from __future__ import annotations

from typing import Any

from starlette.responses import JSONResponse


class ApiError(Exception):
    """An error with an HTTP status, in OpenAI's envelope: {"error": {message, type, param, code}}."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None, extra: dict[str, Any] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers or {}
        self.extra = extra or {}

    def response(self) -> JSONResponse:
        body: dict[str, Any] = {"message": self.message, "type": self.type, "param": self.param, "code": self.code}
        body.update(self.extra)
        return JSONResponse({"error": body}, status_code=self.status, headers=self.headers)


def envelope(status: int, message: str, **kw: Any) -> JSONResponse:
    return ApiError(status, message, **kw).response()
