"""One end-to-end test per request field of API.md (structured output and authentication
aside), through the official openai SDK, each asserting the field's effect."""

import collections

import httpx
import openai
import pytest

from conftest import MODEL, Server

REPETITIVE = "apple banana apple banana apple banana apple banana"
COUNTING = "1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2, 3,"
CAPITAL = "The capital of France is"


def complete(client, prompt=CAPITAL, max_tokens=8, **kw):
    extra = kw.pop("extra_body", {})
    extra.update({k: kw.pop(k) for k in list(kw) if k not in OPENAI_PARAMS})
    return client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=max_tokens, extra_body=extra or None, **kw
    )


OPENAI_PARAMS = {
    "temperature", "top_p", "seed", "n", "best_of", "stop", "stream", "stream_options",
    "logprobs", "echo", "suffix", "frequency_penalty", "presence_penalty", "logit_bias",
    "user",
}


def greedy(client, prompt=CAPITAL, max_tokens=8, **kw):
    return complete(client, prompt, max_tokens, temperature=0, **kw)


def tokenize(server, text, special=False):
    r = httpx.post(f"{server.base}/tokenize", json={"prompt": text, "add_special_tokens": special})
    return r.json()["tokens"]


def stream_choices(client, **kw):
    """Streams a completion; returns (text, logprob tokens, last chunk per choice, chunks)."""
    chunks = list(complete(client, stream=True, **kw))
    text, tokens, finals = collections.defaultdict(str), collections.defaultdict(list), {}
    for c in chunks:
        for ch in c.choices:
            text[ch.index] += ch.text
            if ch.logprobs is not None:
                tokens[ch.index] += ch.logprobs.tokens
            if ch.finish_reason is not None:
                finals[ch.index] = ch
    return text, tokens, finals, chunks


def max_run(tokens):
    """Longest run of one token repeating with period 2 or 1 (how repetitive a text is)."""
    return max(collections.Counter(tokens).values())


# ---- sampling and penalties -------------------------------------------------------------


def test_min_p_one_keeps_only_the_top_token(client):
    want = greedy(client).choices[0].text
    for seed in (1, 2, 3):
        r = complete(client, temperature=1.5, seed=seed, min_p=1.0)
        assert r.choices[0].text == want


def test_typical_p_narrows_sampling_to_the_typical_tokens(client):
    # With a tiny mass, typical-p keeps the token whose surprise is closest to the
    # entropy (and a neighbour when that one is rarer than the mass): seeds stop mattering.
    first = lambda **kw: {
        complete(client, prompt="Once upon a time, there was a", temperature=1.0, seed=s, max_tokens=1, **kw)
        .choices[0].text
        for s in range(1, 7)
    }
    assert len(first()) >= 4
    assert len(first(typical_p=0.001)) <= 2


def test_temperature_zero_is_greedy_and_high_temperature_varies(client):
    want = greedy(client).choices[0].text
    assert {complete(client, temperature=0, seed=s).choices[0].text for s in (1, 2)} == {want}
    hot = {complete(client, temperature=2.0, seed=s, max_tokens=6).choices[0].text for s in (1, 2, 3)}
    assert len(hot) > 1


def test_top_p_tiny_keeps_only_the_top_token(client):
    want = greedy(client).choices[0].text
    for seed in (1, 2, 3):
        assert complete(client, temperature=1.0, seed=seed, top_p=0.001).choices[0].text == want


def test_top_k_one_is_greedy(client):
    want = greedy(client).choices[0].text
    assert complete(client, temperature=1.5, seed=9, top_k=1).choices[0].text == want


def repetition_of(text, server):
    return max_run(tokenize(server, text))


