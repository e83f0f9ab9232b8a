"""The upstream HTTP client (section 4) against a scripted raw-socket server.

Every case runs on each pool the proxy may use for a plain-HTTP upstream: our
own socket client (the default) and the http.client fallback (which serves
HTTPS when urllib3 is absent), so both keep the same contract.  The https
cases at the end run the proxy against a TLS fake upstream through urllib3 and
through http.client.
"""
import json
import pathlib
import socket
import threading
import time

import openai
import pytest

import ragproxy
from _ragproxy import deps
from _ragproxy.http1 import BodyParts
from _ragproxy.upstream import _HTTPClientPool, _SocketPool, _send_request
from conftest import API_KEY, TLS_DIR, openai_for, proxy_config, send_slowly, tls_upstream


class ScriptedServer:
    """Accepts connections; ``script(n, conn, request)`` answers the n-th request on a connection."""

    def __init__(self, script):
        self.script = script
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.url = "http://127.0.0.1:%d" % self.sock.getsockname()[1]
        self.connections = 0
        self.requests = []
        self._stop = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._serve, args=(conn, self.connections), daemon=True).start()

    def _serve(self, conn, number):
        rfile = conn.makefile("rb")
        try:
            while True:
                line = rfile.readline()
                if not line:
                    return
                headers = {}
                while True:
                    h = rfile.readline()
                    if h in (b"\r\n", b""):
                        break
                    name, _, value = h.decode().partition(":")
                    headers[name.strip().lower()] = value.strip()
                body = rfile.read(int(headers.get("content-length", "0")))
                request = {"line": line.decode().strip(), "headers": headers, "body": body, "conn": number}
                self.requests.append(request)
                if self.script(len(self.requests), conn, request) == "close":
                    return
        except OSError:
            return
        finally:
            rfile.close()
            conn.close()

    def close(self):
        self._stop = True
        self.sock.close()


@pytest.fixture(params=["socket", "http.client"])
def pool(request):
    made = _SocketPool() if request.param == "socket" else _HTTPClientPool()
    yield made
    made.close()


@pytest.fixture
def serve():
    servers = []

    def start(script):
        servers.append(ScriptedServer(script))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


def call(pool, url, method="POST", body=b'{"x":1}', headers=None, read_timeout=5.0):
    return pool.request(method, url, dict({"content-type": "application/json"}, **(headers or {})),
                        body, 2.0, read_timeout)


