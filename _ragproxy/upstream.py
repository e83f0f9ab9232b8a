"""Keep-alive connections to the LLM, embedding and rerank servers.

Our own small HTTP/1.1 client for http:// (the local model servers), urllib3
for https:// when it is present (``deps.urllib3``), else http.client.  All
expose the same UpstreamResponse, so the proxy never sees which one is in
use.  Streaming reads use read1(): read(n) would block until n bytes arrived
and starve the client of events.  make_http_pool() picks the pools;
upstream_url() maps a canonical API path onto a provider's base URL.

May import: deps, http1.
"""
from __future__ import annotations

import collections
import contextlib
import http.client
import socket
import ssl
import threading
import urllib.parse

from . import deps
from .http1 import (
    READ_SIZE,
    BodyParts,
    ChunkedBody,
    FixedBody,
    header_value,
    parse_content_length,
    read_head_lines,
    set_io_timeout,
    timed_reader,
)


class UpstreamError(Exception):
    """The upstream failed before answering: ``kind`` is "unreachable" or "timeout"."""

    def __init__(self, kind, message, provider=None):
        super().__init__(message)
        self.kind = kind
        self.provider = provider  # the provider's name, once the proxy knows which one failed


class UpstreamResponse:
    """Status, headers and an incremental body of one upstream response."""

    def __init__(self, status, reason, headers, read1, release, abort, index=None, read_rest=None):
        self.status = status
        self.reason = reason
        self.headers = headers  # list of (name, value); names as the upstream sent them
        self._index = index     # lower-case name -> first value, when the client built one
        self._read1 = read1
        self._read_rest = read_rest  # (limit) -> the whole rest in one read, or None if it cannot
        self._release = release
        self._abort = abort
        self._done = False

    def header(self, name, default=""):
        if self._index is not None:
            return self._index.get(name.lower(), default)
        return header_value(self.headers, name, default)

    def read1(self):
        """Return the next bytes available (b"" at the end); raise UpstreamError on failure."""
        if self._done:
            return b""
        try:
            data = self._read1()
        except Exception as exc:
            self._fail(exc)
        if not data:
            self._done = True
            self._release()
        return data

    def _fail(self, exc):
        """Close, and raise the UpstreamError for an exception from reading the body."""
        self.close()
        if isinstance(exc, (socket.timeout, TimeoutError)):
            raise UpstreamError("timeout", f"upstream stopped sending: {exc or 'read timed out'}") from None
        # The connection broke mid-body; the details vary by library.
        raise UpstreamError("unreachable", f"upstream connection broke: {exc}") from None

    def read_all(self, limit=None):
        if self._read_rest is not None and not self._done:
            try:
                data = self._read_rest(limit)
            except Exception as exc:
                self._fail(exc)
            if data is not None:  # a body of known length, read in one go
                self._done = True
                self._release()
                return data
        parts, size = [], 0
        while True:
            data = self.read1()
            if not data:
                return b"".join(parts)
            parts.append(data)
            size += len(data)
            if limit is not None and size > limit:
                self.close()
                raise UpstreamError("unreachable", f"upstream response larger than {limit} bytes")

    def close(self):
        """Stop reading: the connection is dropped, so the upstream stops generating."""
        if not self._done:
            self._done = True
            self._abort()


_STALE_CONNECTION_ERRORS = (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError,
                            ConnectionAbortedError)


class _IdleConnections:
    """Idle keep-alive connections per upstream key, at most ``maxsize`` each.

    A connection is anything ``_close_quietly`` can close (``.sock``, ``.close()``).
    """

    def __init__(self, maxsize):
        self._idle = collections.defaultdict(list)
        self._lock = threading.Lock()
        self._maxsize = maxsize

    # take() and give() need no lock: list.pop and list.append are atomic, and
    # two threads racing past the length check overshoot maxsize by one at most.
    def take(self, key):
        try:
            return self._idle[key].pop()
        except IndexError:
            return None

    def give(self, key, conn):
        conns = self._idle[key]
        if len(conns) < self._maxsize:
            conns.append(conn)
        else:
            _close_quietly(conn)

    def close(self):
        with self._lock:
            conns = [conn for group in self._idle.values() for conn in group]
            self._idle.clear()
        for conn in conns:
            _close_quietly(conn)


