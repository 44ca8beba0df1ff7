"""What the console says after a change, and its undo, in headless Chromium against the real service.

The server's state is read through the HTTP API after each undo, not only from the page.
"""

# ruff: noqa: F811 - the console's fixtures, imported from test_console.py, are these tests' parameters

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from service.adapters.db.database import Database
from service.core.model import Status
from tests.e2e.conftest import JWT_SECRET
from tests.e2e.test_console import (  # noqa: F401 - fixtures shared with the console's other tests
    add_memory,
    browser,
    open_add,
    open_console,
    playwright,
)
from tests.support.pool import items, seed
from tests.support.processes import ServiceProcess
from tests.support.tokens import token

UNDO = "#toast button.undo"
DUPLICATE_TEXT = "已有一条相同内容的记忆"
BAD_USER_ID = "用户 ID 应为 1 到 9223372036854775807 之间的整数,例如 42"
NOT_FOUND = "找不到这条记忆的变更历史:它不存在,或不属于这个用户"


class Api:
    """The signed-in user's memories as the service answers them, from outside the browser."""

    def __init__(self, service: ServiceProcess, user_id: int) -> None:
        self._base = f"{service.base_url}/api/v1/memory"
        self._headers = {"Authorization": f"Bearer {token(user_id, secret=JWT_SECRET)}"}

    async def call(self, method: str, row_id: Any = "", body: dict[str, Any] | None = None) -> httpx.Response:
        path = f"{self._base}/{row_id}" if row_id != "" else self._base
        async with httpx.AsyncClient() as client:
            return await client.request(method, path, headers=self._headers, json=body)

    async def memory(self, row_id: Any) -> dict[str, Any] | None:
        answer = await self.call("GET", row_id)
        return None if answer.status_code == 404 else answer.json()["data"]


async def said(page, text: str) -> None:  # type: ignore[no-untyped-def]
    await page.wait_for_selector(f"#toast:has-text('{text}')")


async def row_id(page, content: str) -> str:  # type: ignore[no-untyped-def]
    return await page.locator("#memory-list li", has_text=content).get_attribute("data-id") or ""


async def dismiss(page, content: str) -> str:  # type: ignore[no-untyped-def]
    """Dismisses the listed row holding `content`; its id, once the confirmation offers the undo."""
    await add_memory(page, content)
    memory_id = await row_id(page, content)
    await page.locator("#memory-list li", has_text=content).locator("button.dismiss").click()
    await said(page, "已忽略这条记忆")
    await page.wait_for_selector(UNDO)
    return memory_id


async def test_every_change_is_confirmed_in_a_polite_status_line(open_console, user_id: int) -> None:  # type: ignore[no-untyped-def]
    page = await open_console(user_id)
    assert await page.get_attribute("#toast", "role") == "status"
    assert await page.get_attribute("#toast", "aria-live") == "polite"
    await add_memory(page, "确认一下")
    await said(page, "已新增记忆")
    await page.locator("#memory-list li button.edit").click()
    await page.fill("#memory-list textarea", "确认两下")
    await page.click("#memory-list button.save")
    await said(page, "已保存修改")
    await page.locator("#memory-list li button.dismiss").click()
    await said(page, "已忽略这条记忆")
    assert await page.evaluate("document.activeElement.classList.contains('undo')")
    await page.select_option("#status-filter", "DISMISSED")
    await page.locator("#memory-list li button.restore").click()
    await said(page, "已恢复这条记忆")
    await page.select_option("#status-filter", "ACTIVE")
    await page.locator("#memory-list li button.delete").click()
    await page.click("#confirm-ok")
    await said(page, "已删除这条记忆")
    assert await page.locator(UNDO).count() == 0
    await page.click("#auto-capture")
    await said(page, "已开启自动收集记忆")
    await page.click("#auto-capture")
    await said(page, "已关闭自动收集记忆")


