#!/usr/bin/env bash
# The cargo-fuzz targets, built and run briefly from their seeds, so that they keep
# compiling and a finding that the seeds reach at once fails the suite. Long runs are in
# RELIABILITY.md. Installs cargo-fuzz when it is missing; needs the models in the cache
# (the `constraint` target tokenizes with SmolLM2's vocabulary; `chat_request` renders
# with both models' chat templates and tokenizers).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${FERRITE_FUZZ_SMOKE_SECONDS:-10}"

if ! cargo fuzz --version >/dev/null 2>&1; then
  cargo install cargo-fuzz --version 0.13.2 --locked
fi

# One cargo-fuzz project (`libfuzzer/`) holds every target, so the engine and its
# dependencies are compiled and instrumented once.
target="$PWD/target/fuzz"
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT

# Built unoptimized (`--dev`; libfuzzer/Cargo.toml's dev profile): on two cores the build
# took 4.3 minutes against 8.7 for the optimized one that long runs use, and runs 15-40
# times fewer inputs a second (the constraint target 192 against 3,034 in 20 s), which a
# smoke run can spare: its point is the seeds, and what they reach at once. The constraint
# target's own limit on one input's grammar work (3 s optimized) and libFuzzer's are
# raised to match.
run() {
  local name="$1"
  shift
  mkdir -p "$scratch/$name"
  # New inputs go to the scratch folder; the committed seeds are only read.
  cargo fuzz run --dev --fuzz-dir libfuzzer --sanitizer none --target-dir "$target" "$name" \
    "$scratch/$name" "libfuzzer/corpus/$name" -- -max_total_time="$seconds" "$@" 2>&1 | tail -n 20
}

run gguf
FERRITE_FUZZ_WALL_LIMIT_SECS=30 run constraint -timeout=60
run request
run chat_request
