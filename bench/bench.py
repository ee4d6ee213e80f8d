#!/usr/bin/env python3
"""Side-by-side benchmark of ferrite and llama.cpp's llama-server on the same machine,
model and load, in one run. Not a test: it measures and prints a Markdown table.

For each model and server: prefill (TTFT of a ~500-token prompt, 1 new token), single-
stream decode (128 tokens), and streaming load at concurrency 1, 4 and 16 (103-token
prompts, 128 new tokens each): aggregate decode throughput and TTFT p50, and the server's
peak RSS after the 16-stream run. Every measurement runs under bench/quiet.py,
which waits for an idle machine and reports foreign CPU use; only runs it calls clean are
kept (it retries otherwise). Prints issue 5's table (ratios ferrite / llama-server against
their targets) and, with matplotlib installed, writes a plot of throughput and TTFT
against concurrency.

    python3 bench/bench.py --llama-server /path/to/llama-server [--models smollm2-135m gemma3-270m]
        [--json-out bench.json] [--plot BENCHMARKS.png]
"""

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOOLS = ROOT / "bench"
FERRITE = ROOT / "target" / "release" / "ferrite"


def cache_path(name):
    home = Path(os.environ.get("FERRITE_HOME", Path.home() / ".cache" / "ferrite"))
    return home / "models" / f"{name}.gguf"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url, path, proc, timeout=180):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited early ({proc.returncode})")
        try:
            with urllib.request.urlopen(url + path, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.3)
    raise RuntimeError("server did not become ready")


def start(kind, model, llama_server, log_dir):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = open(log_dir / f"{kind}-{model}.log", "wb")
    if kind == "ferrite":
        # The cached file itself, so that any file in the cache (a generated 1B shape, say)
        # is served as llama-server serves it, not only the names ferrite can fetch.
        cmd = [str(FERRITE), "serve", "--model", str(cache_path(model)), "--port", str(port)]
        ready = "/ready"
    else:
        cmd = [llama_server, "-m", str(cache_path(model)), "--port", str(port), "-t", "2",
               "-np", "16", "-c", "32768"]
        ready = "/health"
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    wait_ready(url, ready, proc)
    return proc, url


def start_file(kind, path, binary, log_dir, llama_args, ferrite_args=()):
    """A server on the model file `path`: ferrite with its defaults and `ferrite_args` (a
    kind whose name starts with `ferrite`; the build at `binary` when given, else this
    checkout's), or a llama.cpp-style server at `binary` (llama.cpp's or ik_llama.cpp's) on
    2 threads with `llama_args`."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = open(log_dir / f"{kind}-{path.stem}-{port}.log", "wb")
    if kind.startswith("ferrite"):
        cmd = [binary or str(FERRITE), "serve", "--model", str(path), "--port", str(port),
               *ferrite_args]
        ready = "/ready"
    else:
        cmd, ready = [binary, "-m", str(path), "--port", str(port), "-t", "2", *llama_args], "/health"
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    wait_ready(url, ready, proc, timeout=600)
    return proc, url


def loadgen(url, pid, out_dir, label, args):
    out = out_dir / f"{label}.json"
    cmd = [sys.executable, str(TOOLS / "quiet.py"), "--exclude-pid", str(pid), "--retries", "3", "--",
           sys.executable, str(TOOLS / "loadgen.py"), "--url", url, "--model", "default",
           "--json-out", str(out), *args]
    res = subprocess.run(cmd, capture_output=True, text=True)
    quiet_lines = [l for l in (res.stdout + res.stderr).splitlines() if "foreign" in l.lower()]
    if res.returncode != 0 or not out.exists():
        raise RuntimeError(f"{label} failed:\n{res.stdout}\n{res.stderr}")
    summary = json.loads(out.read_text())
    summary["quiet"] = quiet_lines[-1] if quiet_lines else ""
    print(f"  {label}: {summary['quiet']}", file=sys.stderr, flush=True)
    if summary["failed"]:
        raise RuntimeError(f"{label}: {summary['failed']} failed requests: {summary['errors']}")
    return summary


LOAD_LEVELS = [(1, 2), (4, 4), (16, 16)]

# Issue 5's targets: (figure, key, target, higher is better).
TARGETS = [
    ("prefill tok/s, ~512-token prompt", "prefill_tok_s", 1.2, True),
    ("single-stream decode tok/s", "decode_tok_s", 1.1, True),
    ("aggregate decode tok/s, 16 streams x 128 tokens", "load_c16_tok_s", 1.5, True),
    ("TTFT p50 at 16 streams", "ttft_p50_c16_s", 0.8, False),
    ("peak RSS at 16 streams", "peak_rss_mib", 1.0, False),
]


def peak_rss_mib(pid):
    """The process's peak resident set (VmHWM), in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def plot(table, models, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot", file=sys.stderr)
        return
    fig, axes = plt.subplots(len(models), 2, figsize=(10, 4 * len(models)), squeeze=False)
    levels = [c for c, _ in LOAD_LEVELS]
    for row, model in enumerate(models):
        for kind, style in (("ferrite", "o-"), ("llama-server", "s--")):
            r = table[(model, kind)]
            axes[row][0].plot(levels, [r[f"load_c{c}_tok_s"] for c in levels], style, label=kind)
            axes[row][1].plot(levels, [r[f"ttft_p50_c{c}_s"] for c in levels], style, label=kind)
        axes[row][0].set(title=f"{model}: aggregate decode", xlabel="concurrent streams", ylabel="tokens/s")
        axes[row][1].set(title=f"{model}: time to first token (p50)", xlabel="concurrent streams", ylabel="seconds")
        for ax in axes[row]:
            ax.set_xscale("log", base=2)
            ax.set_xticks(levels, [str(c) for c in levels])
            ax.legend()
            ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    print(f"plot written to {path}", file=sys.stderr)


