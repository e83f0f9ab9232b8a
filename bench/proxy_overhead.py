#!/usr/bin/env python3
"""How much latency ragproxy adds in front of an LLM server.

The same closed-loop load (N keep-alive clients, each sending its next request
as soon as the previous answer is complete) goes straight to a fake LLM server
and through ragproxy, in one run, and the two are printed side by side:

  chat     non-stream chat completions from an upstream that answers at once:
           p50/p99 latency and req/s; at 16 clients this measures capacity
  claude   the same with Claude Code's /v1/messages body of about 120 KB
           (24 tools, 40 turns of an agent loop; bench/request_body.py)
  slow     the same with the upstream thinking ~20 ms per request, as a model
           does, so 16 clients overlap without saturating the machine; the
           think time is subtracted from each latency
  stream   streaming chat completions (34 SSE events sent back to back):
           time to the last byte and to the first event
  events   streaming with the upstream pausing between events; each event
           carries the upstream's clock reading taken just before it was
           written, so the client sees how long every event spent on the way

The fake upstream (tests/fake_upstream.py), each proxy and this load generator
run in separate processes: threads of one process would share its GIL and slow
each other down.  The load generator is one thread driving raw keep-alive
sockets through a selector, so its own cost per request is a few microseconds.
Everything listens on 127.0.0.1 only, and every run stops by itself.

    bash bench/setup_peers.sh                           # once: the LiteLLM and Portkey peers
    python bench/proxy_overhead.py                      # chat + claude, 1/8/16 clients, every side
    python bench/proxy_overhead.py --scenarios claude --clients 1,8 --sides ragproxy,rag-80k,cached
    python bench/proxy_overhead.py --both --json        # urllib3 and http.client proxies
    python bench/proxy_overhead.py --py-spy proxy.txt   # also sample the proxy's stacks
    python bench/proxy_overhead.py --ragproxy /tmp/patched/ragproxy.py   # try a change

Beside direct, the sides (--sides) are: the yardsticks (relay, floor), ragproxy's
pass-through model, its retrieval model over a lexical KB (rag-scifact: SciFact's
5,183 abstracts; rag-80k: SciFact and CoSQA at 28-token chunks, 78,556 chunks;
built once into --cache-dir), the next tool round of the same turn (cached),
and two peers a user might pick instead: LiteLLM's proxy and Portkey's gateway,
installed by bench/setup_peers.sh into their own environments (a side this
machine lacks is reported absent).  Every side gets the same bytes in the same
interleaved slices.

Standard library only (py-spy for --py-spy); Python 3.9+.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import random
import re
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

try:
    import fcntl
except ImportError:  # not on Windows: KB builds are then not locked against a concurrent run
    fcntl = None

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TESTS = os.path.join(ROOT, "tests")
RAGPROXY = os.path.join(ROOT, "ragproxy.py")
EVAL_DIR = os.path.join(os.path.dirname(ROOT), "shared", "eval")
sys.path.insert(0, HERE)
from request_body import AGENT_PROMPT, agent_loop_body  # noqa: E402

API_KEY = "bench-client-key-0001"
# The upstream replaces this word with its clock (time.time_ns(), 19 digits)
# just before writing the event that carries it; same length, so framing holds.
STAMP_PLACEHOLDER = b"TS0000000000000000000Z"
_STAMP = re.compile(rb"TS(\d{19})Z")
STAMPED_MODEL_PREFIX = "bench-stamped-"
CHAT_REPLY = ("Sure. Here is a short answer from the fake upstream, about as long as a one-line "
              "completion a coding tool asks for when it only needs a quick fix to apply.")
TARGET_ADDED_P50_MS = 0.3


# --------------------------------------------------------------------------
# Process roles: the fake upstream, and a proxy under cProfile


def upstream_role():
    """Serve the fake upstream; print its port; obey "event_delay S" / "think_time S" on stdin."""
    sys.path.insert(0, TESTS)
    import fake_upstream

    class StampingHandler(fake_upstream._Handler):
        def _serve(self):
            # A jittered think time (0.5x to 1.5x the mean), like a model's
            # varying latency: a fixed one would march the clients in lockstep.
            # The time actually slept goes back in a header for the client to
            # subtract, so the jitter adds no noise to the comparison.
            self.think_ns = 0
            if fake.think_time:
                start = time.perf_counter_ns()
                time.sleep(fake.think_time * random.uniform(0.5, 1.5))
                self.think_ns = time.perf_counter_ns() - start
            super()._serve()

        def end_headers(self):
            if getattr(self, "think_ns", 0):
                self.send_header("X-Bench-Think-Ns", str(self.think_ns))
            super().end_headers()

        def _write(self, data, chunked=False):
            if STAMP_PLACEHOLDER in data:
                data = data.replace(STAMP_PLACEHOLDER, b"TS%019dZ" % time.time_ns(), 1)
            return super()._write(data, chunked)

    # start() looks both names up at call time; the larger backlog keeps 16
    # simultaneous connects from waiting on SYN retries.
    fake_upstream._Handler = StampingHandler
    fake_upstream._Server.request_queue_size = 128
    # Its usage figures count the prompt's tokens with a regex over every string:
    # 3-10 ms of Python per 120 KB body, which would make this process (on the
    # proxy's own 2 cores), not the proxy, what the large-body figures measure,
    # and saturate it at 8 clients.  A model server's prompt work is not ours to
    # time: the answer reports a size estimate instead.
    fake_upstream._prompt_tokens = lambda body: 1000
    fake = fake_upstream.FakeUpstream()
    fake.think_time = 0.0

    def reply(rec):
        model = str((rec.json or {}).get("model") or "")
        if model.startswith(STAMPED_MODEL_PREFIX):
            count = int(model[len(STAMPED_MODEL_PREFIX):])
            return " ".join([STAMP_PLACEHOLDER.decode()] * count)
        return CHAT_REPLY

    fake.reply_fn = reply
    fake._append = lambda rec: None  # keep no history: memory stays flat over a long run
    fake.start()
    print("PORT", fake.port, flush=True)
    for line in sys.stdin:
        words = line.split()
        if words[:1] == ["event_delay"]:
            fake.event_delay = float(words[1])
        elif words[:1] == ["think_time"]:
            fake.think_time = float(words[1])
        print("ok", flush=True)
    fake.close()


def relay_role(upstream_port):
    """Forward bytes between each client and its own upstream connection; print the port.

    The cheapest proxy there can be: no parsing, one blocking thread per
    direction, a recv and a sendall per read.  Its added latency is what the
    extra hop costs by itself on this machine (a second process to wake, two
    more loopback writes); whatever ragproxy adds on top is its own work.
    """
    def pump(src, dst):
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        for sock in (src, dst):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def serve(client, upstream):
        threading.Thread(target=pump, args=(upstream, client), daemon=True).start()
        pump(client, upstream)

    _serve_connections(upstream_port, serve)


def _serve_connections(upstream_port, serve):
    """Listen on 127.0.0.1, print the port, and run ``serve(client, upstream)``
    on a thread per connection, each with its own upstream connection; exit
    when stdin closes (the benchmark stopping this role)."""
    listener = socket.create_server(("127.0.0.1", 0), backlog=128)
    print("PORT", listener.getsockname()[1], flush=True)
    threading.Thread(target=lambda: sys.stdin.read() and None or os._exit(0), daemon=True).start()
    while True:
        client, _ = listener.accept()
        upstream = socket.create_connection(("127.0.0.1", upstream_port))
        for sock in (client, upstream):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threading.Thread(target=serve, args=(client, upstream), daemon=True).start()


def floor_role(upstream_port):
    """The least Python an HTTP-aware proxy can run per request; print the port.

    A yardstick, not a proxy anyone should use: one thread per connection and
    the same socket calls as ragproxy (a buffered reader, sendall); the request
    head split in one pass, the JSON body parsed (a proxy that routes by model
    must), the request re-framed for the upstream and its answer passed on, a
    Content-Length body at once and a chunked one piece by piece.  No checks,
    no auth, no logging, no errors handled.  Between the bare relay and this
    lies what running any Python per request costs on the machine; what
    ragproxy adds beyond this is its own work.
    """
    def serve(client, upstream):
        client.settimeout(60)
        upstream.settimeout(60)
        rfile, ufile = client.makefile("rb", 65536), upstream.makefile("rb", 65536)
        try:
            while True:
                head = rfile.peek(1)
                end = head.find(b"\r\n\r\n")
                if end < 0:
                    return
                lines = head[:end].decode("latin-1").split("\r\n")
                rfile.read(end + 4)
                method, target, _ = lines[0].split(" ")
                headers = {}
                for line in lines[1:]:
                    name, _, value = line.partition(":")
                    headers[name.lower()] = value.strip()
                body = rfile.read(int(headers.get("content-length", "0")))
                json.loads(body)
                sent = "".join(f"{name}: {value}\r\n" for name, value in headers.items()
                               if name not in ("host", "content-length", "authorization", "connection"))
                upstream.sendall(f"{method} {target} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer "
                                 f"upstream-key\r\nContent-Length: {len(body)}\r\n{sent}\r\n".encode("latin-1")
                                 + body)
                head = ufile.peek(1)
                end = head.find(b"\r\n\r\n")
                lines = head[:end].decode("latin-1").split("\r\n")
                ufile.read(end + 4)
                status, length, out = lines[0].split(" ", 1)[1], None, []
                for line in lines[1:]:
                    name, _, value = line.partition(":")
                    lowered = name.lower()
                    if lowered == "content-length":
                        length = int(value)
                    elif lowered not in ("transfer-encoding", "connection"):
                        out.append(line + "\r\n")
                if length is not None:
                    data = ufile.read(length)
                    client.sendall(f"HTTP/1.1 {status}\r\n{''.join(out)}Content-Length: {length}\r\n\r\n"
                                   .encode("latin-1") + data)
                    continue
                client.sendall(f"HTTP/1.1 {status}\r\n{''.join(out)}Transfer-Encoding: chunked\r\n\r\n"
                               .encode("latin-1"))
                while True:
                    size = int(ufile.readline().split(b";")[0], 16)
                    if not size:
                        ufile.readline()
                        client.sendall(b"0\r\n\r\n")
                        break
                    data = ufile.read(size + 2)
                    client.sendall(b"%x\r\n%s" % (size, data))
        except (OSError, ValueError):
            pass
        finally:
            client.close()
            upstream.close()

    _serve_connections(upstream_port, serve)


def cprofile_proxy_role(script, out_path, argv):
    """Run ``ragproxy.main(argv)`` with every connection thread under cProfile."""
    import cProfile
    import pstats
    import socketserver

    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    import ragproxy

    profiles, lock = [], threading.Lock()
    original = socketserver.ThreadingMixIn.process_request_thread

    def profiled(self, request, client_address):
        # Thread CPU time, not wall time: a thread blocked in recv() waiting for
        # the upstream is not spending anything, and wall time would say it is.
        profile = cProfile.Profile(time.thread_time)
        profile.enable()
        try:
            original(self, request, client_address)
        finally:
            profile.disable()
            with lock:
                profiles.append(profile)

    socketserver.ThreadingMixIn.process_request_thread = profiled
    status = ragproxy.main(argv)
    time.sleep(0.3)  # let connection threads the client just closed finish
    with lock:
        done = list(profiles)
    if done:
        stats = pstats.Stats(done[0])
        for profile in done[1:]:
            stats.add(profile)
        stats.dump_stats(out_path)
    sys.exit(status)


# --------------------------------------------------------------------------
# Child processes


def _cpu_seconds(pid):
    """User+system CPU time of a whole process (all threads) and its live children (serve --workers's
    workers), or None off Linux."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        own = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None
    return own + sum(_cpu_seconds(child) or 0.0 for child in _children(pid))