@pytest.mark.parametrize(
    "field,value,prompt",
    [
        ("frequency_penalty", 2.0, REPETITIVE),
        ("presence_penalty", 2.0, REPETITIVE),
        ("repetition_penalty", 1.8, REPETITIVE),
        ("dry_multiplier", 2.0, COUNTING),
    ],
)
def test_penalties_change_a_repetitive_greedy_text(client, server, field, value, prompt):
    plain = greedy(client, prompt, max_tokens=24).choices[0].text
    penalised = greedy(client, prompt, max_tokens=24, **{field: value}).choices[0].text
    assert penalised != plain
    assert repetition_of(penalised, server) < repetition_of(plain, server)


def test_dry_settings_shape_the_penalty(client):
    plain = greedy(client, COUNTING, max_tokens=16).choices[0].text
    dry = greedy(client, COUNTING, max_tokens=16, dry_multiplier=2.0).choices[0].text
    assert dry != plain
    # Repeats up to the allowed length go unpunished.
    assert greedy(client, COUNTING, max_tokens=16, dry_multiplier=2.0, dry_allowed_length=64).choices[0].text == plain
    # A breaker that every other token contains stops repeats from growing.
    assert (
        greedy(client, COUNTING, max_tokens=16, dry_multiplier=2.0, dry_sequence_breakers=[","]).choices[0].text
        == plain
    )
    # A gentler base, a weaker penalty.
    gentle = greedy(client, COUNTING, max_tokens=16, dry_multiplier=0.05, dry_base=1.0).choices[0].text
    steep = greedy(client, COUNTING, max_tokens=16, dry_multiplier=0.05, dry_base=8.0).choices[0].text
    assert gentle != steep


def test_logit_bias_forces_a_token(client, server):
    (banana,) = tokenize(server, " banana")
    r = greedy(client, max_tokens=5, logit_bias={str(banana): 100}, logprobs=0)
    assert r.choices[0].text == " banana" * 5
    # The logprobs are the model's own, before the bias: " banana" is unlikely after the
    # prompt (a +100 bias would make it certain, logprob 0).
    lp = r.choices[0].logprobs
    assert lp.tokens == [" banana"] * 5 and lp.token_logprobs[0] < -5, lp.token_logprobs
    r = greedy(client, max_tokens=3, logit_bias={str(banana): -100}, prompt=REPETITIVE)
    assert "banana" not in r.choices[0].text


def test_logit_bias_with_an_unknown_token_is_a_400(client):
    with pytest.raises(openai.BadRequestError) as e:
        greedy(client, logit_bias={"99999999": 5})
    assert e.value.body["param"] == "logit_bias"


def test_mirostat_with_a_tiny_target_is_greedy_and_seeded(client):
    want = greedy(client).choices[0].text
    for seed in (1, 2):
        r = complete(client, temperature=1.0, seed=seed, mirostat_target=0.05)
        assert r.choices[0].text == want
    a = complete(client, temperature=1.0, seed=5, mirostat_target=6.0, max_tokens=16).choices[0].text
    b = complete(client, temperature=1.0, seed=5, mirostat_target=6.0, max_tokens=16).choices[0].text
    assert a == b


def test_mirostat_learning_rate_matters(client):
    texts = {
        complete(client, temperature=1.0, seed=11, mirostat_target=3.0, mirostat_lr=lr, max_tokens=32).choices[0].text
        for lr in (0.01, 1.0)
    }
    assert len(texts) == 2


def test_seed_fixes_the_output(client):
    a = complete(client, temperature=1.0, seed=1234, max_tokens=16).choices[0].text
    b = complete(client, temperature=1.0, seed=1234, max_tokens=16).choices[0].text
    assert a == b


# ---- ends -------------------------------------------------------------------------------


