"""Per-fact scoring of what a turn wrote against a case's labels (pure, no model, no database)."""

from __future__ import annotations

from typing import Any, cast

import pytest

from service.core.eval_cases import EvalCase
from service.core.eval_scoring import CaseRun, Usage, Written, model_report, percentile, score_case
from service.core.model import Scope

P = Scope.PROJECT
BOUND = 4000  # MEMORY_LLM_CONVERSATION_TOKENS' default


def case(category: str = "changed_fact_update", **overrides: Any) -> EvalCase:
    base: dict[str, Any] = {
        "id": "c1",
        "category": category,
        "language": "mixed",
        "user": "我们这个仓库已经从 npm 迁到 pnpm 了，另外周报改成周四交。",
        "assistant": "好的。",
        "projectKey": "shop",
        "pool": [
            {"id": "p1", "scope": "PROJECT", "projectKey": "shop", "content": "项目用 npm 管理依赖"},
            {"id": "p2", "scope": "USER", "content": "周报用中文写"},
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
                "example": "用 pnpm",
            },
            {
                "match": {"all": ["周报"]},
                "scope": "USER",
                "action": "touch",
                "target": "p2",
                "example": "周报用中文写",
            },
        ],
        "distractors": [
            {"match": {"all": ["npm"], "none": ["pnpm"]}, "example": "项目用 npm"},
            {"match": {"any": ["暗色", "深色"]}, "example": "用户喜欢深色界面", "dismissed": "x1"},
        ],
    }
    return EvalCase.model_validate(base | overrides)


def scores(*written: Written, failure: str | None = None, of: EvalCase | None = None) -> dict[str, Any]:
    return score_case(CaseRun(of or case(), written, failure), BOUND).scores()


PERFECT = (
    Written("update", "p1", "项目用 pnpm 管理依赖", P),
    Written("touch", "p2", "周报用中文写", Scope.USER),
)


def test_the_labelled_outcome_scores_one_everywhere() -> None:
    got = scores(*PERFECT)
    assert (got["recall"], got["precision"], got["f1"], got["action_accuracy"]) == (1.0, 1.0, 1.0, 1.0)
    assert (got["false_memory_resistance"], got["dismissed_respected"], got["language_kept"]) == (
        1.0,
        1.0,
        1.0,
    )
    assert got["update"] == {"correct": 1, "hallucinated": 0, "omitted": 0}


def test_nothing_written_recalls_nothing_and_keeps_no_distractor() -> None:
    got = scores()
    assert (got["recall"], got["precision"], got["f1"], got["action_accuracy"]) == (0.0, None, 0.0, None)
    assert got["false_memory_resistance"] == got["dismissed_respected"] == 1.0
    assert got["language_kept"] is None
    assert got["update"] == {"correct": 0, "hallucinated": 0, "omitted": 1}


def test_a_changed_fact_inserted_beside_the_old_one_is_an_omitted_update_and_a_wrong_action() -> None:
    got = scores(Written("insert", None, "项目改用 pnpm", P), PERFECT[1])
    assert got["recall"] == got["precision"] == 1.0
    assert got["action_accuracy"] == 0.5
    assert got["update"] == {"correct": 0, "hallucinated": 0, "omitted": 1}


def test_an_update_of_the_wrong_row_is_hallucinated_and_the_right_one_omitted() -> None:
    got = scores(Written("update", "p2", "项目用 pnpm", Scope.USER))
    assert got["update"] == {"correct": 0, "hallucinated": 1, "omitted": 1}
    assert got["recall"] == 0.5 and got["action_accuracy"] == 0.0


def test_a_touched_stale_fact_and_a_reworded_dismissal_are_kept_distractors() -> None:
    got = scores(*PERFECT, Written("touch", "p1", "项目用 npm 管理依赖", P))
    assert (got["false_memory_resistance"], got["dismissed_respected"]) == (0.5, 1.0)
    assert got["precision"] == 2 / 3
    got = scores(*PERFECT, Written("insert", None, "用户喜欢深色界面", Scope.USER))
    assert (got["false_memory_resistance"], got["dismissed_respected"]) == (0.5, 0.0)


def test_language_is_judged_on_the_words_the_turn_wrote_not_on_touched_rows() -> None:
    english = case(
        language="en", keep=[], pool=[], distractors=[], user="we moved this repo from npm to pnpm"
    )
    got = scores(
        Written("insert", None, "repo uses pnpm", P), Written("update", "p9", "用 pnpm", P), of=english
    )
    assert got["language_kept"] == 0.5
    got = scores(Written("touch", "p9", "用 pnpm", P), of=english)
    assert got["language_kept"] is None


def test_a_case_with_nothing_to_keep_has_no_recall_and_any_write_is_imprecise() -> None:
    idle = case("nothing_worth_keeping", keep=[], distractors=[])
    assert scores(of=idle)["recall"] is None and scores(of=idle)["f1"] is None
    assert scores(Written("insert", None, "随便一句", Scope.USER), of=idle)["precision"] == 0.0


def test_the_report_adds_counts_over_cases_then_divides_per_category_and_in_total() -> None:
    idle = case(
        "nothing_worth_keeping",
        id="c2",
        keep=[],
        user="早上好！今天有什么新闻吗？随便聊聊，等会儿再开始干活。",
    )
    runs = [
        CaseRun(case(), PERFECT),
        CaseRun(idle, (Written("insert", None, "用户喜欢深色界面", Scope.USER),)),
        CaseRun(case(id="c3", user="同样的一句话，但模型没有回答，算作什么都没留下。"), failure="timeout"),
    ]
    usage = Usage(100, 20, 40, None, [0.3, 0.1, 0.2, 0.4])

    report = model_report("m", runs, usage, BOUND, {"dropped_item": 2, "unused": 0})

    assert report["cases"] == 3 and report["recall"] == 2 / 4 and report["precision"] == 2 / 3
    assert report["false_memory_resistance"] == pytest.approx(5 / 6)
    assert report["dismissed_respected"] == pytest.approx(2 / 3)
    assert report["update"] == {"correct": 1, "hallucinated": 0, "omitted": 1}
    assert report["failures"] == {"dropped_item": 2, "timeout": 1}
    assert (report["prompt_tokens"], report["cached_tokens"], report["cost_usd"]) == (100, 40, None)
    assert (report["latency_p50_s"], report["latency_p95_s"]) == (0.2, 0.4)
    per = cast(dict[str, dict[str, Any]], report["per_category"])
    assert set(per) == {"changed_fact_update", "nothing_worth_keeping"}
    assert per["nothing_worth_keeping"]["false_memory_resistance"] == 0.5
    assert per["changed_fact_update"]["recall"] == 0.5


def test_percentiles_are_nearest_rank() -> None:
    assert percentile([], 0.5) is None
    assert percentile([5.0], 0.95) == 5.0
    assert percentile([float(i) for i in range(1, 101)], 0.95) == 95.0


def test_a_fact_the_cut_takes_from_the_conversation_is_counted_as_out_of_the_prompt() -> None:
    """Both facts are in the message; the second one sits past what the bound keeps of its head."""
    long = case(user="我们这个仓库已经从 npm 迁到 pnpm 了。" + "日志行。" * 3000 + "另外周报改成周四交。")
    assert (scores(of=long)["facts_in_conversation"], scores(of=long)["facts_in_prompt"]) == (1.0, 0.5)
    assert (scores()["facts_in_conversation"], scores()["facts_in_prompt"]) == (1.0, 1.0)