def _children(pid):
    kids = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children", "rb") as f:
                kids += [int(k) for k in f.read().split()]
    except (OSError, ValueError):
        pass
    return kids


class Child:
    """A child process that reports a port on startup; its stderr is kept for errors."""

    def __init__(self, argv, env, port_pattern, name):
        self.name = name
        self.proc = subprocess.Popen(argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, bufsize=1)
        self.pid = self.proc.pid
        self.stderr_lines = []
        self.port = None
        stream = self.proc.stdout if port_pattern is None else self.proc.stderr
        pattern = re.compile(port_pattern or r"^PORT (\d+)")
        deadline = time.monotonic() + 20
        try:
            while time.monotonic() < deadline:
                line = stream.readline()
                if not line:
                    break
                if stream is self.proc.stderr:
                    self.stderr_lines.append(line)
                m = pattern.search(line)
                if m:
                    self.port = int(m.group(1))
                    break
        except BaseException:   # interrupted while it starts: nobody else knows of it yet
            self.stop()
            raise
        if self.port is None:
            self.stop()
            rest = "".join(self.stderr_lines) + self.proc.stderr.read()
            raise RuntimeError(f"{name} did not start:\n{rest}")
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self):
        for line in self.proc.stderr:
            self.stderr_lines.append(line)

    def command(self, line):
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        return self.proc.stdout.readline().strip()

    def stop(self, sig=signal.SIGINT):
        if self.proc.poll() is None:
            if sig is None:
                self.proc.stdin.close()
            else:
                self.proc.send_signal(sig)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def proxy_config(upstream_port, kb_section=None, plain_models=()):
    """The proxy's config: every model to the fake upstream, with the KB ``kb`` when given its section;
    ``plain_models`` are named models without it (a pass-through beside the retrieval model)."""
    plain = "".join(f'  - {{name: "{name}", upstream: fake}}\n' for name in plain_models)
    return f"""\
server:
  host: 127.0.0.1
  port: 0
  log_level: INFO
api_key_auth: true
api_keys: [{API_KEY}]
providers:
  llm:
    fake: {{type: openai, base_url: "http://127.0.0.1:{upstream_port}/v1", api_key: upstream-key}}
models:
{plain}  - {{name: "*", upstream: fake{", kb: [kb]" if kb_section else ""}}}
{kb_section or ""}"""


def start_proxy(python, script, upstream_port, workdir, pure, cprofile_out=None, label=None, kb=None, workers=1):
    """A ragproxy serving on a port it picks; ``kb`` = ``(data_dir, kb_section)`` of prepare_kb: the retrieval model;
    ``workers``: its serve --workers."""
    data_dir = kb[0] if kb else os.path.join(workdir, label or ("pure" if pure else "default"))
    os.makedirs(data_dir, exist_ok=True)
    config = os.path.join(data_dir, "config.yaml")
    with open(config, "w", encoding="utf-8") as f:
        f.write(proxy_config(upstream_port, kb[1] if kb else None))
    env = dict(os.environ, RAGPROXY_SECRET_KEY="bench-secret")
    env.pop("RAGPROXY_PURE", None)
    if pure:
        env["RAGPROXY_PURE"] = "1"
    args = ["serve", "--config", config, "--data-dir", data_dir] + (["--workers", str(workers)] if workers > 1 else [])
    if cprofile_out:
        argv = [python, os.path.abspath(__file__), "--role", "proxy-cprofile", "--profile-out", cprofile_out,
                "--ragproxy", script, "--"] + args
    else:
        argv = [python, script] + args
    return Child(argv, env, r"listening on http://127\.0\.0\.1:(\d+)", label or ("ragproxy" + (" (pure)" if pure else "")))


def version_line(python, script, pure):
    env = dict(os.environ)
    env.pop("RAGPROXY_PURE", None)
    if pure:
        env["RAGPROXY_PURE"] = "1"
    out = subprocess.run([python, script, "--version"], env=env, capture_output=True, text=True, timeout=60)
    return (out.stdout or out.stderr).strip()


# --------------------------------------------------------------------------
# The retrieval model: lexical KBs, built once into a cache outside the repo

# name: (corpora under --eval-dir, chunking).  "scifact" is SciFact's 5,183
# abstracts at the default chunking; "80k" is SciFact and CoSQA's 6,267 code
# snippets together at a chunk size that makes about 80,000 chunks (78,556 at
# 28 tokens), the size of the KB issue 20's targets name.
KB_SPECS = {
    "scifact": (("scifact",), None),
    "80k": (("scifact", "cosqa-dev"), {"strategy": "auto", "chunk_size": 28, "chunk_overlap": 0}),
}
KB_CHUNKS = re.compile(r"(\d+) chunks in g\d+")


class Absent(Exception):
    """A side this machine cannot run (a peer not installed, a corpus not there): reported, not dropped."""


def _kb_section(chunking):
    text = "knowledge_bases:\n  kb:\n    retrieval: lexical\n    max_file_bytes: 4294967296\n"
    if chunking:
        text += "    chunking: {" + ", ".join(f"{k}: {v}" for k, v in chunking.items()) + "}\n"
    return text + "rag: {index_interval: 3600}\n"   # no re-scan of the sources while the load runs


def _index(python, script, data, config):
    """``ragproxy index kb``: builds, or (when the store is current for this script) only checks, the KB."""
    out = subprocess.run([python, script, "index", "kb", "--data-dir", data, "--config", config,
                          "--log-level", "WARNING"], capture_output=True, text=True, timeout=3600)
    found = KB_CHUNKS.search(out.stdout)
    if out.returncode != 0 or not found:
        raise RuntimeError(f"indexing the bench KB failed:\n{out.stdout}{out.stderr}")
    return int(found.group(1))


