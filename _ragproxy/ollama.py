"""Ollama's native chat and generate APIs served by an OpenAI-compatible upstream.

Tools that speak Ollama's /api/chat and /api/generate can use any provider:
requests become chat completions, and the answer (JSON or SSE) is turned
back into Ollama JSON or NDJSON.  Both directions are checked for the shape
the translation reads: a client's malformed body is a 400 naming the field,
an upstream's malformed answer a 502, or, once the stream has begun, an
``{"error": ...}`` line that ends it.

May import: api, upstream.
"""
from __future__ import annotations

import json
import math
import time

from .api import ClientError, Response, StreamResponse, error_response, json_bytes
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


# -- the answer --------------------------------------------------------------

class _Malformed(Exception):
    """The upstream's answer is not the chat completion the translation reads; the message says where."""


def _expect(value, types, where, expected, default=None):
    if value is None:
        return default
    if isinstance(value, types) and not isinstance(value, bool):
        return value
    raise _Malformed(f"{where} is not {expected}")


def _text(value, where):
    """A message's or delta's content: a string, or (some providers) a list of text parts."""
    if isinstance(value, list):
        texts = []
        for i, part in enumerate(value):
            part = _expect(part, dict, f"{where}[{i}]", "an object", {})
            if part.get("type", "text") == "text":
                texts.append(_expect(part.get("text"), str, f"{where}[{i}].text", "a string", ""))
        return "".join(texts)
    return _expect(value, str, where, "a string", "")


def _usage(value):
    usage = _expect(value, dict, "usage", "an object")
    if usage is None:
        return None
    return {name: _expect(usage.get(name), int, f"usage.{name}", "an integer", 0)
            for name in ("prompt_tokens", "completion_tokens")}


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


def _reply_bytes(obj):
    """One Ollama reply object encoded; _Malformed if the upstream's tool arguments nest too deeply."""
    try:
        return json_bytes(obj)
    except RecursionError:
        raise _Malformed("its tool call arguments are nested too deeply") from None


def _openai_tool_calls_to_ollama(calls, where):
    out = []
    for i, call in enumerate(_expect(calls, list, where, "an array", [])):
        call = _expect(call, dict, f"{where}[{i}]", "an object", {})
        fn = _expect(call.get("function"), dict, f"{where}[{i}].function", "an object", {})
        name = _expect(fn.get("name"), str, f"{where}[{i}].function.name", "a string", "")
        arguments = fn.get("arguments")
        if not isinstance(arguments, dict):  # a string of JSON, as chat completions send it
            arguments = _expect(arguments, str, f"{where}[{i}].function.arguments", "a string", "") or "{}"
            try:
                parsed = json.loads(arguments)
            except (ValueError, RecursionError):
                parsed = None
            arguments = parsed if isinstance(parsed, dict) else {"_raw": arguments}
        out.append({"function": {"name": name, "arguments": arguments}})
    return out


def _error_message(error):
    """The text of an OpenAI-style ``error`` member (an object with a message, or a string); None if neither."""
    if isinstance(error, dict):
        error = error.get("message")
    return error if isinstance(error, str) and error else None


def _upstream_error_message(raw, status):
    """What an upstream's error answer says: its error message, else its first 2000 characters."""
    try:
        answer = json.loads(raw)
    except (ValueError, RecursionError):
        answer = None
    message = _error_message(answer.get("error")) if isinstance(answer, dict) else None
    return message or raw.decode("utf-8", "replace")[:2000] or f"upstream status {status}"


def _final_of_completion(answer, reply):
    """The Ollama reply for a non-streamed chat completion; _Malformed if it is not one."""
    if not isinstance(answer, dict):
        raise _Malformed("it is not a JSON object")
    if answer.get("error") is not None and not answer.get("choices"):
        raise _Malformed("it is an error: " + (_error_message(answer["error"]) or "(no message)"))
    choices = _expect(answer.get("choices"), list, "choices", "an array", [])
    if not choices:
        raise _Malformed("it has no choices")
    choice = _expect(choices[0], dict, "choices[0]", "an object", {})
    message = _expect(choice.get("message"), dict, "choices[0].message", "an object", {})
    finish = _expect(choice.get("finish_reason"), str, "choices[0].finish_reason", "a string")
    calls = _openai_tool_calls_to_ollama(message.get("tool_calls"), "choices[0].message.tool_calls")
    final = reply.final(_text(message.get("content"), "choices[0].message.content"), finish,
                        _usage(answer.get("usage")), calls)
    return _reply_bytes(final)


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
        return error_response("ollama", upstream.status, _upstream_error_message(raw, upstream.status))
    extra = exchange.response_headers
    if not body["stream"]:
        raw = upstream.read_all(MAX_UPSTREAM_BODY)
        try:
            final = _final_of_completion(json.loads(raw), reply)
        except (ValueError, RecursionError):
            return error_response("ollama", 502, "the upstream's answer was malformed: not JSON")
        except _Malformed as exc:
            return error_response("ollama", 502, f"the upstream's answer was malformed: {exc}")
        return Response(200, [("Content-Type", "application/json")] + list(extra), final)
    headers_out = [("Content-Type", "application/x-ndjson"), ("Cache-Control", "no-cache"),
                   ("X-Accel-Buffering", "no")] + extra
    return StreamResponse(200, headers_out, _sse_to_ndjson(upstream, reply), upstream.close)


