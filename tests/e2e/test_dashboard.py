"""The Grafana dashboard and the alert rules name only metrics the running service exports."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import yaml

from tests.support.processes import ServiceProcess

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
METRIC = re.compile(r"\b(?:mao_memory|process)_[a-z_]+\b")
SUFFIXES = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"], "gauge": [""]}


def exported(service: ServiceProcess) -> tuple[set[str], set[str]]:
    """Sample names a scrape can contain, and the metric families behind them."""
    text = httpx.get(f"{service.base_url}/metrics", timeout=5).text
    names, families = set(), set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, family, kind = line.split()
            base = family.removesuffix("_total") if kind == "counter" else family
            if base.startswith("mao_memory_"):
                families.add(base)
            names.update(base + suffix for suffix in SUFFIXES.get(kind, [""]))
    return names, families


def test_every_dashboard_expression_names_an_exported_metric(service: ServiceProcess) -> None:
    names, families = exported(service)
    dashboard = json.loads((DEPLOY / "grafana" / "dashboards" / "mao-memory.json").read_text())
    used = {m for panel in dashboard["panels"] for t in panel["targets"] for m in METRIC.findall(t["expr"])}
    assert used and used <= names, sorted(used - names)
    # …and the dashboard covers every family the service exports.
    covered = {f for f in families if any(u == f or u.startswith(f + "_") for u in used)}
    assert covered == families, sorted(families - covered)


def test_every_alert_expression_names_an_exported_metric(service: ServiceProcess) -> None:
    names, _ = exported(service)
    rules = yaml.safe_load((DEPLOY / "prometheus" / "alerts.yml").read_text())
    used = {m for group in rules["groups"] for rule in group["rules"] for m in METRIC.findall(rule["expr"])}
    assert used and used <= names, sorted(used - names)
