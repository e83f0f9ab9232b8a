"""The proxy core (_ragproxy.proxy), driven by the official openai and anthropic SDKs.

Every call goes client -> ragproxy -> fake upstream over real sockets; the fake
records what reached it, so each test checks both ends.  The body edits
themselves (with_model, with_edits) are test_jsonbody's.
"""
import json
import random

import anthropic
import openai
import pytest

from _ragproxy.proxy import _FINAL_NDJSON_LINE, _FINAL_SSE_EVENT
from conftest import API_KEY, proxy_config
from fake_upstream import ANTHROPIC_OVERLOADED_BODY, OPENAI_RATE_LIMIT_BODY, embed_text

TOOL = {"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
                                         "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                        "required": ["city"]}}}
ANTHROPIC_TOOL = {"name": "get_weather", "description": "Weather for a city",
                  "input_schema": {"type": "object", "properties": {"city": {"type": "string"}},
                                   "required": ["city"]}}


# -- OpenAI chat completions ----------------------------------------------------

def test_chat_non_stream_reaches_upstream_with_provider_key(openai_client, fake):
    reply = openai_client.chat.completions.create(
        model="gpt-4o", messages=[{"role": "user", "content": "hello from the sdk"}])
    assert reply.choices[0].message.content == "ECHO: hello from the sdk"
    seen = fake.last
    assert seen.path == "/v1/chat/completions"
    assert seen.headers["authorization"] == "Bearer upstream-openai-key"  # never the client's key
    assert API_KEY not in json.dumps(seen.headers)
    assert seen.headers["accept-encoding"] == "identity"


def _post_raw(proxy, path, body):
    import urllib.request
    req = urllib.request.Request(proxy.url + path, data=body, method="POST",
                                 headers={"Authorization": "Bearer " + API_KEY, "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=5) as resp:
        return resp.status


def test_chat_body_is_forwarded_byte_for_byte_when_unchanged(proxy, fake):
    body = b'{"model":"gpt-4o","messages":[{"role":"user","content":"x"}],"unknown_field":{"a":[1,2]},"z":1.50}'
    assert _post_raw(proxy, "/v1/chat/completions", body) == 200
    assert fake.last.body == body


def test_chat_stream_with_usage(openai_client, fake):
    stream = openai_client.chat.completions.create(
        model="gpt-4o", messages=[{"role": "user", "content": "stream these words please"}],
        stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "ECHO: stream these words please"
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens > 0
    assert len([c for c in chunks if c.choices and c.choices[0].delta.content]) > 2  # really streamed


def test_chat_stream_tool_call_deltas(openai_client):
    stream = openai_client.chat.completions.create(
        model="gpt-4o", messages=[{"role": "user", "content": "CALL_TOOL for Paris"}], tools=[TOOL], stream=True)
    calls, finish = {}, None
    for chunk in stream:
        for tc in chunk.choices[0].delta.tool_calls or []:
            slot = calls.setdefault(tc.index, {"name": "", "args": ""})
            slot["name"] += tc.function.name or ""
            slot["args"] += tc.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    assert finish == "tool_calls"
    assert calls[0]["name"] == "get_weather"
    assert isinstance(json.loads(calls[0]["args"]), dict)


def test_model_rename_to_upstream_model(openai_client, fake):
    reply = openai_client.chat.completions.create(
        model="gpt-renamed", messages=[{"role": "user", "content": "who am i"}])
    assert fake.last.json["model"] == "real-model-name"
    assert reply.choices[0].message.content == "ECHO: who am i"


def test_a_large_conversation_repeated_is_read_from_what_it_repeats_and_forwarded_as_sent(proxy, fake):
    """Bodies of an agent loop's size go through App.parsed whatever the model: the rounds after
    the first have their tools and earlier messages copied, and still go upstream byte for byte."""
    tools = [{"type": "function", "function": {"name": f"tool_{n}", "description": "Reads a file. " * 80,
                                               "parameters": {"type": "object"}}} for n in range(12)]
    messages = [{"role": "system", "content": "You are a coding agent. " * 100}]
    for n in range(4):
        messages.append({"role": "user", "content": f"step {n}: " + "explain the change " * 60})
        body = json.dumps({"messages": messages, "tools": tools, "z": 1.50, "model": "gpt-4o"}).encode()
        assert len(body) >= 16 << 10
        before = proxy.app.parsed.reused
        assert _post_raw(proxy, "/v1/chat/completions", body) == 200
        assert fake.last.body == body
        if n:
            assert proxy.app.parsed.reused - before >= 2   # the tools, and the entries the last round had
        messages.append({"role": "assistant", "content": "done " * 120})


def test_model_rename_keeps_every_other_byte_of_the_body(proxy, fake):
    rest = b'"messages" :[{"role":"user","content":"caf\\u00e9 \xc3\xa9"}],"n":1.50,"big":1e400,"z":[ 1 ]}'
    assert _post_raw(proxy, "/v1/chat/completions", b'{ "model" : "gpt-renamed",\n ' + rest) == 200
    assert fake.last.body == b'{ "model" : "real-model-name",\n ' + rest


@pytest.mark.parametrize("body", [
    b'{"messages":[{"role":"user","content":"x"}],"model":"gpt-renamed"}',      # the model is not first
    b'{"model":"gpt-4o","messages":[{"role":"user","content":"x"}],"model":"gpt-renamed"}',  # repeated: last wins
    b'{"\\u006dodel":"gpt-renamed","messages":[{"role":"user","content":"x"}]}',  # an escaped key
])
def test_model_rename_of_any_other_body_sends_the_payload_again(proxy, fake, body):
    assert _post_raw(proxy, "/v1/chat/completions", body) == 200
    sent = fake.last.body
    assert json.loads(sent) == {"model": "real-model-name", "messages": [{"role": "user", "content": "x"}]}
    assert sent.count(b'"model"') == 1


def test_glob_routes_and_catch_all(proxy, fake):
    app = proxy.app
    assert app.resolve_route("claude-test-model").upstream == ("an",)
    assert app.resolve_route("gpt-renamed").name == "gpt-renamed"  # exact beats the gpt-* glob
    assert app.resolve_route("gpt-5").name == "gpt-*"
    assert app.resolve_route("llama3.2").name == "*"


# -- OpenAI Responses -----------------------------------------------------------

def test_responses_non_stream(openai_client, fake):
    response = openai_client.responses.create(model="gpt-4o", input="summarise this")
    assert response.output_text == "ECHO: summarise this"
    assert fake.last.path == "/v1/responses"


def test_responses_stream_events_in_order(openai_client):
    events = list(openai_client.responses.create(model="gpt-4o", input="stream it", stream=True))
    types = [e.type for e in events]
    assert types[0] == "response.created" and types[-1] == "response.completed"
    assert "response.output_item.done" in types
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == "ECHO: stream it"


# -- Anthropic messages ---------------------------------------------------------

def test_messages_stream_with_sdk_helper(anthropic_client, fake):
    with anthropic_client.messages.stream(model="claude-test-model", max_tokens=64,
                                          system=[{"type": "text", "text": "first block"}],
                                          messages=[{"role": "user", "content": "hi claude"}]) as stream:
        pieces = list(stream.text_stream)
        final = stream.get_final_message()
    assert "".join(pieces) == final.content[0].text == "ECHO: hi claude"
    seen = fake.last
    assert seen.headers["x-api-key"] == "upstream-anthropic-key"
    assert "authorization" not in seen.headers
    assert seen.json["system"] == [{"type": "text", "text": "first block"}]


def test_messages_create_and_tool_use(anthropic_client):
    msg = anthropic_client.messages.create(model="claude-haiku", max_tokens=64, tools=[ANTHROPIC_TOOL],
                                           messages=[{"role": "user", "content": "CALL_TOOL now"}])
    assert msg.stop_reason == "tool_use"
    block = [b for b in msg.content if b.type == "tool_use"][0]
    assert block.name == "get_weather" and isinstance(block.input, dict)


def test_messages_beta_query_and_headers_forwarded(proxy, fake):
    client = anthropic.Anthropic(base_url=proxy.url, api_key=API_KEY, max_retries=0,
                                 default_headers={"anthropic-beta": "interleaved-thinking-2025-05-14",
                                                  "X-Ragproxy-KB": "off", "x-app": "cli"})
    client.beta.messages.create(model="claude-x", max_tokens=10, messages=[{"role": "user", "content": "b"}],
                                betas=["context-management-2025-06-27"], extra_query={"beta": "true"})
    seen = fake.last
    assert seen.query.get("beta") in ("true", ["true"])
    assert "context-management-2025-06-27" in seen.headers["anthropic-beta"]
    assert seen.headers["x-app"] == "cli"
    assert "x-ragproxy-kb" not in seen.headers


def test_count_tokens(anthropic_client, fake):
    result = anthropic_client.messages.count_tokens(model="claude-x",
                                                    messages=[{"role": "user", "content": "count me"}])
    assert result.input_tokens > 0
    assert fake.last.path == "/v1/messages/count_tokens"


def test_count_tokens_estimated_locally_for_non_anthropic_upstream(anthropic_client, fake):
    result = anthropic_client.messages.count_tokens(model="llama3", messages=[{"role": "user", "content": "x"}])
    assert result.input_tokens > 0
    assert fake.requests == []  # Ollama has no count_tokens; nothing was sent


def test_messages_to_ollama_provider_uses_its_anthropic_endpoint(anthropic_client, fake):
    msg = anthropic_client.messages.create(model="qwen3-coder", max_tokens=32,
                                           messages=[{"role": "user", "content": "local model"}])
    assert msg.content[0].text == "ECHO: local model"
    assert fake.last.path == "/v1/messages"


# -- models and embeddings --------------------------------------------------------

def test_models_list_openai_shape_includes_upstream_models(openai_client):
    ids = [m.id for m in openai_client.models.list()]
    assert "gpt-renamed" in ids and "via-openai" in ids
    assert "fake-model" in ids  # what the catch-all's upstream serves
    assert "*" not in ids and "gpt-*" not in ids


def test_models_list_anthropic_shape(anthropic_client):
    page = anthropic_client.models.list()
    ids = [m.id for m in page.data]
    assert "claude-fake-model" in ids
    assert all(m.type == "model" for m in page.data)


def test_embeddings_default_base64_path(openai_client, fake):
    result = openai_client.embeddings.create(model="gpt-embed", input=["alpha beta", "gamma"])
    assert fake.last.json["encoding_format"] == "base64"
    assert result.data[0].embedding == pytest.approx(embed_text("alpha beta"), abs=1e-6)
    assert fake.last.path == "/v1/embeddings"


# -- errors -------------------------------------------------------------------

def test_upstream_error_forwarded_byte_for_byte(anthropic_client, fake, proxy):
    fake.fail_next(529, ANTHROPIC_OVERLOADED_BODY, headers={"content-type": "application/json",
                                                           "retry-after": "3"})
    import urllib.error
    import urllib.request
    req = urllib.request.Request(proxy.url + "/v1/messages", method="POST",
                                 data=json.dumps({"model": "claude-x", "max_tokens": 5,
                                                  "messages": [{"role": "user", "content": "x"}]}).encode(),
                                 headers={"x-api-key": API_KEY, "content-type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(req, timeout=5)
    assert info.value.code == 529
    assert info.value.read() == ANTHROPIC_OVERLOADED_BODY
    assert info.value.headers["retry-after"] == "3"


def test_upstream_rate_limit_surfaces_as_sdk_exception(openai_client, fake):
    fake.fail_next(429, OPENAI_RATE_LIMIT_BODY, headers={"content-type": "application/json"})
    with pytest.raises(openai.RateLimitError) as info:
        openai_client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "x"}])
    assert info.value.body["code"] == "rate_limit_exceeded"


@pytest.mark.parametrize("sdk", ["openai", "anthropic"])
def test_unknown_model_without_catch_all_is_404_in_api_shape(make_proxy, fake, sdk):
    from conftest import proxy_config
    text = proxy_config(fake.url).replace('  - {name: "*", upstream: [ol, oa]}\n', "")
    p = make_proxy(text)
    if sdk == "openai":
        client = openai.OpenAI(base_url=p.url + "/v1", api_key=API_KEY, max_retries=0)
        with pytest.raises(openai.NotFoundError) as info:
            client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])
        assert info.value.body["code"] == "model_not_found"
    else:
        client = anthropic.Anthropic(base_url=p.url, api_key=API_KEY, max_retries=0)
        with pytest.raises(anthropic.NotFoundError) as info:
            client.messages.create(model="nope", max_tokens=5, messages=[{"role": "user", "content": "x"}])
        assert info.value.body["error"]["type"] == "not_found_error"
    assert fake.requests == []


def test_bad_key_is_401_in_each_shape(proxy, fake):
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=proxy.url + "/v1", api_key="wrong-key-123", max_retries=0).chat.completions.create(
            model="gpt-4o", messages=[{"role": "user", "content": "x"}])
    with pytest.raises(anthropic.AuthenticationError) as info:
        anthropic.Anthropic(base_url=proxy.url, api_key="wrong-key-123", max_retries=0).messages.create(
            model="claude-x", max_tokens=5, messages=[{"role": "user", "content": "x"}])
    assert info.value.body == {"type": "error", "error": {"type": "authentication_error",
                                                          "message": "invalid API key"}}
    assert fake.requests == []


