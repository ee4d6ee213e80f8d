#!/usr/bin/env bash
# The cargo-fuzz targets, built and run briefly from their seeds, so that they keep
# compiling and a finding that the seeds reach at once fails the suite. Long runs are in
# RELIABILITY.md. Installs cargo-fuzz when it is missing; needs the models in the cache
# (the `constraint` target tokenizes with SmolLM2's vocabulary).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${FERRITE_FUZZ_SMOKE_SECONDS:-20}"

if ! cargo fuzz --version >/dev/null 2>&1; then
  cargo install cargo-fuzz --version 0.13.2 --locked
fi

# Both fuzz projects build into one target folder, so the engine is compiled once.
target="$PWD/target/fuzz"
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT

run() {
  local crate="$1" name="$2"
  shift 2
  mkdir -p "$scratch/$name"
  # New inputs go to the scratch folder; the committed seeds are only read.
  (cd "crates/$crate" && cargo fuzz run --sanitizer none --target-dir "$target" "$name" \
    "$scratch/$name" "fuzz/corpus/$name" -- -max_total_time="$seconds" "$@" 2>&1 | tail -n 20)
}

run engine gguf
run engine constraint -timeout=10
run server request
run server chat_request
