"""The console pages in headless Chromium (Debian's package) against the real service and MariaDB."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import sqlite3
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiokafka import AIOKafkaProducer
from playwright import async_api as playwright_api

from service.adapters.db.database import Database
from service.adapters.db.engine import upgrade_schema
from service.core.model import USER_GROUP, DismissedBy, Group, Scope, Source, Status
from service.core.normalize import dedup_hash
from service.core.records import HistoryAction, HistoryActor, HistoryEntry
from tests.conftest import event_payload, said
from tests.e2e.conftest import JWT_SECRET, Topics, publish, read_topic
from tests.support.backends import Broker
from tests.support.pool import items, remember_projects, seed, set_capture
from tests.support.processes import OUTPUT, ServiceProcess, free_port
from tests.support.scripted_llm import ScriptedLlm
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
SIGN_IN_PROMPT = "请先输入平台签发的令牌 (JWT)"
SIGNED_IN_OR_REFUSED = (
    "document.getElementById('page-info').textContent.length > 0"
    " || document.getElementById('error').title !== ''"
)


@pytest.fixture(scope="module")
async def playwright() -> AsyncIterator[Any]:
    async with playwright_api.async_playwright() as p:
        yield p


@pytest.fixture(scope="module")
async def browser(playwright: Any) -> AsyncIterator[Any]:
    instance = await playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS)
    yield instance
    await instance.close()


async def paste_token(page, jwt: str) -> None:  # type: ignore[no-untyped-def]
    await page.fill("#token", jwt)
    await page.click("#token-form button")
    await page.wait_for_function(SIGNED_IN_OR_REFUSED)


async def follow_link(page, jwt: str, code: str = "a-one-time-code") -> None:  # type: ignore[no-untyped-def]
    """A sign-in link followed in this tab; its code exchanged (by a stand-in server) for `jwt`."""

    async def exchange(route) -> None:  # type: ignore[no-untyped-def]
        assert route.request.post_data_json == {"code": code}
        await route.fulfill(json={"code": 0, "message": "success", "data": {"token": jwt}})

    await page.route("**/api/v1/console/session", exchange)
    await page.evaluate("(code) => { location.hash = 'code=' + code; }", code)


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
        if failures is not None:
            page.on("response", lambda r: failures.append(r.url) if r.status >= 400 else None)
        await page.goto(f"{service.base_url}/console/")
        await paste_token(page, jwt or token(user_id, permissions, secret=JWT_SECRET))
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


async def test_delete_asks_in_the_page_in_chinese_never_a_native_dialog(
    open_console, user_id: int, mysql_db: Database
) -> None:  # type: ignore[no-untyped-def]
    page = await open_console(user_id)
    native: list[str] = []

    async def refuse(dialog) -> None:  # type: ignore[no-untyped-def]
        native.append(dialog.message)
        await dialog.dismiss()

    page.on("dialog", refuse)
    await add_memory(page, "要删除的记忆")
    row = page.locator("#memory-list li", has_text="要删除的记忆")
    await row.locator("button.delete").click()
    await page.wait_for_selector("#confirm-dialog[open]")
    assert await page.text_content("#confirm-title") == "删除这条记忆?"
    assert await page.text_content("#confirm-text") == "删除后不可恢复。"
    await page.click("#confirm-dialog button:text('取消')")
    assert await page.is_hidden("#confirm-dialog") and len(await items(mysql_db, user_id)) == 1
    await row.locator("button.delete").click()
    await page.click("#confirm-ok:text('删除')")
    await page.wait_for_selector("#memory-list li:has-text('要删除的记忆')", state="detached")
    assert await items(mysql_db, user_id) == [] and native == []


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


async def test_the_admin_page_says_while_the_model_rejects_events(  # type: ignore[no-untyped-def]
    open_console,
    user_id: int,
    mysql_db: Database,
    llm: ScriptedLlm,
    producer: AIOKafkaProducer,
    broker: Broker,
    topics: Topics,
) -> None:
    """A model the provider does not serve, saved without the probe: its events are dead-lettered as
    `model_rejected`, and the admin page says how many and the last error; the probe then refuses the
    same name, and setting the model again clears the notice."""
    marker = f"typo{user_id}"
    llm.script(marker, status=404, only_if=lambda r: r.model == "rejected-in-console")
    llm.script("Reply: OK", status=404, only_if=lambda r: r.model == "rejected-in-console")
    await set_capture(mysql_db, user_id)
    page = await open_console(user_id, ["memory:read", "memory:admin"])
    await page.click("#nav-audit")
    await page.wait_for_selector("#model-setting:not([hidden])")
    assert await page.is_hidden("#model-rejections")
    try:
        await page.fill("#model-id", "openai/rejected-in-console")
        await page.uncheck("#model-probe")
        await page.click("#model-form button")
        await page.wait_for_selector("#model-effective:has-text('rejected-in-console')")
        for session in (1, 2):
            await publish(
                producer, topics.events, event_payload(user_id, session, lastUserMessage=said(marker))
            )
        for _ in range(100):
            dead = [
                r for r in await read_topic(broker.bootstrap, topics.dlq, 500) if marker.encode() in r.value
            ]
            if len(dead) == 2:
                break
        assert len(dead) == 2
        await page.reload()
        await page.click("#nav-audit")
        notice = await page.wait_for_selector("#model-rejections:not([hidden])")
        text = await notice.text_content()
        assert "模型拒绝了 2 个事件" in text and "model_rejected" in text and "HTTP 404" in text
        await page.screenshot(path=str(SHOTS / "model-rejections.png"), full_page=True)

        await page.check("#model-probe")
        await page.click("#model-form button")
        await page.wait_for_selector("#model-error:has-text('failed a test call (rejected)')")
        assert await page.is_visible("#model-rejections")  # refused: the setting and its count stand
    finally:
        await page.fill("#model-id", "")
        await page.click("#model-form button")
        await page.wait_for_selector("#model-effective:has-text('scripted-default')")
    assert await page.is_hidden("#model-rejections")


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


async def test_a_sign_in_link_for_another_account_asks_before_switching(
    open_console, user_id: int, mysql_db: Database
) -> None:  # type: ignore[no-untyped-def]
    await seed(mysql_db, user_id, "甲的记忆")
    await seed(mysql_db, user_id + 1, "乙的记忆")
    page = await open_console(user_id)
    await page.wait_for_selector("#memory-list li:has-text('甲的记忆')")
    other = token(user_id + 1, ["memory:read"], secret=JWT_SECRET)
    await follow_link(page, other, "link-one")
    await page.wait_for_selector("#confirm-dialog[open]")
    assert "code" not in page.url
    assert f"用户 {user_id + 1}" in (await page.text_content("#confirm-text") or "")
    await page.click("#confirm-dialog button:text('取消')")
    assert await page.text_content("#whoami-user") == f"用户 {user_id}"
    assert await page.locator("#memory-list li", has_text="甲的记忆").count() == 1
    await page.unroute("**/api/v1/console/session")
    await follow_link(page, other, "link-two")
    await page.click("#confirm-ok:text('切换')")
    await page.wait_for_selector("#memory-list li:has-text('乙的记忆')")
    assert await page.locator("#memory-list li", has_text="甲的记忆").count() == 0
    assert await page.text_content("#whoami-user") == f"用户 {user_id + 1}"
    assert await page.is_visible("#nav-audit")


async def test_an_old_token_link_is_never_used_and_the_address_forgets_it_at_once(
    open_console, browser: Any, service: ServiceProcess, user_id: int
) -> None:  # type: ignore[no-untyped-def]
    other = token(user_id + 1, ["memory:read"], secret=JWT_SECRET)
    page = await open_console(user_id)
    await page.evaluate("(jwt) => { location.hash = 'token=' + jwt; }", other)
    await page.wait_for_function("location.href.endsWith('/console/')")
    assert await page.text_content("#whoami-user") == f"用户 {user_id}"
    assert await page.is_hidden("#confirm-dialog")

    fresh = await browser.new_page()
    await fresh.goto(f"{service.base_url}/console/#token={other}")
    await fresh.wait_for_function("location.href.endsWith('/console/')")
    assert await fresh.is_visible("#token") and await fresh.is_hidden("#whoami")
    assert await fresh.evaluate("sessionStorage.getItem('memoryToken')") is None
    await fresh.close()


async def test_a_link_for_the_same_account_with_more_permissions_applies_at_once(
    open_console, user_id: int
) -> None:  # type: ignore[no-untyped-def]
    page = await open_console(user_id, ["memory:read"])
    await page.click("#nav-audit")
    assert await page.is_hidden("#model-setting")
    await follow_link(page, token(user_id, ["memory:read", "memory:admin"], secret=JWT_SECRET))
    await page.wait_for_selector("#model-effective:has-text('scripted-default')")
    assert await page.is_visible("#page-audit") and await page.is_hidden("#confirm-dialog")
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
    await page.click("#sign-out")
    await paste_token(page, token(user_id, secret=JWT_SECRET))
    await page.wait_for_selector("#page-memory:not([hidden])")
    assert await page.is_hidden("#nav-audit")
    assert await page.locator("#audit-table td").count() == 0


async def test_an_expired_token_is_explained_in_chinese(open_console, user_id: int) -> None:  # type: ignore[no-untyped-def]
    page = await open_console(user_id, jwt=token(user_id, ttl_s=-60, secret=JWT_SECRET))
    await page.wait_for_selector("#error:not([hidden])")
    assert await page.text_content("#error") == "令牌无效或已过期,请重新输入平台签发的令牌"
    assert await page.get_attribute("#error", "title") == "invalid token: expired"


async def nothing_of_a_user_is_left(page) -> None:  # type: ignore[no-untyped-def]
    await page.wait_for_selector("#whoami", state="hidden")
    assert await page.locator("#memory-list li").count() == 0
    assert not await page.is_checked("#auto-capture")
    assert await page.text_content("#page-info") == ""
    assert await page.evaluate("sessionStorage.getItem('memoryToken')") is None
    for action in ("#add-open", "#auto-capture", "#nav-memory", "#status-filter", "#next"):
        assert await page.is_hidden(action), action
    assert await page.is_visible("#token")


async def test_sign_out_and_a_refused_token_leave_nothing_of_the_previous_user(
    open_console, user_id: int, mysql_db: Database
) -> None:  # type: ignore[no-untyped-def]
    await seed(mysql_db, user_id, "退出后不该看到")
    await set_capture(mysql_db, user_id)
    page = await open_console(user_id)
    await page.wait_for_selector("#memory-list li")
    assert await page.is_checked("#auto-capture")
    await page.click("#sign-out")
    await nothing_of_a_user_is_left(page)
    assert await page.text_content("#error") == SIGN_IN_PROMPT

    await paste_token(page, token(user_id, secret=JWT_SECRET))
    await page.wait_for_selector("#memory-list li")
    await page.evaluate("sessionStorage.setItem('memoryToken', 'no-longer-a-token')")
    await page.select_option("#status-filter", "DISMISSED")
    await nothing_of_a_user_is_left(page)
    assert await page.text_content("#error") == "令牌无效或已过期,请重新输入平台签发的令牌"


async def test_the_token_field_is_hidden_while_signed_in(open_console, user_id: int) -> None:  # type: ignore[no-untyped-def]
    page = await open_console(user_id)
    assert await page.is_hidden("#token-form") and await page.is_visible("#whoami")
    await page.click("#sign-out")
    await page.wait_for_selector("#token-form", state="visible")


async def test_the_printed_link_signs_in_once_and_leaves_no_token_in_the_profiles_history(
    playwright: Any, browser: Any, tmp_path: Path
) -> None:
    """`make run` without credentials: its console link, opened in a profile kept on disk."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'memory.db'}"
    upgrade_schema(url)
    env = {
        "MEMORY_DATABASE_URL": url,
        "MEMORY_KAFKA_BOOTSTRAP": "",
        "MEMORY_EMBEDDED_KAFKA_PORT": str(free_port()),
        "MEMORY_KAFKA_PARTITIONS": "1",
        "MEMORY_SHUTDOWN_GRACE_S": "1",
    }
    service = ServiceProcess("run", env, name="first-run").start()
    try:
        printed = service.log_path.read_text()
        link = re.findall(r"console:\s+(\S+)", printed)[-1]
        jwt = re.findall(r"user 1 token:\s+(\S+)", printed)[-1]
        profile = tmp_path / "profile"
        context = await playwright.chromium.launch_persistent_context(
            str(profile), executable_path=CHROMIUM, args=ARGS
        )
        page = await context.new_page()
        await page.goto(link)
        await page.wait_for_selector("#whoami-user:text('用户 1')")
        assert page.url == f"{service.base_url}/console/"
        assert await page.evaluate("sessionStorage.getItem('memoryToken')") == jwt
        await context.close()
        with sqlite3.connect(profile / "Default" / "History") as history:
            visited = [row[0] for row in history.execute("SELECT url FROM urls")]
        assert any("/console/" in address for address in visited), visited
        assert not [address for address in visited if jwt in address or "token=" in address]

        again = await browser.new_page()
        await again.goto(link)
        await again.wait_for_selector("#error:has-text('登录链接已失效')")
        assert await again.is_hidden("#whoami") and await again.is_visible("#token")
        await again.close()
    finally:
        service.stop()


