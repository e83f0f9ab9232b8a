"""The fake upstream must be indistinguishable from the real APIs for real clients.

The official openai and anthropic SDKs are pointed straight at it; raw sockets check
the bytes on the wire where the SDKs would hide them.  SDK tests are skipped on an
interpreter without the SDKs (the raw ones still run).  The ``fake`` fixture is in
conftest.py.
"""

import base64
import http.client
import json
import math
import select
import socket
import struct

import pytest

from fake_upstream import (
    ANTHROPIC_OVERLOADED_BODY,
    OPENAI_RATE_LIMIT_BODY,
    embed_text,
    last_user_text,
)

WEATHER_CHAT_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                   "required": ["city"]},
}}
WEATHER_RESPONSES_TOOL = dict(WEATHER_CHAT_TOOL["function"], type="function")
WEATHER_ANTHROPIC_TOOL = {"name": "get_weather", "description": "Weather for a city",
                          "input_schema": WEATHER_CHAT_TOOL["function"]["parameters"]}
EXPECTED_ARGS = {"city": "fake", "days": 1}


@pytest.fixture
def oai(fake):
    openai = pytest.importorskip("openai")
    return openai.OpenAI(base_url=fake.url + "/v1", api_key="x", max_retries=0, timeout=10)


@pytest.fixture
def ant(fake):
    anthropic = pytest.importorskip("anthropic")
    return anthropic.Anthropic(base_url=fake.url, api_key="x", max_retries=0, timeout=10)


# -- raw HTTP helpers: what the wire really carries


def _connect(fake):
    return socket.create_connection(("127.0.0.1", fake.port), timeout=10)


def _send(sock, method, path, body=None, headers=None):
    data = b"" if body is None else json.dumps(body).encode()
    head = "%s %s HTTP/1.1\r\nHost: fake\r\nContent-Length: %d\r\nConnection: close\r\n" % (method, path, len(data))
    head += "".join("%s: %s\r\n" % item for item in (headers or {}).items())
    sock.sendall(head.encode() + b"\r\n" + data)


def _read_to_eof(sock):
    buf = b""
    while True:
        data = sock.recv(65536)
        if not data:
            return buf
        buf += data


def _dechunk(raw):
    """(payload chunks, whether the terminating zero chunk arrived)."""
    chunks = []
    while raw:
        line, sep, rest = raw.partition(b"\r\n")
        if not sep:
            break
        size = int(line, 16)
        if size == 0:
            return chunks, True
        if len(rest) < size + 2:
            break
        chunks.append(rest[:size])
        raw = rest[size + 2:]
    return chunks, False


def raw_request(fake, method, path, body=None, headers=None):
    """(status, lower-cased headers, payload chunks or [body], complete)."""
    with _connect(fake) as sock:
        _send(sock, method, path, body, headers)
        raw = _read_to_eof(sock)
    head, _, payload = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    hdrs = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    if hdrs.get("transfer-encoding") == "chunked":
        chunks, complete = _dechunk(payload)
        return status, hdrs, chunks, complete
    return status, hdrs, [payload], len(payload) == int(hdrs["content-length"])


def sse_blocks(chunks):
    """[(event name or None, data text)] from SSE bytes."""
    blocks = []
    for block in b"".join(chunks).decode().split("\n\n"):
        if not block:
            continue
        fields = dict(line.split(": ", 1) for line in block.split("\n"))
        blocks.append((fields.get("event"), fields["data"]))
    return blocks


def chat_body(text, **extra):
    return dict({"model": "m", "messages": [{"role": "user", "content": text}]}, **extra)


# -- OpenAI Chat Completions