def test_stop_token_ids_end_and_report_the_id(client, server):
    r = greedy(client, max_tokens=8, logprobs=0)
    second = r.choices[0].logprobs.tokens[1]
    (second_id,) = tokenize(server, second)
    s = greedy(client, max_tokens=8, stop_token_ids=[second_id])
    assert s.choices[0].finish_reason == "stop"
    assert s.choices[0].model_extra["stop_reason"] == second_id
    assert s.choices[0].text == r.choices[0].logprobs.tokens[0]
    # min_tokens 4: the stop token cannot come among the first four tokens even when a bias
    # makes it the choice at every step; the fifth is then the stop token and ends it.
    held = greedy(client, max_tokens=8, stop_token_ids=[second_id], min_tokens=4, logprobs=0,
                  logit_bias={str(second_id): 100})
    tokens = held.choices[0].logprobs.tokens
    assert len(tokens) == 5 and second not in tokens[:4] and tokens[4] == second, tokens
    assert held.choices[0].model_extra["stop_reason"] == second_id


def test_min_tokens_holds_back_stop_strings(client):
    plain = greedy(client, max_tokens=8, stop=["."])
    assert plain.choices[0].text == " Paris"
    held = greedy(client, max_tokens=8, stop=["."], min_tokens=3)
    assert held.choices[0].text.startswith(" Paris.")
    assert held.usage.completion_tokens >= 3


def test_stop_reason_names_the_stop_string(client):
    r = greedy(client, stop=[".\n"])
    assert r.choices[0].model_extra["stop_reason"] == ".\n"
    r = greedy(client, max_tokens=2)
    assert r.choices[0].finish_reason == "length" and r.choices[0].model_extra["stop_reason"] is None


@pytest.mark.parametrize("stream", [False, True])
def test_include_stop_str_in_output(client, stream):
    kw = dict(stop=["."], temperature=0, max_tokens=8)
    if stream:
        plain = stream_choices(client, **kw)[0][0]
        kept = stream_choices(client, include_stop_str_in_output=True, **kw)[0][0]
    else:
        plain = complete(client, **kw).choices[0].text
        kept = complete(client, include_stop_str_in_output=True, **kw).choices[0].text
    assert plain == " Paris" and kept == " Paris."


# ---- choices ----------------------------------------------------------------------------


def test_n_128_shares_one_prefill(client, server):
    before = server.metrics()["ferrite_prompt_tokens_total"]
    # A prompt no earlier request started with, so that the prefix cache has nothing.
    r = complete(client, prompt="Zanzibar n128 " + CAPITAL, n=128, max_tokens=2, temperature=1.0, seed=3, ignore_eos=True)
    assert sorted(c.index for c in r.choices) == list(range(128))
    prompt_tokens = r.usage.prompt_tokens
    assert server.metrics()["ferrite_prompt_tokens_total"] - before == prompt_tokens
    assert r.usage.completion_tokens == 256


def mean_logprob(choice):
    lps = choice.logprobs.token_logprobs
    return sum(lps) / len(lps)


def test_best_of_returns_the_best_by_mean_logprob(client):
    kw = dict(temperature=1.2, seed=77, max_tokens=6, logprobs=0)
    everyone = complete(client, n=4, best_of=4, **kw).choices
    best = complete(client, n=2, best_of=4, **kw)
    assert [c.index for c in best.choices] == [0, 1]
    ranked = sorted(everyone, key=mean_logprob, reverse=True)
    assert [c.text for c in best.choices] == [c.text for c in ranked[:2]]
    assert best.usage.completion_tokens == sum(len(c.logprobs.tokens) for c in everyone)


def test_best_of_with_stream_is_a_400(client):
    with pytest.raises(openai.BadRequestError) as e:
        complete(client, n=1, best_of=2, stream=True)
    assert e.value.body["param"] == "best_of"


# ---- logprobs ---------------------------------------------------------------------------


def test_legacy_logprobs_shape(client):
    r = greedy(client, max_tokens=6, logprobs=3)
    lp = r.choices[0].logprobs
    assert "".join(lp.tokens) == r.choices[0].text
    assert len(lp.token_logprobs) == len(lp.tokens) == len(lp.top_logprobs) == 6
    assert all(l <= 0 for l in lp.token_logprobs)
    assert all(3 <= len(t) <= 4 for t in lp.top_logprobs)
    # Greedy picks the best alternative.
    for tok, top in zip(lp.tokens, lp.top_logprobs):
        assert max(top, key=top.get) == tok
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(6)]


