#!/usr/bin/env python3
"""Image encoding of ferrite and llama-server measured in pairs, on ferrite-synth's
random-weight Gemma 3 pair with the real model's vision tower (`--vision full`:
Gemma 3 4B's SigLIP at 896 pixels, 27 blocks; the text model is the small synth one, so
nearly all of the time is the image's). Not a test: it prints each pair and the median
ratio.

Each pair sends each server (the order alternating) one chat request with an 896x896 PNG
it has not seen (a new seed every round, so neither server's caches help) and
`max_tokens: 1`, and times it to the answer: the time to first token with an image. The
same prompt without the image, timed once on each server, is the text's share (its
prefill), which the encoding time is that less. Both servers run on 2 threads,
llama-server with `-fa on` as make_vision.py records it. Each pair also reports the CPU
other processes took meanwhile (as bench/quiet.py counts it); run it on an idle machine.

    cargo build --release -p ferrite-synth -p ferrite-server
    python3 bench/vision.py --llama-server /path/to/llama-server [--pairs 5]
"""

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "fixtures"))
import bench  # noqa: E402  (start_file, stop, cache_path, FERRITE)
import images  # noqa: E402
from quiet import busy_jiffies, pid_jiffies, HZ  # noqa: E402


def pair_files(work):
    synth = str(ROOT / "target" / "release" / "ferrite-synth")
    home = bench.cache_path("gemma3-270m").parent
    text, mmproj = work / "text.gguf", work / "mmproj.gguf"
    subprocess.run([synth, "--arch", "gemma3", "--type", "q8_0", "--tokenizer-from",
                    str(home / "gemma3-270m.gguf"), "--out", str(text)], check=True)
    subprocess.run([synth, "--projector", "gemma3", "--arch", "gemma3", "--vision", "full",
                    "--out", str(mmproj)], check=True)
    return text, mmproj


def ask(url, seed):
    """Seconds to the answer of a chat request with one 896x896 image (`seed` draws it;
    None: the same request without it)."""
    content = [{"type": "text", "text": "What is in this picture?"}]
    if seed is not None:
        content.append({"type": "image_url",
                        "image_url": {"url": images.data_uri(896, 896, seed)}})
    started = time.perf_counter()
    r = httpx.post(url + "/v1/chat/completions", timeout=3600, json={
        "model": "default", "max_tokens": 1, "temperature": 0,
        "messages": [{"role": "user", "content": content}]})
    elapsed = time.perf_counter() - started
    r.raise_for_status()
    return elapsed, r.json()["usage"]["prompt_tokens"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--llama-server", required=True)
    ap.add_argument("--ferrite", default=str(bench.FERRITE))
    ap.add_argument("--pairs", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="ferrite-vision-bench-") as work:
        text, mmproj = pair_files(Path(work))
        mmproj_args = ["--mmproj", str(mmproj)]
        binaries = {"ferrite": args.ferrite, "llama-server": args.llama_server}
        procs, url = {}, {}
        try:
            for kind, binary in binaries.items():
                procs[kind], url[kind] = bench.start_file(
                    kind, text, binary, Path(work), [*mmproj_args, "-c", "4096", "-fa", "on"],
                    ferrite_args=mmproj_args)
            text_only = {kind: ask(url[kind], None)[0] for kind in binaries}
            print(f"text alone: ferrite {text_only['ferrite']:.2f} s, llama-server "
                  f"{text_only['llama-server']:.2f} s", flush=True)
            ratios = []
            for i in range(args.pairs):
                order = list(binaries) if i % 2 == 0 else list(reversed(binaries))
                ttft, tokens, foreign = {}, {}, {}
                for kind in order:
                    busy, own = busy_jiffies(), pid_jiffies(procs[kind].pid)
                    ttft[kind], tokens[kind] = ask(url[kind], 1000 + i)
                    used = busy_jiffies() - busy - (pid_jiffies(procs[kind].pid) - own)
                    foreign[kind] = max(used, 0) / HZ
                ratios.append(ttft["llama-server"] / ttft["ferrite"])
                print(f"pair {i + 1}: time to first token ferrite {ttft['ferrite']:.2f} s, "
                      f"llama-server {ttft['llama-server']:.2f} s (prompt {tokens['ferrite']} "
                      f"and {tokens['llama-server']} tokens), llama-server / ferrite "
                      f"{ratios[-1]:.3f}; other processes' CPU {foreign['ferrite']:.1f} s "
                      f"and {foreign['llama-server']:.1f} s", flush=True)
            print(f"median llama-server / ferrite time {statistics.median(ratios):.3f} "
                  f"(above 1: ferrite faster); ferrite faster in "
                  f"{sum(r > 1 for r in ratios)} of {len(ratios)} pairs")
        finally:
            for proc in procs.values():
                bench.stop(proc)


if __name__ == "__main__":
    main()
