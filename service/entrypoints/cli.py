"""`mao-memory run | worker | api | migrate | retention | dlq replay`."""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime

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


def _timestamp(value: str) -> datetime:
    parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="mao-memory", description="Long-term memory service for Mao agents")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("run", help="consumer and HTTP sidecar in one process")
    commands.add_parser("worker", help="the Kafka consumer only (with /healthz, /readyz, /metrics)")
    commands.add_parser("api", help="the HTTP sidecar only")
    commands.add_parser("migrate", help="apply pending schema migrations and exit")
    commands.add_parser(
        "retention",
        help="one retention run now (expired ledger rows, touch runs, old history); prints figures",
    )
    dlq = commands.add_parser("dlq", help="the dead-letter topic").add_subparsers(
        dest="dlq_command", required=True
    )
    replay_cmd = dlq.add_parser("replay", help="re-publish dead-lettered events to the main topic")
    replay_cmd.add_argument("--reason", help="only this x-dlq-reason, e.g. model_rejected")
    replay_cmd.add_argument(
        "--since", type=_timestamp, help="only messages dead-lettered at or after this RFC 3339 time"
    )
    replay_cmd.add_argument(
        "--dry-run", action="store_true", help="count what would be replayed, publish nothing"
    )
    args = parser.parse_args(argv)

    settings = _load_settings()
    if args.command == "migrate":
        from service.adapters.db.engine import upgrade_schema

        upgrade_schema(settings.database_url)
        print("mao-memory: schema is up to date")
        return

    if args.command == "retention":
        from service.bootstrap import run_retention_once

        print(json.dumps(uvloop.run(run_retention_once(settings)).as_dict()))
        return

    if args.command == "dlq":
        from service.adapters.kafka.replay import Selection, replay_dead_letters

        bootstrap = settings.kafka_bootstrap or f"127.0.0.1:{settings.embedded_kafka_port}"
        selection = Selection(args.reason, args.since)
        report = uvloop.run(
            replay_dead_letters(bootstrap, settings.dlq_topic, settings.kafka_topic, selection, args.dry_run)
        )
        print(report.as_json(args.dry_run))
        return

    from service.adapters.db.engine import SchemaNotCurrent
    from service.adapters.kafka.embedded_broker import PortTaken
    from service.bootstrap import EmbeddedBrokerDied, Mode, configure_logging, serve_forever

    configure_logging(settings.log_level)
    try:
        uvloop.run(serve_forever(settings, Mode(args.command)))
    except (SchemaNotCurrent, PortTaken) as exc:
        print(f"mao-memory: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    except EmbeddedBrokerDied as exc:
        print(f"mao-memory: {exc}", file=sys.stderr)
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()
