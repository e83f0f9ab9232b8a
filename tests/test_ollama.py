"""Ollama's native API: passed through to Ollama, translated for OpenAI-style upstreams."""
import json
import random
import sys
import urllib.request

import pytest

from _ragproxy import ollama
from conftest import API_KEY


def _call(proxy, path, body=None, method=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(proxy.url + path, data=data, method=method or ("POST" if data else "GET"),
                                 headers={"Authorization": "Bearer " + API_KEY, "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=5) as resp:
        return resp.status, resp.headers, resp.read()


def _ndjson(payload):
    return [json.loads(line) for line in payload.decode().splitlines() if line.strip()]


def test_chat_stream_passes_through_to_ollama(proxy, fake):
    status, headers, payload = _call(proxy, "/api/chat", {"model": "llama3", "messages": [
        {"role": "user", "content": "native ollama"}]})
    lines = _ndjson(payload)
    assert headers["content-type"].startswith("application/x-ndjson")
    assert "".join(l["message"]["content"] for l in lines) == "ECHO: native ollama"
    assert lines[-1]["done"] is True and all(not l["done"] for l in lines[:-1])
    assert fake.last.path == "/api/chat"


def test_generate_non_stream_passes_through(proxy, fake):
    _, _, payload = _call(proxy, "/api/generate", {"model": "llama3", "prompt": "gen me", "stream": False})
    assert json.loads(payload)["response"] == "ECHO: gen me"


def test_chat_translated_for_openai_provider_stream(proxy, fake):
    _, headers, payload = _call(proxy, "/api/chat", {"model": "via-openai", "options": {"temperature": 0.2,
                                                                                       "num_predict": 50},
                                                     "messages": [{"role": "user", "content": "translate me"}]})
    sent = fake.last.json
    assert fake.last.path == "/v1/chat/completions"
    assert sent["stream"] is True and sent["temperature"] == 0.2 and sent["max_tokens"] == 50
    lines = _ndjson(payload)
    assert "".join(l["message"]["content"] for l in lines) == "ECHO: translate me"
    final = lines[-1]
    assert final["done"] is True and final["done_reason"] == "stop"
    assert final["eval_count"] > 0 and final["prompt_eval_count"] > 0


def test_chat_translated_non_stream_and_tool_calls(proxy, fake):
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object",
                                                                               "properties": {}}}}]
    _, _, payload = _call(proxy, "/api/chat", {"model": "via-openai", "stream": False, "tools": tools,
                                               "messages": [{"role": "user", "content": "CALL_TOOL please"}]})
    reply = json.loads(payload)
    assert reply["done"] is True
    assert reply["message"]["tool_calls"][0]["function"]["name"] == "lookup"
    assert isinstance(reply["message"]["tool_calls"][0]["function"]["arguments"], dict)


def test_generate_translated_with_system(proxy, fake):
    _, _, payload = _call(proxy, "/api/generate", {"model": "via-openai", "prompt": "p1", "system": "sys",
                                                   "stream": False})
    assert fake.last.json["messages"] == [{"role": "system", "content": "sys"}, {"role": "user", "content": "p1"}]
    assert json.loads(payload)["response"] == "ECHO: p1"


