"""The HTTP adapter on the wire: framing, keep-alive, limits and hostile input.

Raw sockets, because client libraries hide exactly what is tested here.
"""
import json
import logging
import socket
import threading
import time

import pytest

import ragproxy
from conftest import API_KEY, RunningProxy, proxy_config, send_slowly, wait_for


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


def test_a_finished_stream_is_unwatched_before_its_last_chunk_goes_out(proxy):
    # Once the client has the terminating chunk it sends its next request; a
    # socket still watched then woke the hang-up thread for nothing, per stream.
    sock = _connect(proxy)
    body = json.dumps({"model": "gpt-4o", "stream": True, "messages": [{"role": "user", "content": "a b"}]}).encode()
    hangups = proxy.server.hangups
    for _ in range(3):
        sock.sendall(_post("/v1/chat/completions", body))
        status, _, payload = _read_response(sock)
        assert status == 200 and payload.endswith(b"data: [DONE]\n\n")
        assert hangups.watching() == 0
    sock.close()


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


# -- hostile heads: numbers, control characters ----------------------------------

def _shape_of(path, payload):
    """The error message, checked to be in the error shape of ``path``'s API."""
    obj = json.loads(payload)
    if path.startswith("/api/"):
        return obj["error"]
    if path.startswith("/v1/messages"):
        assert obj["type"] == "error" and obj["error"]["type"] == "invalid_request_error"
        return obj["error"]["message"]
    assert obj["error"]["type"] == "invalid_request_error"
    return obj["error"]["message"]


# Each passes str.isdigit(); int() refuses the first three (a closed connection
# without a word, before) and would read the fourth (Arabic-Indic 3).
_NOT_ASCII_DIGITS = ["\xb9", "\xb2", "1" + "9" * 5000, "\u0663"]


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/messages", "/api/chat", "/v1/responses"])
@pytest.mark.parametrize("expect", [False, True], ids=["plain", "expect-100"])
def test_content_length_of_non_ascii_digits_is_400_in_the_api_shape(proxy, fake, path, expect):
    for length in _NOT_ASCII_DIGITS:
        sock = _connect(proxy)
        sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {API_KEY}\r\n"
                     f"{'Expect: 100-continue' + chr(13) + chr(10) if expect else ''}"
                     f"Content-Length: {length}\r\n\r\n{{}}".encode("utf-8" if length == "\u0663" else "latin-1"))
        status, headers, payload = _read_response(sock)
        sock.close()
        assert status == 400 and "invalid Content-Length" in _shape_of(path, payload), length
        assert headers["connection"] == "close"
    assert fake.requests == []


def test_a_non_ascii_http_version_is_400(proxy):
    sock = _connect(proxy)
    sock.sendall("GET /health HTTP/\xb9.\xb9\r\nHost: x\r\n\r\n".encode("latin-1"))
    status, _, payload = _read_response(sock)
    assert status == 400 and "Bad request version" in json.loads(payload)["error"]["message"]


@pytest.mark.parametrize("length", ["\xb9", "\xb2", "1" + "9" * 5000], ids=["sup-1", "sup-2", "5000-digits"])
def test_upload_content_length_of_non_ascii_digits_is_400(admin_proxy, length):
    token = admin_proxy.admin().token
    sock = _connect(admin_proxy)
    sock.sendall(f"POST /admin/api/kbs/docs/upload HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n"
                 f"Content-Type: multipart/form-data; boundary=b\r\nContent-Length: {length}\r\n\r\n".encode("latin-1"))
    status, _, payload = _read_response(sock)
    assert status == 400 and "invalid Content-Length" in json.loads(payload)["error"]["message"]


@pytest.mark.parametrize("trickle", [False, True], ids=["buffered", "trickled"])
@pytest.mark.parametrize("line", [b"X-Note: one\rtwo", b"X-Note: one\x00two", b"X-Note: one\r", b"X Note: 1",
                                  b"X-\xe9: 1", b"X-Note: ok\r\n  folded\rwith a CR"],
                         ids=["bare-CR", "NUL", "CR-at-end", "space-in-name", "non-ascii-name", "folded-CR"])
