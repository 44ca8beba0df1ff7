"""The FastAPI application of `run` and `api`: the ops routes, the memory API, the console and the API
page."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from fastapi.responses import FileResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException

from service.app.erasure import UserEraser
from service.app.memories import MemoryService
from service.app.model_quality import ModelQualityReport
from service.app.model_setting import ModelSetting
from service.entrypoints.http.admin_routes import admin_router
from service.entrypoints.http.api_docs import install_api_docs
from service.entrypoints.http.api_errors import install_api_error_handlers
from service.entrypoints.http.auth import Authenticator
from service.entrypoints.http.console_routes import console_router
from service.entrypoints.http.internal_routes import internal_router
from service.entrypoints.http.memory_routes import memory_router

if TYPE_CHECKING:
    from collections.abc import Sequence

    from starlette.responses import Response
    from starlette.routing import BaseRoute
    from starlette.types import Scope

    from service.adapters.db.database import Database
    from service.adapters.metrics import Metrics
    from service.app.caches import CaptureSwitch
    from service.app.ports import ModelCheck
    from service.config import Settings

CONSOLE_DIR = Path(__file__).resolve().parent / "console"
# Operations that take no credentials (the sign-in link's code is the credential).
UNAUTHENTICATED = frozenset({"/api/v1/console/session"})


class ConsoleFiles(StaticFiles):
    """The console's static pages, with a policy that runs only the console's own script. A
    directory without its trailing slash (`/console/.`, `/console/x/..`) is 404: Starlette would
    redirect it to an address built from the Host header, which the client chooses."""

    async def get_response(self, path: str, scope: Scope) -> Response:
        response = await super().get_response(path, scope)
        if isinstance(response, RedirectResponse):
            raise HTTPException(status_code=404)
        response.headers["Content-Security-Policy"] = (
            "default-src 'self'; script-src 'self'; style-src 'self'; object-src 'none'; "
            "frame-ancestors 'none'"
        )
        response.headers["X-Content-Type-Options"] = "nosniff"
        return response


def create_api_app(
    settings: Settings,
    db: Database,
    capture: CaptureSwitch,
    metrics: Metrics,
    model_check: ModelCheck,
    ops: Sequence[BaseRoute],
) -> FastAPI:
    """`ops` come first; `service.entrypoints.http.app` adds the handlers and middleware every app has."""
    app = FastAPI(
        title="mao-memory",
        version="0.1.0",
        description="Cross-session long-term memory: user CRUD, auto-capture switch, admin audit, injection.",
        docs_url=None,  # FastAPI's page loads Swagger UI from a CDN; `install_api_docs` serves it
        redoc_url=None,
        # A redirect to the slash-less path would be built from the Host header, which the client
        # chooses: an unknown path is a 404 instead.
        redirect_slashes=False,
        routes=list(ops),
    )
    install_api_error_handlers(app)
    if settings.api_docs:
        install_api_docs(app)  # the interactive API page, unless switched off
    app.state.authenticator = Authenticator(settings)
    service = MemoryService(db, capture, settings.robot_keys)
    # Routes are matched in order: the injection lookup, called on every agent turn, comes first.
    app.include_router(internal_router(service, settings, UserEraser(db, metrics, capture)))
    app.include_router(memory_router(service))
    model = ModelSetting(db, model_check, settings.default_model, settings.llm_timeout_s)
    app.include_router(admin_router(service, model, ModelQualityReport(db, metrics)))
    app.include_router(console_router())
    app.add_api_route("/console", _to_console, include_in_schema=False)
    app.mount("/console", ConsoleFiles(directory=CONSOLE_DIR, html=True), name="console")
    app.add_api_route("/favicon.ico", _favicon, include_in_schema=False)
    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]
    return app


async def _to_console() -> RedirectResponse:
    """A relative redirect: nothing from the request's Host header goes into it."""
    return RedirectResponse("console/", status_code=308)


async def _favicon() -> FileResponse:
    """Browsers ask for /favicon.ico whatever the page links; the console's icon answers."""
    return FileResponse(CONSOLE_DIR / "favicon.svg", media_type="image/svg+xml")


def _openapi(app: FastAPI) -> dict[str, Any]:
    """Validation errors are answered as 400 with the envelope, never FastAPI's 422; say so, and
    document the two bearer schemes."""
    if app.openapi_schema is not None:
        return app.openapi_schema
    schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
    schema.setdefault("components", {})["securitySchemes"] = {
        "userJwt": {"type": "http", "scheme": "bearer", "bearerFormat": "JWT"},
        "internalToken": {"type": "http", "scheme": "bearer"},
    }
    for path, operations in schema.get("paths", {}).items():
        for operation in operations.values():
            operation.get("responses", {}).pop("422", None)
            if path in UNAUTHENTICATED:
                continue
            scheme = "internalToken" if path.startswith("/internal/") else "userJwt"
            operation["security"] = [{scheme: []}]
    for name in ("HTTPValidationError", "ValidationError"):
        schema["components"].get("schemas", {}).pop(name, None)
    app.openapi_schema = schema
    return schema