async def test_saving_the_extraction_model_is_confirmed(open_console, user_id: int) -> None:  # type: ignore[no-untyped-def]
    page = await open_console(user_id, ["memory:read", "memory:admin"])
    await page.click("#nav-audit")
    await page.wait_for_selector("#model-effective:not(:empty)")  # the stored value is in the field
    await page.fill("#model-id", "openai/confirmed")
    await page.click("#model-form button")
    await said(page, "已保存记忆抽取模型,当前生效: openai/confirmed")
    await page.fill("#model-id", "")
    await page.click("#model-form button")
    await said(page, "已保存记忆抽取模型,当前生效: openai/scripted-default")


async def test_undo_of_a_dismiss_restores_the_memory(
    open_console, user_id: int, service: ServiceProcess
) -> None:  # type: ignore[no-untyped-def]
    page = await open_console(user_id)
    api = Api(service, user_id)
    memory_id = await dismiss(page, "撤销忽略")
    assert (await api.memory(memory_id) or {})["status"] == "DISMISSED"
    await page.click(UNDO)
    await said(page, "已撤销忽略,记忆已恢复")
    assert (await api.memory(memory_id) or {})["status"] == "ACTIVE"
    await page.wait_for_selector(f"#memory-list li[data-id='{memory_id}']")
    focused = await page.evaluate("document.activeElement.closest('li')?.dataset.id")
    assert focused == memory_id


async def test_undo_of_a_restore_dismisses_the_memory_again(
    open_console, user_id: int, mysql_db: Database, service: ServiceProcess
) -> None:  # type: ignore[no-untyped-def]
    memory_id = await seed(mysql_db, user_id, "撤销恢复", status=Status.DISMISSED)
    page = await open_console(user_id)
    await page.select_option("#status-filter", "DISMISSED")
    await page.locator(f"#memory-list li[data-id='{memory_id}'] button.restore").click()
    await said(page, "已恢复这条记忆")
    api = Api(service, user_id)
    assert (await api.memory(memory_id) or {})["status"] == "ACTIVE"
    await page.click(UNDO)
    await said(page, "已撤销恢复,记忆已重新忽略")
    assert (await api.memory(memory_id) or {})["status"] == "DISMISSED"
    await page.wait_for_selector(f"#memory-list li[data-id='{memory_id}'] button.restore")


async def test_a_double_click_on_undo_sends_one_request(
    open_console, user_id: int, service: ServiceProcess
) -> None:  # type: ignore[no-untyped-def]
    page = await open_console(user_id)
    memory_id = await dismiss(page, "双击撤销")
    patches: list[str] = []
    page.on("request", lambda r: patches.append(r.url) if r.method == "PATCH" else None)

    async def slowly(route) -> None:  # type: ignore[no-untyped-def]
        await asyncio.sleep(0.4)
        await route.continue_()

    await page.route(f"**/api/v1/memory/{memory_id}", slowly)
    await page.dblclick(UNDO)
    await page.locator(UNDO).click(force=True)  # a third click, while the first is still running
    await said(page, "已撤销忽略")
    await page.wait_for_timeout(600)
    assert len(patches) == 1
    assert (await Api(service, user_id).memory(memory_id) or {})["status"] == "ACTIVE"
    assert await page.locator(f"#memory-list li[data-id='{memory_id}']").count() == 1


async def test_undo_after_the_row_was_deleted_elsewhere_resurrects_nothing(
    open_console, user_id: int, mysql_db: Database, service: ServiceProcess
) -> None:  # type: ignore[no-untyped-def]
    page = await open_console(user_id)
    memory_id = await dismiss(page, "在别处删掉")
    api = Api(service, user_id)
    assert (await api.call("DELETE", memory_id)).status_code == 200
    changes: list[str] = []
    page.on("request", lambda r: changes.append(r.method) if r.method != "GET" else None)
    await page.click(UNDO)
    await said(page, "无法撤销:这条记忆已被删除")
    assert changes == [] and await api.memory(memory_id) is None
    assert await items(mysql_db, user_id) == []
    assert await page.is_hidden("#error") and await page.locator(UNDO).count() == 0


