"""/docs works offline: Swagger UI comes from the service itself, under a policy of its own, in
headless Chromium (Debian's package) with every request beyond loopback refused."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
from playwright import async_api as playwright_api

from service.adapters.db.engine import upgrade_schema
from tests.support.processes import OUTPUT, ServiceProcess

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"]
LOOPBACK = {"127.0.0.1", "localhost", "::1", "[::1]"}
# `make screenshots` points this at docs/screenshots.
SHOTS = Path(os.environ.get("MEMORY_SCREENSHOTS_DIR", str(OUTPUT / "screenshots" / "docs")))


@pytest.fixture
def api(tmp_path: Path) -> Iterator[ServiceProcess]:
    url = f"sqlite+aiosqlite:///{tmp_path / 'memory.db'}"
    upgrade_schema(url)
    service = ServiceProcess("api", {"MEMORY_DATABASE_URL": url}, name="api-docs", cwd=tmp_path).start()
    yield service
    service.stop()


async def test_the_api_page_lists_every_operation_without_leaving_loopback(api: ServiceProcess) -> None:
    schema = httpx.get(f"{api.base_url}/openapi.json").json()
    operations = [(method.upper(), path) for path, item in schema["paths"].items() for method in item]
    refused: list[str] = []
    policy_errors: list[str] = []

    async def only_loopback(route: playwright_api.Route) -> None:
        if urlsplit(route.request.url).hostname in LOOPBACK:
            await route.continue_()
        else:
            refused.append(route.request.url)
            await route.abort("internetdisconnected")

    def note_policy_error(message: playwright_api.ConsoleMessage) -> None:
        if "Content Security" in message.text:
            policy_errors.append(message.text)

    async with playwright_api.async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            page = await browser.new_page(viewport={"width": 1280, "height": 900})
            await page.route("**/*", only_loopback)
            page.on("console", note_policy_error)
            response = await page.goto(f"{api.base_url}/docs")
            assert response is not None and response.ok
            await page.wait_for_selector(".opblock", timeout=20_000)
            listed = [
                (
                    (await block.locator(".opblock-summary-method").inner_text()).strip(),
                    (await block.locator(".opblock-summary-path").get_attribute("data-path")),
                )
                for block in await page.locator(".opblock").all()
            ]
            SHOTS.mkdir(parents=True, exist_ok=True)
            await page.screenshot(path=str(SHOTS / "docs-offline.png"))
        finally:
            await browser.close()
    assert sorted(listed) == sorted(operations)
    assert refused == [] and policy_errors == []
    policy = response.headers["content-security-policy"]
    assert "unsafe" not in policy and "script-src 'self';" in policy and "http" not in policy
