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


class LlmPurpose(StrEnum):
    """The `purpose` label of the model's metrics: which handler made the call."""

    EXTRACTION = "extraction"
    CONSOLIDATION = "consolidation"
    PROBE = "probe"  # the one test call before a model is set (`PUT …/settings` with `probe`)


class LlmResult(StrEnum):
    """The `result` label of `mao_memory_llm_calls_total`: the client's failure kinds (timeout, error,
    rejected, unavailable), or what the handler made of the answer."""

    OK = "ok"
    TIMEOUT = "timeout"
    ERROR = "error"
    REJECTED = "rejected"
    UNAVAILABLE = "unavailable"
    INVALID_JSON = "invalid_json"
    TOO_MANY_ITEMS = "too_many_items"
    TRUNCATED = "truncated"


class TokenKind(StrEnum):
    """The `kind` label of `mao_memory_llm_tokens_total`."""

    PROMPT = "prompt"
    COMPLETION = "completion"
    CACHE_READ = "cache_read"
    CACHE_WRITE = "cache_write"


class ProcessingPath(StrEnum):
    """The `path` label of the processing latency: an event that called the model, or one skipped."""

    LLM = "llm"
    SKIP = "skip"


class ConsolidatedOp(StrEnum):
    """The `op` label of `mao_memory_consolidated_rows_total`."""

    MERGED = "merged"
    DROPPED = "dropped"


class RetentionKind(StrEnum):
    """The `kind` label of `mao_memory_retention_removed_total`: what a retention run removed."""

    LEDGER_EXPIRED = "ledger_expired"
    TOUCHES_FOLDED = "touches_folded"
    DELETED_MEMORY_HISTORY = "deleted_memory_history"


class RetentionResult(StrEnum):
    """The `result` label of `mao_memory_retention_runs_total`."""

    OK = "ok"
    ERROR = "error"
