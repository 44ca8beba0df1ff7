"""D15's trigger and the validation of the model's consolidation plan, without I/O."""

from __future__ import annotations

import json
from datetime import datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from service.core.consolidation import (
    InvalidPlan,
    RunResult,
    Thresholds,
    below_every_threshold,
    parse_plan,
    should_run,
)
from service.core.model import USER_GROUP, Group, Scope

NOW = datetime(2026, 12, 2, 12, 0)
MAO = Group(Scope.PROJECT, "mao")
LIMITS = Thresholds()
ALIASES = {1: 101, 2: 102, 3: 103, 4: 104}


def test_runs_when_all_three_conditions_hold() -> None:
    assert should_run(1, 151, {USER_GROUP: 10}, None, NOW, LIMITS).run
    assert should_run(1, 40, {USER_GROUP: 31}, NOW - timedelta(hours=1), NOW, LIMITS).run
    assert should_run(1, 40, {USER_GROUP: 31}, NOW, NOW, LIMITS).run  # due now
    assert should_run(1, 70, {USER_GROUP: 5, MAO: 61}, None, NOW, LIMITS).run


def test_no_new_candidate_no_run() -> None:
    assert should_run(0, 199, {USER_GROUP: 199}, None, NOW, LIMITS).reason is RunResult.SKIPPED_THRESHOLD


def test_under_every_threshold_no_run() -> None:
    assert (
        should_run(3, 150, {USER_GROUP: 30, MAO: 60}, None, NOW, LIMITS).reason is RunResult.SKIPPED_THRESHOLD
    )


def test_a_total_within_the_smallest_threshold_needs_no_group_counts() -> None:
    assert below_every_threshold(30, LIMITS) and not below_every_threshold(31, LIMITS)
    small_total = Thresholds(active_total=20)
    assert below_every_threshold(20, small_total) and not below_every_threshold(21, small_total)


def test_before_the_due_time_no_run() -> None:
    assert (
        should_run(1, 180, {USER_GROUP: 90}, NOW + timedelta(minutes=1), NOW, LIMITS).reason
        is RunResult.SKIPPED_COOLDOWN
    )


def test_a_valid_plan_maps_aliases_back_to_row_ids() -> None:
    answer = [
        {"op": "merge", "sourceIds": [1, 2], "content": "合并后的\n事实"},
        {"op": "keep", "sourceIds": [3]},
        {"op": "drop", "sourceIds": [4]},
    ]
    plan = parse_plan(json.dumps(answer), ALIASES)
    assert [(m.source_ids, m.content) for m in plan.merges] == [((101, 102), "合并后的 事实")]
    assert plan.drops == [104]


@pytest.mark.parametrize(
    "answer",
    [
        "not json",
        {"op": "merge"},
        [{"op": "merge", "sourceIds": [1], "content": "只有一个"}],
        [{"op": "merge", "sourceIds": [1, 2], "content": "长" * 121}],
        [{"op": "merge", "sourceIds": [1, 2]}],
        [{"op": "merge", "sourceIds": [1, 9], "content": "不在输入里"}],
        [{"op": "keep", "sourceIds": [1]}, {"op": "drop", "sourceIds": [1]}],
        [{"op": "merge", "sourceIds": [1, 1], "content": "重复"}],
        [{"op": "rename", "sourceIds": [1]}],
        [{"op": "drop", "sourceIds": ["1"]}],
        [{"op": "drop", "sourceIds": [True]}],
        [{"op": "drop", "sourceIds": []}],
        ["merge"],
    ],
)
def test_any_broken_rule_abandons_the_whole_plan(answer: object) -> None:
    with pytest.raises(InvalidPlan):
        parse_plan(answer if isinstance(answer, str) else json.dumps(answer), ALIASES)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2, 6) | st.text(max_size=130),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.sampled_from(["op", "sourceIds", "content", "x"]), inner, max_size=4)
    ),
    max_leaves=20,
)
operations = st.fixed_dictionaries(
    {
        "op": st.sampled_from(["merge", "keep", "drop", "other"]),
        "sourceIds": st.lists(st.integers(-1, 6), max_size=4),
    },
    optional={"content": st.text(max_size=130)},
)


@settings(max_examples=500, deadline=None)
@given(answer=st.one_of(json_values, st.lists(operations, max_size=5)))
def test_the_validator_accepts_only_plans_that_keep_every_rule(answer: object) -> None:
    try:
        plan = parse_plan(json.dumps(answer), ALIASES)
    except InvalidPlan:
        return
    used = [i for m in plan.merges for i in m.source_ids] + plan.drops
    assert len(used) == len(set(used))  # no id in two operations
    assert set(used) <= set(ALIASES.values())  # only the group's own rows
    assert all(len(m.source_ids) >= 2 for m in plan.merges)
    assert all(0 < len(m.content) <= 120 and "\n" not in m.content for m in plan.merges)


def test_a_wrapped_or_fenced_plan_parses_like_the_bare_array() -> None:
    ops = [{"op": "merge", "sourceIds": [1, 2], "content": "合并"}, {"op": "drop", "sourceIds": [3]}]
    bare = parse_plan(json.dumps(ops), ALIASES)
    assert parse_plan(json.dumps({"operations": ops}), ALIASES) == bare
    assert parse_plan("```json\n" + json.dumps({"operations": ops}) + "\n```", ALIASES) == bare
    assert bare.merges[0].source_ids == (101, 102) and bare.drops == [103]
