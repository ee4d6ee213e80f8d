#!/usr/bin/env python3
"""Decode of ferrite and llama-server measured in pairs, on a machine whose speed drifts:
rounds minutes apart compare different machines, two runs seconds apart compare the
servers. Not a test: it prints each pair and the median ratio.

Both servers stay up (llama-server on 2 threads; for a load, 16 slots as bench/bench.py
starts it); each pair is one run on each, the order alternating from pair to pair:
- `--concurrency 1` (the default): one 64-token streamed decode (bench/loadgen.py), its
  decode rate after the first token;
- `--concurrency C` above 1: bench/bench.py's load at that concurrency (2C streamed
  requests of 128 new tokens, prompts varied), its aggregate decode rate.

    python3 bench/paired_decode.py --model /path/to/file.gguf --llama-server PATH \\
        [--pairs 20] [--concurrency 1] [--ferrite target/release/ferrite]

The figures in BENCHMARKS-history.md's F16 section came from this loop (one stream).
"""

import argparse
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import bench  # noqa: E402  (free_port, wait_ready)


def decode_rate(url, model, concurrency):
    """One stream: tok/s after the first token of one 64-token streamed completion.
    Several: aggregate completion tok/s of bench.py's load at that concurrency."""
    if concurrency == 1:
        load, label = ["-c", "1", "-n", "1", "--max-tokens", "64"], "per-request decode"
    else:
        load = ["-c", str(concurrency), "-n", str(2 * concurrency), "--max-tokens", "128",
                "--vary-prompt"]
        label = "aggregate decode"
    out = subprocess.run(
        [sys.executable, str(HERE / "loadgen.py"), "--url", url, "--model", model, *load,
         "--stream"],
        capture_output=True, text=True, check=True).stdout
    line = next(l for l in out.splitlines() if l.startswith(label))
    return float(line.split()[2])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="a GGUF file")
    ap.add_argument("--llama-server", required=True)
    ap.add_argument("--ferrite", default=str(bench.FERRITE))
    ap.add_argument("--pairs", type=int, default=20)
    ap.add_argument("--concurrency", type=int, default=1,
                    help="streams at once (1: one decode; more: bench.py's load)")
    args = ap.parse_args()
    name = Path(args.model).stem
    ports = {"ferrite": bench.free_port(), "llama-server": bench.free_port()}
    commands = {
        "ferrite": [args.ferrite, "serve", "--model", args.model, "--port",
                    str(ports["ferrite"])],
        "llama-server": [args.llama_server, "-m", args.model, "--port",
                         str(ports["llama-server"]), "-t", "2",
                         *(["-c", "4096"] if args.concurrency == 1
                           else ["-np", "16", "-c", "32768"])],
    }
    ready = {"ferrite": "/ready", "llama-server": "/health"}
    procs = {}
    try:
        for kind, cmd in commands.items():
            procs[kind] = subprocess.Popen(cmd, stdout=subprocess.DEVNULL,
                                           stderr=subprocess.DEVNULL)
            bench.wait_ready(f"http://127.0.0.1:{ports[kind]}", ready[kind], procs[kind],
                             timeout=600)
        ratios = []
        for i in range(args.pairs):
            order = list(commands) if i % 2 == 0 else list(reversed(commands))
            rate = {kind: decode_rate(f"http://127.0.0.1:{ports[kind]}", name,
                                      args.concurrency)
                    for kind in order}
            ratios.append(rate["ferrite"] / rate["llama-server"])
            print(f"pair {i + 1}: ferrite {rate['ferrite']:.2f}, llama-server "
                  f"{rate['llama-server']:.2f} tok/s, ratio {ratios[-1]:.3f}", flush=True)
        print(f"median ferrite / llama-server {statistics.median(ratios):.3f}; ferrite faster "
              f"in {sum(r > 1 for r in ratios)} of {len(ratios)} pairs")
    finally:
        for proc in procs.values():
            proc.terminate()
            proc.wait(timeout=60)


if __name__ == "__main__":
    main()
