"""Structured output end to end, through the official openai SDK: JSON schema, regex,
choice, Lark grammar and tool calls always give output that parses, streaming too."""

import json
import re

import jsonschema
import openai
import pytest

from conftest import MODEL

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 16},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "height_m": {"type": "number", "minimum": 0.5, "maximum": 2.5},
        "role": {"enum": ["admin", "user", "guest"]},
        "address": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 16},
                "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
            },
            "required": ["city", "zip"],
            "additionalProperties": False,
        },
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 3},
    },
    "required": ["name", "age", "role", "address", "tags"],
    "additionalProperties": False,
}

ISO_DATE = r"[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])"

ARITHMETIC = r"""
start: expr
expr: term (OP term){0,3}
term: NUMBER | "(" expr ")"
OP: "+" | "-" | "*" | "/"
NUMBER: /[1-9][0-9]{0,2}/
"""

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 20},
                "unit": {"enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
TIME_TOOL = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"type": "string", "maxLength": 12}},
            "required": ["zone"],
            "additionalProperties": False,
        },
    },
}


def complete(client, prompt, stream=False, **extra):
    kw = dict(model=MODEL, prompt=prompt, max_tokens=200, temperature=1.0, extra_body=extra)
    if not stream:
        return client.completions.create(**kw).choices
    text = {}
    finish = {}
    for chunk in client.completions.create(stream=True, **kw):
        for c in chunk.choices:
            text[c.index] = text.get(c.index, "") + c.text
            if c.finish_reason:
                finish[c.index] = c.finish_reason
    return [type("Choice", (), {"text": text[i], "finish_reason": finish[i]}) for i in sorted(text)]


def parses_arithmetic(text):
    """A recursive-descent check of the arithmetic grammar above."""
    pos = 0

    def number():
        nonlocal pos
        m = re.match(r"[1-9][0-9]{0,2}", text[pos:])
        if not m:
            raise ValueError(f"number expected at {pos}")
        pos += m.end()

    def term():
        nonlocal pos
        if text[pos:pos + 1] == "(":
            pos += 1
            expr()
            if text[pos:pos + 1] != ")":
                raise ValueError(f") expected at {pos}")
            pos += 1
        else:
            number()

    def expr():
        # `term (OP term){0,3}`: at most three operators per expression, as the grammar says.
        nonlocal pos
        term()
        for _ in range(3):
            if pos >= len(text) or text[pos] not in "+-*/":
                break
            pos += 1
            term()

    expr()
    return pos == len(text)


def test_the_arithmetic_checker_refuses_what_the_grammar_refuses():
    assert parses_arithmetic("1+2*(3-4)/5")
    for bad in ["1+2+3+4+5", "(1+2+3+4+5)", "0", "1234", "1+", "(1"]:
        try:
            assert not parses_arithmetic(bad), bad
        except ValueError:
            pass


def test_json_schema_twenty_seeds_all_validate(client):
    for seed in range(20):
        (choice,) = complete(
            client,
            "A user record as JSON:",
            seed=seed,
            response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}},
        )
        assert choice.finish_reason == "stop", choice.text
        jsonschema.validate(json.loads(choice.text), PERSON)


@pytest.mark.parametrize("stream", [False, True])
def test_json_schema_with_n_constrains_every_choice(client, stream):
    choices = complete(client, "A user record as JSON:", stream=stream, n=3, seed=7, guided_json=PERSON)
    assert len(choices) == 3
    for c in choices:
        jsonschema.validate(json.loads(c.text), PERSON)


