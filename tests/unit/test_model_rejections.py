"""The `model_rejected` tally the admin page shows: counted per model, cut to fit its row."""

from __future__ import annotations

from datetime import datetime

from service.core.model_rejections import (
    MAX_VALUE_CHARS,
    Rejections,
    counted,
    decode,
    encode,
    rejection_kind,
    shown,
)

AT = datetime(2030, 1, 1, 12, 0, 0, 123456)


def test_a_rejection_of_the_same_model_adds_one_and_of_another_starts_over() -> None:
    first = counted(None, "openai/a", "HTTP 404", "model not found", AT)
    second = counted(first, "openai/a", "HTTP 400", "bad request", AT)
    assert (second.count, second.kind, second.error) == (2, "HTTP 400", "bad request")
    assert counted(second, "openai/b", "HTTP 401", "bad key", AT).count == 1
    assert counted(None, "openai/a", "HTTP 404", "HTTP 404 not found", AT).error == "not found"


def test_only_the_effective_models_tally_is_shown() -> None:
    tally = counted(None, "openai/a", "HTTP 404", "x", AT)
    assert shown(tally, "openai/a") is tally
    assert shown(tally, "openai/b") is None and shown(None, "openai/a") is None


def test_the_kind_names_the_status_or_a_refusal_before_sending() -> None:
    assert (rejection_kind(404), rejection_kind(None)) == ("HTTP 404", "rejected")


def test_a_tally_round_trips_and_always_fits_its_row() -> None:
    plain = counted(None, "openai/" + "m" * 121, "HTTP 404", "模型不存在 " * 50, AT)
    assert decode(encode(plain)) == plain and len(plain.error) == 200
    escaped = Rejections("openai/" + "m" * 121, 3, "HTTP 400", '"\\\x01' * 50, AT)
    text = encode(escaped)
    back = decode(text)
    assert len(text) <= MAX_VALUE_CHARS and back is not None and escaped.error.startswith(back.error)


def test_an_unreadable_row_is_no_tally() -> None:
    for value in (None, "", "claimed", "{}", '{"model": "m", "count": "x"}', "[1]"):
        assert decode(value) is None


def test_a_quote_of_the_conversation_or_a_memory_is_not_kept() -> None:
    """A provider's refusal may quote what it refused; only the words the request did not carry stay."""
    conversation = ["我有高血压,饮食清淡", "好的"]
    error = "Invalid request: the message '我有高血压' was refused; see 'memory: I take pills daily'"
    tally = counted(None, "openai/a", "HTTP 400", error, AT, [*conversation, "I take pills daily"])
    assert tally.error == "Invalid request: the message '…' was refused; see 'memory: …'"
    assert counted(None, "openai/a", "HTTP 404", "model not found", AT, ["好的", "ok"]).error == (
        "model not found"
    )
