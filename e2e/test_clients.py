"""What clients written by other people rely on (issue 15): logprob offsets that index the
returned text, vLLM's tokenizer routes and fields, OpenAI's error codes, usage details and
retry headers, content types, disconnects, CORS, model routes while loading, threads."""

import json
import os
import shutil
import socket
import subprocess
import time

import httpx
import openai
import pytest

from conftest import BINARY, MODEL, ROOT, Server, free_port, wait_for

GEMMA = "gemma3-270m"
CAPITAL = "The capital of France is"


def post(server, body, path="/v1/completions", **kw):
    return httpx.post(f"{server.base}{path}", json={"model": "default", **body}, timeout=60, **kw)


def sse(server, body):
    """The JSON chunks of a streamed completion."""
    chunks = []
    with httpx.stream("POST", f"{server.base}/v1/completions", json={"model": "default", "stream": True, **body},
                      timeout=60) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[6:]))
    return chunks


@pytest.fixture(scope="module")
def gemma():
    s = Server(GEMMA)
    yield s
    s.stop()


# ---- text_offset indexes the returned text ---------------------------------------------


def check_offsets(text, logprobs):
    offsets = logprobs["text_offset"]
    assert len(offsets) == len(logprobs["tokens"])
    assert offsets == sorted(offsets), f"offsets go backwards: {offsets}"
    assert all(0 <= o <= len(text) for o in offsets), f"past the end ({len(text)}): {offsets}"


def streamed_offsets(chunks):
    text, tokens, offsets = "", [], []
    for c in chunks:
        for ch in c["choices"]:
            text += ch["text"]
            if ch.get("logprobs"):
                tokens += ch["logprobs"]["tokens"]
                offsets += ch["logprobs"]["text_offset"]
    return text, {"tokens": tokens, "text_offset": offsets}


def test_echo_offsets_with_a_bos_adding_model(gemma):
    # Issue 15's case: Gemma adds <bos>, which the text (special tokens skipped) leaves out.
    body = {"prompt": CAPITAL, "max_tokens": 3, "echo": True, "logprobs": 0, "temperature": 0}
    choice = post(gemma, body).json()["choices"][0]
    text, lp = choice["text"], choice["logprobs"]
    assert lp["tokens"][0] == "<bos>" and text.startswith(CAPITAL)
    check_offsets(text, lp)
    offsets = lp["text_offset"]
    assert offsets[:2] == [0, 0], "<bos> adds no text"
    # Every other token's text is exactly where its offset says.
    ends = offsets[1:] + [len(text)]
    for token, start, end in zip(lp["tokens"][1:], offsets[1:], ends[1:]):
        assert text[start:end] == token.replace("▁", " "), (token, text[start:end])
    # The stream gives the same text and offsets.
    s_text, s_lp = streamed_offsets(sse(gemma, body))
    assert (s_text, s_lp["text_offset"]) == (text, offsets)
    # With skip_special_tokens false the echoed text spells <bos> and the offsets follow it.
    shown = post(gemma, {**body, "skip_special_tokens": False}).json()["choices"][0]
    assert shown["text"] == "<bos>" + text
    assert shown["logprobs"]["text_offset"] == [0] + [o + 5 for o in offsets[1:]]
    check_offsets(shown["text"], shown["logprobs"])


@pytest.mark.parametrize("stream", [False, True])
def test_echo_offsets_of_a_prompt_of_special_tokens(server, stream):
    # Issue 15's case: SmolLM2, prompt [0,0,0,0,0] (<|endoftext|> five times).
    body = {"prompt": [0, 0, 0, 0, 0], "max_tokens": 5, "echo": True, "logprobs": 0, "temperature": 0,
            "ignore_eos": True}
    if stream:
        text, lp = streamed_offsets(sse(server, body))
    else:
        choice = post(server, body).json()["choices"][0]
        text, lp = choice["text"], choice["logprobs"]
    check_offsets(text, lp)
    assert lp["text_offset"][:5] == [0] * 5, "skipped special tokens add no text"
    assert len(lp["tokens"]) == 10
    shown = post(server, {**body, "skip_special_tokens": False}).json()["choices"][0]
    assert shown["text"].startswith("<|endoftext|>" * 5)
    assert shown["logprobs"]["text_offset"][:6] == [0, 13, 26, 39, 52, 65]
    check_offsets(shown["text"], shown["logprobs"])