_SYSTEM_TLS = ("", True, "", "")  # see Provider.tls: the system's authorities, checked; no client certificate


def _ssl_context(ca_file, verify, client_cert, client_key):
    """TLS settings for an https upstream: the system's certificate authorities or only
    ``ca_file``'s; without ``verify``, no checks at all (a self-signed test gateway);
    ``client_cert`` (and ``client_key``) for a gateway that asks who is calling."""
    context = ssl.create_default_context(cafile=ca_file or None)
    if not verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if client_cert:
        context.load_cert_chain(client_cert, client_key or None)
    return context


def _tls_hint(exc):
    """What to add to the message of an error that may be a refused certificate."""
    if "CERTIFICATE_VERIFY_FAILED" in str(exc):
        return " (a gateway whose certificate comes from its own authority needs ca_file on its provider)"
    return ""


class _HTTPClientPool:
    """Keep-alive pool over ``http.client`` for when urllib3 is not available."""

    def __init__(self, maxsize=32):
        self._idle = _IdleConnections(maxsize)

    def _new_connection(self, scheme, host, port, tls, connect_timeout):
        if scheme == "https":
            # A context per connection, as urllib3 makes one: a renewed ca_file is read on the next connection.
            conn = http.client.HTTPSConnection(host, port, timeout=connect_timeout, context=_ssl_context(*tls))
        else:
            conn = http.client.HTTPConnection(host, port, timeout=connect_timeout)
        conn.connect()
        conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return conn

    def request(self, method, url, headers, body, connect_timeout, read_timeout, tls=_SYSTEM_TLS):
        parts = urllib.parse.urlsplit(url)
        key = (parts.scheme, parts.hostname, parts.port or (443 if parts.scheme == "https" else 80), tls)
        target = parts.path or "/"
        if parts.query:
            target += "?" + parts.query
        for attempt in (0, 1):
            conn = self._idle.take(key)
            reused = conn is not None
            if conn is None:
                try:
                    conn = self._new_connection(*key, connect_timeout)
                except OSError as exc:
                    raise UpstreamError("unreachable", f"cannot connect to {key[1]}:{key[2]}: "
                                                       f"{exc}{_tls_hint(exc)}") from None
            try:
                conn.sock.settimeout(read_timeout)
                conn.request(method, target, body=body, headers=headers)
                resp = conn.getresponse()
            except (socket.timeout, TimeoutError):
                _close_quietly(conn)
                raise UpstreamError("timeout", f"upstream {key[1]}:{key[2]} did not answer "
                                               f"within {read_timeout:g} s") from None
            except (http.client.HTTPException, OSError) as exc:
                _close_quietly(conn)
                # A pooled connection the server closed while idle fails on
                # first use without a byte of answer; only then is a retry
                # safe (anything else might run a POST twice).
                if reused and attempt == 0 and isinstance(exc, _STALE_CONNECTION_ERRORS):
                    continue
                raise UpstreamError("unreachable", f"{key[1]}:{key[2]} dropped the connection: {exc}") from None
            return self._wrap(conn, resp, key)
        raise AssertionError("unreachable")

    def _wrap(self, conn, resp, key):
        def release():
            resp.close()  # marks the exchange finished; Python 3.9 otherwise refuses the next request
            if resp.will_close:
                conn.close()
            else:
                self._idle.give(key, conn)

        def abort():
            _close_quietly(conn)

        def read1():
            data = resp.read1(READ_SIZE)
            if not data and resp.length:  # http.client ends a short Content-Length body quietly
                raise ConnectionError(f"response body ended {resp.length} bytes early")
            return data

        return UpstreamResponse(resp.status, resp.reason, resp.getheaders(), read1, release, abort)

    def close(self):
        self._idle.close()


