"""Issue 3 end to end: push with the `loraloom` command, chat through `bot:prod` with the official
openai client, promote version 2, roll back to version 1, all against a live server."""
from __future__ import annotations

import os
import subprocess
import sys

import openai
import pytest

LORALOOM = os.path.join(os.path.dirname(sys.executable), "loraloom")  # the installed console script
CHAT = [{"role": "user", "content": "Name three colours."}]
MAX_NEW_TOKENS = 12


def loraloom(live, *args: str) -> subprocess.CompletedProcess[str]:
    env = {name: value for name, value in os.environ.items() if not name.startswith("LORALOOM_")}
    env.update(LORALOOM_BASE_URL=live.url, LORALOOM_API_KEY=live.keys["acme-developer"])
    return subprocess.run([LORALOOM, *args], env=env, capture_output=True, text=True, timeout=120)


def greedy_chat(client: openai.OpenAI, model: str) -> str:
    completion = client.chat.completions.create(
        model=model, messages=CHAT, max_tokens=MAX_NEW_TOKENS, temperature=0
    )
    if model == "base" or "@" in model:
        assert completion.model == model
    else:  # an alias (a bare name follows latest) is answered with the version that served: bot@N
        assert completion.model.startswith(model.split(":")[0] + "@")
    return completion.choices[0].message.content


def test_push_promote_and_roll_back_with_the_cli(live):
    client = openai.OpenAI(base_url=f"{live.url}/v1", api_key=live.keys["acme-inference"], max_retries=0, timeout=120)
    base = greedy_chat(client, "base")

    pushed = loraloom(live, "adapters", "push", str(live.adapters["v1"]), "--name", "bot", "--alias", "prod")
    assert pushed.returncode == 0, pushed.stderr
    assert pushed.stdout == "bot@1\n" and "bot:prod -> bot@1" in pushed.stderr
    first = greedy_chat(client, "bot:prod")
    assert first != base  # the adapter changes greedy output, so the comparisons below mean something

    second_push = loraloom(live, "adapters", "push", str(live.adapters["v2"]), "--name", "bot")
    assert second_push.returncode == 0 and second_push.stdout == "bot@2\n", second_push.stderr
    assert greedy_chat(client, "bot:prod") == first  # a push moves only `latest`
    assert greedy_chat(client, "bot@1") == first

    promoted = loraloom(live, "adapters", "promote", "bot", "prod", "2")
    assert promoted.returncode == 0 and "bot:prod -> bot@2" in promoted.stderr, promoted.stderr
    second = greedy_chat(client, "bot:prod")  # the very next request
    assert second != first
    assert greedy_chat(client, "bot@2") == greedy_chat(client, "bot") == second

    rolled_back = loraloom(live, "adapters", "promote", "bot", "prod", "1")
    assert rolled_back.returncode == 0 and "bot:prod -> bot@1" in rolled_back.stderr, rolled_back.stderr
    assert greedy_chat(client, "bot:prod") == first  # exactly version 1's output again

    versions = loraloom(live, "adapters", "versions", "bot")
    assert versions.returncode == 0, versions.stderr
    rows = [line.split() for line in versions.stdout.splitlines()[1:]]
    assert [(row[0], row[1]) for row in rows] == [("1", "ready"), ("2", "ready")]
    assert "prod" in rows[0] and "latest" in rows[1]

    with live.http("acme-developer") as http:
        history = http.get("/v1/adapters/bot/aliases/prod/history").json()["data"]
        assert [(h["from_version"], h["to_version"]) for h in history] == [(None, 1), (1, 2), (2, 1)]

        refused = loraloom(live, "adapters", "rm", "bot@1")  # prod points at it
        assert refused.returncode == 1 and "409" in refused.stderr and "prod" in refused.stderr
        assert [v["version"] for v in http.get("/v1/adapters/bot/versions").json()["data"]] == [1, 2]
        assert greedy_chat(client, "bot:prod") == first

        forced = loraloom(live, "adapters", "rm", "bot@1", "--force")
        assert forced.returncode == 0, forced.stderr
        assert [v["version"] for v in http.get("/v1/adapters/bot/versions").json()["data"]] == [2]
        assert http.get("/v1/adapters/bot").json()["aliases"] == {"latest": 2}
    with pytest.raises(openai.NotFoundError, match="bot:prod"):
        greedy_chat(client, "bot:prod")
