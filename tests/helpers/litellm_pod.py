"""One LiteLLM "pod" for tests/integrations/litellm: the callback configured from the environment
(as the proxy's config.yaml names it), *n* mocked completions through litellm.acompletion across
tenants, then what LiteLLM said each tenant used, as JSON on stdout; exits normally (the writer's
last flush at exit).

    python -m tests.helpers.litellm_pod POD N
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections import Counter, defaultdict

import litellm

from redis_stats.integrations.litellm.callback import usage_callback


async def main(pod: int, n: int) -> None:
    litellm.callbacks = [usage_callback]
    used: dict[str, Counter[str]] = defaultdict(Counter)
    for i in range(n):
        team = f"team-{(pod + i) % 5}"
        words = " ".join(["word"] * (1 + i % 7))
        response = await litellm.acompletion(
            model="openai/gpt-4o-mini",
            messages=[{"role": "user", "content": f"pod {pod} request {i}: {words}"}],
            mock_response="an answer of " + " ".join(["token"] * (i % 11)),
            metadata={"user_api_key_team_id": team, "user_api_key_hash": f"key-{pod}"},
        )
        used[team]["requests"] += 1
        used[team]["prompt_tokens"] += response.usage.prompt_tokens
        used[team]["generation_tokens"] += response.usage.completion_tokens
    deadline = time.monotonic() + 60
    while usage_callback.recorded < n and time.monotonic() < deadline:
        await asyncio.sleep(0.05)  # LiteLLM runs its callbacks in the background
    print(json.dumps({"recorded": usage_callback.recorded, "used": {t: dict(c) for t, c in used.items()}}))


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]), int(sys.argv[2])))