def test_logprobs_true_with_top_logprobs(client):
    r = greedy(client, max_tokens=4, extra_body={"logprobs": True, "top_logprobs": 2})
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == 4 and all(2 <= len(t) <= 3 for t in lp.top_logprobs)


def test_return_token_log_probs(client):
    r = greedy(client, max_tokens=4, return_token_log_probs=True)
    lp = r.choices[0].logprobs
    assert len(lp.token_logprobs) == 4 and all(len(t) == 1 for t in lp.top_logprobs)


@pytest.mark.parametrize("stream", [False, True])
def test_return_tokens_as_token_ids(client, server, stream):
    kw = dict(temperature=0, max_tokens=4, logprobs=1, return_tokens_as_token_ids=True)
    if stream:
        tokens = stream_choices(client, **kw)[1][0]
    else:
        tokens = complete(client, **kw).choices[0].logprobs.tokens
    assert len(tokens) == 4 and all(t.startswith("token_id:") for t in tokens)
    ids = [int(t.split(":")[1]) for t in tokens]
    text = httpx.post(f"{server.base}/detokenize", json={"tokens": ids}).json()["prompt"]
    assert text == greedy(client, max_tokens=4).choices[0].text


def test_streamed_logprobs_match_the_non_streamed_ones(client):
    text, tokens, _, _ = stream_choices(client, temperature=0, max_tokens=6, logprobs=2)
    r = greedy(client, max_tokens=6, logprobs=2)
    assert tokens[0] == r.choices[0].logprobs.tokens and text[0] == r.choices[0].text


def test_echo_with_logprobs_scores_the_prompt(client, server):
    prompt_ids = tokenize(server, CAPITAL, special=True)
    r = greedy(client, max_tokens=3, echo=True, logprobs=1)
    c = r.choices[0]
    assert c.text.startswith(CAPITAL)
    lp = c.logprobs
    assert len(lp.tokens) == len(prompt_ids) + 3
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert all(l <= 0 for l in lp.token_logprobs[1:])


def test_echo_with_max_tokens_zero_scores_only_the_prompt(client, server):
    prompt_ids = tokenize(server, CAPITAL, special=True)
    r = complete(client, max_tokens=0, echo=True, logprobs=0)
    c = r.choices[0]
    assert c.text == CAPITAL
    assert len(c.logprobs.token_logprobs) == len(prompt_ids) == r.usage.prompt_tokens
    assert r.usage.completion_tokens == 0


def test_echo_without_logprobs(client):
    r = greedy(client, max_tokens=3, echo=True)
    assert r.choices[0].text == CAPITAL + greedy(client, max_tokens=3).choices[0].text
    text = stream_choices(client, temperature=0, max_tokens=3, echo=True)[0][0]
    assert text == r.choices[0].text


# ---- text -------------------------------------------------------------------------------


def test_suffix_is_appended_without_fim_tokens(client):
    plain = greedy(client, max_tokens=4).choices[0].text
    assert greedy(client, max_tokens=4, suffix=" [end]").choices[0].text == plain + " [end]"
    assert stream_choices(client, temperature=0, max_tokens=4, suffix=" [end]")[0][0] == plain + " [end]"


@pytest.mark.parametrize("stream", [False, True])
def test_skip_special_tokens(client, server, stream):
    (im_end,) = tokenize(server, "<|im_end|>", special=True)
    kw = dict(temperature=0, max_tokens=2, logit_bias={str(im_end): 100}, ignore_eos=True)
    get = (lambda **k: stream_choices(client, **k)[0][0]) if stream else (lambda **k: complete(client, **k).choices[0].text)
    assert get(**kw) == ""
    assert get(skip_special_tokens=False, **kw) == "<|im_end|><|im_end|>"


# ---- lengths and time -------------------------------------------------------------------


