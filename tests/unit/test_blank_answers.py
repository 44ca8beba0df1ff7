"""No text whose identity is empty (blank by the project's own rule) passes the model answers' guards:
an extraction candidate's content or a merge's content. All blank texts share one dedup hash, so one
written would collide with every other blank and absorb or replace real facts."""

from __future__ import annotations

import json

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from service.core.consolidation import InvalidPlan, parse_plan
from service.core.extraction_answer import ParsedAnswer, parse_extraction_answer
from service.core.normalize import identity

# Characters that render as nothing, some of which `clean_content` keeps, mixed with a few visible ones.
BLANKS = "\u3164\u115f\u1160\u2800\ufe0f\ufe00\u034f\u200b\u200d\u00ad\ufeff\uffa0\U000e0041 \t"
texts = st.text(alphabet=st.sampled_from(BLANKS + "a字") | st.characters(), max_size=12)


@pytest.mark.parametrize("blank", ["\u3164", "\u115f\u2800\ufe0f", "\u3164\u3164", "\ufe0f \u034f"])
def test_a_blank_text_is_no_candidate_nor_merge(blank: str) -> None:
    answer = json.dumps(
        [
            {"type": "user", "content": blank},
            {"type": "user", "action": "update", "existingId": 1, "content": blank},
        ]
    )
    parsed = parse_extraction_answer(answer)
    assert isinstance(parsed, ParsedAnswer) and parsed.candidates == [] and parsed.dropped_items == 2
    with pytest.raises(InvalidPlan, match="empty"):
        parse_plan(json.dumps([{"op": "merge", "sourceIds": [1, 2], "content": blank}]), {1: 10, 2: 20})


@settings(max_examples=300, deadline=None)
@given(texts)
@example("\u3164")
@example("\u2800a")
def test_no_text_with_an_empty_identity_is_ever_accepted(text: str) -> None:
    parsed = parse_extraction_answer(json.dumps([{"type": "user", "content": text}]))
    assert isinstance(parsed, ParsedAnswer)
    for candidate in parsed.candidates:
        assert candidate.content is not None and identity(candidate.content)
    try:
        plan = parse_plan(json.dumps([{"op": "merge", "sourceIds": [1, 2], "content": text}]), {1: 1, 2: 2})
    except InvalidPlan:
        return
    assert all(identity(m.content) for m in plan.merges)