def _close_quietly(conn):
    """Close an http.client-style connection, waking any thread blocked reading it."""
    if conn is None:
        return
    sock = getattr(conn, "sock", None)
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)  # close() alone does not interrupt a blocked recv()
    with contextlib.suppress(Exception):
        conn.close()


class _SocketPool:
    """Keep-alive HTTP/1.1 over plain sockets, for ``http://`` upstreams.

    A local model server on loopback is the common upstream, and there the
    client library is most of the proxy's cost: http.client parses every
    response's headers with the email package and sends head and body in
    separate writes.  This writes each request in one ``sendall`` and reads
    the response with a BufferedReader's C-level readline and read1.
    """

    _MAX_LINE = 65536
    _MAX_HEADERS = 200

    def __init__(self, maxsize=32):
        self._idle = _IdleConnections(maxsize)
        self._targets = {}  # url -> (host, port), request target, Host header

    def _target(self, url):
        # A proxy sends to a handful of URLs over and over; urlsplit is a
        # tenth of the cost of building a request.
        found = self._targets.get(url)
        if found is None:
            parts = urllib.parse.urlsplit(url)
            found = ((parts.hostname, parts.port or 80),
                     (parts.path or "/") + ("?" + parts.query if parts.query else ""),
                     parts.netloc.rpartition("@")[2])
            if len(self._targets) >= 256:
                self._targets.clear()
            self._targets[url] = found
        return found

    def request(self, method, url, headers, body, connect_timeout, read_timeout, tls=None):
        """Send one request; ``tls`` is unused (plain http), there for the common interface."""
        key, target, netloc = self._target(url)
        host, port = key
        lines = [f"{method} {target} HTTP/1.1"]
        if "host" not in headers:
            lines.append("Host: " + netloc)
        if body is not None and "content-length" not in headers:
            lines.append(f"Content-Length: {len(body)}")
        lines += [f"{name}: {value}" for name, value in headers.items()]
        text = "\r\n".join(lines)
        # One scan for the whole head: a CR or LF that is not a separator came
        # from a name or value, and would let it inject lines.
        if text.count("\n") != len(lines) - 1 or text.count("\r") != len(lines) - 1:
            bad = next((f"header {name!r}" for name, value in headers.items() if set(name + value) & {"\r", "\n"}),
                       "the URL")
            raise UpstreamError("unreachable", f"{bad} holds a line break; not sent")
        head = (text + "\r\n\r\n").encode("latin-1", "replace")
        for attempt in (0, 1):
            conn = self._idle.take(key)
            reused = conn is not None
            if conn is None:
                try:
                    conn = _SocketConnection(socket.create_connection(key, timeout=connect_timeout),
                                             read_timeout)
                except OSError as exc:
                    raise UpstreamError("unreachable", f"cannot connect to {host}:{port}: {exc}") from None
            try:
                if conn.timeout != read_timeout:
                    set_io_timeout(conn.sock, read_timeout)
                    conn.timeout = read_timeout
                _send_request(conn.sock, head, body)
                version, status, reason, response_headers = self._read_head(conn.rfile)
            except (socket.timeout, TimeoutError, BlockingIOError):  # BlockingIOError: a send timed out
                _close_quietly(conn)
                raise UpstreamError("timeout", f"upstream {host}:{port} did not answer "
                                               f"within {read_timeout:g} s") from None
            except (OSError, ValueError, _StaleConnection) as exc:
                _close_quietly(conn)
                # Only a pooled connection that the server closed while idle, failing
                # before a byte of answer, is retried: anything else might run a POST twice.
                stale = isinstance(exc, (_StaleConnection, BrokenPipeError, ConnectionResetError))
                if reused and attempt == 0 and stale:
                    continue
                raise UpstreamError("unreachable", f"{host}:{port} dropped the connection: "
                                                   f"{exc or 'closed without answering'}") from None
            return self._response(conn, key, method, version, status, reason, response_headers)
        raise AssertionError("unreachable")

    def _read_head(self, rfile):
        """``(version, status, reason, headers)`` of the final response, interim 1xx skipped."""
        while True:
            if not rfile.peek(1):  # waits for the answer
                raise _StaleConnection()
            lines = read_head_lines(rfile, self._MAX_HEADERS + 1, self._MAX_LINE, eof_ends=False)
            if not lines:
                raise ValueError("not an HTTP response: an empty line")
            version, _, rest = lines[0].partition(" ")
            code, _, reason = rest.partition(" ")
            if not version.startswith("HTTP/") or len(code) != 3 or not (code.isascii() and code.isdigit()):
                raise ValueError(f"not an HTTP response: {lines[0][:80]!r}")
            headers, index = [], {}
            for line in lines[1:]:
                name, sep, value = line.partition(":")
                if not sep:
                    raise ValueError(f"malformed response header line {line[:80]!r}")
                name, value = name.strip(), value.strip()
                headers.append((name, value))
                index.setdefault(name.lower(), value)
            status = int(code)
            if 100 <= status < 200 and status != 101:
                continue  # 100 Continue and other interim answers come before the real one
            return version, status, reason, (headers, index)

    def _response(self, conn, key, method, version, status, reason, head):
        headers, index = head
        rfile = conn.rfile
        connection = index.get("connection", "").lower()
        keep = ("close" not in connection) if version != "HTTP/1.0" else ("keep-alive" in connection)
        length = index.get("content-length", "")
        if method == "HEAD" or status in (204, 304) or 100 <= status < 200:
            body = FixedBody(rfile, 0)
        elif "chunked" in index.get("transfer-encoding", "").lower():
            body = ChunkedBody(rfile)
        elif length:
            try:
                body = FixedBody(rfile, parse_content_length(length))
            except ValueError:
                # RFC 9112 6.3: where the body ends is unknowable, so nothing of it can be trusted.
                _close_quietly(conn)
                raise UpstreamError("unreachable", f"{key[0]}:{key[1]} sent an invalid Content-Length "
                                                   f"({length[:40]!r})") from None
        else:
            body, keep = FixedBody(rfile, None), False  # delimited by the server closing

        def release():
            if keep and body.reusable:
                self._idle.give(key, conn)
            else:
                _close_quietly(conn)

        return UpstreamResponse(status, reason, headers, body.read1, release, lambda: _close_quietly(conn), index,
                                getattr(body, "read_rest", None))

    def close(self):
        self._idle.close()


