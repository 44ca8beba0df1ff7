"""The memory API's errors in the envelope: its domain errors, and request validation answered as
400 rather than FastAPI's 422."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from service.app.memories import Duplicate, LimitExceeded, NotFound
from service.core.normalize import clean_content
from service.entrypoints.http.envelope import error_response

# An unknown key or tag is echoed in a 400's message: at most this much of it, without control,
# direction or invisible characters.
MAX_SHOWN_KEY_CHARS = 40


def _shown(part: object) -> str:
    """A field name as the message shows it: an unknown key is the client's text, so it is cut
    short (the message itself is cleaned to one line of visible text)."""
    text = str(part)
    return text if len(text) <= MAX_SHOWN_KEY_CHARS else text[:MAX_SHOWN_KEY_CHARS] + "…"


def install_api_error_handlers(app: FastAPI) -> None:
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