def test_offsets_of_generated_special_tokens_and_split_characters(server):
    # A generated special token (forced by logit_bias) adds nothing to the text when skipped.
    (im_end,) = post(server, {"prompt": "<|im_end|>", "add_special_tokens": False}, "/tokenize").json()["tokens"]
    body = {"prompt": CAPITAL, "max_tokens": 3, "logprobs": 1, "temperature": 0, "ignore_eos": True,
            "logit_bias": {str(im_end): 100}}
    choice = post(server, body).json()["choices"][0]
    assert choice["text"] == "" and choice["logprobs"]["text_offset"] == [0, 0, 0]
    # Characters split across byte tokens: offsets never pass the end of the text.
    body = {"prompt": "Emoji: 🤖🦀🎉 and Chinese: 你好世界。 More:", "max_tokens": 24, "logprobs": 0,
            "echo": True, "temperature": 0}
    choice = post(server, body).json()["choices"][0]
    check_offsets(choice["text"], choice["logprobs"])


@pytest.mark.parametrize("stop", ["\n\nX", "\n\nThe"])
def test_offsets_around_text_held_back_for_a_stop_string(server, stop):
    # Greedy: " Paris" "." "\n" "\n" "The" ...; "\n\n" is held back as a possible stop.
    body = {"prompt": CAPITAL, "max_tokens": 8, "logprobs": 0, "temperature": 0, "stop": [stop]}
    choice = post(server, body).json()["choices"][0]
    text, lp = choice["text"], choice["logprobs"]
    check_offsets(text, lp)
    assert streamed_offsets(sse(server, body))[1]["text_offset"] == lp["text_offset"]
    starts = [sum(len(t) for t in lp["tokens"][:i]) for i in range(len(lp["tokens"]))]
    if stop == "\n\nX":
        # Released later, the newlines still start where they decoded.
        assert text.startswith(" Paris.\n\nThe") and lp["text_offset"] == starts
    else:
        # Matched and dropped: the tokens that spelled the stop string point at the end.
        assert text == " Paris." and lp["text_offset"] == [min(o, len(text)) for o in starts]


# ---- vLLM's tokenizer routes ------------------------------------------------------------


def test_tokenizer_info_answers_lm_evaluation_harness_probe(server):
    # lm-eval's `local-completions` strips /v1/completions from its base URL, asks
    # GET /tokenizer_info (it needs `eos_token`), then POST /tokenize of "test" without
    # special tokens (it needs a `tokens` list), and finds the EOS id by tokenizing eos_token.
    base = f"{server.base}/v1/completions".replace("/v1/completions", "").rstrip("/")
    info = httpx.get(f"{base}/tokenizer_info", timeout=10).json()
    assert isinstance(info, dict) and info["eos_token"] in ("<|im_end|>", "<|endoftext|>")
    assert info["model_max_length"] > 0 and isinstance(info["tokenizer_class"], str)
    assert "add_bos_token" in info and "chat_template" in info and "bos_token" in info
    assert "pad_token" in info
    assert isinstance(info["chat_template"], str) and "im_start" in info["chat_template"]
    probe = httpx.post(f"{base}/tokenize", json={"prompt": "test", "add_special_tokens": False}, timeout=10).json()
    assert isinstance(probe["tokens"], list) and probe["tokens"]
    (eos_id,) = httpx.post(f"{base}/tokenize", json={"prompt": info["eos_token"], "add_special_tokens": False},
                           timeout=10).json()["tokens"]
    # Hugging Face's and vLLM's AddedToken objects, not bare strings.
    assert info["added_tokens_decoder"][str(eos_id)] == {
        "content": info["eos_token"], "special": True, "lstrip": False, "rstrip": False,
        "normalized": False, "single_word": False}
    assert all(set(t) == {"content", "special", "lstrip", "rstrip", "normalized", "single_word"}
               for t in info["added_tokens_decoder"].values())
    assert httpx.post(f"{base}/detokenize", json={"tokens": [eos_id]}, timeout=10).json()["prompt"] == info["eos_token"]


def test_tokenizer_info_of_a_bos_adding_model(gemma):
    info = httpx.get(f"{gemma.base}/tokenizer_info", timeout=10).json()
    assert info["bos_token"] == "<bos>" and info["add_bos_token"] is True
    assert info["eos_token"] and info["model_max_length"] > 0
    # Its file has no chat template: the chat route's ChatML default is the one given.
    assert "<|im_start|>" in info["chat_template"]


