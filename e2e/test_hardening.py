"""Production hardening against the real binary: request limits (413, 400), a bounded
waiting queue (429 with Retry-After), KV-cache pressure, cancellation, timeouts, request
ids and JSON logs, Prometheus metrics on their own port, and bad model files."""

import json
import os
import re
import subprocess
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest

from conftest import BINARY, MODEL, ROOT, Server, free_port

METRICS = [
    "ferrite_requests_total",
    "ferrite_requests_running",
    "ferrite_requests_waiting",
    "ferrite_prompt_tokens_total",
    "ferrite_generation_tokens_total",
    "ferrite_time_to_first_token_seconds",
    "ferrite_inter_token_latency_seconds",
    "ferrite_request_duration_seconds",
    "ferrite_kv_cache_usage_ratio",
    "ferrite_requests_cancelled_total",
]


@pytest.fixture(scope="module")
def limited():
    s = Server(
        MODEL,
        [
            "--max-running", "1",
            "--max-waiting", "2",
            "--max-body-size", "4096",
            "--max-prompt-tokens", "64",
            "--max-request-tokens", "300",
            "--log-format", "json",
        ],
        metrics_port=free_port(),
    )
    yield s
    s.stop()


def post(server, body, **kw):
    return httpx.post(f"{server.base}/v1/completions", json=body, timeout=120, **kw)


def body(**kw):
    return {"model": MODEL, "prompt": "1, 2, 3,", "max_tokens": 8, "temperature": 0, **kw}


def concurrently(count, request):
    """Runs request(i) for i in 0..count on threads at once; their results in order."""
    results = [None] * count

    def run(i):
        results[i] = request(i)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    return results


# ---- limits -----------------------------------------------------------------------------


def test_a_body_over_the_limit_gets_413(limited):
    r = post(limited, body(prompt="x" * 5000))
    assert r.status_code == 413
    assert r.json()["error"]["type"] == "invalid_request_error"
    assert "4096 bytes" in r.json()["error"]["message"]
    assert post(limited, body()).status_code == 200


def test_too_many_prompt_tokens_get_400(limited):
    r = post(limited, body(prompt=[[1] * 40, [2] * 30]))
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "prompt"
    assert "at most 64" in r.json()["error"]["message"]


def test_too_many_requested_tokens_get_400(limited):
    r = post(limited, body(n=4, max_tokens=76))
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "max_tokens"
    ok = post(limited, body(n=3, max_tokens=4))
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 12


def test_a_full_queue_gets_429_and_every_accepted_request_completes(limited):
    results = concurrently(8, lambda i: post(limited, body(prompt=f"{i}, {i + 1},", max_tokens=60, ignore_eos=True)))
    statuses = [r.status_code for r in results]
    assert set(statuses) <= {200, 429}, statuses
    assert statuses.count(429) >= 1, statuses
    # The first is admitted at once (or waits), another waits, the rest may find the
    # queue full until the first finishes.
    assert statuses.count(200) >= 2, statuses
    for r in results:
        if r.status_code == 429:
            assert r.headers["retry-after"].isdigit()
            error = r.json()["error"]
            assert (error["type"], error["code"]) == ("rate_limit_error", "server_overloaded")
        else:
            assert r.json()["usage"]["completion_tokens"] == 60
            assert r.json()["choices"][0]["finish_reason"] == "length"


def test_the_sdk_sees_429_as_a_rate_limit_error(limited):
    client = openai.OpenAI(base_url=f"{limited.base}/v1", api_key="x", max_retries=0, timeout=60)
    long = dict(model=MODEL, prompt="1, 2,", max_tokens=250, stream=True, extra_body={"ignore_eos": True})
    # One running (its first token seen, so it has left the queue), then two waiting.
    streams = [client.completions.create(**long)]
    try:
        next(iter(streams[0]))
        streams += [client.completions.create(**long) for _ in range(2)]
        with pytest.raises(openai.RateLimitError) as e:
            client.completions.create(model=MODEL, prompt="Hi", max_tokens=1)
        # The SDK reads Retry-After to pace its retries.
        assert e.value.response.headers["retry-after"] == "1"
        assert e.value.code == "server_overloaded"
    finally:
        for s in streams:
            s.close()


