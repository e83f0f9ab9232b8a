"""The HTTP adapter on the wire: framing, keep-alive, limits and hostile input.

Raw sockets, because client libraries hide exactly what is tested here.
"""
import json
import socket
import time

import pytest

from conftest import API_KEY, send_slowly


def _connect(proxy):
    return socket.create_connection(("127.0.0.1", proxy.port), timeout=5)


def _read_response(sock):
    """One HTTP/1.1 response: (status, headers dict, body bytes). Handles both framings."""
    buf = b""
    while b"\r\n\r\n" not in buf:
        data = sock.recv(65536)
        if not data:
            raise ConnectionError("closed before headers: %r" % buf)
        buf += data
    head, rest = buf.split(b"\r\n\r\n", 1)
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        k, v = line.split(":", 1)
        headers[k.strip().lower()] = v.strip()
    if "content-length" in headers:
        n = int(headers["content-length"])
        while len(rest) < n:
            rest += sock.recv(65536)
        return status, headers, rest[:n]
    if headers.get("transfer-encoding") == "chunked":
        body = b""
        while True:
            while b"\r\n" not in rest:
                rest += sock.recv(65536)
            size_line, rest = rest.split(b"\r\n", 1)
            size = int(size_line, 16)
            while len(rest) < size + 2:
                rest += sock.recv(65536)
            body, rest = body + rest[:size], rest[size + 2:]
            if size == 0:
                return status, headers, body
    while True:
        data = sock.recv(65536)
        if not data:
            return status, headers, rest
        rest += data


def _post(path, body, headers=None, auth=True):
    lines = [f"POST {path} HTTP/1.1", "Host: localhost"]
    if auth:
        lines.append("Authorization: Bearer " + API_KEY)
    for k, v in (headers or {"Content-Type": "application/json"}).items():
        lines.append(f"{k}: {v}")
    if "Transfer-Encoding" not in (headers or {}):
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


