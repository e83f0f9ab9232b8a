#!/usr/bin/env python3
"""Latency of the MCP ``search`` tool, beside the same search through the admin API and the CLI, in one run.

    python bench/mcp_latency.py                      # 80,000-chunk lexical KB, 200 queries (~35 s, 12 of them the KB)
    python bench/mcp_latency.py --chunks 2000 --queries 20 --cli-runs 5   # a quick run
    python bench/mcp_latency.py --kb-dir /tmp/kb80k  # keep the built KB there and reuse it next time
    python bench/mcp_latency.py --json               # the table, then one JSON line
    python bench/mcp_latency.py --ragproxy /tmp/try/ragproxy.py   # measure another checkout

The knowledge base is the one bench/startup.py builds (stdlib source chunked as
ragproxy chunks code, repeated up to ``--chunks`` records, imported with
``ragproxy.py import``), served by ``ragproxy.py serve`` started as a user
starts it, with API-key authentication on.  Every side asks for the same
``--top-k`` hits of the same queries (identifiers and docstring phrases drawn
from that corpus, fixed seed):

- ``mcp http``: ``tools/call`` of ``search`` on ``POST /mcp`` (Streamable HTTP,
  raw JSON-RPC on one keep-alive connection, after one ``initialize``), timed
  from sending the request to the end of its answer (JSON or SSE);
- ``mcp stdio``: the same call on ``ragproxy.py mcp --stdio`` (one process,
  one session, newline-delimited JSON-RPC over its pipes); left out when the
  checkout has no stdio transport;
- ``admin api``: ``POST /admin/api/kbs/{kb}/search`` with a panel token from
  ``POST /admin/api/login``, on one keep-alive connection;
- ``cli``: ``ragproxy.py search KB QUERY --json``, a fresh process each time,
  so its figure includes the interpreter's start and the KB's opening
  (``--cli-runs`` of them, spread over the run);
- ``in-process floor``: ``App.retriever.search`` (the call the MCP tool and
  the proxy make) on the same data directory, in this process: what a search
  costs with no transport at all.

The sides take turns query by query (the CLI every few queries), so a burst
of outside load hits them all alike, and each query starts at another side,
so none is always the one to find the query's terms already analysed.  The first ``--warmup`` queries of each
side are not timed.  ``agree`` is the share of queries whose first hit has the
same text as the floor's first hit: a check that every side really searched.

Standard library only; Python 3.9+.
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time

from perf import _pct, chunk_corpus, load_ragproxy, make_queries, print_table, stdlib_files
from startup import build_kb

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
KB = "kb"
ACCEPT = "application/json, text/event-stream"
SIDES = ("in-process floor", "mcp http", "mcp stdio", "admin api", "cli")


def serve_config(api_key):
    return ("server: {host: 127.0.0.1, port: 0}\napi_key_auth: true\napi_keys: [%s]\n"
            "providers:\n  llm:\n    o: {type: ollama, base_url: 'http://127.0.0.1:9'}\n"
            "models:\n  - {name: '*', upstream: o, kb: [%s]}\n"
            "knowledge_bases:\n  %s:\n    retrieval: lexical\n    max_file_bytes: 4294967296\n"
            % (api_key, KB, KB))


def bench_queries(checkout, chunks_wanted, n):
    """``n`` queries drawn from files that are in the KB (build_kb takes the stdlib from its start)."""
    rp = load_ragproxy(os.path.join(checkout, "ragproxy.py"))
    root, files = stdlib_files()
    take = max(20, chunks_wanted // 20) if chunks_wanted < 20000 else len(files)
    chunks, _, _ = chunk_corpus(rp, root, files[:min(take, 200)])
    return make_queries(chunks, n)


# --------------------------------------------------------------------------
# The server and the clients


class Server:
    """``ragproxy.py serve`` on a free port; its log is drained so it never blocks on a full pipe."""

    def __init__(self, script, data, config, env):
        self.proc = subprocess.Popen([sys.executable, script, "serve", "--port", "0", "--data-dir", data,
                                      "--config", config], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, env=env, universal_newlines=True)
        self.url = None
        self.log = []
        for line in self.proc.stderr:
            self.log.append(line)
            found = re.search(r"listening on http://([\d.]+):(\d+)", line)
            if found:
                self.host, self.port = found.group(1), int(found.group(2))
                self.url = "http://%s:%d" % (self.host, self.port)
                break
        if self.url is None:
            raise RuntimeError("the server did not start:\n" + "".join(self.log[-20:]))
        self._drain = threading.Thread(target=self._read_log, daemon=True)
        self._drain.start()

    def _read_log(self):
        for line in self.proc.stderr:
            self.log.append(line)
            del self.log[:-200]

    def close(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._drain.join(timeout=5)
        self.proc.stderr.close()


def read_sse_reply(data, want_id):
    """The JSON-RPC message answering ``want_id`` in an SSE body."""
    for event in data.decode("utf-8").replace("\r\n", "\n").split("\n\n"):
        payload = "\n".join(line[5:].lstrip(" ") for line in event.split("\n") if line.startswith("data:"))
        if payload:
            message = json.loads(payload)
            if isinstance(message, dict) and message.get("id") == want_id:
                return message
    raise RuntimeError("no answer to request %r in the event stream" % want_id)


class McpHttp:
    """JSON-RPC over Streamable HTTP on one keep-alive connection: initialize once, then tools/call."""

    def __init__(self, server, api_key):
        self.conn = http.client.HTTPConnection(server.host, server.port, timeout=60)
        self.headers = {"Authorization": "Bearer " + api_key, "Accept": ACCEPT, "Content-Type": "application/json"}
        self.next_id = 0
        reply, headers = self.rpc("initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                                                 "clientInfo": {"name": "ragproxy-bench", "version": "0"}})
        session = headers.get("mcp-session-id")
        if session:
            self.headers["Mcp-Session-Id"] = session
        self.headers["MCP-Protocol-Version"] = reply["result"]["protocolVersion"]
        self.post({"jsonrpc": "2.0", "method": "notifications/initialized"})

    def post(self, message):
        self.conn.request("POST", "/mcp", json.dumps(message).encode("utf-8"), self.headers)
        resp = self.conn.getresponse()
        data = resp.read()
        if resp.status not in (200, 202):
            raise RuntimeError("POST /mcp answered %d: %s" % (resp.status, data[:300]))
        return resp, data

    def rpc(self, method, params):
        self.next_id += 1
        resp, data = self.post({"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params})
        headers = {k.lower(): v for k, v in resp.getheaders()}
        if headers.get("content-type", "").startswith("text/event-stream"):
            reply = read_sse_reply(data, self.next_id)
        else:
            reply = json.loads(data)
        if "error" in reply:
            raise RuntimeError("%s failed: %s" % (method, reply["error"]))
        return reply, headers

    def search(self, query, top_k):
        reply, _ = self.rpc("tools/call", {"name": "search", "arguments": {"query": query, "kb": KB, "top_k": top_k}})
        return tool_hit_texts(reply["result"])

    def close(self):
        self.conn.close()


class McpStdio:
    """``ragproxy.py mcp --stdio``: one process, newline-delimited JSON-RPC on its stdin and stdout."""

    def __init__(self, script, data, config, env):
        self.proc = subprocess.Popen([sys.executable, script, "mcp", "--stdio", "--data-dir", data, "--config", config,
                                      "--log-level", "WARNING"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, env=env)
        self.next_id = 0
        self.rpc("initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                                "clientInfo": {"name": "ragproxy-bench", "version": "0"}})
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})

    def send(self, message):
        self.proc.stdin.write(json.dumps(message).encode("utf-8") + b"\n")
        self.proc.stdin.flush()

    def rpc(self, method, params):
        self.next_id += 1
        self.send({"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params})
        while True:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError("ragproxy.py mcp --stdio exited (%s)" % self.proc.poll())
            reply = json.loads(line)
            if reply.get("id") == self.next_id:
                break
        if "error" in reply:
            raise RuntimeError("%s failed: %s" % (method, reply["error"]))
        return reply

    def search(self, query, top_k):
        reply = self.rpc("tools/call", {"name": "search", "arguments": {"query": query, "kb": KB, "top_k": top_k}})
        return tool_hit_texts(reply["result"])

    def close(self):
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc.stdout.close()


def tool_hit_texts(result):
    """The hits' texts of a search tool result (its structuredContent), best first."""
    if result.get("isError"):
        raise RuntimeError("the search tool failed: %s" % result.get("content"))
    structured = result.get("structuredContent") or {}
    hits = structured.get("results")
    if hits is None:
        hits = structured.get("hits") or []
    return [hit.get("text", "") for hit in hits]