# ---- metrics, request ids, logs -----------------------------------------------------------


def test_metrics_live_on_their_own_port(limited):
    assert httpx.get(f"{limited.base}/metrics").status_code == 404
    text = httpx.get(f"{limited.metrics_base}/metrics").text
    assert "ferrite_ready 1" in text


def parse_metrics(text):
    """Prometheus text to {name: value}, labels kept in the name; checks the format."""
    values, typed = {}, set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            assert kind in ("counter", "gauge", "histogram"), line
            typed.add(name)
        elif line and not line.startswith("#"):
            m = re.fullmatch(r'([a-z_]+)(\{[a-z_]+="[^"]*"\})? (\S+)', line)
            assert m, f"not a Prometheus sample: {line!r}"
            base = re.sub(r"_(bucket|sum|count)$", "", m[1])
            assert m[1] in typed or base in typed, f"{m[1]} has no TYPE line"
            values[m[1] + (m[2] or "")] = float(m[3])
    return values, typed


def test_every_metric_is_present_and_moves(limited):
    # Counted from a quiet server: streams the tests before this one closed must have
    # been noticed (and counted cancelled) before the first snapshot.
    deadline = time.time() + 10
    while time.time() < deadline:
        before, _ = parse_metrics(httpx.get(f"{limited.metrics_base}/metrics").text)
        if before["ferrite_requests_running"] == 0 and before["ferrite_requests_waiting"] == 0:
            break
        time.sleep(0.02)
    assert before["ferrite_requests_running"] == 0 and before["ferrite_requests_waiting"] == 0, before
    client = openai.OpenAI(base_url=f"{limited.base}/v1", api_key="x", max_retries=0, timeout=60)
    chunks = list(client.completions.create(model=MODEL, prompt="Count: 1, 2,", max_tokens=20, stream=True, extra_body={"ignore_eos": True}))
    assert chunks
    # One running and one waiting, then both cancelled.
    long = dict(model=MODEL, prompt="1, 2,", max_tokens=250, stream=True, extra_body={"ignore_eos": True})
    first = client.completions.create(**long)
    next(iter(first))
    second = client.completions.create(**long)
    busy = None
    deadline = time.time() + 10
    while time.time() < deadline:
        busy, _ = parse_metrics(httpx.get(f"{limited.metrics_base}/metrics").text)
        if busy["ferrite_requests_running"] == 1 and busy["ferrite_requests_waiting"] == 1:
            break
        time.sleep(0.02)
    assert busy["ferrite_requests_running"] == 1 and busy["ferrite_requests_waiting"] == 1, busy
    assert 0 < busy["ferrite_kv_cache_usage_ratio"] <= 1
    first.close()
    second.close()
    deadline = time.time() + 5
    while time.time() < deadline:
        after, typed = parse_metrics(httpx.get(f"{limited.metrics_base}/metrics").text)
        if after["ferrite_requests_running"] == 0 and after["ferrite_requests_waiting"] == 0:
            break
        time.sleep(0.02)
    for name in METRICS:
        assert name in typed, f"{name} is missing"
    moved = lambda name: after[name] - before.get(name, 0)
    # The two streams closed midway count as disconnected, not as answered.
    assert moved('ferrite_requests_total{status="200"}') >= 1
    assert moved('ferrite_requests_total{status="disconnected"}') == 2
    assert moved("ferrite_prompt_tokens_total") > 0
    assert moved("ferrite_generation_tokens_total") >= 21
    assert moved("ferrite_time_to_first_token_seconds_count") >= 2
    assert moved("ferrite_inter_token_latency_seconds_count") >= 19
    assert moved("ferrite_request_duration_seconds_count") >= 1
    assert moved("ferrite_requests_cancelled_total") == 2
    assert after["ferrite_requests_running"] == 0 and after["ferrite_kv_cache_usage_ratio"] == 0
    assert after['ferrite_time_to_first_token_seconds_bucket{le="+Inf"}'] == after["ferrite_time_to_first_token_seconds_count"]