def test_chat_stream_with_include_usage(fake, oai):
    stream = oai.chat.completions.create(model="gpt-x", messages=[{"role": "user", "content": "hello big world"}],
                                         stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "ECHO: hello big world"
    assert chunks[0].choices[0].delta.role == "assistant"
    assert sum(1 for c in chunks if c.choices and c.choices[0].delta.content) >= 3  # really streamed
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens > 0
    assert all(c.usage is None for c in chunks[:-1])
    assert all(c.object == "chat.completion.chunk" and c.id.startswith("chatcmpl-") for c in chunks)
    assert fake.last.path == "/v1/chat/completions"
    assert fake.last.json["stream_options"] == {"include_usage": True}
    assert fake.last.headers["authorization"] == "Bearer x"


def test_chat_stream_wire_format(fake):
    status, headers, chunks, complete = raw_request(fake, "POST", "/v1/chat/completions",
                                                    chat_body("one two", stream=True))
    assert status == 200 and complete
    assert headers["content-type"].startswith("text/event-stream")
    blocks = sse_blocks(chunks)
    assert all(event is None for event, _ in blocks)
    assert blocks[-1][1] == "[DONE]"
    parsed = [json.loads(data) for _, data in blocks[:-1]]
    assert all("usage" not in p for p in parsed)  # only with include_usage
    assert len(chunks) == len(blocks)  # one event per chunk: streaming is real


def test_chat_non_stream(fake, oai):
    completion = oai.chat.completions.create(model="gpt-x", messages=[
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "what is up"}]},
    ])
    assert completion.object == "chat.completion"
    assert completion.model == "gpt-x"
    assert completion.choices[0].message.content == "ECHO: what is up"
    assert completion.choices[0].finish_reason == "stop"
    assert completion.usage.prompt_tokens > 0
    assert completion.usage.total_tokens == completion.usage.prompt_tokens + completion.usage.completion_tokens


def test_chat_missing_stream_field_means_not_streamed(fake):
    status, headers, chunks, _ = raw_request(fake, "POST", "/v1/chat/completions", chat_body("hi"))
    assert status == 200 and headers["content-type"] == "application/json"
    assert json.loads(chunks[0])["choices"][0]["message"]["content"] == "ECHO: hi"


def test_chat_tool_call_stream_assembled_by_sdk(fake, oai):
    with oai.chat.completions.stream(model="m", messages=[{"role": "user", "content": "please CALL_TOOL"}],
                                     tools=[WEATHER_CHAT_TOOL]) as stream:
        argument_deltas = [e for e in stream if e.type == "tool_calls.function.arguments.delta"]
        final = stream.get_final_completion()
    choice = final.choices[0]
    assert choice.finish_reason == "tool_calls"
    call = choice.message.tool_calls[0]
    assert call.id.startswith("call_") and call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == EXPECTED_ARGS
    assert len(argument_deltas) > 1


def test_chat_tool_call_non_stream(fake, oai):
    completion = oai.chat.completions.create(model="m", tools=[WEATHER_CHAT_TOOL],
                                             messages=[{"role": "user", "content": "CALL_TOOL"}])
    assert completion.choices[0].finish_reason == "tool_calls"
    assert completion.choices[0].message.content is None
    assert json.loads(completion.choices[0].message.tool_calls[0].function.arguments) == EXPECTED_ARGS


def test_chat_after_tool_result_answers_with_text(fake, oai):
    fake.tool_arguments = {"city": "Oslo"}
    messages = [{"role": "user", "content": "CALL_TOOL please"}]
    first = oai.chat.completions.create(model="m", tools=[WEATHER_CHAT_TOOL], messages=messages)
    call = first.choices[0].message.tool_calls[0]
    assert json.loads(call.function.arguments) == {"city": "Oslo"}
    messages += [first.choices[0].message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": "sunny"}]
    second = oai.chat.completions.create(model="m", tools=[WEATHER_CHAT_TOOL], messages=messages)
    assert second.choices[0].finish_reason == "stop"
    assert second.choices[0].message.content == "ECHO: CALL_TOOL please"


def test_secret_reaching_upstream_is_reported(fake, oai):
    fake.secrets = ["not-this-one", 'pa"ss\u00e9']  # quote and accent: JSON escapes both
    completion = oai.chat.completions.create(model="m", messages=[
        {"role": "system", "content": 'the key is pa"ss\u00e9'}, {"role": "user", "content": "hi"}])
    assert completion.choices[0].message.content == 'FOUND: pa"ss\u00e9'
    assert b'pa\\"ss' in fake.last.body


def test_reply_fn_replaces_the_default(fake, oai):
    fake.reply_fn = lambda rec: "custom for " + last_user_text(rec)
    completion = oai.chat.completions.create(model="m", messages=[{"role": "user", "content": "you"}])
    assert completion.choices[0].message.content == "custom for you"


# -- OpenAI Responses

RESPONSES_OPENING = ["response.created", "response.in_progress", "response.output_item.added",
                     "response.content_part.added"]
RESPONSES_CLOSING = ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                     "response.completed"]


