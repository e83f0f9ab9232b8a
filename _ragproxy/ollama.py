"""Ollama's native chat and generate APIs served by an OpenAI-compatible upstream.

Tools that speak Ollama's /api/chat and /api/generate can use any provider:
requests become chat completions, and the answer (JSON or SSE) is turned
back into Ollama JSON or NDJSON.

May import: api, upstream.
"""
from __future__ import annotations

import json
import time

from .api import ClientError, StreamResponse, error_response, json_bytes, json_response
from .upstream import MAX_UPSTREAM_BODY, UpstreamError, upstream_url

_OLLAMA_OPTION_MAP = {"temperature": "temperature", "top_p": "top_p", "num_predict": "max_tokens",
                      "stop": "stop", "seed": "seed", "frequency_penalty": "frequency_penalty",
                      "presence_penalty": "presence_penalty"}


def _ollama_to_openai(endpoint_name, payload, model):
    """The chat-completions body for an Ollama /api/chat or /api/generate body."""
    if endpoint_name == "ollama_chat":
        messages = [_ollama_message_to_openai(m) for m in payload.get("messages") or [] if isinstance(m, dict)]
    elif endpoint_name == "ollama_generate":
        messages = []
        if payload.get("system"):
            messages.append({"role": "system", "content": payload["system"]})
        messages.append(_ollama_message_to_openai({"role": "user", "content": payload.get("prompt") or "",
                                                   "images": payload.get("images")}))
    else:
        raise ClientError(400, f"{endpoint_name} needs an Ollama upstream")
    body = {"model": model, "messages": messages, "stream": payload.get("stream", True) is not False}
    if body["stream"]:
        body["stream_options"] = {"include_usage": True}
    for name, target in _OLLAMA_OPTION_MAP.items():
        options = payload.get("options") or {}
        if isinstance(options, dict) and name in options:
            body[target] = options[name]
    if payload.get("tools"):
        body["tools"] = payload["tools"]
    if payload.get("format") == "json":
        body["response_format"] = {"type": "json_object"}
    elif isinstance(payload.get("format"), dict):
        body["response_format"] = {"type": "json_schema",
                                   "json_schema": {"name": "output", "schema": payload["format"]}}
    return body


def _ollama_message_to_openai(message):
    out = {"role": message.get("role", "user"), "content": message.get("content") or ""}
    images = message.get("images") or []
    if images:
        parts = [{"type": "text", "text": out["content"]}]
        parts += [{"type": "image_url", "image_url": {"url": "data:image/png;base64," + img}} for img in images]
        out["content"] = parts
    calls = message.get("tool_calls") or []
    if calls:
        out["tool_calls"] = [{"id": f"call_{i}", "type": "function",
                              "function": {"name": c.get("function", {}).get("name", ""),
                                           "arguments": json.dumps(c.get("function", {}).get("arguments", {}))}}
                             for i, c in enumerate(calls)]
    if out["role"] == "tool" and message.get("tool_call_id"):
        out["tool_call_id"] = message["tool_call_id"]
    return out


class _OllamaReply:
    """Builds Ollama reply objects for one call, chat or generate."""

    def __init__(self, endpoint_name, model, clock):
        self.chat = endpoint_name == "ollama_chat"
        self.model = model
        self.clock = clock
        self.start = clock()

    def _stamp(self):
        now = self.clock()
        return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + ".%06dZ" % int((now % 1) * 1e6)

    def piece(self, text, tool_calls=None):
        obj = {"model": self.model, "created_at": self._stamp()}
        if self.chat:
            obj["message"] = {"role": "assistant", "content": text}
            if tool_calls:
                obj["message"]["tool_calls"] = tool_calls
        else:
            obj["response"] = text
        obj["done"] = False
        return obj

    def final(self, text, finish_reason, usage, tool_calls=None):
        obj = self.piece(text, tool_calls)
        elapsed = int((self.clock() - self.start) * 1e9)
        usage = usage or {}
        obj.update(done=True, done_reason="length" if finish_reason == "length" else "stop",
                   total_duration=elapsed, load_duration=0,
                   prompt_eval_count=usage.get("prompt_tokens", 0), prompt_eval_duration=0,
                   eval_count=usage.get("completion_tokens", 0), eval_duration=elapsed)
        return obj


