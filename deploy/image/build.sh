#!/usr/bin/env bash
# The image's build step, run by the Dockerfile's build stage and, outside any container,
# by deploy/image/smoke.py in CI, so the two cannot drift apart.
#
#   deploy/image/build.sh DEST      builds the release binary and installs it as DEST/ferrite
#
# TARGET_CPU picks the code generation (rustc's -C target-cpu): x86-64-v3 (AVX2, every
# x86 server since 2013) by default, so one image runs on a cluster's mixed nodes. The
# matrix kernels detect AVX-512 and VNNI at run time and use them wherever they exist,
# whatever this says. `native` builds for the machine that builds (as a local `cargo
# build` does, from .cargo/config.toml), for nodes all of that one kind.
set -euo pipefail
dest=${1:?usage: build.sh DEST}
cd "$(dirname "$0")/../.."
export RUSTFLAGS="-C target-cpu=${TARGET_CPU:-x86-64-v3}"
# The whole workspace, as the test suite builds it, so CI reuses its build.
cargo build --release --locked --workspace
mkdir -p "$dest"
install -m 0755 target/release/ferrite "$dest/ferrite"
"$dest/ferrite" --version
