#!/usr/bin/env python3
"""Rolling restarts without lost requests, proven on one machine: three ferrite replicas
on loopback behind HAProxy, as a Kubernetes Service or gateway would put them.

    python3 scripts/rolling_restart.py [--model smollm2-135m] [--json-out FILE]

HAProxy health-checks each replica's `/ready` every 500 ms (a replica is out after one
failed check, back after two good ones), retries a request on another replica when the
connection fails, the answer is empty, or a draining replica answers 503 (`retry-on`,
`option redispatch`), and buffers request bodies so that a POST can be retried. That is
what a Kubernetes Service's endpoints and a gateway give ferrite: readiness takes a pod out
of rotation; a retry covers the moment before it is out.

While workers send completions without pause (a quarter of them streamed):

1. each replica in turn gets SIGTERM, drains (running requests finish, new ones get 503),
   exits, and is started again; the next waits until HAProxy sees it ready;
2. one replica gets SIGKILL: the requests it was running are lost with it, and is then
   started again.

Every request is one of a few seeded variants, each run alone on a replica before the load:
an answer whose text differs from that run's (a stream's chunks joined) fails the run,
whenever it came.

Checks, exit status 1 on any failure: no request fails during the SIGTERM restarts, every
SIGTERMed replica exits with status 0, and at the SIGKILL only requests that the killed
replica was running fail (HAProxy retries those it had not started answering); every
request sent after it succeeds. Prints the figures RELIABILITY.md quotes: requests sent,
failed and retried (HAProxy's retry and redispatch counters) per phase.
"""

import argparse
import http.client
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# FERRITE_BIN runs it against another build (to see a check fail on a deliberate break).
BINARY = Path(os.environ.get("FERRITE_BIN", ROOT / "target" / "release" / "ferrite"))

# Short prompts of a few kinds (prose, code, a list), each with a few seeds: requests keep
# coming, some stream, and each variant's answer is known from a run of it alone.
PROMPTS = ["Write a haiku about the sea:", "fn main() {", "Three primes: 2, 3,",
           "Dear diary, today", "The recipe needs flour,"]
SEEDS = [1, 2]


def variant_body(model, prompt, seed):
    """The request of one variant (its length drawn from the variant itself)."""
    return {"model": model, "prompt": prompt, "seed": seed, "temperature": 0.8,
            "max_tokens": random.Random(f"{prompt} {seed}").randint(16, 64)}


def completion_text(url, body):
    """The text of a non-streamed completion of `body`."""
    request = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as r:
        return json.load(r)["choices"][0]["text"]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def running(port):
    """How many sequences a replica is generating (its `ferrite_requests_running`)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
            text = r.read().decode()
    except OSError:
        return None
    found = re.search(r"^ferrite_requests_running (\S+)$", text, re.M)
    return int(float(found.group(1))) if found else None


def get(url, timeout=2.0):
    """The status of a GET, or None where there was no answer."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return None


class Replica:
    """One ferrite process on its own port."""

    def __init__(self, name, port, model, workdir):
        self.name, self.port, self.model = name, port, model
        self.log = open(workdir / f"{name}.log", "ab")
        self.proc = None

    def start(self):
        env = dict(os.environ, FERRITE_THREADS="1", FERRITE_SHUTDOWN_GRACE="30")
        self.proc = subprocess.Popen(
            [str(BINARY), "serve", "--model", self.model, "--port", str(self.port)],
            stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)

    def wait_ready(self, timeout=300):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                sys.exit(f"{self.name} exited while starting ({self.proc.returncode})")
            if get(f"http://127.0.0.1:{self.port}/ready") == 200:
                return
            time.sleep(0.2)
        sys.exit(f"{self.name} not ready after {timeout} s")


