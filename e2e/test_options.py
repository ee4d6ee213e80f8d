"""Server options and request fields the rest of the suite leaves untested (issue 16):
`--ignore-unknown-fields`, `--served-model-name`, `best_of` with a constraint, every
`grammar` type end to end, the `stop_sequences` alias."""

import json
import re

import httpx
import openai
import pytest

from conftest import MODEL, Server

CAPITAL = "The capital of France is"


def post(server, **body):
    return httpx.post(f"{server.base}/v1/completions", json={"model": MODEL, **body}, timeout=120)


def test_ignore_unknown_fields_drops_them_instead_of_a_400(server):
    strict = post(server, prompt=CAPITAL, max_tokens=3, temperature=0, no_such_field=1)
    assert strict.status_code == 400 and strict.json()["error"]["param"] == "no_such_field"
    lenient = Server(MODEL, ["--ignore-unknown-fields"])
    try:
        r = post(lenient, prompt=CAPITAL, max_tokens=3, temperature=0, no_such_field=1, another={"x": 2})
        assert r.status_code == 200, r.text
        plain = post(lenient, prompt=CAPITAL, max_tokens=3, temperature=0).json()
        assert r.json()["choices"][0]["text"] == plain["choices"][0]["text"]
        # Known fields are still checked.
        bad = post(lenient, prompt=CAPITAL, temperature=5, no_such_field=1)
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "temperature"
    finally:
        lenient.stop()


def test_served_model_names_are_the_names_requests_use():
    s = Server(MODEL, ["--served-model-name", "tiny", "--served-model-name", "acme/tiny-chat"],
               env={"FERRITE_SERVED_MODEL_NAME": "ignored-when-the-option-is-given"})
    try:
        client = openai.OpenAI(base_url=f"{s.base}/v1", api_key="x", max_retries=0)
        assert [m.id for m in client.models.list().data] == ["tiny", "acme/tiny-chat"]
        for name in ["tiny", "acme/tiny-chat", "default", "accounts/x/models/tiny"]:
            r = client.completions.create(model=name, prompt=CAPITAL, max_tokens=1)
            assert r.model == "tiny", name
        with pytest.raises(openai.NotFoundError) as e:
            client.completions.create(model=MODEL, prompt=CAPITAL, max_tokens=1)
        assert e.value.body["code"] == "model_not_found"
        assert client.models.retrieve("acme/tiny-chat").id == "acme/tiny-chat"
    finally:
        s.stop()
    s = Server(MODEL, env={"FERRITE_SERVED_MODEL_NAME": "one,two"})
    try:
        ids = [m["id"] for m in httpx.get(f"{s.base}/v1/models", timeout=10).json()["data"]]
        assert ids == ["one", "two"]
    finally:
        s.stop()


def test_best_of_with_a_constraint_ranks_constrained_choices(server):
    options = ["Paris", "Lyon", "Marseille", "Nice"]
    r = post(server, prompt=CAPITAL, max_tokens=8, temperature=1.0, seed=3, n=2, best_of=4,
             guided_choice=options, logprobs=0).json()
    assert len(r["choices"]) == 2
    for c in r["choices"]:
        assert c["text"] in options
    # The two returned are the best two of the four by mean token logprob.
    everyone = post(server, prompt=CAPITAL, max_tokens=8, temperature=1.0, seed=3, n=4, best_of=4,
                    guided_choice=options, logprobs=0).json()["choices"]
    mean = lambda c: sum(c["logprobs"]["token_logprobs"]) / len(c["logprobs"]["token_logprobs"])
    ranked = sorted(everyone, key=mean, reverse=True)
    assert [c["text"] for c in r["choices"]] == [c["text"] for c in ranked[:2]]


@pytest.mark.parametrize("grammar, check", [
    ({"type": "regex", "value": r"[0-9]{3}-[0-9]{4}"}, lambda t: re.fullmatch(r"[0-9]{3}-[0-9]{4}", t)),
    ({"type": "lark", "value": 'start: "yes" | "no"'}, lambda t: t in ("yes", "no")),
    ({"type": "llguidance", "value": 'start: "up" | "down"'}, lambda t: t in ("up", "down")),
    ({"type": "llguidance", "value": {"grammars": [{"lark_grammar": 'start: "left" | "right"'}]}},
     lambda t: t in ("left", "right")),
    ({"type": "json_schema", "value": {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 999}},
                                       "required": ["n"], "additionalProperties": False}},
     lambda t: isinstance(json.loads(t)["n"], int)),
])
def test_every_grammar_type(server, grammar, check):
    for seed in range(3):
        r = post(server, prompt="Answer:", max_tokens=30, temperature=1.0, seed=seed, grammar=grammar)
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        assert choice["finish_reason"] == "stop" and check(choice["text"]), choice


def test_stop_sequences_is_an_alias_of_stop(server):
    plain = post(server, prompt=CAPITAL, max_tokens=8, temperature=0).json()["choices"][0]["text"]
    assert plain.startswith(" Paris.")
    by_alias = post(server, prompt=CAPITAL, max_tokens=8, temperature=0, stop_sequences=["."]).json()
    by_stop = post(server, prompt=CAPITAL, max_tokens=8, temperature=0, stop=["."]).json()
    assert by_alias["choices"][0]["text"] == by_stop["choices"][0]["text"] == " Paris"
    assert by_alias["choices"][0]["stop_reason"] == "."
    same = post(server, prompt=CAPITAL, max_tokens=8, stop=["."], stop_sequences=["."])
    assert same.status_code == 200
    differ = post(server, prompt=CAPITAL, max_tokens=8, stop=["."], stop_sequences=["!"])
    assert differ.status_code == 400 and differ.json()["error"]["param"] == "stop_sequences"
