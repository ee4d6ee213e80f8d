#!/usr/bin/env python3
"""Prefill and decode speed of ferrite beside llama.cpp's llama-server on a Llama-3.2-1B-
shaped random-weight model in each weight type, in one run. Not a test.

Each model is written by `ferrite-synth --arch llama --shape 1b` (seed 0; SmolLM2's
tokenizer) into a scratch model cache as the file type says: `q4_k_m`, `q5_k_m` and `iq4_xs`
with the types `llama-quantize` gives each matrix of such a file (`--mix llama-quantize`:
Q6_K output, Q6_K or Q5_K for some value and down projections), any other name with every
weight matrix in that one type. Then both
servers are started on the same file with bench/bench.py's servers and load generator, and
stay up together while the file is measured: `--rounds` times (default 5), each server in
turn (the order alternating from round to round), a prefill (TTFT of a ~500-token prompt
that no prefix cache holds) and a decode (64 streamed tokens, single stream), each under
bench/quiet.py (the idle server sleeps). With `--ik-llama-server`, ik_llama.cpp's server
is measured the same way beside them, and with `--baseline-ferrite` another build of
ferrite (an earlier commit's `target/release/ferrite`, to see what a change did to speed).
The machine's memory bandwidth is measured before
and after (benches/memory_bandwidth.rs), and ferrite's decode is stated as the weights it
reads per second (the file's size per token: every matrix is read once per token) and as
a share of that bandwidth. This machine's speed drifts by a third within
minutes and differed by up to a fifth between two runs of the same binary started apart;
measured this way, back to back, a drift falls on both servers. Each tokens/s cell is the
median of its rounds and each ratio the median of the rounds' ratios. Prints a Markdown
table.

    cargo build --release
    python3 bench/formats.py --llama-server /path/to/llama-server \
        [--ik-llama-server /path/to/ik/llama-server] [--baseline-ferrite /path/to/ferrite] \
        [--types q4_k_m q8_0 ...]
"""

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SYNTH = ROOT / "target" / "release" / "ferrite-synth"


def measure(bench, kind, proc, url, model, work, long_prompt, round_):
    """Prefill and decode tokens/s of one running server on one model (fewer and shorter
    requests than bench.py's: some of these kernels are slow at this size)."""
    label = f"{kind}-{model}-r{round_}"
    pre = bench.loadgen(url, proc.pid, work, f"{label}-prefill",
                        ["-c", "1", "-n", "1", "--max-tokens", "1", "--stream",
                         "--vary-prompt", "--prompt-file", str(long_prompt)])
    dec = bench.loadgen(url, proc.pid, work, f"{label}-decode",
                        ["-c", "1", "-n", "1", "--max-tokens", "64", "--stream"])
    return {"prefill_tok_s": pre["prompt_tokens_per_request"] / pre["ttft_p50_s"],
            "decode_tok_s": dec["per_request_decode_tok_per_s_mean"],
            "quiet": [pre["quiet"], dec["quiet"]]}


@functools.cache
def bandwidth_binary():
    """benches/memory_bandwidth.rs built once (the first call), its executable's path: a
    run calls the binary itself, so that sources edited while a long benchmark runs can
    neither fail nor change its later measurements."""
    out = subprocess.run(["cargo", "bench", "-q", "-p", "ferrite-engine", "--bench",
                          "memory_bandwidth", "--no-run", "--message-format=json"], cwd=ROOT,
                         check=True, capture_output=True, text=True).stdout
    found = [json.loads(line).get("executable") for line in out.splitlines()
             if line.startswith("{")]
    return next(path for path in reversed(found) if path)


