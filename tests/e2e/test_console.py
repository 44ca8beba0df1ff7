"""The console pages in headless Chromium (Debian's package) against the real service and MariaDB."""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright import async_api as playwright_api

from service.adapters.db.database import Database
from service.adapters.db.memory_repository import HistoryEntry
from service.core.model import Group, Scope, Source
from tests.e2e.conftest import JWT_SECRET
from tests.support.pool import items, remember_projects, seed
from tests.support.processes import OUTPUT, ServiceProcess
from tests.support.tokens import token

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
SHOTS = OUTPUT / "screenshots"
# `make screenshots` points this at docs/screenshots.
DOC_SHOTS = Path(os.environ.get("MEMORY_SCREENSHOTS_DIR", str(SHOTS / "docs")))
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
SHANGHAI = "Asia/Shanghai"
PHONE = {"width": 390, "height": 844}
DUPLICATE_TEXT = "已有一条相同内容的记忆"


@pytest.fixture(scope="module")
async def browser() -> AsyncIterator[Any]:
    async with playwright_api.async_playwright() as p:
        instance = await p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield instance
        await instance.close()


@pytest.fixture
async def open_console(browser: Any, service: ServiceProcess, request: pytest.FixtureRequest):  # type: ignore[no-untyped-def]
    pages = []

    async def open_as(  # type: ignore[no-untyped-def]
        user_id: int,
        permissions: list[str] | None = None,
        *,
        jwt: str | None = None,
        viewport: dict[str, int] | None = None,
        failures: list[str] | None = None,
    ):
        # CSP bypassed for the test driver only; the escaping itself is what the XSS test checks.
        # An English locale in Shanghai: times must still read YYYY-MM-DD HH:mm in UTC+8.
        context = await browser.new_context(
            bypass_csp=True,
            timezone_id=SHANGHAI,
            locale="en-US",
            viewport=viewport or {"width": 1280, "height": 720},
        )
        page = await context.new_page()
        page.on("dialog", lambda d: d.accept())  # the delete confirmation
        if failures is not None:
            page.on("response", lambda r: failures.append(r.url) if r.status >= 400 else None)
        jwt = jwt or token(user_id, permissions, secret=JWT_SECRET)
        await page.goto(f"{service.base_url}/console/#token={jwt}")
        await page.wait_for_function(
            "document.getElementById('page-info').textContent.length > 0"
            " || !document.getElementById('error').hidden"
        )
        pages.append(page)
        return page

    yield open_as
    SHOTS.mkdir(parents=True, exist_ok=True)
    for i, page in enumerate(pages):
        await page.screenshot(path=str(SHOTS / f"{request.node.name}-{i}.png"), full_page=True)
        await page.context.close()


async def open_add(page) -> None:  # type: ignore[no-untyped-def]
    await page.click("#add-open")
    await page.wait_for_selector("#add-dialog[open]")


async def add_memory(page, content: str, scope: str = "USER") -> None:  # type: ignore[no-untyped-def]
    await open_add(page)
    await page.select_option("#add-scope", scope)
    await page.fill("#add-content", content)
    await page.click("#add-submit")
    await page.wait_for_selector(f"#memory-list li:has-text('{content}')")


async def test_add_a_user_memory_and_see_it_listed(open_console, user_id: int) -> None:  # type: ignore[no-untyped-def]
    page = await open_console(user_id)
    await open_add(page)
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
    await remember_projects(mysql_db, user_id, "mao")
    page = await open_console(user_id)
    await open_add(page)
    await page.select_option("#add-scope", "PROJECT")
    assert await page.locator("#add-project option").all_text_contents() == ["mao"]
    await page.fill("#add-content", "仓库测试用 Vitest")
    await page.click("#add-submit")
    row = page.locator("#memory-list li", has_text="仓库测试用 Vitest")
    await row.wait_for()
    assert await row.locator(".project").text_content() == "项目: mao"