def test_auth_off_needs_no_key(make_proxy, fake):
    p = make_proxy(auth=False)
    client = openai.OpenAI(base_url=p.url + "/v1", api_key="anything", max_retries=0)
    assert client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "open"}]) \
        .choices[0].message.content == "ECHO: open"


def test_upstream_unreachable_is_502(make_proxy):
    from conftest import proxy_config
    p = make_proxy(proxy_config("http://127.0.0.1:9"))  # discard port: nothing listens
    with pytest.raises(anthropic.APIStatusError) as info:
        anthropic.Anthropic(base_url=p.url, api_key=API_KEY, max_retries=0).messages.create(
            model="claude-x", max_tokens=5, messages=[{"role": "user", "content": "x"}])
    assert info.value.status_code == 502
    assert info.value.body["type"] == "error" and info.value.body["error"]["type"] == "api_error"


def test_upstream_timeout_is_504(make_proxy, fake):
    from conftest import proxy_config
    p = make_proxy(proxy_config(fake.url).replace("read_timeout: 5", "read_timeout: 0.3"))
    fake.delay = 1.0
    with pytest.raises(openai.APIStatusError) as info:
        openai.OpenAI(base_url=p.url + "/v1", api_key=API_KEY, max_retries=0).chat.completions.create(
            model="gpt-4o", messages=[{"role": "user", "content": "x"}])
    assert info.value.status_code == 504
    assert info.value.body["code"] == "upstream_timeout"


