import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from service.core.events import (
    BIGINT_MAX,
    TaskFinishedEvent,
    Undecodable,
    decimal_pattern,
    decode_event,
    event_json_schema,
)
from tests.conftest import event_payload

SCHEMA = Path(__file__).resolve().parents[2] / "schemas" / "task.finished.schema.json"
ID_FIELDS = ("sessionId", "userId")

# What JavaScript and protobuf-JSON producers send: the integer itself, or its canonical decimal string.
ACCEPTED_IDS: list[tuple[object, int]] = [
    (1, 1),
    ("1", 1),
    (42, 42),
    ("42", 42),
    ("9007199254740993", 2**53 + 1),  # past a JS number's exact range
    ("1000000000000000000", 10**18),
    (BIGINT_MAX, BIGINT_MAX),
    (str(BIGINT_MAX), BIGINT_MAX),
]
REFUSED_IDS: list[object] = [
    " 5",
    "5 ",
    "5\n",
    "5.0",
    "0x5",
    "05",
    "0",
    "-5",
    "+5",
    "1e3",
    "1_000",
    "٥",  # ARABIC-INDIC DIGIT FIVE: int() and \d take it
    "５",  # FULLWIDTH DIGIT FIVE
    "",
    "9223372036854775808",  # BIGINT_MAX + 1
    "10000000000000000000",
    5.0,
    1e3,
    True,
    False,
    None,
    0,
    -5,
    2**63,
    [5],
    {"id": 5},
]


def decode(payload: dict[str, Any]) -> TaskFinishedEvent | Undecodable:
    return decode_event(json.dumps(payload, ensure_ascii=False).encode(), 10**6)


def reason_of(value: bytes, max_bytes: int = 10**6) -> str | None:
    result = decode_event(value, max_bytes)
    return result.reason if isinstance(result, Undecodable) else None


def is_canonical_id(text: str) -> bool:
    """The rule stated without the regex: ASCII digits, no leading zero, 1..BIGINT_MAX."""
    return text.isascii() and text.isdigit() and text[0] != "0" and int(text) <= BIGINT_MAX


def ecma_pattern(validator: Any, pattern: str, instance: object, schema: object) -> Iterator[Any]:
    """JSON Schema patterns are ECMA-262, whose `$` ends the input; python-jsonschema searches with
    Python's `$`, which also matches before a final newline and so would accept "5\\n".

    The schema's patterns use `$` only as that anchor.
    """
    from jsonschema.exceptions import ValidationError

    if isinstance(instance, str) and re.search(pattern.replace("$", r"\Z"), instance) is None:
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


def schema_validator() -> Any:
    import jsonschema

    ecma = jsonschema.validators.extend(jsonschema.Draft202012Validator, {"pattern": ecma_pattern})
    return ecma(json.loads(SCHEMA.read_text()))


def test_checked_in_schema_matches_the_model() -> None:
    """Regenerate with `make schemas` when the event model changes."""
    assert json.loads(SCHEMA.read_text()) == event_json_schema()


def test_schema_and_model_agree_on_samples() -> None:
    validator = schema_validator()
    good = event_payload(5, 6)
    validator.validate(good)
    assert isinstance(decode(good), TaskFinishedEvent)
    for bad in (dict(good, userId=5.5), dict(good, phase=1), dict(good, occurredAt=None)):
        assert not validator.is_valid(bad)
        assert reason_of(json.dumps(bad).encode()) == "schema"


@pytest.mark.parametrize("field", ID_FIELDS)
@pytest.mark.parametrize(("value", "expected"), ACCEPTED_IDS, ids=repr)
def test_an_id_may_be_an_integer_or_its_canonical_decimal_string(
    field: str, value: object, expected: int
) -> None:
    event = decode(dict(event_payload(5, 6), **{field: value}))
    assert isinstance(event, TaskFinishedEvent)
    assert getattr(event, {"sessionId": "session_id", "userId": "user_id"}[field]) == expected
    assert type(event.session_id) is int and type(event.user_id) is int


@pytest.mark.parametrize("field", ID_FIELDS)
@pytest.mark.parametrize("value", REFUSED_IDS, ids=repr)
def test_any_other_id_goes_to_the_dlq_as_a_schema_error(field: str, value: object) -> None:
    result = decode(dict(event_payload(5, 6), **{field: value}))
    assert isinstance(result, Undecodable) and result.reason == "schema"
    assert result.detail.startswith(f"{field}: ")


@pytest.mark.parametrize("field", ID_FIELDS)
@pytest.mark.parametrize(
    "value",
    # JSON Schema counts 5.0 as an integer (any number with a zero fractional part), so only the
    # decoder can refuse a float id; every other case the two must judge alike.
    [v for v, _ in ACCEPTED_IDS] + [v for v in REFUSED_IDS if not isinstance(v, float)],
    ids=repr,
)
def test_schema_and_model_agree_on_ids(field: str, value: object) -> None:
    payload = dict(event_payload(5, 6), **{field: value})
    assert schema_validator().is_valid(payload) == isinstance(decode(payload), TaskFinishedEvent)


@given(st.integers(min_value=1, max_value=BIGINT_MAX), st.sampled_from(ID_FIELDS))
def test_every_bigint_id_decodes_from_its_integer_and_its_decimal_string(n: int, field: str) -> None:
    for value in (n, str(n)):
        event = decode(dict(event_payload(5, 6), **{field: value}))
        assert isinstance(event, TaskFinishedEvent)
        assert (event.session_id if field == "sessionId" else event.user_id) == n