def test_request_ids_are_echoed_and_logged_as_json(limited):
    r = post(limited, body(), headers={"x-request-id": "soak-id-42"})
    assert r.headers["x-request-id"] == "soak-id-42"
    fresh = post(limited, body()).headers["x-request-id"]
    assert re.fullmatch(r"[0-9a-f]{32}", fresh)
    time.sleep(0.2)
    lines = [json.loads(l) for l in Path(limited.log.name).read_text().splitlines() if l.startswith("{")]
    mine = [l for l in lines if l.get("span", {}).get("id") == "soak-id-42"]
    assert any(l["fields"].get("message") == "request finished" and l["fields"]["status"] == 200 for l in mine), mine


# ---- cancellation and timeouts ------------------------------------------------------------


def wait_until_idle(server, seconds):
    deadline = time.time() + seconds
    while time.time() < deadline:
        m = server.metrics()
        if m["ferrite_requests_running"] == 0:
            return m
        time.sleep(0.02)
    return server.metrics()


def test_a_disconnected_non_streaming_client_frees_its_sequence(server):
    before = server.metrics()
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            f"{server.base}/v1/completions",
            json=body(max_tokens=3000, ignore_eos=True),
            timeout=1.0,
        )
    gone = time.time()
    m = wait_until_idle(server, 1.0)
    assert m["ferrite_requests_running"] == 0, f"still running {time.time() - gone:.2f} s after the client left"
    assert m["ferrite_requests_cancelled_total"] == before["ferrite_requests_cancelled_total"] + 1
    assert m["ferrite_generation_tokens_total"] - before["ferrite_generation_tokens_total"] < 3000


@pytest.fixture(scope="module")
def tight():
    # The timeout only bounds the test: the queued requests wait for two 40-token runs,
    # about a second on a fast machine and two on a slow one (an AVX2-only Zen 3).
    s = Server(MODEL, ["--request-timeout", "30", "--kv-budget", "100", "--max-running", "8"])
    yield s
    s.stop()


@pytest.fixture(scope="module")
def timed():
    s = Server(MODEL, ["--request-timeout", "2"])
    yield s
    s.stop()


def test_the_server_request_timeout_ends_long_requests(timed):
    tight = timed
    started = time.time()
    r = post(tight, body(max_tokens=3000, ignore_eos=True))
    assert r.status_code == 504, r.text
    assert r.json()["error"]["type"] == "timeout_error"
    assert time.time() - started < 10
    with httpx.stream("POST", f"{tight.base}/v1/completions", json=body(max_tokens=3000, ignore_eos=True, stream=True), timeout=30) as s:
        events = [l[6:] for l in s.iter_lines() if l.startswith("data: ")]
    assert json.loads(events[-1])["error"]["type"] == "timeout_error"


def test_kv_cache_pressure_queues_instead_of_failing(tight):
    # --kv-budget 100: each request reserves its prompt plus 40 positions, so two run at
    # once and the others wait for them (all four at once would reserve about 180).
    seen = []
    done = threading.Event()

    def watch():
        while not done.is_set():
            m = tight.metrics()
            seen.append((m["ferrite_requests_running"], m["ferrite_requests_waiting"],
                         m["ferrite_kv_cache_usage_ratio"]))
            time.sleep(0.005)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        results = concurrently(4, lambda i: post(tight, body(prompt=f"{i} {i}", max_tokens=40, ignore_eos=True)))
    finally:
        done.set()
        watcher.join()
    assert [r.status_code for r in results] == [200] * 4, [r.text for r in results]
    assert all(r.json()["usage"]["completion_tokens"] == 40 for r in results)
    assert max(running for running, _, _ in seen) == 2, seen
    assert max(waiting for _, waiting, _ in seen) >= 1, "nothing waited for KV room"
    assert max(ratio for _, _, ratio in seen) <= 1.0