def _openai_tool_calls_to_ollama(calls):
    out = []
    for call in calls:
        fn = call.get("function") or {}
        try:
            arguments = json.loads(fn.get("arguments") or "{}")
        except ValueError:
            arguments = {"_raw": fn.get("arguments")}
        out.append({"function": {"name": fn.get("name", ""), "arguments": arguments}})
    return out


def translate_ollama_call(app, exchange):
    """Serve an Ollama-native call from an OpenAI-compatible provider."""
    provider = exchange.provider
    body = _ollama_to_openai(exchange.endpoint.name, exchange.payload, exchange.payload.get("model", ""))
    url = upstream_url(provider, "/v1/chat/completions", "")
    upstream = app.open_upstream(exchange.request, provider, "POST", url, json_bytes(body), "application/json")
    reply = _OllamaReply(exchange.endpoint.name, exchange.model, app.clock)
    if upstream.status >= 400:
        raw = upstream.read_all(MAX_UPSTREAM_BODY)
        try:
            message = json.loads(raw)["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = raw.decode("utf-8", "replace")[:2000] or f"upstream status {upstream.status}"
        return error_response("ollama", upstream.status, message)
    extra = exchange.response_headers
    if not body["stream"]:
        try:
            answer = json.loads(upstream.read_all(MAX_UPSTREAM_BODY))
            choice = answer["choices"][0]
            message = choice.get("message") or {}
        except (ValueError, KeyError, IndexError, TypeError):
            return error_response("ollama", 502, "upstream sent an unreadable chat completion")
        final = reply.final(message.get("content") or "", choice.get("finish_reason"), answer.get("usage"),
                            _openai_tool_calls_to_ollama(message.get("tool_calls") or []))
        return json_response(200, final, extra)
    headers_out = [("Content-Type", "application/x-ndjson"), ("Cache-Control", "no-cache"),
                   ("X-Accel-Buffering", "no")] + extra
    return StreamResponse(200, headers_out, _sse_to_ndjson(upstream, reply), upstream.close)


def _iter_sse_data(upstream):
    """The ``data:`` payloads of an SSE stream, one per event."""
    pending = b""
    while True:
        chunk = upstream.read1()
        if not chunk:
            return
        pending += chunk.replace(b"\r\n", b"\n")
        while b"\n\n" in pending:
            event, pending = pending.split(b"\n\n", 1)
            lines = [line[5:].lstrip(b" ") for line in event.split(b"\n") if line.startswith(b"data:")]
            if lines:
                yield b"\n".join(lines)


def _sse_to_ndjson(upstream, reply):
    finish, usage, calls = None, None, {}
    try:
        for data in _iter_sse_data(upstream):
            if data == b"[DONE]":
                break
            try:
                chunk = json.loads(data)
            except ValueError:
                continue
            if "error" in chunk:
                message = (chunk["error"] or {}).get("message", "upstream error") \
                    if isinstance(chunk["error"], dict) else str(chunk["error"])
                yield json_bytes({"error": message}) + b"\n"
                return
            usage = chunk.get("usage") or usage
            for choice in chunk.get("choices") or []:
                delta = choice.get("delta") or {}
                finish = choice.get("finish_reason") or finish
                for call in delta.get("tool_calls") or []:
                    slot = calls.setdefault(call.get("index", 0), {"function": {"name": "", "arguments": ""}})
                    fn = call.get("function") or {}
                    slot["function"]["name"] += fn.get("name") or ""
                    slot["function"]["arguments"] += fn.get("arguments") or ""
                if delta.get("content"):
                    yield json_bytes(reply.piece(delta["content"])) + b"\n"
        tool_calls = _openai_tool_calls_to_ollama([calls[i] for i in sorted(calls)])
        yield json_bytes(reply.final("", finish, usage, tool_calls)) + b"\n"
    except UpstreamError as exc:
        yield json_bytes({"error": f"upstream failed mid-stream: {exc}"}) + b"\n"
