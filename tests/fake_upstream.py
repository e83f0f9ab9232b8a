"""A fake upstream LLM server for ragproxy's tests.

It speaks the real wire formats (OpenAI Chat Completions, Responses, Embeddings,
Models; Anthropic Messages and count_tokens; Ollama's native API; Jina/Cohere
rerank), streams for real (chunked transfer, one chunk per event), records every
request it receives, and can misbehave on demand (error statuses with raw bodies,
delays, dropped or hung streams).  The official ``openai`` and ``anthropic`` SDKs
work when pointed straight at it; test_fake_upstream.py proves that.

Standard library only; runs on Python 3.9+.

    with FakeUpstream() as fake:
        fake.secrets = ["hunter2"]
        ...  # point a client or the proxy at fake.url
        assert fake.last.json["model"] == "m"

Public names: FakeUpstream, Recorded, embed_text, conversation, last_user_text,
ANTHROPIC_OVERLOADED_BODY, OPENAI_RATE_LIMIT_BODY.
"""

from __future__ import annotations

import base64
import collections
import dataclasses
import hashlib
import http.server
import json
import math
import re
import secrets as _secrets
import select
import socket
import struct
import sys
import threading
import time
import urllib.parse

__all__ = [
    "FakeUpstream", "Recorded", "embed_text", "conversation", "last_user_text",
    "ANTHROPIC_OVERLOADED_BODY", "OPENAI_RATE_LIMIT_BODY",
]

# Bodies exactly as the real services send them, for fail_next().
ANTHROPIC_OVERLOADED_BODY = (
    b'{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}'
)
OPENAI_RATE_LIMIT_BODY = (
    b'{\n    "error": {\n        "message": "Rate limit reached for requests",\n'
    b'        "type": "requests",\n        "param": null,\n        "code": "rate_limit_exceeded"\n    }\n}'
)

_WORD = re.compile(r"\w+", re.UNICODE)
_TOKEN = re.compile(r"\w+|[^\w\s]", re.UNICODE)
_CONNECTION_ERRORS = (BrokenPipeError, ConnectionResetError, ConnectionAbortedError, TimeoutError)


# --------------------------------------------------------------------------
# Deterministic text helpers


def embed_text(text: str, dims: int = 64) -> list:
    """Signed feature hashing of lower-cased word tokens, L2-normalised.

    Texts sharing words get a positive cosine; the result is identical on every
    run and platform (blake2b, not hash()).  Empty text gives the zero vector.
    """
    vec = [0.0] * dims
    for word in _WORD.findall(text.lower()):
        digest = hashlib.blake2b(word.encode("utf-8"), digest_size=8).digest()
        number = int.from_bytes(digest, "little")
        vec[number % dims] += 1.0 if (number >> 63) & 1 == 0 else -1.0
    norm = math.sqrt(sum(x * x for x in vec))
    return [x / norm for x in vec] if norm else vec


def _count_tokens(text: str) -> int:
    return len(_TOKEN.findall(text))


def _split_deltas(text: str) -> list:
    """Word-sized pieces (each keeps its trailing space) that join back to text."""
    pieces = re.findall(r"\s*\S+\s*", text)
    return pieces or [text]