# -- failures after the stream began --------------------------------------------

def test_openai_stream_drop_reported_in_band(openai_client, fake):
    fake.drop_after_events = 2
    stream = openai_client.chat.completions.create(
        model="gpt-4o", messages=[{"role": "user", "content": "one two three four five"}], stream=True)
    with pytest.raises(openai.APIError) as info:
        list(stream)
    assert "upstream failed mid-stream" in str(info.value)


def test_anthropic_stream_drop_reported_as_error_event(anthropic_client, fake):
    fake.drop_after_events = 3
    with pytest.raises(anthropic.APIStatusError) as info:
        with anthropic_client.messages.stream(model="claude-x", max_tokens=64,
                                              messages=[{"role": "user", "content": "a b c d e"}]) as s:
            list(s.text_stream)
    assert "upstream failed mid-stream" in str(info.value)


def test_responses_stream_drop_becomes_response_failed(openai_client, fake):
    fake.drop_after_events = 4
    events = list(openai_client.responses.create(model="gpt-4o", input="a b c d e f", stream=True))
    assert events[-1].type == "response.failed"
    assert events[-1].sequence_number == events[-2].sequence_number + 1
    assert events[-1].response.id == events[0].response.id
    assert "upstream failed mid-stream" in events[-1].response.error.message


