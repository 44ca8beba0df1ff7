"""The deployment files checked by the tools their users run: compose, promtool, kubernetes-validate."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import yaml

from service.config import Settings

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
OPS_PORT = Settings(_env_file=None).ops_port  # type: ignore[call-arg]


def run(*args: str, cwd: Path = ROOT, env: dict[str, str] | None = None) -> str:
    result = subprocess.run(
        args, cwd=cwd, capture_output=True, text=True, env={**os.environ, **(env or {})}, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout + result.stderr


def test_compose_file_is_valid_and_complete() -> None:
    assert shutil.which("docker-compose"), "scripts/ensure-tools installs docker-compose"
    rendered = run(
        "docker-compose",
        "-f",
        "docker-compose.yml",
        "config",
        env={"MEMORY_JWT_SECRET": "s", "MEMORY_INTERNAL_TOKEN": "t"},
    )
    config = yaml.safe_load(rendered)
    services = config["services"]
    assert {"kafka", "kafka-topics", "mysql", "migrate", "memory", "prometheus", "grafana"} <= set(services)
    assert services["kafka"]["image"].startswith("apache/kafka:")
    assert services["kafka"]["environment"]["KAFKA_PROCESS_ROLES"] == "broker,controller"  # KRaft
    assert services["mysql"]["image"].startswith("mysql:8")
    assert services["migrate"]["command"] == ["migrate"]
    assert services["memory"]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    topics = " ".join(services["kafka-topics"]["command"])
    assert "--topic task.finished --partitions 12" in topics and "--topic task.finished.dlq" in topics


def test_alert_rules_pass_promtool_check_and_their_unit_tests() -> None:
    assert shutil.which("promtool"), "scripts/ensure-tools installs promtool"
    assert "SUCCESS: 8 rules found" in run(
        "promtool", "check", "rules", "alerts.yml", cwd=DEPLOY / "prometheus"
    )
    assert "SUCCESS" in run("promtool", "test", "rules", "alerts_test.yml", cwd=DEPLOY / "prometheus")
    run("promtool", "check", "config", "prometheus.yml", cwd=DEPLOY / "prometheus")
    scrape = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())["scrape_configs"][0]
    assert scrape["static_configs"][0]["targets"] == [f"memory:{OPS_PORT}"]


def test_kubernetes_manifests_validate_strictly() -> None:
    manifests = sorted(str(p) for p in (DEPLOY / "k8s").glob("*.yaml"))
    out = run(str(Path(os.sys.executable).parent / "kubernetes-validate"), "--strict", *manifests)
    assert out.count("passed") == len(manifests)
    kinds = {yaml.safe_load(Path(m).read_text())["kind"] for m in manifests}
    assert kinds == {"Deployment", "Service", "PodDisruptionBudget", "ConfigMap"}
    deployment = yaml.safe_load((DEPLOY / "k8s" / "deployment.yaml").read_text())
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    # Probes and the scrape go to the ops port, at the setting's default, which the ConfigMap sets.
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    probed = {container[probe]["httpGet"]["port"] for probe in ("livenessProbe", "readinessProbe")}
    assert probed == {"ops"} and ports["ops"] == OPS_PORT
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == str(OPS_PORT)
    config = yaml.safe_load((DEPLOY / "k8s" / "configmap.yaml").read_text())["data"]
    assert config["MEMORY_OPS_PORT"] == str(OPS_PORT)
    service = yaml.safe_load((DEPLOY / "k8s" / "service.yaml").read_text())
    assert [p["targetPort"] for p in service["spec"]["ports"]] == ["http"]  # the ops port stays inside
    assert container["resources"]["requests"]
    secrets = {e["name"] for e in container["env"] if "secretKeyRef" in e.get("valueFrom", {})}
    assert {"MEMORY_JWT_SECRET", "MEMORY_INTERNAL_TOKEN", "MEMORY_LLM_API_KEY"} <= secrets
