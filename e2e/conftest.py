"""Starts the release binary on the default model for the end-to-end tests."""

import json
import os
import socket
import subprocess
import time
from pathlib import Path

import httpx
import openai
import pytest

ROOT = Path(__file__).resolve().parent.parent
# FERRITE_BIN runs the suite against another build (an older one, to see a test fail on
# the behaviour it guards against).
BINARY = Path(os.environ.get("FERRITE_BIN", ROOT / "target" / "release" / "ferrite"))
MODEL = "smollm2-135m"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(predicate, seconds=10):
    """Polls until `predicate()` holds (a state the server reports, not a guessed delay);
    fails the test when it does not within `seconds`."""
    deadline = time.time() + seconds
    while time.time() < deadline:
        if predicate():
            return
        time.sleep(0.01)
    assert predicate(), f"the server did not get there within {seconds} s"


def post(server, body, path="/v1/completions", timeout=120, **kw):
    """POSTs `body` as JSON to one of `server`'s routes."""
    return httpx.post(f"{server.base}{path}", json=body, timeout=timeout, **kw)


def error_param(r, status=400):
    """The `param` of an OpenAI-style `invalid_request_error` answer with `status`."""
    assert r.status_code == status, r.text[:300]
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error", err
    return err["param"]


def completion_request(body: dict) -> bytes:
    """An HTTP/1.1 POST of `body` to /v1/completions, as bytes for a socket."""
    data = json.dumps(body).encode()
    return (b"POST /v1/completions HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n" % len(data) + data)


def raw(server, data: bytes, read=True):
    """Sends `data` on a new connection; returns what came back until the server closed
    it or went quiet for 10 s, or the open socket when not `read`."""
    s = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    s.sendall(data)
    if not read:
        return s
    out = b""
    try:
        while chunk := s.recv(65536):
            out += chunk
    except socket.timeout:
        pass
    s.close()
    return out


class Server:
    """A running `ferrite serve` process."""

    def __init__(self, model, extra_args=(), env=None, metrics_port=None, inherit_env=True):
        """`model` None serves without `--model` (the default model); `env` adds to this
        process's environment, or replaces it with `inherit_env=False`."""
        assert BINARY.exists(), f"{BINARY} is missing: run `cargo build --release` first"
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.model = model  # as given: a name, a path, or None for the default
        self.metrics_base = self.base
        if metrics_port is not None:
            self.metrics_base = f"http://127.0.0.1:{metrics_port}"
            extra_args = [*extra_args, "--metrics-port", str(metrics_port)]
        label = Path(model).name if model else "default"
        self.log = open(ROOT / "target" / f"e2e-{label}-{self.port}.log", "wb")
        model_args = ["--model", model] if model is not None else []
        self.proc = subprocess.Popen(
            [str(BINARY), "serve", *model_args, "--port", str(self.port), *extra_args],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env={**(os.environ if inherit_env else {}), **(env or {})},
        )
        deadline = time.time() + 120
        while time.time() < deadline:
            assert self.proc.poll() is None, f"ferrite exited early; see {self.log.name}"
            try:
                if httpx.get(f"{self.base}/ready", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.proc.kill()
        self.proc.wait()
        self.log.close()
        raise AssertionError(f"ferrite did not become ready in 120 s; see {self.log.name}")

    def memory_mib(self, key="VmRSS") -> float:
        """A memory figure of the process's /proc status (`VmRSS`, `VmHWM`), in MiB."""
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) / 1024
        raise AssertionError(f"no {key}")

    def metrics(self) -> dict:
        text = httpx.get(f"{self.metrics_base}/metrics", timeout=5).text
        values = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, value = line.split()
                values[name] = float(value)
        return values

    def stop(self):
        """SIGTERM; a server that does not then exit 0 within 20 s fails the test."""
        self.proc.terminate()
        try:
            code = self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = "no exit within 20 s"
        finally:
            self.log.close()
        assert code == 0, f"ferrite ended with {code} on SIGTERM; see {self.log.name}"


@pytest.fixture(scope="session")
def server():
    s = Server(MODEL)
    yield s
    s.stop()


@pytest.fixture(scope="session")
def client(server):
    return openai.OpenAI(base_url=f"{server.base}/v1", api_key="unused", max_retries=0, timeout=120)