def test_control_characters_in_a_header_are_400_and_never_reach_the_upstream(proxy, fake, caplog, trickle, line):
    send = send_slowly if trickle else (lambda sock, data: sock.sendall(data))
    for path in ("/v1/chat/completions", "/v1/messages", "/api/chat"):
        raw = _post(path, CHAT, {"Content-Type": "application/json"}).replace(b"\r\n\r\n", b"\r\n" + line +
                                                                                b"\r\n\r\n", 1)
        sock = _connect(proxy)
        send(sock, raw)
        status, headers, payload = _read_response(sock)
        sock.close()
        assert status == 400, (path, payload)
        message = _shape_of(path, payload)
        assert "CR, LF or NUL" in message or "Malformed header" in message
        assert headers["connection"] == "close"
    assert fake.requests == []
    assert not [r for r in caplog.records if "upstream" in r.getMessage()]


# -- Expect: 100-continue ------------------------------------------------------------

def _expect_upload(proxy, token, body, ctype, length=None):
    """Send an upload's head with Expect: 100-continue; the socket and the first answer's status line."""
    sock = _connect(proxy)
    sock.sendall(f"POST /admin/api/kbs/docs/upload HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n"
                 f"Content-Type: {ctype}\r\nExpect: 100-continue\r\n"
                 f"Content-Length: {len(body) if length is None else length}\r\n\r\n".encode())
    first = b""
    while b"\r\n\r\n" not in first:
        data = sock.recv(1)
        if not data:
            break
        first += data
    return sock, first


def test_upload_with_expect_100_continue_is_held_to_the_upload_caps_not_max_body_bytes(make_admin_proxy, fake):
    from conftest import multipart_body, proxy_config
    proxy = make_admin_proxy(proxy_config(fake.url, server="  max_body_bytes: 2048"))
    admin = proxy.admin()
    admin.post("/admin/api/kbs", {"name": "docs"})
    token = admin.token
    body, ctype = multipart_body([("big.md", b"# Notes\n\n" + b"The kettle is blue. " * 400)])
    assert len(body) > 2048   # over server.max_body_bytes, far under uploads.max_total_bytes
    sock, first = _expect_upload(proxy, token, body, ctype)
    assert first == b"HTTP/1.1 100 Continue\r\n\r\n"
    sock.sendall(body)
    status, _, payload = _read_response(sock)
    assert status == 201 and json.loads(payload)["stored"], payload
    # A plain request is still held to server.max_body_bytes, and the answer says which setting that is.
    sock = _connect(proxy)
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 4096\r\n"
                 b"Authorization: Bearer " + API_KEY.encode() + b"\r\n\r\n")
    status, _, payload = _read_response(sock)
    assert status == 413 and "server.max_body_bytes" in json.loads(payload)["error"]["message"]


def test_an_upload_over_its_cap_is_refused_before_100_continue(make_admin_proxy, fake):
    from conftest import proxy_config
    proxy = make_admin_proxy(proxy_config(fake.url, extra="uploads: {max_total_bytes: 1000}\n"))
    admin = proxy.admin()
    admin.post("/admin/api/kbs", {"name": "docs"})
    token = admin.token
    sock, first = _expect_upload(proxy, token, b"", "multipart/form-data; boundary=b", length=10 ** 9)
    assert first.startswith(b"HTTP/1.1 413 ")   # the final answer first: the body is never sent
    rest = first.split(b"\r\n\r\n", 1)[1]
    length = int(first.lower().split(b"content-length: ", 1)[1].split(b"\r\n", 1)[0])
    while len(rest) < length:
        rest += sock.recv(65536)
    error = json.loads(rest)["error"]
    assert "uploads.max_total_bytes" in error["message"] and error["code"] == "upload_rejected"
    # Without a login, likewise: 401 and no 100 Continue.
    sock, first = _expect_upload(proxy, "not-a-token", b"", "multipart/form-data; boundary=b", length=10 ** 6)
    assert first.startswith(b"HTTP/1.1 401 ")


# -- connection cap and head deadline ---------------------------------------------------

