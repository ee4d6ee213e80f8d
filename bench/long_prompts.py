#!/usr/bin/env python3
"""Long prompts, ferrite against llama.cpp's llama-server: the time to answer a prompt of
about 1,200 and 2,400 tokens with 32 new tokens (greedy, `ignore_eos`), median of three
requests, each prompt made unique by a nonce in front so that no prefix cache helps. The
servers run one after the other on the same model files: ferrite with its defaults,
`llama-server -m MODEL.gguf -t 2 -c 4096` (bench.py's 16 slots would leave each one 2,048
tokens of context).
Not a test: it measures and prints a Markdown table.

    python3 bench/long_prompts.py --llama-server /path/to/llama-server
        [--models smollm2-135m gemma3-270m] [--ferrite OTHER_BUILD --ferrite-label NAME]

`--ferrite` adds another ferrite binary (an older build, say) to the same run.
"""

import argparse
import json
import statistics
import tempfile
import time
import urllib.request
from pathlib import Path

import bench

PARAGRAPH = (
    "The harbour town woke slowly. Fishermen hauled their nets past the old lighthouse, "
    "children ran along the sea wall, and the baker opened his shutters to the smell of "
    "bread and salt. Nobody noticed the stranger who stepped off the morning ferry. "
)
# Paragraphs per prompt: about 1,200 and 2,400 tokens.
REPEATS = (24, 48)
NEW_TOKENS = 32
ROUNDS = 3


def timed(url, prompt, llama, new_tokens=NEW_TOKENS):
    models = json.load(urllib.request.urlopen(url + "/v1/models"))
    body = {"model": models["data"][0]["id"], "prompt": prompt, "max_tokens": new_tokens,
            "temperature": 0, "ignore_eos": True}
    if llama:
        body["cache_prompt"] = False
    request = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(),
                                     headers={"content-type": "application/json"})
    start = time.time()
    with urllib.request.urlopen(request, timeout=600) as r:
        usage = json.load(r)["usage"]
    return time.time() - start, usage["prompt_tokens"]


def start(kind, model, llama_server, log_dir):
    if kind == "ferrite":
        return bench.start(kind, model, llama_server, log_dir)
    return bench.start_file(kind, bench.cache_path(model), llama_server, log_dir, ["-c", "4096"])


def measure(kind, model, llama_server, log_dir):
    proc, url = start(kind, model, llama_server, log_dir)
    try:
        out = {}
        for repeats in REPEATS:
            runs = [timed(url, f"{k} " + PARAGRAPH * repeats, kind != "ferrite")
                    for k in range(ROUNDS)]
            out[repeats] = (statistics.median(t for t, _ in runs), runs[0][1])
        return out
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-server", required=True)
    ap.add_argument("--models", nargs="+", default=["smollm2-135m", "gemma3-270m"])
    ap.add_argument("--ferrite", help="another ferrite binary to measure in the same run")
    ap.add_argument("--ferrite-label", default="other ferrite")
    args = ap.parse_args()
    log_dir = Path(tempfile.mkdtemp(prefix="ferrite-long-"))
    builds = [("ferrite", bench.FERRITE)]
    if args.ferrite:
        builds.append((args.ferrite_label, Path(args.ferrite)))
    print("| model | prompt tokens | server | seconds (median of 3) | ferrite / this |")
    print("|---|---|---|---|---|")
    for model in args.models:
        results = {}
        for label, binary in builds:
            bench.FERRITE = binary
            results[label] = measure("ferrite", model, None, log_dir)
        results["llama-server"] = measure("llama", model, args.llama_server, log_dir)
        for repeats in REPEATS:
            ours = results["ferrite"][repeats][0]
            for label, figures in results.items():
                seconds, tokens = figures[repeats]
                print(f"| {model} | {tokens} | {label} | {seconds:.2f} | {ours / seconds:.2f} |")
    print(f"\nserver logs: {log_dir}")


if __name__ == "__main__":
    main()