def test_client_disconnect_closes_upstream(proxy, fake):
    import socket
    fake.hang_after_events = 2
    body = json.dumps({"model": "gpt-4o", "stream": True, "messages": [{"role": "user", "content": "x y z"}]})
    sock = socket.create_connection(("127.0.0.1", proxy.port), timeout=5)
    sock.sendall(("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + API_KEY +
                  "\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)).encode())
    assert b"200 OK" in sock.recv(65536)  # headers (and maybe the first events) arrived
    sock.close()
    assert fake.wait_for_disconnect(timeout=3), "the proxy kept the upstream stream open"


@pytest.mark.parametrize("path,body,last", [
    ("/v1/chat/completions", {"model": "gpt-4o", "stream": True}, b"data: [DONE]"),
    ("/v1/messages", {"model": "claude-test-model", "stream": True, "max_tokens": 64}, b"event: message_stop"),
])
def test_a_client_that_leaves_after_the_last_event_keeps_the_upstream_connection(proxy, fake, openai_client,
                                                                                  path, body, last):
    """The OpenAI SDK closes as soon as it reads [DONE]; the upstream's end of body may come later."""
    import socket
    fake.end_delay = 0.3
    data = json.dumps(dict(body, messages=[{"role": "user", "content": "a b c"}])).encode()
    sock = socket.create_connection(("127.0.0.1", proxy.port), timeout=5)
    sock.sendall(b"POST %s HTTP/1.1\r\nHost: x\r\nx-api-key: %s\r\nanthropic-version: 2023-06-01\r\n"
                 b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                 % (path.encode(), API_KEY.encode(), len(data), data))
    seen = b""
    while last not in seen:
        chunk = sock.recv(65536)
        assert chunk, seen
        seen += chunk
    sock.close()  # before the upstream's end of body
    assert not fake.wait_for_disconnect(timeout=1.0), "the proxy dropped the upstream after the last event"
    reply = openai_client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "next"}])
    assert reply.choices[0].message.content == "ECHO: next"
    assert fake.connections_opened == 1  # the next call reused the connection


