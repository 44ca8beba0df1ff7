"""Metric labels that have no other home: each StrEnum's values are a label's whole range, and the
metrics module creates every series from them at start."""

from __future__ import annotations

from enum import StrEnum


class DeadLetterReason(StrEnum):
    """`x-dlq-reason` and the `reason` label of `mao_memory_dead_letters_total`."""

    INVALID_JSON = "invalid_json"
    INVALID_UTF8 = "invalid_utf8"
    SCHEMA = "schema"
    TOO_LARGE = "too_large"
    EMPTY = "empty"
    UNDECODABLE_RECORD = "undecodable_record"  # the Kafka client could not parse the record itself
    PROCESSING_ERROR = "processing_error"
    MODEL_REJECTED = "model_rejected"
    MODEL_FAILED = "model_failed"  # the model failed this one event again and again, not an outage
    PAYLOAD_TOO_LARGE = "payload_too_large"
    DLQ_REFUSED = "dlq_refused"
