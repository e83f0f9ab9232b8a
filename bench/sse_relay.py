#!/usr/bin/env python3
"""How long ragproxy takes to pass on one large stream event, end to end.

    python bench/sse_relay.py                                  # 1, 4, 16, 32 MiB events (~10 s)
    python bench/sse_relay.py --compare /tmp/old/ragproxy.py   # the same run on another copy, side by side
    python bench/sse_relay.py --sizes 1,4 --paths relay --json

A stream event is held until it is whole (a client can use nothing less), so
the relay buffers it across many 64 KiB reads; one event of many MiB (a model
writing a big file in one tool-call delta, a base64 image) shows whether that
buffering is linear in the event's size.  The upstream here answers every
chat completion with one SSE event whose delta carries that many MiB of text,
then ``data: [DONE]``.  Two paths:

  relay    /v1/chat/completions, passed through event by event
  ollama   /api/chat on an OpenAI provider: the SSE is parsed and becomes NDJSON

ragproxy runs as a user starts it (``ragproxy.py serve``), in its own process;
the upstream and the client are threads of this one.  The figure is the best
of --repeat runs, in seconds from the request sent to the last byte read.
Standard library only; Python 3.9+.  Loopback only; every run stops by itself.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import socket
import sys
import tempfile
import threading
import time

from proxy_overhead import API_KEY, RAGPROXY, start_proxy, version_line

MIB = 1024 * 1024
PATHS = ("relay", "ollama")


def event_bytes(size):
    """One chat-completion chunk event of about ``size`` bytes, and [DONE]."""
    head = b'data: {"id":"chatcmpl-big","object":"chat.completion.chunk","created":0,"model":"m",' \
           b'"choices":[{"index":0,"delta":{"content":"'
    tail = b'"},"finish_reason":"stop"}]}\n\n'
    text = (b"0123456789abcdef" * (size // 16 + 1))[:max(0, size - len(head) - len(tail))]
    return head + text + tail, b"data: [DONE]\n\n"


class Upstream:
    """A keep-alive HTTP/1.1 server answering any request with one big SSE event (chunked)."""

    def __init__(self):
        self.events = event_bytes(MIB)
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn):
        rfile = conn.makefile("rb")
        try:
            while True:
                length = None
                while True:
                    line = rfile.readline(65537)
                    if not line:
                        return
                    if line in (b"\r\n", b"\n"):
                        break
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                rfile.read(length or 0)
                head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
                conn.sendall(head + b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in self.events) + b"0\r\n\r\n")
        except OSError:
            return
        finally:
            conn.close()

    def close(self):
        self.sock.close()


def timed_request(port, path, timeout):
    """Seconds from sending a streaming call to reading the end of its answer, and the body."""
    model = "m"
    body = json.dumps({"model": model, "stream": True, "messages": [{"role": "user", "content": "big"}]}).encode()
    head = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {API_KEY}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        start = time.perf_counter()
        sock.sendall(head + body)
        parts = []
        while True:
            data = sock.recv(1 << 20)
            if not data:
                break
            parts.append(data)
        elapsed = time.perf_counter() - start
    return elapsed, b"".join(parts)


def dechunk(raw):
    head, _, rest = raw.partition(b"\r\n\r\n")
    if b"transfer-encoding: chunked" not in head.lower():
        return head, rest
    out, pos = [], 0
    while True:
        end = rest.index(b"\r\n", pos)
        size = int(rest[pos:end].split(b";")[0], 16)
        if size == 0:
            return head, b"".join(out)
        out.append(rest[end + 2:end + 2 + size])
        pos = end + 2 + size + 2


def check(path, raw, size):
    """The answer arrived whole: the event's text, every byte of it, and the stream's end."""
    head, body = dechunk(raw)
    if not head.startswith(b"HTTP/1.1 200"):
        raise RuntimeError(f"{path}: {head.splitlines()[0].decode(errors='replace')}: {body[:200]!r}")
    expected = event_bytes(size)[0]
    if path == "relay":
        if body != expected + b"data: [DONE]\n\n":
            raise RuntimeError(f"relay: {len(body)} bytes arrived, not the {len(expected) + 14} sent")
        return
    lines = [json.loads(line) for line in body.splitlines()]
    text = "".join(line.get("message", {}).get("content", "") for line in lines)
    sent = json.loads(expected[6:])["choices"][0]["delta"]["content"]
    if text != sent or not lines[-1].get("done"):
        raise RuntimeError(f"ollama: {len(text)} characters arrived, not the {len(sent)} sent: {lines[-1]!r:.200}")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="1,4,16,32", help="event sizes in MiB, comma-separated (default 1,4,16,32)")
    p.add_argument("--paths", default=",".join(PATHS), help="any of relay,ollama (default: both)")
    p.add_argument("--repeat", type=int, default=1, help="runs per figure, the best kept (default 1)")
    p.add_argument("--timeout", type=float, default=300.0, help="give up on one answer after this many seconds")
    p.add_argument("--ragproxy", default=RAGPROXY, metavar="PATH", help="the ragproxy.py to run")
    p.add_argument("--compare", action="append", default=[], metavar="PATH",
                   help="another ragproxy.py to run on the same events (repeatable)")
    p.add_argument("--json", action="store_true", help="also print one JSON line with every figure")
    opts = p.parse_args(argv)
    sizes = [float(s) for s in opts.sizes.split(",") if s.strip()]
    paths = [s.strip() for s in opts.paths.split(",") if s.strip()]
    if set(paths) - set(PATHS):
        p.error(f"unknown path(s): {', '.join(sorted(set(paths) - set(PATHS)))}")
    copies = [("ragproxy", opts.ragproxy)] + [(f"compare-{i + 1}", path) for i, path in enumerate(opts.compare)]
    upstream = Upstream()
    workdir = tempfile.mkdtemp(prefix="ragproxy-sse-relay-")
    proxies, results = [], {}
    try:
        for label, script in copies:
            print(f"{label}: {version_line(sys.executable, script, False)} ({script})")
            proxies.append((label, start_proxy(sys.executable, script, upstream.port, workdir, False, label=label)))
        print(f"one SSE event of N MiB, best of {opts.repeat}; seconds to the last byte\n")
        print(f"{'MiB':>6}  " + "  ".join(f"{label + ' ' + path:>22}" for label, _ in proxies for path in paths))
        for mib in sizes:
            size = int(mib * MIB)
            upstream.events = event_bytes(size)
            row = {}
            for label, child in proxies:
                for path in paths:
                    url = "/v1/chat/completions" if path == "relay" else "/api/chat"
                    best = None
                    for _ in range(opts.repeat):
                        elapsed, raw = timed_request(child.port, url, opts.timeout)
                        check(path, raw, size)
                        best = elapsed if best is None else min(best, elapsed)
                    row[f"{label} {path}"] = round(best, 3)
            results[str(mib)] = row
            print(f"{mib:>6g}  " + "  ".join(f"{row[k]:>22.3f}" for k in row))
    finally:
        for _, child in proxies:
            child.stop(None)
        upstream.close()
        shutil.rmtree(workdir, ignore_errors=True)
    if opts.json:
        print(json.dumps({"bench": "sse_relay", "python": platform.python_version(), "cpus": os.cpu_count(),
                          "results": results}, separators=(",", ":")))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (RuntimeError, OSError) as exc:
        sys.exit(f"sse_relay: {exc}")
    except KeyboardInterrupt:
        sys.exit(130)