def prepare_kb(name, opts, script, workdir):
    """A data directory holding the lexical KB ``kb`` of ``KB_SPECS[name]``, for one proxy process.

    The KB is built once per content (the corpora's bytes and the chunking
    decide the cache key) under --cache-dir, then copied for this run, so a
    run never shares a store with another one; the copy is indexed again by
    ``script``, which is a no-op unless that ragproxy stores KBs differently.
    Returns ``(data_dir, kb_section, facts)``.
    """
    corpora, chunking = KB_SPECS[name]
    section = _kb_section(chunking)
    digest = hashlib.sha256(section.encode())
    texts = []
    for corpus in corpora:
        path = os.path.join(opts.eval_dir, corpus, "corpus.jsonl")
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError:
            raise Absent(f"no corpus at {path} (--eval-dir)") from None
        if opts.kb_docs:
            data = b"".join(data.splitlines(keepends=True)[:opts.kb_docs])
        digest.update(b"\0%s\0%d\0" % (corpus.encode(), len(data)))
        digest.update(data)
        texts.append((corpus, data))
    cached = os.path.join(opts.cache_dir, "kb", f"{name}-{digest.hexdigest()[:16]}")
    docs = sum(data.count(b"\n") for _, data in texts)
    os.makedirs(os.path.dirname(cached), exist_ok=True)
    with open(os.path.join(os.path.dirname(cached), ".lock"), "w") as lock:
        if fcntl is not None:
            fcntl.flock(lock, fcntl.LOCK_EX)   # two runs at once build it once
        built = None
        if not os.path.exists(os.path.join(cached, "built")):
            started = time.perf_counter()
            shutil.rmtree(cached, ignore_errors=True)
            os.makedirs(os.path.join(cached, "data", "documents", "kb"))
            for corpus, data in texts:
                with open(os.path.join(cached, "data", "documents", "kb", corpus + ".jsonl"), "wb") as f:
                    f.write(data)
            config = os.path.join(cached, "build.yaml")
            with open(config, "w", encoding="utf-8") as f:
                f.write(proxy_config(9, section))
            chunks = _index(opts.python, script, os.path.join(cached, "data"), config)
            built = round(time.perf_counter() - started, 1)
            with open(os.path.join(cached, "built"), "w") as f:
                f.write(json.dumps({"chunks": chunks, "docs": docs, "seconds": built}))
        data_dir = os.path.join(workdir, f"kb-{name}-{len(os.listdir(workdir))}")
        shutil.copytree(os.path.join(cached, "data"), data_dir)   # copy2: mtimes kept, so nothing looks changed
    config = os.path.join(data_dir, "check.yaml")
    with open(config, "w", encoding="utf-8") as f:
        f.write(proxy_config(9, section))
    chunks = _index(opts.python, script, data_dir, config)
    return data_dir, section, {"corpora": list(corpora), "docs": docs, "chunks": chunks, "chunking": chunking,
                               "cache": cached, "built_seconds": built}


# --------------------------------------------------------------------------
# The peers: other proxies a user might put there instead (bench/setup_peers.sh)