def _fragments(text: str, count: int = 3) -> list:
    size = max(1, -(-len(text) // count))
    return [text[i:i + size] for i in range(0, len(text), size)] or [""]


def _strings(obj) -> list:
    """Every string inside a JSON value, depth first."""
    out = []
    stack = [obj]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            out.append(item)
        elif isinstance(item, dict):
            stack.extend(reversed(list(item.values())))
        elif isinstance(item, list):
            stack.extend(reversed(item))
    return out


def _prompt_tokens(body) -> int:
    if not isinstance(body, dict):
        return 0
    return sum(_count_tokens(s) for k, v in body.items() if k != "model" for s in _strings(v))


def _dumps(obj) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def _new_id(prefix: str, nbytes: int = 12) -> str:
    return prefix + _secrets.token_hex(nbytes)


# --------------------------------------------------------------------------
# Reading conversations out of the request formats


def _text_of(content) -> str:
    if isinstance(content, str):
        return content
    parts = []
    if isinstance(content, list):
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, dict) and isinstance(part.get("text"), str) and part.get("type") in (
                None, "text", "input_text", "output_text"
            ):
                parts.append(part["text"])
    return "\n".join(parts)


def _chat_turns(messages) -> list:
    return [(m.get("role", ""), _text_of(m.get("content"))) for m in messages or [] if isinstance(m, dict)]


def _responses_turns(items) -> list:
    if isinstance(items, str):
        return [("user", items)]
    turns = []
    for item in items or []:
        if not isinstance(item, dict):
            continue
        kind = item.get("type", "message")
        if kind == "message":
            turns.append((item.get("role", ""), _text_of(item.get("content"))))
        elif kind.endswith("_call_output"):
            turns.append(("tool", _text_of(item.get("output"))))
        elif kind.endswith("_call"):
            turns.append(("assistant", ""))
    return turns


def _anthropic_turns(messages) -> list:
    turns = []
    for m in messages or []:
        if not isinstance(m, dict):
            continue
        content = m.get("content")
        blocks = content if isinstance(content, list) else []
        results = [b for b in blocks if isinstance(b, dict) and b.get("type") == "tool_result"]
        if m.get("role") == "user" and results and not _text_of(blocks):
            turns.append(("tool", "\n".join(_text_of(b.get("content")) for b in results)))
        else:
            turns.append((m.get("role", ""), _text_of(content)))
    return turns


def conversation(recorded: "Recorded") -> list:
    """[(role, text), ...] of a recorded request, whatever its format.

    Tool results become role "tool", so the turn after a tool call is not mistaken
    for the user asking again.
    """
    body = recorded.json if isinstance(recorded.json, dict) else {}
    path = recorded.path
    if path.startswith("/v1/messages"):
        return _anthropic_turns(body.get("messages"))
    if path == "/v1/responses":
        return _responses_turns(body.get("input"))
    if path == "/api/generate":
        return [("user", body.get("prompt") or "")]
    return _chat_turns(body.get("messages"))


def last_user_text(recorded: "Recorded") -> str:
    for role, text in reversed(conversation(recorded)):
        if role == "user" and text:
            return text
    return ""


def _first_tool(tools):
    """(name, json_schema) of the first callable tool, or None."""
    candidates = [t for t in tools or [] if isinstance(t, dict)]
    for want_plain in (True, False):
        for tool in candidates:
            function = tool.get("function") if isinstance(tool.get("function"), dict) else {}
            name = tool.get("name") or function.get("name")
            if not name or (want_plain and tool.get("type") not in (None, "function", "custom")):
                continue
            schema = tool.get("parameters") or tool.get("input_schema") or function.get("parameters")
            return name, schema if isinstance(schema, dict) else {}
    return None


_PLACEHOLDERS = {"string": "fake", "integer": 1, "number": 1, "boolean": True, "array": [], "object": {}}


def _placeholder_arguments(schema: dict) -> dict:
    args = {}
    for name, spec in (schema.get("properties") or {}).items():
        spec = spec if isinstance(spec, dict) else {}
        kind = spec.get("type")
        if isinstance(kind, list):
            kind = next((k for k in kind if k != "null"), None)
        args[name] = spec["enum"][0] if spec.get("enum") else _PLACEHOLDERS.get(kind, "fake")
    return args


# --------------------------------------------------------------------------
# Records and replies


@dataclasses.dataclass
class Recorded:
    """One request as the fake received it."""

    method: str
    path: str                      # without the query string
    query: dict                    # {name: last value}
    headers: dict                  # lower-cased names; repeated headers joined with ", "
    body: bytes                    # de-chunked
    json: object = None            # parsed body, or None when it is not JSON
    raw_headers: list = dataclasses.field(default_factory=list)        # [(name, value)] as sent
    response_status: int = 0                                           # 0 until answered
    response_body: bytearray = dataclasses.field(default_factory=bytearray)  # payload sent so far


@dataclasses.dataclass
class _Body:
    status: int
    data: bytes
    content_type: str = "application/json"
    headers: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class _Stream:
    events: list                   # encoded events (bytes), one chunk each
    content_type: str = "text/event-stream; charset=utf-8"


@dataclasses.dataclass
class _Failure:
    status: int
    body: object                   # bytes, or None for the endpoint's usual error shape
    headers: dict
    path: object                   # only requests to this path, or None for any
    remaining: int


@dataclasses.dataclass
class _Plan:
    """What to answer: either text or one call of the first tool."""

    model: str
    text: str
    tool_name: str = ""
    arguments: str = ""            # JSON text of the call's arguments
    input_tokens: int = 0

    @property
    def output_tokens(self) -> int:
        return _count_tokens(self.arguments if self.tool_name else self.text)


class _BadRequest(Exception):
    pass


def _sse(event_type: str, obj) -> bytes:
    return b"event: " + event_type.encode() + b"\ndata: " + _dumps(obj) + b"\n\n"


def _sse_data(obj) -> bytes:
    return b"data: " + _dumps(obj) + b"\n\n"


def _json(obj, status: int = 200) -> _Body:
    return _Body(status, _dumps(obj))


# --------------------------------------------------------------------------
# Error shapes per API family

_ANTHROPIC_ERROR_TYPES = {
    400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
    404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
    500: "api_error", 529: "overloaded_error",
}
_OPENAI_ERROR_TYPES = {
    400: "invalid_request_error", 401: "invalid_request_error", 403: "invalid_request_error",
    404: "invalid_request_error", 429: "rate_limit_exceeded",
}


def _error_body(family: str, status: int, message: str) -> bytes:
    if family == "anthropic":
        kind = _ANTHROPIC_ERROR_TYPES.get(status, "api_error")
        return _dumps({"type": "error", "error": {"type": kind, "message": message}})
    if family == "ollama":
        return _dumps({"error": message})
    kind = _OPENAI_ERROR_TYPES.get(status, "server_error")
    return _dumps({"error": {"message": message, "type": kind, "param": None, "code": None}})


# --------------------------------------------------------------------------
# OpenAI Chat Completions


def _chat_usage(plan: _Plan) -> dict:
    return {
        "prompt_tokens": plan.input_tokens,
        "completion_tokens": plan.output_tokens,
        "total_tokens": plan.input_tokens + plan.output_tokens,
        "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
        "completion_tokens_details": {
            "reasoning_tokens": 0, "audio_tokens": 0,
            "accepted_prediction_tokens": 0, "rejected_prediction_tokens": 0,
        },
    }


def _chat_completion(plan: _Plan) -> dict:
    message = {"role": "assistant", "content": plan.text, "refusal": None, "annotations": []}
    finish = "stop"
    if plan.tool_name:
        message["content"] = None
        message["tool_calls"] = [{
            "id": _new_id("call_"), "type": "function",
            "function": {"name": plan.tool_name, "arguments": plan.arguments},
        }]
        finish = "tool_calls"
    return {
        "id": _new_id("chatcmpl-"), "object": "chat.completion", "created": int(time.time()),
        "model": plan.model,
        "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish}],
        "usage": _chat_usage(plan), "service_tier": "default", "system_fingerprint": "fp_fake",
    }


def _chat_chunks(plan: _Plan, include_usage: bool) -> list:
    base = {"id": _new_id("chatcmpl-"), "object": "chat.completion.chunk", "created": int(time.time()),
            "model": plan.model, "service_tier": "default", "system_fingerprint": "fp_fake"}

    def chunk(delta, finish=None):
        obj = dict(base, choices=[{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}])
        if include_usage:
            obj["usage"] = None
        return _sse_data(obj)

    if plan.tool_name:
        call = {"index": 0, "id": _new_id("call_"), "type": "function",
                "function": {"name": plan.tool_name, "arguments": ""}}
        events = [chunk({"role": "assistant", "content": None, "tool_calls": [call], "refusal": None})]
        events += [chunk({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]})
                   for piece in _fragments(plan.arguments)]
        events.append(chunk({}, "tool_calls"))
    else:
        events = [chunk({"role": "assistant", "content": "", "refusal": None})]
        events += [chunk({"content": piece}) for piece in _split_deltas(plan.text)]
        events.append(chunk({}, "stop"))
    if include_usage:
        events.append(_sse_data(dict(base, choices=[], usage=_chat_usage(plan))))
    events.append(b"data: [DONE]\n\n")
    return events


