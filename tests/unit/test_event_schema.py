import json
from pathlib import Path

from service.core.events import decode_event, event_json_schema
from tests.conftest import event_payload

SCHEMA = Path(__file__).resolve().parents[2] / "schemas" / "task.finished.schema.json"


def test_checked_in_schema_matches_the_model() -> None:
    """Regenerate with `make schemas` when the event model changes."""
    assert json.loads(SCHEMA.read_text()) == event_json_schema()


def test_schema_and_model_agree_on_samples() -> None:
    import jsonschema

    schema = json.loads(SCHEMA.read_text())
    good = event_payload(5, 6)
    jsonschema.validate(good, schema)
    assert not hasattr(decode_event(json.dumps(good).encode(), 10**6), "reason")
    bad = dict(good, userId="5")
    assert not jsonschema.Draft202012Validator(schema).is_valid(bad)
    assert decode_event(json.dumps(bad).encode(), 10**6).reason == "schema"


def test_unknown_fields_are_ignored() -> None:
    payload = dict(event_payload(5, 6), somethingNew={"x": 1})
    assert not hasattr(decode_event(json.dumps(payload).encode(), 10**6), "reason")


def test_each_required_field_missing_is_a_schema_error() -> None:
    for field in ("eventId", "occurredAt", "sessionId", "userId", "phase", "sessionType"):
        payload = event_payload(5, 6)
        del payload[field]
        result = decode_event(json.dumps(payload).encode(), 10**6)
        assert result.reason == "schema" and field in result.detail


def test_user_id_beyond_bigint_and_oversized_messages_are_rejected() -> None:
    assert decode_event(json.dumps(event_payload(2**63, 1)).encode(), 10**6).reason == "schema"
    assert decode_event(b"x" * 101, 100).reason == "too_large"
    assert decode_event(b"\xff", 100).reason == "invalid_utf8"


def test_checked_in_asyncapi_matches_the_code() -> None:
    """FastStream generates it from the same model; regenerate with `make schemas`."""
    from service.adapters.kafka.asyncapi import asyncapi_document

    checked_in = json.loads((SCHEMA.parent / "asyncapi.json").read_text())
    assert checked_in == json.loads(json.dumps(asyncapi_document()))
    payload = json.dumps(checked_in)
    assert "task.finished.dlq" in payload and "lastAssistantMessage" in payload