@pytest.fixture(scope="module")
def small_context():
    s = Server(MODEL, ["--ctx-size", "64"])
    yield openai.OpenAI(base_url=f"{s.base}/v1", api_key="unused", max_retries=0, timeout=60)
    s.stop()


def test_context_length_exceeded_behavior(small_context):
    prompt = "one two three four five six seven eight nine ten " * 5
    r = small_context.completions.create(
        model=MODEL, prompt=prompt, max_tokens=40, temperature=0, extra_body={"ignore_eos": True}
    )
    assert r.choices[0].finish_reason == "length"
    assert r.usage.total_tokens == 64 and r.usage.completion_tokens < 40
    with pytest.raises(openai.BadRequestError) as e:
        small_context.completions.create(
            model=MODEL, prompt=prompt, max_tokens=40,
            extra_body={"context_length_exceeded_behavior": "error"},
        )
    assert e.value.body["param"] == "max_tokens"


def test_truncate_sequence_keeps_the_end_of_a_long_prompt(small_context):
    prompt = "word " * 200
    with pytest.raises(openai.BadRequestError) as e:
        small_context.completions.create(model=MODEL, prompt=prompt, max_tokens=4)
    assert e.value.body["param"] == "prompt"
    r = small_context.completions.create(
        model=MODEL, prompt=prompt, max_tokens=4, extra_body={"truncate_sequence": True, "ignore_eos": True}
    )
    assert r.usage.prompt_tokens == 60 and r.usage.completion_tokens == 4


def test_max_tokens_aliases(client):
    assert greedy(client, max_tokens=None, extra_body={"max_new_tokens": 3}).usage.completion_tokens == 3
    with pytest.raises(openai.BadRequestError) as e:
        greedy(client, max_tokens=3, extra_body={"max_completion_tokens": 4})
    assert e.value.body["param"] == "max_completion_tokens"


def test_inference_timeout(client):
    with pytest.raises(openai.APIStatusError) as e:
        complete(client, max_tokens=4000, ignore_eos=True, inference_timeout=0.3)
    assert e.value.status_code == 504 and e.value.body["type"] == "timeout_error"
    with pytest.raises(openai.APIError) as e:
        list(complete(client, max_tokens=4000, ignore_eos=True, inference_timeout=0.3, stream=True))
    assert "inference_timeout" in str(e.value)


def test_continuous_usage_stats(client):
    _, _, _, chunks = stream_choices(
        client, temperature=0, max_tokens=4, stream_options={"include_usage": True, "continuous_usage_stats": True}
    )
    with_choices = [c for c in chunks if c.choices]
    assert with_choices and all(c.usage is not None for c in with_choices)
    counts = [c.usage.completion_tokens for c in with_choices]
    assert counts == sorted(counts) and counts[-1] == 4
    assert chunks[-1].usage.total_tokens == chunks[-1].usage.prompt_tokens + 4


# ---- accepted with meaning --------------------------------------------------------------


def test_prediction_gives_the_same_text_in_fewer_steps(client, server):
    steps = lambda: server.metrics()["ferrite_forward_steps_total"]
    before = steps()
    plain = greedy(client, "def fibonacci(n):", max_tokens=32, ignore_eos=True)
    plain_steps = steps() - before
    before = steps()
    fast = greedy(
        client, "def fibonacci(n):", max_tokens=32, ignore_eos=True,
        prediction={"type": "content", "content": plain.choices[0].text},
    )
    fast_steps = steps() - before
    assert fast.choices[0].text == plain.choices[0].text
    assert fast_steps * 2 < plain_steps, (fast_steps, plain_steps)


def test_images_are_refused_by_a_text_model(client):
    with pytest.raises(openai.BadRequestError) as e:
        complete(client, prompt="<image> what is this?", images=["data:image/png;base64,AAAA"])
    assert e.value.body["param"] == "images" and "text only" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        complete(client, prompt="no marker", images=["data:image/png;base64,AAAA"])
    assert "marker" in e.value.body["message"]


