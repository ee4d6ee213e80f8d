#!/usr/bin/env python3
"""Prefill and decode speed of ferrite beside llama.cpp's llama-server on a Llama-3.2-1B-
shaped random-weight model in each weight type, in one run. Not a test.

Each model is written by `ferrite-synth --arch llama --shape 1b --type T` (every weight
matrix in that type; seed 0; SmolLM2's tokenizer) into a scratch model cache, then both
servers are measured on the same file the way bench/bench.py measures them (prefill: TTFT
of a ~500-token prompt; decode: 128 streamed tokens, single stream), each measurement
under bench/quiet.py. Prints a Markdown table of tokens/s and ratios.

    cargo build --release
    python3 bench/formats.py --llama-server /path/to/llama-server [--types q4_k q8_0 ...]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SYNTH = ROOT / "target" / "release" / "ferrite-synth"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-server", required=True)
    ap.add_argument("--types", nargs="+", default=["q4_k", "q5_k", "q8_0", "iq4_xs", "f16"])
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
    for ty in args.types:
        name = f"llama1b-{ty}"
        path = scratch / "models" / f"{name}.gguf"
        subprocess.run([str(SYNTH), "--arch", "llama", "--shape", "1b", "--type", ty,
                        "--tokenizer-from", str(tokenizer), "--out", str(path)], check=True)
        for kind in ("ferrite", "llama-server"):
            print(f"measuring {kind} on {name} ...", file=sys.stderr, flush=True)
            table[(ty, kind)] = bench.measure(kind, name, args.llama_server, scratch, long_prompt,
                                              with_load=False)
        path.unlink()
    rows = ["| weights (1B shape) | prefill tok/s ferrite | llama-server | ratio "
            "| decode tok/s ferrite | llama-server | ratio |", "|---|---|---|---|---|---|---|"]
    for ty in args.types:
        f, l = table[(ty, "ferrite")], table[(ty, "llama-server")]
        rows.append(f"| {ty.upper()} | {f['prefill_tok_s']:.1f} | {l['prefill_tok_s']:.1f} "
                    f"| {f['prefill_tok_s'] / l['prefill_tok_s']:.2f} | {f['decode_tok_s']:.2f} "
                    f"| {l['decode_tok_s']:.2f} | {f['decode_tok_s'] / l['decode_tok_s']:.2f} |")
    print("\n".join(rows))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({f"{t}/{k}": v for (t, k), v in table.items()}, indent=2))
    print(f"logs: {scratch}", file=sys.stderr)


if __name__ == "__main__":
    main()