def test_translated_upstream_error_in_ollama_shape(proxy, fake):
    fake.fail_next(400, b'{"error":{"message":"bad thing","type":"invalid_request_error"}}',
                   headers={"content-type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as info:
        _call(proxy, "/api/chat", {"model": "via-openai", "messages": [{"role": "user", "content": "x"}]})
    assert info.value.code == 400 and json.loads(info.value.read()) == {"error": "bad thing"}


def test_translated_stream_drop_is_an_error_line(proxy, fake):
    fake.drop_after_events = 2
    _, _, payload = _call(proxy, "/api/chat", {"model": "via-openai", "messages": [
        {"role": "user", "content": "one two three four"}]})
    assert "error" in _ndjson(payload)[-1]


def test_native_stream_drop_is_an_error_line(proxy, fake):
    fake.drop_after_events = 2
    _, _, payload = _call(proxy, "/api/chat", {"model": "llama3", "messages": [
        {"role": "user", "content": "one two three four"}]})
    last = _ndjson(payload)[-1]
    assert "upstream failed mid-stream" in last["error"]


def test_tags_merges_upstream_and_configured_names(proxy):
    _, _, payload = _call(proxy, "/api/tags")
    names = [m["name"] for m in json.loads(payload)["models"]]
    assert "fake-model" in names and "gpt-renamed" in names and "*" not in names


def test_version_needs_no_key(proxy):
    with urllib.request.urlopen(proxy.url + "/api/version", timeout=5) as resp:
        assert "version" in json.loads(resp.read())


def test_other_api_path_forwarded_to_ollama(proxy, fake):
    _call(proxy, "/api/show", {"model": "llama3"})
    assert fake.last.path == "/api/show"


# -- the translated path: what the client sends ---------------------------------

def _error_of(proxy, path, body):
    """(status, parsed body) of a call the proxy refuses."""
    with pytest.raises(urllib.error.HTTPError) as info:
        _call(proxy, path, body)
    return info.value.code, json.loads(info.value.read())


_MESSAGE = {"role": "user", "content": "hi"}


@pytest.mark.parametrize("path,fields,named", [
    ("/api/chat", {"messages": 5}, "'messages'"),
    ("/api/chat", {"messages": [5]}, "'messages[0]'"),
    ("/api/chat", {"messages": [{"role": "user", "content": "x", "images": [1]}]}, "'messages[0].images[0]'"),
    ("/api/chat", {"messages": [{"role": "user", "content": "x", "images": [None]}]}, "'messages[0].images[0]'"),
    ("/api/chat", {"messages": [{"role": "user", "content": "x", "images": "abc"}]}, "'messages[0].images'"),
    ("/api/chat", {"messages": [{"role": "assistant", "tool_calls": [1]}]}, "'messages[0].tool_calls[0]'"),
    ("/api/chat", {"messages": [{"role": "assistant", "tool_calls": [{"function": "f"}]}]},
     "'messages[0].tool_calls[0].function'"),
    ("/api/chat", {"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "f",
                                                                                  "arguments": "{}"}}]}]},
     "'messages[0].tool_calls[0].function.arguments'"),
    ("/api/chat", {"messages": [{"role": 5, "content": "x"}]}, "'messages[0].role'"),
    ("/api/chat", {"messages": [{"role": "user", "content": {"text": "x"}}]}, "'messages[0].content'"),
    ("/api/chat", {"messages": [_MESSAGE], "options": 5}, "'options'"),
    ("/api/chat", {"messages": [_MESSAGE], "options": {"temperature": "hot"}}, "'options.temperature'"),
    ("/api/chat", {"messages": [_MESSAGE], "options": {"num_predict": 1.5}}, "'options.num_predict'"),
    ("/api/chat", {"messages": [_MESSAGE], "options": {"seed": True}}, "'options.seed'"),
    ("/api/chat", {"messages": [_MESSAGE], "options": {"stop": [1]}}, "'options.stop[0]'"),
    ("/api/chat", {"messages": [_MESSAGE], "format": 5}, "'format'"),
    ("/api/chat", {"messages": [_MESSAGE], "format": "yaml"}, "'format'"),
    ("/api/chat", {"messages": [_MESSAGE], "tools": 5}, "'tools'"),
    ("/api/chat", {"messages": [_MESSAGE], "tools": ["lookup"]}, "'tools[0]'"),
    ("/api/chat", {"messages": [_MESSAGE], "stream": "no"}, "'stream'"),
    ("/api/generate", {"prompt": 5}, "'prompt'"),
    ("/api/generate", {"prompt": "x", "system": ["s"]}, "'system'"),
    ("/api/generate", {"prompt": "x", "images": [1]}, "'images[0]'"),
    ("/api/generate", {"prompt": "x", "options": []}, "'options'"),
])
def test_translated_body_of_the_wrong_shape_is_a_400_naming_the_field(proxy, fake, path, fields, named):
    status, body = _error_of(proxy, path, dict(fields, model="via-openai"))
    assert status == 400 and list(body) == ["error"] and named in body["error"]
    assert fake.requests == []  # refused before anything went upstream