def test_json_object_is_an_object(client):
    # Seeded sequences draw the same tokens whatever else runs: these three complete.
    for seed in range(3):
        (c,) = complete(client, "Some JSON:", seed=seed, response_format={"type": "json_object"}, max_tokens=200)
        assert c.finish_reason == "stop", c.text
        assert isinstance(json.loads(c.text), dict)
    (c,) = complete(
        client, "Some JSON:", seed=1,
        response_format={"type": "json_object", "schema": {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"], "additionalProperties": False}},
    )
    assert json.loads(c.text)["ok"] in (True, False)


@pytest.mark.parametrize("stream", [False, True])
def test_regex_always_full_matches(client, stream):
    for seed in range(10):
        (c,) = complete(client, "Today's date is", stream=stream, seed=seed, guided_regex=ISO_DATE)
        assert re.fullmatch(ISO_DATE, c.text), c.text
        assert c.finish_reason == "stop"


def test_grammar_field_with_regex_and_json_schema(client):
    (c,) = complete(client, "A date:", seed=3, grammar={"type": "regex", "value": ISO_DATE})
    assert re.fullmatch(ISO_DATE, c.text)
    (c,) = complete(client, "A number:", seed=3, grammar={"type": "json_schema", "value": {"type": "integer", "minimum": 10, "maximum": 99}})
    assert 10 <= json.loads(c.text) <= 99


def test_guided_choice_returns_one_of_them(client):
    options = ["positive", "negative", "neutral (mixed)"]
    for seed in range(10):
        (c,) = complete(client, "The sentiment of 'I love it' is", seed=seed, guided_choice=options)
        assert c.text in options


@pytest.mark.parametrize("field", ["guided_grammar", "lark"])
def test_lark_arithmetic_always_parses(client, field):
    extra = {"guided_grammar": ARITHMETIC} if field == "guided_grammar" else {"grammar": {"type": "lark", "value": ARITHMETIC}}
    for seed in range(10):
        (c,) = complete(client, "An arithmetic expression:", seed=seed, max_tokens=120, **extra)
        assert c.finish_reason == "stop", c.text
        assert parses_arithmetic(c.text), c.text


def test_tool_choice_required_gives_a_valid_call(client):
    for seed in range(5):
        (c,) = complete(client, "Call a tool to answer: what's the weather in Paris?", seed=seed,
                        tools=[WEATHER_TOOL, TIME_TOOL], tool_choice="required")
        call = json.loads(c.text)
        tool = {"get_weather": WEATHER_TOOL, "get_time": TIME_TOOL}[call["name"]]
        jsonschema.validate(call["arguments"], tool["function"]["parameters"])


def test_named_tool_choice_calls_that_tool(client):
    (c,) = complete(client, "Weather?", seed=2, tools=[WEATHER_TOOL, TIME_TOOL],
                    tool_choice={"type": "function", "function": {"name": "get_time"}})
    call = json.loads(c.text)
    assert call["name"] == "get_time"
    jsonschema.validate(call["arguments"], TIME_TOOL["function"]["parameters"])


def test_tool_choice_auto_leaves_the_output_free(client):
    free = client.completions.create(model=MODEL, prompt="Hello", max_tokens=6, temperature=0).choices[0].text
    auto = client.completions.create(
        model=MODEL, prompt="Hello", max_tokens=6, temperature=0,
        extra_body={"tools": [WEATHER_TOOL], "tool_choice": "auto"},
    ).choices[0].text
    assert auto == free


def test_max_tokens_cutting_a_constraint_says_length(client):
    (c,) = complete(client, "A user record as JSON:", seed=1, guided_json=PERSON, max_tokens=5)
    assert c.finish_reason == "length"


@pytest.mark.parametrize(
    "extra,param,words",
    [
        ({"guided_json": {"type": "no-such-type"}}, "guided_json", "guided_json"),
        ({"guided_regex": "(unclosed"}, "guided_regex", "guided_regex"),
        ({"guided_grammar": "start: missing_rule"}, "guided_grammar", "guided_grammar"),
        ({"guided_regex": "a+", "guided_json": {"type": "object"}}, "guided_regex", "guided_json"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format", "schema"),
        ({"response_format": {"type": "json_object"}, "guided_choice": ["a"]}, "guided_choice", "response_format"),
    ],
)
def test_bad_constraints_are_400s_naming_the_field(client, extra, param, words):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=MODEL, prompt="x", max_tokens=4, extra_body=extra)
    assert e.value.body["param"] == param
    assert words in e.value.body["message"]
