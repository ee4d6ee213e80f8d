#!/usr/bin/env python3
"""Every speed target of issue 19 measured in one run, on one machine, with the same model
files for every server: ferrite, llama.cpp's llama-server and ik_llama.cpp's. Not a test:
it prints one Markdown table (each target, the figures behind it, the ratio, met or not)
and writes a plot. It takes about half an hour on 2 cores.

The models: SmolLM2-135M and Gemma 3 270M (the real files from ferrite's model cache) and
a Llama-3.2-1B-shaped Q4_K_M file with random weights (`ferrite-synth`, as
bench/formats.py makes it). What is measured, in this order:

1. memory bandwidth (benches/memory_bandwidth.rs; the read ceiling is the larger of its
   one-stream and four-stream reads);
2. per model, the servers up side by side: prefill of a ~525-token prompt (three
   requests) and single-stream decode (two of 128 tokens), `--rounds` times (default 5),
   the servers taking turns in an order that alternates; each figure is the median of its
   rounds, and each prefill or decode ratio the median of the rounds' ratios, as
   bench/formats.py takes them (this machine's memory bandwidth moves between about 33
   and 63 GB/s within minutes: a round's servers run back to back, so a drift falls on
   them alike, where a ratio of medians could pair one server's fast round with the
   other's slow one). On the 1B file the memory bandwidth is also measured right before
   each of ferrite's decodes, and the share of the read ceiling is the median of the
   rounds' shares. Then, one server after the other, bench.py's loads (aggregate decode
   and TTFT at 1, 4 and 16 streams) and each one's peak RSS; ik_llama.cpp on the 1B file
   only, where its targets are;
3. per model, long prompts: time to the first token of a unique ~512- and ~4,096-token
   prompt, best of three, per prompt token, on ferrite and llama-server (one slot, 8,192
   tokens of context);
4. prompt lookup on the real models (bench/lookup.py's copying, code-editing and
   extraction workloads, three rounds, answers identical);
5. memory bandwidth again.

Runs bench/quiet.py calls contended are retried.

With `--ferrite-before BINARY` (an earlier build of ferrite), that build joins the 1B file's
paired rounds, loads and long prompts as a fourth server, and the table adds the 1B rows of
this build against it: a restructuring's "within noise of before", measured in the same run.

    cargo build --release
    pip install -r bench/requirements.txt      # matplotlib, for the plot
    python3 bench/targets.py --llama-server /path/to/llama-server \\
        --ik-llama-server /path/to/ik_llama.cpp/build/bin/llama-server \\
        [--ferrite-before /path/to/older/ferrite] [--models llama1b-q4_k_m] \\
        [--plot bench-targets.png] [--json-out targets.json]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench  # noqa: E402
import formats  # noqa: E402
import long_prompts  # noqa: E402
import lookup  # noqa: E402

REAL = ["smollm2-135m", "gemma3-270m"]
ONE_B = "llama1b-q4_k_m"
# Paragraphs of long_prompts.PARAGRAPH (about 51 tokens each) for the two prompt lengths.
SHORT_REPEATS, LONG_REPEATS = 10, 80
LOOKUP_WORKLOADS = ["copy a paragraph", "edit code", "extract sentences"]
# The 1B figures compared with `--ferrite-before`: (key, label, higher is better, unit).
BEFORE_ROWS = [("prefill_tok_s", "prefill", True, "tok/s"),
               ("decode_tok_s", "single-stream decode", True, "tok/s"),
               ("load_c16_tok_s", "16-stream aggregate decode", True, "tok/s"),
               ("ttft_p50_c16_s", "TTFT p50 at 16 streams", False, "s"),
               ("peak_rss_mib", "peak RSS at 16 streams", False, "MiB")]
# "Within noise": this machine's paired rounds of one build against itself spread by a few
# per cent (BENCHMARKS-history.md), so a build within 5% of the one before is called unchanged.
BEFORE_NOISE = 0.95


def loads(servers, path, work, long_prompt, rounds, ceilings):
    """bench.py's figures for each server (`kind: binary`) on one model. The servers run
    side by side: prefill and single-stream decode are measured `rounds` times, the
    servers taking turns (the order alternating), each round's figures kept (`rounds`)
    and each figure the median of its rounds; with `ceilings`, the memory's read ceiling
    is measured right before each of ferrite's decodes (ferrite's `ceiling_gb_s`). Then
    the loads at 1, 4 and 16 streams, one server after the other, and each one's peak
    RSS."""
    up = {}
    try:
        for kind, binary in servers.items():
            up[kind] = bench.start_file(kind, path, binary, work, ["-np", "16", "-c", "32768"])
        rates = {kind: {"prefill_tok_s": [], "decode_tok_s": []} for kind in up}
        if ceilings:
            rates["ferrite"]["ceiling_gb_s"] = []
        for r in range(rounds):
            for kind in (list(up) if r % 2 == 0 else list(up)[::-1]):
                proc, url = up[kind]
                label = f"{kind}-{path.stem}-r{r + 1}"
                pre = bench.loadgen(url, proc.pid, work, f"{label}-prefill",
                                    ["-c", "1", "-n", "3", "--max-tokens", "1", "--stream",
                                     "--vary-prompt", "--prompt-file", str(long_prompt)])
                if ceilings and kind == "ferrite":
                    rates[kind]["ceiling_gb_s"].append(ceiling(formats.memory_bandwidth()))
                dec = bench.loadgen(url, proc.pid, work, f"{label}-decode",
                                    ["-c", "1", "-n", "2", "--max-tokens", "128", "--stream"])
                rates[kind]["prefill_tok_s"].append(pre["prompt_tokens_per_request"] / pre["ttft_p50_s"])
                rates[kind]["decode_tok_s"].append(dec["per_request_decode_tok_per_s_mean"])
        out = {}
        for kind, (proc, url) in up.items():
            out[kind] = {key: statistics.median(values) for key, values in rates[kind].items()}
            out[kind]["rounds"] = rates[kind]
            out[kind].update(bench.concurrency_loads(url, proc.pid, work, f"{kind}-{path.stem}"))
        return out
    finally:
        for proc, _ in up.values():
            bench.stop(proc)


def first_token_ms(url, repeats, tag, llama):
    """Milliseconds per prompt token to the first token of a unique prompt of `repeats`
    paragraphs (long_prompts.py's request with one new token), and the prompt's length."""
    prompt = f"{tag} {time.time()} " + long_prompts.PARAGRAPH * repeats
    seconds, tokens = long_prompts.timed(url, prompt, llama, new_tokens=1)
    return seconds * 1000 / tokens, tokens


def long_prompt_costs(kind, path, binary, work):
    """Best of three ms per prompt token at both prompt lengths, after a warm-up."""
    proc, url = bench.start_file(kind, path, binary, work, ["-np", "1", "-c", "8192"])
    try:
        llama = not kind.startswith("ferrite")
        first_token_ms(url, 2, "warm-up", llama)
        out = {}
        for name, repeats in (("short", SHORT_REPEATS), ("long", LONG_REPEATS)):
            runs = [first_token_ms(url, repeats, f"{kind}-{k}", llama) for k in range(3)]
            out[f"{name}_ms_per_token"] = min(ms for ms, _ in runs)
            out[f"{name}_tokens"] = runs[0][1]
            print(f"  {kind} {path.stem} {name}: {[round(ms, 3) for ms, _ in runs]} ms/token "
                  f"({runs[0][1]} tokens)", file=sys.stderr, flush=True)
        return out
    finally:
        bench.stop(proc)


def lookup_speedups(model, work):
    """bench/lookup.py's comparison of the workloads whose output repeats the input."""
    servers = {"without": lookup.start(model, [], work, "without"),
               "with": lookup.start(model, ["--prompt-lookup", "8"], work, "with")}
    try:
        return {name: lookup.compare(servers, f"{model} / {name}", lookup.WORKLOADS[name], 3)
                for name in LOOKUP_WORKLOADS}
    finally:
        for proc, _ in servers.values():
            bench.stop(proc)


def ceiling(bandwidth):
    """The read ceiling of one bandwidth measurement, GB/s."""
    return max(bandwidth["read_gb_s"], bandwidth["read_4_streams_gb_s"])


def paired_ratio(ours, other, key):
    """The median of the rounds' ratios of `key` (ferrite's figures `ours` against another
    server's), where both kept their rounds; the ratio of the medians otherwise."""
    a, b = ours.get("rounds", {}).get(key), other.get("rounds", {}).get(key)
    if a and b and len(a) == len(b):
        return statistics.median(x / y for x, y in zip(a, b))
    return ours[key] / other[key]


def rows_of(results):
    """The table's rows: (target, figures, ratio, bound, met)."""
    rows = []
    load, longp = results["load"], results["long"]

    def add(target, figures, ratio, bound, higher):
        met = ratio >= bound if higher else ratio <= bound
        rows.append((target, figures, ratio, (">= " if higher else "<= ") + f"{bound:g}", met))

    for model in results["models"]:
        f, l = load[f"{model}/ferrite"], load[f"{model}/llama-server"]
        for key, label, bound, higher, unit in (
                ("prefill_tok_s", "prefill", 1.2, True, "tok/s"),
                ("decode_tok_s", "single-stream decode", 1.1, True, "tok/s"),
                ("load_c16_tok_s", "16-stream aggregate decode", 1.5, True, "tok/s"),
                ("ttft_p50_c16_s", "TTFT p50 at 16 streams", 0.8, False, "s"),
                ("peak_rss_mib", "peak RSS at 16 streams", 1.0, False, "MiB")):
            add(f"{model}: {label} vs llama-server",
                f"{f[key]:.2f} / {l[key]:.2f} {unit}", paired_ratio(f, l, key), bound, higher)
    if f"{ONE_B}/ik_llama.cpp" in load:
        f, k = load[f"{ONE_B}/ferrite"], load[f"{ONE_B}/ik_llama.cpp"]
        for key, label in (("prefill_tok_s", "prefill"), ("decode_tok_s", "single-stream decode")):
            add(f"{ONE_B}: {label} vs ik_llama.cpp", f"{f[key]:.2f} / {k[key]:.2f} tok/s",
                paired_ratio(f, k, key), 1.0, True)
    if f"{ONE_B}/ferrite-before" in load:
        f, b = load[f"{ONE_B}/ferrite"], load[f"{ONE_B}/ferrite-before"]
        for key, label, higher, unit in BEFORE_ROWS:
            add(f"{ONE_B}: {label} vs the build before", f"{f[key]:.2f} / {b[key]:.2f} {unit}",
                paired_ratio(f, b, key), BEFORE_NOISE if higher else 1 / BEFORE_NOISE, higher)
        f, b = longp[f"{ONE_B}/ferrite"], longp[f"{ONE_B}/ferrite-before"]
        for length in ("short", "long"):
            key = f"{length}_ms_per_token"
            add(f"{ONE_B}: ms per prompt token of the {f[f'{length}_tokens']}-token prompt vs the "
                f"build before", f"{f[key]:.3f} / {b[key]:.3f} ms", f[key] / b[key],
                1 / BEFORE_NOISE, False)
    if ONE_B in results["models"]:
        f = load[f"{ONE_B}/ferrite"]
        gb = results["weight_bytes"] / 1e9
        streamed = f["decode_tok_s"] * gb
        per_round = f.get("rounds", {}).get("ceiling_gb_s")
        if per_round:
            # Each decode against the ceiling measured just before it.
            decodes = f["rounds"]["decode_tok_s"]
            share = statistics.median(d * gb / c for d, c in zip(decodes, per_round))
            read = f["ceiling_gb_s"]
        else:
            read = statistics.mean(ceiling(b) for b in results["bandwidth"])
            share = streamed / read
        add(f"{ONE_B}: decode's weight reads, share of the read ceiling",
            f"{streamed:.1f} / {read:.1f} GB/s", share, 0.8, True)
    for model in results["models"]:
        c = longp[f"{model}/ferrite"]
        add(f"{model}: ms per prompt token, {c['long_tokens']} against {c['short_tokens']} tokens",
            f"{c['long_ms_per_token']:.2f} / {c['short_ms_per_token']:.2f} ms",
            c["long_ms_per_token"] / c["short_ms_per_token"], 1.5, False)
    for model, workloads in results["lookup"].items():
        for name, r in workloads.items():
            add(f"{model}: prompt lookup, {name} (identical output)",
                f"{r['with']:.1f} / {r['without']:.1f} tok/s", r["ratio"], 1.5, True)
    return rows


def table(results):
    lines = ["| target | figures (ferrite / other) | ratio | target | met |",
             "|---|---|---|---|---|"]
    for target, figures, ratio, bound, met in rows_of(results):
        lines.append(f"| {target} | {figures} | {ratio:.2f} | {bound} | {'yes' if met else '**no**'} |")
    lines.append("")
    lines.append("For information, llama-server's own long-prompt ratio and the lower loads:")
    lines.append("")
    lines.append("| model | llama-server ms per prompt token, long / short | 1 stream tok/s, ferrite / "
                 "llama-server | 4 streams |")
    lines.append("|---|---|---|---|")
    for model in results["models"]:
        c = results["long"][f"{model}/llama-server"]
        f, l = results["load"][f"{model}/ferrite"], results["load"][f"{model}/llama-server"]
        lines.append(f"| {model} | {c['long_ms_per_token']:.2f} / {c['short_ms_per_token']:.2f} "
                     f"= {c['long_ms_per_token'] / c['short_ms_per_token']:.2f} "
                     f"| {f['load_c1_tok_s']:.1f} / {l['load_c1_tok_s']:.1f} "
                     f"| {f['load_c4_tok_s']:.1f} / {l['load_c4_tok_s']:.1f} |")
    lines.append("")
    lines.append("Memory bandwidth (benches/memory_bandwidth.rs, 2 threads, before and after), read "
                 "one stream / four streams per thread, triad: "
                 + "; ".join(f"{b['read_gb_s']:.1f} / {b['read_4_streams_gb_s']:.1f}, "
                             f"{b['triad_gb_s']:.1f} GB/s" for b in results["bandwidth"]) + ".")
    return "\n".join(lines)


def plot(results, path):
    """Left: each target's margin (the ratio over the target, inverted where lower is
    better: above 1 is met). Right: aggregate decode against concurrency."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot", file=sys.stderr)
        return
    rows = rows_of(results)
    fig, (left, right) = plt.subplots(1, 2, figsize=(16, 0.32 * len(rows) + 2),
                                      gridspec_kw={"width_ratios": [3, 2]})
    margins = []
    for _, _, ratio, bound, _ in rows:
        value = float(bound.split()[1])
        margins.append(ratio / value if bound.startswith(">=") else value / ratio)
    y = range(len(rows))
    left.barh(y, margins, color=["tab:green" if met else "tab:red" for *_, met in rows])
    left.axvline(1.0, color="black", linewidth=1)
    left.set_yticks(list(y), [r[0] for r in rows], fontsize=7)
    left.invert_yaxis()
    left.set_xlabel("margin over the target (ratio / target; target / ratio where lower is better)")
    left.set_title("issue 19's targets, one run")
    levels = [c for c, _ in bench.LOAD_LEVELS]
    for model in results["models"]:
        for kind, style in (("ferrite", "o-"), ("ferrite-before", "x-."), ("llama-server", "s--"),
                            ("ik_llama.cpp", "^:")):
            r = results["load"].get(f"{model}/{kind}")
            if r:
                right.plot(levels, [r[f"load_c{c}_tok_s"] for c in levels], style,
                           label=f"{model}, {kind}")
    right.set(xscale="log", xlabel="concurrent streams", ylabel="aggregate decode tokens/s",
              title="aggregate decode against concurrency")
    right.set_xticks(levels, [str(c) for c in levels])
    right.legend(fontsize=7)
    right.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    print(f"plot written to {path}", file=sys.stderr)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-server", required=True)
    ap.add_argument("--ik-llama-server", help="ik_llama.cpp's llama-server (its 1B targets)")
    ap.add_argument("--models", nargs="+", default=[*REAL, ONE_B])
    ap.add_argument("--rounds", type=int, default=5,
                    help="turns of each server at prefill and single-stream decode")
    ap.add_argument("--ferrite-before", help="an earlier ferrite build, paired with this one on "
                    "the 1B file")
    ap.add_argument("--plot", help="write the plot (PNG) here")
    ap.add_argument("--json-out", help="write every figure here")
    args = ap.parse_args()
    assert bench.FERRITE.exists() and formats.SYNTH.exists(), "build first: cargo build --release"
    home = Path(os.environ.get("FERRITE_HOME", Path.home() / ".cache" / "ferrite"))
    work = Path(tempfile.mkdtemp(prefix="ferrite-targets-"))
    paths = {}
    for model in args.models:
        if model == ONE_B:
            paths[model] = work / f"{ONE_B}.gguf"
            subprocess.run([str(formats.SYNTH), "--arch", "llama", "--shape", "1b",
                            *formats.synth_type("q4_k_m"), "--tokenizer-from",
                            str(home / "models" / "smollm2-135m.gguf"), "--out", str(paths[model])],
                           check=True)
        else:
            paths[model] = home / "models" / f"{model}.gguf"
            assert paths[model].exists(), f"{paths[model]}: run `ferrite pull {model}` first"
    import loadgen as lg  # the 103-token prompt, five times over for prefill

    long_prompt = work / "long_prompt.txt"
    long_prompt.write_text(" ".join([lg.DEFAULT_PROMPT] * 5))
    results = {"models": args.models, "load": {}, "long": {}, "lookup": {},
               "bandwidth": [formats.memory_bandwidth()]}
    for model in args.models:
        servers = {"ferrite": None, "llama-server": args.llama_server}
        if model == ONE_B and args.ik_llama_server:
            servers["ik_llama.cpp"] = args.ik_llama_server
        if model == ONE_B and args.ferrite_before:
            servers["ferrite-before"] = args.ferrite_before
        print(f"loads: {', '.join(servers)} on {model} ...", file=sys.stderr, flush=True)
        figures_of = loads(servers, paths[model], work, long_prompt, args.rounds, model == ONE_B)
        for kind, figures in figures_of.items():
            results["load"][f"{model}/{kind}"] = figures
        for kind in [k for k in servers if k in ("ferrite", "ferrite-before", "llama-server")]:
            print(f"long prompts: {kind} on {model} ...", file=sys.stderr, flush=True)
            results["long"][f"{model}/{kind}"] = long_prompt_costs(kind, paths[model], servers[kind], work)
    if ONE_B in args.models:
        results["weight_bytes"] = paths[ONE_B].stat().st_size
    for model in (m for m in args.models if m in REAL):
        results["lookup"][model] = lookup_speedups(model, work)
    results["bandwidth"].append(formats.memory_bandwidth())
    print(table(results))
    if args.plot:
        plot(results, args.plot)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(results, indent=2))
    if ONE_B in args.models:
        paths[ONE_B].unlink()
    print(f"logs and raw loadgen summaries: {work}", file=sys.stderr)


if __name__ == "__main__":
    main()