LITELLM_KEY = "sk-" + "bench-client-key-0001"


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PeerChild:
    """A peer proxy on a port chosen here, ready once it answers HTTP; the same face as Child."""

    def __init__(self, argv, env, name, log_path, timeout=120):
        self.name = name
        self.port = _free_port()
        argv = [a.replace("{port}", str(self.port)) for a in argv]
        self.log = open(log_path, "wb")
        self.proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=self.log,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        self.pid = self.proc.pid
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    break
                try:
                    with socket.create_connection(("127.0.0.1", self.port), timeout=2) as sock:
                        sock.sendall(b"GET /health/liveliness HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                     b"Connection: close\r\n\r\n")
                        if sock.recv(16).startswith(b"HTTP/1."):
                            return
                except OSError:
                    time.sleep(0.3)
        except BaseException:   # interrupted while it starts: nobody else knows of it yet
            self.stop()
            raise
        self.stop()
        with open(log_path, "rb") as f:
            tail = f.read()[-2000:].decode("utf-8", "replace")
        raise RuntimeError(f"{name} did not start (log {log_path}):\n{tail}")

    def stop(self, sig=signal.SIGINT):
        if self.proc.poll() is None:
            self.proc.send_signal(sig or signal.SIGINT)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def find_peer(name, opts):
    """What bench/setup_peers.sh recorded for ``name``; Absent when it is not installed."""
    record = os.path.join(opts.cache_dir, "peers", f"{name}.json")
    try:
        with open(record, encoding="utf-8") as f:
            info = json.load(f)
    except (OSError, ValueError):
        raise Absent(f"not installed (bash bench/setup_peers.sh {name})") from None
    if not os.path.exists(info.get("exe", "")):
        raise Absent(f"{info.get('exe')} is gone (bash bench/setup_peers.sh {name})")
    if name == "portkey" and shutil.which("node") is None:
        raise Absent("node is not on PATH")
    return info


def _litellm_config(upstream_port, opts):
    models = ["bench-model", f"{STAMPED_MODEL_PREFIX}{opts.events}"]
    lines = ["model_list:"]
    for model in models:
        lines += [f"  - model_name: {model}",
                  f"    litellm_params: {{model: openai/{model}, api_base: 'http://127.0.0.1:{upstream_port}/v1', "
                  "api_key: upstream-key}"]
    lines += [f"  - model_name: {CLAUDE_MODEL}",
              f"    litellm_params: {{model: anthropic/{CLAUDE_MODEL}, api_base: 'http://127.0.0.1:{upstream_port}', "
              "api_key: upstream-key}",
              # The documented way to run it without a database: a master key, no DATABASE_URL.
              "general_settings: {master_key: " + LITELLM_KEY + ", disable_spend_logs: true}",
              "litellm_settings: {telemetry: false, drop_params: false}"]
    return "\n".join(lines) + "\n"


def start_peer(name, info, upstream_port, opts, workdir):
    env = dict(os.environ)
    log = os.path.join(workdir, f"{name}.log")
    if name == "litellm":
        config = os.path.join(workdir, "litellm.yaml")
        with open(config, "w", encoding="utf-8") as f:
            f.write(_litellm_config(upstream_port, opts))
        for var in ("DATABASE_URL", "LITELLM_MASTER_KEY"):
            env.pop(var, None)
        env.update(LITELLM_LOCAL_MODEL_COST_MAP="True", LITELLM_LOG="ERROR", LITELLM_TELEMETRY="False",
                   NO_DOCKER="True")
        argv = [info["exe"], "--config", config, "--host", "127.0.0.1", "--port", "{port}", "--num_workers", "1"]
    else:
        argv = ["node", info["exe"], "--port={port}", "--headless"]
    return PeerChild(argv, env, f"{name} {info['version']}", log)


def peer_headers(name, scenario, upstream_port):
    """The header lines a peer needs to pass a request to the fake upstream (auth for the client included)."""
    if name == "litellm":
        return [f"Authorization: Bearer {LITELLM_KEY}"]
    if name == "portkey":
        if scenario == "claude":
            return ["x-portkey-provider: anthropic", f"x-portkey-custom-host: http://127.0.0.1:{upstream_port}/v1",
                    "x-api-key: upstream-key"]
        return ["x-portkey-provider: openai", f"x-portkey-custom-host: http://127.0.0.1:{upstream_port}/v1",
                "Authorization: Bearer upstream-key"]
    return [f"Authorization: Bearer {API_KEY}"]


class Side:
    """One thing the load goes to: a label, its process (None: the fake upstream itself, "direct"),
    whether it gets the tool-round body, which peer's headers it needs, and whether it is a
    ragproxy (whose /metrics say what retrieval did)."""

    def __init__(self, label, child=None, tool_round=False, peer=None, ragproxy=False, fresh=False):
        self.label, self.child, self.tool_round, self.peer = label, child, tool_round, peer
        self.ragproxy, self.fresh = ragproxy, fresh


_REQUESTS_TOTAL = re.compile(r'^ragproxy_requests_total\{[^}]*outcome="([^"]*)"[^}]*\} ([0-9.e+]+)$', re.M)


def retrieval_outcomes(port):
    """ragproxy's requests so far by retrieval outcome (retrieved, cached, no_match, ...), from /metrics."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            data = b""
            while True:
                got = sock.recv(65536)
                if not got:
                    break
                data += got
    except OSError:
        return {}
    counts = {}
    for outcome, value in _REQUESTS_TOTAL.findall(data.decode("utf-8", "replace")):
        counts[outcome] = counts.get(outcome, 0) + int(float(value))
    return counts


class OutcomeTally:
    """What each ragproxy port's slices did by retrieval outcome: the difference of its /metrics.

    serve --workers' workers each count their own requests and see a peer's as of
    its last flush (metricsshare: once a second), and two reads of /metrics may be
    answered by different workers.  No worker's view counts more than was served,
    so a view holding every answer since the last complete one is complete too:
    each slice's counts are read until they are, and the next slice starts from
    them rather than from another read, which a peer's late flush could leave short.
    """

    SETTLE_SECONDS = 3.0   # at most this long on, after which the counts are taken as they are

    def __init__(self, read=None):
        self._read = read or retrieval_outcomes
        self._last = {}

    def start(self, port):
        if port not in self._last:   # nothing sent to it yet: no count can be in flight
            self._last[port] = self._read(port)

    def finish(self, port, answered):
        """The outcomes of the ``answered`` requests sent to ``port`` since the last start or finish."""
        before = self._last[port]
        deadline = time.monotonic() + self.SETTLE_SECONDS
        while True:
            counts = self._read(port)
            if sum(counts.values()) - sum(before.values()) >= answered or time.monotonic() >= deadline:
                break
            time.sleep(0.05)
        self._last[port] = counts
        return {outcome: n - before.get(outcome, 0) for outcome, n in counts.items() if n - before.get(outcome, 0)}


# --------------------------------------------------------------------------
# The load generator


CLAUDE_MODEL = "claude-sonnet-4-5"


# In the fresh side's question: a counter the load generator writes in before each send,
# so every request asks a question not asked before (a new turn, a new search).
FRESH_SLOT = b"0000000000"


class Fresh:
    """A request whose question is new every time: ``payload()`` gives the next bytes.

    The counter has a fixed width, so the Content-Length stays right.  Not one
    search or turn cache hit: what a KB search costs each first request of a
    human turn, where rag-<kb> (the same question every time) meets the search cache.
    """

    def __init__(self, data):
        self.at = data.rindex(FRESH_SLOT)
        self.data, self.count = data, 0

    def __call__(self):
        self.count += 1
        return b"%s%010d%s" % (self.data[:self.at], self.count, self.data[self.at + len(FRESH_SLOT):])


def request_bytes(port, stream, prompt_bytes, model, tool_round=False, auth=None, fresh=False):
    """A chat completions request; ``tool_round`` adds a tool call and its result after the user turn
    (the next round of the same turn); ``auth`` is the header lines that authorise it; ``fresh``:
    a Fresh, whose question changes with each request."""
    words = ("please refactor this function and explain the change " * (prompt_bytes // 50 + 1))
    ask = words[:prompt_bytes]
    if fresh:
        ask = ask[:max(0, prompt_bytes - len(FRESH_SLOT) - 1)] + " " + FRESH_SLOT.decode()
    messages = [{"role": "system", "content": "You are a coding assistant."},
                {"role": "user", "content": ask}]
    if tool_round:
        messages += [{"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_bench_0001", "type": "function",
             "function": {"name": "read_file", "arguments": json.dumps({"path": "src/app.py"})}}]},
            {"role": "tool", "tool_call_id": "call_bench_0001", "content": "def main():\n    return 0\n" * 8}]
    body = json.dumps({"model": model, "stream": stream, "max_tokens": 256, "messages": messages},
                      separators=(",", ":")).encode()
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            + "".join(line + "\r\n" for line in (auth or [f"Authorization: Bearer {API_KEY}"]))
            + "Content-Type: application/json\r\n"
            f"Accept: {'text/event-stream' if stream else 'application/json'}\r\n"
            f"User-Agent: ragproxy-bench/1\r\nContent-Length: {len(body)}\r\n\r\n").encode()
    return Fresh(head + body) if fresh else head + body


_AGENT_BODIES = {}


def messages_bytes(port, size, tool_round=False, auth=None, stream=False, fresh=False, model=CLAUDE_MODEL):
    """A Claude Code /v1/messages request of about ``size`` bytes (request_body.agent_loop_body);
    ``fresh``: a Fresh whose question changes with each request."""
    key = (size, tool_round, stream, fresh, model)
    if key not in _AGENT_BODIES:
        prompt = AGENT_PROMPT + (" (question " + FRESH_SLOT.decode() + ")" if fresh else "")
        _AGENT_BODIES[key] = agent_loop_body(size, tool_round=tool_round, model=model, stream=stream,
                                             prompt=prompt)
    body = _AGENT_BODIES[key]
    head = (f"POST /v1/messages?beta=true HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            + "".join(line + "\r\n" for line in (auth or [f"Authorization: Bearer {API_KEY}"]))
            + f"Content-Type: application/json\r\nAccept: {'text/event-stream' if stream else 'application/json'}\r\n"
            "anthropic-version: 2023-06-01\r\nanthropic-beta: claude-code-20250219,interleaved-thinking-2025-05-14\r\n"
            "x-app: cli\r\nUser-Agent: claude-cli/2.1.197 (external, cli)\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    return Fresh(head + body) if fresh else head + body


class _Conn:
    """One keep-alive client connection and the response it is reading."""

    __slots__ = ("sock", "buf", "pos", "head_done", "chunked", "length", "status", "sent_at",
                 "first_at", "stamps", "think", "injected")

    def __init__(self, sock):
        self.sock = sock
        self.reset()

    def reset(self):
        self.buf = bytearray()
        self.pos = 0
        self.head_done = False
        self.chunked = False
        self.length = 0
        self.status = 0
        self.first_at = None
        self.stamps = []
        self.think = 0.0
        self.injected = False

    def feed(self, data, now, wall, want_stamps):
        """Take received bytes; True once the whole response is in."""
        buf = self.buf
        buf += data
        if not self.head_done:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                return False
            lines = bytes(buf[:end]).split(b"\r\n")
            self.status = int(lines[0].split(None, 2)[1])
            for line in lines[1:]:
                name, _, value = line.partition(b":")
                name = name.strip().lower()
                if name == b"content-length":
                    self.length = int(value)
                elif name == b"transfer-encoding" and b"chunked" in value.lower():
                    self.chunked = True
                elif name == b"x-bench-think-ns":
                    self.think = int(value) / 1e9
                elif name == b"x-ragproxy-sources":   # the retrieval model put context in
                    self.injected = True
            self.head_done = True
            self.pos = end + 4
            if not self.chunked and self.first_at is None:
                self.first_at = now
        if not self.chunked:
            return len(buf) - self.pos >= self.length
        pos = self.pos
        while True:
            eol = buf.find(b"\r\n", pos)
            if eol < 0:
                return False
            size = int(bytes(buf[pos:eol]).split(b";", 1)[0], 16)
            if size == 0:
                return len(buf) >= eol + 4  # no trailers: "0\r\n\r\n"
            end = eol + 2 + size
            if len(buf) < end + 2:
                return False
            if self.first_at is None:
                self.first_at = now
            if want_stamps:
                for m in _STAMP.finditer(buf, eol + 2, end):
                    self.stamps.append(wall - int(m.group(1)))
            pos = self.pos = end + 2


def run_load(port, payload, clients, seconds, max_requests, warmup, want_stamps, watch_pids):
    """Closed-loop load on 127.0.0.1:port; per-request figures from after the warm-up.

    Returns latencies (s), first-event times (s), per-event delays (ns), errors,
    the measured wall time, the CPU seconds each watched process used in it,
    how many measured answers said ragproxy injected context (X-Ragproxy-Sources)
    and how many answers came in all, the warm-up's and errors included.
    """
    sel = selectors.DefaultSelector()
    conns = []
    for _ in range(clients):
        sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn = _Conn(sock)
        conns.append(conn)
        sel.register(sock, selectors.EVENT_READ, conn)
    latencies, firsts, delays = [], [], []
    errors, first_error, injected, answered = 0, None, 0, 0
    clock = time.perf_counter
    start = clock()
    measure_from = start + warmup
    stop_at = measure_from + (seconds if max_requests is None else 600.0)
    measuring, cpu0 = False, {}
    next_payload = payload if callable(payload) else None   # a Fresh: new bytes per request
    for conn in conns:
        conn.sent_at = clock()
        conn.sock.sendall(next_payload() if next_payload else payload)
    active = len(conns)
    last_event = clock()
    while active:
        ready = sel.select(5.0)
        now = clock()
        if not ready:
            if now - last_event > 30:
                raise RuntimeError(f"no response for 30 s from port {port}")
            continue
        last_event = now
        if not measuring and now >= measure_from:
            measuring = True
            measure_from = now
            cpu0 = {name: _cpu_seconds(pid) for name, pid in watch_pids.items()}
            cpu0["loadgen"] = time.process_time()
        for key, _ in ready:
            conn = key.data
            data = conn.sock.recv(262144)
            if not data:
                raise RuntimeError(f"port {port} closed a keep-alive connection")
            wall = time.time_ns() if want_stamps else 0
            now = clock()
            if not conn.feed(data, now, wall, want_stamps):
                continue
            answered += 1
            if conn.status != 200:
                errors += 1
                if first_error is None:
                    first_error = bytes(conn.buf).decode("latin-1")[:400]
            elif measuring and conn.sent_at >= measure_from:
                latencies.append(now - conn.sent_at - conn.think)
                firsts.append(conn.first_at - conn.sent_at - conn.think)
                delays.extend(conn.stamps)
                injected += conn.injected
            conn.reset()
            # Errors count toward --requests: a side that fails every request must still end its slice.
            done = now >= stop_at or (max_requests is not None and len(latencies) + errors >= max_requests)
            if done:
                sel.unregister(conn.sock)
                conn.sock.close()
                active -= 1
            else:
                data = next_payload() if next_payload else payload
                conn.sent_at = clock()
                conn.sock.sendall(data)
    elapsed = clock() - measure_from
    cpu = {name: _delta(_cpu_seconds(pid), cpu0.get(name)) for name, pid in watch_pids.items()}
    cpu["loadgen"] = time.process_time() - cpu0.get("loadgen", 0.0)
    sel.close()
    if first_error:
        print(f"  first error from port {port}: {first_error!r}", file=sys.stderr)
    return latencies, firsts, delays, errors, elapsed, cpu, injected, answered


def _delta(after, before):
    return None if after is None or before is None else after - before


def percentile(values, q):
    """Nearest-rank percentile of an unsorted list (None when empty)."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 100))
    return ordered[int(rank) - 1]


# --------------------------------------------------------------------------
# Scenarios and reporting


def _fmt(value, spec=".3f", signed=False):
    if value is None:
        return "-"
    return format(value, ("+" if signed else "") + spec)


SCENARIOS = ("chat", "claude", "slow", "stream", "events")
DEFAULT_SCENARIOS = ("chat", "claude")
# relay, floor: yardsticks; ragproxy: the pass-through model; rag-<kb>: the
# retrieval model over that KB (KB_SPECS); cached: the tool round of the same
# turn against the largest KB asked for; litellm, portkey: the peers.
# fresh: the claude body against that same KB with a new question in every request
# (no search or turn cache can answer it; rag-<kb> asks one question again and again).
SIDES = ("relay", "floor", "ragproxy", "rag-scifact", "rag-80k", "cached", "fresh", "litellm", "portkey")
DEFAULT_SIDES = ("relay", "ragproxy", "rag-scifact", "rag-80k", "cached", "fresh", "litellm", "portkey")


def side_payload(side, name, opts, upstream_port, model, stream):
    port = side.child.port if side.child is not None else upstream_port
    auth = peer_headers(side.peer, name, upstream_port)
    if name == "claude":
        return messages_bytes(port, opts.body_bytes, side.tool_round, auth, stream, side.fresh)
    return request_bytes(port, stream, opts.prompt_bytes, model, side.tool_round, auth, side.fresh)


def run_scenario(name, targets, clients, opts, upstream, tally):
    """Run one scenario at one client count against every target (Side); return result dicts.
    ``tally``: the OutcomeTally the ragproxy sides' slices are counted in."""
    stream = name in ("stream", "events") or (name == "claude" and opts.claude_stream)
    stamped = name == "events"
    model = f"{STAMPED_MODEL_PREFIX}{opts.events}" if stamped else "bench-model"
    upstream.command(f"event_delay {opts.event_interval_ms / 1000.0 if stamped else 0}")
    upstream.command(f"think_time {opts.slow_ms / 1000.0 if name == 'slow' else 0}")
    # Rounds interleave the targets (direct, proxy, direct, proxy, ...) so a
    # burst of outside load on the machine hits both sides alike.
    samples = {side.label: ([], [], [], [0, 0.0, 0], {}) for side in targets}
    outcomes = {side.label: {} for side in targets}
    payloads = {side.label: side_payload(side, name, opts, upstream.port, model, stream) for side in targets}
    per_round = None if opts.requests is None else max(1, opts.requests // opts.rounds)
    for _ in range(opts.rounds):
        for side in targets:
            child = side.child
            watch = {"upstream": upstream.pid}
            if child is not None:
                watch["proxy"] = child.pid
            port = child.port if child is not None else upstream.port
            if side.ragproxy:
                tally.start(port)
            lat, first, delays, errors, elapsed, cpu, injected, answered = run_load(
                port, payloads[side.label], clients, opts.seconds / opts.rounds, per_round, opts.warmup, stamped,
                watch)
            if side.ragproxy:   # the warm-up's requests count here too
                after = outcomes[side.label]
                for outcome, n in tally.finish(port, answered).items():
                    after[outcome] = after.get(outcome, 0) + n
            all_lat, all_first, all_delays, totals, all_cpu = samples[side.label]
            all_lat += lat
            all_first += first
            all_delays += delays
            totals[0] += errors
            totals[1] += elapsed
            totals[2] += injected
            for k, v in cpu.items():
                all_cpu[k] = None if v is None or all_cpu.get(k, 0.0) is None else all_cpu.get(k, 0.0) + v
    results = []
    for label in (side.label for side in targets):
        lat, first, delays, (errors, elapsed, injected), cpu = samples[label]
        n = len(lat)
        result = {
            "scenario": name, "clients": clients, "path": label, "requests": n, "errors": errors,
            "injected": injected,
            "outcomes": outcomes[label] or None,
            "seconds": round(elapsed, 3), "rps": round(n / elapsed, 1) if elapsed > 0 else None,
            "p50_ms": _ms(percentile(lat, 50)), "p99_ms": _ms(percentile(lat, 99)),
            "first_p50_ms": _ms(percentile(first, 50)) if stream else None,
            # /proc counts CPU time in 10 ms ticks: below 0.2 s the figure is noise.
            "cpu_us_per_req": {k: (round(v / n * 1e6, 1) if v is not None and n and
                                   (k == "loadgen" or v >= 0.2) else None)
                               for k, v in cpu.items()},
        }
        if stamped:
            result["events"] = len(delays)
            result["event_p50_us"] = _us(percentile(delays, 50))
            result["event_p99_us"] = _us(percentile(delays, 99))
        results.append(result)
    base = results[0]
    for result in results[1:]:
        for key in ("p50_ms", "p99_ms", "first_p50_ms"):
            if result[key] is not None and base[key] is not None:
                result["added_" + key] = round(result[key] - base[key], 4)
        for key in ("event_p50_us", "event_p99_us"):
            if key in result and result[key] is not None and base[key] is not None:
                result["added_" + key] = round(result[key] - base[key], 1)
    return results


def median_rows(rows):
    """One row per (scenario, clients, path): the median of each figure over the runs that measured it,
    counts summed; with one run, the rows themselves."""
    groups = {}
    for row in rows:
        groups.setdefault((row["scenario"], row["clients"], row["path"]), []).append(row)
    out = []
    for group in groups.values():
        if len(group) == 1:
            out.append(group[0])
            continue
        merged = dict(group[0], runs=len(group))
        for key, value in group[0].items():
            if key in ("requests", "errors", "injected", "events"):
                merged[key] = sum(r.get(key) or 0 for r in group)
            elif key == "outcomes":
                totals = {}
                for r in group:
                    for outcome, n in (r.get("outcomes") or {}).items():
                        totals[outcome] = totals.get(outcome, 0) + n
                merged[key] = totals or None
            elif key == "cpu_us_per_req":
                merged[key] = {k: _median([r[key].get(k) for r in group]) for k in value}
            elif isinstance(value, (int, float)) and key not in ("clients",):
                merged[key] = _median([r.get(key) for r in group])
        out.append(merged)
    return out


def _median(values):
    values = sorted(v for v in values if v is not None)
    if not values:
        return None
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else round((values[mid - 1] + values[mid]) / 2, 4)


def _ms(seconds):
    return None if seconds is None else round(seconds * 1000.0, 4)


def _us(nanoseconds):
    return None if nanoseconds is None else round(nanoseconds / 1000.0, 1)


def print_table(name, rows, opts, absent=None):
    W = max([20] + [len(r["path"]) + 2 for r in rows])  # noqa: N806
    titles = {
        "chat": "chat: non-stream chat completions, instant upstream; latency per request (ms)",
        "claude": (f"claude: Claude Code /v1/messages, {opts.body_bytes // 1000} KB body (24 tools, 40 turns), "
                   + ("streamed, instant upstream; time to the last byte and to the first event (ms)"
                      if opts.claude_stream else "non-stream, instant upstream; latency per request (ms)")),
        "slow": (f"slow: non-stream chat completions, upstream thinks {opts.slow_ms:g} ms (+-50%) per request; "
                 "latency minus that think time (ms)"),
        "stream": (f"stream: streaming chat completions ({len(CHAT_REPLY.split()) + 3} events back to back), "
                   "time to the last byte and to the first event (ms)"),
        "events": (f"events: streams of {opts.events} stamped events, one every {opts.event_interval_ms:g} ms; "
                   "delay from the upstream's write to the client's receive (us)"),
    }
    print()
    print(titles[name])
    if name == "events":
        header = f"{'clients':>7}  {'path':<{W}}{'events':>8}{'p50':>9}{'p99':>9}{'added p50':>11}{'added p99':>11}"
        print(header)
        for r in rows:
            print(f"{r['clients']:>7}  {r['path']:<{W}}{r['events']:>8}{_fmt(r['event_p50_us'], '.1f'):>9}"
                  f"{_fmt(r['event_p99_us'], '.1f'):>9}"
                  f"{_fmt(r.get('added_event_p50_us'), '.1f', True) if 'added_event_p50_us' in r else '':>11}"
                  f"{_fmt(r.get('added_event_p99_us'), '.1f', True) if 'added_event_p99_us' in r else '':>11}")
        _print_absent(absent)
        return
    first = name == "stream" or (name == "claude" and opts.claude_stream)
    header = (f"{'clients':>7}  {'path':<{W}}{'p50':>8}{'p99':>8}{'req/s':>9}"
              + (f"{'1st evt':>9}" if first else "")
              + f"{'added p50':>11}{'added p99':>11}{'proxy CPU/req':>15}")
    print(header)
    for r in rows:
        added = "added_p50_ms" in r
        cpu = r["cpu_us_per_req"].get("proxy")
        line = (f"{r['clients']:>7}  {r['path']:<{W}}{_fmt(r['p50_ms']):>8}{_fmt(r['p99_ms']):>8}"
                f"{_fmt(r['rps'], '.0f'):>9}")
        if first:
            line += f"{_fmt(r['first_p50_ms']):>9}"
        line += (f"{_fmt(r.get('added_p50_ms'), '.3f', True) if added else '':>11}"
                 f"{_fmt(r.get('added_p99_ms'), '.3f', True) if added else '':>11}"
                 f"{(_fmt(cpu, '.0f') + ' us') if cpu is not None else '':>15}")
        if r["errors"]:
            line += f"  ({r['errors']} errors)"
        print(line)
    _print_absent(absent)


def _print_absent(absent):
    for label, reason in (absent or {}).items():
        print(f"{'':>7}  {label}: absent, {reason}")


_YARDSTICKS = {"relay": "a bare TCP relay: what the extra hop costs by itself",
               "python-floor": "the least Python a proxy can run per request (--floor)"}


def _pass_through(path):
    return path in _YARDSTICKS or path in ("ragproxy", "ragproxy-pure") or re.fullmatch(r"(compare|w)-?\d+", path)


_PEERS = ("litellm", "portkey")


def print_summary(results, opts, absent):
    """The issue-20 table: every side's added p50 per body and client count, then capacity at the most clients."""
    scenarios = [name for name in ("chat", "claude") if name in opts.scenario_list]
    if not scenarios:
        return
    rows = {(r["scenario"], r["clients"], r["path"]): r for r in results}
    paths = [r["path"] for r in results if r["scenario"] == scenarios[0] and r["clients"] == opts.client_counts[0]
             and r["path"] != "direct"]
    body = {"chat": "small", "claude": f"{opts.body_bytes // 1000} KB"}
    cols = [(name, clients) for name in scenarios for clients in opts.client_counts]
    width = max([24] + [len(p) + 2 for p in paths + list(absent)])
    print()
    print("added p50 over direct (ms), per body and clients; the same interleaved slices")
    print(f"{'side':<{width}}" + "".join(f"{body[n] + ', ' + str(c):>14}" for n, c in cols))
    for path in paths:
        print(f"{path:<{width}}" + "".join(f"{_fmt(rows.get((n, c, path), {}).get('added_p50_ms'), '.2f', True):>14}"
                                           for n, c in cols))
    for label, reason in absent.items():
        print(f"{label:<{width}}absent: {reason}")
    most = max(opts.client_counts)
    print()
    print(f"at {most} clients: req/s, p99 (ms), p99 added over direct (ms), proxy CPU per request (us, "
          "/proc utime+stime over the slice)")
    print(f"{'side':<{width}}" + "".join(f"{body[n] + ' ' + what:>16}" for n in scenarios
                                         for what in ("req/s", "p99", "+p99", "CPU/req")))
    for path in ["direct"] + paths:
        line = f"{path:<{width}}"
        for n in scenarios:
            r = rows.get((n, most, path), {})
            cpu = (r.get("cpu_us_per_req") or {}).get("proxy")
            line += (f"{_fmt(r.get('rps'), '.0f'):>16}{_fmt(r.get('p99_ms'), '.2f'):>16}"
                     f"{_fmt(r.get('added_p99_ms'), '.2f', True) if 'added_p99_ms' in r else '':>16}"
                     f"{_fmt(cpu, '.0f'):>16}")
        print(line)


def print_outcomes(results):
    """What retrieval did on each ragproxy side, over all its slices (warm-ups included), from its /metrics."""
    totals = {}
    for r in results:
        for outcome, n in (r.get("outcomes") or {}).items():
            side = totals.setdefault(r["path"], {})
            side[outcome] = side.get(outcome, 0) + n
    if not totals:
        return
    print()
    print("ragproxy requests by retrieval outcome (its /metrics, warm-ups included)")
    for path, counts in totals.items():
        print(f"  {path:<22}" + ", ".join(f"{outcome} {n}" for outcome, n in sorted(counts.items())))


def _retrieval_sides(paths):
    """The retrieval and the tool-round sides of the largest KB among ``paths`` (None where absent)."""
    return (next((p for p in ("rag-80k", "rag-scifact") if p in paths), None),
            next((p for p in ("cached-80k", "cached-scifact") if p in paths), None))


def issue20_targets(results, opts):
    """Issue 20's latency targets on the large body against the largest KB the run has:
    ``[(clients, path, got, want, met)]`` from one set of rows (a run's, or the medians)."""
    rows = {(r["scenario"], r["clients"], r["path"]): r for r in results}
    rag, cached = _retrieval_sides({r["path"] for r in results})
    targets = []
    for name in [n for n in ("claude", "chat") if n in opts.scenario_list][:1]:
        def added(clients, path):
            return rows.get((name, clients, path), {}).get("added_p50_ms")

        for clients in opts.client_counts:
            base = added(clients, "ragproxy")
            if base is None:
                continue
            if rag and added(clients, rag) is not None:
                got = added(clients, rag)
                if clients == 1:
                    ok = got <= 1.0 and got <= base + 0.5
                    want = f"<= +1.0 ms and <= pass-through {base:+.2f} + 0.5"
                else:
                    ok, want = got <= 2 * max(base, 0.0), f"<= 2x pass-through ({2 * base:+.2f})"
                targets.append((clients, rag, got, want, ok))
            if cached and added(clients, cached) is not None:
                got = added(clients, cached)
                targets.append((clients, cached, got, f"<= pass-through {base:+.2f} + 0.2", got <= base + 0.2))
    return targets


def print_issue20(results, opts, per_run=()):
    """Issue 20's targets on the medians, with how many of the runs (``per_run``: each run's
    rows) met each one alone: a margin smaller than the runs' scatter shows as a split count."""
    paths = {r["path"] for r in results}
    targets = issue20_targets(results, opts)
    if "ragproxy" not in paths or not targets:
        return
    print()
    print("issue 20 targets (claude body):" if "claude" in opts.scenario_list else "issue 20 targets:")
    run_targets = [{(c, p): ok for c, p, _, _, ok in issue20_targets(rows, opts)} for rows in per_run]
    for clients, path, got, want, ok in targets:
        counted = [verdicts[clients, path] for verdicts in run_targets if (clients, path) in verdicts]
        runs = f"  (met in {sum(counted)} of {len(counted)} runs)" if len(counted) > 1 else ""
        print(f"  {clients:>2} clients  {path:<14} {got:+.2f} ms  {want}: {'met' if ok else 'MISSED'}{runs}")
    rows = {(r["scenario"], r["clients"], r["path"]): r for r in results}
    rag, cached = _retrieval_sides(paths)
    fresh = next((p for p in paths if p.startswith("fresh")), None)
    # A new question is what the first request of every human turn costs: it counts against the peers too.
    ours = [p for p in paths if p in ("ragproxy", rag, cached, fresh)]
    for path in sorted(p for p in paths if p in _PEERS):
        behind = [(r["scenario"], r["clients"], o) for r in results if r["path"] == path
                  for o in ours if r.get("added_p50_ms") is not None
                  and (rows.get((r["scenario"], r["clients"], o)) or {}).get("added_p50_ms", 0) > r["added_p50_ms"]]
        print(f"  ragproxy ahead of {path} on every row: " + (
            "met" if not behind else "MISSED on " + ", ".join(f"{s} {c} clients {o}" for s, c, o in behind)))


def print_verdict(results, opts):
    print()
    print(f"target: at most +{TARGET_ADDED_P50_MS} ms p50 per request (stream: to the first event); "
          "streaming holds no event back")
    relays = {(r["scenario"], r["clients"]): r for r in results if r["path"] == "relay"}
    for r in results:
        if r["scenario"] == "claude" or not _pass_through(r["path"]):
            continue   # the retrieval model, the peers and the large body: print_issue20 has their targets
        where = f"  {r['scenario']:<7}{r['clients']:>3} clients  {r['path']:<20}"
        relay = relays.get((r["scenario"], r["clients"])) if r["path"] not in _YARDSTICKS else None
        key = "added_first_p50_ms" if r["scenario"] == "stream" else "added_p50_ms"
        beyond = ""
        if relay is not None and relay.get(key) is not None and r.get(key) is not None:
            beyond = f"; beyond the bare relay {r[key] - relay[key]:+.3f} ms"
        if r["path"] in _YARDSTICKS and "added_event_p50_us" in r:
            print(f"{where}added per event p50 {r['added_event_p50_us']:+.1f} us  ({_YARDSTICKS[r['path']]})")
        elif r["path"] in _YARDSTICKS and key in r:
            print(f"{where}added p50{' to the first event' if key != 'added_p50_ms' else ''} "
                  f"{r[key]:+.3f} ms  ({_YARDSTICKS[r['path']]})")
        elif r["scenario"] in ("chat", "slow") and "added_p50_ms" in r:
            ok = r["added_p50_ms"] <= TARGET_ADDED_P50_MS
            print(f"{where}added p50 {r['added_p50_ms']:+.3f} ms  {'met' if ok else 'MISSED'}{beyond}")
        elif r["scenario"] == "stream" and "added_first_p50_ms" in r:
            ok = r["added_first_p50_ms"] <= TARGET_ADDED_P50_MS
            print(f"{where}added p50 to the first event {r['added_first_p50_ms']:+.3f} ms  "
                  f"{'met' if ok else 'MISSED'}; to the last byte {r['added_p50_ms']:+.3f} ms{beyond}")
        elif "added_event_p50_us" in r:
            # An event held until the next one arrives would add about one interval.
            held = r["added_event_p50_us"] >= opts.event_interval_ms * 1000 / 2
            print(f"{where}added per event p50 {r['added_event_p50_us']:+.1f} us, "
                  f"p99 {r['added_event_p99_us']:+.1f} us  "
                  f"{'events HELD BACK' if held else 'met: each event relayed as it came'}")


def _load_average():
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def _py_spy_start(pid, out_path):
    exe = shutil.which("py-spy")
    if exe is None:
        raise SystemExit("--py-spy needs py-spy (python -m pip install py-spy)")
    fmt = "speedscope" if out_path.endswith(".json") else ("flamegraph" if out_path.endswith(".svg") else "raw")
    return subprocess.Popen([exe, "record", "--pid", str(pid), "--rate", "500", "--format", fmt,
                             "--output", out_path, "--nonblocking"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _parse_args(argv):
    p = argparse.ArgumentParser(description="Latency ragproxy adds in front of an LLM server (direct vs proxied).")
    p.add_argument("--clients", default="1,8,16", help="comma-separated client counts (default 1,8,16)")
    p.add_argument("--seconds", type=float, default=3.0, help="measured seconds per run (default 3)")
    p.add_argument("--requests", type=int, default=None,
                   help="measure this many requests per run instead of --seconds")
    p.add_argument("--runs", type=int, default=1,
                   help="repeat the whole measurement this many times and report the median of each figure "
                        "(every run's tables are printed too; default 1)")
    p.add_argument("--rounds", type=int, default=3,
                   help="split each run into this many slices, alternating direct and proxied (default 3)")
    p.add_argument("--warmup", type=float, default=0.3,
                   help="unmeasured seconds before each slice (default 0.3)")
    p.add_argument("--scenarios", default=",".join(DEFAULT_SCENARIOS),
                   help="any of %s, or all (default: %s)" % (",".join(SCENARIOS), ",".join(DEFAULT_SCENARIOS)))
    p.add_argument("--sides", default=",".join(DEFAULT_SIDES),
                   help="what runs beside direct, in the same slices: any of %s (default: %s; --floor and "
                        "--no-relay add and remove those two)" % (",".join(SIDES), ",".join(DEFAULT_SIDES)))
    p.add_argument("--body-bytes", type=int, default=120_000,
                   help="size of the Claude Code body in 'claude' (default 120000)")
    p.add_argument("--claude-stream", action="store_true",
                   help="send the 'claude' body with stream: true, as Claude Code does (default non-stream: "
                        "Portkey's gateway 1.15.2 fails every streamed request on Node 20 here)")
    p.add_argument("--cache-dir", default=os.environ.get("RAGPROXY_BENCH_CACHE") or os.path.join(
                       os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "ragproxy-bench"),
                   help="where the KBs are built once and bench/setup_peers.sh installs the peers "
                        "(default $RAGPROXY_BENCH_CACHE or ~/.cache/ragproxy-bench)")
    p.add_argument("--eval-dir", default=EVAL_DIR, help="the shared eval corpora (default ../shared/eval)")
    p.add_argument("--kb-docs", type=int, default=0,
                   help="take only the first N documents of each corpus (a small KB for a quick try)")
    p.add_argument("--profile-side", default=None, metavar="LABEL",
                   help="the side whose process --py-spy or --cprofile watches (default: the first ragproxy), "
                        "e.g. rag-80k")
    p.add_argument("--slow-ms", type=float, default=20.0,
                   help="mean upstream think time in 'slow' (default 20)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--pure", action="store_true", help="run the proxy with RAGPROXY_PURE=1 (http.client pool)")
    mode.add_argument("--both", action="store_true", help="run the default (urllib3) and the pure proxy")
    p.add_argument("--json", action="store_true", help="also print one JSON line with every figure")
    p.add_argument("--prompt-bytes", type=int, default=1000, help="size of the user message (default 1000)")
    p.add_argument("--events", type=int, default=20, help="stamped events per stream in 'events' (default 20)")
    p.add_argument("--event-interval-ms", type=float, default=5.0,
                   help="upstream pause between events in 'events' (default 5)")
    p.add_argument("--python", default=sys.executable, help="interpreter for the proxy and the upstream")
    p.add_argument("--ragproxy", default=RAGPROXY, metavar="PATH",
                   help="the ragproxy.py to run (default: the checkout's), e.g. a patched copy to compare")
    p.add_argument("--compare", action="append", default=[], metavar="PATH",
                   help="another ragproxy.py to run beside the first, in the same interleaved slices "
                        "(labelled compare-1, compare-2, ...): an A/B of a change that machine drift "
                        "between separate runs cannot blur; repeatable")
    p.add_argument("--compare-workers", action="append", default=[], type=int, metavar="N",
                   help="also run the ragproxy sides with serve --workers N (labelled wN, wN-rag-80k, ...) in the "
                        "same interleaved slices; repeatable")
    p.add_argument("--py-spy", metavar="FILE", help="sample the proxy with py-spy while the load runs "
                   "(raw collapsed stacks; .svg flamegraph; .json speedscope)")
    p.add_argument("--cprofile", metavar="FILE", help="run the proxy with cProfile on its connection threads "
                   "and save the stats (slows the proxy: latencies are not comparable)")
    p.add_argument("--no-relay", action="store_true",
                   help="leave out the bare TCP relay (the cost of the extra hop alone)")
    p.add_argument("--floor", action="store_true",
                   help="add a minimal Python proxy (see floor_role): the least Python per request, "
                        "to tell what Python itself costs on this machine from what ragproxy adds")
    p.add_argument("--role", choices=("upstream", "relay", "floor", "proxy-cprofile"), help=argparse.SUPPRESS)
    p.add_argument("--profile-out", help=argparse.SUPPRESS)
    p.add_argument("rest", nargs="*", help=argparse.SUPPRESS)
    opts = p.parse_args(argv)
    try:
        opts.client_counts = [int(c) for c in opts.clients.split(",") if c.strip()]
    except ValueError:
        p.error(f"--clients must be comma-separated numbers, got {opts.clients!r}")
    if opts.rounds < 1 or opts.runs < 1:
        p.error("--rounds and --runs must be at least 1")
    if not opts.client_counts or min(opts.client_counts) < 1:
        p.error("--clients needs at least one count of 1 or more")
    opts.scenario_list = [s.strip() for s in opts.scenarios.split(",") if s.strip()]
    if opts.scenario_list == ["all"]:
        opts.scenario_list = list(SCENARIOS)
    opts.side_set = {s.strip() for s in opts.sides.split(",") if s.strip()}
    if opts.floor:
        opts.side_set.add("floor")
    if opts.no_relay:
        opts.side_set.discard("relay")
    unknown_sides = opts.side_set - set(SIDES)
    if unknown_sides:
        p.error(f"unknown side(s): {', '.join(sorted(unknown_sides))} (any of {', '.join(SIDES)})")
    unknown = set(opts.scenario_list) - set(SCENARIOS)
    if unknown:
        p.error(f"unknown scenario(s): {', '.join(sorted(unknown))}")
    if opts.py_spy and opts.cprofile:
        p.error("choose one of --py-spy and --cprofile")
    return opts


def _terminated(signum, frame):
    raise KeyboardInterrupt


def main(argv=None):
    opts = _parse_args(sys.argv[1:] if argv is None else argv)
    if opts.role == "upstream":
        upstream_role()
        return 0
    if opts.role in ("relay", "floor"):
        (relay_role if opts.role == "relay" else floor_role)(int(opts.rest[0]))
        return 0
    if opts.role == "proxy-cprofile":
        cprofile_proxy_role(opts.ragproxy, opts.profile_out, opts.rest)
        return 0

    modes = [False, True] if opts.both else [opts.pure]
    # The process --py-spy / --cprofile watch: the first ragproxy unless --profile-side names another.
    profiled = first_label = opts.profile_side or ("ragproxy-pure" if modes[0] else "ragproxy")
    versions = {("ragproxy-pure" if pure else "ragproxy"): version_line(opts.python, opts.ragproxy, pure)
                for pure in modes}
    cpus = os.cpu_count()
    print("ragproxy proxy-overhead benchmark")
    print(f"  load generator: Python {platform.python_version()} ({platform.python_implementation()}), "
          f"{platform.system()} {platform.machine()}, {cpus} CPUs")
    for label, line in versions.items():
        print(f"  {label}: {line}")
    if os.path.abspath(opts.ragproxy) != RAGPROXY:
        print(f"  ragproxy script: {opts.ragproxy}")
    for i, path in enumerate(opts.compare, 1):
        print(f"  compare-{i}: {path}")
    load = _load_average()
    if load is not None:
        busy = "  (other processes are busy: expect noisy figures)" if load > 0.5 else ""
        print(f"  load average before the run: {load:.2f}{busy}")
    print(f"  3 processes (load generator, fake upstream, proxy) share these {cpus} CPUs; "
          "at 16 clients they compete for them")
    run_desc = f"{opts.requests} requests" if opts.requests else f"{opts.seconds:g} s"
    print(f"  {run_desc} per run in {opts.rounds} slices alternating direct and proxied, each after "
          f"{opts.warmup:g} s warm-up; user message {opts.prompt_bytes} bytes; 127.0.0.1 only")

    workdir = tempfile.mkdtemp(prefix="ragproxy-bench-")
    upstream = proxies = spy = relay = floor = None
    results, absent, kb_facts, peer_versions = [], {}, {}, {}
    # A SIGTERM (a CI step's timeout, kill) unwinds as Ctrl-C does, through the finally below
    # that stops every child: the peers run in sessions of their own and outlived the bench.
    signal.signal(signal.SIGTERM, _terminated)
    try:
        upstream = Child([opts.python, os.path.abspath(__file__), "--role", "upstream"], dict(os.environ),
                         None, "fake upstream")
        def yardstick(role):
            return Child([opts.python, os.path.abspath(__file__), "--role", role, "--", str(upstream.port)],
                         dict(os.environ), None, role)

        relay = yardstick("relay") if "relay" in opts.side_set else None
        floor = yardstick("floor") if "floor" in opts.side_set else None
        proxies = []
        targets = [Side("direct")] + ([Side("relay", relay)] if relay is not None else []) + (
            [Side("python-floor", floor)] if floor is not None else [])

        def proxy(script, label, pure=False, kb=None, workers=1):
            child = start_proxy(opts.python, script, upstream.port, workdir, pure,
                                opts.cprofile if label == profiled else None, label=label, kb=kb, workers=workers)
            proxies.append(child)
            return child

        if "ragproxy" in opts.side_set:
            for pure in modes:
                label = "ragproxy-pure" if pure else "ragproxy"
                targets.append(Side(label, proxy(opts.ragproxy, label, pure), ragproxy=True))
        scripts = [("", opts.ragproxy, 1)] + [(f"compare-{i}-", path, 1) for i, path in enumerate(opts.compare, 1)] \
            + [(f"w{n}-", opts.ragproxy, n) for n in opts.compare_workers]
        for i, path in enumerate(opts.compare, 1):
            if "ragproxy" in opts.side_set:
                targets.append(Side(f"compare-{i}", proxy(path, f"compare-{i}", modes[0]), ragproxy=True))
        for n in opts.compare_workers:
            if "ragproxy" in opts.side_set:
                targets.append(Side(f"w{n}", proxy(opts.ragproxy, f"w{n}", modes[0], workers=n), ragproxy=True))
        kbs = [name for name in KB_SPECS if f"rag-{name}" in opts.side_set]
        cached_kb = (kbs or ["80k"])[-1] if {"cached", "fresh"} & set(opts.side_set) else None
        for prefix, script, workers in scripts:
            for name in kbs + ([cached_kb] if cached_kb and cached_kb not in kbs else []):
                labels = ([f"{prefix}rag-{name}"] if name in kbs else []) + (
                    [f"{prefix}{side}-{name}" for side in ("cached", "fresh") if side in opts.side_set]
                    if name == cached_kb else [])
                try:
                    data_dir, section, facts = prepare_kb(name, opts, script, workdir)
                except Absent as exc:
                    absent.update((label, str(exc)) for label in labels)
                    continue
                kb_facts[name] = facts
                child = proxy(script, labels[0], modes[0], (data_dir, section), workers)
                targets += [Side(label, child, tool_round=label.startswith(f"{prefix}cached-"), ragproxy=True,
                                 fresh=label.startswith(f"{prefix}fresh-")) for label in labels]
        for name in ("litellm", "portkey"):
            if name not in opts.side_set:
                continue
            try:
                info = find_peer(name, opts)
                child = start_peer(name, info, upstream.port, opts, workdir)
            except Absent as exc:
                absent[name] = str(exc)
                continue
            except RuntimeError as exc:
                absent[name] = f"did not start: {str(exc).splitlines()[0]}"
                continue
            peer_versions[name] = info
            proxies.append(child)
            targets.append(Side(name, child, peer=name))
        for name, facts in kb_facts.items():
            built = f", built in {facts['built_seconds']} s" if facts["built_seconds"] is not None else ""
            print(f"  KB {name}: lexical, {facts['chunks']} chunks from {facts['docs']} documents of "
                  f"{' + '.join(facts['corpora'])}, chunking {facts['chunking'] or 'default'} "
                  f"(cache {facts['cache']}{built})")
        for name, info in peer_versions.items():
            print(f"  {name} {info['version']}: {info['command']}")
        for label, reason in absent.items():
            print(f"  {label}: absent, {reason}")
        if opts.py_spy:
            watched = next((side.child for side in targets if side.label == profiled), None)
            if watched is None:
                raise SystemExit(f"--profile-side {profiled}: no such side in this run")
            spy = _py_spy_start(watched.pid, opts.py_spy)
            time.sleep(0.5)
        runs = []   # each run's rows, every scenario's
        tally = OutcomeTally()
        for run in range(opts.runs):
            if opts.runs > 1:
                print(f"\n== run {run + 1} of {opts.runs}")
            runs.append([])
            for name in opts.scenario_list:
                rows = []
                for clients in opts.client_counts:
                    rows += run_scenario(name, targets, clients, opts, upstream, tally)
                print_table(name, rows, opts, absent)
                sys.stdout.flush()
                runs[-1] += rows
        results = median_rows([row for rows in runs for row in rows])
        if opts.runs > 1:
            print(f"\n== the median of each figure over the {opts.runs} runs")
            for name in opts.scenario_list:
                print_table(name, [r for r in results if r["scenario"] == name], opts, absent)
    finally:
        if spy is not None:
            spy.send_signal(signal.SIGINT)
            try:
                spy.wait(30)
            except subprocess.TimeoutExpired:
                spy.kill()
        for child in proxies or []:
            child.stop(signal.SIGINT)
        for child in (relay, floor):
            if child is not None:
                child.stop(None)
        if upstream is not None:
            upstream.stop(None)
        shutil.rmtree(workdir, ignore_errors=True)
    print_verdict(results, opts)
    print_summary(results, opts, absent)
    print_outcomes(results)
    print_issue20(results, opts, runs)
    if opts.py_spy:
        print(f"\npy-spy samples of the {first_label} process: {opts.py_spy}")
    if opts.cprofile:
        print(f"\ncProfile stats of the {first_label} process: {opts.cprofile} "
              "(python -m pstats FILE; latencies above include cProfile's slowdown)")
    if opts.json:
        print(json.dumps({"bench": "proxy_overhead", "python": platform.python_version(), "cpus": cpus,
                          "platform": platform.platform(), "ragproxy": versions,
                          "load_average_before": load,
                          "options": {"seconds": opts.seconds, "requests": opts.requests, "rounds": opts.rounds, "runs": opts.runs,
                                      "warmup": opts.warmup, "slow_ms": opts.slow_ms,
                                      "prompt_bytes": opts.prompt_bytes, "body_bytes": opts.body_bytes,
                                      "claude_stream": opts.claude_stream,
                                      "events": opts.events,
                                      "event_interval_ms": opts.event_interval_ms},
                          "kbs": kb_facts, "peers": peer_versions, "absent": absent,
                          "results": results}, separators=(",", ":")))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (RuntimeError, OSError) as exc:
        sys.exit(f"proxy_overhead: {exc}")
    except KeyboardInterrupt:
        sys.exit(130)
