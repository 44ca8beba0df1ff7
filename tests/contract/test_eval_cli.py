"""`mao-memory eval` as a child process against scripted models that answer the labelled set from
its own labels: the scores must tell a perfect, an empty and a sloppy model apart, each on the
metrics it breaks, per category too."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from service.core.eval_cases import Category, EvalCase
from service.entrypoints.eval_command import load_cases
from tests.support.eval_models import EMPTY, ORACLE, SLOPPY, responder
from tests.support.scripted_llm import ScriptedLlm

ROOT = Path(__file__).resolve().parents[2]
CASES = ROOT / "eval" / "cases"
GARBAGE, REFUSED = "garbage", "refused"


def eval_cli(tmp_path: Path, llm: ScriptedLlm, *args: str) -> subprocess.CompletedProcess[str]:
    """The command of this checkout in an empty directory (no `.env`), its database a throwaway."""
    return subprocess.run(
        [sys.executable, "-m", "service.main", "eval", "--api-base", llm.api_base, *args],
        env={**os.environ, "PYTHONPATH": str(ROOT), "MEMORY_LLM_MAX_RETRIES": "0"},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.fixture(scope="module")
def cases() -> list[EvalCase]:
    return load_cases(CASES)


@pytest.fixture(scope="module")
def reports(
    tmp_path_factory: pytest.TempPathFactory, llm_server: ScriptedLlm, cases: list[EvalCase]
) -> Iterator[dict[str, dict[str, Any]]]:
    """One run of five models, the tests' common input (a run takes seconds)."""
    llm, tmp_path = llm_server, tmp_path_factory.mktemp("eval")
    llm.reset()
    llm.responder = responder(cases)
    llm.script("", "this is not JSON", only_if=lambda r: r.model == GARBAGE)
    llm.script("", status=400, only_if=lambda r: r.model == REFUSED)
    out = tmp_path / "eval.json"
    models = [f"openai/{m}" for m in (ORACLE, EMPTY, SLOPPY, GARBAGE, REFUSED)]
    run = eval_cli(
        tmp_path, llm, *(a for m in models for a in ("--model", m)), "--cases", str(CASES), "--out", str(out)
    )
    assert run.returncode == 0, run.stderr
    # The table on stdout names every model; progress on stderr ends at the whole count.
    assert all(m in run.stdout.splitlines()[0] for m in models)
    assert f"{len(cases) * len(models)}/{len(cases) * len(models)} cases" in run.stderr
    yield {r["model"].removeprefix("openai/"): r for r in json.loads(out.read_text())["models"]}
    llm.reset()


def test_the_oracle_scores_one_the_empty_model_recalls_nothing_the_sloppy_one_in_between(
    reports: dict[str, dict[str, Any]], cases: list[EvalCase]
) -> None:
    oracle, empty, sloppy = reports[ORACLE], reports[EMPTY], reports[SLOPPY]
    updates = sum(k.action == "update" for c in cases for k in c.keep)
    assert oracle["cases"] == empty["cases"] == sloppy["cases"] == len(cases)
    for name in ("recall", "precision", "f1", "false_memory_resistance", "action_accuracy"):
        assert oracle[name] == 1.0, name
    assert oracle["dismissed_respected"] == oracle["language_kept"] == 1.0
    assert oracle["update"] == {"correct": updates, "hallucinated": 0, "omitted": 0}
    assert (empty["recall"], empty["f1"], empty["precision"]) == (0.0, 0.0, None)
    assert empty["false_memory_resistance"] == empty["dismissed_respected"] == 1.0
    assert empty["update"] == {"correct": 0, "hallucinated": 0, "omitted": updates}
    # Sloppy keeps every gold fact in its own language and updates right, but restates stored facts
    # as new rows, keeps distractors and revives dismissed facts: exactly those scores fall.
    assert sloppy["recall"] == sloppy["language_kept"] == 1.0
    assert sloppy["update"] == oracle["update"]
    for name in ("precision", "false_memory_resistance", "action_accuracy", "dismissed_respected"):
        assert 0.0 < sloppy[name] < 1.0, name
    assert empty["f1"] < sloppy["f1"] < oracle["f1"]
    assert all(r["failures"] == {} for r in (oracle, empty, sloppy))


def test_every_category_tells_the_three_apart(reports: dict[str, dict[str, Any]]) -> None:
    oracle, empty, sloppy = (reports[m]["per_category"] for m in (ORACLE, EMPTY, SLOPPY))
    assert set(oracle) == {c.value for c in Category}
    for category, scores in oracle.items():
        assert scores["false_memory_resistance"] == 1.0, category
        assert sloppy[category]["false_memory_resistance"] < 1.0, category
        assert empty[category]["false_memory_resistance"] == 1.0, category
        if scores["recall"] is not None:  # a category with facts to keep
            assert (scores["recall"], empty[category]["recall"], sloppy[category]["recall"]) == (1, 0, 1)
            assert sloppy[category]["precision"] < scores["precision"] == 1.0, category


def test_failed_answers_are_counted_by_kind_and_score_as_nothing_kept(
    reports: dict[str, dict[str, Any]], cases: list[EvalCase]
) -> None:
    garbage, refused = reports[GARBAGE], reports[REFUSED]
    assert garbage["failures"] == {"invalid_json": len(cases)}
    assert refused["failures"] == {"rejected": len(cases)}
    assert garbage["recall"] == refused["recall"] == 0.0
    assert garbage["prompt_tokens"] == 100 * len(cases)  # the scripted server's usage per answer
    assert garbage["latency_p50_s"] is not None and garbage["cost_usd"] is None  # no price in litellm's map


def test_a_mislabelled_case_file_stops_the_run_naming_the_line(tmp_path: Path, llm: ScriptedLlm) -> None:
    good = CASES.joinpath("project_fact.jsonl").read_text(encoding="utf-8").splitlines()[0]
    broken = json.loads(good) | {"keep": [{**json.loads(good)["keep"][0], "target": "nowhere"}]}
    bad = tmp_path / "bad.jsonl"
    bad.write_text(good + "\n" + json.dumps(broken, ensure_ascii=False) + "\n", encoding="utf-8")

    run = eval_cli(tmp_path, llm, "--model", "openai/oracle", "--cases", str(bad))

    assert run.returncode == 2 and f"{bad}:2" in run.stderr and "insert has no target" in run.stderr
    assert llm.requests == []