class AdminApi:
    """POST /admin/api/kbs/{kb}/search with a panel token, on one keep-alive connection."""

    def __init__(self, server, panel_key):
        self.conn = http.client.HTTPConnection(server.host, server.port, timeout=60)
        status, body = self.post("/admin/api/login", {"key": panel_key}, {})
        if status != 200:
            raise RuntimeError("admin login failed (%d): %s" % (status, body))
        self.headers = {"Authorization": "Bearer " + body["token"]}

    def post(self, path, body, headers):
        self.conn.request("POST", path, json.dumps(body).encode("utf-8"),
                          dict(headers, **{"Content-Type": "application/json"}))
        resp = self.conn.getresponse()
        return resp.status, json.loads(resp.read())

    def search(self, query, top_k):
        status, body = self.post("/admin/api/kbs/%s/search" % KB, {"query": query, "top_k": top_k}, self.headers)
        if status != 200:
            raise RuntimeError("admin search answered %d: %s" % (status, body))
        return [hit["text"] for hit in body["hits"]]

    def close(self):
        self.conn.close()


class Cli:
    def __init__(self, script, data, config, env):
        self.argv = [sys.executable, script, "search", KB, "--data-dir", data, "--config", config,
                     "--log-level", "WARNING", "--json"]
        self.env = env

    def search(self, query, top_k):
        proc = subprocess.run(self.argv[:4] + [query, "--top-k", str(top_k)] + self.argv[4:], env=self.env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=600)
        if proc.returncode != 0:
            raise RuntimeError("ragproxy.py search failed (%d): %s" % (proc.returncode, proc.stderr.decode()[-400:]))
        return [json.loads(line)["text"] for line in proc.stdout.decode("utf-8").splitlines() if line.startswith("{")]

    def close(self):
        pass


