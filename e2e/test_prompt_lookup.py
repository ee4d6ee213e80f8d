"""Speculative decoding by prompt lookup (`--prompt-lookup`): through the openai SDK, a
server with it answers exactly what the default server answers (text, logprobs and their
alternatives, finish reasons; greedy, seeded, streamed, chat, stop strings, n, a JSON
schema), in fewer forward steps where the output repeats the prompt."""

import json
import subprocess

import openai
import pytest

from conftest import BINARY, MODEL, Server, free_port, wait_for

QUOTE = ("Copy the sentence.\nSentence: The committee approved the new budget for the "
         "library, the park and the two schools on Tuesday evening.\nCopy: The committee")


@pytest.fixture(scope="module")
def lookup():
    s = Server(MODEL, ["--prompt-lookup", "8"])
    yield s
    s.stop()


def sdk(server):
    return openai.OpenAI(base_url=f"{server.base}/v1", api_key="unused", max_retries=0, timeout=120)


def answer(server, **body):
    """The request's answer with what varies between runs (ids, times, and how much of
    the prompt each server's prefix cache happened to hold) left out."""
    r = sdk(server).completions.create(model=MODEL, **body).model_dump()
    usage = {k: r["usage"][k] for k in ("prompt_tokens", "completion_tokens")}
    return [(c["text"], c["finish_reason"], c["logprobs"]) for c in r["choices"]], usage


CASES = {
    "greedy": dict(prompt=QUOTE, max_tokens=48, temperature=0, logprobs=2),
    "counting": dict(prompt="1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 1, 2, 3,", max_tokens=40,
                     temperature=0, logprobs=1),
    "seeded n=2": dict(prompt=QUOTE, max_tokens=32, temperature=0.8, seed=11, n=2, logprobs=1),
    "stop inside a repeated run": dict(prompt=QUOTE, max_tokens=48, temperature=0,
                                       stop=["two schools"]),
    "json schema": dict(prompt="A list of three colours as JSON: ", max_tokens=120, temperature=0,
                        extra_body={"response_format": {"type": "json_schema", "json_schema": {
                            "name": "c", "schema": {"type": "object", "properties": {
                                "colours": {"type": "array", "maxItems": 3,
                                            "items": {"type": "string", "maxLength": 12}}},
                                "required": ["colours"], "additionalProperties": False}}}}),
}


@pytest.mark.parametrize("case", CASES)
def test_the_answer_is_the_one_without_lookup(server, lookup, case):
    want = answer(server, **CASES[case])
    got = answer(lookup, **CASES[case])
    assert got == want
    if case == "stop inside a repeated run":
        assert got[0][0][1] == "stop"
    if case == "json schema":
        json.loads(got[0][0][0])


def test_streamed_deltas_are_the_ones_without_lookup(server, lookup):
    def deltas(s):
        stream = sdk(s).completions.create(model=MODEL, prompt=QUOTE, max_tokens=40,
                                           temperature=0, stream=True)
        return [c.choices[0].text for c in stream if c.choices]
    want = deltas(server)
    assert deltas(lookup) == want
    assert "".join(want).strip()


def test_chat_is_the_one_without_lookup(server, lookup):
    def chat(s):
        r = sdk(s).chat.completions.create(
            model=MODEL, max_tokens=40, temperature=0, logprobs=True, top_logprobs=1,
            messages=[{"role": "user", "content": "Repeat exactly: the red fox and the red fox "
                                                  "and the red fox and the red fox."}])
        return r.choices[0].message.content, r.choices[0].logprobs.model_dump()
    assert chat(lookup) == chat(server)


def test_repeated_text_takes_fewer_steps(lookup):
    before = lookup.metrics()
    body = dict(CASES["greedy"], extra_body={"ignore_eos": True})
    answer(lookup, **body)
    # The last token is sent during its step, before the step is counted.
    wait_for(lambda: lookup.metrics()["ferrite_requests_running"] == 0)
    after = lookup.metrics()

    def grew(name):
        return after[name] - before[name]

    steps = grew("ferrite_forward_steps_total")
    accepted = grew("ferrite_draft_tokens_accepted_total")
    fed = grew("ferrite_draft_tokens_fed_total")
    # 48 tokens: the first from the prompt's step, each other one from a step of its own
    # or accepted as a draft.
    assert steps == 1 + (48 - 1 - accepted), (steps, accepted, fed)
    assert 0 < accepted <= fed
    assert steps <= 1 + 48 * 2 / 3, (steps, accepted, fed)


@pytest.mark.parametrize("args, message", [
    (["--prompt-lookup", "9"], "--prompt-lookup: prompt lookup drafts 1 to 8 tokens"),
    (["--prompt-lookup", "4", "--prompt-lookup-min", "5"], "1 <= min <= max <= 16"),
    (["--prompt-lookup", "4", "--prompt-lookup-max", "17"], "1 <= min <= max <= 16"),
])
def test_a_bad_configuration_stops_the_server_before_it_loads(args, message):
    p = subprocess.run([str(BINARY), "serve", "--port", str(free_port()), *args],
                       capture_output=True, text=True, timeout=30)
    assert p.returncode != 0
    assert message in p.stderr, p.stderr