def _post_bytes(proxy, path, data):
    """(status, parsed body) of a POST of raw bytes."""
    req = urllib.request.Request(proxy.url + path, data=data, method="POST",
                                 headers={"Authorization": "Bearer " + API_KEY, "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


@pytest.mark.parametrize("field", ["format", "tools", "tool_arguments"])
def test_translated_body_nested_just_under_the_parsers_limit_is_a_400(proxy, fake, field):
    """Python's parser and encoder share the recursion limit, and the translation
    encodes on a deeper stack than the body was parsed on: a body nested just
    under the limit parses, then cannot be encoded again."""
    deep = '"DEEP"'  # replaced by the nesting in the bytes: this test's own stack could not encode it either
    body = {"model": "via-openai", "stream": False, "messages": [_MESSAGE]}
    if field == "format":
        body["format"] = "DEEP"
    elif field == "tools":
        body["tools"] = [{"type": "function", "function": {"name": "f", "parameters": "DEEP"}}]
    else:
        body["messages"] = [{"role": "assistant", "content": "", "tool_calls": [
            {"function": {"name": "f", "arguments": "DEEP"}}]}, _MESSAGE]
    template = json.dumps(body)
    assert template.count(deep) == 1
    ours = []
    for depth in range(940, 1000, 4):
        sent_before = len(fake.requests)
        data = template.replace(deep, '{"a":' * depth + "{}" + "}" * depth).encode()
        status, payload = _post_bytes(proxy, "/api/chat", data)
        assert status in (200, 400), (depth, status, payload)
        if status == 200:
            assert payload["done"] is True
        elif len(fake.requests) == sent_before:  # refused by the proxy, not by the upstream
            ours.append(payload["error"])
    named = "'messages[0].tool_calls[0].function.arguments'" if field == "tool_arguments" else f"'{field}'"
    assert all(e in ("request body is not valid JSON: nested too deeply", f"{named} is nested too deeply")
               for e in ours), ours
    # The window between parsing and encoding is there only where json's C parser and encoder
    # count depth on Python's own stack: from 3.12 they keep a C limit of their own (far above
    # these depths), so every body here is translated.  Arguments are encoded apart, shallower
    # than the body that holds them.
    if field != "tool_arguments" and sys.version_info < (3, 12):
        assert f"{named} is nested too deeply" in ours, ours  # the window between parsing and encoding was hit


def test_negative_num_predict_means_no_limit_and_a_stop_string_is_kept(proxy, fake):
    _call(proxy, "/api/chat", {"model": "via-openai", "stream": False, "messages": [_MESSAGE],
                               "options": {"num_predict": -1, "stop": "END", "top_k": 3}})
    sent = fake.last.json
    assert "max_tokens" not in sent and sent["stop"] == "END"  # Ollama's -1 is "no limit", not a length


# -- the translated path: what the upstream answers ------------------------------

def _sse_events(*events):
    return b"".join(e if isinstance(e, bytes) else b"data: " + json.dumps(e).encode() + b"\n\n" for e in events)


def _delta(content):
    return {"id": "c1", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": content},
                                                                       "finish_reason": None}]}


_SSE = {"Content-Type": "text/event-stream"}
_JSON = {"Content-Type": "application/json"}


@pytest.mark.parametrize("answer,says", [
    (b'{"choices": ["x"]}', "choices[0] is not an object"),
    (b'{"choices": []}', "no choices"),
    (b'{"choices": {"0": {}}}', "choices is not an array"),
    (b'[1, 2]', "not a JSON object"),
    (b'null', "not a JSON object"),
    (b'not json at all', "not JSON"),
    (b"DEEP", "not JSON"),  # nested 100000 deep, below
    (b'{"choices": [{"message": "hello"}]}', "choices[0].message is not an object"),
    (b'{"choices": [{"message": {"content": 5}}]}', "choices[0].message.content is not a string"),
    (b'{"choices": [{"message": {"content": "x", "tool_calls": [1]}}]}', "choices[0].message.tool_calls[0]"),
    (b'{"choices": [{"message": {"content": "x", "tool_calls": [{"function": {"arguments": 5}}]}}]}',
     "choices[0].message.tool_calls[0].function.arguments"),
    (b'{"choices": [{"message": {"content": "x"}, "finish_reason": 1}]}', "finish_reason"),
    (b'{"choices": [{"message": {"content": "x"}}], "usage": [1]}', "usage is not an object"),
    (b'{"choices": [{"message": {"content": "x"}}], "usage": {"prompt_tokens": "9"}}', "usage.prompt_tokens"),
    (b'{"error": {"message": "quota exhausted"}}', "quota exhausted"),
])
def test_translated_malformed_completion_is_a_502(proxy, fake, answer, says):
    fake.fail_next(200, answer.replace(b"DEEP", b"[" * 100000 + b"]" * 100000), headers=_JSON)
    status, body = _error_of(proxy, "/api/chat", {"model": "via-openai", "stream": False, "messages": [_MESSAGE]})
    assert status == 502 and list(body) == ["error"]
    assert body["error"].startswith("the upstream's answer was malformed") and says in body["error"]


