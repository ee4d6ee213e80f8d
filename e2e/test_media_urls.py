"""Images by URL: refused unless the operator allows the host (`--allowed-media-domains`),
never fetched from a loopback or private address unless that is allowed too
(`--allow-private-media-addresses`), redirects checked like the first address, and every
fetch bounded in time (`--media-fetch-timeout`) and bytes (`--max-body-size`; headers and
chunk framing by bounds of their own, against endless ones). A fetched image gives the
same answer as the same image sent as a `data:` URI.

The image server is a local one (127.0.0.1), so the servers that fetch from it allow
private addresses, and one that does not shows the refusal."""

import http.server
import json
import ssl
import threading

import httpx
import pytest

from conftest import ROOT, Server, error_param
from test_vision import FIXTURES, images, pair

PICTURE = images.png(64, 48, 3)


class ImageHost:
    """A local HTTP server with an image, redirects, a 404, a large body and a body that
    never ends (until `close`)."""

    def __init__(self):
        self.release = threading.Event()
        self.fetched = []
        host = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def send(self, status, body=b"", headers=()):
                self.send_response(status)
                for name, value in headers:
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                host.fetched.append(self.path)
                port = self.server.server_address[1]
                if self.path == "/cat.png":
                    self.send(200, PICTURE, [("Content-Type", "image/png")])
                elif self.path == "/to-cat":
                    self.send(302, headers=[("Location", f"http://127.0.0.1:{port}/cat.png")])
                elif self.path == "/loop":
                    self.send(302, headers=[("Location", "/loop")])
                elif self.path == "/to-data":
                    self.send(302, headers=[("Location", "data:,x")])
                elif self.path == "/to-localhost":
                    self.send(302, headers=[("Location", f"http://localhost:{port}/cat.png")])
                elif self.path == "/large":
                    self.send(200, b"\0" * 300_000, [("Content-Type", "image/png")])
                elif self.path.startswith("/half"):
                    self.send(200, b"\0" * 120_000, [("Content-Type", "image/png")])
                elif self.path == "/page":
                    self.send(200, b"<html>no picture here</html>", [("Content-Type", "text/html")])
                elif self.path in ("/chunk-bomb", "/header-bomb"):
                    # An endless chunk-size line, or an endless header: the server must
                    # stop reading at its bound, not hold what it read.
                    self.wfile.write(b"HTTP/1.1 200 OK\r\n")
                    if self.path == "/chunk-bomb":
                        self.wfile.write(b"Transfer-Encoding: chunked\r\n\r\n")
                    else:
                        self.wfile.write(b"X-Padding: ")
                    try:
                        for _ in range(4096):  # 64 MiB at most
                            self.wfile.write((b"0" if self.path == "/chunk-bomb" else b"a") * 16384)
                    except OSError:
                        pass  # ferrite hung up: the point
                    self.close_connection = True
                elif self.path == "/endless":
                    self.send_response(200)
                    self.send_header("Content-Type", "image/png")
                    self.send_header("Content-Length", "150000")  # within the budget
                    self.end_headers()
                    self.wfile.write(PICTURE[:100])
                    self.wfile.flush()
                    host.release.wait(60)
                else:
                    self.send(404, b"not here")

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def url(self, path, host="127.0.0.1"):
        return f"http://{host}:{self.port}{path}"

    def close(self):
        self.release.set()
        self.server.shutdown()


class TlsHost(ImageHost):
    """The same server over TLS, with a self-signed certificate for 127.0.0.1
    (fixtures/tls/, test-only): no public root vouches for it."""

    def __init__(self):
        super().__init__()
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        tls = ROOT / "fixtures" / "tls"
        context.load_cert_chain(tls / "localhost.crt", tls / "localhost.key")
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)

    def url(self, path, host="127.0.0.1"):
        return f"https://{host}:{self.port}{path}"


@pytest.fixture(scope="module")
def host():
    h = ImageHost()
    yield h
    h.close()


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    fixture = json.loads((FIXTURES / "gemma3.json").read_text())
    return pair(tmp_path_factory.mktemp("media"), fixture)


def serve(models, *args):
    text, mmproj = models
    return Server(str(text), ["--mmproj", str(mmproj), *args])


@pytest.fixture(scope="module")
def fetching(models):
    """Fetches from 127.0.0.1 only (private addresses allowed), within 2 s and 200 kB."""
    s = serve(models, "--allowed-media-domains", "127.0.0.1", "--allow-private-media-addresses",
              "--media-fetch-timeout", "2", "--max-body-size", "200000")
    yield s
    s.stop()


def chat(server, url, **extra):
    return httpx.post(f"{server.base}/v1/chat/completions", timeout=60, json={
        "model": "default", "max_tokens": 4, "temperature": 0, "logprobs": True, "messages": [
            {"role": "user", "content": [{"type": "text", "text": "What is this?"},
                                         {"type": "image_url", "image_url": {"url": url}}]}],
        **extra})


def answer(r):
    assert r.status_code == 200, r.text
    body = r.json()
    return [(c["token"], c["logprob"]) for c in body["choices"][0]["logprobs"]["content"]], \
        body["usage"]["prompt_tokens"]


def refusal(r, field="messages[0].content[1]"):
    assert error_param(r) == field, r.text
    return r.json()["error"]["message"]


