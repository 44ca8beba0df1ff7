"""Alembic environment: runs over a synchronous driver (PyMySQL / sqlite3) of the configured URL."""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine, pool

from service.adapters.db.tables import metadata

config = context.config


def run_migrations_online() -> None:
    engine = create_engine(config.get_main_option("sqlalchemy.url") or "", poolclass=pool.NullPool)
    with engine.connect() as connection:
        context.configure(
            connection=connection,
            target_metadata=metadata,
            render_as_batch=connection.dialect.name == "sqlite",
            compare_type=True,
            # Set by `upgrade_schema` for `migrate`'s line per applied revision.
            on_version_apply=config.attributes.get("on_version_apply"),
        )
        with context.begin_transaction():
            context.run_migrations()


run_migrations_online()