def _send_request(sock, head, body):
    """``head`` then ``body`` (bytes or http1.BodyParts) in one system call where the
    socket can gather them.

    Joining them copied the body (120 KB for a coding agent's turn), and
    sending them apart cost a second system call and segment; each system
    call is also a point where another thread can take the GIL.
    """
    if not body:
        sock.sendall(head)
        return
    buffers = (head, *body.parts) if isinstance(body, BodyParts) else (head, body)
    if _SENDMSG is None:
        sock.sendall(b"".join(buffers))
        return
    sent = sock.sendmsg(buffers)
    for buffer in buffers:   # a send cut short (a timeout, a signal): the rest as sendall does it
        if sent >= len(buffer):
            sent -= len(buffer)
            continue
        sock.sendall(memoryview(buffer)[sent:])
        sent = 0


_SENDMSG = getattr(socket.socket, "sendmsg", None)  # not on Windows


class _SocketConnection:
    """One upstream socket and its buffered reader."""

    __slots__ = ("sock", "rfile", "timeout")

    def __init__(self, sock, timeout):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock, self.rfile, self.timeout = sock, timed_reader(sock, timeout, READ_SIZE), timeout

    def close(self):
        with contextlib.suppress(OSError):
            self.rfile.close()
        self.sock.close()


class _StaleConnection(Exception):
    """The server closed a pooled connection before answering."""