def test_responses_stream_helper(fake, oai):
    with oai.responses.stream(model="gpt-x", input="tell me more") as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert "".join(deltas) == "ECHO: tell me more"
    assert final.output_text == "ECHO: tell me more"
    assert final.id.startswith("resp_") and final.status == "completed"
    assert final.usage.total_tokens == final.usage.input_tokens + final.usage.output_tokens


def test_responses_create_stream_event_order(fake, oai):
    events = list(oai.responses.create(model="m", input="a b c", stream=True))  # "ECHO: ", "a ", "b ", "c"
    types = [e.type for e in events]
    assert types == RESPONSES_OPENING + ["response.output_text.delta"] * 4 + RESPONSES_CLOSING
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[2].item.id == events[-2].item.id and events[2].item.id.startswith("msg_")


def test_responses_wire_event_lines_match_data_type(fake):
    body = {"model": "m", "stream": True, "input": [
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "rules"}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "x y"}]}]}
    status, _, chunks, complete = raw_request(fake, "POST", "/v1/responses", body)
    assert status == 200 and complete
    blocks = sse_blocks(chunks)
    assert [event for event, _ in blocks] == [json.loads(data)["type"] for _, data in blocks]
    done = [json.loads(data) for event, data in blocks if event == "response.output_text.done"][0]
    assert done["text"] == "ECHO: x y"


def test_responses_non_stream(fake, oai):
    response = oai.responses.create(model="m", input=[{"role": "user", "content": "plain question"}],
                                    instructions="sys")
    assert response.object == "response"
    assert response.output_text == "ECHO: plain question"
    assert response.instructions == "sys"


def test_responses_function_call_stream(fake, oai):
    with oai.responses.stream(model="m", input="CALL_TOOL now", tools=[WEATHER_RESPONSES_TOOL]) as stream:
        types = [e.type for e in stream]
        final = stream.get_final_response()
    item = final.output[0]
    assert item.type == "function_call" and item.name == "get_weather"
    assert item.id.startswith("fc_") and item.call_id.startswith("call_")
    assert json.loads(item.arguments) == EXPECTED_ARGS
    assert "response.function_call_arguments.done" in types


def test_responses_codex_follow_up_turn_gets_text(fake, oai):
    inputs = [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "CALL_TOOL go"}]},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{}", "id": "fc_1"},
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
    ]
    response = oai.responses.create(model="m", input=inputs, tools=[WEATHER_RESPONSES_TOOL], store=False)
    assert response.output[0].type == "message"
    assert response.output_text == "ECHO: CALL_TOOL go"


# -- Anthropic Messages


def test_messages_stream(fake, ant):
    with ant.messages.stream(model="claude-x", max_tokens=100,
                             messages=[{"role": "user", "content": "stream this please"}]) as stream:
        pieces = list(stream.text_stream)
        final = stream.get_final_message()
    assert len(pieces) > 1 and "".join(pieces) == "ECHO: stream this please"
    assert final.content[0].text == "ECHO: stream this please"
    assert final.stop_reason == "end_turn" and final.id.startswith("msg_")
    assert final.usage.output_tokens > 1 and final.usage.input_tokens > 0
    headers = fake.last.headers
    assert "anthropic-version" in headers
    assert headers.get("x-api-key") == "x" or headers.get("authorization") == "Bearer x"  # varies by SDK version


def test_messages_wire_format(fake):
    body = {"model": "m", "max_tokens": 5, "stream": True,
            "system": [{"type": "text", "text": "sys"}],
            "messages": [{"role": "user", "content": [{"type": "text", "text": "hey"}]}]}
    status, _, chunks, complete = raw_request(fake, "POST", "/v1/messages?beta=true", body)
    assert status == 200 and complete
    blocks = sse_blocks(chunks)
    events = [event for event, _ in blocks]
    assert events[:3] == ["message_start", "ping", "content_block_start"]
    assert events[-4:] == ["content_block_delta", "content_block_stop", "message_delta", "message_stop"]
    assert events == [json.loads(data)["type"] for _, data in blocks]
    assert fake.last.path == "/v1/messages" and fake.last.query == {"beta": "true"}


