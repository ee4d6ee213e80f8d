"""`POST /v1/chat/completions` through the official openai SDK's `chat.completions`,
against the release binary on SmolLM2 (whose GGUF carries its chat template): greedy
answers equal to llama.cpp's server's for the same messages (fixtures/chat), streaming,
`n`, logprobs, structured output, tools, and the errors a bad conversation gets."""

import json
import time
from pathlib import Path

import httpx
import jsonschema
import openai
import pytest

from conftest import MODEL, Server

FIXTURE = json.loads((Path(__file__).resolve().parents[1] / "fixtures" / "chat" / f"{MODEL}.json").read_text())

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "The local time in a timezone",
    "parameters": {"type": "object", "properties": {"timezone": {"type": "string", "enum": ["UTC", "CET", "JST"]}},
                   "required": ["timezone"], "additionalProperties": False}}}
TOOLS = {"get_weather": WEATHER, "get_time": TIME}

# A conversation in which the assistant has used the tool before: a model this small
# follows the example and calls it again.
TOOL_HISTORY = [
    {"role": "user", "content": "What is the weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
        "name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"},
    {"role": "assistant", "content": "It is 18 C and sunny in Paris."},
    {"role": "user", "content": "What is the weather in Tokyo?"},
]
HELLO = [{"role": "user", "content": "Tell me a short story about a robot."}]


def chat(client, messages=HELLO, **kw):
    return client.chat.completions.create(model=MODEL, messages=messages, **kw)


@pytest.mark.parametrize("case", FIXTURE["answers"], ids=lambda c: json.dumps(c["messages"])[:40])
def test_greedy_answers_equal_llama_cpps(client, case):
    r = chat(client, case["messages"], max_tokens=24, temperature=0)
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-")
    assert r.choices[0].message.role == "assistant"
    # llama.cpp drops a character cut off by max_tokens; ferrite writes U+FFFD for its
    # bytes, as a Hugging Face decode (and vLLM) does.
    assert r.choices[0].message.content.removesuffix("\ufffd") == case["content"]
    assert r.usage.prompt_tokens == case["prompt_tokens"]


def test_an_answer_runs_to_its_end_without_max_tokens(client):
    r = chat(client, [{"role": "user", "content": "Hi"}], temperature=0)
    assert r.choices[0].finish_reason == "stop"
    assert 0 < r.usage.completion_tokens < 200


