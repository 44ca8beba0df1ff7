"""The HTTP application: the ops endpoints always, the memory API unless this process is a bare worker.

A bare worker's app is plain Starlette: FastAPI, the API's modules and their models would cost it
8 MiB for three routes (`docs/performance.md`, case 7)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from starlette.applications import Starlette

from service.entrypoints.http.body_limit import BodyLimit
from service.entrypoints.http.envelope import install_error_handlers
from service.entrypoints.http.no_store import NoStore
from service.entrypoints.http.ops import Check, ops_routes

if TYPE_CHECKING:
    from service.adapters.db.database import Database
    from service.adapters.metrics import Metrics
    from service.app.caches import CaptureSwitch
    from service.config import Settings


def create_app(
    settings: Settings,
    metrics: Metrics,
    db: Database,
    capture: CaptureSwitch,
    include_api: bool,
    checks: dict[str, Check],
) -> Starlette:
    routes = ops_routes(metrics, checks)
    if include_api:
        from service.entrypoints.http.api_app import create_api_app

        app: Starlette = create_api_app(settings, db, capture, metrics, routes)
    else:
        app = Starlette(routes=routes)
        # A redirect to the slash-less path would be built from the Host header, which the client
        # chooses: an unknown path is a 404 instead.
        app.router.redirect_slashes = False
    install_error_handlers(app)
    app.add_middleware(BodyLimit)
    app.add_middleware(NoStore)  # outside BodyLimit: its 413 is kept out of caches too
    return app
