"""The scripted model in a process of its own, so a benchmark's CPU figures leave its work out.

`python -m bench.model_server [delay_s]` prints its API base on stdout and serves until stdin closes.
Every extraction is answered with one user fact named after the marker `bench-<user>` in the prompt
(a new fact on a user's first event, the same fact, touched, afterwards); a consolidation keeps
every memory as it is.
"""

from __future__ import annotations

import json
import re
import sys

from service.core.consolidation import GROUP
from tests.support.scripted_llm import Request, ScriptedLlm

MARKER = re.compile(r"bench-(\d+)")


def answer(request: Request) -> str:
    if str(request.messages[-1]["content"]).startswith(GROUP):
        return json.dumps({"operations": []})
    found = MARKER.search(request.text)
    who = found.group(1) if found else "0"
    return json.dumps({"memories": [{"type": "user", "content": f"用户{who}在基准测试里的长期偏好"}]})


if __name__ == "__main__":
    llm = ScriptedLlm(record=False).start()
    llm.default_delay_s = float(sys.argv[1]) if len(sys.argv) > 1 else 0.0
    llm.responder = answer
    print(llm.api_base, flush=True)
    sys.stdin.read()
    llm.stop()