async def test_audit_reads_another_user_in_chinese_and_the_tab_is_only_for_memory_read(
    open_console, user_id: int, mysql_db: Database
) -> None:  # type: ignore[no-untyped-def]
    await seed(mysql_db, user_id + 1, "被审计用户的记忆", group=Group(Scope.PROJECT, "mao"))
    auditor = await open_console(user_id, ["memory:read"])
    assert await auditor.text_content("#whoami-user") == f"用户 {user_id}"
    assert await auditor.text_content("#whoami-permissions") == "审计"
    await auditor.click("#nav-audit")
    assert await auditor.text_content(".notice") == "本页面用于审计用户记忆内容,仅供治理用途"
    await auditor.fill("#audit-user", str(user_id + 1))
    await auditor.click("#audit-form button")
    row = auditor.locator("#audit-table tbody tr", has_text="被审计用户的记忆")
    await row.wait_for()
    cells = await row.locator("td").all_text_contents()
    assert cells[1:3] + cells[4:6] == ["项目", "mao", "自动", "生效中"]
    assert await auditor.text_content("#audit-page-info") == "第 1 / 1 页 · 共 1 条"

    outsider = await open_console(user_id + 2)
    assert await outsider.is_hidden("#nav-audit")
    assert await outsider.text_content("#whoami-user") == f"用户 {user_id + 2}"
    assert await outsider.text_content("#whoami-permissions") == ""


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
    await open_add(page)
    await page.fill("#add-content", hostile)
    await page.click("#add-submit")
    await page.wait_for_timeout(500)
    assert await page.evaluate("window.__pwned") is None
    texts = await page.locator("#memory-list .content").all_text_contents()
    assert hostile in texts and await page.locator("#memory-list script, #memory-list img").count() == 0


# --- the rough edges a first-time user met -------------------------------------------------------


async def test_cancel_or_escape_in_the_add_dialog_creates_nothing(
    open_console, user_id: int, mysql_db: Database
) -> None:  # type: ignore[no-untyped-def]
    page = await open_console(user_id)
    await open_add(page)
    await page.fill("#add-content", "取消了就不该保存")
    await page.click("#add-cancel")
    assert not await page.evaluate("document.getElementById('add-dialog').open")
    await open_add(page)
    await page.fill("#add-content", "按 Esc 也不该保存")
    await page.keyboard.press("Escape")
    assert not await page.evaluate("document.getElementById('add-dialog').open")
    await page.wait_for_timeout(500)
    assert await items(mysql_db, user_id) == []
    assert await page.locator("#memory-list li").count() == 0


async def test_the_add_dialog_opens_empty_on_the_user_scope_every_time(
    open_console, user_id: int, mysql_db: Database
) -> None:  # type: ignore[no-untyped-def]
    await remember_projects(mysql_db, user_id, "mao")
    page = await open_console(user_id)
    await add_memory(page, "第一次存的是项目记忆", scope="PROJECT")
    await open_add(page)
    assert await page.input_value("#add-scope") == "USER"
    assert await page.is_hidden("#add-project-label")
    assert await page.input_value("#add-content") == ""
    assert await page.text_content("#add-counter") == "0/500"
    assert await page.is_disabled("#add-submit")


async def test_an_error_in_the_dialog_is_shown_there_in_chinese_and_leaves_with_it(
    open_console, user_id: int
) -> None:  # type: ignore[no-untyped-def]
    page = await open_console(user_id)
    await add_memory(page, "只能有一条")
    await open_add(page)
    await page.fill("#add-content", "只能有一条")
    await page.click("#add-submit")
    await page.wait_for_selector(f"#add-error:has-text('{DUPLICATE_TEXT}')")
    assert await page.get_attribute("#add-error", "title") == "MEMORY_CONTENT_DUPLICATE"
    assert await page.is_hidden("#error")
    await page.click("#add-cancel")
    assert await page.is_hidden("#add-error") and await page.is_hidden("#error")
    await open_add(page)
    assert await page.is_hidden("#add-error")


async def test_a_new_token_in_the_address_of_an_open_tab_takes_over_and_leaves_the_address(
    open_console, user_id: int, mysql_db: Database
) -> None:  # type: ignore[no-untyped-def]
    await seed(mysql_db, user_id, "甲的记忆")
    await seed(mysql_db, user_id + 1, "乙的记忆")
    page = await open_console(user_id)
    await page.wait_for_selector("#memory-list li:has-text('甲的记忆')")
    assert "token" not in page.url
    other = token(user_id + 1, ["memory:read"], secret=JWT_SECRET)
    await page.evaluate("(t) => { location.hash = 'token=' + t; }", other)
    await page.wait_for_selector("#memory-list li:has-text('乙的记忆')")
    assert await page.locator("#memory-list li", has_text="甲的记忆").count() == 0
    assert "token" not in page.url
    assert await page.text_content("#whoami-user") == f"用户 {user_id + 1}"
    assert await page.is_visible("#nav-audit")


