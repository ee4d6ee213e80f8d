"""Drives a ferrite server with LangChain's `OpenAI` LLM and `ChatOpenAI`, and LiteLLM's
`text_completion` and `completion(messages=…)`, the way their users call them, and prints
what came back as one JSON object.

    .venv-clients/bin/python e2e/clients/drive.py http://127.0.0.1:8080/v1 MODEL
"""

import json
import os
import sys

# LiteLLM fetches a model price list from the internet at import unless told not to.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import litellm  # noqa: E402
from langchain_openai import ChatOpenAI, OpenAI  # noqa: E402

PROMPT = "The capital of France is"
QUESTION = "What is the capital of France?"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"], "additionalProperties": False}}}


def main(base, model):
    out = {}
    llm = OpenAI(base_url=base, api_key="unused", model=model, temperature=0, max_tokens=8, max_retries=0)
    out["langchain_invoke"] = llm.invoke(PROMPT)
    out["langchain_stream"] = list(llm.stream(PROMPT))
    out["langchain_stop"] = llm.invoke(PROMPT, stop=["\n"])
    out["langchain_batch"] = llm.batch([PROMPT, "1, 2, 3,"])
    result = llm.generate([PROMPT])
    out["langchain_usage"] = result.llm_output.get("token_usage")

    r = litellm.text_completion(model=f"openai/{model}", api_base=base, api_key="unused", prompt=PROMPT,
                                max_tokens=8, temperature=0)
    out["litellm_text"] = r.choices[0].text
    out["litellm_usage"] = {"prompt_tokens": r.usage.prompt_tokens, "completion_tokens": r.usage.completion_tokens,
                            "cached_tokens": r.usage.prompt_tokens_details.cached_tokens}
    chunks = litellm.text_completion(model=f"openai/{model}", api_base=base, api_key="unused", prompt=PROMPT,
                                     max_tokens=8, temperature=0, stream=True)
    out["litellm_stream"] = "".join(c.choices[0].text or "" for c in chunks if c.choices)

    chat = ChatOpenAI(base_url=base, api_key="unused", model=model, temperature=0, max_tokens=12, max_retries=0)
    out["langchain_chat"] = chat.invoke(QUESTION).content
    out["langchain_chat_stream"] = [c.content for c in chat.stream(QUESTION)]
    called = chat.bind_tools([WEATHER], tool_choice="get_weather").invoke("Weather in Paris?")
    out["langchain_tool_calls"] = [{"name": c["name"], "args": c["args"]} for c in called.tool_calls]

    messages = [{"role": "user", "content": QUESTION}]
    r = litellm.completion(model=f"openai/{model}", api_base=base, api_key="unused", messages=messages,
                           max_tokens=12, temperature=0)
    out["litellm_chat"] = r.choices[0].message.content
    chunks = litellm.completion(model=f"openai/{model}", api_base=base, api_key="unused", messages=messages,
                                max_tokens=12, temperature=0, stream=True)
    out["litellm_chat_stream"] = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