def test_streamed_deltas_concatenate_to_the_answer(client):
    body = dict(messages=HELLO, max_tokens=40, temperature=0.9, seed=11)
    whole = chat(client, **body)
    chunks = list(chat(client, stream=True, stream_options={"include_usage": True}, **body))
    assert all(c.object == "chat.completion.chunk" and c.id == chunks[0].id for c in chunks)
    first = chunks[0].choices[0].delta
    assert first.role == "assistant" and first.content == ""
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [whole.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    with httpx.stream("POST", f"{client.base_url}chat/completions",
                      json={"model": MODEL, "messages": HELLO, "max_tokens": 3, "stream": True}, timeout=60) as r:
        lines = [line for line in r.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"


def test_n_choices_each_seeded(client):
    r = chat(client, n=3, max_tokens=12, temperature=1.0, seed=5)
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert len({c.message.content for c in r.choices}) > 1
    again = chat(client, n=3, max_tokens=12, temperature=1.0, seed=5)
    assert [c.message.content for c in again.choices] == [c.message.content for c in r.choices]


def test_logprobs_describe_every_generated_token(client):
    r = chat(client, max_tokens=10, temperature=0, logprobs=True, top_logprobs=3)
    c = r.choices[0]
    tokens = c.logprobs.content
    assert len(tokens) == r.usage.completion_tokens
    assert b"".join(bytes(t.bytes) for t in tokens).decode() == c.message.content
    for t in tokens:
        assert t.logprob <= 0 and len(t.top_logprobs) == 3
        # Greedy: the chosen token is the most likely one.
        assert t.top_logprobs[0].token == t.token and t.top_logprobs[0].logprob == pytest.approx(t.logprob)
    streamed = list(chat(client, max_tokens=10, temperature=0, logprobs=True, top_logprobs=3, stream=True))
    streamed_tokens = [t.token for ch in streamed if ch.choices and ch.choices[0].logprobs
                       for t in ch.choices[0].logprobs.content]
    assert streamed_tokens == [t.token for t in tokens]


def test_response_format_json_schema_validates(client):
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                               "age": {"type": "integer", "minimum": 0, "maximum": 120}},
              "required": ["name", "age"], "additionalProperties": False}
    for seed in range(5):
        r = chat(client, [{"role": "user", "content": "Describe a person as JSON."}], seed=seed, max_tokens=60,
                 response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": schema}})
        jsonschema.validate(json.loads(r.choices[0].message.content), schema)


def test_tool_choice_required_gives_valid_calls(client):
    for seed in range(4):
        r = chat(client, [{"role": "user", "content": "What's the weather in Paris?"}], seed=seed, max_tokens=120,
                 tools=[WEATHER, TIME], tool_choice="required")
        c = r.choices[0]
        assert c.finish_reason == "tool_calls" and c.message.content is None
        assert c.message.tool_calls
        for call in c.message.tool_calls:
            assert call.type == "function" and call.id.startswith("call_")
            jsonschema.validate(json.loads(call.function.arguments), TOOLS[call.function.name]["function"]["parameters"])
    one = chat(client, [{"role": "user", "content": "Time in Tokyo?"}], seed=1, max_tokens=120,
               tools=[WEATHER, TIME], tool_choice="required", parallel_tool_calls=False)
    assert len(one.choices[0].message.tool_calls) == 1


def test_named_tool_choice_calls_that_tool(client):
    for stream in (False, True):
        body = dict(messages=[{"role": "user", "content": "Weather?"}], seed=3, max_tokens=60, tools=[WEATHER, TIME],
                    tool_choice={"type": "function", "function": {"name": "get_time"}})
        if stream:
            chunks = list(chat(client, stream=True, **body))
            calls = [tc for ch in chunks if ch.choices and ch.choices[0].delta.tool_calls
                     for tc in ch.choices[0].delta.tool_calls]
            name, arguments = calls[0].function.name, "".join(tc.function.arguments for tc in calls)
            finish = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
        else:
            c = chat(client, **body).choices[0]
            name, arguments, finish = c.message.tool_calls[0].function.name, c.message.tool_calls[0].function.arguments, [c.finish_reason]
        # A forced function ends with `stop`, as OpenAI answers it.
        assert name == "get_time" and finish == ["stop"]
        jsonschema.validate(json.loads(arguments), TIME["function"]["parameters"])


def test_pydantic_style_schemas_with_refs_and_formats_work(client):
    # $defs at the parameters' root with #/$defs refs, and a `format` llguidance does not
    # implement, as Pydantic and the OpenAI Agents SDK write them.
    booking = {"type": "function", "function": {"name": "book", "parameters": {
        "$defs": {"Guest": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                                            "age": {"type": "integer", "format": "int32"}},
                            "required": ["name", "age"], "additionalProperties": False}},
        "type": "object", "properties": {"guest": {"$ref": "#/$defs/Guest"}, "nights": {"type": "integer", "minimum": 1, "maximum": 9}},
        "required": ["guest", "nights"], "additionalProperties": False}}}
    r = chat(client, [{"role": "user", "content": "Book a room for Ann, 30, two nights."}], seed=1, max_tokens=80,
             tools=[booking, WEATHER], tool_choice="required")
    calls = r.choices[0].message.tool_calls
    assert calls and r.choices[0].finish_reason == "tool_calls", r.choices[0]
    for call in calls:
        jsonschema.validate(json.loads(call.function.arguments), TOOLS.get(call.function.name, booking)["function"]["parameters"])
    # With `auto`, the tools' $defs compile into the lazy call grammar beside the other
    # tool: the model follows the conversation's example and calls the weather tool.
    r = chat(client, TOOL_HISTORY, max_tokens=40, temperature=0, tools=[booking, WEATHER])
    assert r.choices[0].finish_reason == "tool_calls", r.choices[0]
    (call,) = r.choices[0].message.tool_calls
    assert (call.function.name, json.loads(call.function.arguments)) == ("get_weather", {"city": "Tokyo"})