async def test_switching_to_an_admin_token_shows_the_model_setting_at_once(
    open_console, user_id: int
) -> None:  # type: ignore[no-untyped-def]
    page = await open_console(user_id, ["memory:read"])
    await page.click("#nav-audit")
    assert await page.is_hidden("#model-setting")
    await page.fill("#token", token(user_id, ["memory:read", "memory:admin"], secret=JWT_SECRET))
    await page.click("#token-form button")
    await page.wait_for_selector("#model-effective:has-text('scripted-default')")
    assert await page.is_visible("#page-audit")
    assert await page.text_content("#whoami-permissions") == "审计 · 管理"


async def test_a_reader_token_replaced_by_a_plain_one_leaves_the_audit_page_and_its_rows(
    open_console, user_id: int, mysql_db: Database
) -> None:  # type: ignore[no-untyped-def]
    await seed(mysql_db, user_id + 1, "不该留在屏幕上")
    page = await open_console(user_id, ["memory:read"])
    await page.click("#nav-audit")
    await page.fill("#audit-user", str(user_id + 1))
    await page.click("#audit-form button")
    await page.wait_for_selector("#audit-table td:has-text('不该留在屏幕上')")
    await page.fill("#token", token(user_id, secret=JWT_SECRET))
    await page.click("#token-form button")
    await page.wait_for_selector("#page-memory:not([hidden])")
    assert await page.is_hidden("#nav-audit")
    assert await page.locator("#audit-table td").count() == 0


async def test_an_expired_token_is_explained_in_chinese(open_console, user_id: int) -> None:  # type: ignore[no-untyped-def]
    page = await open_console(user_id, jwt=token(user_id, ttl_s=-60, secret=JWT_SECRET))
    await page.wait_for_selector("#error:not([hidden])")
    assert await page.text_content("#error") == "令牌无效或已过期,请重新输入平台签发的令牌"
    assert await page.get_attribute("#error", "title") == "invalid token: expired"


async def test_sign_out_forgets_the_token(open_console, user_id: int, mysql_db: Database) -> None:  # type: ignore[no-untyped-def]
    await seed(mysql_db, user_id, "退出后不该看到")
    page = await open_console(user_id)
    await page.wait_for_selector("#memory-list li")
    await page.click("#sign-out")
    await page.wait_for_selector("#whoami", state="hidden")
    assert await page.locator("#memory-list li").count() == 0
    assert await page.evaluate("sessionStorage.getItem('memoryToken')") is None
    assert await page.text_content("#error") == "请先输入平台签发的令牌 (JWT)"


async def test_history_and_dates_are_in_chinese_and_local_time(
    open_console, user_id: int, mysql_db: Database
) -> None:  # type: ignore[no-untyped-def]
    row_id = await seed(mysql_db, user_id, "周报用中文写")
    async with mysql_db.transaction() as uow:
        await uow.memories.record(
            user_id, row_id, HistoryEntry("insert", "auto", new_content="周报用中文写"), mysql_db.now()
        )
        await uow.commit()
    (item,) = await items(mysql_db, user_id)
    shanghai = (item.updated_at + timedelta(hours=8)).strftime("%Y-%m-%d %H:%M")
    page = await open_console(user_id)
    row = page.locator("#memory-list li", has_text="周报用中文写")
    assert await row.locator("time").text_content() == shanghai
    assert await page.text_content("#page-info") == "第 1 / 1 页 · 共 1 条"
    await row.locator("button.history").click()
    entry = page.locator("#history-list li").first
    assert await entry.locator("strong").text_content() == "自动新增 · 自动收集"
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d", await entry.locator(".when").text_content() or "")


