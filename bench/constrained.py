#!/usr/bin/env python3
"""What a JSON-schema constraint costs per generated token on SmolLM2. Not a test: it
measures and prints a Markdown table for BENCHMARKS.md.

One ferrite server; alternating unconstrained and constrained requests (same prompt,
same seed, 128 tokens forced with ignore_eos and a schema whose output cannot end early),
each timed as a stream so that the prompt's time is left out: the time per token is
(last token time - first token time) / (tokens - 1). Medians of the repetitions. Forced
tokens (the grammar allowing only one) are verified as drafts, several per step, so the
constrained figure is also given with those drafts' steps counted.

    python3 bench/constrained.py [--repeats 7]
"""

import argparse
import json
import statistics
import subprocess
import tempfile
import time
import urllib.request

from bench import FERRITE, free_port, wait_ready

PROMPT = "Here is a list of numbers and words in JSON: "
SCHEMA = {
    "type": "array",
    "minItems": 400,
    "items": {
        "type": "object",
        "properties": {"n": {"type": "integer"}, "w": {"type": "string", "maxLength": 12}},
        "required": ["n", "w"],
        "additionalProperties": False,
    },
}
TOKENS = 128


def timed_stream(url, body):
    """Returns (seconds between first and last token, tokens)."""
    req = urllib.request.Request(
        url + "/v1/completions",
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json"},
    )
    stamps = []
    with urllib.request.urlopen(req, timeout=600) as r:
        for line in r:
            line = line.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("choices") and chunk["choices"][0].get("logprobs"):
                stamps.extend([time.perf_counter()] * len(chunk["choices"][0]["logprobs"]["tokens"]))
    return stamps[-1] - stamps[0], len(stamps)


def steps(url):
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("ferrite_forward_steps_total "):
                return float(line.split()[1])
    raise RuntimeError("no step counter")


def run(url, body):
    """Returns (seconds per token, seconds per forward step) of one request."""
    before = steps(url)
    seconds, n = timed_stream(url, body)
    time.sleep(0.05)  # the last step's counter lands just after its last event
    # The first token comes from the prompt's step, outside the timed span.
    step_count = steps(url) - before - 1
    return seconds / (n - 1), seconds / max(step_count, 1)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tempfile.NamedTemporaryFile(prefix="ferrite-constrained-", suffix=".log", delete=False)
    proc = subprocess.Popen([str(FERRITE), "serve", "--model", "smollm2-135m", "--port", str(port)], stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_ready(url, "/ready", proc)
        base = {
            "model": "default", "prompt": PROMPT, "max_tokens": TOKENS, "temperature": 1.0, "seed": 1,
            "ignore_eos": True, "stream": True, "logprobs": 0,
        }
        free, constrained = [], []
        timed_stream(url, {**base, "guided_json": SCHEMA})  # warms the grammar index
        for _ in range(args.repeats):
            free.append(run(url, base))
            constrained.append(run(url, {**base, "guided_json": SCHEMA}))
        med = lambda rows, i: statistics.median(r[i] for r in rows)
        ft, fs, ct, cs = med(free, 0), med(free, 1), med(constrained, 0), med(constrained, 1)
        print("| SmolLM2-135M, 128 tokens, temperature 1 | unconstrained | JSON schema | constrained / free |")
        print("|---|---|---|---|")
        print(f"| ms per forward step (mask cost) | {fs * 1000:.2f} | {cs * 1000:.2f} | {cs / fs:.2f} |")
        print(f"| ms per generated token (forced tokens go as drafts) | {ft * 1000:.2f} | {ct * 1000:.2f} | {ct / ft:.2f} |")
        print(f"\n(medians of {args.repeats} alternating runs)")
    finally:
        proc.terminate()
        proc.wait(timeout=20)


if __name__ == "__main__":
    main()