def test_messages_create(fake, ant):
    message = ant.messages.create(model="claude-x", max_tokens=100, system="be nice",
                                  messages=[{"role": "user", "content": [{"type": "text", "text": "hello"}]}])
    assert message.type == "message" and message.role == "assistant"
    assert message.content[0].text == "ECHO: hello"
    assert message.model == "claude-x"


def test_messages_tool_use_stream_and_create(fake, ant):
    kwargs = dict(model="m", max_tokens=100, tools=[WEATHER_ANTHROPIC_TOOL],
                  messages=[{"role": "user", "content": "CALL_TOOL"}])
    with ant.messages.stream(**kwargs) as stream:
        json_deltas = [e for e in stream if e.type == "content_block_delta" and e.delta.type == "input_json_delta"]
        streamed = stream.get_final_message()
    created = ant.messages.create(**kwargs)
    for message in (streamed, created):
        block = message.content[0]
        assert message.stop_reason == "tool_use"
        assert block.type == "tool_use" and block.id.startswith("toolu_") and block.name == "get_weather"
        assert block.input == EXPECTED_ARGS
    assert len(json_deltas) > 1


def test_messages_after_tool_result_answers_with_text(fake, ant):
    message = ant.messages.create(model="m", max_tokens=100, tools=[WEATHER_ANTHROPIC_TOOL], messages=[
        {"role": "user", "content": "CALL_TOOL now"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                                           "input": {"city": "x"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"}]},
    ])
    assert message.stop_reason == "end_turn"
    assert message.content[0].text == "ECHO: CALL_TOOL now"


def test_count_tokens(fake, ant):
    small = ant.messages.count_tokens(model="m", messages=[{"role": "user", "content": "one"}])
    large = ant.messages.count_tokens(model="m", messages=[{"role": "user", "content": "one two three four"}])
    assert 0 < small.input_tokens < large.input_tokens
    assert fake.last.path == "/v1/messages/count_tokens"


# -- models, embeddings, rerank


def test_models_list_both_sdks(fake, oai, ant):
    fake.models = ["gpt-fake", "claude-fake"]
    assert [m.id for m in oai.models.list()] == ["gpt-fake", "claude-fake"]
    assert [m.id for m in ant.models.list()] == ["gpt-fake", "claude-fake"]


def test_embeddings_default_base64_decodes_to_embed_text(fake, oai):
    result = oai.embeddings.create(model="emb", input=["red apple", "green pear"])
    assert fake.last.json["encoding_format"] == "base64"
    for item, text in zip(result.data, ["red apple", "green pear"]):
        assert item.embedding == pytest.approx(embed_text(text), abs=1e-6)
    assert result.usage.prompt_tokens == 4


def test_embeddings_float_and_dimensions(fake, oai):
    result = oai.embeddings.create(model="emb", input="red apple", encoding_format="float", dimensions=16)
    assert result.data[0].embedding == pytest.approx(embed_text("red apple", 16))
    raw = json.loads(raw_request(fake, "POST", "/v1/embeddings",
                                 {"model": "e", "input": "x", "encoding_format": "base64"})[2][0])
    packed = base64.b64decode(raw["data"][0]["embedding"])
    assert list(struct.unpack("<64f", packed)) == pytest.approx(embed_text("x"))


def test_embed_text_is_deterministic_and_normalised():
    a, b, c = embed_text("Parse the config file"), embed_text("parse config"), embed_text("network socket timeout")
    assert a == embed_text("parse the CONFIG file")
    assert math.isclose(sum(x * x for x in a), 1.0)
    cosine = lambda u, v: sum(x * y for x, y in zip(u, v))  # noqa: E731
    assert cosine(a, b) > cosine(a, c)
    assert embed_text("") == [0.0] * 64 and len(embed_text("x", dims=8)) == 8


def test_rerank_sorts_by_overlap_and_cuts_to_top_n(fake):
    body = {"model": "r", "query": "parse config file",
            "documents": ["socket timeout", "parse the config file", {"text": "config loader"}], "top_n": 2}
    status, _, chunks, _ = raw_request(fake, "POST", "/v1/rerank", body)
    results = json.loads(chunks[0])["results"]
    assert status == 200
    assert [r["index"] for r in results] == [1, 2]
    assert results[0]["relevance_score"] > results[1]["relevance_score"]


# -- Ollama native API


def test_ollama_chat_ndjson_stream(fake):
    status, headers, chunks, complete = raw_request(fake, "POST", "/api/chat", chat_body("local model"))
    assert status == 200 and complete and headers["content-type"] == "application/x-ndjson"
    lines = [json.loads(line) for line in b"".join(chunks).splitlines()]
    assert all(line["done"] is False for line in lines[:-1]) and lines[-1]["done"] is True
    assert lines[-1]["done_reason"] == "stop"
    assert lines[-1]["eval_count"] > 0 and lines[-1]["prompt_eval_count"] > 0 and lines[-1]["total_duration"] > 0
    assert "".join(line["message"]["content"] for line in lines) == "ECHO: local model"


def test_ollama_non_stream_and_generate(fake):
    reply = json.loads(raw_request(fake, "POST", "/api/chat", chat_body("once", stream=False))[2][0])
    assert reply["done"] is True and reply["message"] == {"role": "assistant", "content": "ECHO: once"}
    _, _, chunks, _ = raw_request(fake, "POST", "/api/generate", {"model": "m", "prompt": "gen this"})
    lines = [json.loads(line) for line in b"".join(chunks).splitlines()]
    assert "".join(line["response"] for line in lines) == "ECHO: gen this" and lines[-1]["done"] is True


def test_ollama_tool_call(fake):
    body = chat_body("CALL_TOOL", stream=False, tools=[WEATHER_CHAT_TOOL])
    reply = json.loads(raw_request(fake, "POST", "/api/chat", body)[2][0])
    assert reply["message"]["tool_calls"][0]["function"]["name"] == "get_weather"
    assert reply["message"]["tool_calls"][0]["function"]["arguments"] == EXPECTED_ARGS


def test_ollama_metadata_and_embed(fake):
    tags = json.loads(raw_request(fake, "GET", "/api/tags")[2][0])
    assert [m["name"] for m in tags["models"]] == fake.models
    assert "version" in json.loads(raw_request(fake, "GET", "/api/version")[2][0])
    assert "capabilities" in json.loads(raw_request(fake, "POST", "/api/show", {"model": "m"})[2][0])
    embed = json.loads(raw_request(fake, "POST", "/api/embed", {"model": "e", "input": ["a", "b c"]})[2][0])
    assert embed["embeddings"] == [embed_text("a"), embed_text("b c")]


# -- errors and fault injection


def test_unknown_path_is_openai_404(fake):
    status, _, chunks, _ = raw_request(fake, "POST", "/v1/nope", {"x": 1})
    assert status == 404
    assert json.loads(chunks[0])["error"]["message"] == "Invalid URL (POST /v1/nope)"


def test_anthropic_overloaded_raises_typed_error(fake, ant):
    anthropic = pytest.importorskip("anthropic")
    fake.fail_next(529, ANTHROPIC_OVERLOADED_BODY)
    with pytest.raises(anthropic.OverloadedError) as caught:
        ant.messages.create(model="m", max_tokens=5, messages=[{"role": "user", "content": "hi"}])
    assert caught.value.status_code == 529
    assert caught.value.body == json.loads(ANTHROPIC_OVERLOADED_BODY)
    assert ant.messages.create(model="m", max_tokens=5, messages=[{"role": "user", "content": "hi"}])
    assert [r.response_status for r in fake.requests] == [529, 200]


def test_openai_rate_limit_raises_typed_error(fake, oai):
    openai = pytest.importorskip("openai")
    fake.fail_next(429, OPENAI_RATE_LIMIT_BODY, path="/v1/chat/completions")
    with pytest.raises(openai.RateLimitError) as caught:
        oai.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert caught.value.code == "rate_limit_exceeded"


def test_fail_next_body_is_byte_exact_and_counted(fake):
    fake.fail_next(503, b"upstream \xffbroken", headers={"Content-Type": "text/plain", "Retry-After": "7"}, count=2)
    for _ in range(2):
        status, headers, chunks, _ = raw_request(fake, "GET", "/v1/models")
        assert (status, headers["retry-after"], chunks) == (503, "7", [b"upstream \xffbroken"])
    assert raw_request(fake, "GET", "/v1/models")[0] == 200


def test_sdk_retries_through_injected_failures(fake):
    openai = pytest.importorskip("openai")
    fake.fail_next(500, headers={"retry-after-ms": "10"}, count=2)
    client = openai.OpenAI(base_url=fake.url + "/v1", api_key="x", max_retries=2, timeout=10)
    assert client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert [r.response_status for r in fake.requests] == [500, 500, 200]


def test_drop_after_events_truncates_the_stream(fake):
    fake.drop_after_events = 2
    status, _, chunks, complete = raw_request(fake, "POST", "/v1/messages",
                                              {"model": "m", "max_tokens": 5, "stream": True,
                                               "messages": [{"role": "user", "content": "hi"}]})
    assert status == 200 and not complete
    assert [event for event, _ in sse_blocks(chunks)] == ["message_start", "ping"]
    assert fake.client_disconnects == 0


def test_drop_before_reply(fake):
    fake.drop_after_events = 0
    with _connect(fake) as sock:
        _send(sock, "GET", "/v1/models")
        assert _read_to_eof(sock) == b""


def _read_events(sock, count):
    buf = b""
    while buf.count(b"\n\n") < count:
        select.select([sock], [], [], 10)
        data = sock.recv(65536)
        assert data, "stream ended early"
        buf += data
    return buf


def test_hang_after_events_records_client_going_away(fake):
    fake.hang_after_events = 3
    sock = _connect(fake)
    _send(sock, "POST", "/v1/chat/completions", chat_body("a b c d e", stream=True))
    _read_events(sock, 3)
    assert fake.client_disconnects == 0
    sock.close()
    assert fake.wait_for_disconnect(5)
    assert fake.client_disconnects == 1
    assert fake.last.response_body.count(b"\n\n") == 3


def test_client_leaving_during_delay_is_recorded(fake):
    fake.delay = 30
    sock = _connect(fake)
    _send(sock, "POST", "/v1/chat/completions", chat_body("slow"))
    assert fake.wait_for_requests(1)
    sock.close()
    assert fake.wait_for_disconnect(5)


def test_event_delay_still_delivers_everything(fake, ant):
    fake.event_delay = 0.01
    with ant.messages.stream(model="m", max_tokens=5, messages=[{"role": "user", "content": "a b"}]) as stream:
        assert stream.get_final_message().content[0].text == "ECHO: a b"


# -- HTTP behaviour


def test_keep_alive_reuses_one_connection(fake):
    conn = http.client.HTTPConnection("127.0.0.1", fake.port, timeout=10)
    for _ in range(3):
        conn.request("POST", "/v1/chat/completions", body=json.dumps(chat_body("k", stream=True)),
                     headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        assert response.status == 200 and response.read().endswith(b"data: [DONE]\n\n")
    conn.close()
    assert fake.connections_opened == 1 and len(fake.requests) == 3


def test_chunked_request_body_is_decoded_and_recorded(fake):
    conn = http.client.HTTPConnection("127.0.0.1", fake.port, timeout=10)
    payload = json.dumps(chat_body("chunked hello")).encode()
    conn.request("POST", "/v1/chat/completions?x=1", body=iter([payload[:10], payload[10:]]),
                 headers={"Content-Type": "application/json", "X-Custom": "Value"}, encode_chunked=True)
    reply = json.loads(conn.getresponse().read())
    conn.close()
    assert reply["choices"][0]["message"]["content"] == "ECHO: chunked hello"
    recorded = fake.last
    assert recorded.body == payload and recorded.json == chat_body("chunked hello")
    assert recorded.method == "POST" and recorded.query == {"x": "1"}
    assert recorded.headers["x-custom"] == "Value" and recorded.headers["transfer-encoding"] == "chunked"


def test_clear_forgets_requests(fake):
    raw_request(fake, "GET", "/api/version")
    assert fake.last.path == "/api/version"
    fake.clear()
    assert fake.requests == [] and fake.last is None