class Floor:
    """The Retriever.search the MCP tool and the proxy call, in this process."""

    def __init__(self, script, data, config_text):
        rp = load_ragproxy(script)
        self.app = rp.App(rp.Config.from_text(config_text), data_dir=data)

    def search(self, query, top_k):
        return [hit.chunk.get("text", "") for hit in self.app.retriever.search([KB], query, top_k=top_k)]

    def close(self):
        self.app.close()


def has_stdio(script, env):
    proc = subprocess.run([sys.executable, script, "mcp", "--help"], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, env=env, timeout=120)
    return proc.returncode == 0 and b"--stdio" in proc.stdout


# --------------------------------------------------------------------------
# The run


def run(args):
    checkout = os.path.dirname(os.path.abspath(args.ragproxy))
    work = args.kb_dir or tempfile.mkdtemp(prefix="ragproxy-mcp-bench-")
    os.makedirs(work, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAGPROXY_")}
    api_key, panel_key = "rp-bench-" + secrets.token_hex(8), secrets.token_hex(16)
    env["RAGPROXY_SECRET_KEY"] = panel_key
    opened = []
    try:
        data, _, _ = build_kb(work, args.chunks, checkout)
        queries = bench_queries(checkout, args.chunks, args.queries)
        config_text = serve_config(api_key)
        config = os.path.join(work, "mcp-bench.yaml")
        with open(config, "w", encoding="utf-8") as f:
            f.write(config_text)
        server = Server(args.ragproxy, data, config, env)
        opened.append(server)
        clients = {"in-process floor": Floor(args.ragproxy, data, config_text), "mcp http": McpHttp(server, api_key)}
        opened.extend(clients.values())
        if has_stdio(args.ragproxy, env):
            clients["mcp stdio"] = McpStdio(args.ragproxy, data, config, env)
            opened.append(clients["mcp stdio"])
        clients["admin api"] = AdminApi(server, panel_key)
        opened.append(clients["admin api"])
        cli = Cli(args.ragproxy, data, config, env)
        times = {name: [] for name in list(clients) + ["cli"]}
        agree = {name: 0 for name in times}
        hits = {name: 0 for name in times}
        cli.search(queries[0], args.top_k)   # untimed: the first run after a build compiles and reads the KB cold
        cli_every = max(1, len(queries) // args.cli_runs) if args.cli_runs else 0
        names = list(clients)
        for n, query in enumerate(queries[:args.warmup] + queries):
            timed = n >= args.warmup
            found = {}
            # Each query starts at another side: the two server sides share one process, and the
            # second to ask for a query would find its terms in the analyzer's cache.
            for name in names[n % len(names):] + names[:n % len(names)]:
                started = time.perf_counter()
                texts = clients[name].search(query, args.top_k)
                seconds = time.perf_counter() - started
                found[name] = texts
                if timed:
                    times[name].append(seconds)
            first = found["in-process floor"][:1]
            for name, texts in found.items():
                if timed:
                    hits[name] += len(texts)
                    agree[name] += texts[:1] == first
            if timed and cli_every and (n - args.warmup) % cli_every == 0 and len(times["cli"]) < args.cli_runs:
                started = time.perf_counter()
                texts = cli.search(query, args.top_k)
                times["cli"].append(time.perf_counter() - started)
                hits["cli"] += len(texts)
                agree["cli"] += texts[:1] == first
        return report(args, times, hits, agree)
    finally:
        for thing in reversed(opened):
            try:
                thing.close()
            except Exception as exc:  # a client that failed to close must not hide the run's own error
                print("closing %s: %s" % (type(thing).__name__, exc), file=sys.stderr)
        if not args.kb_dir:
            shutil.rmtree(work, ignore_errors=True)


def report(args, times, hits, agree):
    summary = {"chunks": args.chunks, "queries": len(times["in-process floor"]), "top_k": args.top_k,
               "python": sys.version.split()[0], "sides": {}}
    rows = []
    floor = _pct(times["in-process floor"], 50)
    for name in SIDES:
        samples = times.get(name)
        if not samples:
            continue
        p50, p99 = _pct(samples, 50), _pct(samples, 99)
        figures = {"n": len(samples), "p50_ms": round(p50 * 1000, 3), "p99_ms": round(p99 * 1000, 3),
                   "mean_ms": round(sum(samples) / len(samples) * 1000, 3),
                   "hits_per_query": round(hits[name] / len(samples), 2), "agree": round(agree[name] / len(samples), 3)}
        summary["sides"][name] = figures
        rows.append((name, figures["n"], "%.2f" % figures["p50_ms"], "%.2f" % figures["p99_ms"],
                     "%.1fx" % (p50 / floor) if floor else "-", figures["hits_per_query"], figures["agree"]))
    print(f"\n== search on a lexical KB of {args.chunks} chunks, top {args.top_k}, {summary['queries']} queries, "
          f"Python {summary['python']}")
    print_table(("side", "n", "p50 ms", "p99 ms", "p50 x floor", "hits", "agree"), rows)
    mcp = summary["sides"].get("mcp http")
    admin = summary["sides"].get("admin api")
    if mcp and admin:
        print("mcp http vs admin api, p50: %+.2f ms" % (mcp["p50_ms"] - admin["p50_ms"]))
    return summary


def parse_args(argv):
    p = argparse.ArgumentParser(description="MCP search tool latency beside the admin API and the CLI")
    p.add_argument("--chunks", type=int, default=80_000, help="chunks in the KB (default 80000)")
    p.add_argument("--queries", type=int, default=200, help="timed queries per side (default 200)")
    p.add_argument("--cli-runs", type=int, default=30, help="timed CLI processes, spread over the run (default 30)")
    p.add_argument("--top-k", type=int, default=10, help="hits every side asks for (default 10)")
    p.add_argument("--warmup", type=int, default=5, help="untimed queries before the timed ones (default 5)")
    p.add_argument("--kb-dir", help="where to build (and next time reuse) the KB; default a temporary directory")
    p.add_argument("--ragproxy", default=os.path.join(ROOT, "ragproxy.py"),
                   help="the ragproxy.py of the checkout to measure (default: this one)")
    p.add_argument("--json", action="store_true", help="after the table, one JSON line with every figure")
    args = p.parse_args(argv)
    if args.queries < 1 or args.top_k < 1 or args.warmup < 0 or args.cli_runs < 0:
        p.error("--queries and --top-k must be at least 1, --warmup and --cli-runs at least 0")
    return args


def main(argv=None):
    args = parse_args(argv)
    summary = run(args)
    if args.json:
        print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