# Arbitrary text, plus text that is nearly a number: signs, zeros, spaces, other digits, overflow.
near_numbers = st.builds(
    "".join,
    st.lists(
        st.sampled_from(["0", "1", "5", "9", "-", "+", " ", "\n", ".", "e", "_", "٥", "５", "²"])
        | st.integers(min_value=0).map(str),
        max_size=6,
    ),
)


@given(st.text() | near_numbers, st.sampled_from(ID_FIELDS))
def test_any_non_canonical_text_id_is_a_schema_error(text: str, field: str) -> None:
    result = decode(dict(event_payload(5, 6), **{field: text}))
    if is_canonical_id(text):
        assert isinstance(result, TaskFinishedEvent)
    else:
        assert isinstance(result, Undecodable) and result.reason == "schema"


@given(st.integers(min_value=1, max_value=10**25), st.integers(min_value=0, max_value=10**26))
def test_the_decimal_pattern_matches_exactly_the_numbers_up_to_its_limit(limit: int, n: int) -> None:
    assert (re.fullmatch(decimal_pattern(limit), str(n)) is not None) == (1 <= n <= limit)


def test_the_decimal_pattern_holds_at_the_bigint_boundary() -> None:
    pattern = decimal_pattern(BIGINT_MAX)
    for n in (1, 9, 10, 10**18 - 1, 10**18, BIGINT_MAX - 1, BIGINT_MAX):
        assert re.fullmatch(pattern, str(n)), n
    for text in ("0", str(BIGINT_MAX + 1), str(10**19), "9" * 19, "05"):
        assert not re.fullmatch(pattern, text), text


def test_unknown_fields_are_ignored() -> None:
    payload = dict(event_payload(5, 6), somethingNew={"x": 1})
    assert not hasattr(decode_event(json.dumps(payload).encode(), 10**6), "reason")


def test_each_required_field_missing_is_a_schema_error() -> None:
    for field in ("eventId", "occurredAt", "sessionId", "userId", "phase", "sessionType"):
        payload = event_payload(5, 6)
        del payload[field]
        result = decode_event(json.dumps(payload).encode(), 10**6)
        assert isinstance(result, Undecodable) and result.reason == "schema" and field in result.detail


def test_user_id_beyond_bigint_and_oversized_messages_are_rejected() -> None:
    assert reason_of(json.dumps(event_payload(2**63, 1)).encode()) == "schema"
    assert reason_of(b"x" * 101, 100) == "too_large"
    assert reason_of(b"\xff", 100) == "invalid_utf8"


# An event's bytes with arbitrary bytes spliced in: mostly valid JSON whose strings hold ill-formed
# UTF-8 (lone continuation bytes, overlong forms, encoded surrogates, code points past U+10FFFF).
_EVENT_BYTES = json.dumps(event_payload(5, 6), ensure_ascii=False).encode()
_spliced = st.tuples(st.integers(0, len(_EVENT_BYTES)), st.binary(min_size=1, max_size=6)).map(
    lambda cut: _EVENT_BYTES[: cut[0]] + cut[1] + _EVENT_BYTES[cut[0] :]
)


@given(st.binary(max_size=200) | _spliced)
def test_the_bytes_get_the_verdict_of_the_text_they_decode_to(raw: bytes) -> None:
    """Events are validated as bytes, with no text copy: what Python's strict UTF-8 codec refuses is
    `invalid_utf8`, and valid text gets exactly the verdict of validating the text itself."""
    result = decode_event(raw, 10**6)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        assert isinstance(result, Undecodable) and result.reason == "invalid_utf8"
        return
    try:
        expected: object = TaskFinishedEvent.model_validate_json(text)
    except ValueError:
        assert isinstance(result, Undecodable) and result.reason in {"invalid_json", "schema"}
        return
    assert result == expected


def test_checked_in_asyncapi_matches_the_code() -> None:
    """FastStream generates it from the same model; regenerate with `make schemas`."""
    from service.adapters.kafka.asyncapi import asyncapi_document

    checked_in = json.loads((SCHEMA.parent / "asyncapi.json").read_text())
    assert checked_in == json.loads(json.dumps(asyncapi_document()))
    payload = json.dumps(checked_in)
    assert "task.finished.dlq" in payload and "lastAssistantMessage" in payload
    embedded = checked_in["components"]["schemas"]["TaskFinishedEvent"]["properties"]
    standalone = json.loads(SCHEMA.read_text())["properties"]
    for field in ID_FIELDS:
        assert embedded[field] == standalone[field]


@pytest.mark.parametrize(
    "event_id",
    ["ev-1\u202e\x00\n<script>", "ev-1\n", "ev\t1", "ev\x1c1", "ev\u2028", "ev\u200b1", "ev\ufe0f"],
)
def test_an_event_id_with_a_control_format_or_invisible_character_is_a_schema_error(event_id: str) -> None:
    """eventId comes back from the history endpoints: it is an identifier, as a project key is."""
    payload = dict(event_payload(5, 6), eventId=event_id)
    result = decode(payload)
    assert isinstance(result, Undecodable) and result.reason == "schema"
    assert result.detail.startswith("eventId: Value error, must not contain control, format or invisible")
    assert not schema_validator().is_valid(payload)
    assert isinstance(decode(dict(payload, eventId="ev 1-中文")), TaskFinishedEvent)