def test_the_last_event_of_each_stream_format_is_recognised():
    last = {
        "openai": b'data: {"choices":[]}\n\ndata: [DONE]\n\n',
        "anthropic": b'event: message_stop\ndata: {"type":"message_stop"}\n\n',
        "responses": b'event: response.completed\ndata: {"type":"response.completed"}\n\n',
        "error": b'event: error\ndata: {"type":"error"}\n\n',
    }
    assert all(_FINAL_SSE_EVENT.search(piece) for piece in last.values())
    quoted = b'data: {"choices":[{"delta":{"content":"\\nevent: message_stop\\ndata: [DONE]"}}]}\n\n'
    assert not _FINAL_SSE_EVENT.search(quoted)  # a model's text cannot end the stream early
    assert _FINAL_NDJSON_LINE.search(b'{"model":"m","done":true,"eval_count":3}\n')
    assert not _FINAL_NDJSON_LINE.search(b'{"message":{"content":"\\"done\\":true"},"done":false}\n')


# -- the rewrite hook ------------------------------------------------------------

def test_rewriters_can_change_the_request_and_add_headers(proxy, openai_client, fake):
    def inject(exchange):
        exchange.payload["messages"].insert(0, {"role": "system", "content": "CONTEXT-123"})
        exchange.changed = True
        exchange.response_headers.append(("X-Ragproxy-Sources", "doc#1"))

    proxy.app.rewriters.append(inject)
    raw = openai_client.chat.completions.with_raw_response.create(
        model="gpt-4o", messages=[{"role": "user", "content": "q"}])
    assert raw.headers["x-ragproxy-sources"] == "doc#1"
    assert fake.last.json["messages"][0] == {"role": "system", "content": "CONTEXT-123"}
    assert int(fake.last.headers["content-length"]) == len(fake.last.body)


