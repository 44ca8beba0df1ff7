"""What the dead-letter topic is asked to be (replication, `min.insync.replicas`, retention) and how
an existing topic falls short of it: plain data in, sentences out."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Durability:
    replication_factor: int | None = None  # None: the broker's default
    min_insync_replicas: int | None = None  # None: the broker's default
    retention_ms: int | None = None  # None: the broker's default

    def topic_configs(self) -> dict[str, str]:
        configs = {}
        if self.min_insync_replicas is not None:
            configs["min.insync.replicas"] = str(self.min_insync_replicas)
        if self.retention_ms is not None:
            configs["retention.ms"] = str(self.retention_ms)
        return configs


def durability_gaps(wanted: Durability, replicas: int | None, configs: dict[str, str | None]) -> list[str]:
    """How an existing topic is weaker than `wanted`: fewer replicas, a lower `min.insync.replicas`,
    a longer (or unlimited, -1) retention. A broker that reports no configuration at all (Tansu)
    is said once, as what could not be checked."""
    gaps = []
    factor = wanted.replication_factor
    if factor is not None and replicas is not None and replicas < factor:
        gaps.append(f"replication factor {replicas} < {factor} configured")
    checked = wanted.topic_configs()
    if checked and not configs:
        return [*gaps, f"the broker reports no topic configuration: {', '.join(sorted(checked))} not checked"]
    insync = _number(configs.get("min.insync.replicas"))
    if wanted.min_insync_replicas is not None and insync is not None and insync < wanted.min_insync_replicas:
        gaps.append(f"min.insync.replicas {insync} < {wanted.min_insync_replicas} configured")
    retention = _number(configs.get("retention.ms"))
    limit = wanted.retention_ms
    if limit is not None and retention is not None and not 0 <= retention <= limit:
        gaps.append(f"retention.ms {retention} keeps dead letters longer than {limit} configured")
    return gaps


def _number(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None