def test_translated_completion_with_content_parts_and_a_raw_argument_string(proxy, fake):
    answer = {"choices": [{"message": {"content": [{"type": "text", "text": "two "}, {"type": "text", "text": "parts"}],
                                       "tool_calls": [{"function": {"name": "f", "arguments": "not json"}}]},
                           "finish_reason": "length"}], "usage": {"prompt_tokens": 3, "completion_tokens": 4}}
    fake.fail_next(200, json.dumps(answer), headers=_JSON)
    _, _, payload = _call(proxy, "/api/chat", {"model": "via-openai", "stream": False, "messages": [_MESSAGE]})
    reply = json.loads(payload)
    assert reply["message"]["content"] == "two parts" and reply["done_reason"] == "length"
    assert reply["message"]["tool_calls"] == [{"function": {"name": "f", "arguments": {"_raw": "not json"}}}]
    assert reply["prompt_eval_count"] == 3 and reply["eval_count"] == 4


@pytest.mark.parametrize("bad,says", [
    (b"data: [1, 2]\n\n", "an event is not a JSON object"),
    (b"data: {not json\n\n", "an event is not JSON"),
    (b'data: {"choices": ["x"]}\n\n', "choices[0] is not an object"),
    (b'data: {"choices": {"delta": {}}}\n\n', "choices is not an array"),
    (b'data: {"choices": [{"delta": "text"}]}\n\n', "choices[0].delta is not an object"),
    (b'data: {"choices": [{"delta": {"content": 7}}]}\n\n', "choices[0].delta.content is not a string"),
    (b'data: {"choices": [{"delta": {"tool_calls": "f"}}]}\n\n', "choices[0].delta.tool_calls is not an array"),
    (b'data: {"choices": [{"delta": {"tool_calls": ["f"]}}]}\n\n', "choices[0].delta.tool_calls[0] is not"),
    (b'data: {"choices": [{"delta": {"tool_calls": [{"index": "0"}]}}]}\n\n', "tool_calls[0].index"),
    (b'data: {"choices": [{"delta": {"tool_calls": [{"function": {"arguments": {}}}]}}]}\n\n',
     "function.arguments is not a string"),
    (b'data: {"choices": [], "usage": {"completion_tokens": []}}\n\n', "usage.completion_tokens"),
    (b"data: DEEP\n\n", "an event is not JSON"),  # nested 100000 deep, below
])
def test_translated_stream_with_a_malformed_event_ends_with_an_error_line(proxy, fake, bad, says):
    bad = bad.replace(b"DEEP", b"[" * 100000 + b"]" * 100000)
    fake.fail_next(200, _sse_events(_delta("Hello"), _delta(" there"), bad, _delta("never sent"), b"data: [DONE]\n\n"),
                   headers=_SSE)
    status, _, payload = _call(proxy, "/api/chat", {"model": "via-openai", "messages": [_MESSAGE]})
    lines = _ndjson(payload)
    assert status == 200 and [l["message"]["content"] for l in lines[:-1]] == ["Hello", " there"]
    assert list(lines[-1]) == ["error"] and lines[-1]["error"].startswith("the upstream's stream was malformed")
    assert says in lines[-1]["error"]


def test_translated_stream_that_stops_without_an_end_is_an_error_line(proxy, fake):
    fake.fail_next(200, _sse_events(_delta("Hel"), _delta("lo")), headers=_SSE)  # a clean end of body, no [DONE]
    _, _, payload = _call(proxy, "/api/generate", {"model": "via-openai", "prompt": "x"})
    lines = _ndjson(payload)
    assert [l["response"] for l in lines[:-1]] == ["Hel", "lo"]
    assert "ended without a finish_reason or [DONE]" in lines[-1]["error"]