def test_without_max_tokens_the_default_fits_the_limits():
    # Twenty alternatives for four choices of --chat-max-tokens (4096) tokens would pass
    # this server's logprob limit; a client that asked for no length is not refused: its
    # default is lowered to its share, 20,000 / (4 choices × 21) = 238 tokens a choice.
    # (On the default limit the four choices could run to 4096 tokens each: minutes on a
    # slow machine.)
    server = Server(MODEL, ["--max-logprob-entries", "20000"])
    try:
        client = openai.OpenAI(base_url=f"{server.base}/v1", api_key="unused", max_retries=0, timeout=120)
        ask = dict(n=4, seed=1, logprobs=True, top_logprobs=20, extra_body={"ignore_eos": True})
        r = chat(client, [{"role": "user", "content": "Hi"}], **ask)
        assert [c.finish_reason for c in r.choices] == ["length"] * 4
        assert [len(c.logprobs.content) for c in r.choices] == [238] * 4
        assert r.usage.completion_tokens == 4 * 238
        # Asked for outright, the same length is refused by that limit.
        with pytest.raises(openai.BadRequestError) as e:
            chat(client, [{"role": "user", "content": "Hi"}], max_tokens=4096, **ask)
        assert e.value.body["param"] == "logprobs", e.value.body
    finally:
        server.stop()


def test_a_client_that_leaves_a_chat_stream_frees_its_sequence(server):
    before = server.metrics().get('ferrite_requests_total{status="disconnected"}', 0)
    with httpx.stream("POST", f"{server.base}/v1/chat/completions", timeout=30,
                      json={"model": MODEL, "messages": HELLO, "max_tokens": 3000, "ignore_eos": True, "stream": True}) as r:
        next(r.iter_lines())
    deadline = time.time() + 5
    while time.time() < deadline and server.metrics().get("ferrite_requests_running", 1) != 0:
        time.sleep(0.05)
    assert server.metrics()["ferrite_requests_running"] == 0
    assert server.metrics()['ferrite_requests_total{status="disconnected"}'] == before + 1


def test_auto_parses_the_call_the_model_writes(client):
    r = chat(client, TOOL_HISTORY, max_tokens=60, temperature=0, tools=[WEATHER])
    c = r.choices[0]
    assert c.finish_reason == "tool_calls" and c.message.content is None
    (call,) = c.message.tool_calls
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Tokyo"}
    chunks = list(chat(client, TOOL_HISTORY, max_tokens=60, temperature=0, tools=[WEATHER], stream=True))
    deltas = [ch.choices[0].delta for ch in chunks if ch.choices]
    assert "".join(d.content or "" for d in deltas) == ""
    (streamed,) = [tc for d in deltas if d.tool_calls for tc in d.tool_calls]
    assert (streamed.function.name, streamed.function.arguments) == ("get_weather", call.function.arguments)


def test_auto_without_a_call_is_plain_content(client):
    plain = chat(client, max_tokens=20, temperature=0).choices[0]
    auto = chat(client, max_tokens=20, temperature=0, tools=[WEATHER], tool_choice="none").choices[0]
    assert auto.message.content == plain.message.content and not auto.message.tool_calls
    r = chat(client, [{"role": "user", "content": "Say hello."}], max_tokens=20, temperature=0, tools=[WEATHER]).choices[0]
    assert r.message.content and not r.message.tool_calls and r.finish_reason in ("stop", "length")


def test_tokenize_gives_the_chat_prompt(client, server):
    r = chat(client, TOOL_HISTORY, max_tokens=1, tools=[WEATHER])
    t = httpx.post(f"{server.base}/tokenize", json={"messages": TOOL_HISTORY, "tools": [WEATHER]}, timeout=30).json()
    assert t["count"] == r.usage.prompt_tokens


@pytest.mark.parametrize("messages,param", [
    ([{"role": "wizard", "content": "hi"}], "messages[0].role"),
    ([{"content": "hi"}], "messages[0].role"),
    (["hi"], "messages[0]"),
    ([{"role": "user"}], "messages[0].content"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}}]}],
     "messages[0].content[0]"),
    ([{"role": "tool", "content": "42"}], "messages[0].tool_call_id"),
    ([], "messages"),
])
def test_a_bad_message_is_a_400_naming_the_field(client, messages, param):
    with pytest.raises(openai.BadRequestError) as e:
        chat(client, messages, max_tokens=2)
    assert e.value.body["param"] == param, e.value.body


