"""End-to-end tests of /v1/completions with the official openai SDK against the release
binary serving SmolLM2-135M."""

import json
import threading
from pathlib import Path

import httpx
import openai
import pytest

from conftest import MODEL

FIXTURE = json.loads(
    (Path(__file__).resolve().parents[1] / "fixtures" / "smollm2-135m-q4_1.llamacpp.json").read_text()
)
CAPITAL = FIXTURE["greedy_16"][0]  # "The capital of France is" -> " Paris.\n\n..."


def greedy(client, prompt, max_tokens=8, **kw):
    return client.completions.create(model=MODEL, prompt=prompt, max_tokens=max_tokens, temperature=0, **kw)


def error_of(exc):
    body = exc.body if isinstance(exc.body, dict) else {}
    return body.get("error", body)


def test_non_streaming_greedy_matches_llama_cpp(client):
    r = greedy(client, CAPITAL["prompt"], max_tokens=16, extra_body={"return_token_ids": True})
    assert r.object == "text_completion"
    assert r.id.startswith("cmpl-")
    assert r.model == MODEL
    [choice] = r.choices
    assert choice.index == 0
    # llama.cpp's whole greedy continuation, token for token.
    assert choice.model_extra["prompt_token_ids"] == CAPITAL["prompt_ids_with_special"]
    assert choice.model_extra["token_ids"] == [step["id"] for step in CAPITAL["steps"]]
    assert choice.text == CAPITAL["greedy_text"], choice.text
    assert choice.finish_reason == "length"
    assert r.usage.prompt_tokens == len(CAPITAL["prompt_ids_with_special"])
    assert r.usage.completion_tokens == 16
    assert r.usage.total_tokens == r.usage.prompt_tokens + 16


def test_streaming_gives_the_same_text_and_ends_with_finish_reason(client):
    whole = greedy(client, "Once upon a time, there was a", max_tokens=12).choices[0].text
    chunks = list(
        client.completions.create(
            model=MODEL, prompt="Once upon a time, there was a", max_tokens=12, temperature=0, stream=True
        )
    )
    assert len(chunks) >= 2
    assert all(c.object == "text_completion" and c.id == chunks[0].id for c in chunks)
    assert "".join(c.choices[0].text for c in chunks) == whole
    assert chunks[-1].choices[0].finish_reason == "length"
    assert all(c.choices[0].finish_reason is None for c in chunks[:-1])


def test_n_with_seed_gives_indexed_reproducible_choices(client):
    args = dict(model=MODEL, prompt="My favourite animal is", max_tokens=10, temperature=1.0, n=3, seed=1234)
    first = client.completions.create(**args)
    second = client.completions.create(**args)
    assert [c.index for c in first.choices] == [0, 1, 2]
    texts = [c.text for c in first.choices]
    assert texts == [c.text for c in second.choices], "same seed, same choices"
    assert len(set(texts)) > 1, "choices of one request are sampled independently"
    single = client.completions.create(**{**args, "n": 1})
    assert single.choices[0].text == texts[0], "choice 0 does not depend on n"
    assert first.usage.prompt_tokens == single.usage.prompt_tokens, "the prompt is counted once"
    assert 3 <= first.usage.completion_tokens <= 30
    other = client.completions.create(**{**args, "seed": 4321})
    assert [c.text for c in other.choices] != texts, "another seed, other choices"


def test_prompt_list_and_token_ids(client):
    prompts = ["The capital of France is", "def add(a, b):\n"]
    r = greedy(client, prompts, max_tokens=6)
    assert [c.index for c in r.choices] == [0, 1]
    singles = [greedy(client, p, max_tokens=6).choices[0].text for p in prompts]
    assert [c.text for c in r.choices] == singles
    assert r.usage.prompt_tokens == 5 + 8
    by_ids = greedy(client, CAPITAL["prompt_ids_with_special"], max_tokens=6)
    assert by_ids.choices[0].text == singles[0]
    two_id_prompts = greedy(client, [CAPITAL["prompt_ids_with_special"], [33, 28, 216]], max_tokens=3)
    assert [c.index for c in two_id_prompts.choices] == [0, 1]
    assert two_id_prompts.choices[0].text == singles[0][: len(two_id_prompts.choices[0].text)]


def test_stop_string_spanning_tokens(client):
    # " Paris" and "." are two tokens; "is." spans them.
    r = greedy(client, CAPITAL["prompt"], max_tokens=8, stop=["is."])
    choice = r.choices[0]
    assert choice.text == " Par"
    assert choice.finish_reason == "stop"
    assert choice.model_extra.get("stop_reason") == "is."
    streamed = list(
        client.completions.create(
            model=MODEL, prompt=CAPITAL["prompt"], max_tokens=8, temperature=0, stop=["is."], stream=True
        )
    )
    assert "".join(c.choices[0].text for c in streamed if c.choices) == " Par"
    assert streamed[-1].choices[0].finish_reason == "stop"


