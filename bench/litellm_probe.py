"""CPU per model call through the service's own LlmClient, in a process of its own.

Run by `bench/run.py` against the benchmark's scripted model server answering at once, so the figure
is the client side alone: what each extraction spends in litellm before any of the service's work.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

from service.adapters.llm_client import LlmClient
from service.adapters.metrics import Metrics
from service.core.comparison_set import EMPTY
from service.core.extraction_prompt import build_extraction_messages


async def probe(api_base: str, model: str, calls: int, concurrency: int) -> dict[str, float]:
    client = LlmClient(Metrics(), api_base, "bench", timeout_s=30, max_retries=0, retry_base_s=0.1)
    messages = build_extraction_messages("请记住我喜欢用中文写报告,并且总是附上摘要。", "好的。", None, EMPTY)
    for _ in range(20):  # warm-up: connection pool, lazy imports
        await client.complete("probe", model, messages)
    slots = asyncio.Semaphore(concurrency)

    async def one() -> None:
        async with slots:
            await client.complete("probe", model, messages)

    cpu, wall = time.process_time(), time.perf_counter()
    await asyncio.gather(*(one() for _ in range(calls)))
    await asyncio.sleep(1.0)  # litellm's logging thread finishes the calls' callbacks
    cpu = time.process_time() - cpu
    wall = time.perf_counter() - wall - 1.0
    return {
        "calls": calls,
        "concurrency": concurrency,
        "cpu_ms_per_call": round(cpu / calls * 1000, 2),
        "wall_ms_per_call": round(wall / calls * 1000, 2),
    }


if __name__ == "__main__":
    base, name, n, c = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    print(json.dumps(asyncio.run(probe(base, name, n, c))))
