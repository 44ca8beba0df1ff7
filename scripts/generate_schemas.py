"""Writes the checked-in contract files under schemas/ from the code that defines them."""

from __future__ import annotations

import json
from pathlib import Path

from service.adapters.kafka.asyncapi import asyncapi_document
from service.core.events import event_json_schema

SCHEMAS = Path(__file__).resolve().parents[1] / "schemas"


def main() -> None:
    SCHEMAS.mkdir(exist_ok=True)
    (SCHEMAS / "task.finished.schema.json").write_text(
        json.dumps(event_json_schema(), indent=2, ensure_ascii=False) + "\n"
    )
    (SCHEMAS / "asyncapi.json").write_text(
        json.dumps(asyncapi_document(), indent=2, ensure_ascii=False) + "\n"
    )


if __name__ == "__main__":
    main()
