"""The FastAPI application: ops endpoints always, the memory API unless this process is a bare worker."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastapi import FastAPI

from service.app.memories import MemoryService
from service.entrypoints.http.admin_routes import admin_router
from service.entrypoints.http.auth import Authenticator
from service.entrypoints.http.body_limit import BodyLimit
from service.entrypoints.http.envelope import install_error_handlers
from service.entrypoints.http.internal_routes import internal_router
from service.entrypoints.http.memory_routes import memory_router
from service.entrypoints.http.ops import Check, ops_router

if TYPE_CHECKING:
    from service.bootstrap import Container


def create_app(container: Container, include_api: bool, checks: dict[str, Check]) -> FastAPI:
    app = FastAPI(
        title="mao-memory",
        version="0.1.0",
        description="Cross-session long-term memory: user CRUD, auto-capture switch, admin audit, injection.",
        docs_url=None,
        redoc_url=None,
    )
    install_error_handlers(app)
    app.add_middleware(BodyLimit)
    app.include_router(ops_router(container.metrics.registry, checks))
    if include_api:
        settings = container.settings
        app.state.authenticator = Authenticator(settings)
        service = MemoryService(container.db, container.capture, settings.robot_project_keys)
        app.include_router(memory_router(service))
        app.include_router(admin_router(service))
        app.include_router(internal_router(service, settings))
    return app
