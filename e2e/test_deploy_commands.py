"""The two commands a container uses besides `serve`: `ferrite pull` as an init step (the
same model specs as `serve --model`, nothing fetched where the model is cached, a path
checked, escapes refused) and `ferrite probe` as the health check (exit 0 only on a 200,
1 otherwise, bounded in time)."""

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

from conftest import BINARY, MODEL, free_port


def model_file():
    home = Path(os.environ.get("FERRITE_HOME", Path.home() / ".cache" / "ferrite"))
    return home / "models" / f"{MODEL}.gguf"


def ferrite(*args, env=None, timeout=60):
    return subprocess.run([str(BINARY), *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


def test_pull_finds_a_cached_model_and_checks_a_path(tmp_path):
    cached = ferrite("pull", MODEL)
    assert cached.returncode == 0, cached.stderr
    assert "already in the cache" in cached.stderr
    good = tmp_path / "model.gguf"
    shutil.copy(model_file(), good)
    by_path = ferrite("pull", str(good))
    assert by_path.returncode == 0 and str(good) in by_path.stderr, by_path.stderr
    bad = tmp_path / "notes.gguf"
    bad.write_text("not a model")
    refused = ferrite("pull", str(bad))
    assert refused.returncode == 1 and "is not a GGUF model" in refused.stderr, refused.stderr
    assert "panicked" not in refused.stderr


def test_pull_refuses_what_is_neither_a_model_nor_a_repo_id():
    # Escapes from the cache are refused by the code `serve` shares (test_hardening.py).
    for spec in ["a/b/c", "no-such-model"]:
        out = ferrite("pull", spec)
        assert out.returncode == 1, out.stderr
        assert "panicked" not in out.stderr
        assert "is not a GGUF file, a known model" in out.stderr, out.stderr


def test_probe_exits_zero_only_on_200(server):
    port = str(server.port)
    assert ferrite("probe", "--port", port).returncode == 0
    assert ferrite("probe", "--port", port, "--path", "/ready").returncode == 0
    missing = ferrite("probe", "--port", port, "--path", "/no/such/route")
    assert missing.returncode == 1 and "404" in missing.stderr, missing.stderr
    closed = ferrite("probe", "--port", str(free_port()))
    assert closed.returncode == 1 and "connecting" in closed.stderr, closed.stderr


def test_probe_gives_up_on_a_silent_server_within_its_timeout():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        port = listener.getsockname()[1]
        started = time.monotonic()
        out = ferrite("probe", "--port", str(port), "--timeout", "0.5")
        assert out.returncode == 1, out.stderr
        assert time.monotonic() - started < 5
