"""Long contexts (issue 52): the KV cache's types (`--cache-type-k/-v`, llama.cpp's
`-ctk/-ctv`) and a byte budget through the release binary, and a 16k-token prompt
prefilled while four streams decode, none of them waiting over a second for a token."""

import subprocess
import threading
import time

import httpx

from conftest import BINARY, MODEL, Server, free_port, wait_for

GEMMA = "gemma3-270m"
CAPITAL = "The capital of France is"
# SmolLM2-135M: 30 layers, 3 KV heads of 64 values (192 a layer) for keys and for values.
SMOLLM2_LAYERS, SMOLLM2_KV_WIDTH = 30, 192


def position_bytes(key_type, value_type):
    """Bytes one position takes in SmolLM2's cache: f16 2 bytes a value, Q8_0 34 and Q4_0 18
    per block of 32."""
    row = {"f16": 2 * SMOLLM2_KV_WIDTH, "q8_0": SMOLLM2_KV_WIDTH // 32 * 34, "q4_0": SMOLLM2_KV_WIDTH // 32 * 18}
    return SMOLLM2_LAYERS * (row[key_type] + row[value_type])


def greedy(server, model, prompt, n):
    r = httpx.post(f"{server.base}/v1/completions", timeout=120,
                   json={"model": model, "prompt": prompt, "max_tokens": n, "temperature": 0, "logprobs": 1})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]


def test_quantized_caches_serve_and_a_byte_budget_counts_their_bytes():
    plain = Server(MODEL)
    try:
        f16 = greedy(plain, MODEL, CAPITAL, 8)
    finally:
        plain.stop()
    budget = 64 << 20
    s = Server(MODEL, ["--cache-type-k", "q8_0", "--cache-type-v", "q8_0", "--kv-budget", "64MiB"])
    try:
        q8 = greedy(s, MODEL, CAPITAL, 8)
        # The same model, keys and values at 8.5 bits: a close answer, not the same bits.
        assert q8["text"] and q8["logprobs"]["tokens"][0] == f16["logprobs"]["tokens"][0]
        drift = [abs(a - b) for a, b in zip(q8["logprobs"]["token_logprobs"][:1], f16["logprobs"]["token_logprobs"])]
        assert 0 < max(drift) < 0.1, drift
        positions = budget // position_bytes("q8_0", "q8_0")
        m = s.metrics()
        assert m["ferrite_kv_cache_budget_positions"] == positions
        assert m["ferrite_kv_cache_budget_bytes"] == positions * position_bytes("q8_0", "q8_0") <= budget
        # Past the budget's positions, the 400 counts them.
        r = httpx.post(f"{s.base}/v1/completions", timeout=30,
                       json={"model": MODEL, "prompt": CAPITAL, "max_tokens": positions})
        assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens", r.text
        assert f"at most {positions}" in r.json()["error"]["message"]
    finally:
        s.stop()
    # Mixed types, and the environment's names for the flags.
    s = Server(MODEL, env={"FERRITE_CACHE_TYPE_K": "q4_0", "FERRITE_KV_BUDGET": "1GiB"})
    try:
        assert greedy(s, MODEL, CAPITAL, 4)["text"]
        assert s.metrics()["ferrite_kv_cache_budget_positions"] == (1 << 30) // position_bytes("q4_0", "f16")
    finally:
        s.stop()


def test_a_cache_type_llama_cpp_does_not_offer_or_a_bad_budget_stops_the_server():
    for flag, value, says in [("--cache-type-k", "q5_1", "f16, q8_0, q4_0"), ("--cache-type-v", "f32", "f16, q8_0, q4_0"),
                              ("--kv-budget", "1.5GiB", "whole number"), ("--kv-budget", "4 parsecs", "unknown unit")]:
        r = subprocess.run([str(BINARY), "serve", "--model", MODEL, "--port", str(free_port()), flag, value],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode != 0 and flag in r.stderr and says in r.stderr, (flag, value, r.stderr[-500:])


def stream_gaps(server, stop, gaps, errors):
    """Streams a long greedy answer, appending each gap between tokens to `gaps`, until
    `stop` is set."""
    try:
        with httpx.stream("POST", f"{server.base}/v1/completions", timeout=300,
                          json={"model": GEMMA, "prompt": "Once upon a time", "max_tokens": 4000,
                                "ignore_eos": True, "stream": True, "temperature": 0}) as r:
            last = None
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    now = time.monotonic()
                    if last is not None:
                        gaps.append((now, now - last))
                    last = now
                if stop.is_set():
                    return
    except Exception as e:  # noqa: BLE001 - reported by the test
        errors.append(e)


def test_a_16k_prompt_prefills_while_four_streams_decode_without_a_gap_over_a_second():
    s = Server(GEMMA)
    try:
        stop, errors = threading.Event(), []
        gaps = [[] for _ in range(4)]
        streams = [threading.Thread(target=stream_gaps, args=(s, stop, g, errors)) for g in gaps]
        for t in streams:
            t.start()
        wait_for(lambda: all(len(g) >= 3 for g in gaps), 60)
        # About 16,400 tokens of Gemma's vocabulary: a paragraph repeated.
        paragraph = ("The harbour town woke slowly. Fishermen hauled their nets past the old lighthouse, "
                     "children ran along the sea wall, and the baker opened his shutters. ")
        prompt = paragraph * 545
        started = time.monotonic()
        r = httpx.post(f"{s.base}/v1/completions", timeout=600,
                       json={"model": GEMMA, "prompt": prompt, "max_tokens": 4, "temperature": 0})
        ended = time.monotonic()
        stop.set()
        for t in streams:
            t.join(timeout=60)
        assert r.status_code == 200, r.text[:300]
        prompt_tokens = r.json()["usage"]["prompt_tokens"]
        assert 16_000 <= prompt_tokens <= 17_000, prompt_tokens
        assert not errors, errors
        during = [gap for g in gaps for (at, gap) in g if started < at <= ended]
        print(f"{prompt_tokens}-token prompt in {ended - started:.1f} s beside 4 streams; "
              f"{len(during)} of their gaps meanwhile, worst {max(during):.3f} s")
        # Every stream kept producing tokens through the prefill.
        assert all(sum(1 for (at, _) in g if started < at <= ended) >= 10 for g in gaps)
        assert max(during) <= 1.0, max(during)
    finally:
        s.stop()