def test_rewriters_that_name_their_edits_leave_the_rest_of_the_body_as_sent(proxy, fake):
    def add_system(exchange):
        exchange.payload["system"] = "CONTEXT-456"
        exchange.edits += (("system",),)

    proxy.app.rewriters.append(add_system)
    body = b'{"model":"gpt-renamed", "messages": [{"role":"user","content":"q"}], "temperature": 1.50}'
    assert _post_raw(proxy, "/v1/chat/completions", body) == 200
    assert fake.last.body == \
        b'{"model":"real-model-name", "messages": [{"role":"user","content":"q"}], "temperature": 1.50' \
        b',"system":"CONTEXT-456"}'


# -- hop-by-hop headers a Connection header names (RFC 9110 section 7.6.1) ---------

def test_headers_named_in_the_clients_connection_header_are_not_forwarded(proxy, fake):
    import http.client
    conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=5)
    conn.request("POST", "/v1/chat/completions", body=json.dumps(
        {"model": "gpt-4o", "messages": [{"role": "user", "content": "hop"}]}),
        headers={"Authorization": "Bearer " + API_KEY, "Content-Type": "application/json",
                 "Connection": "keep-alive, X-Hop-Secret", "X-Hop-Secret": "for the proxy only",
                 "X-Kept": "end to end"})
    resp = conn.getresponse()
    assert resp.status == 200 and json.loads(resp.read())["choices"][0]["message"]["content"] == "ECHO: hop"
    conn.close()
    assert "x-hop-secret" not in fake.last.headers
    assert fake.last.headers["x-kept"] == "end to end"