def test_translated_stream_error_event_reaches_the_official_client(proxy, fake):
    import ollama
    client = ollama.Client(host=proxy.url, headers={"Authorization": "Bearer " + API_KEY})
    fake.fail_next(200, _sse_events(_delta("partial "), _delta("answer"), b'data: {"choices": [{"delta": 5}]}\n\n'),
                   headers=_SSE)
    received = []
    with pytest.raises(ollama.ResponseError) as info:
        for part in client.chat(model="via-openai", messages=[_MESSAGE], stream=True):
            received.append(part.message.content)
    assert received == ["partial ", "answer"] and "malformed" in info.value.error
    fake.fail_next(200, _sse_events({"error": {"message": "context length exceeded", "type": "x"}}), headers=_SSE)
    with pytest.raises(ollama.ResponseError) as info:
        list(client.chat(model="via-openai", messages=[_MESSAGE], stream=True))
    assert info.value.error == "context length exceeded"


def test_translated_stream_tolerates_crlf_comments_and_no_last_blank_line(proxy, fake):
    body = (b": keep-alive\r\n\r\n" + _sse_events(_delta("a")).replace(b"\n", b"\r\n")
            + b'data: {"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"name": "look", '
              b'"arguments": "{\\"q\\":"}}]}}]}\r\r'
            + b'data: {"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"arguments": " 1}"}}]}, '
              b'"finish_reason": "tool_calls"}]}\n\ndata: [DONE]')
    fake.fail_next(200, body, headers=_SSE)
    _, _, payload = _call(proxy, "/api/chat", {"model": "via-openai", "messages": [_MESSAGE]})
    lines = _ndjson(payload)
    assert lines[0]["message"]["content"] == "a" and lines[-1]["done"] is True
    assert lines[-1]["message"]["tool_calls"] == [{"function": {"name": "look", "arguments": {"q": 1}}}]


# -- reading the upstream's SSE: linear in an event's size, any read boundaries ----

class Reads:
    """An upstream body that arrives in the given reads (UpstreamResponse's read1 and close)."""

    def __init__(self, chunks):
        self.chunks = list(chunks)
        self.closed = False

    def read1(self):
        return self.chunks.pop(0) if self.chunks else b""

    def close(self):
        self.closed = True


class Counted(bytes):
    """bytes that add to ``seen`` the length of every search, split, slice or concatenation of them,
    and whose results count in turn: how many bytes an algorithm goes over, not how long it takes."""

    seen = 0

    def __add__(self, other):
        Counted.seen += len(self) + len(other)
        return Counted(bytes(self) + bytes(other))

    def __radd__(self, other):
        Counted.seen += len(self) + len(other)
        return Counted(bytes(other) + bytes(self))

    def __contains__(self, sub):
        Counted.seen += len(self)
        return bytes.__contains__(self, sub)

    def __getitem__(self, index):
        value = bytes.__getitem__(self, index)
        if isinstance(index, slice):
            Counted.seen += len(value)
            return Counted(value)
        return value


def _counting(name):
    method = getattr(bytes, name)

    def counted(self, *args):
        Counted.seen += len(self)
        value = method(self, *args)
        if isinstance(value, bytes):
            return Counted(value)
        return [Counted(v) for v in value] if isinstance(value, list) else value
    return counted


for _name in ("find", "rfind", "index", "rindex", "count", "split", "rsplit", "replace", "strip", "lstrip",
              "rstrip"):
    setattr(Counted, _name, _counting(_name))


def counted_reads(data, size):
    """``data`` in reads of ``size`` bytes, each a Counted."""
    return Reads(Counted(data[i:i + size]) for i in range(0, len(data), size))


