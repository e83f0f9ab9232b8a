"""The client APIs' formats (_ragproxy.api): error shapes, the endpoint table, paths, StreamTracker; in-process.

Pure functions and small classes, checked against the shapes each client
API documents (and its SDK parses); that a real request gets them over
the wire is test_server's and test_proxy's.
"""
import json

import pytest

from _ragproxy import api


def error_of(dialect, status, message="nope", code=None):
    response = api.error_response(dialect, status, message, code, headers=[("Retry-After", "3")])
    assert response.status == status
    assert response.headers == [("Content-Type", "application/json"), ("Retry-After", "3")]
    return json.loads(response.body)


def test_error_shapes_per_dialect():
    assert error_of("openai", 429, code="rate_limited") == {
        "error": {"message": "nope", "type": "rate_limit_error", "param": None, "code": "rate_limited"}}
    assert error_of("openai", 503)["error"]["type"] == "server_error"          # any 5xx without its own type
    assert error_of("openai", 422)["error"]["type"] == "invalid_request_error"  # any 4xx without its own type
    assert error_of("responses", 401)["error"]["type"] == "authentication_error"
    assert error_of("anthropic", 404, "gone") == {"type": "error", "error": {"type": "not_found_error",
                                                                             "message": "gone"}}
    assert error_of("anthropic", 529)["error"]["type"] == "overloaded_error"
    assert error_of("anthropic", 500)["error"]["type"] == "api_error"
    assert error_of("ollama", 400, "bad model") == {"error": "bad model"}


def test_error_bodies_keep_non_ascii_text_as_utf8():
    body = api.error_response("ollama", 400, "caf\u00e9").body
    assert body == '{"error":"caf\u00e9"}'.encode("utf-8")


@pytest.mark.parametrize("sent, canonical, dialect", [
    ("/chat/completions", "/v1/chat/completions", "openai"),
    ("/v1/chat/completions/", "/v1/chat/completions", "openai"),
    ("/messages", "/v1/messages", "anthropic"),
    ("/v1/messages/count_tokens", "/v1/messages/count_tokens", "anthropic"),
    ("/responses", "/v1/responses", "responses"),
    ("/api/generate", "/api/generate", "ollama"),
    ("/models", "/v1/models", "openai"),
    ("/", "/", "openai"),
])
def test_normalize_path_and_dialect_of(sent, canonical, dialect):
    assert api.normalize_path(sent) == canonical
    assert api.dialect_of(sent) == dialect


def test_every_endpoint_speaks_the_dialect_of_its_path():
    for (method, path), endpoint in api.ENDPOINTS.items():
        assert method == "POST" and api.normalize_path(path) == path, path
        assert endpoint.dialect == api.dialect_for_path(path), path
        assert set(endpoint.list_fields) <= set(endpoint.required), path


def test_is_event_stream():
    assert api.is_event_stream("text/event-stream; charset=utf-8")
    assert api.is_event_stream("Application/X-NDJSON")
    assert not api.is_event_stream("application/json")


def test_stream_tracker_continues_a_responses_stream_in_its_failure_event():
    tracker = api.StreamTracker("responses")
    assert tracker.watches
    tracker.feed(b'event: response.created\ndata: {"type":"response.created","sequence_number":0,'
                 b'"response":{"id":"resp_abc","status":"in_progress"}}\n\n')
    tracker.feed(b'data: {"sequence_number":1}\n\ndata: {"sequence_number": 2,"item_id":"msg_1"}\n\n')
    event = tracker.error_event("upstream went away")
    assert event.startswith(b"event: response.failed\ndata: ") and event.endswith(b"\n\n")
    data = json.loads(event.split(b"data: ", 1)[1])
    assert data["type"] == "response.failed" and data["sequence_number"] == 3
    assert data["response"]["id"] == "resp_abc" and data["response"]["status"] == "failed"
    assert data["response"]["error"] == {"code": "server_error", "message": "upstream went away"}
    assert json.loads(tracker.error_event("again").split(b"data: ", 1)[1])["sequence_number"] == 4


def test_stream_tracker_failure_events_of_the_other_dialects():
    assert not api.StreamTracker("anthropic").watches and not api.StreamTracker("openai").watches
    anthropic = api.StreamTracker("anthropic").error_event("boom")
    assert anthropic == b'event: error\ndata: {"type":"error","error":{"type":"api_error","message":"boom"}}\n\n'
    assert api.StreamTracker("ollama").error_event("boom") == b'{"error":"boom"}\n'
    openai = api.StreamTracker("openai").error_event("boom", code="timeout")
    assert openai.startswith(b"data: ") and openai.endswith(b"\n\n")
    assert json.loads(openai[6:]) == {"error": {"message": "boom", "type": "server_error", "param": None,
                                                "code": "timeout"}}