def _handle_chat(fake, rec):
    body = rec.json
    plan = fake._plan(rec, body.get("tools"))
    if not body.get("stream"):
        return _json(_chat_completion(plan))
    options = body.get("stream_options") or {}
    return _Stream(_chat_chunks(plan, bool(options.get("include_usage"))))


# --------------------------------------------------------------------------
# OpenAI Responses


def _responses_usage(plan: _Plan) -> dict:
    return {
        "input_tokens": plan.input_tokens,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": plan.output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": plan.input_tokens + plan.output_tokens,
    }


def _response_object(body: dict, plan: _Plan, response_id: str, status: str, output: list) -> dict:
    done = status == "completed"
    return {
        "id": response_id, "object": "response", "created_at": int(time.time()), "status": status,
        "background": False, "completed_at": int(time.time()) if done else None,
        "error": None, "incomplete_details": None,
        "instructions": body.get("instructions"), "max_output_tokens": body.get("max_output_tokens"),
        "model": plan.model, "output": output,
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "previous_response_id": body.get("previous_response_id"),
        "reasoning": body.get("reasoning") or {"effort": None, "summary": None},
        "store": body.get("store", True), "temperature": body.get("temperature", 1.0),
        "text": body.get("text") or {"format": {"type": "text"}},
        "tool_choice": body.get("tool_choice", "auto"), "tools": body.get("tools") or [],
        "top_p": body.get("top_p", 1.0), "truncation": body.get("truncation", "disabled"),
        "usage": _responses_usage(plan) if done else None,
        "user": None, "metadata": body.get("metadata") or {},
    }


def _output_text_part(text: str) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _output_item(plan: _Plan, item_id: str, call_id: str, done: bool) -> dict:
    status = "completed" if done else "in_progress"
    if plan.tool_name:
        return {"id": item_id, "type": "function_call", "status": status,
                "arguments": plan.arguments if done else "", "call_id": call_id, "name": plan.tool_name}
    content = [_output_text_part(plan.text)] if done else []
    return {"id": item_id, "type": "message", "status": status, "role": "assistant", "content": content}


