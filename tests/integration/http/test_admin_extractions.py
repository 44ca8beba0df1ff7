"""The admin audit shows how many extractions a user had in the last 24 hours: what the daily
extraction budget counts."""

from __future__ import annotations

from datetime import timedelta

import httpx
from structlog.testing import capture_logs

from service.adapters.db.database import Database
from tests.integration.http.conftest import As


async def test_admin_reads_a_users_extractions_of_the_last_24_hours(
    http: httpx.AsyncClient, mysql_db: Database, user_id: int
) -> None:
    now = mysql_db.now()
    async with mysql_db.transaction() as uow:
        for i, hours in enumerate((0.5, 23.9, 24.1, 48)):
            await uow.accounts.mark_processed(
                f"x{user_id}-{i}", user_id, i, "extracted", now - timedelta(hours=hours)
            )
        await uow.accounts.mark_processed(f"x{user_id}-other", user_id + 1, 9, "extracted", now)
        await uow.commit()
    admin = As(http, 1, ["memory:read"])

    with capture_logs() as logs:
        response = await admin.get("/api/v1/admin/memory/extractions", params={"userId": user_id})

    assert response.status_code == 200, response.text
    assert response.json() == {
        "code": 0,
        "message": "success",
        "data": {"userId": str(user_id), "extractionsLast24h": 2},
    }
    assert [(e["event"], e["caller"], e["user_id"]) for e in logs] == [("admin_extractions_read", 1, user_id)]
