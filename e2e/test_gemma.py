"""Gemma 3 270M through the release binary: llama.cpp's greedy tokens and logprobs, the same
answer whatever else runs beside it, a constraint. Gemma is the Q4_K, SentencePiece,
BOS-adding, sliding-window model: what is true of SmolLM2 has to be shown again here."""

import json
import re
import threading
from pathlib import Path

import httpx
import pytest

from conftest import Server

GEMMA = "gemma3-270m"
FIXTURE = json.loads((Path(__file__).resolve().parents[1] / "fixtures" / "gemma3-270m-q4_k_m.llamacpp.json").read_text())


@pytest.fixture(scope="module")
def gemma():
    s = Server(GEMMA)
    yield s
    s.stop()


def complete(server, **body):
    r = httpx.post(f"{server.base}/v1/completions", json={"model": GEMMA, **body}, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


@pytest.mark.parametrize("case", FIXTURE["greedy_16"], ids=lambda c: c["prompt"][:20])
def test_greedy_tokens_and_logprobs_match_llama_cpp(gemma, case):
    r = complete(gemma, prompt=case["prompt"], max_tokens=16, temperature=0, logprobs=1, return_token_ids=True)
    choice = r["choices"][0]
    assert choice["prompt_token_ids"] == case["prompt_ids_with_special"]
    assert choice["token_ids"] == [s["id"] for s in case["steps"]]
    assert choice["text"] == case["greedy_text"]
    for got, step in zip(choice["logprobs"]["token_logprobs"], case["steps"]):
        assert abs(got - step["logprob"]) < 1e-3, (got, step["logprob"])


def test_answers_do_not_depend_on_what_runs_beside_them(gemma):
    # Eight different prompts at once, greedy and seeded: each answer is the one it gets alone.
    prompts = [f"Story {i}: once upon a time in a land of {w}" for i, w in enumerate(
        ["ice", "fire", "sand", "rain", "glass", "wind", "stone", "salt"])]
    bodies = [dict(prompt=p, max_tokens=24, temperature=0 if i % 2 else 0.8, seed=i, logprobs=0)
              for i, p in enumerate(prompts)]
    alone = [complete(gemma, **b)["choices"][0] for b in bodies]
    together = [None] * len(bodies)

    def run(i):
        together[i] = complete(gemma, **bodies[i])["choices"][0]

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(bodies))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for a, b in zip(alone, together):
        assert a["text"] == b["text"]
        assert a["logprobs"]["token_logprobs"] == b["logprobs"]["token_logprobs"]


def test_a_regex_constraint_and_json_schema(gemma):
    for seed in range(3):
        text = complete(gemma, prompt="Today's date is", max_tokens=20, seed=seed, temperature=1.0,
                        guided_regex=r"20[0-9]{2}-(0[1-9]|1[0-2])-[0-2][0-9]")["choices"][0]["text"]
        assert re.fullmatch(r"20[0-9]{2}-(0[1-9]|1[0-2])-[0-2][0-9]", text), text
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                               "rainy": {"type": "boolean"}},
              "required": ["city", "rainy"], "additionalProperties": False}
    choice = complete(gemma, prompt="Weather as JSON:", max_tokens=60, seed=1, guided_json=schema)["choices"][0]
    assert choice["finish_reason"] == "stop"
    data = json.loads(choice["text"])
    assert set(data) == {"city", "rainy"} and isinstance(data["rainy"], bool)


def test_streamed_logprobs_and_echo(gemma):
    body = dict(prompt="The capital of France is", max_tokens=6, temperature=0, logprobs=2, echo=True)
    whole = complete(gemma, **body)["choices"][0]
    with httpx.stream("POST", f"{gemma.base}/v1/completions", json={"model": GEMMA, "stream": True, **body},
                      timeout=60) as r:
        chunks = [json.loads(l[6:]) for l in r.iter_lines() if l.startswith("data: {")]
    text = "".join(c["choices"][0]["text"] for c in chunks)
    tokens = [t for c in chunks if c["choices"][0]["logprobs"] for t in c["choices"][0]["logprobs"]["tokens"]]
    assert text == whole["text"] and tokens == whole["logprobs"]["tokens"]


CHAT = json.loads((Path(__file__).resolve().parents[1] / "fixtures" / "chat" / f"{GEMMA}.json").read_text())


@pytest.mark.parametrize("case", CHAT["answers"], ids=lambda c: json.dumps(c["messages"])[:40])
def test_chat_answers_equal_llama_cpps_up_to_the_end_of_turn(gemma, case):
    # The file has no chat template: both servers render ChatML. `<|im_end|>` is no token
    # of Gemma's vocabulary, so llama.cpp writes it out and goes on; ferrite stops there.
    r = httpx.post(f"{gemma.base}/v1/chat/completions", timeout=120,
                   json={"model": GEMMA, "messages": case["messages"], "max_tokens": 24, "temperature": 0})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["usage"]["prompt_tokens"] == case["prompt_tokens"]
    content = body["choices"][0]["message"]["content"].removesuffix("\ufffd")
    expected, cut, _ = case["content"].partition("<|im_end|>")
    assert content == expected
    if cut:
        assert body["choices"][0]["stop_reason"] == "<|im_end|>"
