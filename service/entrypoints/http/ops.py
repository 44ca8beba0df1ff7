"""Liveness, readiness and Prometheus metrics: what the orchestrator and the scraper call.

Plain Starlette routes: a bare worker serves only these, and FastAPI would cost it 5 MiB."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from service.adapters.metrics import Metrics

# A check answers True (ready), False (not ready), or ready with a note for /readyz to show.
Check = Callable[[], Awaitable[bool | str]]


class CheckFailed(Exception):
    """Raised by a check that knows why it fails: /readyz shows the reason beside `fail`."""


CHECK_TIMEOUT_S = 2.0


REFRESH_EVERY_S = 10.0


def ops_routes(metrics: Metrics, checks: dict[str, Check]) -> list[Route]:
    refreshing: set[asyncio.Task[dict[str, Verdict]]] = set()
    last_refresh = [0.0]

    async def run_checks() -> dict[str, Verdict]:
        last_refresh[0] = time.monotonic()
        results = await asyncio.gather(*(_run(check) for check in checks.values()))
        status = dict(zip(checks, results, strict=True))
        metrics.ready.set(1 if all(r.ready for r in results) else 0)
        return status

    def refresh_in_background() -> None:
        """A scrape never waits for, nor repeats, the checks: at most one run per ten seconds."""
        if refreshing or time.monotonic() - last_refresh[0] < REFRESH_EVERY_S:
            return
        task = asyncio.create_task(run_checks())
        refreshing.add(task)
        task.add_done_callback(refreshing.discard)

    async def healthz(_: Request) -> JSONResponse:
        """The process is up and its event loop answers."""
        return JSONResponse({"status": "ok"})

    async def readyz(_: Request) -> JSONResponse:
        """Ready when every dependency (database, broker) answers within two seconds."""
        status = await run_checks()
        ready = all(v.ready for v in status.values())
        return JSONResponse(
            {
                "status": "ok" if ready else "unavailable",
                "checks": {k: v.shown() for k, v in status.items()},
            },
            status_code=200 if ready else 503,
        )

    async def scrape(_: Request) -> Response:
        """Scrapes keep `mao_memory_ready` fresh, so the readiness alert needs no other prober."""
        refresh_in_background()
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return [
        Route("/healthz", healthz, methods=["GET"], include_in_schema=False),
        Route("/readyz", readyz, methods=["GET"], include_in_schema=False),
        Route("/metrics", scrape, methods=["GET"], include_in_schema=False),
    ]


@dataclass(frozen=True, slots=True)
class Verdict:
    ready: bool
    why: str = ""  # a failed check's reason, or a ready one's note

    def shown(self) -> str:
        said = "ok" if self.ready else "fail"
        return f"{said}: {self.why}" if self.why else said


async def _run(check: Check) -> Verdict:
    try:
        result = await asyncio.wait_for(check(), timeout=CHECK_TIMEOUT_S)
    except CheckFailed as exc:
        return Verdict(False, str(exc))
    except Exception:
        return Verdict(False)
    return Verdict(True, result) if isinstance(result, str) else Verdict(result)
