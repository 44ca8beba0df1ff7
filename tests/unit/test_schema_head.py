from pathlib import Path

from service.adapters.db.engine import SCHEMA_HEAD, migrations_head


def test_the_schema_the_code_needs_is_the_newest_migration() -> None:
    """A new migration without SCHEMA_HEAD moved would let the service start on the old schema."""
    versions = Path(__file__).resolve().parents[2] / "migrations" / "versions"
    assert migrations_head() == SCHEMA_HEAD
    assert any(p.name.startswith(f"{SCHEMA_HEAD}_") for p in versions.glob("*.py"))
