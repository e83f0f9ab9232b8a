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