async def test_undo_after_the_row_was_edited_elsewhere_keeps_the_edit_and_refreshes(
    open_console, user_id: int, service: ServiceProcess
) -> None:  # type: ignore[no-untyped-def]
    page = await open_console(user_id)
    memory_id = await dismiss(page, "在别处改过")
    api = Api(service, user_id)
    assert (await api.call("PATCH", memory_id, {"content": "另一个标签页改的"})).status_code == 200
    requests: list[str] = []
    page.on("request", lambda r: requests.append(f"{r.method} {r.url.split('/api/v1/')[-1]}"))
    await page.click(UNDO)
    await said(page, "无法撤销:这条记忆在此之后又被修改过,列表已刷新")
    now = await api.memory(memory_id) or {}
    assert (now["status"], now["content"]) == ("DISMISSED", "另一个标签页改的")
    assert not [r for r in requests if r.startswith("PATCH")]
    assert [r for r in requests if r.startswith("GET memory?")], requests  # the list was read again


async def test_the_undo_leaves_with_its_window(open_console, user_id: int, service: ServiceProcess) -> None:  # type: ignore[no-untyped-def]
    page = await open_console(user_id)
    memory_id = await dismiss(page, "来不及撤销")
    await page.wait_for_timeout(4500)
    assert await page.locator(UNDO).count() == 1
    await page.wait_for_selector(UNDO, state="detached", timeout=3000)
    assert await page.text_content("#toast") == ""
    assert await page.evaluate("document.activeElement !== document.body")  # focus went to the page
    assert (await Api(service, user_id).memory(memory_id) or {})["status"] == "DISMISSED"


async def test_a_late_duplicate_answer_never_shows_in_the_reopened_add_dialog(
    open_console, user_id: int
) -> None:  # type: ignore[no-untyped-def]
    page = await open_console(user_id)
    await add_memory(page, "重复的内容")
    await open_add(page)
    await page.fill("#add-content", "重复的内容")
    await page.click("#add-submit")
    await page.wait_for_selector(f"#add-error:has-text('{DUPLICATE_TEXT}')")
    await page.type("#add-content", "之二")
    assert await page.is_hidden("#add-error")  # the reason no longer applies to what is typed
    await page.click("#add-cancel")

    answered = asyncio.Event()

    async def slowly(route) -> None:  # type: ignore[no-untyped-def]
        if route.request.method != "POST":
            await route.continue_()
            return
        await asyncio.sleep(0.8)
        await route.continue_()
        answered.set()

    await page.route("**/api/v1/memory", slowly)
    await open_add(page)
    await page.fill("#add-content", "重复的内容")
    await page.click("#add-submit")
    await page.keyboard.press("Escape")
    await open_add(page)
    await asyncio.wait_for(answered.wait(), 5)
    await page.wait_for_function("!document.getElementById('add-submit').busy")
    assert await page.is_hidden("#add-error")
    assert await page.evaluate("document.getElementById('add-dialog').open")


async def test_the_audit_says_when_a_user_has_no_memories(
    open_console, user_id: int, mysql_db: Database
) -> None:  # type: ignore[no-untyped-def]
    await seed(mysql_db, user_id + 1, "有记忆的用户")
    page = await open_console(user_id, ["memory:read"])
    await page.click("#nav-audit")
    await page.fill("#audit-user", str(user_id + 2))
    await page.click("#audit-form button")
    await page.wait_for_selector("#audit-empty:not([hidden])")
    assert await page.text_content("#audit-empty") == (
        f"用户 {user_id + 2} 没有记忆:该用户还没有任何记忆,或没有这个用户"
    )
    assert await page.locator("#audit-table tbody tr").count() == 0
    await page.fill("#audit-user", str(user_id + 1))
    await page.click("#audit-form button")
    await page.wait_for_selector("#audit-table td:has-text('有记忆的用户')")
    assert await page.is_hidden("#audit-empty")


