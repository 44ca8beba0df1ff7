"""The response envelope `{code, message, data}` on every response, errors included.

FastAPI answers 404, 405 and validation errors in its own shape; the handlers here replace all of
them, and turn a database outage into 503 rather than 500.
"""

from __future__ import annotations

from typing import Any, Generic, TypeVar

import structlog
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

from service.adapters.db.errors import is_transient
from service.app.memories import Duplicate, LimitExceeded, NotFound
from service.core.normalize import clean_content

log = structlog.get_logger(__name__)
T = TypeVar("T")
# An unknown key or tag is echoed in a 400's message: at most this much of it, without control,
# direction or invisible characters.
MAX_SHOWN_KEY_CHARS = 40

# HTTP status → (code, default message); 40900/40901 share 409 and are raised explicitly.
CODES: dict[int, tuple[int, str]] = {
    400: (40000, "validation failed"),
    401: (40100, "unauthorized"),
    403: (40300, "forbidden"),
    404: (40400, "not found"),
    405: (40500, "method not allowed"),
    409: (40900, "MEMORY_CONTENT_DUPLICATE"),
    413: (41300, "request body too large"),
    500: (50000, "internal error"),
    503: (50300, "service unavailable"),
}


class Envelope(BaseModel, Generic[T]):
    code: int = 0
    message: str = "success"
    data: T | None = None


class ErrorEnvelope(BaseModel):
    code: int
    message: str
    data: None = None


class ApiError(Exception):
    def __init__(self, status: int, message: str | None = None, code: int | None = None) -> None:
        default_code, default_message = CODES[status]
        super().__init__(message or default_message)
        self.status = status
        self.code = code or default_code
        self.message = message or default_message


def ok(data: Any) -> dict[str, Any]:
    return {"code": 0, "message": "success", "data": data}


def error_response(status: int, message: str | None = None, code: int | None = None) -> JSONResponse:
    err = ApiError(status, message, code)
    return JSONResponse({"code": err.code, "message": err.message, "data": None}, status_code=status)


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI entries so that every documented error carries the envelope schema."""
    return {s: {"model": ErrorEnvelope, "description": CODES[s][1]} for s in statuses}


def _shown(part: object) -> str:
    """A field name as the message shows it: an unknown key is the client's text, so it is cut
    short (the message itself is cleaned to one line of visible text)."""
    text = str(part)
    return text if len(text) <= MAX_SHOWN_KEY_CHARS else text[:MAX_SHOWN_KEY_CHARS] + "…"


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def _api(_: Request, exc: ApiError) -> JSONResponse:
        return error_response(exc.status, exc.message, exc.code)

    @app.exception_handler(NotFound)
    async def _not_found(_: Request, __: NotFound) -> JSONResponse:
        return error_response(404, "memory not found")

    @app.exception_handler(Duplicate)
    async def _duplicate(_: Request, __: Duplicate) -> JSONResponse:
        return error_response(409, "MEMORY_CONTENT_DUPLICATE", 40900)

    @app.exception_handler(LimitExceeded)
    async def _limit(_: Request, __: LimitExceeded) -> JSONResponse:
        return error_response(409, "MEMORY_LIMIT_EXCEEDED", 40901)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        if first.get("type") == "json_invalid":
            reason = (first.get("ctx") or {}).get("error", "invalid JSON")
            position = first.get("loc", ("body", "?"))[-1]
            return error_response(
                400, f"the request body is not valid JSON: {reason} at character {position}"
            )
        where = ".".join(_shown(p) for p in first.get("loc", ()) if p not in {"body", "query", "path"})
        reason = str(first.get("msg", "invalid"))
        if (ctx := first.get("ctx") or {}).get("tag") is not None:  # an unknown `scope`, as sent
            reason = reason.replace(f"'{ctx['tag']}'", f"'{_shown(ctx['tag'])}'", 1)
        message = f"{where}: {reason}" if where else reason
        return error_response(400, clean_content(message)[:300])

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        status = exc.status_code if exc.status_code in CODES else 400
        return error_response(status)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        if is_transient(exc):
            log.warning("http_database_unavailable", path=request.url.path, error=str(exc))
            return error_response(503, "database unavailable")
        log.exception("http_unhandled_error", path=request.url.path)
        return error_response(500)