class HAProxy:
    """HAProxy in front of the replicas, with its runtime API on a Unix socket."""

    def __init__(self, binary, port, replicas, workdir):
        self.socket = workdir / "haproxy.sock"
        servers = "\n".join(f"    server {r.name} 127.0.0.1:{r.port} check" for r in replicas)
        config = f"""
global
    stats socket {self.socket} mode 600 level admin
    maxconn 256

defaults
    mode http
    timeout connect 2s
    timeout client 120s
    timeout server 120s
    timeout http-request 10s
    retries 3
    option redispatch 1
    retry-on conn-failure empty-response 503
    option http-buffer-request

frontend api
    bind 127.0.0.1:{port}
    default_backend ferrite

backend ferrite
    balance leastconn
    option httpchk GET /ready
    http-check expect status 200
    default-server inter 500ms fastinter 250ms downinter 500ms fall 1 rise 2
    http-response set-header X-Ferrite-Replica %s
{servers}
"""
        path = workdir / "haproxy.cfg"
        path.write_text(config)
        check = subprocess.run([binary, "-c", "-q", "-f", str(path)], capture_output=True,
                               text=True)
        if check.returncode != 0:
            sys.exit(f"haproxy rejected its configuration:\n{check.stderr}")
        self.proc = subprocess.Popen([binary, "-f", str(path)], stdout=subprocess.DEVNULL,
                                     stderr=open(workdir / "haproxy.log", "ab"))

    def command(self, line):
        for _ in range(50):
            try:
                with socket.socket(socket.AF_UNIX) as s:
                    s.connect(str(self.socket))
                    s.sendall(line.encode() + b"\n")
                    out = b""
                    while chunk := s.recv(65536):
                        out += chunk
                    return out.decode()
            except (FileNotFoundError, ConnectionRefusedError):
                time.sleep(0.1)
        sys.exit("HAProxy's runtime API did not answer")

    def stats(self):
        """Per server of the backend: status, retries and redispatches."""
        lines = self.command("show stat").splitlines()
        header = lines[0].lstrip("# ").split(",")
        rows = {}
        for line in lines[1:]:
            if not line:
                continue
            row = dict(zip(header, line.split(",")))
            if row["pxname"] == "ferrite":
                rows[row["svname"]] = row
        return rows

    def wait_status(self, server, status, timeout=60):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.stats()[server]["status"].startswith(status):
                return
            time.sleep(0.1)
        sys.exit(f"HAProxy never saw {server} {status}")


