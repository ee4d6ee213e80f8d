#!/usr/bin/env python3
"""Soak test: starts the release binary on loopback and runs a bounded mix of requests
against it at a fixed concurrency, then checks that

- every valid request completed with the usage it should have (exact where the request
  makes the count exact: `ignore_eos` without stop strings),
- every valid request's text (each choice's, a stream's chunks joined) is the text the same
  request got when it ran alone on the idle server before the load: every request is one of
  a few variants of its kind (all seeded), so each runs many times, in batches of every
  make-up and from the prefix cache, and corruption under load (a shared prefix block
  written over, a batch row read for another) changes an answer,
- every invalid request got its 4xx in the OpenAI error shape,
- no request got a 5xx or lost its connection,
- cancelled streams left the engine (nothing running or waiting at the end, the cancelled
  counter moved by at least as many),
- the server's RSS at the end is within 10% of its RSS after the warm-up (the first 150 requests).

    .venv/bin/python scripts/soak.py [--requests 500] [--concurrency 16]

The server runs with `--prefix-cache-positions 512` so that the warm-up fills the prefix
cache (a bounded cache filling up by design is not a leak); everything else is default.
Prints a summary (the figures in RELIABILITY.md) and exits 1 on any failed check.
"""

import argparse
import asyncio
import json
import os
import random
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
# FERRITE_BIN runs it against another build (to see a check fail on a deliberate break).
BINARY = Path(os.environ.get("FERRITE_BIN", ROOT / "target" / "release" / "ferrite"))

PROMPTS = [
    "The capital of France is",
    "Once upon a time",
    "def fibonacci(n):",
    "1, 2, 3, 4,",
    "The weather today is",
    "List three colors:",
    "Q: What is 2 + 2?\nA:",
    "In the beginning",
    "import numpy as np\n",
    "My favourite food is",
]

INVALID = [
    ({"temperature": -1}, 400),
    ({"n": 0}, 400),
    ({"max_tokens": "many"}, 400),
    ({"no_such_field": 1}, 400),
    ({"model": "no-such-model"}, 404),
    ({"prompt": []}, 400),
    ({"logprobs": 100}, 400),
    ({"best_of": 2, "n": 3}, 400),
    ({"stop": ["a", "b", "c", "d", "e"]}, 400),
    ({"response_format": {"type": "json_schema"}}, 400),
]


KINDS = ["plain", "stream", "n", "stop", "logprobs", "cancel", "invalid"]
# Variants of each kind: few enough that each runs many times, alone once first.
VARIANTS = 6


def texts(completion):
    """A completion's choices' texts, by index."""
    return [c["text"] for c in sorted(completion["choices"], key=lambda c: c["index"])]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_mib(pid):
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def metrics(base):
    values = {}
    for line in httpx.get(f"{base}/metrics", timeout=10).text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    return values