def test_modalities_and_audio(client):
    assert complete(client, modalities=["text"]).choices[0].text
    for field, value in [("modalities", ["text", "audio"]), ("audio", {"voice": "alloy"})]:
        with pytest.raises(openai.BadRequestError) as e:
            complete(client, **{field: value})
        assert e.value.body["param"] == field


def test_user_and_gateway_extras_are_accepted_and_user_is_logged(client, server):
    r = complete(client, user="alice-e2e", metadata={"k": "v"}, priority=1, inference_extra_params={})
    assert r.choices[0].text
    server.log.flush()
    assert "alice-e2e" in open(server.log.name, encoding="utf-8", errors="replace").read()


# ---- other routes -----------------------------------------------------------------------


def test_tokenize_and_detokenize_round_trip(server):
    r = httpx.post(f"{server.base}/tokenize", json={"model": MODEL, "prompt": "Hello world", "return_token_strs": True}).json()
    assert r["count"] == len(r["tokens"]) == 2 and r["token_strs"] == ["Hello", "Ġworld"]
    assert r["max_model_len"] > 0
    back = httpx.post(f"{server.base}/detokenize", json={"tokens": r["tokens"]}).json()
    assert back["prompt"] == "Hello world"
    bad = httpx.post(f"{server.base}/detokenize", json={"tokens": [-1]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tokens"


def test_retrieve_a_model(client):
    assert client.models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError) as e:
        client.models.retrieve("no-such-model")
    assert e.value.body["code"] == "model_not_found"


# ---- every field: a 400 naming it -------------------------------------------------------

BAD_VALUES = [
    ("temperature", 3), ("top_p", 0), ("top_k", -5), ("min_p", 2), ("typical_p", 0),
    ("frequency_penalty", 3), ("presence_penalty", "x"), ("repetition_penalty", 0),
    ("logit_bias", {"x": 1}), ("seed", "x"), ("n", 0), ("best_of", 0), ("stop", 5),
    ("include_stop_str_in_output", "x"), ("stop_token_ids", [-1]), ("ignore_eos", "x"),
    ("min_tokens", -1), ("echo", "x"), ("logprobs", 21), ("top_logprobs", 30),
    ("return_token_log_probs", "x"), ("return_tokens_as_token_ids", "x"),
    ("skip_special_tokens", "x"), ("mirostat_target", -1), ("mirostat_lr", 5),
    ("dry_multiplier", -1), ("dry_base", 0), ("dry_allowed_length", -1),
    ("dry_sequence_breakers", [""]), ("suffix", 5), ("max_tokens", -1),
    ("max_completion_tokens", "x"), ("max_new_tokens", -2),
    ("context_length_exceeded_behavior", "drop"), ("truncate_sequence", "x"),
    ("stream_options", {"include_usage": True}), ("inference_timeout", -1),
    ("prediction", {"type": "other", "content": "x"}), ("images", "x"),
    ("modalities", ["audio"]), ("audio", {"format": "wav"}), ("user", 5), ("stop_sequences", 1),
    ("stream", "x"), ("prompt", {"a": 1}), ("model", 5), ("metadata", "x"), ("priority", "high"),
    ("inference_extra_params", [1]), ("inference_extra_headers", 5), ("tools", 5),
    ("tool_choice", {"type": "x"}), ("parallel_tool_calls", "x"), ("response_format", {"type": "xml"}),
    ("guided_json", 5), ("guided_regex", 5), ("guided_choice", "x"), ("guided_grammar", 5),
    ("grammar", {"type": "ebnf", "value": "x"}),
]


@pytest.mark.parametrize("field,value", BAD_VALUES, ids=[f for f, _ in BAD_VALUES])
def test_bad_value_is_a_400_naming_the_field(server, field, value):
    body = {"model": MODEL, "prompt": "x", "max_tokens": 2, field: value}
    r = httpx.post(f"{server.base}/v1/completions", json=body, timeout=30)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == field and error["type"] == "invalid_request_error"
