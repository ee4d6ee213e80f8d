#!/usr/bin/env python3
"""The container image's steps, run outside a container and checked, where no container
builder can run (CI has no daemon and no base images): what the Dockerfile says is what
this runs.

    python3 deploy/image/smoke.py [--build]      (--build: run deploy/image/build.sh first)

From the Dockerfile it reads the build stage's `RUN ... build.sh DEST` and the runtime
stage's `ENV`, `USER`, `EXPOSE`, `ENTRYPOINT`, `CMD`, `STOPSIGNAL` and `HEALTHCHECK`, then:

1. runs the build script into a staging folder (with `--build`; TARGET_CPU as set, the
   test suite uses `native` to reuse its own build) and checks that the binary needs no
   shared library beyond glibc's and libgcc's, which the Debian runtime image has;
2. lays out the volume the image declares (a temporary FERRITE_HOME holding the cached
   model, as the init step's `ferrite pull` leaves it) and runs the pull step on it: it
   must find the model there and fetch nothing;
3. starts the entry point with the image's environment, as the image's user (setpriv) when
   this runs as root, as CI does (otherwise as the caller), with an API key from a file as
   the Kubernetes Secret mounts it;
4. checks the health-check command (exit 0 once up), `/health`, `/ready`, the metrics
   the deploy manifests scale and route on, a completion with the key and a 401 without;
5. sends the stop signal and checks a clean exit (status 0) within the grace period.
"""

import argparse
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"

# Libraries the runtime image (debian:bookworm-slim) provides.
ALLOWED_LIBRARIES = {"linux-vdso.so.1", "libgcc_s.so.1", "libm.so.6", "libc.so.6",
                     "ld-linux-x86-64.so.2", "libpthread.so.0", "libdl.so.2", "librt.so.1"}



def manifest_metrics():
    """The ferrite metric names the manifests use (HPA, KEDA, prometheus-adapter, the
    endpoint picker): each must be a gauge, as the autoscalers and the inference gateway's
    model server protocol read them (deploy/README.md, "Metrics")."""
    names = set()
    for path in (ROOT / "deploy" / "kubernetes").rglob("*.yaml"):
        names |= set(re.findall(r"\bferrite_[a-z_]+\b", path.read_text()))
    return sorted(names)


def stages(text):
    """The Dockerfile's instructions per stage: {name: [(instruction, argument)]}."""
    text = re.sub(r"\\\n", " ", text)
    out, current = {}, None
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        word, _, rest = line.partition(" ")
        word = word.upper()
        if word == "FROM":
            m = re.match(r"(\S+)(?:\s+AS\s+(\S+))?", rest, re.IGNORECASE)
            current = m.group(2) or m.group(1)
            out[current] = [("FROM", m.group(1))]
        elif current is not None:
            out[current].append((word, rest.strip()))
    return out


def instructions(stage_map, name, word):
    """`word`'s arguments in stage `name` and the stages it is built FROM."""
    found = []
    while name in stage_map:
        steps = stage_map[name]
        found = [arg for w, arg in steps if w == word] + found
        name = steps[0][1]
    return found


def env_of(stage_map, name):
    env = {}
    for arg in instructions(stage_map, name, "ENV"):
        for pair in shlex.split(arg):
            key, _, value = pair.partition("=")
            env[key] = value
    return env