class _Urllib3Pool:
    """The same interface over urllib3's PoolManager."""

    def __init__(self, maxsize=32):
        self._pm = deps.urllib3.PoolManager(num_pools=16, maxsize=maxsize, block=False, retries=False)

    def request(self, method, url, headers, body, connect_timeout, read_timeout, tls=_SYSTEM_TLS):
        exc_mod = deps.urllib3.exceptions
        ca_file, verify, client_cert, client_key = tls
        # Each setting gets pools of its own; urllib3 reads the files again per new connection.
        settings = {"cert_reqs": "CERT_REQUIRED" if verify else "CERT_NONE", "ca_certs": ca_file or None,
                    "assert_hostname": None if verify else False,
                    "cert_file": client_cert or None, "key_file": client_key or None}
        try:
            target = deps.urllib3.util.parse_url(url)
            pool = self._pm.connection_from_host(target.host, target.port, target.scheme, pool_kwargs=settings)
            resp = pool.urlopen(
                method, target.request_uri, body=body, headers=headers,
                redirect=False, retries=False, assert_same_host=False,
                timeout=deps.urllib3.Timeout(connect=connect_timeout, read=read_timeout),
                preload_content=False, decode_content=False)
        except exc_mod.ReadTimeoutError as exc:
            raise UpstreamError("timeout", f"upstream did not answer in {read_timeout:g} s: {exc}") from None
        except exc_mod.HTTPError as exc:
            raise UpstreamError("unreachable", f"cannot reach {url}: {exc}{_tls_hint(exc)}") from None

        def abort():
            _close_quietly(getattr(resp, "connection", None))
            with contextlib.suppress(Exception):
                resp.close()
                resp.release_conn()

        return UpstreamResponse(resp.status, resp.reason, list(resp.headers.iteritems()),
                                lambda: resp.read1(READ_SIZE, decode_content=False),
                                resp.release_conn, abort)

    def close(self):
        self._pm.clear()


class _SchemePool:
    """Plain-HTTP upstreams over our own sockets; HTTPS through urllib3 (else http.client).

    Measured with bench/proxy_overhead.py, urllib3 costs ~150 us more CPU per
    request than http.client, and http.client ~140 us more than _SocketPool;
    for a local model server on loopback that is most of the proxy's
    overhead.  TLS, proxies and certificate handling earn a library's keep on
    HTTPS gateways, so one serves those.
    """

    def __init__(self, maxsize=32):
        self._maxsize = maxsize
        self._plain = _SocketPool(maxsize)
        self._tls = None   # made by the first https request: most runs never need urllib3 loaded
        self._lock = threading.Lock()

    def request(self, method, url, headers, body, connect_timeout, read_timeout, tls=_SYSTEM_TLS):
        """Send one request; an https ``url`` is spoken to as ``tls`` says (see Provider.tls).
        ``body``: bytes, an http1.BodyParts (sent as its parts over plain http) or None."""
        if url[:6].lower() != "https:":
            return self._plain.request(method, url, headers, body, connect_timeout, read_timeout, tls)
        if isinstance(body, BodyParts):   # the libraries take one buffer
            body = bytes(body)
        return self._tls_pool().request(method, url, headers, body, connect_timeout, read_timeout, tls)

    def _tls_pool(self):
        pool = self._tls
        if pool is None:   # the first https request: made once, whichever thread gets here first
            with self._lock:
                if self._tls is None:
                    self._tls = (_Urllib3Pool(self._maxsize) if deps.urllib3 is not None
                                 else _HTTPClientPool(self._maxsize))
                pool = self._tls
        return pool

    def close(self):
        self._plain.close()
        with self._lock:
            if self._tls is not None:
                self._tls.close()


def make_http_pool(maxsize=32):
    """The upstream connection pool (see _SchemePool)."""
    return _SchemePool(maxsize)
MAX_UPSTREAM_BODY = 256 * 1024 * 1024


def upstream_url(provider, path, query):
    """The provider URL for a canonical ``/v1/...`` or ``/api/...`` path.

    An openai provider's base_url already ends in its API prefix (``/v1`` for
    most servers), as the OpenAI SDK expects; the others are server roots.
    """
    if provider.type == "openai" and path.startswith("/v1/"):
        url = provider.base_url + path[3:]
    else:
        url = provider.base_url + path
    return url + ("?" + query if query else "")