def test_a_fetched_image_gives_the_data_uris_answer(fetching, host):
    inline = answer(chat(fetching, images.data_uri(64, 48, 3)))
    assert answer(chat(fetching, host.url("/cat.png"))) == inline
    # Through a redirect to an allowed host, and on the completions route.
    assert answer(chat(fetching, host.url("/to-cat"))) == inline
    r = httpx.post(f"{fetching.base}/v1/completions", timeout=60, json={
        "model": "default", "max_tokens": 1, "prompt": "Look: <image>",
        "images": [host.url("/cat.png")]})
    assert r.status_code == 200, r.text
    tokens = httpx.post(f"{fetching.base}/tokenize", timeout=60, json={
        "model": "default", "messages": [{"role": "user", "content": [
            {"type": "text", "text": "What is this?"},
            {"type": "image_url", "image_url": {"url": host.url("/cat.png")}}]}]})
    assert tokens.status_code == 200, tokens.text
    assert tokens.json()["count"] == inline[1], "the chat route's prompt_tokens"


def test_urls_are_refused_by_a_server_that_allows_no_host(models, host):
    s = serve(models)
    try:
        before = len(host.fetched)
        assert "does not fetch image URLs" in refusal(chat(s, host.url("/cat.png")))
        r = httpx.post(f"{s.base}/v1/completions", timeout=60, json={
            "model": "default", "max_tokens": 1, "prompt": "<image>",
            "images": [host.url("/cat.png")]})
        assert "--allowed-media-domains" in refusal(r, "images[0]")
        assert len(host.fetched) == before, "nothing was fetched"
    finally:
        s.stop()


def test_private_addresses_are_refused_unless_allowed(models, host):
    s = serve(models, "--allowed-media-domains", "127.0.0.1,localhost")
    try:
        before = len(host.fetched)
        for h in ["127.0.0.1", "localhost"]:
            message = refusal(chat(s, host.url("/cat.png", h)))
            assert "non-public address" in message, message
        assert len(host.fetched) == before, "no connection was made"
    finally:
        s.stop()


def test_hosts_not_allowed_are_refused_before_and_after_a_redirect(fetching, host):
    before = len(host.fetched)
    assert "not among the media domains" in refusal(chat(fetching, host.url("/cat.png", "localhost")))
    assert len(host.fetched) == before
    # The redirect is followed only to check its target, which is refused.
    assert "not among the media domains" in refusal(chat(fetching, host.url("/to-localhost")))
    assert host.fetched[before:] == ["/to-localhost"]


@pytest.mark.parametrize("path,says", [
    ("/missing", "answered 404"),
    ("/loop", "more than 3 redirects"),
    ("/chunk-bomb", "chunked framing is malformed"),
    ("/header-bomb", "headers are too large"),
    ("/to-data", "a redirect to no http(s) URL"),
    ("/page", "is not a PNG, JPEG, WebP or GIF"),
    ("/large", "--max-body-size"),
    ("/endless", "--media-fetch-timeout"),
])
def test_failed_fetches_are_400s_naming_the_field(fetching, host, path, says):
    peak = fetching.memory_mib("VmHWM")
    r = chat(fetching, host.url(path))
    assert says in refusal(r), r.text
    # The bombs offer 64 MiB: none of it may stay in the server (its peak memory).
    assert fetching.memory_mib("VmHWM") < peak + 16, f"{path}: the server's peak memory grew"


def test_https_certificates_are_verified(fetching):
    tls = TlsHost()
    try:
        message = refusal(chat(fetching, tls.url("/cat.png")))
        assert "TLS failed" in message and "certificate" in message, message
    finally:
        tls.close()


def test_a_redirect_loop_is_followed_three_times(fetching, host):
    before = len(host.fetched)
    refusal(chat(fetching, host.url("/loop")))
    assert host.fetched[before:] == ["/loop"] * 4, "the first request and three redirects"


def test_fetching_is_bounded_per_request(fetching, host):
    """A hundred URLs are refused before any is fetched; a request's fetches share one
    deadline, and the first to fail names its field."""
    before = len(host.fetched)
    many = [{"type": "image_url", "image_url": {"url": host.url("/cat.png")}}] * 100
    r = httpx.post(f"{fetching.base}/v1/chat/completions", timeout=60, json={
        "model": "default", "max_tokens": 1, "messages": [{"role": "user", "content": many}]})
    assert error_param(r) == "messages", r.text
    assert len(host.fetched) == before
    r = httpx.post(f"{fetching.base}/v1/completions", timeout=60, json={
        "model": "default", "max_tokens": 1, "prompt": "<image> <image>",
        "images": [host.url("/endless"), host.url("/cat.png")]})
    assert "--media-fetch-timeout" in refusal(r, "images[0]")
    # 120 kB is within the 200 kB limit (and no image); two of them are not.
    assert "is not a PNG" in refusal(chat(fetching, host.url("/half")))
    r = httpx.post(f"{fetching.base}/v1/completions", timeout=60, json={
        "model": "default", "max_tokens": 1, "prompt": "<image> <image>",
        "images": [host.url("/half1"), host.url("/half2")]})
    assert "--max-body-size" in r.json()["error"]["message"], r.text