async def test_one_row_is_edited_at_a_time_and_cancel_never_reloads_a_draft_away(
    open_console, user_id: int, mysql_db: Database
) -> None:  # type: ignore[no-untyped-def]
    first = await seed(mysql_db, user_id, "第一条", age_minutes=1)
    second = await seed(mysql_db, user_id, "第二条")
    page = await open_console(user_id)
    listed: list[str] = []
    page.on("request", lambda r: listed.append(r.url) if "/api/v1/memory?" in r.url else None)
    row = lambda row_id: page.locator(f"#memory-list li[data-id='{row_id}']")  # noqa: E731
    await row(first).locator("button.edit").click()
    await row(first).locator("textarea").fill("第一条的草稿")
    await row(second).locator("button.edit").click()
    await page.wait_for_selector("#confirm-dialog[open]")
    assert await page.text_content("#confirm-title") == "放弃未保存的修改?"
    await page.click("#confirm-dialog button:text('取消')")
    assert await row(first).locator("textarea").input_value() == "第一条的草稿"
    assert await page.locator("#memory-list textarea").count() == 1
    await page.select_option("#status-filter", "DISMISSED")
    await page.click("#confirm-dialog button:text('取消')")
    await page.wait_for_function("document.getElementById('status-filter').value === 'ACTIVE'")
    assert await row(first).locator("textarea").input_value() == "第一条的草稿"

    await row(second).locator("button.edit").click()
    await page.click("#confirm-ok:text('放弃修改')")
    assert await row(first).locator(".content").text_content() == "第一条"
    assert await page.locator("#memory-list textarea").count() == 1
    await row(second).locator("textarea").fill("第二条的草稿")
    await row(second).locator("button.cancel").click()
    assert await row(second).locator(".content").text_content() == "第二条"
    assert await page.locator("#memory-list textarea").count() == 0 and listed == []