CHAT = json.dumps({"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}).encode()


def test_keep_alive_serves_many_requests_on_one_connection(proxy, fake):
    sock = _connect(proxy)
    for _ in range(5):
        sock.sendall(_post("/v1/chat/completions", CHAT))
        status, headers, body = _read_response(sock)
        assert status == 200 and json.loads(body)["choices"][0]["message"]["content"] == "ECHO: hi"
        assert headers.get("connection") != "close"
    sock.close()
    assert fake.connections_opened == 1  # the upstream connection was pooled too
    assert len(fake.requests) == 5  # and no request was sent twice


def test_stream_is_chunked_and_carries_sse_headers(proxy):
    sock = _connect(proxy)
    body = json.dumps({"model": "gpt-4o", "stream": True, "messages": [{"role": "user", "content": "a b"}]}).encode()
    sock.sendall(_post("/v1/chat/completions", body))
    status, headers, payload = _read_response(sock)
    assert status == 200
    assert headers["transfer-encoding"] == "chunked"
    assert headers["content-type"].startswith("text/event-stream")
    assert headers["cache-control"] == "no-cache" and headers["x-accel-buffering"] == "no"
    assert payload.endswith(b"data: [DONE]\n\n")
    # the connection stays usable after a chunked stream
    sock.sendall(_post("/v1/chat/completions", CHAT))
    assert _read_response(sock)[0] == 200


def test_http10_stream_is_close_delimited(proxy):
    sock = _connect(proxy)
    body = json.dumps({"model": "gpt-4o", "stream": True, "messages": [{"role": "user", "content": "a"}]}).encode()
    sock.sendall(_post("/v1/chat/completions", body).replace(b"HTTP/1.1", b"HTTP/1.0", 1))
    status, headers, payload = _read_response(sock)
    assert status == 200 and "transfer-encoding" not in headers
    assert payload.endswith(b"data: [DONE]\n\n")


def test_chunked_request_body_is_decoded(proxy, fake):
    sock = _connect(proxy)
    chunks = [CHAT[:10], CHAT[10:]]
    wire = b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunks) + b"0\r\n\r\n"
    sock.sendall(_post("/v1/chat/completions", wire,
                       {"Content-Type": "application/json", "Transfer-Encoding": "chunked"}))
    status, _, body = _read_response(sock)
    assert status == 200, body
    assert fake.last.json["messages"][0]["content"] == "hi"


@pytest.mark.parametrize("path,shape", [("/v1/chat/completions", "openai"), ("/v1/messages", "anthropic"),
                                        ("/api/chat", "ollama"), ("/v1/responses", "openai")])
@pytest.mark.parametrize("body,fragment", [
    (b"{not json", "not valid JSON"),
    (b"\xff\xfe{}", "not valid UTF-8"),
    (b"[1, 2]", "must be a JSON object"),
    (b'{"messages": []}', "missing required field 'model'"),
    (b"", "empty"),
    (b"[" * 100_000, "nested too deeply"),  # a parser recursion limit is still bad input, not a 500
], ids=["not-json", "not-utf8", "array", "no-model", "empty", "deep-nesting"])
def test_bad_bodies_get_400_in_the_api_shape(proxy, fake, path, shape, body, fragment):
    sock = _connect(proxy)
    sock.sendall(_post(path, body))
    status, headers, payload = _read_response(sock)
    assert status == 400
    obj = json.loads(payload)
    if shape == "openai":
        assert fragment in obj["error"]["message"] and obj["error"]["type"] == "invalid_request_error"
    elif shape == "anthropic":
        assert obj["type"] == "error" and fragment in obj["error"]["message"]
    else:
        assert fragment in obj["error"]
    assert b"Traceback" not in payload
    assert fake.requests == []


def test_missing_messages_and_wrong_types(proxy):
    sock = _connect(proxy)
    sock.sendall(_post("/v1/messages", json.dumps({"model": "claude-x", "max_tokens": 5}).encode()))
    status, _, payload = _read_response(sock)
    assert status == 400 and "'messages'" in json.loads(payload)["error"]["message"]
    sock.sendall(_post("/v1/chat/completions", json.dumps({"model": "m", "messages": "hi"}).encode()))
    status, _, payload = _read_response(sock)
    assert status == 400 and "must be an array" in json.loads(payload)["error"]["message"]


def test_oversized_body_is_413_without_reading_it(make_proxy, fake):
    p = make_proxy(server="  max_body_bytes: 2048")
    sock = _connect(p)
    sock.sendall(b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nx-api-key: " + API_KEY.encode() +
                 b"\r\nContent-Type: application/json\r\nContent-Length: 100000000\r\n\r\n")
    status, headers, payload = _read_response(sock)
    assert status == 413
    assert json.loads(payload)["error"]["type"] == "request_too_large"
    assert headers["connection"] == "close"


def test_oversized_chunked_body_is_413(make_proxy):
    p = make_proxy(server="  max_body_bytes: 2048")
    sock = _connect(p)
    chunk = b"x" * 1500
    wire = (b"%x\r\n%s\r\n" % (len(chunk), chunk)) * 3 + b"0\r\n\r\n"
    sock.sendall(_post("/v1/chat/completions", wire, {"Transfer-Encoding": "chunked"}))
    assert _read_response(sock)[0] == 413


@pytest.mark.parametrize("body", [b"zz\r\nabc\r\n0\r\n\r\n", b"-3\r\nabc\r\n0\r\n\r\n", b"0x3\r\nabc\r\n0\r\n\r\n"],
                         ids=["not-hex", "negative", "0x-prefix"])
def test_malformed_chunked_body_is_400(proxy, body):
    sock = _connect(proxy)
    sock.settimeout(5)  # a negative size once read to the end of the stream: it must not wait for that
    sock.sendall(_post("/v1/chat/completions", body, {"Transfer-Encoding": "chunked"}))
    status, _, payload = _read_response(sock)
    assert status == 400 and "chunked" in json.loads(payload)["error"]["message"]


def test_bad_content_length_is_400(proxy):
    sock = _connect(proxy)
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n")
    assert _read_response(sock)[0] == 400


def test_oversized_headers_are_431_json(make_proxy):
    p = make_proxy(server="  max_header_bytes: 2048")
    sock = _connect(p)
    sock.sendall(_post("/v1/chat/completions", CHAT, {"Content-Type": "application/json", "X-Big": "a" * 4000}))
    status, _, payload = _read_response(sock)
    assert status == 431 and "error" in json.loads(payload)


def test_header_line_over_stdlib_limit_still_gets_json(proxy):
    sock = _connect(proxy)
    sock.sendall(b"GET /v1/models HTTP/1.1\r\nX-Huge: " + b"a" * 70000 + b"\r\n\r\n")
    status, _, payload = _read_response(sock)
    assert status == 431 and json.loads(payload)["error"]


def test_garbage_request_line_gets_json_400(proxy):
    sock = _connect(proxy)
    sock.sendall(b"HELLO\r\n\r\n")
    status, _, payload = _read_response(sock)
    assert status == 400 and json.loads(payload)["error"]


def test_slow_client_is_timed_out_with_408(make_proxy, timeouts):
    p = make_proxy(server="  client_timeout: 0.5")
    sock = _connect(p)
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
    status, headers, payload = _read_response(sock)  # returns once the proxy gives up on the body
    assert status == 408 and headers["connection"] == "close"


def test_idle_keep_alive_connection_is_closed(make_proxy, timeouts):
    p = make_proxy(server="  client_timeout: 0.3")
    sock = _connect(p)
    sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    assert _read_response(sock)[0] == 200
    time.sleep(0.8)
    assert sock.recv(10) == b""  # the proxy hung up; its thread is free


def test_head_and_health_need_no_key(proxy):
    sock = _connect(proxy)
    sock.sendall(b"HEAD / HTTP/1.1\r\nHost: x\r\n\r\n")
    data = sock.recv(65536)
    assert data.startswith(b"HTTP/1.1 200") and data.endswith(b"\r\n\r\n")  # no body after HEAD
    sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    status, _, payload = _read_response(sock)
    assert status == 200 and json.loads(payload)["status"] == "ok"


def test_unknown_path_is_json_404(proxy):
    sock = _connect(proxy)
    sock.sendall(b"GET /nowhere HTTP/1.1\r\nHost: x\r\n\r\n")
    status, _, payload = _read_response(sock)
    assert status == 404 and json.loads(payload)["error"]["message"]


def test_paths_without_v1_prefix(proxy, fake):
    sock = _connect(proxy)
    sock.sendall(_post("/chat/completions", CHAT))
    assert _read_response(sock)[0] == 200
    assert fake.last.path == "/v1/chat/completions"


def test_internal_error_is_500_without_traceback(proxy):
    def boom(exchange):
        raise RuntimeError("secret internal detail")
    proxy.app.rewriters.append(boom)
    sock = _connect(proxy)
    sock.sendall(_post("/v1/messages", json.dumps({"model": "claude-x", "max_tokens": 5,
                                                   "messages": [{"role": "user", "content": "x"}]}).encode()))
    status, _, payload = _read_response(sock)
    assert status == 500
    assert json.loads(payload)["type"] == "error"
    assert b"secret internal detail" not in payload and b"Traceback" not in payload


def test_generic_v1_path_forwarded_to_catch_all(proxy, fake):
    sock = _connect(proxy)
    sock.sendall(b"GET /v1/models/fake-model HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + API_KEY.encode() +
                 b"\r\n\r\n")
    _read_response(sock)
    assert fake.last.path == "/v1/models/fake-model"


def test_a_body_too_deep_to_read_a_model_from_goes_to_the_catch_all(proxy, fake):
    sock = _connect(proxy)
    sock.sendall(_post("/v1/some/new/endpoint", b"[" * 100_000, {"Content-Type": "application/json"}))
    status, _, _ = _read_response(sock)
    assert status != 500 and fake.last.path == "/v1/some/new/endpoint"


@pytest.mark.parametrize("trickle", [False, True], ids=["buffered", "trickled"])
def test_request_heads_parse_alike_however_they_arrive(proxy, fake, trickle):
    send = send_slowly if trickle else (lambda sock, data: sock.sendall(data))
    crlf = _post("/v1/chat/completions", CHAT, {"Content-Type": "application/json", "X-Trace": "one",
                                                 "X-Folded": "first"})
    crlf = crlf.replace(b"X-Folded: first\r\n", b"X-Folded: first\r\n   second\r\n")
    crlf = crlf.replace(b"X-Trace: one\r\n", b"X-Trace: one\r\nx-trace: two\r\n")
    head, body = crlf.split(b"\r\n\r\n", 1)
    for raw in (crlf, head.replace(b"\r\n", b"\n") + b"\n\n" + body):  # and bare LF line ends
        sock = _connect(proxy)
        send(sock, raw)
        status, _, payload = _read_response(sock)
        sock.close()
        assert status == 200 and json.loads(payload)["choices"][0]["message"]["content"] == "ECHO: hi"
        got = fake.last.headers
        assert got["x-trace"] == "one, two" and got["x-folded"] == "first second"
        assert API_KEY not in got.get("authorization", "")  # authenticated, and the key not forwarded


@pytest.mark.parametrize("trickle", [False, True], ids=["buffered", "trickled"])
def test_bad_request_heads_are_refused_however_they_arrive(proxy, trickle):
    send = send_slowly if trickle else (lambda sock, data: sock.sendall(data))
    cases = [
        (b"GET /v1/models HTTP/1.1\r\n" + b"X-Many: 1\r\n" * 101 + b"\r\n", 431),
        (b"GET /v1/models HTTP/1.1\r\nNo colon here\r\n\r\n", 400),
        (b"GET /v1/models HTTP/1.1\r\n: no name\r\n\r\n", 400),
    ]
    for raw, want in cases:
        sock = _connect(proxy)
        send(sock, raw)
        status, headers, payload = _read_response(sock)
        sock.close()
        assert status == want and json.loads(payload)["error"]
        assert headers["connection"] == "close"