def test_tokenize_token_strs_are_the_vocabulary_strings(server, gemma):
    plain = post(server, {"prompt": "Hello world is"}, "/tokenize").json()
    assert "token_strs" in plain and plain["token_strs"] is None
    r = post(server, {"prompt": "Hello world is", "return_token_strs": True}, "/tokenize").json()
    assert r["token_strs"] == ["Hello", "Ġworld", "Ġis"]
    g = post(gemma, {"prompt": "Hello world", "return_token_strs": True}, "/tokenize").json()
    assert g["token_strs"] == ["<bos>", "Hello", "▁world"]


# ---- vLLM's completion fields -----------------------------------------------------------


def test_continuous_usage_stats_needs_include_usage(server):
    chunks = sse(server, {"prompt": CAPITAL, "max_tokens": 3, "stream_options": {"continuous_usage_stats": True}})
    assert chunks and all("usage" not in c or c["usage"] is None for c in chunks)
    chunks = sse(server, {"prompt": CAPITAL, "max_tokens": 3,
                          "stream_options": {"continuous_usage_stats": True, "include_usage": True}})
    assert all(c.get("usage") for c in chunks)


def test_prompt_logprobs_in_vllm_shape(server):
    ids = post(server, {"prompt": CAPITAL}, "/tokenize").json()["tokens"]
    r = post(server, {"prompt": CAPITAL, "max_tokens": 2, "temperature": 0, "prompt_logprobs": 2,
                      "echo": True, "logprobs": 0}).json()
    choice = r["choices"][0]
    scores = choice["prompt_logprobs"]
    assert len(scores) == len(ids) and scores[0] is None
    echoed = choice["logprobs"]["token_logprobs"][: len(ids)]
    for position, (token, entry) in enumerate(zip(ids[1:], scores[1:]), 1):
        own = entry[str(token)]
        assert own["rank"] >= 1 and own["decoded_token"] and own["logprob"] <= 0
        assert abs(own["logprob"] - echoed[position]) < 1e-5
        ranked = sorted((v["rank"], v["logprob"]) for k, v in entry.items() if k != str(token) or v["rank"] <= 2)
        assert [rank for rank, _ in ranked][:2] == [1, 2]
        assert len(entry) in (2, 3)
        best = max(v["logprob"] for v in entry.values())
        assert [v["rank"] for v in entry.values() if v["logprob"] == best][0] == 1
    # Without echo it is still given; it is not a streaming field.
    alone = post(server, {"prompt": CAPITAL, "max_tokens": 1, "prompt_logprobs": 0}).json()["choices"][0]
    assert [list(e) if e else None for e in alone["prompt_logprobs"]] == [None] + [[str(t)] for t in ids[1:]]
    assert "logprobs" not in alone or alone["logprobs"] is None
    for bad in [{"prompt_logprobs": -1}, {"prompt_logprobs": 21}, {"prompt_logprobs": "2"},
                {"prompt_logprobs": 1, "stream": True}]:
        e = post(server, {"prompt": CAPITAL, **bad})
        assert e.status_code == 400 and e.json()["error"]["param"] == "prompt_logprobs", (bad, e.text)


def test_allowed_token_ids_restrict_the_output(server):
    allowed = post(server, {"prompt": " yes no maybe"}, "/tokenize").json()["tokens"]
    for seed in range(3):
        r = post(server, {"prompt": CAPITAL, "max_tokens": 8, "temperature": 1.5, "seed": seed,
                          "allowed_token_ids": allowed, "return_token_ids": True, "ignore_eos": True}).json()
        choice = r["choices"][0]
        assert len(choice["token_ids"]) == 8 and set(choice["token_ids"]) <= set(allowed), choice
    # Combined with a grammar, the grammar wins where they disagree.
    r = post(server, {"prompt": CAPITAL, "max_tokens": 4, "allowed_token_ids": allowed,
                      "guided_choice": ["Paris"]}).json()
    assert r["choices"][0]["text"] == "Paris"
    for bad, why in [([], "empty"), ([10**9], "vocabulary"), ([-1], "range"), ("x", "")]:
        e = post(server, {"prompt": CAPITAL, "allowed_token_ids": bad})
        assert e.status_code == 400 and e.json()["error"]["param"] == "allowed_token_ids", e.text
        assert why in e.json()["error"]["message"]