def test_content_length_body_and_keep_alive(pool, serve):
    server = serve(lambda n, conn, req: conn.sendall(
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Up: %d\r\nContent-Length: 11\r\n\r\n{\"n\": %04d}"
        % (n, n)))
    for n in (1, 2, 3):
        resp = call(pool, server.url + "/v1/chat?x=1")
        assert resp.status == 200 and resp.header("x-up") == str(n) and resp.read_all() == b'{"n": %04d}' % n
    assert server.connections == 1  # pooled
    first = server.requests[0]
    assert first["line"] == "POST /v1/chat?x=1 HTTP/1.1" and first["body"] == b'{"x":1}'
    assert first["headers"]["host"] == server.url.split("//")[1]


def test_request_bodies_of_every_size_arrive_whole(pool, serve):
    # Head and body go in one gathered write where the socket can (a 120 KB
    # agent turn among them), on one keep-alive connection.
    server = serve(lambda n, conn, req: conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"))
    sizes = (1, 1000, 65535, 65536, 65537, 123456, 1_000_000)
    bodies = [bytes(range(256)) * (size // 256) + b"z" * (size % 256) for size in sizes]
    for body in bodies:
        assert call(pool, server.url + "/v1/messages", body=body).read_all() == b"ok"
    assert [r["body"] for r in server.requests] == bodies
    assert [r["headers"]["content-length"] for r in server.requests] == [str(size) for size in sizes]
    assert server.connections == 1


class _ShortSends:
    """A socket whose gathered send takes only ``first`` bytes, as one cut short by a timeout does."""

    def __init__(self, first):
        self.first, self.data = first, b""

    def sendmsg(self, buffers):
        self.data += b"".join(buffers)[:self.first]
        return self.first

    def sendall(self, data):
        self.data += bytes(data)


@pytest.mark.parametrize("first", [0, 3, 10, 11, 15])
def test_a_gathered_send_cut_short_sends_the_rest(first):
    sock = _ShortSends(first)
    _send_request(sock, b"HEAD:1234\r\n", b"body!")
    assert sock.data == b"HEAD:1234\r\nbody!"


@pytest.mark.parametrize("first", range(0, 21))
def test_a_body_in_parts_is_sent_as_its_parts_and_whole_when_cut_short(first):
    body = b"a spliced body!"
    parts = BodyParts([memoryview(body)[:2], b"", b"[new]", memoryview(body)[2:]])
    sock = _ShortSends(first)
    _send_request(sock, b"HEAD:1234\r\n", parts)
    assert sock.data == b"HEAD:1234\r\na [new]spliced body!"
    assert len(parts) == len(bytes(parts)) == 20


def test_a_body_in_parts_goes_over_the_wire_as_one_body(serve):
    server = serve(lambda n, conn, req: conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"))
    body = bytes(range(256)) * 600
    parts = BodyParts([memoryview(body)[:70_000], b'"injected"', memoryview(body)[70_000:]])
    pool = ragproxy.make_http_pool()
    try:
        assert call(pool, server.url + "/v1/messages", body=parts).read_all() == b"ok"
    finally:
        pool.close()
    assert server.requests[0]["body"] == bytes(parts)
    assert server.requests[0]["headers"]["content-length"] == str(len(body) + 10)


def test_chunked_pieces_arrive_as_they_are_sent(pool, serve):
    def script(n, conn, req):
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
        for i in range(3):
            event = b"data: %d\n\n" % i
            conn.sendall(b"%x;ext=1\r\n%s\r\n" % (len(event), event))
            time.sleep(0.15)
        conn.sendall(b"0\r\nX-Trailer: t\r\n\r\n")
    server = serve(script)
    resp = call(pool, server.url + "/s")
    started, got = time.monotonic(), []
    while True:
        data = resp.read1()
        if not data:
            break
        got.append((data, time.monotonic() - started))
    assert b"".join(d for d, _ in got) == b"data: 0\n\ndata: 1\n\ndata: 2\n\n"
    assert got[0][1] < 0.1  # the first event did not wait for the rest
    call(pool, server.url + "/again").read_all()
    assert server.connections == 1  # a complete chunked body leaves the connection reusable


_CHUNKED_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
_CHUNKED_BODY = (b"7;name=value\r\ndata: 0\r\n" + b"9\r\ndata: 1\n\n\r\n" + b"00000003\r\nabc\r\n"
                 + b"0\r\nX-Trailer: t\r\nX-Other: u\r\n\r\n")


@pytest.mark.parametrize("trickle", [False, True], ids=["at-once", "byte-by-byte"])
def test_chunked_bodies_decode_alike_however_they_arrive(pool, serve, trickle):
    def script(n, conn, req):
        if trickle:
            send_slowly(conn, _CHUNKED_HEAD + _CHUNKED_BODY)
        else:
            conn.sendall(_CHUNKED_HEAD + _CHUNKED_BODY)
    server = serve(script)
    for _ in range(2):
        assert call(pool, server.url + "/s").read_all() == b"data: 0data: 1\n\nabc"
    assert server.connections == 1  # trailers read to the end: the connection is reused


def test_chunks_that_arrive_together_leave_in_one_read():
    pool = _SocketPool()
    ready = threading.Event()

    def script(n, conn, req):
        events = b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in (b"data: 1\n\n", b"data: 2\n\n"))
        conn.sendall(_CHUNKED_HEAD + events)
        ready.wait(5)
        conn.sendall(b"0\r\n\r\n")
    server = ScriptedServer(script)
    try:
        resp = call(pool, server.url + "/s")
        assert resp.read1() == b"data: 1\n\ndata: 2\n\n"  # both events, and it did not wait for the end
        ready.set()
        assert resp.read1() == b""
    finally:
        ready.set()
        server.close()
        pool.close()


@pytest.mark.parametrize("body", [
    b"-5\r\nhello\r\n0\r\n\r\n",          # int(x, 16) would read -5
    b"0x5\r\nhello\r\n0\r\n\r\n",
    b"5\r\nhelloXX0\r\n\r\n",               # no CRLF after the data
    b"5\r\nhel",                             # cut short
    b"f" * 9000,                               # a size line that never ends
], ids=["negative", "0x-prefix", "no-crlf", "cut-short", "endless-line"])
def test_malformed_chunked_bodies_fail_cleanly(serve, body):
    pool = _SocketPool()
    server = serve(lambda n, conn, req: (conn.sendall(_CHUNKED_HEAD + body), "close")[1])
    try:
        resp = call(pool, server.url + "/s")
        with pytest.raises(ragproxy.UpstreamError):
            resp.read_all()
    finally:
        pool.close()


_TWO_EVENTS = {
    "/v1/chat/completions": (
        b'data: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"Hel"}}]}\n\n',
        b'data: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"lo"}}]}\n\n'),
    "/v1/responses": (
        b'event: response.created\ndata: {"type":"response.created","sequence_number":0,'
        b'"response":{"id":"resp_two","object":"response","status":"in_progress","output":[]}}\n\n',
        b'event: response.output_text.delta\ndata: {"type":"response.output_text.delta","sequence_number":1,'
        b'"item_id":"msg_1","output_index":0,"content_index":0,"delta":"Hello"}\n\n'),
    "/v1/messages": (
        b'event: message_start\ndata: {"type":"message_start","message":{"id":"msg_1","type":"message",'
        b'"role":"assistant","content":[],"model":"claude-x"}}\n\n',
        b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,'
        b'"delta":{"type":"text_delta","text":"Hello"}}\n\n'),
    "/api/chat": (
        b'{"model":"llama3","message":{"role":"assistant","content":"Hel"},"done":false}\n',
        b'{"model":"llama3","message":{"role":"assistant","content":"lo"},"done":false}\n'),
}


@pytest.mark.parametrize("path,model", [("/v1/chat/completions", "gpt-4o"), ("/v1/responses", "gpt-4o"),
                                        ("/v1/messages", "claude-x"), ("/api/chat", "llama3")],
                         ids=["chat", "responses", "messages", "ollama"])
def test_events_before_a_framing_error_reach_the_client_then_the_in_band_error(serve, make_proxy, path, model):
    """Two good chunks and a broken size line in ONE send: both events, then the error the README promises."""
    from test_server import _read_response

    def script(n, conn, req):
        events = _TWO_EVENTS[req["line"].split()[1]]
        ctype = b"application/x-ndjson" if events[0].startswith(b"{") else b"text/event-stream"
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: " + ctype + b"\r\nTransfer-Encoding: chunked\r\n\r\n"
                     + b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in events) + b"zz\r\n")
        return "close"
    server = serve(script)
    proxy = make_proxy(proxy_config(server.url))
    body = {"model": model, "stream": True, "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
    if path == "/v1/responses":
        body = {"model": model, "stream": True, "input": "hi"}
    payload = json.dumps(body).encode()
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as sock:
        sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {API_KEY}\r\n"
                     f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n".encode() + payload)
        status, _, relayed = _read_response(sock)
    assert status == 200
    first, second = _TWO_EVENTS[path]
    assert relayed.startswith(first + second), relayed
    error = relayed[len(first + second):]
    if path == "/v1/chat/completions":
        assert error.startswith(b"data: ") and "mid-stream" in json.loads(error[6:])["error"]["message"]
    elif path == "/v1/responses":
        event = json.loads(error.split(b"data: ", 1)[1])
        assert error.startswith(b"event: response.failed\n") and event["sequence_number"] == 2
        assert event["response"]["id"] == "resp_two" and event["response"]["status"] == "failed"
    elif path == "/v1/messages":
        event = json.loads(error.split(b"data: ", 1)[1])
        assert error.startswith(b"event: error\n") and event["type"] == "error"
    else:
        assert "mid-stream" in json.loads(error)["error"]


def test_an_invalid_content_length_or_status_from_the_upstream_is_its_failure(serve):
    answers = [b"HTTP/1.1 200 OK\r\nContent-Length: \xb9\r\n\r\nx", b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
               b"HTTP/1.1 \xb2\xb0\xb0 OK\r\nContent-Length: 0\r\n\r\n"]
    server = serve(lambda n, conn, req: (conn.sendall(answers[n - 1]), "close")[1])
    pool = _SocketPool()
    try:
        for _ in answers:
            with pytest.raises(ragproxy.UpstreamError) as err:
                call(pool, server.url + "/x").read_all()
            assert err.value.kind == "unreachable"
    finally:
        pool.close()


def test_bytes_after_a_chunked_body_keep_the_connection_out_of_the_pool(serve):
    pool = _SocketPool()
    server = serve(lambda n, conn, req: conn.sendall(_CHUNKED_HEAD + b"2\r\nhi\r\n0\r\n\r\nGARBAGE"))
    try:
        for _ in range(2):
            assert call(pool, server.url + "/s").read_all() == b"hi"
        assert server.connections == 2  # the stray bytes were not taken for the next answer
    finally:
        pool.close()


def test_interim_100_continue_head_204_and_close_delimited(pool, serve):
    def script(n, conn, req):
        if n == 1:
            conn.sendall(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\nok")
        elif n == 2:
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 1234\r\n\r\n")  # HEAD: no body follows
        elif n == 3:
            conn.sendall(b"HTTP/1.1 204 No Content\r\n\r\n")
        else:
            conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\nuntil the end")
            return "close"
    server = serve(script)
    resp = call(pool, server.url + "/a")
    assert resp.status == 201 and resp.read_all() == b"ok"
    resp = call(pool, server.url + "/b", method="HEAD", body=None)
    assert resp.status == 200 and resp.read_all() == b""
    resp = call(pool, server.url + "/c", method="DELETE", body=None)
    assert resp.status == 204 and resp.read_all() == b""
    resp = call(pool, server.url + "/d")
    assert resp.read_all() == b"until the end"
    assert server.connections == 1
    call(pool, server.url + "/e")  # the close-delimited answer was not pooled
    assert server.connections == 2


def test_a_pooled_connection_closed_while_idle_is_retried_once(pool, serve):
    def script(n, conn, req):
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\n%d" % (n % 10))
        return "close" if n == 1 else None  # the server drops the idle connection
    server = serve(script)
    assert call(pool, server.url + "/1").read_all() == b"1"
    time.sleep(0.1)
    assert call(pool, server.url + "/2").read_all() == b"2"
    assert server.connections == 2 and len(server.requests) == 2


def test_a_fresh_connection_that_drops_the_request_is_not_retried(pool, serve):
    server = serve(lambda n, conn, req: "close")  # reads the POST, answers nothing
    with pytest.raises(ragproxy.UpstreamError) as err:
        call(pool, server.url + "/x")
    assert err.value.kind == "unreachable"
    assert len(server.requests) == 1  # a POST never runs twice


def test_timeouts_and_truncated_bodies(pool, serve):
    def script(n, conn, req):
        if n == 1:
            time.sleep(1.0)  # never answers in time
            return "close"
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly this")
        return "close"
    server = serve(script)
    with pytest.raises(ragproxy.UpstreamError) as err:
        call(pool, server.url + "/slow", read_timeout=0.3)
    assert err.value.kind == "timeout"
    resp = call(pool, server.url + "/cut")
    with pytest.raises(ragproxy.UpstreamError) as err:
        resp.read_all()
    assert err.value.kind == "unreachable"


def test_socket_pool_timeouts_on_every_kind_of_wait(timeouts, serve):
    """Waiting for the head, a stalled body, a server that stops reading, and a
    pooled connection whose timeout changed: each ends as a "timeout" in time."""
    def script(n, conn, req):
        if req["line"].startswith("POST /stall"):
            conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n")
        elif req["line"].startswith("POST /fast"):
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            return None
        time.sleep(1.5)
        return "close"
    server = serve(script)
    pool = _SocketPool()
    try:
        assert call(pool, server.url + "/fast", read_timeout=5.0).read_all() == b"ok"
        started = time.monotonic()
        with pytest.raises(ragproxy.UpstreamError) as err:
            call(pool, server.url + "/head", read_timeout=0.3)  # on the pooled connection, at 0.3 s now
        assert err.value.kind == "timeout" and time.monotonic() - started < 1.2
        assert server.connections == 1
        resp = call(pool, server.url + "/stall", read_timeout=0.3)
        assert resp.read1() == b"hello"
        with pytest.raises(ragproxy.UpstreamError) as err:
            resp.read1()
        assert err.value.kind == "timeout" and "stopped sending" in str(err.value)

        with socket.socket() as deaf:  # accepts, never reads: the request body fills every buffer
            deaf.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            deaf.bind(("127.0.0.1", 0))
            deaf.listen(1)
            started = time.monotonic()
            with pytest.raises(ragproxy.UpstreamError) as err:
                call(pool, "http://127.0.0.1:%d/x" % deaf.getsockname()[1], body=b"x" * (32 << 20),
                     read_timeout=0.3)
            assert err.value.kind == "timeout" and time.monotonic() - started < 3.0
    finally:
        pool.close()


def test_unreachable_and_garbage(pool, serve):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = "http://127.0.0.1:%d" % s.getsockname()[1]
    with pytest.raises(ragproxy.UpstreamError) as err:
        call(pool, dead + "/x")
    assert err.value.kind == "unreachable"
    server = serve(lambda n, conn, req: (conn.sendall(b"SSH-2.0-OpenSSH\r\n\r\n"), "close")[1])
    with pytest.raises(ragproxy.UpstreamError):
        call(pool, server.url + "/x")


def test_header_values_cannot_inject_lines(serve):
    server = serve(lambda n, conn, req: conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"))
    pool = _SocketPool()
    try:
        with pytest.raises(ragproxy.UpstreamError):
            call(pool, server.url + "/x", headers={"x-evil": "a\r\nInjected: 1"})
        assert server.requests == []
    finally:
        pool.close()


def test_closing_a_response_mid_body_stops_the_upstream(pool, serve):
    stopped = threading.Event()

    def script(n, conn, req):
        conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        try:
            for _ in range(200):
                conn.sendall(b"5\r\nhello\r\n")
                time.sleep(0.01)
        except OSError:
            stopped.set()
        return "close"
    server = serve(script)
    resp = call(pool, server.url + "/gen")
    assert resp.read1()
    resp.close()
    assert stopped.wait(3.0)  # the server saw the connection go away


@pytest.mark.parametrize("trickle", [False, True], ids=["buffered", "trickled"])
def test_response_heads_parse_alike_however_they_arrive(pool, serve, trickle):
    heads = [
        b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nX-Twice: a\r\nX-Twice: b\r\n"
        b"X-Space:   padded  \r\nContent-Length: 2\r\n\r\nok",
        b"HTTP/1.1 200 OK\nContent-Type: text/plain\nX-Twice: a\nX-Twice: b\n"  # bare LF line ends
        b"X-Space:   padded  \nContent-Length: 2\n\nok",
        b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\nX-Twice: a\r\nX-Twice: b\n"  # mixed
        b"X-Space:   padded  \r\nContent-Length: 2\r\n\r\nok",
    ]
    send = send_slowly if trickle else (lambda conn, data: conn.sendall(data))
    server = serve(lambda n, conn, req: send(conn, heads[n - 1]))
    for _ in heads:
        resp = call(pool, server.url + "/x")
        assert resp.status == 200 and resp.read_all() == b"ok"
        named = [(k.lower(), v) for k, v in resp.headers]
        assert [v for k, v in named if k == "x-twice"] == ["a", "b"]
        # http.client keeps trailing blanks in a value; ours strips them (RFC 9110 5.5).
        padded = resp.header("x-space")
        assert (padded == "padded" if isinstance(pool, _SocketPool) else padded.strip() == "padded")
        assert resp.header("content-type") == "text/plain"
    assert server.connections == 1  # every answer was framed right, so the connection was reused


@pytest.mark.parametrize("trickle", [False, True], ids=["buffered", "trickled"])
def test_malformed_response_heads_are_refused_however_they_arrive(serve, trickle):
    send = send_slowly if trickle else (lambda conn, data: conn.sendall(data))
    bad = [
        b"HTTP/1.1 200 OK\r\nNo colon here\r\nContent-Length: 0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\n" + b"X-Many: 1\r\n" * 201 + b"Content-Length: 0\r\n\r\n",
        b"\r\nHTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
    ]
    server = serve(lambda n, conn, req: (send(conn, bad[(n - 1) % len(bad)]), "close")[1])
    pool = _SocketPool()
    try:
        for _ in bad:
            with pytest.raises(ragproxy.UpstreamError) as err:
                call(pool, server.url + "/x")
            assert err.value.kind == "unreachable"
    finally:
        pool.close()


# -- https upstreams (a company gateway) ---------------------------------------------

TLS = pathlib.Path(TLS_DIR)


@pytest.fixture(params=["urllib3", "http.client"])
def tls_library(request, monkeypatch):
    """Run a test on each client the proxy may use for https."""
    if request.param == "urllib3" and deps.urllib3 is None:
        pytest.skip("urllib3 disabled (RAGPROXY_PURE=1 or not installed)")
    if request.param == "http.client":
        monkeypatch.setattr(deps, "urllib3", None)  # read when the pool makes its first https connection
    return request.param


def gateway_config(url, tls_fields=""):
    return f"""
api_keys: [{API_KEY}]
providers:
  llm:
    gateway: {{type: openai, base_url: "{url}/v1", api_key: gateway-key, read_timeout: 5{tls_fields}}}
models:
  - {{name: "*", upstream: gateway}}
"""


def test_https_gateway_with_its_own_certificate_authority(tls_library, gateway, make_proxy):
    proxy = make_proxy(gateway_config(gateway.url, f', ca_file: "{TLS / "ca.pem"}"'))
    client = openai_for(proxy)
    reply = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "over tls"}])
    assert reply.choices[0].message.content == "ECHO: over tls"
    chunks = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "streamed tls"}],
                                            stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "ECHO: streamed tls"
    vectors = client.embeddings.create(model="m", input=["a", "b"])  # a pass-through path
    assert len(vectors.data) == 2
    assert [r.headers["authorization"] for r in gateway.requests] == ["Bearer gateway-key"] * 3
    assert gateway.connections_opened == 1  # one TLS connection, kept alive


