"""`GET /api/v1/admin/memory/quality`: each extraction model's figures for the admin, with rates."""

from __future__ import annotations

from datetime import timedelta

import httpx

from service.adapters.db.database import Database
from service.core.records import HistoryAction, HistoryActor, HistoryEntry
from tests.integration.http.conftest import As


async def test_the_admin_reads_each_models_rejections_and_reconfirmations(
    http: httpx.AsyncClient, mysql_db: Database, user_id: int
) -> None:
    """20 memories of the model, 8 days old: 5 dismissed after a day, 3 deleted after two, 1
    edited after ten (outside 7 days, and the cohort of 30 is still empty); 4 touched again."""
    model = f"openai/http-quality-{user_id}"
    born = mysql_db.now() - timedelta(days=8)
    later = {**dict.fromkeys(range(5), (HistoryAction.DISMISS, 1)), 5: (HistoryAction.DELETE, 2)}
    later |= {6: (HistoryAction.DELETE, 2), 7: (HistoryAction.DELETE, 2), 8: (HistoryAction.EDIT, 7.5)}
    async with mysql_db.transaction() as uow:
        for memory_id in range(20):
            insert = HistoryEntry(HistoryAction.INSERT, HistoryActor.AUTO, model=model)
            await uow.memories.record(user_id, memory_id, insert, born)
            if memory_id in later:
                action, days = later[memory_id]
                entry = HistoryEntry(action, HistoryActor.USER)
                await uow.memories.record(user_id, memory_id, entry, born + timedelta(days=days))
            if memory_id >= 16:
                touch = HistoryEntry(HistoryAction.TOUCH, HistoryActor.AUTO, model="openai/other")
                await uow.memories.record(user_id, memory_id, touch, born + timedelta(hours=1))
        await uow.commit()

    response = await As(http, 1, ["memory:read"]).get("/api/v1/admin/memory/quality")

    assert response.status_code == 200, response.text
    data = response.json()["data"]
    assert data["windowDays"] == 90
    [mine] = [m for m in data["models"] if m["model"] == model]
    assert mine == {
        "model": model,
        "created": 20,
        "reconfirmed": 4,
        "reconfirmedRate": 0.2,
        "touches": 4,
        "within": [
            {
                "days": 7,
                "cohort": 20,
                "rejected": {"dismissed": 5, "deleted": 3, "edited": 0, "total": 8},
                "rejectedRate": 0.4,
            },
            {
                "days": 30,
                "cohort": 0,
                "rejected": {"dismissed": 0, "deleted": 0, "edited": 0, "total": 0},
                "rejectedRate": None,
            },
        ],
    }


async def test_without_memory_read_the_figures_are_refused(http: httpx.AsyncClient) -> None:
    writer = await As(http, 2, ["memory:write"]).get("/api/v1/admin/memory/quality")
    anonymous = await http.get("/api/v1/admin/memory/quality")
    assert (writer.status_code, writer.json()["code"]) == (403, 40300)
    assert (anonymous.status_code, anonymous.json()["code"]) == (401, 40100)
