"""No single request can stall, starve, crash or outlive the server (issue 14): each
pathological request found by trying the server as an attacker would, against the real
binary, with the bound it must now respect asserted."""

import select
import signal
import socket
import threading
import time

import httpx
import pytest

from conftest import MODEL, Server, completion_request, error_param, post, raw, wait_for

# Another client's small request must finish within this while a pathological one runs
# (alone it takes well under a second).
FEW_SECONDS = 5.0


@pytest.fixture(scope="module")
def srv():
    s = Server(MODEL, ["--max-connections", "40", "--request-read-timeout", "2"])
    yield s
    s.stop()


def small(server):
    """Another client's 8-token request; returns its wall time."""
    started = time.monotonic()
    r = post(server, {"model": MODEL, "prompt": "1, 2, 3,", "max_tokens": 8, "temperature": 0})
    assert r.status_code == 200, r.text
    return time.monotonic() - started


def in_background(fn):
    """Runs fn on a thread; returns a getter for its result (or exception). The getter's
    `ended` is when fn returned (None while it runs)."""
    out = {}

    def run():
        try:
            out["value"] = fn()
        except Exception as e:  # noqa: BLE001 - reported by the getter
            out["error"] = e
        get.ended = time.monotonic()

    t = threading.Thread(target=run, daemon=True)

    def get(timeout=180):
        t.join(timeout)
        assert not t.is_alive(), "the background request did not finish"
        if "error" in out:
            raise out["error"]
        return out["value"]

    get.ended = None
    t.start()
    return get


def running(server):
    """Sequences the engine runs or has waiting."""
    m = server.metrics()
    return m["ferrite_requests_running"] + m["ferrite_requests_waiting"]


def small_beside(server, get):
    """Once the engine runs the background request `get` waits for, another client's small
    request: its wall time. Asserts that the background request was still unanswered when
    the small one was, so that the small one really ran beside it."""
    wait_for(lambda: running(server) >= 1, 30)
    took = small(server)
    answered = time.monotonic()
    assert get.ended is None or get.ended > answered, "the pathological request ended first"
    return took


@pytest.mark.parametrize("regex", ["a{100000}", "(a{1000}){1000}", "\uFFFD{101695}"])
def test_a_regex_that_forces_a_huge_run_is_a_400(srv, regex):
    r = post(srv, {"model": MODEL, "prompt": "x", "guided_regex": regex, "max_tokens": 4})
    assert error_param(r) == "guided_regex"
    assert "at least" in r.json()["error"]["message"]


@pytest.mark.parametrize("regex", ["a{16384}", "(a{100}){100}", "a{10000}"])
def test_a_huge_counted_repetition_neither_stalls_the_engine_nor_errs(srv, regex):
    body = {"model": MODEL, "prompt": "x", "guided_regex": regex, "max_tokens": 400}
    get = in_background(lambda: post(srv, body))
    assert small_beside(srv, get) < FEW_SECONDS
    r = get()
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert set(choice["text"]) <= {"a"}, choice["text"]
    assert choice["finish_reason"] == "length", choice