def _until(condition, timeout=5.0):
    """Wait for ``condition()`` (a handler thread ends just after its client leaves)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


def test_connections_past_max_connections_get_503_while_health_still_answers(make_proxy):
    from _ragproxy.server import HEALTH_RESERVE
    p = make_proxy(server="  client_timeout: 5\n  max_connections: 2")
    p.server.reserve_head_timeout = 30   # the silent clients below keep their places throughout
    held = [_connect(p) for _ in range(2)]
    for sock in held:  # served, and kept alive: each holds its place
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert _read_response(sock)[0] == 200
    assert p.server.connections == 2
    for path, shape in (("/v1/models", "openai"), ("/v1/messages", "anthropic"), ("/api/tags", "ollama")):
        sock = _connect(p)
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {API_KEY}\r\n\r\n".encode())
        status, headers, payload = _read_response(sock)
        sock.close()
        assert status == 503 and headers["retry-after"] == "1" and headers["connection"] == "close"
        obj = json.loads(payload)
        message = obj["error"] if shape == "ollama" else obj["error"]["message"]
        assert "server.max_connections" in message
    sock = _connect(p)
    sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    status, headers, payload = _read_response(sock)
    sock.close()
    assert status == 200 and json.loads(payload)["status"] == "ok" and headers["connection"] == "close"
    _until(lambda: p.server.connections == 2)
    # The reserve full too (silent clients): the next connection is answered before it says a word.
    silent = [_connect(p) for _ in range(HEALTH_RESERVE)]
    _until(lambda: p.server.connections == 2 + HEALTH_RESERVE)
    sock = _connect(p)
    status, headers, payload = _read_response(sock)
    assert status == 503 and "server.max_connections" in json.loads(payload)["error"]["message"]
    assert sock.recv(10) == b""
    sock.close()
    for sock in held + silent:
        sock.close()
    _until(lambda: p.server.connections == 0)
    sock = _connect(p)
    sock.sendall(_post("/v1/chat/completions", CHAT))
    assert _read_response(sock)[0] == 200   # serving again


def test_a_client_silent_in_the_health_reserve_is_dropped_sooner_than_head_timeout(make_proxy):
    p = make_proxy(server="  client_timeout: 30\n  head_timeout: 30\n  max_connections: 1")
    held = _connect(p)
    held.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    assert _read_response(held)[0] == 200
    sock = _connect(p)
    sock.settimeout(15)
    assert sock.recv(10) == b""   # after reserve_head_timeout (2 s), not 30
    held.close()


def _trickle_until_answered(sock, data, pause=0.02):
    """Send ``data`` a byte at a time until the server answers; (bytes sent, what came back)."""
    sock.setblocking(False)
    try:
        for sent in range(len(data)):
            try:
                reply = sock.recv(65536)
                return sent, reply
            except BlockingIOError:
                pass
            try:
                sock.send(data[sent:sent + 1])
            except OSError:
                return sent, b""
            time.sleep(pause)
    finally:
        sock.setblocking(True)
    return len(data), b""


def test_a_head_that_trickles_in_is_cut_off_at_head_timeout(make_proxy, timeouts):
    p = make_proxy(server="  client_timeout: 5\n  head_timeout: 0.3")
    # Every byte comes well within client_timeout; the whole would take ~10 s.
    head = b"Host: x\r\n" + b"X-Slow: 1\r\n" * 40 + b"\r\n"
    sock = _connect(p)
    sock.sendall(b"GET /v1/messages HTTP/1.1\r\n")
    sent, reply = _trickle_until_answered(sock, head)
    assert sent < len(head), "the whole head was taken however slowly it came"
    sock.settimeout(5)
    while b"\r\n\r\n" not in reply or not reply.endswith(b"}"):
        data = sock.recv(65536)
        if not data:
            break
        reply += data
    assert reply.startswith(b"HTTP/1.1 408 ")
    body = json.loads(reply.split(b"\r\n\r\n", 1)[1])
    assert body["type"] == "error" and "server.head_timeout" in body["error"]["message"]   # the request's shape


def test_a_connection_that_sends_nothing_is_closed_at_head_timeout(make_proxy, timeouts, caplog):
    caplog.set_level(logging.DEBUG, logger="ragproxy")
    p = make_proxy(server="  client_timeout: 30\n  head_timeout: 0.3")
    sock = _connect(p)
    sock.settimeout(10)   # client_timeout alone would hold it for 30 s
    assert sock.recv(10) == b""
    _until(lambda: p.server.connections == 0)
    assert [r for r in caplog.records if "timed out" in r.getMessage()]
    assert not [r for r in caplog.records if r.exc_info]   # closed as planned, not by an exception


def test_head_timeout_leaves_a_keep_alive_connection_between_requests_alone(make_proxy, timeouts):
    p = make_proxy(server="  client_timeout: 5\n  head_timeout: 0.2")
    sock = _connect(p)
    for _ in range(2):
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert _read_response(sock)[0] == 200
        time.sleep(0.5)   # idle longer than head_timeout: client_timeout is what applies now
    send_slowly(sock, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")   # well within 0.2 s
    assert _read_response(sock)[0] == 200


# -- logs ---------------------------------------------------------------------------

def test_logged_paths_mask_a_key_prefix_and_come_as_arguments(make_proxy, caplog):
    caplog.set_level(logging.DEBUG, logger="ragproxy")
    proxy = make_proxy(server="  client_timeout: 0.5")
    secret = API_KEY

    def boom(exchange):
        raise RuntimeError("boom")
    proxy.app.rewriters.append(boom)
    sock = _connect(proxy)
    sock.sendall(f"GET /k/{secret}/v1/models HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    _read_response(sock)
    sock.sendall(_post(f"/k/{secret}/v1/messages", json.dumps(
        {"model": "claude-x", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}).encode(), auth=False))
    _read_response(sock)
    sock.close()
    sock = _connect(proxy)
    send_slowly(sock, f"POST /k/{secret}/v1/messages HTTP/1.1\r\nContent-Length: 5\r\n\r\n".encode())
    assert _read_response(sock)[0] == 408   # the body never comes
    sock.close()
    _until(lambda: proxy.server.connections == 0)
    lines = [r.getMessage() for r in caplog.records]
    assert not [line for line in lines if secret in line]
    assert [line for line in lines if "/k/***/v1/models" in line]
    assert "internal error handling POST /k/***/v1/messages" in lines
    assert [line for line in lines if "/k/***/v1/messages HTTP/1.1 408" in line]
    # Request data reaches a line only as an argument, which the log formatter can escape.
    assert not [r for r in caplog.records if "/k/" in str(r.msg)]


# -- fuzzing the request parser ---------------------------------------------------------

_FUZZ_BYTES = b"\r\n\x00\t :;,-\x7f\x80\xb9\xb2\xe9\xff0123456789abcdefxX"
_ODD_LENGTHS = ["", "-1", "+5", "0x10", "\xb9", "\xb2", "1 2", "5, 5", "9" * 30, "0" * 25 + "7", " 7", "7 ",
                "1e3", "\u0663", "18446744073709551617"]
_ODD_CHUNK_SIZES = [b"fffffffffffffffff", b"-1", b"1;ext=x", b"\xb9", b"0x5", b"", b"5 5", b" 5", b"5\x00",
                    b"g", b"1" * 40]


def _fuzz_cases(rng, count):
    """Request bytes: well-formed ones, then mutated: flips, odd headers, lengths, chunks, cuts."""
    bodies = {"/v1/chat/completions": CHAT,
              "/v1/messages": json.dumps({"model": "claude-x", "max_tokens": 5,
                                          "messages": [{"role": "user", "content": "x"}]}).encode(),
              "/api/chat": json.dumps({"model": "llama", "messages": [{"role": "user", "content": "x"}]}).encode(),
              "/v1/responses": json.dumps({"model": "gpt-4o", "input": "x"}).encode()}

    def noise(n):
        return bytes(rng.choice(_FUZZ_BYTES) if rng.random() < 0.6 else rng.randrange(256) for _ in range(n))

    for _ in range(count):
        path = rng.choice(list(bodies) + ["/health", "/v1/models"])
        body = bodies.get(path, b"")
        if body and rng.random() < 0.3:
            wire = b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in (body[:7], body[7:])) + b"0\r\n\r\n"
            raw = _post(path, wire, {"Content-Type": "application/json", "Transfer-Encoding": "chunked"})
        elif body:
            raw = _post(path, body)
        else:
            raw = f"GET {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {API_KEY}\r\n\r\n".encode()
        head, _, rest = raw.partition(b"\r\n\r\n")
        kind = rng.randrange(7)
        if kind == 1:    # bytes flipped anywhere
            raw = bytearray(raw)
            for _ in range(rng.randrange(1, 6)):
                raw[rng.randrange(len(raw))] = rng.randrange(256)
            raw = bytes(raw)
        elif kind == 2:  # a random header, its name and value of any bytes
            raw = head + b"\r\n" + noise(rng.randrange(1, 12)) + b":" + noise(rng.randrange(0, 40)) + \
                b"\r\n\r\n" + rest
        elif kind == 3:  # an odd Content-Length
            value = rng.choice(_ODD_LENGTHS).encode("utf-8" if rng.random() < 0.2 else "latin-1", "replace")
            raw = b"\r\n".join(line for line in head.split(b"\r\n") if not line.startswith(b"Content-Length")) + \
                b"\r\nContent-Length: " + value + b"\r\n\r\n" + rest
        elif kind == 4:  # an odd chunk size
            raw = _post(path or "/v1/chat/completions", rng.choice(_ODD_CHUNK_SIZES) + b"\r\n" + body[:9] +
                        b"\r\n0\r\n\r\n", {"Transfer-Encoding": "chunked"})
        elif kind == 5:  # cut anywhere
            raw = raw[:rng.randrange(len(raw))]
        elif kind == 6:  # line ends mangled
            raw = head.replace(b"\r\n", rng.choice([b"\n", b"\r", b"\r\r\n", b"\n\r"]), rng.randrange(1, 4)) + \
                b"\r\n\r\n" + rest
        yield raw


def _answer(sock):
    """Everything the server sends until it closes (or its first answer, keep-alive): bytes."""
    reply = b""
    while True:
        data = sock.recv(65536)
        if not data:
            return reply
        reply += data
        head, sep, body = reply.partition(b"\r\n\r\n")
        if sep and b"content-length: " in head.lower():
            length = int(head.lower().split(b"content-length: ", 1)[1].split(b"\r\n", 1)[0])
            if len(body) >= length:
                return reply


@pytest.mark.parametrize("seed", range(2))
def test_fuzzed_requests_get_well_formed_answers_below_500(make_proxy, fake, seed):
    import random
    p = make_proxy(server="  client_timeout: 2\n  head_timeout: 2")
    rng = random.Random(seed)
    seen = {}
    for raw in _fuzz_cases(rng, 250):
        sock = _connect(p)
        sock.settimeout(10)   # a hang fails the case instead of the run
        try:
            sock.sendall(raw)
            sock.shutdown(socket.SHUT_WR)   # the end of what it sends: nothing stalls on a cut request
            reply = _answer(sock)
        except ConnectionResetError:
            reply = b""
        finally:
            sock.close()
        if not reply:
            # Only a head that never ended may go unanswered (nothing to answer yet).
            assert b"\n\r\n" not in raw and b"\n\n" not in raw, raw
            continue
        status_line, _, rest = reply.partition(b"\r\n")
        version, status, _ = status_line.decode("latin-1").split(" ", 2)
        assert version == "HTTP/1.1" and status.isdigit(), reply[:200]
        # 501 (an unknown method) and 505 (HTTP/2 and up) are HTTP's own answers to such requests.
        assert int(status) < 500 or int(status) in (501, 505), (raw, reply[:300])
        head, sep, body = rest.partition(b"\r\n\r\n")
        assert sep, reply[:300]
        if int(status) >= 400 and b"application/json" in head:
            length = int(head.lower().split(b"content-length: ", 1)[1].split(b"\r\n", 1)[0])
            assert json.loads(body[:length]), reply[:300]
        seen[status] = seen.get(status, 0) + 1
    assert len(seen) > 3, seen   # the cases reached many answers, not one refusal
    _until(lambda: p.server.connections == 0)
    sock = _connect(p)
    sock.sendall(_post("/v1/chat/completions", CHAT))
    assert _read_response(sock)[0] == 200   # and it serves on


class _RecordingPlacement:
    """A placement.CpuPlacement stand-in: which threads entered and left, in order."""

    def __init__(self):
        self.events = []

    def enter_thread(self):
        self.events.append(("enter", threading.get_ident()))

    def leave_thread(self):
        self.events.append(("leave", threading.get_ident()))


def test_each_connection_thread_is_placed_for_its_whole_life(fake):
    placement = _RecordingPlacement()
    app = ragproxy.App(ragproxy.Config.from_text(proxy_config(fake.url)))
    running = RunningProxy(app, ragproxy.make_server(app, "127.0.0.1", 0, placement=placement))
    try:
        sock = _connect(running)
        for _ in range(2):   # keep-alive: one thread, placed once
            sock.sendall(_post("/v1/chat/completions", CHAT))
            assert _read_response(sock)[0] == 200
        assert [kind for kind, _ in placement.events] == ["enter"]
        sock.close()
        wait_for(lambda: len(placement.events) == 2, "the connection thread to end")
        (entered, thread), (left, same) = placement.events
        assert (entered, left) == ("enter", "leave") and thread == same != threading.get_ident()
    finally:
        running.close()