async def test_escape_closes_whatever_is_on_top(open_console, user_id: int) -> None:  # type: ignore[no-untyped-def]
    page = await open_console(user_id)
    await add_memory(page, "正在编辑")
    await add_memory(page, "看它的历史")
    edited, other = [
        await page.locator("#memory-list li", has_text=text).get_attribute("data-id")
        for text in ("正在编辑", "看它的历史")
    ]
    await page.locator(f"#memory-list li[data-id='{edited}'] button.edit").click()
    await page.locator(f"#memory-list li[data-id='{other}'] button.history").click()
    await page.wait_for_selector("#history-drawer", state="visible")
    await open_add(page)
    await page.keyboard.press("Escape")
    assert not await page.evaluate("document.getElementById('add-dialog').open")
    editors = page.locator("#memory-list textarea")
    assert await page.is_visible("#history-drawer") and await editors.count() == 1
    await page.keyboard.press("Escape")
    assert await page.is_hidden("#history-drawer") and await editors.count() == 1
    await page.keyboard.press("Escape")
    assert await editors.count() == 0
    assert await page.locator(f"#memory-list li[data-id='{edited}'] .content").text_content() == "正在编辑"


async def test_saving_a_memory_deleted_elsewhere_removes_its_row_and_counts_it_out(
    open_console, user_id: int, mysql_db: Database, service: ServiceProcess
) -> None:  # type: ignore[no-untyped-def]
    await seed(mysql_db, user_id, "留下的", age_minutes=1)
    gone = await seed(mysql_db, user_id, "在别处删掉的")
    page = await open_console(user_id)
    assert await page.text_content("#page-info") == "第 1 / 1 页 · 共 2 条"
    await page.locator(f"#memory-list li[data-id='{gone}'] button.edit").click()
    await page.fill("#memory-list textarea", "改了也存不下")
    async with httpx.AsyncClient() as client:
        deleted = await client.delete(
            f"{service.base_url}/api/v1/memory/{gone}",
            headers={"Authorization": f"Bearer {token(user_id, secret=JWT_SECRET)}"},
        )
    assert deleted.status_code == 200
    await page.click("#memory-list button.save")
    await page.wait_for_selector(f"#memory-list li[data-id='{gone}']", state="detached")
    assert await page.text_content("#error") == "记忆不存在或已被删除"
    assert await page.text_content("#page-info") == "第 1 / 1 页 · 共 1 条"
    assert await page.locator("#memory-list li", has_text="留下的").count() == 1


