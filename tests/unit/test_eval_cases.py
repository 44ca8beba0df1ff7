"""The labelled evaluation set: its size and shape, and the schema that refuses a mislabelled case."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from service.core.eval_cases import Category, EvalCase, Match, fold
from service.core.model import Action, Status
from service.entrypoints.eval_command import CasesInvalid, load_cases

CASES = Path(__file__).resolve().parents[2] / "eval" / "cases"


@pytest.fixture(scope="module")
def cases() -> list[EvalCase]:
    return load_cases(CASES)


def test_the_set_holds_150_cases_at_least_10_per_category_one_file_each(cases: list[EvalCase]) -> None:
    per_category = Counter(c.category for c in cases)
    assert len(cases) >= 150
    assert set(per_category) == set(Category)
    assert min(per_category.values()) >= 10
    assert sorted(p.stem for p in CASES.glob("*.jsonl")) == sorted(c.value for c in Category)
    for path in CASES.glob("*.jsonl"):
        assert {json.loads(line)["category"] for line in path.read_text().splitlines()} == {path.stem}


def test_ids_are_unique_and_every_target_is_a_shown_entry_of_the_pool(cases: list[EvalCase]) -> None:
    assert len({c.id for c in cases}) == len(cases)
    for case in cases:
        shown = {p.id for p in case.pool if p.shown(case.project_key)}
        assert {k.target for k in case.keep if k.target} <= shown, case.id


def test_the_set_covers_its_languages_and_the_labels_each_category_needs(cases: list[EvalCase]) -> None:
    assert {c.language for c in cases} == {"zh", "en", "mixed"}
    by = {cat: [c for c in cases if c.category is cat] for cat in Category}
    actions = {cat: {k.action for c in group for k in c.keep} for cat, group in by.items()}
    assert actions[Category.RESTATEMENT_TOUCH] == {Action.TOUCH}
    assert actions[Category.MORE_COMPLETE_UPDATE] == actions[Category.CHANGED_FACT_UPDATE] == {Action.UPDATE}
    for cat in (Category.ONE_OFF_TASK, Category.GUESS_OR_SMALL_TALK, Category.NOTHING_WORTH_KEEPING):
        assert actions[cat] == set(), cat
    assert all(any(d.dismissed for d in c.distractors) for c in by[Category.DISMISSED_REWORDED])
    assert all(any(p.status is Status.DISMISSED for p in c.pool) for c in by[Category.DISMISSED_REWORDED])
    assert all(c.pool and not c.keep for c in by[Category.INJECTED_ECHO])
    assert all(len(c.user) + len(c.assistant) > 2000 for c in by[Category.LONG_CONVERSATION])
    assert all(c.keep or c.distractors for c in cases)


def test_match_rules_fold_width_case_and_spaces() -> None:
    rule = Match.model_validate({"all": ["Node 20"], "any": ["CI", "持续集成"], "none": ["node 22"]})
    assert rule.matches("仓库固定用 ＮＯＤＥ20，ci 也是")
    assert not rule.matches("仓库用 node 20 和 node 22，CI 也是")
    assert not rule.matches("仓库固定用 Node 20")
    assert fold("20 号") == fold("20号")


def _case(**overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "id": "c1",
        "category": "changed_fact_update",
        "language": "mixed",
        "user": "我们这个仓库已经从 npm 迁到 pnpm 了，以后都用 pnpm。",
        "assistant": "好的。",
        "projectKey": "shop",
        "pool": [
            {"id": "p1", "scope": "PROJECT", "projectKey": "shop", "content": "项目用 npm 管理依赖"},
            {
                "id": "x1",
                "scope": "USER",
                "content": "用户喜欢暗色主题",
                "status": "DISMISSED",
                "dismissedBy": "USER",
            },
        ],
        "keep": [
            {
                "match": {"all": ["pnpm"]},
                "scope": "PROJECT",
                "action": "update",
                "target": "p1",
                "example": "项目用 pnpm 管理依赖",
            }
        ],
        "distractors": [{"match": {"all": ["npm"], "none": ["pnpm"]}, "example": "项目用 npm"}],
    }
    return base | overrides


def test_a_well_labelled_case_passes() -> None:
    assert EvalCase.model_validate(_case()).keep[0].target == "p1"


@pytest.mark.parametrize(
    ("change", "complaint"),
    [
        ({"user": "用 pnpm 吧"}, "never reaches the model"),
        ({"keep": [_case()["keep"][0] | {"target": "p9"}]}, "not a shown"),
        ({"keep": [_case()["keep"][0] | {"target": "x1", "scope": "USER"}]}, "not a shown"),
        ({"keep": [_case()["keep"][0] | {"target": None}]}, "insert has no target"),
        ({"keep": [_case()["keep"][0] | {"example": "项目用 yarn"}]}, "fails its own match rule"),
        ({"keep": [_case()["keep"][0] | {"example": "项目用 npm 管理依赖"}]}, "fails its own match rule"),
        ({"keep": [_case()["keep"][0] | {"match": {"all": [" "]}}]}, "no empty term"),
        ({"keep": [_case()["keep"][0] | {"match": {"none": ["yarn"]}}]}, "needs an `all` or `any`"),
        ({"keep": [_case()["keep"][0] | {"example": "repo uses pnpm"}]}, "not in the case's language"),
        ({"distractors": [{"match": {"all": ["pnpm"]}, "example": "用 pnpm"}]}, "matches a"),
        (
            {
                "distractors": [
                    {"match": {"all": ["npm"], "none": ["pnpm"]}, "example": "用 npm", "dismissed": "p1"}
                ]
            },
            "no user-dismissed",
        ),
        ({"pool": [_case()["pool"][0]] * 2}, "pool ids repeat"),
        ({"pool": [{"id": "p1", "scope": "USER", "projectKey": "shop", "content": "x"}]}, "projectKey"),
        ({"pool": [{"id": "p1", "scope": "USER", "content": "x", "status": "DISMISSED"}]}, "dismissedBy"),
        ({"projectKey": None}, "needs the case's projectKey"),
        ({"category": "gossip"}, "category"),
        ({"surprise": 1}, "surprise"),
    ],
)
def test_a_mislabelled_case_is_refused(change: dict[str, Any], complaint: str) -> None:
    with pytest.raises(ValidationError, match=complaint):
        EvalCase.model_validate(_case(**change))


def test_the_loader_names_the_bad_line_and_refuses_repeats(tmp_path: Path) -> None:
    line = json.dumps(_case(), ensure_ascii=False)
    (tmp_path / "a.jsonl").write_text(line + "\n\n" + json.dumps(_case(id="c2", user="x")) + "\n")
    with pytest.raises(CasesInvalid, match=r"a\.jsonl:3"):
        load_cases(tmp_path)
    (tmp_path / "a.jsonl").write_text(line + "\n" + json.dumps(_case(id="c2"), ensure_ascii=False) + "\n")
    with pytest.raises(CasesInvalid, match="conversation repeats"):
        load_cases(tmp_path)
    (tmp_path / "a.jsonl").write_text(line + "\n")
    (tmp_path / "b.jsonl").write_text(json.dumps(_case(assistant="不同"), ensure_ascii=False) + "\n")
    with pytest.raises(CasesInvalid, match="id repeats"):
        load_cases(tmp_path)
    (tmp_path / "empty").mkdir()
    with pytest.raises(CasesInvalid, match=r"no \*\.jsonl"):
        load_cases(tmp_path / "empty")
    with pytest.raises(OSError):
        load_cases(tmp_path / "nothing.jsonl")
