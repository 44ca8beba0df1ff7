"""The response envelope `{code, message, data}` on every response, errors included.

Starlette answers 404 and 405 in its own shape; the handlers here replace them, and turn a database
outage into 503 rather than 500. The memory API's own errors are mapped in `api_errors`.

A handler registered for `Exception` runs in Starlette's outermost middleware, which re-raises the
exception once the response is sent, and the server then logs it at ERROR with its traceback (and a
database error's SQL). The database's exception classes are therefore handled one layer in, where an
answered exception ends: an outage is one WARNING line; anything else goes on to the 500 handler.
"""

from __future__ import annotations

from typing import Any, Generic, TypeVar, cast

import structlog
from pydantic import BaseModel
from sqlalchemy.exc import DBAPIError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from starlette.applications import Starlette
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse

from service.adapters.db.errors import is_transient

log = structlog.get_logger(__name__)
T = TypeVar("T")

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


def install_error_handlers(app: Starlette) -> None:
    """Every app's handlers: a bare worker's ops routes answer with the envelope too."""
    app.add_exception_handler(ApiError, _api)
    app.add_exception_handler(StarletteHTTPException, _http)
    for kind in (DBAPIError, PoolTimeout, OSError):  # what `is_transient` may call an outage
        app.add_exception_handler(kind, _database)
    app.add_exception_handler(Exception, _unexpected)


async def _api(_: Request, exc: Exception) -> JSONResponse:
    err = cast(ApiError, exc)  # registered for ApiError only
    return error_response(err.status, err.message, err.code)


async def _http(_: Request, exc: Exception) -> JSONResponse:
    status = cast(StarletteHTTPException, exc).status_code
    status = status if status in CODES else 400
    return error_response(status)


async def _database(request: Request, exc: Exception) -> JSONResponse:
    if not is_transient(exc):
        raise exc  # a bug: the 500 handler logs it whole
    log.warning("http_database_unavailable", path=request.url.path, error=_without_sql(exc))
    return error_response(503, "database unavailable")


def _without_sql(exc: BaseException) -> str:
    """The driver's own message: SQLAlchemy's text of a DBAPIError carries the statement and its
    parameters, which may hold users' memories."""
    cause = exc.orig if isinstance(exc, DBAPIError) and exc.orig is not None else exc
    return f"{type(cause).__name__}: {cause}"[:300]


async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    log.exception("http_unhandled_error", path=request.url.path)
    return error_response(500)
