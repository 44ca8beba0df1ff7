"""The FastAPI application: ops endpoints always, the memory API unless this process is a bare worker."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastapi import FastAPI

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
    app.include_router(ops_router(container.metrics.registry, checks))
    return app
