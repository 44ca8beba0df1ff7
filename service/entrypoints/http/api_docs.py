"""The interactive API page at /docs: Swagger UI served by the service itself, from the
swagger-ui-bundle-v2 package, so the page works without the internet (FastAPI's own page loads
Swagger UI from a CDN), under a policy that runs only the page's own files."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from html import escape
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import FileResponse, HTMLResponse, Response
from swagger_ui_bundle import swagger_ui_path

SWAGGER_UI = Path(swagger_ui_path)
# Swagger UI's stylesheet draws its icons from data: URIs; nothing else is needed beyond 'self'.
POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "object-src 'none'; frame-ancestors 'none'"
)
HEADERS = {"Content-Security-Policy": POLICY, "X-Content-Type-Options": "nosniff"}
ASSETS = {"swagger-ui.css": "text/css", "swagger-ui-bundle.js": "text/javascript"}
# FastAPI's page settings, in a file of its own: the policy runs no inline script.
START = """\
const root = document.getElementById("swagger-ui");
window.ui = SwaggerUIBundle({
  url: root.dataset.openapi,
  dom_id: "#swagger-ui",
  layout: "BaseLayout",
  deepLinking: true,
  showExtensions: true,
  showCommonExtensions: true,
  presets: [SwaggerUIBundle.presets.apis, SwaggerUIBundle.SwaggerUIStandalonePreset],
});
"""
PAGE = """\
<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{title} - API</title>
<link rel="stylesheet" href="{docs}/swagger-ui.css">
</head>
<body>
<div id="swagger-ui" data-openapi="{openapi}"></div>
<script src="{docs}/swagger-ui-bundle.js"></script>
<script src="{docs}/start.js"></script>
</body>
</html>
"""


def install_api_docs(app: FastAPI, path: str = "/docs") -> None:
    """/docs, its start script and Swagger UI's two files (`ASSETS`), nothing else of the package."""

    async def page(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        html = PAGE.format(
            title=escape(app.title), docs=escape(root + path), openapi=escape(f"{root}{app.openapi_url}")
        )
        return HTMLResponse(html, headers=HEADERS)

    async def start() -> Response:
        return Response(START, media_type="text/javascript", headers=HEADERS)

    app.add_api_route(path, page, include_in_schema=False)
    app.add_api_route(f"{path}/start.js", start, include_in_schema=False)
    for name, media_type in ASSETS.items():
        app.add_api_route(f"{path}/{name}", _asset(name, media_type), include_in_schema=False)


def _asset(name: str, media_type: str) -> Callable[[], Awaitable[FileResponse]]:
    async def serve() -> FileResponse:
        return FileResponse(SWAGGER_UI / name, media_type=media_type, headers=HEADERS)

    return serve
