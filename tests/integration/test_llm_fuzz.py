"""Generated model answers against the real client, on the service's own HTTP path and through
`litellm.acompletion` (Anthropic's format): status codes, bodies good, empty, cut, not JSON or of
the wrong shape, Retry-After values, resets, cut connections and delays beyond the timeout.

Each call must end in the class docs/operations.md's failure table states, make at most 1 + max_retries
requests (exactly that many for an outage, one otherwise), and the circuit breaker must open only
when different callers fail with no success in between.

`MEMORY_FUZZ_EXAMPLES` sets the example count (20 here; `make faults` runs the same properties with
300 by default, `tests/faults/test_llm_faults.py`).
"""

from __future__ import annotations

import itertools
import json
import os
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service.adapters.circuit_breaker import BreakerState, CircuitBreaker
from service.adapters.llm_client import AnswerShape, FailureClass, LlmClient, LlmError, StructuredOutput
from service.adapters.metrics import Metrics
from service.core.extraction_prompt import ANSWER_SCHEMA
from tests.support.scripted_llm import ScriptedLlm

EXAMPLES = int(os.environ.get("MEMORY_FUZZ_EXAMPLES", "20"))
# A call's whole deadline. An answered call through litellm's Anthropic path took over 0.2 s now and
# then on a loaded 2-core host, and was counted a timeout; the scripted timeouts wait past this one.
TIMEOUT_S = 0.6
MAX_RETRIES = 2
SHAPE = AnswerShape("memories", ANSWER_SCHEMA, max_tokens=256)
OPENAI, ANTHROPIC = "openai/fuzz-model", "anthropic/claude-haiku-4-5"
ANSWER, TRUNCATED = "answer", "truncated"
_markers = (f"fuzz-{n}" for n in itertools.count())

FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


@dataclass(frozen=True)
class Scripted:
    """One generated answer: the scripted server's rule and the outcome the failure table states."""

    rule: dict[str, Any]
    expected: str  # a FailureClass value, ANSWER or TRUNCATED
    kind: str | None = None  # the LlmError's metric label, for failures


def status_class(status: int) -> FailureClass:
    """docs/operations.md's failure table ("Model failures"), restated as the oracle."""
    if status == 429 or status >= 500:
        return FailureClass.OUTAGE
    if status in (408, 409, 425) or status < 400:
        return FailureClass.EVENT
    return FailureClass.REJECTED


def kind_of(status: int) -> str:
    return {FailureClass.REJECTED: "rejected"}.get(
        status_class(status), "timeout" if status == 408 else "error"
    )


def openai_completion(content: Any, finish: str, usage: Any = None) -> bytes:
    choice = {"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": finish}
    completion = {"id": "c", "object": "chat.completion", "choices": [choice]}
    return json.dumps(completion | ({} if usage is None else {"usage": usage})).encode()


def anthropic_message(content: Any, stop: str) -> bytes:
    message = {"id": "m", "type": "message", "role": "assistant", "model": "m", "content": content}
    return json.dumps(
        message | {"stop_reason": stop, "usage": {"input_tokens": 1, "output_tokens": 1}}
    ).encode()


TEXT = st.text(max_size=40)
NOT_TEXT = st.one_of(
    st.integers(), st.floats(allow_nan=False), st.booleans(), st.lists(st.integers(), max_size=2)
)
NOT_JSON = st.text(max_size=30).map(lambda t: ("<" + t).encode())


# A usage block is bookkeeping: however wrong, the answer beside it stands.
USAGE = st.one_of(
    st.none(),
    st.sampled_from(["x", [], {}, {"prompt_tokens": "abc"}, {"prompt_tokens": -5, "completion_tokens": -1}]),
    st.fixed_dictionaries(
        {"prompt_tokens": st.integers(-(10**20), 10**20), "completion_tokens": st.floats(0, 1e6)}
    ),
)


