"""The dead-letter header contract both ways, without a broker: what the consumer writes, what a
replay reads back."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from service.adapters.kafka.dead_letters import (
    ERROR,
    NULL_KEY,
    REASON,
    REPLAY_COUNT,
    Headers,
    header,
    replayed,
    verdict,
    verdict_only,
    with_null_key,
)


def letter(original: Headers) -> Headers:
    return [*original, *verdict("schema", "bad id", "task.finished", 2, 41)]


def test_a_record_with_neither_key_nor_value_gets_an_empty_key_and_the_marker() -> None:
    assert with_null_key(None, None, [("h", b"x")]) == (b"", [("h", b"x"), (NULL_KEY, b"1")])
    assert with_null_key(None, b"7", []) == (b"7", [])
    assert with_null_key(b"{}", None, []) == (None, [])


def test_a_replay_drops_the_verdict_keeps_the_rest_in_order_and_counts() -> None:
    key, headers = replayed(b"{}", b"7", letter([("traceparent", b"00-ab"), ("empty", None)]))
    assert key == b"7"
    assert headers[:2] == [("traceparent", b"00-ab"), ("empty", None)]
    assert header(headers, REASON) is None and header(headers, ERROR) is None
    assert header(headers, "x-original-offset") == "41" and header(headers, REPLAY_COUNT) == "1"
    _, again = replayed(b"{}", b"7", [*headers, *verdict("schema", "again", "task.finished", 2, 90)])
    assert [v for k, v in again if k == REPLAY_COUNT] == [b"2"]


def test_a_key_the_record_did_not_have_is_removed_again_unless_the_value_is_missing_too() -> None:
    assert replayed(b"{}", b"", [*letter([]), (NULL_KEY, b"1")])[0] is None
    key, headers = with_null_key(None, None, letter([]))
    restored, replay_headers = replayed(None, key, headers)
    assert restored == b"" and header(replay_headers, NULL_KEY) is None


def test_the_last_resort_keeps_only_the_verdict_and_the_coordinates() -> None:
    kept = verdict_only(letter([("traceparent", b"00-ab"), ("x-dlq-raw-key:ff", None)]))
    assert [k for k, _ in kept] == [
        "x-dlq-raw-key:ff",
        REASON,
        ERROR,
        "x-original-topic",
        "x-original-partition",
        "x-original-offset",
    ]


@given(st.binary(max_size=40) | st.text(max_size=40).map(str.encode) | st.just(b"9" * 5000) | st.none())
def test_any_replay_count_a_header_carries_is_counted_on(count: bytes | None) -> None:
    """A dead letter's headers come from whoever produced it: a count that is not a plain number
    (a superscript digit, 5,000 digits, bytes that are not UTF-8) restarts at 1, never raises."""
    _, headers = replayed(b"{}", b"7", [*letter([]), (REPLAY_COUNT, count)])
    [written] = [v for k, v in headers if k == REPLAY_COUNT]
    assert written is not None and written.isdigit() and int(written) >= 1
    text = (count or b"").decode("utf-8", "replace")
    if text.isascii() and text.isdigit() and len(text) <= 18:
        assert int(written) == int(text) + 1