async def test_a_double_click_sends_one_request(open_console, user_id: int) -> None:  # type: ignore[no-untyped-def]
    page = await open_console(user_id)
    changes: list[str] = []
    page.on("request", lambda r: changes.append(r.method) if r.method in {"POST", "PATCH"} else None)

    async def slowly(route) -> None:  # type: ignore[no-untyped-def]
        await asyncio.sleep(0.3)
        await route.continue_()

    await page.route("**/api/v1/memory**", slowly)
    await open_add(page)
    await page.fill("#add-content", "双击只存一次")
    await page.dblclick("#add-submit")
    row = page.locator("#memory-list li", has_text="双击只存一次")
    await row.wait_for()
    await row.locator("button.dismiss").dblclick()
    await row.wait_for(state="detached")
    await page.wait_for_timeout(500)
    assert changes == ["POST", "PATCH"]


async def test_the_project_scope_explains_itself_without_projects(
    open_console, user_id: int, mysql_db: Database
) -> None:  # type: ignore[no-untyped-def]
    page = await open_console(user_id)
    await open_add(page)
    assert await page.is_disabled("#add-scope option[value='PROJECT']")
    assert "还没有项目" in (await page.text_content("#add-project-hint") or "")
    assert await page.is_visible("#add-project-hint")
    await page.click("#add-cancel")
    await remember_projects(mysql_db, user_id, "mao")
    await open_add(page)
    assert await page.is_hidden("#add-project-hint")


