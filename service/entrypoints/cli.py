"""`mao-memory run | worker | api | migrate`."""

from __future__ import annotations

import argparse
import sys

import uvloop
from pydantic import ValidationError

from service.config import Settings


def _load_settings() -> Settings:
    try:
        return Settings()
    except ValidationError as exc:
        lines = [f"  MEMORY_{'_'.join(str(p) for p in e['loc']).upper()}: {e['msg']}" for e in exc.errors()]
        print("mao-memory: invalid configuration\n" + "\n".join(lines), file=sys.stderr)
        raise SystemExit(2) from None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="mao-memory", description="Long-term memory service for Mao agents")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("run", help="consumer and HTTP sidecar in one process")
    commands.add_parser("worker", help="the Kafka consumer only (with /healthz, /readyz, /metrics)")
    commands.add_parser("api", help="the HTTP sidecar only")
    commands.add_parser("migrate", help="apply pending schema migrations and exit")
    args = parser.parse_args(argv)

    settings = _load_settings()
    if args.command == "migrate":
        from service.adapters.db.engine import upgrade_schema

        upgrade_schema(settings.database_url)
        print("mao-memory: schema is up to date")
        return

    from service.bootstrap import Mode, configure_logging, serve_forever

    configure_logging(settings.log_level)
    uvloop.run(serve_forever(settings, Mode(args.command)))


if __name__ == "__main__":
    main()
