"""The console pages in headless Chromium (Debian's package) against the real service and MariaDB."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator

import pytest
from playwright import async_api as playwright_api

from service.adapters.db.database import Database
from tests.e2e.conftest import JWT_SECRET
from tests.support.pool import seed
from tests.support.processes import OUTPUT, ServiceProcess
from tests.support.tokens import token

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
SHOTS = OUTPUT / "screenshots"
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture(scope="module")
async def browser() -> AsyncIterator[object]:
    async with playwright_api.async_playwright() as p:
        instance = await p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield instance
        await instance.close()


@pytest.fixture
async def open_console(browser: object, service: ServiceProcess, request: pytest.FixtureRequest):  # type: ignore[no-untyped-def]
    pages = []

    async def open_as(user_id: int, permissions: list[str] | None = None):  # type: ignore[no-untyped-def]
        # CSP bypassed for the test driver only; the escaping itself is what the XSS test checks.
        context = await browser.new_context(bypass_csp=True)  # type: ignore[attr-defined]
        page = await context.new_page()
        page.on("dialog", lambda d: d.accept())  # the delete confirmation
        jwt = token(user_id, permissions, secret=JWT_SECRET)
        await page.goto(f"{service.base_url}/console/#token={jwt}")
        await page.wait_for_function("document.getElementById('page-info').textContent.length > 0")
        pages.append(page)
        return page

    yield open_as
    SHOTS.mkdir(parents=True, exist_ok=True)
    for i, page in enumerate(pages):
        await page.screenshot(path=str(SHOTS / f"{request.node.name}-{i}.png"), full_page=True)
        await page.context.close()


async def add_memory(page, content: str, scope: str = "USER") -> None:  # type: ignore[no-untyped-def]
    await page.click("#add-open")
    await page.select_option("#add-scope", scope)
    await page.fill("#add-content", content)
    await page.click("#add-submit")
    await page.wait_for_selector(f"#memory-list li:has-text('{content}')")


async def test_add_a_user_memory_and_see_it_listed(open_console, user_id: int) -> None:  # type: ignore[no-untyped-def]
    page = await open_console(user_id)
    await page.click("#add-open")
    await page.fill("#add-content", "报告用中文写")
    assert await page.text_content("#add-counter") == "6/500"
    await page.click("#add-submit")
    row = page.locator("#memory-list li", has_text="报告用中文写")
    await row.wait_for()
    assert await row.locator(".badge").text_content() == "手动"


async def test_edit_inline(open_console, user_id: int) -> None:  # type: ignore[no-untyped-def]
    page = await open_console(user_id)
    await add_memory(page, "原来的内容")
    await page.locator("#memory-list li", has_text="原来的内容").locator("button.edit").click()
    await page.fill("#memory-list textarea", "改过的内容")
    await page.click("#memory-list button.save")
    await page.wait_for_selector("#memory-list li:has-text('改过的内容')")
    assert await page.locator("#memory-list li", has_text="原来的内容").count() == 0


async def test_dismiss_and_restore(open_console, user_id: int) -> None:  # type: ignore[no-untyped-def]
    page = await open_console(user_id)
    await add_memory(page, "可以忽略的记忆")
    await page.locator("#memory-list li", has_text="可以忽略的记忆").locator("button.dismiss").click()
    await page.wait_for_selector("#memory-list li:has-text('可以忽略的记忆')", state="detached")
    await page.select_option("#status-filter", "DISMISSED")
    await page.locator("#memory-list li", has_text="可以忽略的记忆").locator("button.restore").click()
    await page.wait_for_selector("#memory-list li:has-text('可以忽略的记忆')", state="detached")
    await page.select_option("#status-filter", "ACTIVE")
    await page.wait_for_selector("#memory-list li:has-text('可以忽略的记忆')")


async def test_delete_with_confirmation(open_console, user_id: int, mysql_db: Database) -> None:  # type: ignore[no-untyped-def]
    from tests.support.pool import items

    page = await open_console(user_id)
    await add_memory(page, "要删除的记忆")
    await page.locator("#memory-list li", has_text="要删除的记忆").locator("button.delete").click()
    await page.wait_for_selector("#memory-list li:has-text('要删除的记忆')", state="detached")
    assert await items(mysql_db, user_id) == []


async def test_auto_capture_switch_survives_a_reload(open_console, user_id: int) -> None:  # type: ignore[no-untyped-def]
    page = await open_console(user_id)
    assert not await page.is_checked("#auto-capture")
    await page.click("#auto-capture")
    await page.wait_for_timeout(300)
    await page.reload()
    await page.wait_for_function("document.getElementById('auto-capture').checked === true")


async def test_add_a_project_memory_through_the_dropdown(
    open_console, user_id: int, mysql_db: Database
) -> None:  # type: ignore[no-untyped-def]
    async with mysql_db.transaction() as uow:
        await uow.accounts.remember_project(user_id, "mao", mysql_db.now())
        await uow.commit()
    page = await open_console(user_id)
    await page.click("#add-open")
    await page.select_option("#add-scope", "PROJECT")
    assert await page.locator("#add-project option").all_text_contents() == ["mao"]
    await page.fill("#add-content", "仓库测试用 Vitest")
    await page.click("#add-submit")
    row = page.locator("#memory-list li", has_text="仓库测试用 Vitest")
    await row.wait_for()
    assert await row.locator(".project").text_content() == "项目: mao"


async def test_audit_reads_another_user_with_memory_read_and_is_refused_without(
    open_console, user_id: int, mysql_db: Database
) -> None:  # type: ignore[no-untyped-def]
    await seed(mysql_db, user_id + 1, "被审计用户的记忆")
    auditor = await open_console(user_id, ["memory:read"])
    await auditor.click("#nav-audit")
    assert await auditor.text_content(".notice") == "本页面用于审计用户记忆内容,仅供治理用途"
    await auditor.fill("#audit-user", str(user_id + 1))
    await auditor.click("#audit-form button")
    await auditor.wait_for_selector("#audit-table td:has-text('被审计用户的记忆')")
    outsider = await open_console(user_id + 2)
    await outsider.click("#nav-audit")
    await outsider.fill("#audit-user", str(user_id + 1))
    await outsider.click("#audit-form button")
    await outsider.wait_for_selector("#error:has-text('permission memory:read required')")
    assert await outsider.locator("#audit-table td").count() == 0


async def test_change_the_extraction_model(open_console, user_id: int, mysql_db: Database) -> None:  # type: ignore[no-untyped-def]
    page = await open_console(user_id, ["memory:read", "memory:admin"])
    await page.click("#nav-audit")
    await page.wait_for_selector("#model-setting:not([hidden])")
    await page.fill("#model-id", "openai/from-the-console")
    await page.click("#model-form button")
    await page.wait_for_selector("#model-effective:has-text('openai/from-the-console')")
    async with mysql_db.read() as uow:
        assert await uow.accounts.extraction_model() == "openai/from-the-console"
    await page.fill("#model-id", "")
    await page.click("#model-form button")
    await page.wait_for_selector("#model-effective:has-text('scripted-default')")


async def test_a_script_memory_renders_as_text_and_never_runs(open_console, user_id: int) -> None:  # type: ignore[no-untyped-def]
    page = await open_console(user_id)
    hostile = '<script>window.__pwned = 1</script><img src=x onerror="window.__pwned = 2">'
    await add_memory(page, "<script>window.__pwned = 1</script>")
    await page.click("#add-open")
    await page.fill("#add-content", hostile)
    await page.click("#add-submit")
    await page.wait_for_timeout(500)
    assert await page.evaluate("window.__pwned") is None
    texts = await page.locator("#memory-list .content").all_text_contents()
    assert hostile in texts and await page.locator("#memory-list script, #memory-list img").count() == 0
