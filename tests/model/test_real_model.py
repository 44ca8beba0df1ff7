"""`make test-model`: the extraction path end to end against a real model server (opt-in).

llama.cpp's OpenAI-compatible server serves SmolLM2-135M-Instruct; a completed event with capture
on goes through the handler and litellm with the structured-output request. A 135M model is a
protocol partner, not a judge of facts: what is asserted is the protocol (the request carries a
token cap and a structured-output mode, the answer ends parsed or dropped by the guards, the event
finishes), never what the model remembered. Writes tests/output/model-run.json.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from service.adapters.db.database import Database
from service.adapters.llm_client import LlmClient, StructuredOutput
from service.adapters.metrics import Metrics
from service.core.extraction_answer import parse_extraction_answer
from service.core.outcomes import Outcome
from tests.conftest import said
from tests.integration.conftest import HandlerFactory, make_event
from tests.simulation.driver import CURRENT_USER, RecordingLlm
from tests.support.pool import items, ledger, set_capture
from tests.support.processes import free_port

MODEL_FILE = Path(".cache/models/SmolLM2-135M-Instruct.Q4_1.gguf")
SERVER_PYTHON = Path(".venv-model/bin/python")
MODEL = "openai/SmolLM2-135M-Instruct"
CONVERSATIONS = [
    "请记住:我以后所有的周报都用中文写,并且放在最前面给出三条要点摘要。",
    "Please remember that I always want code examples in TypeScript with strict mode on.",
    "这个仓库的单元测试统一用 Vitest,提交前必须跑 pnpm lint 和 pnpm test。",
]

pytestmark = pytest.mark.skipif(
    not os.environ.get("MEMORY_TEST_MODEL"), reason="opt-in: make test-model builds and serves a real model"
)


@pytest.fixture(scope="module")
def model_server() -> Iterator[str]:
    port = free_port()
    server = subprocess.Popen(
        [str(SERVER_PYTHON), "-m", "llama_cpp.server", "--model", str(MODEL_FILE), "--model_alias",
         MODEL.split("/", 1)[1], "--host", "127.0.0.1", "--port", str(port), "--n_ctx", "4096"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}/v1"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{base}/models", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.5)
    yield base
    server.terminate()
    server.wait(timeout=30)


@pytest.mark.timeout(900)
async def test_a_completed_event_goes_through_a_real_model_server(
    model_server: str, mysql_db: Database, make_handler: HandlerFactory, user_id: int
) -> None:
    metrics = Metrics()
    llm = RecordingLlm(
        LlmClient(metrics, model_server, None, timeout_s=120, max_retries=1, retry_base_s=0.5,
                  structured_output=StructuredOutput.AUTO)
    )  # fmt: skip
    await set_capture(mysql_db, user_id)
    handler = make_handler(mysql_db, llm=llm, default_model=MODEL)
    CURRENT_USER.set(user_id)
    runs = []
    for session, message in enumerate(CONVERSATIONS, start=1):
        event = make_event(user_id, session, lastUserMessage=f"{message} ({said(str(session))})")
        started = time.perf_counter()
        outcome, _ = await handler.handle(event)
        answer = llm.last_extraction.get(user_id, "")
        parsed = parse_extraction_answer(answer)
        runs.append(
            {
                "event": session,
                "outcome": outcome.value,
                "mode": llm.mode(MODEL).value,
                "seconds": round(time.perf_counter() - started, 2),
                "answer": answer[:400],
                "parsed": str(parsed)[:400],
            }
        )
        assert outcome in {Outcome.EXTRACTED, Outcome.FAILED}  # an answer, used or dropped whole
        assert [r["outcome"] for r in await ledger(mysql_db, event.event_id)] == [outcome.value]
    fallbacks = {
        f"{s.labels['from_mode']}->{s.labels['to_mode']}": s.value
        for m in metrics.registry.collect()
        for s in m.samples
        if s.name == "mao_memory_llm_structured_output_fallbacks_total" and s.value
    }
    stored = [i.content for i in await items(mysql_db, user_id)]
    assert all(len(c) <= 120 and "\n" not in c for c in stored)
    output = Path("tests/output")
    output.mkdir(parents=True, exist_ok=True)
    (output / "model-run.json").write_text(
        json.dumps(
            {"model": MODEL, "fallbacks": fallbacks, "runs": runs, "stored": stored},
            ensure_ascii=False,
            indent=2,
        )
    )
