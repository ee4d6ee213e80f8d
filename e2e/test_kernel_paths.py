"""Every kernel path end to end: the release binary under FERRITE_CPU=avx2 and
FERRITE_CPU=portable gives the native path's answers exactly (text and logprobs), and
llama.cpp's greedy tokens. On an AVX-512 machine this runs the paths an older CPU takes;
the kernels' own tests compare them bit for bit only where the CPU can run them."""

import json
from pathlib import Path

import httpx
import pytest

from conftest import Server

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
MODELS = {"smollm2-135m": "smollm2-135m-q4_1.llamacpp.json", "gemma3-270m": "gemma3-270m-q4_k_m.llamacpp.json"}
# Over 512 tokens: two prefill chunks and the wide prompt tiles.
LONG = "In the beginning the river ran north, and the towns along it traded salt for wool. " * 32


def answers(server, fixture, cases, long=True):
    """Greedy answers to the first `cases` fixture prompts (16 tokens), then to LONG (4)."""
    out = []
    prompts = [(case["prompt"], 16) for case in fixture["greedy_16"][:cases]] + [(LONG, 4)] * long
    for prompt, max_tokens in prompts:
        r = httpx.post(f"{server.base}/v1/completions", timeout=300, json={
            "model": "default", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "logprobs": 2, "return_token_ids": True})
        assert r.status_code == 200, r.text
        out.append(r.json()["choices"][0])
    return out


@pytest.fixture(scope="module", params=list(MODELS))
def native(request):
    model = request.param
    fixture = json.loads((FIXTURES / MODELS[model]).read_text())
    s = Server(model)
    try:
        yield model, fixture, answers(s, fixture, len(fixture["greedy_16"]))
    finally:
        s.stop()


@pytest.mark.parametrize("cap", ["avx2", "portable"])
def test_kernel_path_gives_the_native_answers_and_llama_cpp_tokens(native, cap):
    model, fixture, want = native
    s = Server(model, env={"FERRITE_CPU": cap})
    try:
        s.log.flush()
        log = open(s.log.name, encoding="utf-8", errors="replace").read()
        assert f'kernels="{cap}"' in log, "the server did not take FERRITE_CPU"
        # The portable path is slow: two fixture prompts and no long prefill (the engine's
        # fixture test runs all five under FERRITE_CPU too).
        portable = cap == "portable"
        cases = 2 if portable else len(fixture["greedy_16"])
        got = answers(s, fixture, cases, long=not portable)
    finally:
        s.stop()
    want = want[:cases] + ([] if portable else want[-1:])
    for case, g in zip(fixture["greedy_16"], got):
        assert g["token_ids"] == [step["id"] for step in case["steps"]], (cap, case["prompt"])
    for g, w in zip(got, want):
        assert g["text"] == w["text"]
        assert g["logprobs"] == w["logprobs"], f"{cap} differs from the native path"