# ---- bad model files ----------------------------------------------------------------------


def model_file():
    home = Path(os.environ.get("FERRITE_HOME", Path.home() / ".cache" / "ferrite"))
    return home / "models" / f"{MODEL}.gguf"


def serve_fails(model):
    p = subprocess.run(
        [str(BINARY), "serve", "--model", str(model), "--port", str(free_port())],
        capture_output=True, text=True, timeout=120,
    )
    output = p.stdout + p.stderr
    assert p.returncode == 1, output
    assert "panicked" not in output, output
    return output


def test_bad_model_files_give_a_clear_error(tmp_path):
    truncated = tmp_path / "truncated.gguf"
    with open(model_file(), "rb") as f:
        truncated.write_bytes(f.read(3 << 20))
    out = serve_fails(truncated)
    assert str(truncated) in out and "is the file truncated?" in out, out
    garbage = tmp_path / "garbage.gguf"
    garbage.write_bytes(os.urandom(4096))
    out = serve_fails(garbage)
    assert str(garbage) in out and "not a valid GGUF file" in out, out


def gguf_bytes(metadata, tensors=()):
    """A GGUF v3 file: string or string-list metadata; tensors as (name, dims, type id, data)."""
    import struct

    def string(s):
        b = s.encode()
        return struct.pack("<Q", len(b)) + b

    out = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(metadata))
    for key, value in metadata.items():
        out += string(key)
        if isinstance(value, list):
            out += struct.pack("<IIQ", 9, 8, len(value)) + b"".join(string(v) for v in value)
        else:
            out += struct.pack("<I", 8) + string(value)
    offset = 0
    for name, dims, kind, data in tensors:
        out += string(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        out += struct.pack("<IQ", kind, offset)
        offset += -(-len(data) // 32) * 32
    out += bytes(-len(out) % 32)
    for *_, data in tensors:
        out += data + bytes(-len(data) % 32)
    return out


TOKENIZER = {
    "tokenizer.ggml.model": "gpt2",
    "tokenizer.ggml.tokens": ["a", "b", "ab"],
    "tokenizer.ggml.merges": ["a b"],
}


def test_unknown_architectures_and_tensor_types_give_a_clear_error(tmp_path):
    unknown_arch = tmp_path / "mamba.gguf"
    unknown_arch.write_bytes(gguf_bytes({"general.architecture": "mamba9", **TOKENIZER}))
    out = serve_fails(unknown_arch)
    assert str(unknown_arch) in out and "architecture `mamba9`" in out, out
    unknown_type = tmp_path / "quant.gguf"
    unknown_type.write_bytes(gguf_bytes({"general.architecture": "llama", **TOKENIZER},
                                        [("token_embd.weight", [32, 3], 99, bytes(96))]))
    out = serve_fails(unknown_type)
    assert str(unknown_type) in out and "99" in out, out


def test_model_names_cannot_escape_the_cache():
    for name in ["../../no/such/model", "owner/repo:../../escape.gguf"]:
        out = serve_fails(name)
        assert "error" in out.lower() and ("not a GGUF file" in out), out
        # `ferrite pull` (a container's init step) takes the same specs, with the same rules.
        pulled = subprocess.run([str(BINARY), "pull", name], capture_output=True, text=True,
                                timeout=60)
        assert pulled.returncode == 1 and "panicked" not in pulled.stderr, pulled.stderr
        assert "not a GGUF file" in pulled.stderr, pulled.stderr