def test_return_token_ids(server):
    ids = post(server, {"prompt": CAPITAL}, "/tokenize").json()["tokens"]
    body = {"prompt": CAPITAL, "max_tokens": 6, "temperature": 0, "return_token_ids": True}
    choice = post(server, body).json()["choices"][0]
    assert choice["prompt_token_ids"] == ids
    assert len(choice["token_ids"]) == 6
    text = post(server, {"tokens": choice["token_ids"]}, "/detokenize").json()["prompt"]
    assert text == choice["text"]
    chunks = sse(server, body)
    firsts = [c["choices"][0] for c in chunks if c["choices"]]
    assert firsts[0]["prompt_token_ids"] == ids
    assert all("prompt_token_ids" not in ch for ch in firsts[1:])
    assert [t for ch in firsts for t in ch["token_ids"]] == choice["token_ids"]
    # Off by default: the keys are there and null, as vLLM sends them (client code written
    # for vLLM reads them as attributes).
    plain = post(server, {"prompt": CAPITAL, "max_tokens": 1}).json()["choices"][0]
    assert {k: plain[k] for k in ("token_ids", "prompt_token_ids", "prompt_logprobs")} == dict.fromkeys(
        ("token_ids", "prompt_token_ids", "prompt_logprobs"))


# ---- OpenAI's error code, usage details, retry header ------------------------------------


@pytest.fixture(scope="module")
def small():
    s = Server(MODEL, ["--ctx-size", "64"])
    yield s
    s.stop()


def test_context_length_exceeded_code(small):
    client = openai.OpenAI(base_url=f"{small.base}/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=MODEL, prompt="word " * 200, max_tokens=4)
    assert (e.value.code, e.value.body["param"]) == ("context_length_exceeded", "prompt")
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=MODEL, prompt="word " * 20, max_tokens=60,
                                  extra_body={"context_length_exceeded_behavior": "error"})
    assert (e.value.code, e.value.body["param"]) == ("context_length_exceeded", "max_tokens")


def test_cached_tokens_in_usage(server):
    prompt = f"Run {time.time()}: " + "the quick brown fox jumps over the lazy dog. " * 30
    first = post(server, {"prompt": prompt, "max_tokens": 2}).json()["usage"]
    assert first["prompt_tokens_details"] == {"cached_tokens": 0}
    again = post(server, {"prompt": prompt, "max_tokens": 2}).json()["usage"]
    assert 0 < again["prompt_tokens_details"]["cached_tokens"] < again["prompt_tokens"]
    chunks = sse(server, {"prompt": prompt, "max_tokens": 2, "stream_options": {"include_usage": True}})
    assert chunks[-1]["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    # The SDK reads it.
    client = openai.OpenAI(base_url=f"{server.base}/v1", api_key="x", max_retries=0)
    usage = client.completions.create(model=MODEL, prompt=prompt, max_tokens=1).usage
    assert usage.prompt_tokens_details.cached_tokens > 0


def test_a_deadline_504_is_not_retried_by_the_sdk(server):
    sent = []
    http = httpx.Client(event_hooks={"request": [lambda request: sent.append(request.url.path)]})
    client = openai.OpenAI(base_url=f"{server.base}/v1", api_key="x", max_retries=2, http_client=http)
    with pytest.raises(openai.APIStatusError) as e:
        client.completions.create(model=MODEL, prompt=CAPITAL, max_tokens=4000,
                                  extra_body={"ignore_eos": True, "inference_timeout": 0.3})
    assert e.value.status_code == 504
    assert e.value.response.headers["x-should-retry"] == "false"
    assert sent == ["/v1/completions"], "the SDK retried"


# ---- content type ------------------------------------------------------------------------


def test_a_body_that_is_not_json_is_a_415(server):
    body = json.dumps({"model": MODEL, "prompt": CAPITAL, "max_tokens": 1})
    for kind in ["application/x-www-form-urlencoded", "text/plain", "multipart/form-data; boundary=x", None]:
        headers = {"content-type": kind} if kind else {}
        r = httpx.post(f"{server.base}/v1/completions", content=body, headers=headers, timeout=30)
        assert r.status_code == 415, (kind, r.text)
        assert r.json()["error"]["code"] == "unsupported_media_type" and "application/json" in r.json()["error"]["message"]
    for kind in ["application/json", "application/json; charset=utf-8"]:
        headers = {"content-type": kind} if kind else {}
        r = httpx.post(f"{server.base}/v1/completions", content=body, headers=headers, timeout=30)
        assert r.status_code == 200, (kind, r.text)


# ---- disconnects are logged and counted -----------------------------------------------------


def disconnected(server):
    return server.metrics().get('ferrite_requests_total{status="disconnected"}', 0)


def test_disconnected_requests_are_logged_and_counted(server):
    before = disconnected(server)
    # Before the answer: a non-streaming request whose client gives up.
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{server.base}/v1/completions", timeout=0.5,
                   json={"model": MODEL, "prompt": CAPITAL, "max_tokens": 3000, "ignore_eos": True})
    wait_for(lambda: disconnected(server) == before + 1, 3)
    # In the middle of a stream.
    with httpx.stream("POST", f"{server.base}/v1/completions", timeout=30,
                      json={"model": MODEL, "prompt": CAPITAL, "max_tokens": 3000, "ignore_eos": True,
                            "stream": True}) as r:
        lines = r.iter_lines()
        next(lines)
    wait_for(lambda: disconnected(server) == before + 2, 3)
    # A request answered in full is not one, nor a HEAD request (whose body is never sent).
    assert post(server, {"prompt": CAPITAL, "max_tokens": 1}).status_code == 200
    answered = server.metrics().get('ferrite_requests_total{status="200"}', 0)
    assert httpx.head(f"{server.base}/v1/models", timeout=10).status_code == 200
    time.sleep(0.2)
    assert disconnected(server) == before + 2
    assert server.metrics()['ferrite_requests_total{status="200"}'] == answered + 1
    server.log.flush()
    log = open(server.log.name, encoding="utf-8", errors="replace").read()
    assert "client disconnected before the answer" in log
    assert "client disconnected before the end of the answer" in log


