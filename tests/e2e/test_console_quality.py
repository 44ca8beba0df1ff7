"""The admin page's extraction-quality table in headless Chromium, against the real service."""

# ruff: noqa: F811 - the console's fixtures, imported from test_console.py, are these tests' parameters

from __future__ import annotations

from datetime import timedelta
from typing import Any

from service.adapters.db.database import Database
from service.core.records import HistoryAction, HistoryActor, HistoryEntry
from tests.e2e.test_console import (  # noqa: F401 - fixtures shared with the console's other tests
    browser,
    open_console,
    playwright,
)


async def write_model_history(db: Database, user_id: int, model: str) -> None:
    """40 memories 10 days old: 6 dismissed after a day, 2 deleted after three, 2 edited after
    eight days (outside 7); 10 touched again by a later extraction."""
    born = db.now() - timedelta(days=10)
    fates = {i: (HistoryAction.DISMISS, 1) for i in range(6)} | {6: (HistoryAction.DELETE, 3)}
    fates |= {7: (HistoryAction.DELETE, 3), 8: (HistoryAction.EDIT, 8), 9: (HistoryAction.EDIT, 8)}
    async with db.transaction() as uow:
        for memory_id in range(40):
            insert = HistoryEntry(HistoryAction.INSERT, HistoryActor.AUTO, model=model)
            await uow.memories.record(user_id, memory_id, insert, born)
            if memory_id in fates:
                action, days = fates[memory_id]
                await uow.memories.record(
                    user_id, memory_id, HistoryEntry(action, HistoryActor.USER), born + timedelta(days=days)
                )
            if memory_id >= 30:
                touch = HistoryEntry(HistoryAction.TOUCH, HistoryActor.AUTO, model=model)
                await uow.memories.record(user_id, memory_id, touch, born + timedelta(hours=2))
        await uow.commit()


async def test_the_admin_page_shows_each_models_rejected_and_reconfirmed_share(
    open_console: Any, user_id: int, mysql_db: Database
) -> None:
    model = f"openai/console-quality-{user_id}"
    await write_model_history(mysql_db, user_id, model)
    reader = await open_console(user_id, ["memory:read"])
    await reader.click("#nav-audit")

    row = reader.locator("#quality-table tbody tr", has_text=model)
    await row.wait_for()
    cells = await row.locator("td").all_text_contents()
    assert cells == [
        model,
        "40",
        "20.0%（忽略 6 · 删除 2 · 编辑 0 / 40）",
        "—",
        "25.0%（10）",
    ]
    assert await reader.is_visible("#model-quality h2:has-text('抽取质量')")
    assert await reader.is_hidden("#model-setting")  # the model setting stays `memory:admin`'s

    user = await open_console(user_id + 1)
    assert await user.is_hidden("#model-quality")
    assert await user.locator("#quality-table tbody tr").count() == 0
