#!/usr/bin/env python3
"""Prompt lookup (`--prompt-lookup`): decode speed with and without it on workloads whose
output repeats the input (copying a paragraph, editing code, extracting sentences) and on
one whose output does not (a story's continuation), on the real models. Not a test.

Two ferrite servers run side by side on the same model, one with `--prompt-lookup 8`, the
other without; each workload is sent to each in turn (`--rounds` times, the order
alternating), as a streamed greedy completion (a base model's prompt: Gemma 3 270M's
file has no chat template). Decode speed is (completion tokens - 1)
over the time from the first streamed token to the last. The answers must be identical
(the script stops otherwise). Each cell is the median over rounds, each ratio the median
of the rounds' ratios; the acceptance is the share of drafted tokens accepted, from the
server's metrics. Prints a Markdown table.

    cargo build --release
    python3 bench/lookup.py [--models smollm2-135m gemma3-270m] [--rounds 3]
"""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import bench

PARAGRAPH = (
    "The harbour town woke slowly. Fishermen hauled their nets past the old lighthouse, "
    "children ran along the sea wall, and the baker opened his shutters to the smell of "
    "bread and salt. Nobody noticed the stranger who stepped off the morning ferry, a tall "
    "woman in a grey coat carrying a leather case and a folded map of the coast."
)

CODE = '''def mean_and_spread(values):
    total = 0
    for value in values:
        total += value
    mean = total / len(values)
    spread = 0
    for value in values:
        spread += (value - mean) ** 2
    return mean, (spread / len(values)) ** 0.5
'''

REPORT = (
    "On 3 March the council met in the town hall. The weather was cold and wet. "
    "On 9 March the new bridge opened to traffic. Many people came to watch. "
    "The school held its spring fair on 21 March. It raised money for new books. "
    "On 30 March the harbour closed for repairs."
)

WORKLOADS = {
    "copy a paragraph": f"A paragraph, then the same paragraph copied exactly.\n\nParagraph:\n"
                        f"{PARAGRAPH}\n\nCopy:\n",
    "edit code": f"Original:\n```python\n{CODE}```\n\nThe same function with the variable "
                 "`total` renamed to `acc`:\n```python\n",
    "extract sentences": f"Report: {REPORT}\n\nThe sentences of the report that contain a date, "
                         "each copied exactly:\n1.",
    "a story (nothing to copy)": "Once upon a time, a lighthouse keeper found a message "
                                        "in a bottle.",
}
MAX_TOKENS = 160


def complete(url, prompt):
    """Streams one greedy completion; returns (text, completion tokens, decode tok/s)."""
    body = {"model": "default", "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}
    req = urllib.request.Request(url + "/v1/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    text, first, last, tokens = [], None, None, None
    with urllib.request.urlopen(req, timeout=600) as r:
        for line in r:
            line = line.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            for choice in chunk.get("choices", []):
                if choice.get("text"):
                    now = time.perf_counter()
                    first = first or now
                    last = now
                    text.append(choice["text"])
    rate = (tokens - 1) / (last - first) if tokens and tokens > 1 and last > first else float("nan")
    return "".join(text), tokens, rate


def metrics(url):
    values = {}
    for line in urllib.request.urlopen(url + "/metrics").read().decode().splitlines():
        if line.startswith("ferrite_draft_tokens"):
            name, value = line.split()
            values[name] = float(value)
    return values


def start(model, extra, work, label):
    port = bench.free_port()
    url = f"http://127.0.0.1:{port}"
    log = open(work / f"{label}-{model}.log", "wb")
    proc = subprocess.Popen([str(bench.FERRITE), "serve", "--model", model, "--port", str(port),
                             "--served-model-name", "default", *extra],
                            stdout=log, stderr=subprocess.STDOUT)
    bench.wait_ready(url, "/ready", proc)
    return proc, url


def compare(servers, label, prompt, rounds):
    """One workload sent `rounds` times to the servers `with` and `without` lookup (the
    order alternating); stops if an answer differs. Returns the completion tokens, the
    median decode tok/s of each, the median of the rounds' ratios, and the share of
    drafted tokens accepted."""
    rates = {k: [] for k in servers}
    answers = {}
    before = metrics(servers["with"][1])
    for r in range(rounds):
        order = list(servers) if r % 2 == 0 else list(servers)[::-1]
        for kind in order:
            text, tokens, rate = complete(servers[kind][1], prompt)
            answers.setdefault(kind, (text, tokens))
            if answers[kind] != (text, tokens):
                sys.exit(f"{label}: {kind} answered differently between rounds")
            rates[kind].append(rate)
            print(f"{label} / {kind} round {r + 1}: {tokens} tokens, {rate:.1f} tok/s",
                  file=sys.stderr, flush=True)
    if answers["with"] != answers["without"]:
        sys.exit(f"{label}: the answers differ:\n{answers}")
    after = metrics(servers["with"][1])
    fed = after["ferrite_draft_tokens_fed_total"] - before["ferrite_draft_tokens_fed_total"]
    accepted = (after["ferrite_draft_tokens_accepted_total"]
                - before["ferrite_draft_tokens_accepted_total"])
    return {
        "tokens": answers["with"][1],
        "without": statistics.median(rates["without"]),
        "with": statistics.median(rates["with"]),
        "ratio": statistics.median(w / o for w, o in zip(rates["with"], rates["without"])),
        "accepted": f"{accepted / fed:.0%} of {fed / rounds:.0f}" if fed else "none drafted",
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["smollm2-135m", "gemma3-270m"])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--lookup", default="8", help="--prompt-lookup's value")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="ferrite-lookup-"))
    rows = ["| model | workload | tokens | decode tok/s without | with lookup | ratio | drafts accepted |",
            "|---|---|---|---|---|---|---|"]
    for model in args.models:
        servers = {"without": start(model, [], work, "without"),
                   "with": start(model, ["--prompt-lookup", args.lookup], work, "with")}
        try:
            for name, content in WORKLOADS.items():
                r = compare(servers, f"{model} / {name}", content, args.rounds)
                rows.append(f"| {model} | {name} | {r['tokens']} | {r['without']:.1f} "
                            f"| {r['with']:.1f} | {r['ratio']:.2f} | {r['accepted']} |")
        finally:
            for proc, _ in servers.values():
                bench.stop(proc)
    print("\n".join(rows))
    print(f"logs: {work}", file=sys.stderr)


if __name__ == "__main__":
    main()