def good_answers(model: str) -> st.SearchStrategy[Scripted]:
    def openai(text: str | None, cut: bool, usage: Any) -> Scripted:
        return Scripted(
            {"raw_body": openai_completion(text, "length" if cut else "stop", usage)}, cut_or_not(cut)
        )

    def anthropic(text: str, cut: bool) -> Scripted:
        content = [{"type": "text", "text": text}]
        return Scripted(
            {"raw_body": anthropic_message(content, "max_tokens" if cut else "end_turn")}, cut_or_not(cut)
        )

    if model == OPENAI:
        return st.builds(openai, st.one_of(TEXT, st.none()), st.booleans(), USAGE)
    return st.builds(anthropic, TEXT, st.booleans())


def cut_or_not(cut: bool) -> str:
    return TRUNCATED if cut else ANSWER


def unusable_bodies(model: str) -> st.SearchStrategy[bytes]:
    good = openai_completion("[]", "stop") if model == OPENAI else anthropic_message([], "end_turn")
    wrong = (
        [
            b"{}",
            b"[]",
            b"null",
            b'{"choices": []}',
            b'{"choices": "x"}',
            b'{"choices": [{}]}',
            b'{"choices": [{"message": null}]}',
            b'{"choices": [{"message": "hi"}]}',
        ]
        if model == OPENAI
        else [b"{}", b"[]", b'{"type": "message"}', b'{"type": "message", "content": "hi"}']
    )
    wrong_content = NOT_TEXT.map(
        (lambda c: openai_completion(c, "stop"))
        if model == OPENAI
        else (lambda c: anthropic_message([{"type": "text", "text": c}], "end_turn"))
    )
    cut = st.integers(0, len(good) - 1).map(lambda n: good[:n])
    return st.one_of(st.sampled_from(wrong), wrong_content, cut, NOT_JSON)


RETRY_AFTER = st.sampled_from([None, "0", "0.01", "-5", "abc", "nan", "inf", "Wed, 21 Oct 2015 07:28:00 GMT"])


def failures() -> st.SearchStrategy[Scripted]:
    statuses = st.one_of(
        st.sampled_from([300, 302, 307, 400, 401, 403, 404, 408, 409, 413, 422, 425, 429]),
        st.integers(400, 599),
        st.integers(500, 599),
    )
    http = st.builds(
        lambda status, after: Scripted(
            {"status": status, "headers": {"Retry-After": after} if after else {}},
            status_class(status).value,
            kind_of(status),
        ),
        statuses,
        RETRY_AFTER,
    )
    connection = st.sampled_from(
        [
            Scripted({"reset": True}, FailureClass.OUTAGE.value, "error"),
            Scripted({"truncate": True}, FailureClass.OUTAGE.value, "error"),
        ]
    )
    return st.one_of(http, connection)


def scripted(model: str) -> st.SearchStrategy[Scripted]:
    unusable = unusable_bodies(model).map(
        lambda raw: Scripted({"raw_body": raw}, FailureClass.EVENT.value, "error")
    )
    plain = st.one_of(good_answers(model), unusable, failures())
    # One answer in five arrives after the timeout, whatever it would have been.
    return st.builds(late_or_not, plain, st.sampled_from([False, False, False, False, True]))


def late_or_not(answer: Scripted, late: bool) -> Scripted:
    if not late:
        return answer
    return Scripted(answer.rule | {"delay_s": TIMEOUT_S + 0.1}, FailureClass.EVENT.value, "timeout")


def new_client(server: ScriptedLlm, model: str, breaker: CircuitBreaker | None = None) -> LlmClient:
    base = server.api_base.removesuffix("/v1") if model == ANTHROPIC else server.api_base
    return LlmClient(
        Metrics(),
        base,
        "k",
        timeout_s=TIMEOUT_S,
        max_retries=MAX_RETRIES,
        retry_base_s=0.001,
        breaker=breaker,
        structured_output=StructuredOutput.OFF,
    )


async def call(
    server: ScriptedLlm, client: LlmClient, model: str, answer: Scripted, caller: object = None
) -> tuple[str, str | None, int]:
    """The call's outcome (ANSWER, TRUNCATED or a failure class), its kind and requests sent."""
    marker = next(_markers)
    rule = server.script(marker, **answer.rule)
    messages = [{"role": "system", "content": "rules"}, {"role": "user", "content": marker}]
    try:
        result = await client.complete("extraction", model, messages, SHAPE, wait=False, caller=caller)
        outcome, kind = (TRUNCATED if result.truncated else ANSWER), None
    except LlmError as exc:
        outcome, kind = exc.failure.value, exc.kind
    finally:
        server.remove(rule)
    return outcome, kind, len(server.calls(marker))