def exec_form(arg):
    """A JSON-array (exec form) argument, as a list."""
    value = json.loads(arg)
    assert isinstance(value, list) and all(isinstance(v, str) for v in value), arg
    return value


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(url, data=None, headers=None):
    request = urllib.request.Request(url, data=data, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def check(condition, message):
    if not condition:
        sys.exit(f"FAILED: {message}")
    print(f"ok: {message}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", action="store_true", help="run deploy/image/build.sh first")
    ap.add_argument("--model", default="smollm2-135m", help="a model in the ferrite cache")
    args = ap.parse_args()

    stage_map = stages(DOCKERFILE.read_text())
    runtime = list(stage_map)[-1]
    check(runtime == "runtime", "the Dockerfile's last (default) stage is `runtime`")
    build_runs = [a for a in instructions(stage_map, "build", "RUN") if "build.sh" in a]
    check(len(build_runs) == 1, "the build stage runs deploy/image/build.sh")
    copies = [a for a in instructions(stage_map, runtime, "COPY") if "--from=build" in a]
    check(copies == ["--from=build /out/ferrite /usr/local/bin/ferrite"],
          "the runtime stage copies the built binary and nothing else from the build")
    env = env_of(stage_map, runtime)
    user = instructions(stage_map, runtime, "USER")[-1]
    uid, _, gid = user.partition(":")
    check(uid.isdigit() and int(uid) != 0, f"the image runs as a non-root user ({user})")
    entrypoint = exec_form(instructions(stage_map, runtime, "ENTRYPOINT")[-1])
    cmd = exec_form(instructions(stage_map, runtime, "CMD")[-1])
    exposed = instructions(stage_map, runtime, "EXPOSE")
    check(exposed == [env["FERRITE_PORT"]], "EXPOSE declares the port FERRITE_PORT sets")
    health = instructions(stage_map, runtime, "HEALTHCHECK")[-1]
    health_cmd = exec_form(health.split("CMD", 1)[1].strip())
    check(instructions(stage_map, runtime, "STOPSIGNAL") == ["SIGTERM"], "STOPSIGNAL is SIGTERM")
    pull_cmd = exec_form(instructions(stage_map, "pull", "CMD")[-1])

    with tempfile.TemporaryDirectory(prefix="ferrite-image-") as tmp:
        tmp = Path(tmp)
        staged = tmp / "out"
        if args.build:
            subprocess.run([str(ROOT / "deploy/image/build.sh"), str(staged)], check=True)
        else:
            staged.mkdir()
            shutil.copy2(ROOT / "target/release/ferrite", staged / "ferrite")
        binary = staged / "ferrite"
        libraries = set(re.findall(r"^\s*(\S+)", subprocess.run(
            ["ldd", str(binary)], capture_output=True, text=True, check=True).stdout, re.M))
        check({Path(lib).name for lib in libraries} <= ALLOWED_LIBRARIES,
              f"the binary needs only glibc and libgcc ({sorted(libraries)})")

        # The image's paths, mapped onto this machine: the binary's, and the volume's.
        def mapped(arg):
            return (arg.replace("/usr/local/bin/ferrite", str(binary))
                    .replace(env["FERRITE_HOME"], str(tmp / "volume")))

        volume = tmp / "volume"
        (volume / "models").mkdir(parents=True)
        cache = Path(os.environ.get("FERRITE_HOME", Path.home() / ".cache/ferrite"))
        model_file = cache / "models" / f"{args.model}.gguf"
        check(model_file.is_file(), f"{args.model} is in the cache ({model_file})")
        # A copy, not a link: its owner and mode change below, the cache's must not.
        shutil.copy2(model_file, volume / "models" / model_file.name)
        secret = tmp / "secret"
        secret.mkdir()
        (secret / "api-key").write_text("smoke-test-key\n")
        port = free_port()
        run_env = {k: mapped(v) for k, v in env.items()}
        run_env.update(PATH=os.environ["PATH"], FERRITE_PORT=str(port),
                       FERRITE_MODEL=args.model,
                       FERRITE_API_KEY_FILE=str(secret / "api-key"),
                       # No network: a fetch attempt must fail, not hang.
                       FERRITE_PYTHON="/nonexistent/python3")
        as_user = []
        if os.geteuid() == 0:
            for path in (tmp, volume, volume / "models", secret):
                os.chown(path, int(uid), int(gid or uid))
            for path in [volume / "models" / model_file.name, secret / "api-key"]:
                os.chmod(path, 0o644)
            os.chmod(tmp, 0o755)
            as_user = ["setpriv", f"--reuid={uid}", f"--regid={gid or uid}", "--clear-groups"]

        # The init step: the model is already in the volume, so pull fetches nothing.
        pull_argv = as_user + [mapped(a) for a in entrypoint] + [pull_cmd[0], args.model]
        pulled = subprocess.run(pull_argv, env=run_env, capture_output=True, text=True,
                                timeout=60)
        check(pulled.returncode == 0 and "already in the cache" in pulled.stderr,
              f"the pull step finds {args.model} in the volume and fetches nothing")

        argv = as_user + [mapped(a) for a in entrypoint + cmd]
        print("starting:", " ".join(argv))
        log = open(tmp / "server.log", "wb")
        server = subprocess.Popen(argv, env=run_env, stdout=log, stderr=subprocess.STDOUT,
                                  cwd=volume)
        base = f"http://127.0.0.1:{port}"
        try:
            probe = as_user + [mapped(a) for a in health_cmd]
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                if server.poll() is not None:
                    sys.exit(f"FAILED: the server exited ({server.returncode}):\n"
                             + (tmp / "server.log").read_text())
                if subprocess.run(probe, env=run_env, capture_output=True).returncode == 0:
                    break
                time.sleep(0.5)
            check(subprocess.run(probe, env=run_env).returncode == 0,
                  "the HEALTHCHECK command succeeds once the server is up")
            ready = as_user + [str(binary), "probe", "--path", "/ready"]
            while subprocess.run(ready, env=run_env, capture_output=True).returncode != 0:
                check(time.monotonic() < deadline, "the server gets ready")
                time.sleep(0.5)
            check(http(base + "/health")[0] == 200 and http(base + "/ready")[0] == 200,
                  "/health and /ready answer 200")
            status, text = http(base + "/metrics")
            names = manifest_metrics()
            check(len(names) >= 3, f"the manifests name ferrite's metrics ({names})")
            for name in names:
                check(status == 200 and f"# TYPE {name} gauge" in text,
                      f"/metrics has {name}, named in deploy/kubernetes, as a gauge, without a key")
            body = json.dumps({"model": args.model, "prompt": "Hello", "max_tokens": 4,
                               "temperature": 0}).encode()
            json_type = {"Content-Type": "application/json"}
            status, _ = http(base + "/v1/completions", body, json_type)
            check(status == 401, "a completion without the key gets 401")
            status, text = http(base + "/v1/completions", body,
                                dict(json_type, Authorization="Bearer smoke-test-key"))
            check(status == 200 and json.loads(text)["usage"]["completion_tokens"] == 4,
                  "a completion with the key from the secret file")
            logs = (tmp / "server.log").read_text().splitlines()
            check(any(line.startswith("{") for line in logs) and all(
                json.loads(line) for line in logs if line.startswith("{")),
                "logs are JSON lines (FERRITE_LOG_FORMAT=json)")
            server.send_signal(signal.SIGTERM)
            # Nothing runs: the drain is immediate, whatever the grace.
            code = server.wait(timeout=30)
            check(code == 0, "SIGTERM: the server drains and exits with status 0")
        finally:
            if server.poll() is None:
                server.kill()
    print("image smoke test passed")


if __name__ == "__main__":
    main()