def test_https_gateway_certificate_refused_without_ca_file(tls_library, gateway, make_proxy, caplog):
    proxy = make_proxy(gateway_config(gateway.url))
    client = openai_for(proxy)
    with pytest.raises(openai.InternalServerError) as info:
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    assert info.value.status_code == 502 and "gateway" in info.value.body["message"]
    # The log says why, and what to do about it (the client's message may say less: see the README).
    assert [r for r in caplog.records if "CERTIFICATE_VERIFY_FAILED" in r.getMessage() and "ca_file" in r.getMessage()]
    assert gateway.requests == []


@pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning")
def test_https_gateway_with_checks_off(tls_library, gateway, make_proxy):
    proxy = make_proxy(gateway_config(gateway.url, ", tls_verify: false"))
    client = openai_for(proxy)
    reply = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "unchecked"}])
    assert reply.choices[0].message.content == "ECHO: unchecked"


def test_https_gateway_gets_a_body_with_context_injected_whole(tls_library, gateway, make_proxy, tmp_path):
    """Over plain http a spliced body goes as its parts (BodyParts); the TLS clients take it joined."""
    docs = tmp_path / "documents" / "docs"
    docs.mkdir(parents=True)
    (docs / "retry.md").write_text("Fetches that fail are retried with Retry(total=3) and exponential backoff.\n")
    config = gateway_config(gateway.url, f', ca_file: "{TLS / "ca.pem"}"').replace(
        '{name: "*", upstream: gateway}', '{name: "*", upstream: gateway, kb: [docs]}')
    proxy = make_proxy(config + "knowledge_bases:\n  docs:\n    retrieval: lexical\n", data_dir=tmp_path)
    proxy.app.knowledge_bases.index_all()
    messages = [{"role": "system", "content": "You help with code. " * 40},
                {"role": "user", "content": "how are failing fetches retried"}]
    reply = openai_for(proxy).chat.completions.create(model="m", messages=messages)
    assert reply.choices[0].message.content.startswith("ECHO:")
    sent = gateway.requests[-1]
    assert int(sent.headers["content-length"]) == len(sent.body)
    assert sent.json["messages"][0] == messages[0]   # the client's bytes around the edit, as they came
    assert "Retry(total=3)" in sent.json["messages"][-1]["content"]