def test_include_usage_sends_a_last_usage_chunk(client):
    chunks = list(
        client.completions.create(
            model=MODEL,
            prompt=CAPITAL["prompt"],
            max_tokens=5,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    last = chunks[-1]
    assert last.choices == []
    assert last.usage.prompt_tokens == 5
    assert last.usage.completion_tokens == 5
    assert last.usage.total_tokens == 10
    assert all(c.usage is None for c in chunks[:-1])


def test_out_of_range_temperature_is_a_400_naming_it(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=MODEL, prompt="x", temperature=5)
    err = error_of(e.value)
    assert err["param"] == "temperature"
    assert err["type"] == "invalid_request_error"


def test_unknown_field_and_unknown_model(client, server):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=MODEL, prompt="x", extra_body={"frobnicate": 1})
    assert error_of(e.value)["param"] == "frobnicate"
    with pytest.raises(openai.NotFoundError) as e:
        client.completions.create(model="no-such-model", prompt="x")
    assert error_of(e.value)["code"] == "model_not_found"
    r = httpx.post(f"{server.base}/v1/completions", content=b"{not json", timeout=10,
                   headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"


def test_models_route(client):
    models = client.models.list()
    ids = [m.id for m in models.data]
    assert ids == [MODEL]
    assert models.data[0].model_extra["max_model_len"] == 8192


def test_openapi_document_describes_the_real_answers(client, server):
    import jsonschema

    doc = httpx.get(f"{server.base}/openapi.json", timeout=10).json()
    assert doc["openapi"].startswith("3.1")
    schemas = doc["components"]["schemas"]
    assert {"model", "prompt", "max_tokens", "guided_json", "stream_options"} <= set(schemas["CompletionRequest"]["properties"])
    body = {"model": MODEL, "prompt": "Hello", "max_tokens": 3, "logprobs": 1}
    jsonschema.validate(body, schemas["CompletionRequest"])
    answer = httpx.post(f"{server.base}/v1/completions", json=body, timeout=60).json()
    jsonschema.validate(answer, schemas["Completion"])
    error = httpx.post(f"{server.base}/v1/completions", json={**body, "n": 0}, timeout=60).json()
    jsonschema.validate(error, schemas["Error"])
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**body, "no_such_field": 1}, schemas["CompletionRequest"])
    # The answer schemas require what every answer has: an object missing it fails.
    for schema, incomplete in [("Completion", {k: v for k, v in answer.items() if k != "choices"}),
                               ("Completion", {**answer, "choices": [{"index": 0}]}),
                               ("Completion", {**answer, "usage": {"prompt_tokens": 1}}),
                               ("Error", {"error": {"message": "x"}}), ("Error", {})]:
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(incomplete, schemas[schema])
    chunks = httpx.post(f"{server.base}/v1/completions", json={**body, "stream": True}, timeout=60).text
    for line in chunks.splitlines():
        if line.startswith("data: {"):
            jsonschema.validate(json.loads(line[6:]), schemas["CompletionChunk"])


def test_eight_concurrent_streams_all_finish(client):
    prompts = [f"Story number {i}: once upon a time" for i in range(8)]
    results = [None] * 8

    def run(i):
        chunks = list(
            client.completions.create(model=MODEL, prompt=prompts[i], max_tokens=24, temperature=0, stream=True)
        )
        results[i] = chunks

    threads = [threading.Thread(target=run, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    for i, chunks in enumerate(results):
        assert chunks, f"stream {i} produced nothing"
        assert chunks[-1].choices[0].finish_reason in ("length", "stop")
        alone = greedy(client, prompts[i], max_tokens=24).choices[0].text
        assert "".join(c.choices[0].text for c in chunks) == alone, f"stream {i} differs when batched"


def test_disconnected_stream_leaves_the_engine(client, server):
    import time

    before = server.metrics()
    stream = client.completions.create(
        model=MODEL, prompt="1, 2, 3, 4, 5,", max_tokens=4000, temperature=0, stream=True
    )
    for _ in range(3):
        next(iter(stream))
    assert server.metrics()["ferrite_requests_running"] == 1
    stream.close()
    # Freed within one engine step; a second is generous.
    deadline = time.time() + 1
    while time.time() < deadline:
        m = server.metrics()
        if m["ferrite_requests_running"] == 0:
            break
        time.sleep(0.05)
    assert m["ferrite_requests_running"] == 0
    assert m["ferrite_requests_cancelled_total"] == before["ferrite_requests_cancelled_total"] + 1
    generated = m["ferrite_generation_tokens_total"]
    time.sleep(0.5)
    assert server.metrics()["ferrite_generation_tokens_total"] == generated, "no compute after disconnect"
    assert generated - before["ferrite_generation_tokens_total"] < 4000


def test_seeded_request_is_the_same_alone_and_under_load(client):
    args = dict(model=MODEL, prompt="The weather today is", max_tokens=24, temperature=0.9, seed=77)
    alone = client.completions.create(**args).choices[0].text
    others = [None] * 7
    seeded = [None]

    def other(i):
        others[i] = client.completions.create(
            model=MODEL, prompt=f"Item {i}: the best way to", max_tokens=40, temperature=1.0, seed=i
        )

    def mine():
        seeded[0] = client.completions.create(**args).choices[0].text

    threads = [threading.Thread(target=other, args=(i,)) for i in range(7)] + [threading.Thread(target=mine)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert all(o is not None for o in others)
    assert seeded[0] == alone


def test_ignore_eos_generates_past_end_of_sequence(client):
    # Greedy SmolLM2 ends this chat turn with <|im_end|> well before 40 tokens.
    prompt = "<|im_start|>user\nSay hi.<|im_end|>\n<|im_start|>assistant\n"
    short = greedy(client, prompt, max_tokens=40)
    assert short.choices[0].finish_reason == "stop"
    assert short.usage.completion_tokens < 40
    long = greedy(client, prompt, max_tokens=40, extra_body={"ignore_eos": True})
    assert long.choices[0].finish_reason == "length"
    assert long.usage.completion_tokens == 40