def _responses_events(body: dict, plan: _Plan) -> list:
    response_id = _new_id("resp_", 24)
    item_id = _new_id("fc_" if plan.tool_name else "msg_", 24)
    call_id = _new_id("call_")
    raw = []  # (type, payload) without sequence numbers

    def lifecycle(kind, status, output):
        raw.append((kind, {"response": _response_object(body, plan, response_id, status, output)}))

    lifecycle("response.created", "in_progress", [])
    lifecycle("response.in_progress", "in_progress", [])
    raw.append(("response.output_item.added",
                {"output_index": 0, "item": _output_item(plan, item_id, call_id, False)}))
    where = {"item_id": item_id, "output_index": 0}
    if plan.tool_name:
        for piece in _fragments(plan.arguments):
            raw.append(("response.function_call_arguments.delta", dict(where, delta=piece)))
        raw.append(("response.function_call_arguments.done", dict(where, arguments=plan.arguments)))
    else:
        where["content_index"] = 0
        raw.append(("response.content_part.added", dict(where, part=_output_text_part(""))))
        for piece in _split_deltas(plan.text):
            raw.append(("response.output_text.delta", dict(where, delta=piece, logprobs=[])))
        raw.append(("response.output_text.done", dict(where, text=plan.text, logprobs=[])))
        raw.append(("response.content_part.done", dict(where, part=_output_text_part(plan.text))))
    final_item = _output_item(plan, item_id, call_id, True)
    raw.append(("response.output_item.done", {"output_index": 0, "item": final_item}))
    lifecycle("response.completed", "completed", [final_item])
    return [_sse(kind, dict({"type": kind, "sequence_number": n}, **payload))
            for n, (kind, payload) in enumerate(raw)]


def _handle_responses(fake, rec):
    body = rec.json
    plan = fake._plan(rec, body.get("tools"))
    if body.get("stream"):
        return _Stream(_responses_events(body, plan))
    item = _output_item(plan, _new_id("fc_" if plan.tool_name else "msg_", 24), _new_id("call_"), True)
    return _json(_response_object(body, plan, _new_id("resp_", 24), "completed", [item]))


# --------------------------------------------------------------------------
# Anthropic Messages


def _anthropic_usage(plan: _Plan, output_tokens: int) -> dict:
    return {
        "input_tokens": plan.input_tokens, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0,
        "cache_creation": {"ephemeral_5m_input_tokens": 0, "ephemeral_1h_input_tokens": 0},
        "output_tokens": output_tokens, "service_tier": "standard",
    }


def _anthropic_message(plan: _Plan, content: list, stop_reason, output_tokens: int) -> dict:
    return {
        "id": _new_id("msg_01", 11), "type": "message", "role": "assistant", "model": plan.model,
        "content": content, "stop_reason": stop_reason, "stop_sequence": None,
        "usage": _anthropic_usage(plan, output_tokens),
    }


def _anthropic_block(plan: _Plan, complete: bool) -> dict:
    if plan.tool_name:
        arguments = json.loads(plan.arguments) if complete else {}
        return {"type": "tool_use", "id": _new_id("toolu_01", 11), "name": plan.tool_name, "input": arguments}
    return {"type": "text", "text": plan.text if complete else ""}


def _anthropic_events(plan: _Plan) -> list:
    stop_reason = "tool_use" if plan.tool_name else "end_turn"
    events = [
        _sse("message_start", {"type": "message_start", "message": _anthropic_message(plan, [], None, 1)}),
        _sse("ping", {"type": "ping"}),
        _sse("content_block_start",
             {"type": "content_block_start", "index": 0, "content_block": _anthropic_block(plan, False)}),
    ]
    if plan.tool_name:
        deltas = [{"type": "input_json_delta", "partial_json": piece} for piece in [""] + _fragments(plan.arguments)]
    else:
        deltas = [{"type": "text_delta", "text": piece} for piece in _split_deltas(plan.text)]
    events += [_sse("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": d}) for d in deltas]
    events.append(_sse("content_block_stop", {"type": "content_block_stop", "index": 0}))
    usage = _anthropic_usage(plan, plan.output_tokens)
    del usage["cache_creation"], usage["service_tier"]
    events.append(_sse("message_delta", {
        "type": "message_delta", "delta": {"stop_reason": stop_reason, "stop_sequence": None}, "usage": usage,
    }))
    events.append(_sse("message_stop", {"type": "message_stop"}))
    return events


def _handle_messages(fake, rec):
    body = rec.json
    plan = fake._plan(rec, body.get("tools"))
    if body.get("stream"):
        return _Stream(_anthropic_events(plan))
    stop_reason = "tool_use" if plan.tool_name else "end_turn"
    return _json(_anthropic_message(plan, [_anthropic_block(plan, True)], stop_reason, plan.output_tokens))


def _handle_count_tokens(fake, rec):
    return _json({"input_tokens": _prompt_tokens(rec.json)})


# --------------------------------------------------------------------------
# Models, embeddings, rerank


def _handle_models(fake, rec):
    if "anthropic-version" in rec.headers:
        data = [{"type": "model", "id": m, "display_name": m, "created_at": "2025-01-01T00:00:00Z"}
                for m in fake.models]
        return _json({"data": data, "has_more": False,
                      "first_id": data[0]["id"] if data else None, "last_id": data[-1]["id"] if data else None})
    return _json({"object": "list", "data": [
        {"id": m, "object": "model", "created": 1700000000, "owned_by": "fake"} for m in fake.models
    ]})


def _embedding_inputs(value) -> list:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value and all(isinstance(v, int) for v in value):
        return [" ".join(map(str, value))]  # one pre-tokenised input
    if isinstance(value, list):
        return [v if isinstance(v, str) else " ".join(map(str, v)) for v in value]
    raise _BadRequest("'input' must be a string or a list")