async def test_dismissed_rows_say_who_dismissed_them(open_console, user_id: int, mysql_db: Database) -> None:  # type: ignore[no-untyped-def]
    for content, by in [("用户不要的", DismissedBy.USER), ("给新记忆让位的", DismissedBy.CAPACITY)]:
        await seed(mysql_db, user_id, content, status=Status.DISMISSED, dismissed_by=by)
    page = await open_console(user_id)
    await page.select_option("#status-filter", "DISMISSED")
    user_row = page.locator("#memory-list li", has_text="用户不要的")
    await user_row.wait_for()
    assert "用户忽略" in (await user_row.locator(".meta").text_content() or "")
    capacity_row = page.locator("#memory-list li", has_text="给新记忆让位的")
    assert "容量降级" in (await capacity_row.locator(".meta").text_content() or "")


async def test_the_empty_list_points_at_the_auto_capture_switch_while_it_is_off(
    open_console, user_id: int
) -> None:  # type: ignore[no-untyped-def]
    page = await open_console(user_id)
    await page.wait_for_selector("#memory-empty", state="visible")
    assert "「自动收集记忆」开关" in (await page.text_content("#memory-empty") or "")
    await page.click("#auto-capture")
    await page.wait_for_selector("#memory-empty:text-is('暂无记忆')")