def _iter_sse_data(upstream, limit=MAX_UPSTREAM_BODY):
    """The ``data:`` payloads of an SSE stream, one per event; _Malformed for an event over ``limit`` bytes.

    An event is kept as the list of its reads and joined once it is whole,
    and each read is searched once: one event of many MiB, which arrives in
    hundreds of 64 KiB reads, costs time linear in its size.  CR and CRLF
    line ends count as LF, also when a read ends between the CR and the LF.
    An unfinished event at the end of the body is passed on all the same
    (the JSON parser then judges it), so an upstream that leaves out the last
    blank line loses nothing.
    """
    parts, size, cr = [], 0, False  # the unfinished event's pieces; whether the last read ended in a CR
    while True:
        chunk = upstream.read1()
        if not chunk:
            if parts:
                data = _event_data(b"".join(parts))
                if data is not None:
                    yield data
            return
        if cr:
            chunk = b"\r" + chunk
        cr = chunk.endswith(b"\r")
        if cr:
            chunk = chunk[:-1]  # perhaps the first half of a CRLF: decided by the next read
        if b"\r" in chunk:
            chunk = chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        if not chunk:
            continue
        # A blank line split between two reads: the LF ending the last one counts again.
        lead = b"\n" if parts and parts[-1].endswith(b"\n") else b""
        events = (lead + chunk if lead else chunk).split(b"\n\n")
        if len(events) == 1:
            parts.append(chunk)
            size += len(chunk)
            if size > limit:
                raise _Malformed(f"an event is larger than {limit} bytes")
            continue
        parts.append(events[0][len(lead):])
        for event in [b"".join(parts)] + events[1:-1]:
            data = _event_data(event)
            if data is not None:
                yield data
        rest = events[-1]
        parts, size = ([rest], len(rest)) if rest else ([], 0)


def _event_data(event):
    """The joined ``data:`` lines of one event, or None when it has none (a comment, a ping)."""
    lines = [line[5:].lstrip(b" ") for line in event.split(b"\n") if line.startswith(b"data:")]
    return b"\n".join(lines) if lines else None


def _sse_to_ndjson(upstream, reply):
    """Ollama NDJSON lines for a chat-completions SSE stream.

    A failure after the first line is an ``{"error": ...}`` line that ends
    the stream (all Ollama clients have to report it); the lines before it
    are the ones already sent.
    """
    finish, usage, calls, done = None, None, {}, False
    try:
        for data in _iter_sse_data(upstream):
            if data == b"[DONE]":
                done = True
                break
            try:
                chunk = json.loads(data)
            except (ValueError, RecursionError):
                raise _Malformed("an event is not JSON") from None
            if not isinstance(chunk, dict):
                raise _Malformed("an event is not a JSON object")
            if chunk.get("error") is not None:
                yield json_bytes({"error": _error_message(chunk["error"]) or "upstream error"}) + b"\n"
                return
            usage = _usage(chunk.get("usage")) or usage
            for i, choice in enumerate(_expect(chunk.get("choices"), list, "choices", "an array", [])):
                where = f"choices[{i}]"
                choice = _expect(choice, dict, where, "an object", {})
                delta = _expect(choice.get("delta"), dict, where + ".delta", "an object", {})
                finish = _expect(choice.get("finish_reason"), str, where + ".finish_reason", "a string") or finish
                for j, call in enumerate(_expect(delta.get("tool_calls"), list, where + ".delta.tool_calls",
                                                 "an array", [])):
                    at = f"{where}.delta.tool_calls[{j}]"
                    call = _expect(call, dict, at, "an object", {})
                    slot = calls.setdefault(_expect(call.get("index"), int, at + ".index", "an integer", 0),
                                            ([], []))
                    fn = _expect(call.get("function"), dict, at + ".function", "an object", {})
                    # Pieces joined at the end: a call's arguments can come in thousands of deltas.
                    slot[0].append(_expect(fn.get("name"), str, at + ".function.name", "a string", ""))
                    slot[1].append(_expect(fn.get("arguments"), str, at + ".function.arguments", "a string", ""))
                text = _text(delta.get("content"), where + ".delta.content")
                if text:
                    yield json_bytes(reply.piece(text)) + b"\n"
        if not done and finish is None:
            raise _Malformed("it ended without a finish_reason or [DONE]")
        merged = [{"function": {"name": "".join(calls[i][0]), "arguments": "".join(calls[i][1])}}
                  for i in sorted(calls)]
        yield _reply_bytes(reply.final("", finish, usage, _openai_tool_calls_to_ollama(merged, "tool_calls"))) \
            + b"\n"
    except UpstreamError as exc:
        yield json_bytes({"error": f"upstream failed mid-stream: {exc}"}) + b"\n"
    except _Malformed as exc:
        upstream.close()  # what follows a malformed event is not worth reading
        yield json_bytes({"error": f"the upstream's stream was malformed: {exc}"}) + b"\n"
