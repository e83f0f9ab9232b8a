"""Ollama's native chat and generate APIs served by an OpenAI-compatible upstream.

Tools that speak Ollama's /api/chat and /api/generate can use any provider:
requests become chat completions, and the answer (JSON or SSE) is turned
back into Ollama JSON or NDJSON.  A request is checked for the shape the
translation reads: a malformed body is a 400 naming the field.

May import: api, upstream.
"""
from __future__ import annotations

import json
import math
import time

from .api import ClientError, StreamResponse, error_response, json_bytes, json_response
from .upstream import MAX_UPSTREAM_BODY, UpstreamError, upstream_url

_NUMBER = (int, float)
# Ollama option -> (chat-completions field, accepted JSON types, what to call them).
_OLLAMA_OPTION_MAP = {"temperature": ("temperature", _NUMBER, "a number"),
                      "top_p": ("top_p", _NUMBER, "a number"),
                      "num_predict": ("max_tokens", int, "an integer"),
                      "stop": ("stop", (str, list), "a string or an array of strings"),
                      "seed": ("seed", int, "an integer"),
                      "frequency_penalty": ("frequency_penalty", _NUMBER, "a number"),
                      "presence_penalty": ("presence_penalty", _NUMBER, "a number")}


# -- the request -------------------------------------------------------------

def _checked(value, types, where, expected):
    """``value`` if it is of ``types``; a 400 naming ``where`` if not.

    A bool never stands in for a number, nor NaN or an infinity (which
    Python's parser takes, and JSON has not) for a float.
    """
    if isinstance(value, types) and (types is bool or not isinstance(value, bool)) \
            and not (isinstance(value, float) and not math.isfinite(value)):
        return value
    raise ClientError(400, f"'{where}' must be {expected}")


def _optional(obj, key, types, where, expected, default):
    value = obj.get(key)
    return default if value is None else _checked(value, types, where, expected)


def _strings(value, where):
    for i, item in enumerate(_checked(value, list, where, "an array of strings")):
        _checked(item, str, f"{where}[{i}]", "a string")
    return value


def _ollama_to_openai(endpoint_name, payload, model):
    """The chat-completions body for an Ollama /api/chat or /api/generate body; ClientError 400
    naming the field when the body is not the shape Ollama documents."""
    if endpoint_name == "ollama_chat":
        entries = _optional(payload, "messages", list, "messages", "an array of message objects", [])
        messages = [_ollama_message_to_openai(_checked(m, dict, f"messages[{i}]", "a message object"),
                                              f"messages[{i}]") for i, m in enumerate(entries)]
    elif endpoint_name == "ollama_generate":
        messages = []
        system = _optional(payload, "system", str, "system", "a string", "")
        if system:
            messages.append({"role": "system", "content": system})
        messages.append(_ollama_message_to_openai({"role": "user", "content": payload.get("prompt"),
                                                   "images": payload.get("images")}, "", "prompt"))
    else:
        raise ClientError(400, f"{endpoint_name} needs an Ollama upstream")
    stream = _optional(payload, "stream", bool, "stream", "true or false", True)
    body = {"model": model, "messages": messages, "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    options = _optional(payload, "options", dict, "options", "an object", {})
    for name, (target, types, expected) in _OLLAMA_OPTION_MAP.items():
        if options.get(name) is None:
            continue
        value = _checked(options[name], types, f"options.{name}", expected)
        if name == "stop" and isinstance(value, list):
            _strings(value, "options.stop")
        if name == "num_predict" and value < 0:
            continue  # Ollama's -1 (no limit) and -2 (fill the context): chat completions' default
        body[target] = value
    tools = _optional(payload, "tools", list, "tools", "an array of tool objects", [])
    for i, tool in enumerate(tools):
        _checked(tool, dict, f"tools[{i}]", "a tool object")
    if tools:
        body["tools"] = tools
    fmt = payload.get("format")
    if fmt == "json":
        body["response_format"] = {"type": "json_object"}
    elif isinstance(fmt, dict):
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "output", "schema": fmt}}
    elif fmt not in (None, ""):
        raise ClientError(400, "'format' must be \"json\" or a JSON schema object")
    return body


def _ollama_message_to_openai(message, where, content_name="content"):
    prefix = where + "." if where else ""
    role = _optional(message, "role", str, prefix + "role", "a string", "user")
    content = _optional(message, "content", str, prefix + content_name, "a string", "")
    out = {"role": role, "content": content}
    images = _optional(message, "images", list, prefix + "images", "an array of base64 strings", [])
    if images:
        _strings(images, prefix + "images")
        parts = [{"type": "text", "text": content}]
        parts += [{"type": "image_url", "image_url": {"url": "data:image/png;base64," + img}} for img in images]
        out["content"] = parts
    calls = _optional(message, "tool_calls", list, prefix + "tool_calls", "an array of tool calls", [])
    if calls:
        out["tool_calls"] = [_tool_call_to_openai(call, i, f"{prefix}tool_calls[{i}]") for i, call in enumerate(calls)]
    tool_call_id = _optional(message, "tool_call_id", str, prefix + "tool_call_id", "a string", "")
    if role == "tool" and tool_call_id:
        out["tool_call_id"] = tool_call_id
    return out


def _tool_call_to_openai(call, i, where):
    fn = _optional(_checked(call, dict, where, "a tool call object"), "function", dict, where + ".function",
                   "an object", {})
    name = _optional(fn, "name", str, where + ".function.name", "a string", "")
    arguments = _optional(fn, "arguments", dict, where + ".function.arguments", "an object", {})
    try:
        encoded = json.dumps(arguments)
    except RecursionError:
        raise ClientError(400, f"'{where}.function.arguments' is nested too deeply") from None
    return {"id": f"call_{i}", "type": "function", "function": {"name": name, "arguments": encoded}}


def _request_bytes(body, payload):
    """``body`` encoded; a 400 naming the field when the client nested it too deeply to encode.

    The body was parsed on a shallower stack than this one, so a body nested
    just under the parser's limit can parse and yet not encode.  Catching the
    RecursionError here costs nothing on the way every body takes.
    """
    try:
        return json_bytes(body)
    except RecursionError:
        raise ClientError(400, f"'{_deepest_field(payload)}' is nested too deeply") from None


def _deepest_field(payload):
    """The top-level field of ``payload`` that holds its most deeply nested value (walked without recursion)."""
    deepest, best = "", -1
    stack = [(value, key, 1) for key, value in payload.items()]
    while stack:
        value, key, depth = stack.pop()
        if depth > best:
            deepest, best = key, depth
        if isinstance(value, dict):
            stack.extend((v, key, depth + 1) for v in value.values())
        elif isinstance(value, list):
            stack.extend((v, key, depth + 1) for v in value)
    return deepest


# -- the answer -------------------------------------------------------------

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
    upstream = app.open_upstream(exchange.request, provider, "POST", url, _request_bytes(body, exchange.payload),
                                 "application/json")
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