# ---- CORS --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cors():
    s = Server(MODEL, ["--allowed-origins", "https://app.example", "--api-key", "k"])
    yield s
    s.stop()


def preflight(server, origin):
    return httpx.options(f"{server.base}/v1/completions", timeout=10, headers={
        "origin": origin, "access-control-request-method": "POST",
        "access-control-request-headers": "authorization, content-type"})


def test_cors_preflight_and_headers_for_listed_origins(cors):
    r = preflight(cors, "https://app.example")
    assert r.status_code == 204, r.text
    assert r.headers["access-control-allow-origin"] == "https://app.example"
    assert "POST" in r.headers["access-control-allow-methods"]
    assert "authorization" in r.headers["access-control-allow-headers"]
    answer = httpx.post(f"{cors.base}/v1/completions", timeout=30,
                        headers={"origin": "https://app.example", "authorization": "Bearer k"},
                        json={"model": MODEL, "prompt": CAPITAL, "max_tokens": 1})
    assert answer.status_code == 200
    assert answer.headers["access-control-allow-origin"] == "https://app.example"
    assert "x-request-id" in answer.headers["access-control-expose-headers"]
    # Another origin: the preflight is refused and answers carry no permission.
    other = preflight(cors, "https://evil.example")
    assert other.status_code == 403 and "access-control-allow-origin" not in other.headers
    assert "evil.example" in other.json()["error"]["message"]
    r = httpx.get(f"{cors.base}/v1/models", headers={"origin": "https://evil.example", "x-api-key": "k"}, timeout=10)
    assert r.status_code == 200 and "access-control-allow-origin" not in r.headers
    # The answer depends on Origin, so every answer says so to caches, without one too.
    r = httpx.get(f"{cors.base}/v1/models", headers={"x-api-key": "k"}, timeout=10)
    assert "origin" in r.headers["vary"].lower()


def test_no_cross_origin_access_by_default(server):
    r = preflight(server, "https://app.example")
    assert r.status_code == 403 and "access-control-allow-origin" not in r.headers
    r = httpx.get(f"{server.base}/v1/models", headers={"origin": "https://app.example"}, timeout=10)
    assert r.status_code == 200 and "access-control-allow-origin" not in r.headers


def test_allowed_origins_from_the_environment_and_bad_values():
    s = Server(MODEL, env={"FERRITE_ALLOWED_ORIGINS": "https://a.example,https://b.example"})
    try:
        for origin in ["https://a.example", "https://b.example"]:
            assert preflight(s, origin).headers["access-control-allow-origin"] == origin
    finally:
        s.stop()
    p = subprocess.run([str(BINARY), "serve", "--allowed-origins", "app.example", "--port", str(free_port())],
                       capture_output=True, text=True, timeout=30)
    assert p.returncode != 0 and "allowed-origins" in p.stderr