async def test_the_counter_and_the_limit_count_characters_not_utf16_units(
    open_console, user_id: int, mysql_db: Database
) -> None:  # type: ignore[no-untyped-def]
    page = await open_console(user_id)
    await open_add(page)
    await page.fill("#add-content", "😀" * 501)
    assert await page.text_content("#add-counter") == "501/500"
    assert await page.is_disabled("#add-submit")
    await page.fill("#add-content", "😀" * 500)
    assert await page.text_content("#add-counter") == "500/500"
    await page.click("#add-submit")
    await page.wait_for_selector("#memory-list li")
    (item,) = await items(mysql_db, user_id)
    assert item.content == "😀" * 500
    await page.locator("#memory-list li button.edit").click()
    await page.locator("#memory-list textarea").press("End")
    await page.keyboard.type("😀")
    assert await page.text_content("#memory-list .counter") == "501/500"
    assert await page.is_disabled("#memory-list button.save")


@pytest.mark.parametrize("width", [360, 390])
async def test_a_phone_width_keeps_every_label_on_one_line_and_nothing_scrolls_sideways(
    open_console, user_id: int, mysql_db: Database, width: int
) -> None:  # type: ignore[no-untyped-def]
    await seed(mysql_db, user_id, "手机上也要一行一行地读得清楚")
    page = await open_console(
        user_id, ["memory:read", "memory:admin"], viewport={"width": width, "height": 800}
    )
    await page.wait_for_selector("#memory-list li")
    overflow = await page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
    assert overflow <= 0
    wrapped = await page.evaluate(
        """() => [...document.querySelectorAll('button')].filter((b) => b.offsetParent !== null)
              .filter((b) => {
                const line = parseFloat(getComputedStyle(b).lineHeight);
                return b.getBoundingClientRect().height > 2 * line;
              })
              .map((b) => b.textContent)"""
    )
    assert wrapped == []


async def test_every_request_of_a_page_load_succeeds_and_buttons_wear_the_console_style(
    open_console, user_id: int, service: ServiceProcess
) -> None:  # type: ignore[no-untyped-def]
    failures: list[str] = []
    page = await open_console(user_id, failures=failures)
    await page.wait_for_timeout(300)
    assert failures == []
    async with httpx.AsyncClient() as client:
        icon = await client.get(f"{service.base_url}/favicon.ico")
    assert icon.status_code == 200 and icon.headers["content-type"] == "image/svg+xml"
    unstyled = await page.evaluate(
        """() => [...document.querySelectorAll('button')].filter((b) => {
              const s = getComputedStyle(b);
              return s.fontFamily !== getComputedStyle(document.body).fontFamily
                  || !b.disabled && s.cursor !== 'pointer' || s.color === s.backgroundColor
                  || s.borderTopLeftRadius === '0px' && !b.classList.contains('scope');
           }).map((b) => b.id || b.textContent)"""
    )
    assert unstyled == []


async def test_screenshots_for_the_docs(open_console, user_id: int, mysql_db: Database) -> None:  # type: ignore[no-untyped-def]
    """Not a check: the pictures docs/ shows (`make screenshots` writes them there)."""
    await remember_projects(mysql_db, user_id, "mao")
    await seed(mysql_db, user_id, "该仓库测试用 Vitest,提交前跑 pnpm test", group=Group(Scope.PROJECT, "mao"))
    await seed(mysql_db, user_id, "周报和总结都用中文写,结论放在最前面")
    await seed(mysql_db, user_id, "偏好 TypeScript 严格模式", source=Source.MANUAL)
    DOC_SHOTS.mkdir(parents=True, exist_ok=True)
    page = await open_console(user_id, ["memory:read", "memory:admin"])
    await page.wait_for_selector("#memory-list li")
    await page.screenshot(path=str(DOC_SHOTS / "memory-page.png"))
    phone = await open_console(user_id, viewport=PHONE)
    await phone.wait_for_selector("#memory-list li")
    await phone.screenshot(path=str(DOC_SHOTS / "memory-page-phone.png"))
    await page.click("#nav-audit")
    await page.fill("#audit-user", str(user_id))
    await page.click("#audit-form button")
    await page.wait_for_selector("#audit-table td")
    await page.wait_for_selector("#model-effective:not(:empty)")
    await page.screenshot(path=str(DOC_SHOTS / "audit-page.png"), full_page=True)
