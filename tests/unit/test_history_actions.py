"""`memory_history.action` and `.actor`: the stored words never change, and the console names each."""

from __future__ import annotations

import re
from pathlib import Path

from service.core.records import HistoryAction, HistoryActor

CONSOLE_LABELS = Path(__file__).resolve().parents[2] / "service/entrypoints/http/console/labels.js"


def test_the_stored_words_stay_as_they_are() -> None:
    assert sorted(HistoryAction) == sorted(
        [
            "insert",
            "touch",
            "update",
            "demote",
            "merge",
            "drop",
            "create",
            "edit",
            "dismiss",
            "restore",
            "delete",
        ]
    )


def test_the_console_shows_every_action_in_chinese() -> None:
    block = re.search(r"action: \{(.*?)\}", CONSOLE_LABELS.read_text(), re.S)
    assert block is not None
    assert set(re.findall(r"(\w+):", block.group(1))) == set(HistoryAction)


def test_the_stored_actors_stay_as_they_are_and_the_console_names_each() -> None:
    assert sorted(HistoryActor) == ["auto", "consolidator", "migration", "user"]
    block = re.search(r"actor: \{(.*?)\}", CONSOLE_LABELS.read_text(), re.S)
    assert block is not None
    assert set(re.findall(r"(\w+):", block.group(1))) == set(HistoryActor)
