#!/usr/bin/env python3
"""Two builds' matrix kernels measured in pairs: `benches/matmul_kernels.rs` of one commit
against the same bench of another, run alternately so that the machine's drift falls on
both. Not a test: it prints, per format and number of activation rows, each build's
median GMAC/s and the median of the rounds' ratios (new / baseline).

Build each side's bench executable (`cargo bench -p ferrite-engine --bench matmul_kernels
--no-run` prints its path; for an earlier commit, in a `git worktree` of it) and copy it
out, then:

    python3 bench/paired_kernels.py --baseline /tmp/matmul-old --new /tmp/matmul-new \\
        [--formats Q4_K,Q8_0] [--batches 1,4,16] [--rounds 8] [--threads 1]
"""

import argparse
import statistics
import subprocess


def run(binary, formats, batches, threads):
    """One run of a bench executable: {format: [GMAC/s per batch column]}."""
    args = [binary, "--threads", str(threads), "--formats", formats]
    if batches:
        args += ["--batches", batches]
    out = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    rows = {}
    for line in out.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| ") and cells[0] not in ("format", "---"):
            try:
                rows[cells[0]] = [float(c) for c in cells[1:]]
            except ValueError:
                continue
        elif line.startswith("| format"):
            header = cells[1:]
    return header, rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--baseline", required=True, help="the earlier build's bench executable")
    ap.add_argument("--new", required=True, help="the build under test's bench executable")
    ap.add_argument("--formats", default="Q4_K,Q8_0,Q6_K")
    ap.add_argument("--batches", help="activation rows per product, e.g. 1,4,16")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    runs = {"baseline": [], "new": []}
    header = None
    for r in range(args.rounds):
        order = ["baseline", "new"] if r % 2 == 0 else ["new", "baseline"]
        for side in order:
            binary = args.baseline if side == "baseline" else args.new
            header, rows = run(binary, args.formats, args.batches, args.threads)
            runs[side].append(rows)
    print(f"| format | " + " | ".join(f"{h}: baseline, new, ratio" for h in header) + " |")
    print("|---|" + "---|" * len(header))
    for fmt in runs["new"][0]:
        cells = []
        for col in range(len(header)):
            base = [rows[fmt][col] for rows in runs["baseline"]]
            new = [rows[fmt][col] for rows in runs["new"]]
            ratio = statistics.median(n / b for n, b in zip(new, base))
            cells.append(f"{statistics.median(base):.1f}, {statistics.median(new):.1f}, "
                         f"{ratio:.2f}")
        print(f"| {fmt} | " + " | ".join(cells) + " |")
    print(f"\n{args.rounds} rounds, {args.threads} thread(s), GMAC/s medians; the ratio is the "
          "median of the rounds' new / baseline")


if __name__ == "__main__":
    main()
