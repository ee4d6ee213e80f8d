"""LangChain's `OpenAI` LLM and `ChatOpenAI`, and LiteLLM's `text_completion` and
`completion(messages=…)`, against the release binary:
people point them at an OpenAI-compatible server and expect the same text the openai SDK
gets. They run in their own virtualenv (`.venv-clients`, made by scripts/test.sh from
e2e/clients/requirements.txt) because LiteLLM needs an older openai than this suite."""

import json
import subprocess

import jsonschema

from conftest import MODEL, ROOT

CLIENTS_PYTHON = ROOT / ".venv-clients" / "bin" / "python"


def test_langchain_and_litellm_get_what_the_openai_sdk_gets(client, server):
    assert CLIENTS_PYTHON.exists(), (
        f"{CLIENTS_PYTHON} is missing: run scripts/test.sh, or make it with "
        "`python3 -m venv .venv-clients && .venv-clients/bin/pip install -r e2e/clients/requirements.txt`"
    )
    p = subprocess.run([str(CLIENTS_PYTHON), str(ROOT / "e2e" / "clients" / "drive.py"), f"{server.base}/v1", MODEL],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    expected = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=8,
                                         temperature=0).choices[0].text
    assert expected.startswith(" Paris")
    assert out["langchain_invoke"] == expected
    assert "".join(out["langchain_stream"]) == expected and len(out["langchain_stream"]) > 1
    assert out["langchain_stop"] == expected.split("\n")[0]
    assert out["langchain_batch"][0] == expected and out["langchain_batch"][1]
    assert out["langchain_usage"]["completion_tokens"] == 8
    assert out["litellm_text"] == expected and out["litellm_stream"] == expected
    assert out["litellm_usage"]["completion_tokens"] == 8 and out["litellm_usage"]["prompt_tokens"] == 5
    assert out["litellm_usage"]["cached_tokens"] >= 0
    chat = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "What is the capital of France?"}],
                                          max_tokens=12, temperature=0).choices[0].message.content
    assert chat
    assert out["langchain_chat"] == chat and "".join(out["langchain_chat_stream"]) == chat
    assert len(out["langchain_chat_stream"]) > 1
    (call,) = out["langchain_tool_calls"]
    assert call["name"] == "get_weather"
    jsonschema.validate(call["args"], {"type": "object", "properties": {"city": {"type": "string"}},
                                       "required": ["city"], "additionalProperties": False})
    assert out["litellm_chat"] == chat and out["litellm_chat_stream"] == chat