async def warm(server: ScriptedLlm, model: str) -> None:
    """One answered call first: litellm's setup on a process's first call (about 0.4 s) would
    otherwise count against the call's deadline."""
    client = new_client(server, model)
    try:
        await call(server, client, model, Scripted({}, ANSWER))
    finally:
        await client.stop()


async def check_answers(server: ScriptedLlm, model: str, answers: list[Scripted]) -> None:
    await warm(server, model)
    client = new_client(server, model, CircuitBreaker(threshold=10_000, open_s=60, max_open_s=60))
    try:
        for answer in answers:
            outcome, kind, requests = await call(server, client, model, answer)
            assert (outcome, kind) == (answer.expected, answer.kind), answer.rule
            assert requests == (1 + MAX_RETRIES if outcome == FailureClass.OUTAGE.value else 1), answer.rule
    finally:
        await client.stop()


@FUZZ
@given(data=st.data())
@pytest.mark.parametrize("model", [OPENAI, ANTHROPIC])
async def test_every_answer_ends_in_its_class_and_no_call_is_retried_without_bound(
    llm_server: ScriptedLlm, model: str, data: st.DataObject
) -> None:
    await check_answers(llm_server, model, data.draw(st.lists(scripted(model), min_size=1, max_size=2)))


# A call's outcome for the breaker: answered, rejected (also an answer), or failed.
BREAKER_ANSWERS = {
    "ok": Scripted({"raw_body": openai_completion("[]", "stop")}, ANSWER),
    "rejected": Scripted({"status": 400}, FailureClass.REJECTED.value, "rejected"),
    "event": Scripted({"status": 409}, FailureClass.EVENT.value, "error"),
    "unusable": Scripted({"raw_body": b"{}"}, FailureClass.EVENT.value, "error"),
    "outage": Scripted({"status": 503}, FailureClass.OUTAGE.value, "error"),
}
THRESHOLD = 3


@FUZZ
@given(calls=st.lists(st.tuples(st.integers(0, 4), st.sampled_from(sorted(BREAKER_ANSWERS))), max_size=12))
async def test_the_breaker_opens_only_when_different_callers_fail(
    llm_server: ScriptedLlm, calls: list[tuple[int, str]]
) -> None:
    await check_breaker(llm_server, calls)


async def check_breaker(server: ScriptedLlm, calls: list[tuple[int, str]]) -> None:
    """Against a model of the rule: a success or a rejection clears the failing callers, a failure
    adds its caller, `THRESHOLD` of them open the breaker, and an open breaker sends nothing. A
    rejection that `THRESHOLD` different callers met with no answer between is an outage."""
    breaker = CircuitBreaker(threshold=THRESHOLD, open_s=60, max_open_s=60)
    client = new_client(server, OPENAI, breaker)
    failing: set[int] = set()
    rejected: set[int] = set()  # callers rejected since the last answer: THRESHOLD of them, an outage
    try:
        for caller, name in calls:
            answer = BREAKER_ANSWERS[name]
            outcome, kind, requests = await call(server, client, OPENAI, answer, caller)
            if len(failing) >= THRESHOLD:
                assert (outcome, kind, requests) == (FailureClass.OUTAGE.value, "unavailable", 0)
                continue
            expected_outcome = answer.expected
            if name == "rejected":
                rejected.add(caller)
                if len(rejected) >= THRESHOLD:
                    expected_outcome = FailureClass.OUTAGE.value
            elif name == "ok":
                rejected.clear()
            assert (outcome, kind) == (expected_outcome, answer.kind)
            if outcome in (ANSWER, FailureClass.REJECTED.value):
                failing.clear()
            else:
                failing.add(caller)
            expected = BreakerState.OPEN if len(failing) >= THRESHOLD else BreakerState.CLOSED
            assert breaker.state is expected, (calls, failing)
    finally:
        await client.stop()