class Load:
    """Workers sending completions through HAProxy until stopped."""

    def __init__(self, url, model, workers, references):
        self.url, self.model = url, model
        self.references = references  # (prompt, seed) -> the text it got alone
        self.mismatches = []  # answers whose text differs from their variant's alone
        self.results = []  # (started, ended, ok, detail, replica)
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.threads = [threading.Thread(target=self.worker, args=(i,), daemon=True)
                        for i in range(workers)]

    def start(self):
        for t in self.threads:
            t.start()

    def stop(self):
        self.stopping.set()
        for t in self.threads:
            t.join(timeout=120)

    def worker(self, i):
        rng = random.Random(i)
        while not self.stopping.is_set():
            stream = rng.random() < 0.25
            prompt, seed = rng.choice(PROMPTS), rng.choice(SEEDS)
            body = variant_body(self.model, prompt, seed) | {"stream": stream}
            started = time.monotonic()
            ok, detail, replica = self.send(body, stream)
            if ok and detail != self.references[prompt, seed]:
                # A wrong answer is never a lost one: it fails the run whenever it came.
                with self.lock:
                    self.mismatches.append(f"{replica}: {detail!r}, alone {self.references[prompt, seed]!r}")
            with self.lock:
                self.results.append((started, time.monotonic(), ok, detail, replica))

    def send(self, body, stream):
        request = urllib.request.Request(
            self.url + "/v1/completions", data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"})
        replica = None
        try:
            with urllib.request.urlopen(request, timeout=120) as r:
                replica = r.headers.get("X-Ferrite-Replica")
                raw = r.read().decode()
            if stream:
                events = [line[6:] for line in raw.splitlines() if line.startswith("data: ")]
                if not events or events[-1] != "[DONE]":
                    return False, "stream ended without [DONE]", replica
                if any('"error"' in e for e in events[:-1]):
                    return False, "error event in the stream", replica
                chunks = [json.loads(e)["choices"] for e in events[:-1]]
                return True, "".join(c[0]["text"] for c in chunks if c), replica
            choice = json.loads(raw)["choices"][0]
            if choice["finish_reason"] not in ("length", "stop"):
                return False, f"finish_reason {choice['finish_reason']}", replica
            return True, choice["text"], replica
        except urllib.error.HTTPError as e:
            return False, f"HTTP {e.code}", e.headers.get("X-Ferrite-Replica")
        except (OSError, ValueError, KeyError, http.client.HTTPException) as e:
            return False, f"{type(e).__name__}: {e}", replica


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--replicas", type=int, default=3)
    ap.add_argument("--workers", type=int, default=6, help="concurrent requests")
    ap.add_argument("--haproxy", default=shutil.which("haproxy") or "/usr/sbin/haproxy")
    ap.add_argument("--settle", type=float, default=3.0,
                    help="seconds of load between restarts")
    ap.add_argument("--json-out")
    args = ap.parse_args()
    if not Path(args.haproxy).exists():
        sys.exit("haproxy not found (Debian: apt-get install haproxy)")

    workdir = Path(tempfile.mkdtemp(prefix="ferrite-rolling-"))
    replicas = [Replica(f"r{i + 1}", free_port(), args.model, workdir)
                for i in range(args.replicas)]
    for r in replicas:
        r.start()
    for r in replicas:
        r.wait_ready()
    front = free_port()
    proxy = HAProxy(args.haproxy, front, replicas, workdir)
    for r in replicas:
        proxy.wait_status(r.name, "UP")
    first = f"http://127.0.0.1:{replicas[0].port}"
    references = {(p, seed): completion_text(first, variant_body(args.model, p, seed))
                  for p in PROMPTS for seed in SEEDS}
    load = Load(f"http://127.0.0.1:{front}", args.model, args.workers, references)
    failures = []
    report = {"replicas": args.replicas, "workers": args.workers, "restarts": []}
    try:
        load.start()
        load_started = time.monotonic()
        time.sleep(args.settle)
        before = proxy.stats()

        # Phase 1: SIGTERM each replica in turn, as a rolling update does.
        term_start = time.monotonic()
        for r in replicas:
            busy = running(r.port)
            sent = time.monotonic()
            print(f"SIGTERM {r.name} at {sent - load_started:.2f} s", flush=True)
            r.proc.send_signal(signal.SIGTERM)
            code = r.proc.wait(timeout=60)
            exited = time.monotonic()
            report["restarts"].append({"replica": r.name, "exit_status": code,
                                       "running_at_sigterm": busy,
                                       "seconds_to_exit": round(exited - sent, 2)})
            if code != 0:
                failures.append(f"{r.name} exited with status {code} after SIGTERM")
            r.start()
            r.wait_ready()
            proxy.wait_status(r.name, "UP")
            time.sleep(args.settle)
        after_term = proxy.stats()

        # Phase 2: SIGKILL one replica: what it was running is lost.
        victim = replicas[0]
        victim_running = running(victim.port)
        killed_at = time.monotonic()
        victim.proc.kill()
        victim.proc.wait()
        proxy.wait_status(victim.name, "DOWN")
        time.sleep(args.settle)
        victim.start()
        victim.wait_ready()
        proxy.wait_status(victim.name, "UP")
        time.sleep(args.settle)
    finally:
        load.stop()
        after_kill = proxy.stats() if proxy.proc.poll() is None else {}
        proxy.proc.terminate()
        for r in replicas:
            if r.proc and r.proc.poll() is None:
                r.proc.terminate()
                r.proc.wait(timeout=60)

    def counter(stats, field):
        return sum(int(row.get(field) or 0) for name, row in stats.items()
                   if name not in ("FRONTEND", "BACKEND"))

    def phase(name, results, stats_from, stats_to):
        failed = [r for r in results if not r[2]]
        row = {
            "phase": name,
            "sent": len(results),
            "failed": len(failed),
            "retried": counter(stats_to, "wretr") - counter(stats_from, "wretr"),
            "redispatched": counter(stats_to, "wredis") - counter(stats_from, "wredis"),
            "failures": sorted({f"{r[3]} (from {r[4] or 'no replica'}, sent at "
                                f"{r[0] - load_started:.2f} s, failed at {r[1] - load_started:.2f} s)"
                                for r in failed}),
        }
        report.setdefault("phases", []).append(row)
        return failed

    # By when a request ended: the SIGTERM phase has every request that ended between the
    # first SIGTERM and the SIGKILL (those running at a SIGTERM included, whenever they
    # were sent), the SIGKILL phase every one that ended after it.
    with load.lock:
        everything = list(load.results)
    term_results = [r for r in everything if term_start <= r[1] < killed_at]
    kill_results = [r for r in everything if r[1] >= killed_at]
    in_flight_at_kill = sum(1 for r in kill_results if r[0] < killed_at)
    term_failed = phase("rolling SIGTERM restarts", term_results, before, after_term)
    if term_failed:
        failures.append(f"{len(term_failed)} requests failed during the SIGTERM restarts")
    kill_failed = phase("SIGKILL of one replica", kill_results, after_term, after_kill)
    late = [r for r in kill_failed if r[0] >= killed_at]
    report["in_flight_at_kill"] = in_flight_at_kill
    report["failed_after_kill_sent_after_it"] = len(late)
    if late:
        failures.append(f"{len(late)} requests sent after the SIGKILL failed")
    lost = [r for r in kill_failed if r[0] < killed_at]
    report["failed_in_flight_at_kill"] = len(lost)
    report["running_on_killed_replica"] = victim_running
    # Only the killed replica's own requests may fail: each answer names its replica, so a
    # failure without one (an error of HAProxy's own) or from another replica is a failure
    # of the check, and there can be no more of them than it was running.
    if any(r[4] != victim.name for r in lost):
        failures.append("a request not running on the killed replica failed at the SIGKILL")
    if victim_running is None or len(lost) > victim_running:
        failures.append(f"{len(lost)} requests failed at the SIGKILL, more than the "
                        f"{victim_running} the killed replica was running")
    report["answers_checked"] = sum(1 for r in everything if r[2])
    report["answers_differing"] = len(load.mismatches)
    if load.mismatches:
        failures.append(f"{len(load.mismatches)} answers differ from their variant's run alone, "
                        f"the first: {load.mismatches[0]}")
    served = {r[4] for r in kill_results if r[2]}
    report["replicas_serving_after_kill"] = sorted(s for s in served if s)

    print(f"{args.replicas} replicas behind HAProxy, {args.workers} concurrent requests")
    print("| phase | sent | failed | retried | redispatched |")
    print("|---|---|---|---|---|")
    for row in report["phases"]:
        print(f"| {row['phase']} | {row['sent']} | {row['failed']} | {row['retried']} | "
              f"{row['redispatched']} |")
        for f in row["failures"]:
            print(f"  failure: {f}")
    for r in report["restarts"]:
        print(f"{r['replica']}: {r['running_at_sigterm']} sequences running at SIGTERM, "
              f"exit status {r['exit_status']} {r['seconds_to_exit']} s later")
    print(f"{report['answers_checked']} answers, {report['answers_differing']} of them differing from "
          "their variant's run alone")
    print(f"SIGKILL of {victim.name}: {in_flight_at_kill} requests in flight (on all replicas), "
          f"{victim_running} of them on {victim.name}, {len(lost)} failed; {len(late)} failed "
          "among those sent after it")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(report, indent=2))
    if failures:
        print("FAILED: " + "; ".join(failures))
        sys.exit(1)
    print("OK")


if __name__ == "__main__":
    main()
