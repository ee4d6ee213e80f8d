#!/usr/bin/env python3
"""Long contexts (issue 52): ferrite against llama.cpp's llama-server (and ik_llama.cpp's,
when given) on the same model file with the same KV cache types, in paired rounds. Not a
test: it prints a Markdown table of medians and ratios.

For each prompt length (tokens of a paragraph repeated, a nonce in front so that no prefix
cache helps) and each round, every server in turn (the order alternating by round) answers
the prompt with `--new-tokens` greedy tokens, streamed: the time to the first token, and
the decode rate after it (tokens after the first over the time they took). Each figure is
the median of its rounds, each ratio the median of the rounds' ratios (a round's servers run
back to back, so a drift of this machine's memory bandwidth falls on them alike).

The servers run with one slot, 2 threads and a context of the longest prompt plus the new
tokens (rounded up to 1,024): `llama-server -m FILE -t 2 -np 1 -c N -fa on -ctk K -ctv V`,
`ferrite serve --model FILE --ctx-size N --cache-type-k K --cache-type-v V`.

    python3 bench/long_context.py --llama-server /path/to/llama-server MODEL.gguf \\
        [--ik-llama-server PATH] [--prompts 4096 16384] [--cache-type q8_0] [--rounds 3]

Make a model with `ferrite-synth` (`--arch llama --shape 1b --type q4_k --mix
llama-quantize --context 65536` for the 1B rows; `--shape 8b` for the 8B ones). Run it on an
idle machine (bench/quiet.py says how idle it was).
"""

import argparse
import json
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench  # noqa: E402

PARAGRAPH = (
    "The harbour town woke slowly. Fishermen hauled their nets past the old lighthouse, "
    "children ran along the sea wall, and the baker opened his shutters to the smell of "
    "bread and salt. Nobody noticed the stranger who stepped off the morning ferry. "
)


def tokens_of(url, text, llama):
    """Tokens of `text` (llama-server's /tokenize takes `content`, ferrite's vLLM-style one
    `prompt`)."""
    body = {"content": text} if llama else {"prompt": text}
    request = urllib.request.Request(url + "/tokenize", data=json.dumps(body).encode(),
                                     headers={"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as r:
        return len(json.load(r)["tokens"])


def prompt_of(url, tokens, nonce, llama):
    """About `tokens` tokens (by the server's tokenizer): the paragraph repeated."""
    per = tokens_of(url, PARAGRAPH * 8, llama) / 8
    return f"[{nonce}] " + PARAGRAPH * max(1, round(tokens / per))


def timed_stream(url, prompt, new_tokens, llama):
    """(time to the first token, decode tokens/s after it, prompt tokens)."""
    models = json.load(urllib.request.urlopen(url + "/v1/models"))
    body = {"model": models["data"][0]["id"], "prompt": prompt, "max_tokens": new_tokens,
            "temperature": 0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
    if llama:
        body["cache_prompt"] = False
    request = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(),
                                     headers={"content-type": "application/json"})
    start = time.time()
    stamps, usage = [], None
    with urllib.request.urlopen(request, timeout=3600) as r:
        for line in r:
            line = line.decode().strip()
            if not line.startswith("data: {"):
                continue
            event = json.loads(line[6:])
            if event.get("choices") and event["choices"][0].get("text") is not None:
                stamps.append(time.time())
            if event.get("usage"):
                usage = event["usage"]
    first = stamps[0] - start
    decode = (len(stamps) - 1) / (stamps[-1] - stamps[0]) if len(stamps) > 1 else float("nan")
    return first, decode, (usage or {}).get("prompt_tokens")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model", type=Path)
    ap.add_argument("--llama-server", required=True)
    ap.add_argument("--ik-llama-server")
    ap.add_argument("--prompts", type=int, nargs="+", default=[4096, 16384])
    ap.add_argument("--cache-type", default="f16", help="keys' and values' type on every server")
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    context = -(-(max(args.prompts) + args.new_tokens + 256) // 1024) * 1024
    kv = args.cache_type
    servers = {"ferrite": None, "llama-server": args.llama_server}
    if args.ik_llama_server:
        servers["ik_llama.cpp"] = args.ik_llama_server
    figures = {k: {n: [] for n in args.prompts} for k in servers}
    with tempfile.TemporaryDirectory() as work:
        work = Path(work)
        running = {}
        try:
            for kind, binary in servers.items():
                llama_args = ["-np", "1", "-c", str(context), "-fa", "on", "-ctk", kv, "-ctv", kv]
                ferrite_args = ["--ctx-size", str(context), "--cache-type-k", kv, "--cache-type-v", kv]
                running[kind] = bench.start_file(kind, args.model, binary, work, llama_args, ferrite_args)
            for n in args.prompts:
                for r in range(args.rounds):
                    order = list(servers) if r % 2 == 0 else list(reversed(servers))
                    for kind in order:
                        url = running[kind][1]
                        prompt = prompt_of(url, n, f"{n}-{r}-{kind}", kind != "ferrite")
                        first, decode, used = timed_stream(url, prompt, args.new_tokens, kind != "ferrite")
                        figures[kind][n].append((first, decode))
                        print(f"{n} round {r} {kind}: {used} prompt tokens, first token {first:.2f} s, "
                              f"decode {decode:.2f} tok/s", flush=True)
        finally:
            for proc, _ in running.values():
                bench.stop(proc)
    print(f"\n{args.model.name}, KV cache {kv}, {args.rounds} paired rounds\n")
    print("| prompt | server | TTFT (s) | decode after it (tok/s) | ferrite's TTFT ratio | ferrite's decode ratio |")
    print("|---|---|---|---|---|---|")
    for n in args.prompts:
        for kind in servers:
            rows = figures[kind][n]
            ttft = statistics.median(f for f, _ in rows)
            dec = statistics.median(d for _, d in rows)
            ratio = ""
            if kind != "ferrite":
                ours = figures["ferrite"][n]
                t = statistics.median(theirs[0] / mine[0] for theirs, mine in zip(rows, ours))
                d = statistics.median(mine[1] / theirs[1] for theirs, mine in zip(rows, ours))
                ratio = f"| {t:.2f}x | {d:.2f}x"
            else:
                ratio = "| | "
            print(f"| {n} | {kind} | {ttft:.2f} | {dec:.2f} {ratio} |")


if __name__ == "__main__":
    main()
