#!/usr/bin/env python3
"""A stand-in LLM server for the quickstart: it answers with what it received.

Speaks just enough of the OpenAI chat API (JSON and streaming) for curl and the
OpenAI SDK.  The reply is the last user message as the proxy forwarded it, so
you can see the context ragproxy injected.  Standard library only.

    python echo_upstream.py [--port 11500]
"""
import argparse
import json
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Echo(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))) or b"{}")
        messages = body.get("messages") or [{"role": "user", "content": ""}]
        content = messages[-1].get("content")
        if isinstance(content, list):
            content = "\n".join(p.get("text", "") for p in content if isinstance(p, dict))
        reply = "The proxy sent me this user message:\n\n" + str(content)
        base = {"id": "chatcmpl-echo", "created": int(time.time()), "model": body.get("model", "echo")}
        if body.get("stream"):
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            for piece in (reply[i:i + 80] for i in range(0, len(reply), 80)):
                chunk = dict(base, object="chat.completion.chunk",
                             choices=[{"index": 0, "delta": {"content": piece}, "finish_reason": None}])
                self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            self.wfile.write(b"data: [DONE]\n\n")
            self.close_connection = True
            return
        out = json.dumps(dict(base, object="chat.completion", choices=[
            {"index": 0, "message": {"role": "assistant", "content": reply}, "finish_reason": "stop"}],
            usage={"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0})).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *args):
        pass


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=11500)
    port = parser.parse_args().port
    print(f"echo upstream on http://127.0.0.1:{port}/v1", flush=True)
    ThreadingHTTPServer(("127.0.0.1", port), Echo).serve_forever()