def test_openai_fields_with_nothing_to_do_are_accepted(client):
    r = chat(client, max_tokens=3, store=False, service_tier="auto")
    assert r.choices[0].message.content
    with pytest.raises(openai.BadRequestError) as e:
        chat(client, max_tokens=3, reasoning_effort="low")
    assert e.value.body["param"] == "reasoning_effort"


@pytest.mark.parametrize("extra,param", [
    ({"logprobs": 3}, "logprobs"),
    ({"temperature": 7}, "temperature"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"echo": True}, "echo"),
    ({"prompt": "x"}, "prompt"),
])
def test_completion_rules_hold_for_chat(client, extra, param):
    with pytest.raises(openai.BadRequestError) as e:
        chat(client, max_tokens=2, extra_body=extra) if param in ("echo", "prompt", "logprobs") else chat(client, max_tokens=2, **extra)
    assert e.value.body["param"] == param, e.value.body


def test_a_template_error_is_a_400_with_its_message(tmp_path):
    template = tmp_path / "strict.jinja"
    template.write_text("{% for m in messages %}{% if m.role == 'system' %}{{ raise_exception('no system messages, please') }}"
                        "{% endif %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}<|im_start|>assistant\n")
    server = Server(MODEL, ["--chat-template", str(template)])
    try:
        client = openai.OpenAI(base_url=f"{server.base}/v1", api_key="unused", max_retries=0)
        with pytest.raises(openai.BadRequestError) as e:
            chat(client, [{"role": "system", "content": "x"}, {"role": "user", "content": "hi"}], max_tokens=2)
        assert "no system messages, please" in e.value.body["message"]
        # The operator's template is the one used: no default system message.
        r = chat(client, [{"role": "user", "content": "hi"}], max_tokens=2)
        # (Jinja drops the template's final newline, as transformers renders it.)
        t = httpx.post(f"{server.base}/tokenize", json={"prompt": "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant"}).json()
        assert r.usage.prompt_tokens == t["count"]
    finally:
        server.stop()


def test_a_conversation_longer_than_the_context_names_the_messages(client):
    with pytest.raises(openai.BadRequestError) as e:
        chat(client, [{"role": "user", "content": "word " * 9000}], max_tokens=2)
    assert e.value.body["param"] == "messages" and e.value.body["code"] == "context_length_exceeded"
    assert "rendered conversation" in e.value.body["message"]


def test_a_client_that_leaves_during_a_long_prefill_is_noticed_at_once(server):
    # Nothing is sent while a long prompt is prefilled; the stream's task still notices
    # that its client left (and frees the sequence) instead of at the first token.
    def running():
        return server.metrics().get("ferrite_requests_running", 0)
    with httpx.stream("POST", f"{server.base}/v1/chat/completions", timeout=60,
                      json={"model": MODEL, "messages": [{"role": "user", "content": "word " * 7000}],
                            "max_tokens": 50, "stream": True}) as r:
        assert r.status_code == 200
        deadline = time.time() + 5
        while running() == 0 and time.time() < deadline:
            time.sleep(0.05)
        assert running() == 1
    left = time.time()
    while running() != 0 and time.time() - left < 20:
        time.sleep(0.05)
    # The prefill alone takes tens of seconds; the engine
    # notices between its chunks, each up to 512 tokens, which at this context can take a
    # few seconds on a slow machine.
    assert running() == 0 and time.time() - left < 10


def test_top_logprobs_keep_only_their_alternatives():
    # Each token's alternatives once kept the whole vocabulary's allocation (384 KiB at
    # SmolLM2's 49,152 tokens): 16 × 300 tokens grew the server by ~1.9 GB, so the
    # 16 × 120 here would grow it by ~720 MiB.
    server = Server(MODEL)
    try:
        def peak_mib():
            status = Path(f"/proc/{server.proc.pid}/status").read_text()
            return int(next(l for l in status.splitlines() if l.startswith("VmHWM")).split()[1]) // 1024
        before = peak_mib()
        r = httpx.post(f"{server.base}/v1/chat/completions", timeout=300, json={
            "model": MODEL, "messages": HELLO, "n": 16, "max_tokens": 120, "ignore_eos": True,
            "logprobs": True, "top_logprobs": 1})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 16 * 120
        assert peak_mib() - before < 400, f"{before} → {peak_mib()} MiB"
    finally:
        server.stop()