class Soak:
    def __init__(self, base, model, seed):
        self.base = base
        self.model = model
        self.rng = random.Random(seed)
        self.failures = []
        self.kinds = Counter()
        self.statuses = Counter()
        self.latencies = []
        self.references = {}
        self.texts_checked = 0

    def fail(self, i, kind, message):
        self.failures.append(f"request {i} ({kind}): {message}")

    def plan(self, i):
        """The i-th request: its kind, its variant and its body."""
        kind = self.rng.choices(KINDS, weights=[25, 25, 12, 10, 8, 10, 10])[0]
        # Invalid requests have no answer to compare: each of their kinds is a variant.
        variant = self.rng.randrange(len(INVALID) if kind == "invalid" else VARIANTS)
        return kind, variant, self.body(kind, variant)

    def body(self, kind, variant):
        """The body of a kind's variant: the same for every request of it."""
        rng = random.Random(f"{kind} {variant}")
        body = {
            "model": self.model,
            "prompt": f"{rng.choice(PROMPTS)} ({variant})",
            "max_tokens": rng.randint(4, 24),
            "temperature": rng.choice([0, 0.7, 1.0]),
            "seed": variant,
            "ignore_eos": True,
        }
        if kind == "stream":
            body |= {"stream": True, "stream_options": {"include_usage": True}}
        elif kind == "n":
            n = rng.randint(2, 3)
            body |= {"n": n, "best_of": n + rng.randint(0, 1)}
        elif kind == "stop":
            body |= {"stop": [rng.choice([",", ".", "\n", " the"])], "ignore_eos": False}
        elif kind == "logprobs":
            body |= {"logprobs": 2, "echo": rng.random() < 0.5}
        elif kind == "cancel":
            body |= {"stream": True, "max_tokens": 400}
        elif kind == "invalid":
            change, status = INVALID[variant]
            body |= change
            body["expect"] = status
        return body

    def record_references(self):
        """Runs every variant of the kinds that finish, one at a time on the idle server,
        and keeps its choices' texts."""
        for kind in KINDS:
            if kind in ("cancel", "invalid"):
                continue
            for variant in range(VARIANTS):
                body = {k: v for k, v in self.body(kind, variant).items()
                        if k not in ("stream", "stream_options")}
                r = httpx.post(f"{self.base}/v1/completions", json=body, timeout=120)
                r.raise_for_status()
                self.references[kind, variant] = texts(r.json())

    def check_text(self, i, kind, variant, got):
        want = self.references[kind, variant]
        if got != want:
            self.fail(i, kind, f"variant {variant} answered {got!r}, alone it answered {want!r}")
        self.texts_checked += 1

    async def run_one(self, client, i):
        kind, variant, body = self.plan(i)
        self.kinds[kind] += 1
        expect = body.pop("expect", 200)
        started = time.monotonic()
        try:
            if body.get("stream"):
                await self.stream(client, i, kind, variant, body)
            else:
                r = await client.post(f"{self.base}/v1/completions", json=body)
                self.statuses[r.status_code] += 1
                if r.status_code != expect:
                    self.fail(i, kind, f"status {r.status_code}, expected {expect}: {r.text[:200]}")
                elif expect == 200:
                    self.check_usage(i, kind, body, r.json())
                    self.check_text(i, kind, variant, texts(r.json()))
                else:
                    error = r.json().get("error", {})
                    if not error.get("message") or error.get("type") != "invalid_request_error":
                        self.fail(i, kind, f"not an OpenAI error body: {r.text[:200]}")
        except httpx.HTTPError as e:
            self.fail(i, kind, f"{type(e).__name__}: {e}")
        self.latencies.append(time.monotonic() - started)

    def check_usage(self, i, kind, body, out):
        n = body.get("n", 1)
        usage = out["usage"]
        if len(out["choices"]) != n:
            self.fail(i, kind, f"{len(out['choices'])} choices, expected {n}")
        if usage["prompt_tokens"] <= 0 or usage["total_tokens"] != usage["prompt_tokens"] + usage["completion_tokens"]:
            self.fail(i, kind, f"inconsistent usage {usage}")
        exact = body.get("ignore_eos") and "stop" not in body
        best_of = body.get("best_of", n)
        want = body["max_tokens"] * best_of
        if exact and usage["completion_tokens"] != want:
            self.fail(i, kind, f"completion_tokens {usage['completion_tokens']}, expected {want}")
        if not exact and not 0 < usage["completion_tokens"] <= want:
            self.fail(i, kind, f"completion_tokens {usage['completion_tokens']} outside 1..={want}")
        for c in out["choices"]:
            if c["finish_reason"] not in ("stop", "length"):
                self.fail(i, kind, f"finish_reason {c['finish_reason']}")

    async def stream(self, client, i, kind, variant, body):
        async with client.stream("POST", f"{self.base}/v1/completions", json=body) as r:
            self.statuses[r.status_code] += 1
            if r.status_code != 200:
                self.fail(i, kind, f"status {r.status_code}")
                return
            events = []
            async for line in r.aiter_lines():
                if not line.startswith("data: "):
                    continue
                events.append(line[6:])
                if kind == "cancel" and len(events) >= 3:
                    return  # leaving the block closes the connection midway
        if kind == "cancel":
            self.fail(i, kind, "the stream ended before it could be cancelled")
            return
        if not events or events[-1] != "[DONE]":
            self.fail(i, kind, f"no [DONE]: {events[-1:]}")
            return
        chunks = [json.loads(e) for e in events[:-1]]
        if any("error" in c for c in chunks):
            self.fail(i, kind, f"error event {chunks[-1]}")
            return
        usage = chunks[-1].get("usage")
        if not usage or usage["completion_tokens"] != body["max_tokens"]:
            self.fail(i, kind, f"usage {usage}, expected {body['max_tokens']} tokens")
        finishes = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"] and c["choices"][0].get("finish_reason")]
        if finishes != ["length"]:
            self.fail(i, kind, f"finish reasons {finishes}")
        self.check_text(i, kind, variant, ["".join(c["choices"][0]["text"] for c in chunks if c["choices"])])