@pytest.mark.parametrize("newline", [b"\n", b"\r\n"])
def test_one_big_sse_event_is_read_in_time_linear_in_its_size(newline):
    text = "x" * (2 * 1024 * 1024)
    body = (b"data: " + json.dumps(_delta(text)).encode() + newline * 2 + b"data: [DONE]" + newline * 2)
    Counted.seen = 0
    events = list(ollama._iter_sse_data(counted_reads(body, 16384)))  # 129 reads
    assert [json.loads(e)["choices"][0]["delta"]["content"] for e in events[:-1]] == [text]
    assert events[-1] == b"[DONE]"
    # Adding each read to one buffer and searching it all again goes over about
    # reads/2 times the event (64 here); each read searched once, a few times.
    assert Counted.seen < 8 * len(body), Counted.seen / len(body)


def _reference_sse_data(body):
    """The data of each event, read from the whole body at once (the SSE spec's line ends)."""
    out = []
    for event in body.replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n\n"):
        lines = [line[5:].lstrip(b" ") for line in event.split(b"\n") if line.startswith(b"data:")]
        if lines:
            out.append(b"\n".join(lines))
    return out


def test_sse_events_are_the_same_whatever_the_read_boundaries():
    rng = random.Random(14)
    for _ in range(400):
        ends = [rng.choice([b"\n", b"\r\n", b"\r"]) for _ in range(40)]
        body = b""
        for i in range(rng.randint(0, 6)):
            lines = [rng.choice([b"data: ", b"data:", b"data:  ", b": ping ", b"event: e", b"id: 1"])
                     + bytes(rng.choice(b"ab {}[]:\"d") for _ in range(rng.randint(0, 12)))
                     for _ in range(rng.randint(1, 3))]
            for line in lines:
                body += line + rng.choice(ends)
            body += rng.choice(ends)  # the blank line that ends the event
        if rng.random() < 0.3:
            body += b"data: unfinished"
        cuts = sorted(rng.sample(range(1, len(body)), min(len(body) - 1, rng.randint(0, 12)))) if len(body) > 1 else []
        reads = [body[a:b] for a, b in zip([0] + cuts, cuts + [len(body)])]
        assert list(ollama._iter_sse_data(Reads(reads))) == _reference_sse_data(body), (body, reads)


def test_an_sse_event_larger_than_the_limit_is_malformed():
    reads = Reads([b"data: " + b"x" * 1000] * 5)
    with pytest.raises(ollama._Malformed, match="larger than 4096 bytes"):
        list(ollama._iter_sse_data(reads, limit=4096))


def test_a_16_mib_event_arrives_whole_through_the_translation(proxy, fake):
    text = "0123456789abcdef" * (1024 * 1024)
    fake.fail_next(200, _sse_events(_delta(text), b"data: [DONE]\n\n"), headers=_SSE)
    _, _, payload = _call(proxy, "/api/chat", {"model": "via-openai", "messages": [_MESSAGE]})
    lines = _ndjson(payload)
    assert len(lines) == 2 and lines[0]["message"]["content"] == text and lines[1]["done"] is True


# -- fuzzing the translation both ways --------------------------------------------

_WORDS = ["hello", "wörld", "tool", "", " ", "日本", "a\nb", "\"q\"", "\\", "1.5", "null", "{}", "[DONE]"]


