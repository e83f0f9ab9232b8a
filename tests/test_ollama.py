"""Ollama's native API: passed through to Ollama, translated for OpenAI-style upstreams."""
import json
import urllib.request

import pytest

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
    if field != "tool_arguments":  # (arguments are encoded apart, shallower than the body that holds them)
        assert f"{named} is nested too deeply" in ours, ours  # the window between parsing and encoding was hit


def test_negative_num_predict_means_no_limit_and_a_stop_string_is_kept(proxy, fake):
    _call(proxy, "/api/chat", {"model": "via-openai", "stream": False, "messages": [_MESSAGE],
                               "options": {"num_predict": -1, "stop": "END", "top_k": 3}})
    sent = fake.last.json
    assert "max_tokens" not in sent and sent["stop"] == "END"  # Ollama's -1 is "no limit", not a length