def test_headers_named_in_the_upstreams_connection_header_are_not_relayed(make_proxy):
    import http.client
    import socket
    import threading

    from conftest import proxy_config
    body = b'{"choices":[{"message":{"role":"assistant","content":"hi"}}]}'
    listener = socket.create_server(("127.0.0.1", 0))

    def answer():
        conn, _ = listener.accept()
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                data += conn.recv(65536)
            head, _, rest = data.partition(b"\r\n\r\n")
            length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
            while len(rest) < length:
                rest += conn.recv(65536)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: X-Upstream-Hop\r\n"
                         b"X-Upstream-Hop: internal\r\nX-Request-Id: r1\r\n"
                         b"Content-Length: %d\r\n\r\n%s" % (len(body), body))

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    p = make_proxy(proxy_config(f"http://127.0.0.1:{listener.getsockname()[1]}"))
    conn = http.client.HTTPConnection("127.0.0.1", p.port, timeout=5)
    conn.request("POST", "/v1/chat/completions", body=b'{"model":"gpt-4o","messages":[]}',
                 headers={"Authorization": "Bearer " + API_KEY, "Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200 and resp.read() == body
    assert resp.getheader("X-Upstream-Hop") is None and resp.getheader("X-Request-Id") == "r1"
    conn.close()
    thread.join(5)
    listener.close()


# -- an unreachable upstream is named, its address is not ----------------------------

def test_unreachable_upstream_names_the_provider_not_its_address(make_proxy, caplog):
    from conftest import proxy_config
    p = make_proxy(proxy_config("http://127.0.0.1:9"))  # discard port: nothing listens
    with caplog.at_level("WARNING", logger="ragproxy"):
        with pytest.raises(openai.APIStatusError) as info:
            openai.OpenAI(base_url=p.url + "/v1", api_key=API_KEY, max_retries=0).chat.completions.create(
                model="gpt-4o", messages=[{"role": "user", "content": "x"}])
    assert info.value.status_code == 502 and info.value.body["code"] == "upstream_unreachable"
    message = info.value.body["message"]
    assert "'oa'" in message and "127.0.0.1" not in message and ":9" not in message
    assert "127.0.0.1:9" in caplog.text and "provider oa" in caplog.text  # the detail is in the log


# -- Ollama-speaking clients: a key in a header, or in the base URL ------------------

def test_official_ollama_client_with_a_bearer_header(proxy, fake):
    import ollama
    client = ollama.Client(host=proxy.url, headers={"Authorization": "Bearer " + API_KEY})
    reply = client.chat(model="llama3", messages=[{"role": "user", "content": "header key"}])
    assert reply.message.content == "ECHO: header key"
    assert fake.last.path == "/api/chat" and API_KEY not in json.dumps(fake.last.headers)
    client.list()
    assert fake.last.path == "/api/tags" and API_KEY not in json.dumps(fake.last.headers)


def test_official_ollama_client_with_the_key_in_its_base_url(proxy, fake, caplog):
    import ollama
    client = ollama.Client(host=f"{proxy.url}/k/{API_KEY}")
    with caplog.at_level("DEBUG", logger="ragproxy"):
        reply = client.chat(model="llama3", messages=[{"role": "user", "content": "url key"}])
        streamed = "".join(part.message.content for part in client.chat(
            model="llama3", messages=[{"role": "user", "content": "streamed url key"}], stream=True))
        client.list()
    assert reply.message.content == "ECHO: url key" and streamed == "ECHO: streamed url key"
    assert [r.path for r in fake.requests] == ["/api/chat", "/api/chat", "/api/tags"]  # the prefix is not forwarded
    assert all(API_KEY not in r.path and API_KEY not in json.dumps(r.headers) for r in fake.requests)
    logged = [r.getMessage() for r in caplog.records if r.name == "ragproxy"]
    assert any("/k/***/api/chat" in line for line in logged)  # the server's access lines, masked
    assert not any(API_KEY in line for line in logged)


def test_ollama_client_without_a_key_is_told_both_ways_to_send_one(proxy):
    import ollama
    with pytest.raises(ollama.ResponseError) as info:
        ollama.Client(host=proxy.url).chat(model="llama3", messages=[{"role": "user", "content": "x"}])
    assert info.value.status_code == 401 and "/k/KEY" in info.value.error
    with pytest.raises(ollama.ResponseError) as info:
        ollama.Client(host=proxy.url + "/k/wrong-key").list()
    assert info.value.status_code == 401 and info.value.error == "invalid API key"


# -- relaying one large event, and events split across reads ------------------------

def _relayed(reads, sse, dialect="openai"):
    from _ragproxy.api import StreamTracker
    from _ragproxy.proxy import _relay_events
    return list(_relay_events(reads, StreamTracker(dialect), sse))


@pytest.mark.parametrize("sse,end", [(True, b"\n\n"), (True, b"\r\n\r\n"), (False, b"\n")])
def test_one_big_event_is_relayed_in_time_linear_in_its_size(sse, end):
    from test_ollama import Counted, counted_reads
    event = b"data: " + b"x" * (2 * 1024 * 1024) + end
    body = event + b"data: [DONE]" + end
    Counted.seen = 0
    pieces = _relayed(counted_reads(body, 16384), sse)  # 129 reads
    assert b"".join(pieces) == body and all(piece.endswith(end) for piece in pieces)
    # Adding each read to one buffer and searching it all again goes over about
    # reads/2 times the event (64 here); each read searched once, a few times.
    assert Counted.seen < 8 * len(body), Counted.seen / len(body)


def _relayed_the_simple_way(reads, sse):
    """What the relay yields, worked out as it was before it became linear: all that is
    pending joined to each read, then cut after the last end found in the lot."""
    out, pending = [], b""
    for data in reads:
        data, pending = pending + data, b""
        if not sse:
            cut = data.rfind(b"\n") + 1
        else:
            lf, crlf = data.rfind(b"\n\n"), data.rfind(b"\r\n\r\n")
            cut = max(lf + 2 if lf >= 0 else 0, crlf + 4 if crlf >= 0 else 0)
        data, pending = data[:cut], data[cut:]
        if data:
            out.append(data)
    return out + [pending] if pending else out


def test_relayed_pieces_are_whole_events_whatever_the_read_boundaries():
    from test_ollama import Reads
    rng = random.Random(14)
    for _ in range(500):
        sse = rng.random() < 0.7
        end = rng.choice([b"\n\n", b"\r\n\r\n"]) if sse else b"\n"
        body = b"".join(b"data: " + bytes(rng.choice(b"ab\r\n:") for _ in range(rng.randint(0, 8))) + end
                        for _ in range(rng.randint(1, 6)))
        cuts = sorted(rng.sample(range(1, len(body)), min(len(body) - 1, rng.randint(0, 15))))
        reads = [body[a:b] for a, b in zip([0] + cuts, cuts + [len(body)])]
        assert _relayed(Reads(reads), sse) == _relayed_the_simple_way(reads, sse), (body, reads)


def test_a_16_mib_event_is_relayed_whole(proxy, fake):
    event = b'data: {"choices":[{"index":0,"delta":{"content":"' + b"0123456789abcdef" * (1024 * 1024) + b'"}}]}\n\n'
    fake.fail_next(200, event + b"data: [DONE]\n\n", headers={"Content-Type": "text/event-stream"})
    import urllib.request
    req = urllib.request.Request(proxy.url + "/v1/chat/completions", method="POST", data=json.dumps(
        {"model": "gpt-4o", "stream": True, "messages": [{"role": "user", "content": "big"}]}).encode(),
        headers={"Authorization": "Bearer " + API_KEY, "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        assert resp.read() == event + b"data: [DONE]\n\n"


# -- one parse for what retrieval reads -------------------------------------------

def test_a_body_retrieval_reads_is_parsed_with_its_members_and_any_other_plainly(make_proxy, fake, tmp_path):
    """A model with knowledge bases gets the one-pass parse (payload and where its messages
    lie, which the turn key and the splice reuse); a pass-through model the plain parse."""
    (tmp_path / "documents" / "notes").mkdir(parents=True)
    (tmp_path / "documents" / "notes" / "a.md").write_text("# Deploys\nThe deploy key rotates weekly.\n")
    extra = "  - {name: with-kb, upstream: oa, kb: notes}\n"
    proxy = make_proxy(proxy_config(fake.url).replace("  - {name: \"*\"", extra + "  - {name: \"*\""),
                       data_dir=tmp_path)
    proxy.app.knowledge_bases.index_all()
    seen = []
    proxy.app.rewriters.insert(0, lambda exchange: seen.append(exchange.members))   # as parsed, before retrieval
    question = b'"messages":[{"role":"user","content":"when does the deploy key rotate?"}]}'
    assert _post_raw(proxy, "/v1/chat/completions", b'{"model":"with-kb",' + question) == 200
    assert _post_raw(proxy, "/v1/chat/completions", b'{"model":"gpt-4o",' + question) == 200
    members, plain = seen
    assert plain is None
    assert members is not None and members.body is not None and "messages" in members.expand
    assert b"rotates weekly" in fake.requests[-2].body   # the retriever injected with them