def _random_json(rng, depth=0):
    kind = rng.randrange(7 if depth < 3 else 5)
    if kind == 0:
        return None
    if kind == 1:
        return rng.random() < 0.5
    if kind == 2:
        return rng.choice([0, 1, -1, -2, 7, 2 ** 63, -(2 ** 70)])
    if kind == 3:
        return rng.choice([0.0, -0.5, 1e308, 3.25])
    if kind == 4:
        return rng.choice(_WORDS)
    if kind == 5:
        return [_random_json(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return {rng.choice(["a", "role", "content", "function", "type", "text"]): _random_json(rng, depth + 1)
            for _ in range(rng.randint(0, 3))}


def _places(value, path=()):
    """Every (container, key) in a JSON value: where a mutation can land."""
    out = []
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        out.append((value, key))
        out += _places(item, path + (key,))
    return out


def _mutated(rng, value):
    """``value`` (a dict, changed in place) after one to three random changes."""
    for _ in range(rng.randint(1, 3)):
        places = _places(value)
        if not places:
            break
        container, key = rng.choice(places)
        action = rng.randrange(4)
        if action == 0 and isinstance(container, dict):
            del container[key]
        elif action == 1:
            container[key] = [container[key]]
        else:
            container[key] = _random_json(rng)
    return value


def _chat_body(rng):
    messages = []
    for _ in range(rng.randint(0, 4)):
        message = {"role": rng.choice(["user", "assistant", "system", "tool"]), "content": rng.choice(_WORDS)}
        if rng.random() < 0.2:
            message["images"] = ["aGVsbG8="]
        if message["role"] == "assistant" and rng.random() < 0.3:
            message["tool_calls"] = [{"function": {"name": "lookup", "arguments": {"q": "x"}}}]
        if message["role"] == "tool" and rng.random() < 0.5:
            message["tool_call_id"] = "call_0"
        messages.append(message)
    body = {"model": "via-openai", "messages": messages}
    return _common_fields(rng, body)


def _generate_body(rng):
    body = {"model": "via-openai", "prompt": rng.choice(_WORDS)}
    if rng.random() < 0.5:
        body["system"] = rng.choice(_WORDS)
    if rng.random() < 0.2:
        body["images"] = ["aGVsbG8="]
    return _common_fields(rng, body)


def _common_fields(rng, body):
    if rng.random() < 0.7:
        body["stream"] = rng.random() < 0.5
    if rng.random() < 0.6:
        options = {"temperature": 0.2, "top_p": 0.9, "num_predict": rng.choice([-1, 50]), "stop": ["\n\n"],
                   "seed": 7, "top_k": 40, "frequency_penalty": 0.1}
        body["options"] = {k: v for k, v in options.items() if rng.random() < 0.5}
    if rng.random() < 0.3:
        body["tools"] = [{"type": "function", "function": {"name": "lookup", "parameters": {
            "type": "object", "properties": {"q": {"type": "string"}}}}}]
    if rng.random() < 0.3:
        body["format"] = rng.choice(["json", "", {"type": "object", "properties": {"a": {"type": "string"}}}])
    return body


def _completion(rng):
    message = {"role": "assistant", "content": rng.choice(_WORDS)}
    if rng.random() < 0.3:
        message["tool_calls"] = [{"id": "call_1", "type": "function",
                                  "function": {"name": "lookup", "arguments": rng.choice(['{"q":"x"}', "{", "[]"])}}]
    return {"id": "chatcmpl-1", "object": "chat.completion", "choices": [
        {"index": 0, "message": message, "finish_reason": rng.choice(["stop", "length", "tool_calls", None])}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}}


def _stream_chunks(rng):
    chunks = [{"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}]
    chunks += [_delta(rng.choice(_WORDS)) for _ in range(rng.randint(0, 4))]
    if rng.random() < 0.3:
        chunks += [{"choices": [{"index": 0, "delta": {"tool_calls": [
            {"index": 0, "id": "call_1", "function": {"name": "lookup", "arguments": piece}}]}}]}
            for piece in ['{"q"', ':"x"}']]
    chunks.append({"choices": [{"index": 0, "delta": {}, "finish_reason": rng.choice(["stop", "length"])}]})
    if rng.random() < 0.7:
        chunks.append({"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 2}})
    if rng.random() < 0.1:
        chunks.append({"error": rng.choice([{"message": "overloaded"}, "overloaded", None, 5])})
    return chunks


def _sse_body(rng, chunks):
    end = rng.choice([b"\n\n", b"\r\n\r\n"])
    events = [b"data: " + json.dumps(c).encode() + end for c in chunks]
    if rng.random() < 0.2:
        events.insert(rng.randint(0, len(events)), b": keep-alive" + end)
    if rng.random() < 0.85:
        events.append(b"data: [DONE]" + end)
    body = b"".join(events)
    return body[:rng.randint(0, len(body))] if rng.random() < 0.1 else body


def _flipped(rng, data):
    """``data`` with a few bytes changed, or cut short: mostly no longer JSON."""
    data = bytearray(data)
    if data and rng.random() < 0.5:
        return bytes(data[:rng.randrange(len(data))])
    for _ in range(rng.randint(1, 3)):
        if data:
            data[rng.randrange(len(data))] = rng.choice(b'{}[]",:0a\\\n\r ')
    return bytes(data)


def _check_ollama_answer(response, endpoint):
    """What App.handle returned is an Ollama answer (JSON or NDJSON) or an Ollama error."""
    chunks = getattr(response, "chunks", None)
    if chunks is not None:
        try:
            body = b"".join(chunks)
        finally:
            response.close()
    else:
        body = response.body
    status = response.status
    headers = {k.lower(): v for k, v in response.headers}
    assert status != 500 and 200 <= status < 600, (status, body[:300])
    if status != 200:
        error = json.loads(body)
        assert list(error) == ["error"] and isinstance(error["error"], str) and error["error"], body[:300]
        return "error"
    if chunks is None:
        reply = json.loads(body)
        _check_reply(reply, endpoint, final=True)
        return "json"
    assert headers["content-type"] == "application/x-ndjson"
    assert body.endswith(b"\n")
    lines = [json.loads(line) for line in body.split(b"\n")[:-1]]
    assert lines, "an empty stream"
    for line in lines[:-1]:
        _check_reply(line, endpoint, final=False)
    if list(lines[-1]) == ["error"]:
        assert isinstance(lines[-1]["error"], str) and lines[-1]["error"]
        return "stream error"
    _check_reply(lines[-1], endpoint, final=True)
    return "stream"


def _check_reply(reply, endpoint, final):
    assert isinstance(reply, dict) and reply["done"] is final and isinstance(reply["model"], str), reply
    assert isinstance(reply["created_at"], str)
    if endpoint == "/api/chat":
        message = reply["message"]
        assert message["role"] == "assistant" and isinstance(message["content"], str), reply
        for call in message.get("tool_calls", []):
            assert isinstance(call["function"]["name"], str) and isinstance(call["function"]["arguments"], dict)
    else:
        assert isinstance(reply["response"], str), reply
    if final:
        assert reply["done_reason"] in ("stop", "length")
        assert all(isinstance(reply[k], int) for k in ("total_duration", "prompt_eval_count", "eval_count"))


@pytest.fixture
def translating_app(fake):
    """The app without its server: App.handle in this thread, so an exception escaping it fails the test."""
    import ragproxy
    from conftest import proxy_config
    app = ragproxy.App(ragproxy.Config.from_text(proxy_config(fake.url)))
    headers = {"authorization": "Bearer " + API_KEY, "content-type": "application/json"}

    def handle(path, data):
        return app.handle(ragproxy.Request("POST", path, "", headers, data, "127.0.0.1"))

    yield handle
    app.close()


def test_fuzzed_ollama_bodies_get_an_ollama_answer_or_an_ollama_error(translating_app, fake):
    rng = random.Random(1414)
    seen = {}
    for _ in range(300):
        path = rng.choice(["/api/chat", "/api/generate"])
        body = (_chat_body if path == "/api/chat" else _generate_body)(rng)
        if rng.random() < 0.8:
            _mutated(rng, body)
        data = json.dumps(body).encode()
        if rng.random() < 0.1:
            data = _flipped(rng, data)
        kind = _check_ollama_answer(translating_app(path, data), path)
        seen[kind] = seen.get(kind, 0) + 1
    assert set(seen) >= {"error", "json", "stream"}, seen  # the bodies reached every kind of answer


def test_fuzzed_upstream_answers_become_ollama_answers_or_ollama_errors(translating_app, fake):
    rng = random.Random(1415)
    seen = {}
    for _ in range(300):
        path = rng.choice(["/api/chat", "/api/generate"])
        stream = rng.random() < 0.6
        if stream:
            data, headers = _sse_body(rng, [_mutated(rng, c) if rng.random() < 0.3 else c
                                            for c in _stream_chunks(rng)]), _SSE
        else:
            answer = _completion(rng)
            data, headers = json.dumps(_mutated(rng, answer) if rng.random() < 0.7 else answer).encode(), _JSON
        if rng.random() < 0.1:
            data = _flipped(rng, data)
        status = rng.choice([200] * 8 + [400, 429, 503])
        fake.fail_next(status, data, headers=headers)
        body = {"model": "via-openai", "stream": stream}
        body.update({"messages": [_MESSAGE]} if path == "/api/chat" else {"prompt": "hi"})
        kind = _check_ollama_answer(translating_app(path, json.dumps(body).encode()), path)
        seen[kind] = seen.get(kind, 0) + 1
    assert set(seen) == {"error", "json", "stream", "stream error"}, seen
