"""The README's set-up commands, read from its "Set up" section and run as written, so the
README cannot drift from what works: the first in a clone of this repository, up to
`/ready`, a completion and a chat answer (the README's own curl examples); the second is
the command `.ci/run` runs (this suite is part of it, so it is not run again from here)."""

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import time

import httpx

from conftest import ROOT

README = ROOT / "README.md"
# Where the README's server listens: the command takes no address, so the default one.
DEFAULT_BASE = "http://127.0.0.1:8080"


def section(title):
    """The text of the README's `## title` section."""
    text = README.read_text()
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## )", text, re.S | re.M)
    assert match, f"README.md has no '## {title}' section"
    return match.group(1)


def code_blocks(text):
    return re.findall(r"^```sh\n(.*?)^```", text, re.S | re.M)


def setup_commands():
    """The commands of the Set up section's first code block, comments dropped."""
    block = code_blocks(section("Set up"))[0]
    commands = [line.split(" #", 1)[0].strip() for line in block.splitlines()]
    return [c for c in commands if c and not c.startswith("#")]


def example_requests():
    """The Set up section's example requests (its second code block), one shell command
    each (continuation lines joined)."""
    block = code_blocks(section("Set up"))[1]
    return [c.strip() for c in block.replace("\\\n", " ").splitlines() if c.strip()]


def test_the_set_up_section_has_two_commands_and_ci_runs_the_second():
    serve, tests = setup_commands()
    assert serve.startswith("cargo run") and "serve" in serve, serve
    # .ci/run goes to the repository's root and runs the README's test command, as written.
    lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    lines = [line for line in lines if line and not line.startswith("#")]
    assert 'cd "$(dirname "$0")/.."' in lines
    assert lines[-1] in (tests, f"exec {tests}"), (lines[-1], tests)


def port_is_free(port):
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def test_the_serve_command_works_as_written_in_a_fresh_clone(tmp_path):
    serve = setup_commands()[0]
    assert port_is_free(8080), "port 8080, the README server's, is taken by something else"
    clone = tmp_path / "ferrite"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    # The working tree's changes to tracked files too, so that a change is tried before
    # it is committed (in CI the checkout is a clean clone: there are none).
    diff = subprocess.run(["git", "diff", "HEAD", "--binary"], cwd=ROOT, capture_output=True, check=True).stdout
    if diff:
        subprocess.run(["git", "apply"], cwd=clone, input=diff, check=True)
    assert not (clone / "target").exists()
    # The build goes to this checkout's target directory, so that it takes a minute or two,
    # not a fresh build's ten: the dependencies built there are reused, ferrite's own
    # crates are compiled again from the clone (under the same names: the next build in
    # the checkout compiles them again too). The binary the suite runs is put back.
    built = ROOT / "target" / "release" / "ferrite"
    saved = built.with_name("ferrite.before-readme-test")
    saved.unlink(missing_ok=True)
    os.link(built, saved)
    log = open(tmp_path / "serve.log", "wb")
    env = {**os.environ, "CARGO_TARGET_DIR": str(ROOT / "target")}
    for name in ("FERRITE_PORT", "FERRITE_HOST", "FERRITE_MODEL"):
        env.pop(name, None)
    proc = subprocess.Popen(["bash", "-c", serve], cwd=clone, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        deadline = time.time() + 1200
        while True:
            assert proc.poll() is None, f"`{serve}` exited with {proc.returncode}: {(tmp_path / 'serve.log').read_text()[-3000:]}"
            try:
                if httpx.get(f"{DEFAULT_BASE}/ready", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.time() < deadline, "the README's server was not ready within 20 minutes"
            time.sleep(0.5)
        # The README's example requests, run as written.
        completion, chat = example_requests()
        assert completion.startswith("curl") and "/v1/completions" in completion
        assert chat.startswith("curl") and "/v1/chat/completions" in chat
        out = json.loads(subprocess.run(shlex.split(completion), capture_output=True, check=True).stdout)
        assert out["object"] == "text_completion" and out["choices"][0]["text"].strip(), out
        assert out["usage"]["completion_tokens"] == 16 or out["choices"][0]["finish_reason"] == "stop"
        out = json.loads(subprocess.run(shlex.split(chat), capture_output=True, check=True).stdout)
        assert out["object"] == "chat.completion" and out["choices"][0]["message"]["content"], out
        models = httpx.get(f"{DEFAULT_BASE}/v1/models", timeout=10).json()
        assert models["data"][0]["id"] == "smollm2-135m"
    finally:
        try:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass  # it exited (its build failed): the assertion above says why
            try:
                code = proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                code = "no exit within 30 s"
            log.close()
        finally:
            os.replace(saved, built)
    assert code == 0, f"the README's server ended with {code} on SIGTERM"

