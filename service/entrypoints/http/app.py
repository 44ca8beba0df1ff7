"""The HTTP applications: the API port's (the ops endpoints always, the memory API unless this
process is a bare worker), and the ops port's (the ops endpoints alone, `docs/operations.md`, "Ports").

A bare worker's app is plain Starlette: FastAPI, the API's modules and their models would cost it
8 MiB for three routes (`docs/performance.md`, case 7)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from starlette.applications import Starlette
from starlette.routing import Route

from service.entrypoints.http.body_limit import BodyLimit
from service.entrypoints.http.envelope import install_error_handlers
from service.entrypoints.http.no_store import NoStore
from service.entrypoints.http.ops import Check, ops_routes

if TYPE_CHECKING:
    from service.adapters.db.database import Database
    from service.adapters.metrics import Metrics
    from service.app.caches import CaptureSwitch
    from service.app.ports import ModelCheck
    from service.config import Settings


def create_apps(
    settings: Settings,
    metrics: Metrics,
    db: Database,
    capture: CaptureSwitch,
    model_check: ModelCheck,
    include_api: bool,
    checks: dict[str, Check],
) -> tuple[Starlette, Starlette]:
    """The API port's app and the ops port's, sharing the ops routes (and so their readiness state)."""
    routes = ops_routes(metrics, checks)
    if include_api:
        from service.entrypoints.http.api_app import create_api_app

        api = _guarded(create_api_app(settings, db, capture, metrics, model_check, routes))
    else:
        api = _bare(routes)
    return api, _bare(routes)


def _bare(routes: list[Route]) -> Starlette:
    app = Starlette(routes=routes)
    # A redirect to the slash-less path would be built from the Host header, which the client
    # chooses: an unknown path is a 404 instead.
    app.router.redirect_slashes = False
    return _guarded(app)


def _guarded(app: Starlette) -> Starlette:
    install_error_handlers(app)
    app.add_middleware(BodyLimit)
    app.add_middleware(NoStore)  # outside BodyLimit: its 413 is kept out of caches too
    return app
