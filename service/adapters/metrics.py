"""Every Prometheus metric the service exports, on one registry built by the composition root."""

from __future__ import annotations

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    disable_created_metrics,
)

from service.core.consolidation import RunResult
from service.core.labels import (
    ConsolidatedOp,
    DeadLetterReason,
    LlmPurpose,
    LlmResult,
    ProcessingPath,
    RetentionKind,
    RetentionResult,
    TokenKind,
)
from service.core.model import Action
from service.core.model_quality import ModelQuality
from service.core.outcomes import Outcome
from service.core.persist_plan import Result

PREFIX = "mao_memory"
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        # `*_created` series double the cardinality and no dashboard or alert reads them.
        disable_created_metrics()  # type: ignore[no-untyped-call]
        self.registry = registry or CollectorRegistry()
        r = self.registry
        # process_cpu_seconds_total and friends: a worker is CPU-bound long before its in-flight bound
        # fills, so CPU per extracted event is the figure that sizes a deployment.
        ProcessCollector(registry=r)
        self.user_erasures = Counter(
            f"{PREFIX}_user_erasures_total",
            "Users erased whole (DELETE /internal/v1/memory/users/{userId}, `mao-memory erase-user`)",
            registry=r,
        )
        self.events = Counter(
            f"{PREFIX}_events_total", "task.finished events consumed, by outcome", ["outcome"], registry=r
        )
        self.processing_latency = Histogram(
            f"{PREFIX}_event_processing_seconds",
            "Time from taking an event to finishing it",
            ["path"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.llm_calls = Counter(
            f"{PREFIX}_llm_calls_total", "LLM calls by purpose and result", ["purpose", "result"], registry=r
        )
        self.llm_retries = Counter(
            f"{PREFIX}_llm_retries_total", "LLM calls retried after 429/5xx/refusal", ["purpose"], registry=r
        )
        self.llm_latency = Histogram(
            f"{PREFIX}_llm_latency_seconds",
            "LLM call latency",
            ["purpose"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.llm_tokens = Counter(
            f"{PREFIX}_llm_tokens_total",
            "LLM tokens by purpose and kind; cache_read and cache_write are the part of prompt the "
            "provider served from, or wrote to, its prompt cache",
            ["purpose", "kind"],
            registry=r,
        )
        self.llm_cost = Counter(
            f"{PREFIX}_llm_cost_usd",
            "Estimated LLM cost in USD from litellm's local cost map (0 for models outside it)",
            ["purpose"],
            registry=r,
        )
        self.llm_prompt_chars = Histogram(
            f"{PREFIX}_llm_prompt_chars",
            "Characters sent to the model per call",
            ["purpose"],
            buckets=(500, 1000, 2000, 4000, 8000, 16000, 32000, 64000),
            registry=r,
        )
        self.llm_mode_fallbacks = Counter(
            f"{PREFIX}_llm_structured_output_fallbacks_total",
            "Models found to refuse a structured-output mode, and the mode used instead",
            ["from_mode", "to_mode"],
            registry=r,
        )
        self.llm_breaker = Gauge(
            f"{PREFIX}_llm_breaker_state",
            "The model's circuit breaker: 0 closed, 1 half-open, 2 open",
            registry=r,
        )
        self.llm_breaker_opened = Counter(
            f"{PREFIX}_llm_breaker_opened_total", "Times the model's circuit breaker opened", registry=r
        )
        self.event_retries = Counter(
            f"{PREFIX}_event_retries_total",
            "Events tried again later because the model was unavailable",
            registry=r,
        )
        self.candidates = Counter(
            f"{PREFIX}_candidates_total",
            "Extracted candidates by action and result",
            ["action", "result"],
            registry=r,
        )
        self.demotions = Counter(
            f"{PREFIX}_overflow_demotions_total", "AUTO rows demoted to make room (D14)", registry=r
        )
        self.consolidations = Counter(
            f"{PREFIX}_consolidations_total", "Consolidation runs by result", ["result"], registry=r
        )
        self.consolidated_rows = Counter(
            f"{PREFIX}_consolidated_rows_total", "Rows changed by consolidation", ["op"], registry=r
        )
        self.dead_letters = Counter(
            f"{PREFIX}_dead_letters_total", "Events sent to the dead-letter topic", ["reason"], registry=r
        )
        self.consumer_crashes = Counter(
            f"{PREFIX}_consumer_crashes_total",
            "Times the consumer ended without a stop request (the process then exits non-zero)",
            registry=r,
        )
        self.dead_letters_lost = Counter(
            f"{PREFIX}_dead_letters_lost_total",
            "Dead letters that neither the DLQ nor a stub of them could hold (logged with coordinates)",
            registry=r,
        )
        self.retention_runs = Counter(
            f"{PREFIX}_retention_runs_total", "Retention runs by result", ["result"], registry=r
        )
        self.retention_removed = Counter(
            f"{PREFIX}_retention_rows_removed_total",
            "Rows the retention job removed: expired ledger rows, touch rows folded into their run's "
            "first row, history of memories gone past the horizon",
            ["kind"],
            registry=r,
        )
        self.retention_duration = Gauge(
            f"{PREFIX}_retention_last_duration_seconds", "Duration of the last retention run", registry=r
        )
        self.retention_longest_transaction = Gauge(
            f"{PREFIX}_retention_longest_transaction_seconds",
            "Longest write transaction of the last retention run",
            registry=r,
        )
        self.table_rows = Gauge(
            f"{PREFIX}_table_rows", "Rows per table, counted by the last retention run", ["table"], registry=r
        )
        self.db_retries = Counter(
            f"{PREFIX}_db_retries_total",
            "Event processing retried after a transient database error",
            registry=r,
        )
        self.consumer_lag = Gauge(
            f"{PREFIX}_consumer_lag",
            "Messages behind the partition's high watermark",
            ["partition"],
            registry=r,
        )
        self.in_flight = Gauge(f"{PREFIX}_events_in_flight", "Events taken but not finished", registry=r)
        self.partitions_assigned = Gauge(
            f"{PREFIX}_partitions_assigned", "Partitions this consumer owns", registry=r
        )
        self.rebalances = Counter(
            f"{PREFIX}_rebalances_total", "Partition assignments this consumer received", registry=r
        )
        self.ready = Gauge(
            f"{PREFIX}_ready", "1 when every dependency answered the last readiness check", registry=r
        )
        self.log_resets = Counter(
            f"{PREFIX}_consumer_log_resets_total",
            "Times a partition's log ended below this consumer's position (a topic deleted and"
            " created again, a truncated log) and the consumer went back to its start",
            ["partition"],
            registry=r,
        )
        self.committed_offset = Gauge(
            f"{PREFIX}_committed_offset", "Last committed offset", ["partition"], registry=r
        )
        self._model_quality_gauges(r)
        self._initialize_series()

    def _model_quality_gauges(self, r: CollectorRegistry) -> None:
        """Per extraction model, over its memories of the last 90 days (`core.model_quality`); the
        `model` label holds at most `MAX_MODELS` names and "(other)"."""
        self.model_created = Gauge(
            f"{PREFIX}_model_memories_created",
            "Memories the model's extractions inserted in the last 90 days",
            ["model"],
            registry=r,
        )
        self.model_cohort = Gauge(
            f"{PREFIX}_model_memories_cohort",
            "The model's memories at least `within` old: the denominator of the rejected share",
            ["model", "within"],
            registry=r,
        )
        self.model_rejected = Gauge(
            f"{PREFIX}_model_memories_rejected",
            "The model's memories of the cohort that the user first dismissed, deleted or edited "
            "within `within` of their creation, by that first action",
            ["model", "kind", "within"],
            registry=r,
        )
        self.model_reconfirmed = Gauge(
            f"{PREFIX}_model_memories_reconfirmed",
            "The model's memories touched at least once by a later extraction",
            ["model"],
            registry=r,
        )
        self.model_touches = Gauge(
            f"{PREFIX}_model_memory_touches",
            "Touches of the model's memories by later extractions",
            ["model"],
            registry=r,
        )

    def publish_model_quality(self, figures: list[ModelQuality]) -> None:
        """Replaces every model's series (synchronously, so no scrape sees half of them)."""
        gauges = (self.model_created, self.model_cohort, self.model_rejected)
        for gauge in (*gauges, self.model_reconfirmed, self.model_touches):
            gauge.clear()
        for q in figures:
            self.model_created.labels(q.model).set(q.created)
            self.model_reconfirmed.labels(q.model).set(q.reconfirmed)
            self.model_touches.labels(q.model).set(q.touches)
            for h in q.horizons:
                within = f"{h.days}d"
                self.model_cohort.labels(q.model, within).set(h.cohort)
                for kind, count in h.rejected.items():
                    self.model_rejected.labels(q.model, kind.label, within).set(count)

    def _initialize_series(self) -> None:
        """Every known label set exists from the start at 0, so rates and alerts never see a gap."""
        for outcome in Outcome:
            self.events.labels(outcome.value)
        self._initialize_llm_series()
        for action in Action:
            for candidate_result in Result:
                self.candidates.labels(action.value, candidate_result.value)
        for run_result in RunResult:
            self.consolidations.labels(run_result.value)
        for op in ConsolidatedOp:
            self.consolidated_rows.labels(op)
        for reason in DeadLetterReason:
            self.dead_letters.labels(reason.value)
        for path in ProcessingPath:
            self.processing_latency.labels(path)
        for kind in RetentionKind:
            self.retention_removed.labels(kind)
        for retention_result in RetentionResult:
            self.retention_runs.labels(retention_result)

    def _initialize_llm_series(self) -> None:
        for purpose in LlmPurpose:
            for result in LlmResult:
                self.llm_calls.labels(purpose, result)
            self.llm_latency.labels(purpose)
            self.llm_cost.labels(purpose)
            self.llm_prompt_chars.labels(purpose)
            self.llm_retries.labels(purpose)
            for token_kind in TokenKind:
                self.llm_tokens.labels(purpose, token_kind)
        for weaker in (("json_schema", "json_object"), ("json_object", "off")):
            self.llm_mode_fallbacks.labels(*weaker)