# ---- model routes while loading, and compute threads -------------------------------------------


def test_model_routes_answer_503_until_the_model_is_ready():
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = open(ROOT / "target" / f"e2e-loading-{port}.log", "wb")
    proc = subprocess.Popen([str(BINARY), "serve", "--model", GEMMA, "--port", str(port)], stdout=log,
                            stderr=subprocess.STDOUT)
    routes = [("GET", "/v1/models", None), ("GET", f"/v1/models/{GEMMA}", None),
              ("POST", "/tokenize", {"prompt": "x"}), ("POST", "/detokenize", {"tokens": [1]}),
              ("GET", "/tokenizer_info", None), ("GET", "/ready", None)]
    seen = []
    try:
        deadline = time.time() + 120
        while time.time() < deadline:
            # /ready is asked last: the model becomes ready once and stays so, so a model
            # route that said 200 before it means /ready must say 200 too.
            try:
                answers = [httpx.request(m, f"{base}{path}", json=body, timeout=2) for m, path, body in routes]
            except httpx.TransportError:
                time.sleep(0.01)
                continue
            statuses = tuple(a.status_code for a in answers)
            seen.append(statuses)
            for a in answers:
                if a.status_code == 503:
                    assert a.headers["retry-after"] and a.json()["error"]["code"] == "service_unavailable"
            if statuses[0] == 200:
                break
        r = httpx.post(f"{base}/v1/completions", json={"model": GEMMA, "prompt": "Hi", "max_tokens": 1}, timeout=30)
        assert r.status_code == 200, r.text
        loading = [s for s in seen if s[-1] == 503]
        assert (503,) * len(routes) in seen, f"never saw the model loading: {seen}"
        # While /ready said 503, every model route that answered before it did too ...
        for statuses in loading:
            first_ok = next((i for i, code in enumerate(statuses) if code == 200), len(statuses))
            assert all(code == 503 for code in statuses[:first_ok]), seen[-3:]
        # ... and once a model route said 200, they all do.
        for statuses in seen:
            if 200 in statuses:
                first_ok = statuses.index(200)
                assert all(code == 200 for code in statuses[first_ok:]), seen[-3:]
        assert seen[-1] == (200,) * len(routes), seen
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


def compute_threads_logged(args, prefix=()):
    port = free_port()
    p = subprocess.Popen([*prefix, str(BINARY), "serve", "--port", str(port), *args], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    try:
        for line in p.stdout:
            if "compute threads" in line:
                fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
                names = []
                for _ in range(100):
                    names = [open(f"/proc/{p.pid}/task/{t}/comm").read().strip()
                             for t in os.listdir(f"/proc/{p.pid}/task")]
                    if any(n.startswith("ferrite-comput") for n in names):
                        break
                    time.sleep(0.05)
                return int(fields["compute_threads"]), int(fields["available_cores"]), names
        raise AssertionError("no compute-threads log line")
    finally:
        p.terminate()
        p.wait(timeout=30)


def cores_for_this_process():
    """What the server should find: the affinity mask, capped by a cgroup CPU quota."""
    cores = len(os.sched_getaffinity(0))
    try:
        quota, period = open("/sys/fs/cgroup/cpu.max").read().split()
        if quota != "max":
            cores = min(cores, max(1, int(quota) // int(period)))
    except (OSError, ValueError):
        pass
    return cores


def test_threads_option_and_the_cpu_affinity_mask():
    threads, cores, names = compute_threads_logged(["--threads", "1"])
    assert (threads, cores) == (1, cores_for_this_process())
    assert sum(n.startswith("ferrite-comput") for n in names) == 1, names
    if shutil.which("taskset") and len(os.sched_getaffinity(0)) > 1:
        cpu = str(min(os.sched_getaffinity(0)))
        threads, cores, names = compute_threads_logged([], prefix=["taskset", "-c", cpu])
        assert (threads, cores) == (1, 1)
    bad = subprocess.run([str(BINARY), "serve", "--threads", "0"], capture_output=True, text=True, timeout=30)
    assert bad.returncode != 0 and "--threads" in bad.stderr