async def test_a_history_that_cannot_be_found_says_so_in_the_drawer(
    open_console, user_id: int, mysql_db: Database
) -> None:  # type: ignore[no-untyped-def]
    """A row without a trail (seeded past the API) answers 404; the drawer must not show the last one."""
    await seed(mysql_db, user_id + 1, "没有历史的记忆")
    page = await open_console(user_id, ["memory:read"])
    await add_memory(page, "有历史的记忆")
    await page.locator("#memory-list li button.history").click()
    await page.wait_for_selector("#history-list li")
    await page.click("#history-close")
    await page.click("#nav-audit")
    await page.fill("#audit-user", str(user_id + 1))
    await page.click("#audit-form button")
    await page.click("#audit-table td:has-text('没有历史的记忆')")
    await page.wait_for_selector("#history-empty:not([hidden])")
    assert await page.text_content("#history-empty") == NOT_FOUND
    assert await page.locator("#history-list li").count() == 0
    assert await page.is_visible("#history-drawer") and await page.is_hidden("#error")
    await page.click("#history-close")
    await page.click("#nav-memory")
    await page.locator("#memory-list li button.history").click()
    await page.wait_for_selector("#history-list li")
    assert await page.is_hidden("#history-empty")


@pytest.mark.parametrize("typed", ["abc", "0", "-3", "1.5", "042", "9223372036854775808", " "])
async def test_a_bad_user_id_is_explained_before_any_request(
    open_console, user_id: int, mysql_db: Database, typed: str
) -> None:  # type: ignore[no-untyped-def]
    await seed(mysql_db, user_id, "查过一次")
    page = await open_console(user_id, ["memory:read"])
    await page.click("#nav-audit")
    await page.fill("#audit-user", str(user_id))
    await page.click("#audit-form button")
    await page.wait_for_selector("#audit-table td:has-text('查过一次')")
    audits: list[str] = []
    page.on("request", lambda r: audits.append(r.url) if "/admin/memory?" in r.url else None)
    await page.fill("#audit-user", typed)
    await page.click("#audit-form button")
    await page.wait_for_selector("#audit-error:not([hidden])")
    assert await page.text_content("#audit-error") == BAD_USER_ID
    assert audits == [] and await page.locator("#audit-table tbody tr").count() == 0
    assert await page.text_content("#audit-page-info") == ""
    assert await page.evaluate("document.activeElement.id") == "audit-user"
    await page.fill("#audit-user", "9223372036854775807")
    await page.click("#audit-form button")
    await page.wait_for_selector("#audit-empty:not([hidden])")
    assert await page.is_hidden("#audit-error") and len(audits) == 1


async def test_a_slow_undo_never_takes_away_a_later_rows_undo(
    open_console, user_id: int, service: ServiceProcess
) -> None:  # type: ignore[no-untyped-def]
    """Undo A on a slow line, dismiss B meanwhile: B's undo is on offer, and A's late answer must not
    replace it (B would be dismissed with no way back)."""
    page = await open_console(user_id)
    api = Api(service, user_id)
    first = await dismiss(page, "慢的撤销")
    release = asyncio.Event()

    async def held(route) -> None:  # type: ignore[no-untyped-def]
        if route.request.method == "GET":
            await release.wait()
        await route.continue_()

    await page.route(f"**/api/v1/memory/{first}", held)
    await page.click(UNDO)
    second = await dismiss(page, "后来的忽略")
    release.set()
    await page.wait_for_function(
        "id => document.querySelector(`#memory-list li[data-id='${id}']`)", arg=first
    )
    await asyncio.sleep(0.5)  # the undo's own line, had it been written, is written by now
    assert (await api.memory(first) or {})["status"] == "ACTIVE"
    assert await page.locator(UNDO).count() == 1
    await page.click(UNDO)
    await said(page, "已撤销忽略,记忆已恢复")
    assert (await api.memory(second) or {})["status"] == "ACTIVE"
