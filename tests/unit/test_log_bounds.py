"""Log lines are bounded whatever a record holds: every text is cut to 256 bytes, its length noted."""

from __future__ import annotations

import json
import logging
import timeit

import pytest
import structlog

from service.bootstrap import configure_logging
from service.core.log_bounds import MAX_LOG_TEXT_BYTES, bound_log_values, bounded


def test_a_long_text_is_cut_to_the_bound_with_its_full_length() -> None:
    assert bounded("k" * 4_194_304) == "k" * 256 + "… (4194304 bytes)"
    assert bounded("短" * 100).startswith("短" * 85) and bounded("短" * 100).endswith("(300 bytes)")  # type: ignore[union-attr]
    assert bounded(b"\xff" * 300).endswith("(300 bytes)")  # type: ignore[union-attr]
    assert bounded("k" * MAX_LOG_TEXT_BYTES) == "k" * MAX_LOG_TEXT_BYTES


def test_every_line_of_the_service_and_its_libraries_is_bounded(capsys: pytest.CaptureFixture[str]) -> None:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    configure_logging("INFO")
    try:
        structlog.get_logger("test").info("event_dead_lettered", key="k" * 4_000_000, error="e" * 1_000_000)
        logging.getLogger("uvicorn").warning("a library line %s", "x" * 1_000_000)
    finally:
        structlog.reset_defaults()
        root.handlers[:], root.level = handlers, level
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and all(len(line.encode()) < 1024 for line in lines)
    first = json.loads(lines[0])
    assert first["key"].endswith("(4000000 bytes)") and first["error"].endswith("(1000000 bytes)")
    assert json.loads(lines[1])["event"].endswith("(1000015 bytes)")


def test_the_bound_costs_next_to_nothing_on_an_ordinary_line() -> None:
    """An ordinary skip-path line (short values) pays one length check per value."""
    event = {"event": "events_skipped", "seconds": 10, "ignored_phase": 12, "user_id": "9100000001"}
    runs = timeit.repeat(lambda: bound_log_values(None, "info", dict(event)), number=10_000, repeat=3)
    per_call = min(runs)
    assert per_call / 10_000 < 20e-6


def test_a_text_nested_in_a_list_or_dict_or_an_object_is_bounded_too() -> None:
    """A structured value (headers as pairs, a dict of fields, an object rendered by repr) reaches the
    line as a whole unless the bound walks into it."""
    huge = "c" * 4_194_304

    class Loud:
        def __repr__(self) -> str:
            return huge

    event = {"event": "x", "headers": [("h", huge.encode())], "fields": {"a": {"b": [huge]}}, "obj": Loud()}
    line = structlog.processors.JSONRenderer()(None, "info", bound_log_values(None, "info", event))
    assert len(line.encode()) < 4096, f"a {len(line.encode())}-byte line"
    assert "(4194304 bytes)" in line