def test_tokenizing_a_megabyte_is_linear(srv):
    # A megabyte takes about four times a quarter's time (measured 2.9-5.3 here), a
    # quadratic tokenizer sixteen: the bound is on the ratio of the fastest of three runs,
    # with no absolute slack, which let a 16x regression pass wherever a quarter took under
    # 60 ms; an absolute bound only against a stall.
    def seconds(text):
        started = time.monotonic()
        r = post(srv, {"model": MODEL, "prompt": text}, path="/tokenize")
        assert r.status_code == 200, r.text[:200]
        assert r.json()["count"] > 0
        return time.monotonic() - started

    for text in ["a" * (1 << 20), " " * (1 << 20), ("The quick brown fox, 1234 naïve café 你好. " * 30000)[: 1 << 20]]:
        # Interleaved, the least of three each: noise only ever adds time.
        runs = [(seconds(text[: len(text) // 4]), seconds(text)) for _ in range(3)]
        quarter, whole = min(q for q, _ in runs), min(w for _, w in runs)
        assert whole < 8 * quarter and whole < 10, runs


def test_stop_strings_are_bounded(srv):
    huge = {"model": MODEL, "prompt": "x", "max_tokens": 2, "stop": ["a" * (1 << 20)] * 4}
    assert error_param(post(srv, huge)) == "stop"
    # The largest allowed, four 512-byte stop strings: in 16 choices another client's
    # request still runs at its usual pace; in 128 memory stays put.
    stops = [c * 512 for c in "wxyz"]
    body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 64, "n": 16,
            "stop": stops, "temperature": 1, "ignore_eos": True}
    get = in_background(lambda: post(srv, body))
    assert small_beside(srv, get) < FEW_SECONDS
    assert get().status_code == 200
    before = srv.memory_mib()
    r = post(srv, {**body, "n": 128, "max_tokens": 16})
    assert r.status_code == 200, r.text[:200]
    assert len(r.json()["choices"]) == 128
    assert srv.memory_mib() - before < 300


def test_answers_and_kv_needs_are_bounded_before_anything_runs(srv):
    echo = {"model": MODEL, "prompt": "word " * 2000, "n": 32, "max_tokens": 0, "echo": True, "logprobs": 20}
    assert error_param(post(srv, echo)) == "logprobs"
    kv = {"model": MODEL, "prompt": "x", "n": 128, "max_tokens": 2048, "ignore_eos": True}
    assert error_param(post(srv, kv)) == "n"
    one = {"model": MODEL, "prompt": "x", "max_tokens": 200_000}
    r = post(srv, {**one, "context_length_exceeded_behavior": "error"})
    assert error_param(r) == "max_tokens"


@pytest.mark.parametrize(
    "field, constraint",
    [
        ("guided_json", {"$ref": "#"}),
        ("guided_json", {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}),
        ("guided_regex", "[^\\s\\S]"),
        ("guided_grammar", 'start: x\nx: x "a"'),
    ],
)
def test_unsatisfiable_constraints_are_a_400_naming_the_field(srv, field, constraint):
    r = post(srv, {"model": MODEL, "prompt": "x", "max_tokens": 4, field: constraint})
    assert error_param(r) == field
    assert "no output" in r.json()["error"]["message"]


def test_bans_yield_to_what_the_grammar_allows(srv):
    # The empty regex allows only the end: min_tokens cannot forbid it.
    r = post(srv, {"model": MODEL, "prompt": "x", "guided_regex": "", "min_tokens": 4, "max_tokens": 8})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"] == ""
    # "\n" is token 198, also a stop token banned before min_tokens.
    r = post(srv, {
        "model": MODEL, "prompt": "x", "guided_regex": "\n", "stop_token_ids": [198],
        "min_tokens": 1, "max_tokens": 8,
    })
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["finish_reason"] == "stop"


def test_a_request_with_ten_thousand_prompts_does_not_starve_others(srv):
    body = {"model": MODEL, "prompt": ["x"] * 10_000, "max_tokens": 1, "temperature": 0}
    client = httpx.Client(timeout=300)
    before = srv.metrics()["ferrite_generation_tokens_total"]
    get = in_background(lambda: client.post(f"{srv.base}/v1/completions", json=body))
    # Once its prompts are being served (the counters move), the small ones go beside them.
    wait_for(lambda: srv.metrics()["ferrite_generation_tokens_total"] > before + 10, 60)
    for _ in range(3):
        assert small(srv) < FEW_SECONDS
    r = get(timeout=300)
    assert r.status_code == 200, r.text[:200]
    assert len(r.json()["choices"]) == 10_000


def test_streams_keep_their_pace_while_a_long_prompt_is_prefilled(srv):
    long_prompt = "hello world " * 4000  # 8,000 tokens
    started = srv.metrics()["ferrite_prompt_tokens_total"]
    long = raw(srv, completion_request({"model": MODEL, "prompt": long_prompt, "max_tokens": 1}), read=False)
    # Its prefill has begun when the prompt-token counter moves.
    wait_for(lambda: srv.metrics()["ferrite_prompt_tokens_total"] > started, 60)
    prefilled = srv.metrics()["ferrite_prompt_tokens_total"]
    gaps = []
    try:
        with httpx.stream(
            "POST", f"{srv.base}/v1/completions", timeout=120,
            json={"model": MODEL, "prompt": "Once upon a time", "max_tokens": 40,
                  "ignore_eos": True, "stream": True, "temperature": 0},
        ) as r:
            last = None
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    now = time.monotonic()
                    if last is not None:
                        gaps.append(now - last)
                    last = now
        # The long prompt was being prefilled all along.
        assert srv.metrics()["ferrite_prompt_tokens_total"] - prefilled > 500
    finally:
        long.close()  # the long prompt is cancelled
    # Its cancellation takes effect once the step in flight (up to 512 of its tokens) ends;
    # until then the next test's requests would queue behind it (one measured 5.1 s for 8
    # tokens on a busy machine).
    wait_for(lambda: srv.metrics()["ferrite_requests_running"] == 0, 30)
    print(f"worst inter-token gap during a long prefill: {max(gaps):.3f} s")
    assert len(gaps) >= 39
    assert max(gaps) <= 1.0, max(gaps)


def test_a_huge_declared_body_is_a_413_at_once(srv):
    started = time.monotonic()
    head = (
        b"POST /v1/completions HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\n"
        b"content-length: 10000000000\r\n\r\n"
    )
    s = raw(srv, head, read=False)
    s.settimeout(5)
    answer = s.recv(65536)
    s.close()
    assert answer.startswith(b"HTTP/1.1 413"), answer[:100]
    assert time.monotonic() - started < 2


def test_slow_and_idle_connections_are_closed_and_connections_are_bounded(srv):
    # Slowloris: half a request's headers, then nothing. The server closes them after
    # --request-read-timeout (2 s) and serves others meanwhile.
    opened = time.monotonic()
    sockets = [raw(srv, b"POST /v1/completions HTTP/1.1\r\nhost: localhost\r\n", read=False) for _ in range(30)]
    assert small(srv) < FEW_SECONDS
    # Each is closed by the server (readable: end of file or a 408) within the timeout
    # and a margin, none before the timeout.
    pending, closed_at = list(sockets), []
    while pending and time.monotonic() < opened + 2 + 3:
        ready, _, _ = select.select(pending, [], [], max(0.0, opened + 5 - time.monotonic()))
        for s in ready:
            assert closed_by_server(s)
            closed_at.append(time.monotonic() - opened)
            pending.remove(s)
    for s in sockets:
        s.close()
    assert not pending, f"{len(pending)} of 30 slow connections still open after 5 s"
    assert min(closed_at) >= 1.9, f"closed after {min(closed_at):.2f} s, before the 2 s timeout"
    # Past --max-connections (40) one more connection is refused with a clean 503: once
    # the server holds 40, the next is. A probe served instead means a slot was free: the
    # held ones are not all accepted yet, or one of them came while a slow connection's
    # slot was still being given back (the client sees the close a moment before the
    # server's task ends) and was itself refused. Then one more is held, and the next
    # probe tried.
    partial = b"GET /health HTTP/1.1\r\nhost: localhost\r\n"
    held = [raw(srv, partial, read=False) for _ in range(40)]
    answers = []

    def refused():
        answers.append(raw(srv, b"GET /health HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\r\n"))
        if answers[-1].startswith(b"HTTP/1.1 503"):
            return True
        assert answers[-1].startswith(b"HTTP/1.1 200"), answers[-1][:200]
        held.append(raw(srv, partial, read=False))
        return False

    wait_for(refused, 5)
    assert b"too_many_connections" in answers[-1]
    for s in held:
        s.close()
    # Their slots are free again: a new client is served.
    wait_for(lambda: raw(srv, b"GET /health HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\r\n")
             .startswith(b"HTTP/1.1 200"), 5)
    assert small(srv) < FEW_SECONDS


def closed_by_server(s):
    """Whether the server closed this connection (with or without a 408 first)."""
    s.settimeout(1)
    try:
        data = s.recv(1024)
        return data == b"" or data.startswith(b"HTTP/1.1 408")
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False


def test_keys_are_trimmed_the_scheme_is_case_insensitive_and_openapi_is_protected():
    s = Server(MODEL, ["--api-key", " padded "])
    try:
        url = f"{s.base}/v1/models"
        for value in ["Bearer padded", "BEARER padded", "bearer padded"]:
            assert httpx.get(url, headers={"authorization": value}).status_code == 200, value
        assert httpx.get(url, headers={"authorization": "Bearer other"}).status_code == 401
        assert httpx.get(f"{s.base}/openapi.json").status_code == 401
        assert httpx.get(f"{s.base}/openapi.json", headers={"x-api-key": "padded"}).status_code == 200
        assert httpx.get(f"{s.base}/health").status_code == 200
    finally:
        s.stop()


@pytest.mark.parametrize(
    "body",
    [
        {"prompt": "x", "guided_regex": "a{16384}", "max_tokens": 2000, "ignore_eos": True},
        {"prompt": "a" * (1 << 20), "max_tokens": 1},
        {"prompt": "x", "max_tokens": 4000, "n": 16, "stop": ["q" * 512] * 4, "ignore_eos": True},
        {"prompt": ["x"] * 10_000, "max_tokens": 1},
        {"prompt": "hello world " * 4000, "max_tokens": 1},
        {"prompt": "word " * 500, "n": 8, "max_tokens": 0, "echo": True, "logprobs": 20},
    ],
    ids=["grammar", "tokenize", "stop-strings", "many-prompts", "long-prefill", "echo-logprobs"],
)
def test_sigterm_during_a_pathological_request_exits_zero_within_grace_plus_four(body):
    # The documented bound (README's --shutdown-grace, RELIABILITY.md, deploy/README.md):
    # exit status 0 at most 4 s after the grace, whatever still runs.
    grace, margin = 2, 4
    s = Server(MODEL, ["--shutdown-grace", str(grace)])
    try:
        get = in_background(lambda: post(s, {"model": MODEL, **body}, timeout=60))
        # Signalled once the server holds the request (in flight from its arrival to its
        # answer: tokenized, queued or running), and before it was answered.
        wait_for(lambda: s.metrics()["ferrite_http_requests_in_flight"] >= 1, 30)
        started = time.monotonic()
        assert get.ended is None, "the request was answered before the signal"
        s.proc.send_signal(signal.SIGTERM)
        code = s.proc.wait(timeout=grace + margin + 5)
        exited = time.monotonic() - started
        assert code == 0
        assert exited <= grace + margin, f"exited {exited:.2f} s after SIGTERM"
        # It was still running at the signal: its answer (a 503, or a closed connection)
        # came after it.
        try:
            get(timeout=30)
        except httpx.HTTPError:
            pass
        assert get.ended > started
    finally:
        if s.proc.poll() is None:
            s.proc.kill()
        s.log.close()


def test_grammars_that_would_recurse_too_deep_are_refused_not_fatal(server):
    # llguidance compiles a $ref chain or a chain of Lark rules depth-first: 400 links
    # overflowed a 2 MiB stack and aborted the process (found by a hostile-client probe of
    # the chat route; completions had it too). Now measured first: a 400 naming the field.
    n = 20000
    defs = {f"A{i}": {"type": "object", "properties": {"a": {"$ref": f"#/$defs/A{i + 1}"}}} for i in range(n)}
    defs[f"A{n}"] = {"type": "string"}
    chain = {"$ref": "#/$defs/A0", "$defs": defs}
    rules = "start: r0\n" + "".join(f"r{i}: \"a\" r{i + 1}\n" for i in range(n)) + f"r{n}: \"b\"\n"
    base = {"model": "smollm2-135m", "max_tokens": 2}
    for path, body, field in [
        ("/v1/completions", {"prompt": "x", "guided_json": chain}, "guided_json"),
        ("/v1/completions", {"prompt": "x", "guided_grammar": rules}, "guided_grammar"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "response_format":
            {"type": "json_schema", "json_schema": {"name": "x", "schema": chain}}}, "response_format"),
    ]:
        r = httpx.post(f"{server.base}{path}", json={**base, **body}, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["param"] == field, r.text
    # A chain well within the limit still compiles (on the compiler's own deep stack).
    ok = {"$ref": "#/$defs/A0", "$defs": {**{k: v for k, v in defs.items() if int(k[1:]) < 300}, "A300": {"type": "string"}}}
    r = httpx.post(f"{server.base}/v1/completions", json={**base, "prompt": "x", "guided_json": ok}, timeout=60)
    assert r.status_code == 200, r.text
    assert httpx.get(f"{server.base}/health", timeout=5).status_code == 200