async def run_batch(soak, start, count, concurrency):
    queue = list(range(start, start + count))
    limits = httpx.Limits(max_connections=concurrency * 2)
    async with httpx.AsyncClient(timeout=300, limits=limits) as client:
        async def worker():
            while queue:
                await soak.run_one(client, queue.pop(0))

        await asyncio.gather(*(worker() for _ in range(concurrency)))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=500)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--warmup", type=int, default=150, help="requests before the RSS baseline")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = open(ROOT / "target" / f"soak-{port}.log", "wb")
    proc = subprocess.Popen(
        [str(BINARY), "serve", "--model", args.model, "--host", "127.0.0.1", "--port", str(port),
         "--prefix-cache-positions", "512"],
        stdout=log, stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.time() + 120
        while True:
            assert proc.poll() is None, f"ferrite exited; see {log.name}"
            try:
                if httpx.get(f"{base}/ready", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.time() < deadline, "ferrite did not become ready"
            time.sleep(0.2)
        soak = Soak(base, args.model, args.seed)
        soak.record_references()
        before = metrics(base)
        started = time.monotonic()
        asyncio.run(run_batch(soak, 0, args.warmup, args.concurrency))
        time.sleep(1)
        rss_warm = rss_mib(proc.pid)
        asyncio.run(run_batch(soak, args.warmup, args.requests - args.warmup, args.concurrency))
        elapsed = time.monotonic() - started
        time.sleep(1)
        rss_end = rss_mib(proc.pid)
        after = metrics(base)
        cancelled = after["ferrite_requests_cancelled_total"] - before.get("ferrite_requests_cancelled_total", 0)
        if after["ferrite_requests_running"] != 0 or after["ferrite_requests_waiting"] != 0:
            soak.failures.append(f"still busy at the end: {after['ferrite_requests_running']} running, {after['ferrite_requests_waiting']} waiting")
        if cancelled < soak.kinds["cancel"]:
            soak.failures.append(f"{soak.kinds['cancel']} streams cancelled, the engine counted {cancelled}")
        if soak.texts_checked < args.requests // 2:
            soak.failures.append(f"only {soak.texts_checked} answers' texts were checked")
        five_xx = sum(v for k, v in soak.statuses.items() if k >= 500)
        if five_xx:
            soak.failures.append(f"{five_xx} responses were 5xx")
        growth = rss_end / rss_warm - 1
        if growth > 0.10:
            soak.failures.append(f"RSS grew {growth:.1%} after warm-up ({rss_warm:.0f} -> {rss_end:.0f} MiB)")
        lat = sorted(soak.latencies)
        summary = {
            "requests": args.requests,
            "concurrency": args.concurrency,
            "seconds": round(elapsed, 1),
            "kinds": dict(sorted(soak.kinds.items())),
            "statuses": dict(sorted(soak.statuses.items())),
            "engine_cancelled": int(cancelled),
            "generated_tokens": int(after["ferrite_generation_tokens_total"] - before.get("ferrite_generation_tokens_total", 0)),
            "latency_p50_s": round(lat[len(lat) // 2], 3),
            "latency_p99_s": round(lat[int(len(lat) * 0.99)], 3),
            "rss_after_warmup_mib": round(rss_warm, 1),
            "rss_end_mib": round(rss_end, 1),
            "rss_growth": f"{growth:+.1%}",
            "texts_checked": soak.texts_checked,
            "failures": len(soak.failures),
        }
        print(json.dumps(summary, indent=2))
        for f in soak.failures[:30]:
            print("FAIL", f, file=sys.stderr)
        failed = bool(soak.failures)
    finally:
        proc.terminate()
        try:
            code = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = "no exit within 60 s"
        log.close()
    # A server that does not stop cleanly on SIGTERM fails the soak too.
    if code != 0:
        print(f"FAIL ferrite ended with {code} on SIGTERM", file=sys.stderr)
        return 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