def _handle_embeddings(fake, rec):
    body = rec.json
    texts = _embedding_inputs(body.get("input"))
    dims = int(body.get("dimensions") or fake.embedding_dims)
    as_base64 = body.get("encoding_format") == "base64"
    data = []
    for index, text in enumerate(texts):
        vec = embed_text(text, dims)
        if as_base64:
            vec = base64.b64encode(struct.pack("<%df" % len(vec), *vec)).decode("ascii")
        data.append({"object": "embedding", "index": index, "embedding": vec})
    tokens = sum(_count_tokens(t) for t in texts)
    return _json({"object": "list", "data": data, "model": body.get("model", ""),
                  "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})


def _overlap_score(query: str, document: str) -> float:
    wanted = set(_WORD.findall(query.lower()))
    if not wanted:
        return 0.0
    return len(wanted & set(_WORD.findall(document.lower()))) / len(wanted)


def _handle_rerank(fake, rec):
    body = rec.json
    query = body.get("query") or ""
    if "texts" in body:  # TEI's native shape answers with a bare list
        scored = [{"index": i, "score": _overlap_score(query, t)} for i, t in enumerate(body["texts"])]
        return _json(sorted(scored, key=lambda r: -r["score"]))
    documents = [d.get("text", "") if isinstance(d, dict) else str(d) for d in body.get("documents") or []]
    results = [{"index": i, "relevance_score": _overlap_score(query, d)} for i, d in enumerate(documents)]
    results.sort(key=lambda r: -r["relevance_score"])  # stable: ties keep document order
    if body.get("top_n") is not None:
        results = results[:int(body["top_n"])]
    if body.get("return_documents"):
        for r in results:
            r["document"] = {"text": documents[r["index"]]}
    tokens = _count_tokens(query) + sum(_count_tokens(d) for d in documents)
    return _json({"id": _new_id("rerank-"), "model": body.get("model", ""), "results": results,
                  "usage": {"total_tokens": tokens}})


# --------------------------------------------------------------------------
# Ollama native API


def _ollama_time() -> str:
    now = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + ".%09dZ" % int((now % 1) * 1e9)


def _ollama_final(plan: _Plan) -> dict:
    return {"done": True, "done_reason": "stop", "total_duration": 1000000, "load_duration": 100000,
            "prompt_eval_count": plan.input_tokens, "prompt_eval_duration": 200000,
            "eval_count": plan.output_tokens, "eval_duration": 700000}


def _ollama_reply(rec, plan: _Plan, pieces: list, final: dict, piece_fields):
    if rec.json.get("stream", True) is False:
        return _json(dict({"model": plan.model, "created_at": _ollama_time()}, **piece_fields(plan.text), **final))
    lines = [_dumps(dict({"model": plan.model, "created_at": _ollama_time()}, **piece_fields(p), done=False))
             + b"\n" for p in pieces]
    lines.append(_dumps(dict({"model": plan.model, "created_at": _ollama_time()}, **piece_fields(""), **final))
                 + b"\n")
    return _Stream(lines, "application/x-ndjson")


def _handle_ollama_chat(fake, rec):
    plan = fake._plan(rec, rec.json.get("tools"))
    if plan.tool_name:
        call = {"id": _new_id("call_", 4),
                "function": {"index": 0, "name": plan.tool_name, "arguments": json.loads(plan.arguments)}}
        message = {"role": "assistant", "content": "", "tool_calls": [call]}
        reply = dict({"model": plan.model, "created_at": _ollama_time(), "message": message}, **_ollama_final(plan))
        if rec.json.get("stream", True) is False:
            return _json(reply)
        # Ollama sends the whole call in one line, then the closing line.
        first = {"model": plan.model, "created_at": _ollama_time(), "message": message, "done": False}
        last = dict(reply, message={"role": "assistant", "content": ""})
        return _Stream([_dumps(first) + b"\n", _dumps(last) + b"\n"], "application/x-ndjson")
    return _ollama_reply(rec, plan, _split_deltas(plan.text), _ollama_final(plan),
                         lambda text: {"message": {"role": "assistant", "content": text}})


def _handle_ollama_generate(fake, rec):
    plan = fake._plan(rec, None)
    final = dict(_ollama_final(plan), context=[1, 2, 3])
    return _ollama_reply(rec, plan, _split_deltas(plan.text), final, lambda text: {"response": text})


def _ollama_details() -> dict:
    return {"parent_model": "", "format": "gguf", "family": "llama", "families": ["llama"],
            "parameter_size": "1B", "quantization_level": "Q4_K_M"}


def _handle_ollama_tags(fake, rec):
    models = [{"name": m, "model": m, "modified_at": "2025-01-01T00:00:00Z", "size": 1000000,
               "digest": hashlib.sha256(m.encode()).hexdigest(), "details": _ollama_details()}
              for m in fake.models]
    return _json({"models": models})


def _handle_ollama_version(fake, rec):
    return _json({"version": "0.12.0"})


def _handle_ollama_show(fake, rec):
    return _json({
        "modelfile": "FROM fake\n", "parameters": "", "template": "{{ .Prompt }}",
        "details": _ollama_details(),
        "model_info": {"general.architecture": "llama", "llama.context_length": 8192,
                       "llama.embedding_length": fake.embedding_dims},
        "capabilities": ["completion", "tools", "embedding"], "modified_at": "2025-01-01T00:00:00Z",
    })


def _handle_ollama_embed(fake, rec):
    texts = _embedding_inputs(rec.json.get("input", ""))
    return _json({"model": rec.json.get("model", ""),
                  "embeddings": [embed_text(t, fake.embedding_dims) for t in texts],
                  "total_duration": 100000, "load_duration": 10000,
                  "prompt_eval_count": sum(_count_tokens(t) for t in texts)})


def _handle_ollama_embeddings(fake, rec):  # the older single-prompt endpoint
    return _json({"embedding": embed_text(rec.json.get("prompt") or "", fake.embedding_dims)})


def _handle_head_root(fake, rec):
    return _Body(200, b"", "text/plain")


# (method, path) -> (handler, error family, needs a JSON object body)
_ROUTES = {
    ("POST", "/v1/chat/completions"): (_handle_chat, "openai", True),
    ("POST", "/v1/responses"): (_handle_responses, "openai", True),
    ("POST", "/v1/messages"): (_handle_messages, "anthropic", True),
    ("POST", "/v1/messages/count_tokens"): (_handle_count_tokens, "anthropic", True),
    ("GET", "/v1/models"): (_handle_models, "openai", False),
    ("POST", "/v1/embeddings"): (_handle_embeddings, "openai", True),
    ("POST", "/v1/rerank"): (_handle_rerank, "openai", True),
    ("POST", "/rerank"): (_handle_rerank, "openai", True),
    ("POST", "/api/chat"): (_handle_ollama_chat, "ollama", True),
    ("POST", "/api/generate"): (_handle_ollama_generate, "ollama", True),
    ("GET", "/api/tags"): (_handle_ollama_tags, "ollama", False),
    ("GET", "/api/version"): (_handle_ollama_version, "ollama", False),
    ("POST", "/api/show"): (_handle_ollama_show, "ollama", True),
    ("POST", "/api/embed"): (_handle_ollama_embed, "ollama", True),
    ("POST", "/api/embeddings"): (_handle_ollama_embeddings, "ollama", True),
    ("HEAD", "/"): (_handle_head_root, "openai", False),
}


def _family_of(path: str) -> str:
    if path.startswith("/v1/messages"):
        return "anthropic"
    return "ollama" if path.startswith("/api/") else "openai"


# --------------------------------------------------------------------------
# HTTP plumbing


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False  # a hung stream must not block close()
    allow_reuse_address = True

    def handle_error(self, request, client_address):
        # Connection errors are normal here; anything else is kept for the test to see.
        error = sys.exc_info()[1]
        if not isinstance(error, OSError):
            self.fake.errors.append(error)


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    server_version = "FakeUpstream/1.0"
    sys_version = ""

    def setup(self):
        super().setup()
        self.server.fake._opened(self.connection)

    def finish(self):
        try:
            super().finish()
        except OSError:
            pass
        finally:
            self.server.fake._finished(self.connection)

    def handle(self):
        try:
            super().handle()
        except _CONNECTION_ERRORS:
            pass

    def log_message(self, format, *args):
        pass

    def do_GET(self):
        self._serve()

    do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = do_OPTIONS = do_GET

    # -- request

    def _read_body(self) -> bytes:
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            out = bytearray()
            while True:
                size = int(self.rfile.readline(65537).split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline(65537) not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    return bytes(out)
                out += self.rfile.read(size)
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _record(self) -> Recorded:
        split = urllib.parse.urlsplit(self.path)
        body = self._read_body()
        parsed = None
        if body:
            try:
                parsed = json.loads(body)
            except (ValueError, RecursionError):  # not JSON to us, as to a real server
                parsed = None
        headers = {}
        for name, value in self.headers.items():
            key = name.lower()
            headers[key] = headers[key] + ", " + value if key in headers else value
        return Recorded(
            method=self.command, path=split.path or "/",
            query=dict(urllib.parse.parse_qsl(split.query, keep_blank_values=True)),
            headers=headers, body=body, json=parsed, raw_headers=list(self.headers.items()),
        )

    # -- the exchange

    def _serve(self):
        fake = self.server.fake
        rec = self._record()
        fake._append(rec)
        self.rec = rec
        if fake.delay and not self._pause(fake.delay):
            return
        failure = fake._take_failure(rec.path)
        if failure is not None:
            family = _family_of(rec.path)
            data = failure.body if failure.body is not None else _error_body(
                family, failure.status, "fake failure %d" % failure.status)
            self._send_body(_Body(failure.status, data, headers=failure.headers))
            return
        if fake.hang_after_events == 0:
            self._hang()
            return
        if fake.drop_after_events == 0:
            self._drop()
            return
        self._send(self._reply(fake, rec))

    def _reply(self, fake, rec):
        route = _ROUTES.get((rec.method, rec.path))
        if route is None:
            message = "Invalid URL (%s %s)" % (rec.method, rec.path)
            return _Body(404, _error_body("openai", 404, message))
        handler, family, needs_object = route
        if needs_object and not isinstance(rec.json, dict):
            return _Body(400, _error_body(family, 400, "request body must be a JSON object"))
        try:
            return handler(fake, rec)
        except _BadRequest as error:
            return _Body(400, _error_body(family, 400, str(error)))
        except Exception as error:  # a bug in the fake: make it visible to the test
            fake.errors.append(error)
            return _Body(500, _error_body(family, 500, "fake upstream error: %r" % error))

    def _send(self, reply):
        if isinstance(reply, _Stream):
            self._send_stream(reply)
        else:
            self._send_body(reply)

    def _start(self, status: int, headers: dict):
        self.rec.response_status = status
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()

    def _send_body(self, reply: _Body):
        headers = {"Content-Type": reply.content_type, "Content-Length": str(len(reply.data)),
                   "x-request-id": _new_id("req_")}
        headers.update(reply.headers or {})
        try:
            self._start(reply.status, headers)
        except _CONNECTION_ERRORS:
            self._client_gone()
            return
        if self.command != "HEAD" and reply.data:
            self._write(reply.data)

    def _send_stream(self, reply: _Stream):
        fake = self.server.fake
        try:
            self._start(200, {"Content-Type": reply.content_type, "Transfer-Encoding": "chunked",
                              "Cache-Control": "no-cache", "x-request-id": _new_id("req_")})
        except _CONNECTION_ERRORS:
            self._client_gone()
            return
        for sent, event in enumerate(reply.events):
            if fake.hang_after_events is not None and sent >= fake.hang_after_events:
                self._hang()
                return
            if fake.drop_after_events is not None and sent >= fake.drop_after_events:
                self._drop()
                return
            if sent and fake.event_delay and not self._pause(fake.event_delay):
                return
            if not self._write(event, chunked=True):
                return
        if fake.end_delay and not self._pause(fake.end_delay):
            return
        self._write(b"", chunked=True)

    # -- socket-level behaviour

    def _write(self, data: bytes, chunked: bool = False) -> bool:
        wire = b"%x\r\n%s\r\n" % (len(data), data) if chunked else data
        try:
            self.wfile.write(wire)
            self.wfile.flush()
        except _CONNECTION_ERRORS + (OSError,):
            self._client_gone()
            return False
        self.rec.response_body += data
        return True

    def _client_gone(self):
        self.close_connection = True
        self.server.fake._disconnected()

    def _peer_closed(self, timeout: float) -> bool:
        """True once the client has closed its end; waits at most timeout."""
        try:
            readable, _, _ = select.select([self.connection], [], [], timeout)
            if not readable:
                return False
            if self.connection.recv(1, socket.MSG_PEEK) == b"":
                return True
        except (OSError, ValueError):
            return True
        time.sleep(timeout)  # bytes are waiting (a pipelined request): not a close
        return False

    def _pause(self, seconds: float) -> bool:
        """Sleep, watching for the client going away; False if it did."""
        deadline = time.monotonic() + seconds
        fake = self.server.fake
        while not fake._closing.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return True
            if self._peer_closed(min(0.02, remaining)):
                self._client_gone()
                return False
        self.close_connection = True
        return False

    def _hang(self):
        """Send nothing more; keep the socket open until the client leaves."""
        fake = self.server.fake
        deadline = time.monotonic() + fake.hang_limit
        while not fake._closing.is_set() and time.monotonic() < deadline:
            if self._peer_closed(0.02):
                self._client_gone()
                return
        self.close_connection = True

    def _drop(self):
        self.close_connection = True
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


# --------------------------------------------------------------------------
# The public object


class FakeUpstream:
    """A real HTTP server on 127.0.0.1 that imitates LLM APIs.

    Settable per test:
      reply_fn(recorded) -> str   the text to answer (default: default_reply)
      secrets                     strings default_reply reports as "FOUND: <s>"
      models                      ids served by /v1/models, /api/tags
      embedding_dims              default vector size (64)
      tool_arguments              dict used for tool calls instead of schema placeholders
      tool_call_fn(recorded)      -> (tool name, arguments dict) to call, or None to answer with
                                  text; when set it decides instead of the CALL_TOOL rule (an
                                  agent such as Claude Code offers dozens of tools and adds turns)
      delay                       seconds to wait before answering
      event_delay                 seconds between stream events
      end_delay                   seconds between a stream's last event and the end of its body
      drop_after_events           close the socket after N stream events (0: before any reply)
      hang_after_events           stop after N stream events (0: before any reply) and wait
                                  for the client to close, counting it in client_disconnects
      hang_limit                  a hung reply gives up after this many seconds (60)
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0, tls=None):
        self.host = host
        self.port = port
        self.tls = tls  # an ssl.SSLContext: serve https with it
        self.reply_fn = self.default_reply
        self.secrets = []
        self.models = ["fake-model", "claude-fake-model"]
        self.embedding_dims = 64
        self.tool_arguments = None
        self.tool_call_fn = None
        self.delay = 0.0
        self.event_delay = 0.0
        self.end_delay = 0.0
        self.drop_after_events = None
        self.hang_after_events = None
        self.hang_limit = 60.0  # so no hung thread outlives a test run
        self.errors = []  # exceptions raised inside the fake (bugs), for tests to assert empty
        self.client_disconnected = threading.Event()
        self._requests = []
        self._failures = collections.deque()
        self._lock = threading.Lock()
        self._connections = set()
        self._connections_opened = 0
        self._client_disconnects = 0
        self._closing = threading.Event()
        self._server = None
        self._thread = None

    # -- lifecycle

    def start(self) -> "FakeUpstream":
        if self._server is not None:
            return self
        self._closing.clear()
        self._server = _Server((self.host, self.port), _Handler)
        self._server.fake = self
        if self.tls is not None:  # the handshake happens in accept(); a refused one only drops that client
            self._server.socket = self.tls.wrap_socket(self._server.socket, server_side=True)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.01},
                                        name="FakeUpstream:%d" % self.port, daemon=True)
        self._thread.start()
        return self

    def close(self):
        if self._server is None:
            return
        self._closing.set()
        self._server.shutdown()
        with self._lock:
            open_connections = list(self._connections)
        for conn in open_connections:  # wake keep-alive threads blocked on a read
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._server.server_close()
        self._thread.join(timeout=5)
        self._server = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc_info):
        self.close()

    @property
    def url(self) -> str:
        if self._server is None:
            raise RuntimeError("FakeUpstream is not started")
        host = "127.0.0.1" if self.host in ("", "0.0.0.0") else self.host
        return "%s://%s:%d" % ("https" if self.tls else "http", host, self.port)

    # -- what it received

    @property
    def requests(self) -> list:
        """A snapshot copy of the recorded requests, oldest first."""
        with self._lock:
            return list(self._requests)

    @property
    def last(self):
        """The most recent request, or None."""
        with self._lock:
            return self._requests[-1] if self._requests else None

    def clear(self):
        """Forget recorded requests, disconnects and pending failures (not the settings)."""
        with self._lock:
            self._requests.clear()
            self._failures.clear()
            self._client_disconnects = 0
            self.client_disconnected.clear()

    @property
    def connections_opened(self) -> int:
        with self._lock:
            return self._connections_opened

    @property
    def client_disconnects(self) -> int:
        """How many times a client went away before its reply was finished."""
        with self._lock:
            return self._client_disconnects

    def wait_for_disconnect(self, timeout: float = 5.0) -> bool:
        return self.client_disconnected.wait(timeout)

    def wait_for_requests(self, count: int, timeout: float = 5.0) -> bool:
        """Block until at least count requests were recorded."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if len(self._requests) >= count:
                    return True
            time.sleep(0.005)
        return False

    # -- behaviour

    def fail_next(self, status: int, body=None, headers=None, count: int = 1, path=None):
        """Answer the next count requests (to path, if given) with status and body.

        body is sent byte for byte; None gives the endpoint's usual error shape.
        """
        if isinstance(body, str):
            body = body.encode("utf-8")
        with self._lock:
            self._failures.append(_Failure(status, body, dict(headers or {}), path, count))

    def reset_faults(self):
        self.delay = self.event_delay = self.end_delay = 0.0
        self.drop_after_events = self.hang_after_events = None
        with self._lock:
            self._failures.clear()

    def default_reply(self, recorded: Recorded) -> str:
        """'FOUND: <secret>' if a secret reached us, else 'ECHO: <last user text[:200]>'."""
        haystacks = [recorded.body.decode("utf-8", "replace")]
        if recorded.json is not None:
            haystacks.append("\n".join(_strings(recorded.json)))  # secrets that JSON escaping hides
        for secret in self.secrets:
            if any(secret in hay for hay in haystacks):
                return "FOUND: " + secret
        return "ECHO: " + last_user_text(recorded)[:200]

    # -- used by the handler

    def _plan(self, rec: Recorded, tools) -> _Plan:
        body = rec.json
        plan = _Plan(model=str(body.get("model") or "fake-model"), text="", input_tokens=_prompt_tokens(body))
        if self.tool_call_fn is not None:
            call = self.tool_call_fn(rec)
            if call:
                plan.tool_name, plan.arguments = call[0], json.dumps(call[1], separators=(",", ":"))
                return plan
            plan.text = str((self.reply_fn or self.default_reply)(rec))
            return plan
        turns = conversation(rec)
        tool = _first_tool(tools)
        if tool and turns and turns[-1][0] == "user" and "CALL_TOOL" in turns[-1][1]:
            arguments = self.tool_arguments if self.tool_arguments is not None else _placeholder_arguments(tool[1])
            plan.tool_name, plan.arguments = tool[0], json.dumps(arguments, separators=(",", ":"))
            return plan
        plan.text = str((self.reply_fn or self.default_reply)(rec))
        return plan

    def _append(self, rec: Recorded):
        with self._lock:
            self._requests.append(rec)

    def _take_failure(self, path: str):
        with self._lock:
            for failure in self._failures:
                if failure.path is None or failure.path == path:
                    failure.remaining -= 1
                    if failure.remaining <= 0:
                        self._failures.remove(failure)
                    return failure
        return None

    def _opened(self, conn):
        with self._lock:
            self._connections_opened += 1
            self._connections.add(conn)

    def _finished(self, conn):
        with self._lock:
            self._connections.discard(conn)

    def _disconnected(self):
        with self._lock:
            self._client_disconnects += 1
        self.client_disconnected.set()