def test_embedding_provider_over_https(gateway):
    provider = ragproxy.Provider(name="emb", type="openai", base_url=gateway.url + "/v1", model="fake-embed",
                                 ca_file=str(TLS / "ca.pem"), connect_timeout=2.0, read_timeout=5.0)
    pool = ragproxy.make_http_pool()
    try:
        assert len(ragproxy.EmbeddingClient(provider, pool).embed(["one", "two"])) == 2
    finally:
        pool.close()


@pytest.fixture
def mtls_gateway():
    """A gateway that asks for a client certificate from the test CA."""
    yield from tls_upstream(ask_client_certificate=True)


def test_https_gateway_that_asks_for_a_client_certificate(tls_library, mtls_gateway, make_proxy):
    trust = f', ca_file: "{TLS / "ca.pem"}"'
    mine = f', client_cert: "{TLS / "client.pem"}", client_key: "{TLS / "client.key"}"'
    proxy = make_proxy(gateway_config(mtls_gateway.url, trust + mine))
    client = openai_for(proxy)
    reply = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "who am i"}])
    assert reply.choices[0].message.content == "ECHO: who am i"
    without = make_proxy(gateway_config(mtls_gateway.url, trust))
    client = openai_for(without)
    with pytest.raises(openai.InternalServerError) as info:
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "anonymous"}])
    assert info.value.status_code == 502
    assert len(mtls_gateway.requests) == 1  # the refused one never reached it


@pytest.mark.parametrize("fields,error", [
    (f', client_cert: "{TLS / "client.pem"}", client_key: "{TLS / "server.key"}"', "cannot load the client"),
    (f', client_key: "{TLS / "client.key"}"', "client_key needs client_cert"),
])
def test_client_certificate_and_key_must_load_together(fields, error):
    with pytest.raises(ragproxy.ConfigError) as info:
        ragproxy.Config.from_text(gateway_config("https://gw.example", fields))
    assert "providers.llm.gateway.client_cert" in str(info.value) and error in str(info.value)


@pytest.mark.parametrize("path,error", [("/no/such/ca.pem", "no such file"), ("certs/ca.pem", "absolute path")])
def test_ca_file_is_an_absolute_path_to_a_file(path, error):
    with pytest.raises(ragproxy.ConfigError) as info:
        ragproxy.Config.from_text(gateway_config("https://gw.example", f', ca_file: "{path}"'))
    assert "providers.llm.gateway.ca_file" in str(info.value) and error in str(info.value)