def measure(kind, model, llama_server, work, long_prompt, with_load):
    proc, url = start(kind, model, llama_server, work)
    try:
        results = {}
        pre = loadgen(url, proc.pid, work, f"{kind}-{model}-prefill",
                      ["-c", "1", "-n", "5", "--max-tokens", "1", "--stream", "--vary-prompt",
                       "--prompt-file", str(long_prompt)])
        results["quiet"] = {}
        results["quiet"]["prefill"] = pre["quiet"]
        results["prefill_tok_s"] = pre["prompt_tokens_per_request"] / pre["ttft_p50_s"]
        results["prefill_prompt_tokens"] = pre["prompt_tokens_per_request"]
        dec = loadgen(url, proc.pid, work, f"{kind}-{model}-decode",
                      ["-c", "1", "-n", "4", "--max-tokens", "128", "--stream"])
        results["quiet"]["decode"] = dec["quiet"]
        results["decode_tok_s"] = dec["per_request_decode_tok_per_s_mean"]
        if with_load:
            loads = concurrency_loads(url, proc.pid, work, f"{kind}-{model}")
            results["quiet"].update(loads.pop("quiet"))
            results.update(loads)
        return results
    finally:
        stop(proc)


def concurrency_loads(url, pid, work, label):
    """The loads at each of LOAD_LEVELS (103-token prompts, 128 new tokens each): aggregate
    decode tok/s and TTFT p50 per level, then the server's peak RSS."""
    results = {"quiet": {}}
    for c, n in LOAD_LEVELS:
        s = loadgen(url, pid, work, f"{label}-c{c}",
                    ["-c", str(c), "-n", str(n), "--max-tokens", "128", "--vary-prompt", "--stream"])
        results["quiet"][f"c{c}"] = s["quiet"]
        results[f"load_c{c}_tok_s"] = s["aggregate_tok_per_s"]
        results[f"ttft_p50_c{c}_s"] = s["ttft_p50_s"]
    results["peak_rss_mib"] = peak_rss_mib(pid)
    return results


def stop(proc):
    """Stops a server with SIGTERM (kills one that has not stopped 20 s later)."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-server", required=True, help="path to llama.cpp's llama-server")
    ap.add_argument("--models", nargs="+", default=["smollm2-135m", "gemma3-270m"])
    ap.add_argument("--json-out", help="write all figures here")
    ap.add_argument("--plot", help="write the throughput/TTFT plot (PNG) here")
    args = ap.parse_args()
    assert FERRITE.exists(), "build first: cargo build --release"
    work = Path(tempfile.mkdtemp(prefix="ferrite-bench-"))
    sys.path.insert(0, str(TOOLS))
    import loadgen as lg  # the default 103-token prompt, repeated for prefill

    long_prompt = work / "long_prompt.txt"
    long_prompt.write_text(" ".join([lg.DEFAULT_PROMPT] * 5))
    table = {}
    for model in args.models:
        for kind in ("ferrite", "llama-server"):
            print(f"measuring {kind} on {model} ...", file=sys.stderr, flush=True)
            table[(model, kind)] = measure(kind, model, args.llama_server, work, long_prompt,
                                           with_load=True)
    rows = ["| model | figure | ferrite | llama-server | ferrite / llama | target | met |",
            "|---|---|---|---|---|---|---|"]
    for model in args.models:
        f, l = table[(model, "ferrite")], table[(model, "llama-server")]
        for label, key, target, higher in TARGETS:
            ratio = f[key] / l[key]
            met = ratio >= target if higher else ratio <= target
            bound = ">=" if higher else "<="
            rows.append(f"| {model} | {label} | {f[key]:.2f} | {l[key]:.2f} | {ratio:.2f} "
                        f"| {bound} {target} | {'yes' if met else 'no'} |")
        for c, _ in LOAD_LEVELS[:-1]:
            key = f"load_c{c}_tok_s"
            rows.append(f"| {model} | aggregate decode tok/s, {c} stream(s) | {f[key]:.2f} | {l[key]:.2f} "
                        f"| {f[key] / l[key]:.2f} | | |")
    print("\n".join(rows))
    if args.plot:
        plot(table, args.models, args.plot)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({f"{m}/{k}": v for (m, k), v in table.items()}, indent=2))
    print(f"logs and raw loadgen summaries: {work}", file=sys.stderr)


if __name__ == "__main__":
    main()