def memory_bandwidth():
    """The machine's read and triad bandwidth (GB/s) from benches/memory_bandwidth.rs, about
    a second."""
    out = subprocess.run([bandwidth_binary(), "--json"], cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


# The file types made as llama-quantize makes them: ferrite-synth's type and mix.
LLAMA_QUANTIZE = {"q4_k_m": "q4_k", "q5_k_m": "q5_k", "iq4_xs": "iq4_xs"}


def synth_type(name):
    """ferrite-synth's arguments for a file type of the table."""
    if name in LLAMA_QUANTIZE:
        return ["--type", LLAMA_QUANTIZE[name], "--mix", "llama-quantize"]
    return ["--type", name]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-server", required=True)
    ap.add_argument("--ik-llama-server", help="ik_llama.cpp's llama-server, measured too")
    ap.add_argument("--baseline-ferrite", help="another build of ferrite, measured too")
    ap.add_argument("--types", nargs="+", default=["q4_k_m", "q5_k_m", "q8_0", "iq4_xs", "f16"])
    ap.add_argument("--rounds", type=int, default=5, help="turns of each server per file")
    ap.add_argument("--json-out")
    args = ap.parse_args()
    home = Path(os.environ.get("FERRITE_HOME", Path.home() / ".cache" / "ferrite"))
    tokenizer = home / "models" / "smollm2-135m.gguf"
    scratch = Path(tempfile.mkdtemp(prefix="ferrite-formats-"))
    (scratch / "models").mkdir()
    # bench.py finds models (and ferrite its cache) through FERRITE_HOME.
    os.environ["FERRITE_HOME"] = str(scratch)
    sys.path.insert(0, str(HERE))
    import bench
    import loadgen as lg

    long_prompt = scratch / "long_prompt.txt"
    long_prompt.write_text(" ".join([lg.DEFAULT_PROMPT] * 5))
    table = {}
    weight_bytes = {}
    bandwidth = [memory_bandwidth()]
    for ty in args.types:
        name = f"llama1b-{ty}"
        path = scratch / "models" / f"{name}.gguf"
        subprocess.run([str(SYNTH), "--arch", "llama", "--shape", "1b", *synth_type(ty),
                        "--tokenizer-from", str(tokenizer), "--out", str(path)], check=True)
        weight_bytes[ty] = path.stat().st_size
        binaries = {"ferrite": None, "llama-server": args.llama_server}
        if args.baseline_ferrite:
            binaries["ferrite-baseline"] = args.baseline_ferrite
        if args.ik_llama_server:
            binaries["ik_llama.cpp"] = args.ik_llama_server
        kinds = list(binaries)
        servers = {}
        try:
            for kind in kinds:
                servers[kind] = bench.start_file(kind, bench.cache_path(name), binaries[kind], scratch,
                                                  ["-c", "8192"])
            rounds = {kind: [] for kind in kinds}
            for r in range(args.rounds):
                for kind in (kinds if r % 2 == 0 else kinds[::-1]):
                    print(f"measuring {kind} on {name}, round {r + 1} ...", file=sys.stderr, flush=True)
                    proc, url = servers[kind]
                    rounds[kind].append(measure(bench, kind, proc, url, name, scratch, long_prompt, r + 1))
        finally:
            for proc, _ in servers.values():
                bench.stop(proc)
        for kind, runs in rounds.items():
            table[(ty, kind)] = {
                "prefill_tok_s": statistics.median(m["prefill_tok_s"] for m in runs),
                "decode_tok_s": statistics.median(m["decode_tok_s"] for m in runs),
                "rounds": runs,
            }
        for other in kinds[1:]:
            pairs = list(zip(rounds["ferrite"], rounds[other]))
            table[(ty, f"ratio/{other}")] = {
                key: statistics.median(f[key] / l[key] for f, l in pairs)
                for key in ("prefill_tok_s", "decode_tok_s")
            }
        path.unlink()
    bandwidth.append(memory_bandwidth())
    others = [k for k in ("ferrite-baseline", "llama-server", "ik_llama.cpp")
              if (args.types[0], k) in table]
    head = ["weights (1B shape)"]
    for phase in ("prefill", "decode"):
        head.append(f"{phase} tok/s ferrite")
        for other in others:
            head += [other, "ratio"]
    head.append("ferrite decode: weights read, GB/s (of the read bandwidth)")
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    read = statistics.mean(b["read_gb_s"] for b in bandwidth)
    for ty in args.types:
        cells = [ty.upper()]
        for key in ("prefill_tok_s", "decode_tok_s"):
            cells.append(f"{table[(ty, 'ferrite')][key]:.1f}")
            for other in others:
                cells.append(f"{table[(ty, other)][key]:.1f}")
                cells.append(f"{table[(ty, f'ratio/{other}')][key]:.2f}")
        streamed = table[(ty, "ferrite")]["decode_tok_s"] * weight_bytes[ty] / 1e9
        cells.append(f"{streamed:.1f} ({streamed / read:.0%})")
        rows.append("| " + " | ".join(cells) + " |")
    rows.append("")
    rows.append("Memory read bandwidth (benches/memory_bandwidth.rs, 2 threads, before and after): "
                + ", ".join(f"{b['read_gb_s']:.1f}" for b in bandwidth) + " GB/s; triad "
                + ", ".join(f"{b['triad_gb_s']:.1f}" for b in bandwidth) + " GB/s.")
    print("\n".join(rows))
    if args.json_out:
        cells = {f"{t}/{k}": v for (t, k), v in table.items()}
        cells.update(bandwidth=bandwidth, weight_bytes=weight_bytes)
        Path(args.json_out).write_text(json.dumps(cells, indent=2))
    print(f"logs: {scratch}", file=sys.stderr)


if __name__ == "__main__":
    main()