async def test_history_and_dates_are_in_chinese_and_local_time(
    open_console, user_id: int, mysql_db: Database
) -> None:  # type: ignore[no-untyped-def]
    row_id = await seed(mysql_db, user_id, "周报用中文写")
    async with mysql_db.transaction() as uow:
        await uow.memories.record(
            user_id,
            row_id,
            HistoryEntry(HistoryAction.INSERT, HistoryActor.AUTO, new_content="周报用中文写"),
            mysql_db.now(),
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


async def seed_from_session(db: Database, user_id: int, content: str, session_id: int) -> None:
    """A memory written by session `session_id`, with its insert in the history."""
    async with db.transaction() as uow:
        digest = dedup_hash(Scope.USER, None, content)
        row = await uow.memories.insert(
            user_id, USER_GROUP, content, digest, Source.AUTO, session_id, db.now()
        )
        entry = HistoryEntry(
            HistoryAction.INSERT, HistoryActor.AUTO, new_content=content, session_id=session_id
        )
        await uow.memories.record(user_id, row, entry, db.now())
        await uow.commit()


async def test_the_history_drawer_shows_a_session_id_above_2_53_exactly(
    open_console, user_id: int, mysql_db: Database
) -> None:  # type: ignore[no-untyped-def]
    """9007199254740995 read as a JavaScript number is …996; ids arrive as strings and stay so, on the
    user's page and through the audit's userId above 2^53."""
    session = 2**53 + 3
    audited = 2**53 + 1 + 2 * (user_id // 10_000 % 10**6)  # odd: no JavaScript number equals it
    await seed_from_session(mysql_db, user_id, "会话号很大的记忆", session)
    await seed_from_session(mysql_db, audited, "被审计的大号用户的记忆", session)

    page = await open_console(user_id, ["memory:read"])
    await page.locator("#memory-list li", has_text="会话号很大的记忆").locator("button.history").click()
    session_line = page.locator("#history-list li .when", has_text="会话")
    assert await session_line.text_content() == f"会话 {session}"

    await page.keyboard.press("Escape")
    await page.click("#nav-audit")
    await page.fill("#audit-user", "1e3")  # a number to JavaScript, not an id: refused, never sent
    await page.click("#audit-form button")
    await page.wait_for_selector("#audit-error:not([hidden])")
    await page.fill("#audit-user", str(audited))
    await page.click("#audit-form button")
    row = page.locator("#audit-table tbody tr", has_text="被审计的大号用户的记忆")
    await row.click()
    await page.wait_for_selector("#history-drawer", state="visible")
    assert await session_line.text_content() == f"会话 {session}"
    (item,) = await items(mysql_db, audited)
    assert await row.locator("td").first.text_content() == str(item.id)


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


async def test_the_history_of_a_memory_deleted_elsewhere_says_its_words_were_deleted_and_when(
    open_console, user_id: int, mysql_db: Database, service: ServiceProcess
) -> None:  # type: ignore[no-untyped-def]
    headers = {"Authorization": f"Bearer {token(user_id, secret=JWT_SECRET)}"}
    async with httpx.AsyncClient(base_url=service.base_url, headers=headers) as client:
        created = await client.post("/api/v1/memory", json={"scope": "USER", "content": "血压偏高,饮食清淡"})
        memory = created.json()["data"]["id"]
        page = await open_console(user_id)  # the row listed here, then deleted on another device
        assert (await client.delete(f"/api/v1/memory/{memory}")).status_code == 200
    await page.locator(f"#memory-list li[data-id='{memory}'] button.history").click()
    await page.wait_for_selector("#history-drawer", state="visible")
    entries = page.locator("#history-list li")
    assert await entries.count() == 2
    erased = await page.locator("#history-list .erased").all_text_contents()
    assert len(erased) == 2 and all(
        re.fullmatch(r"内容已由用户删除 · \d{4}-\d\d-\d\d \d\d:\d\d", e) for e in erased
    )
    assert "血压" not in (await page.text_content("#history-list") or "")
