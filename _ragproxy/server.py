"""The HTTP server: a thin adapter from http.server to App.handle().

Parse the wire request, enforce size limits, write the response in as few
writes as possible (the stdlib's separate header/body writes cost ~40 ms per
keep-alive response under Nagle and delayed ACK), and stop the upstream the
moment a client goes away.  The app is passed in; nothing here knows what
it does with a request.

Two bounds keep a flood of connections from taking the machine: at most
server.max_connections are served at once (a few more, past it, are read
only to answer ``GET /health``; the rest get 503 at once), and a request's
whole head must arrive within server.head_timeout, however it trickles in.

May import: api, defaults, http1.
"""
from __future__ import annotations

import contextlib
import email.utils
import http.server
import io
import logging
import selectors
import socket
import threading
import time

from . import __version__
from .api import ClientError, Request, StreamResponse, dialect_of, error_response, loggable_path
from .defaults import DEFAULT_HOST
from .http1 import (
    MAX_HEADER_LINES,
    HeadTooLarge,
    buffered_head_lines,
    parse_chunk_size,
    parse_content_length,
    parse_header_lines,
    read_head_lines,
    set_read_deadline,
    timed_reader,
)

log = logging.getLogger("ragproxy")


_REASONS = {code: phrase for code, (phrase, _) in http.server.BaseHTTPRequestHandler.responses.items()}
_REASONS.update({529: "Overloaded"})

#: Connections past server.max_connections that are still read, to answer
#: ``GET /health`` (anything else gets 503); past these, 503 before reading.
HEALTH_RESERVE = 8


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    server_version = "ragproxy/" + __version__
    sys_version = ""

    def __init__(self, request, client_address, server, overflow=False):
        self.overflow = overflow  # taken past server.max_connections: /health only, then close
        super().__init__(request, client_address, server)

    def handle_one_request(self):
        """Read, parse and serve one request.

        The usual request arrives whole, so its request line and headers are
        taken from the read buffer in one pass (see _buffered_head_lines).  A
        head split across reads, or with bare LF line ends, is read line by
        line (_read_head) and judged the same way.
        """
        try:
            lines = buffered_head_lines(self.rfile)
            if lines:
                self._lift_deadline()
                self.raw_requestline = lines[0].encode("latin-1")
                if not (self._start_line(lines[0]) and self._accept_headers(lines[1:])):
                    return
            elif not self._read_head():
                return
            serve = getattr(self, "do_" + self.command, None)
            if serve is None:
                self.send_error(501, f"Unsupported method ({self.command!r})")
                return
            serve()
        except (socket.timeout, TimeoutError, BlockingIOError) as exc:  # a read or a write timed out: drop it
            self.log_message("%s %s timed out: %s", self.command or "-", loggable_path(self.path or "-"), exc)
            self.close_connection = True

    def _read_head(self):
        """A head read line by line, all of it within server.head_timeout; False if refused.

        Not all buffered, or not a clean CRLF head (a blank line first
        included): http.server's way, one readline per line, which is slow
        but rare.  The deadline starts at the first byte (at the connection
        for its first request), so a peer trickling a byte now and then
        cannot hold the connection and its thread for ever.
        """
        if not self._deadline:
            self._arm_deadline()
        self.command, self.path = None, ""
        try:
            raw = self.rfile.readline(65537)
            if not raw:
                self.close_connection = True
                return False
            if len(raw) > 65536:
                self.send_error(414)
                return False
            self.raw_requestline = raw
            if not self._start_line(str(raw, "iso-8859-1").rstrip("\r\n")):
                return False
            try:
                lines = read_head_lines(self.rfile, MAX_HEADER_LINES)
            except HeadTooLarge as exc:
                self.send_error(431, str(exc))
                return False
        except (socket.timeout, TimeoutError):
            self.send_error(408, f"the request head did not arrive within {self.head_timeout:g} s "
                                 "(server.head_timeout)")
            return False
        finally:
            self._lift_deadline()
        return self._accept_headers(lines)

    def _arm_deadline(self):
        clock = self.server.clock
        set_read_deadline(self.rfile, clock() + self.head_timeout, clock)
        self._deadline = True

    def _lift_deadline(self):
        if self._deadline:
            set_read_deadline(self.rfile, None)
            self._deadline = False

    def _start_line(self, requestline):
        """The stdlib's checks of the request line; False (an error sent) if it is bad."""
        self.command = None
        self.request_version = "HTTP/0.9"
        self.close_connection = True
        self.requestline = requestline
        self._continue = False
        words = requestline.split()
        if not words:
            return False
        if len(words) != 3:
            self.send_error(400, f"Bad request syntax ({requestline!r})")
            return False
        command, path, version = words
        before_11 = False
        if version != "HTTP/1.1":  # the usual one needs no parsing
            major, dot, minor = version[5:].partition(".")
            # isascii(): str.isdigit() passes "\xb9" (superscript one), which int() refuses.
            if not (version.startswith("HTTP/") and version.isascii() and dot and major.isdigit()
                    and minor.isdigit() and len(major) <= 10 and len(minor) <= 10):
                self.send_error(400, f"Bad request version ({version!r})")
                return False
            if int(major) >= 2:
                self.send_error(505, f"Invalid HTTP version ({version[5:]})")
                return False
            before_11 = (int(major), int(minor)) < (1, 1)
        self._before_11 = self.close_connection = before_11
        self.request_version = version
        self.command, self.path = command, path
        if path.startswith("//"):
            self.path = "/" + path.lstrip("/")
        return True

    def _accept_headers(self, lines):
        """Parse the header lines and act on Connection and Expect as http.server does."""
        if len(lines) > MAX_HEADER_LINES:
            self.send_error(431, "Too many headers")
            return False
        try:
            self.headers = headers = parse_header_lines(lines)
        except ValueError as exc:
            self.send_error(400, str(exc))
            return False
        self.header_bytes = sum(map(len, lines)) + 2 * len(lines)
        conntype = headers.get("connection")
        if conntype is not None:
            conntype = conntype.lower()
            if conntype == "close":
                self.close_connection = True
            elif conntype == "keep-alive":
                self.close_connection = False
        expect = headers.get("expect")
        if expect is not None and expect.lower() == "100-continue" and not self._before_11:
            if not self.handle_expect_100():
                return False
        return True

    def log_request(self, code="-", size="-"):
        # Not the stdlib's line: it holds the request line as sent, a /k/KEY/ path included.
        if log.isEnabledFor(logging.DEBUG):
            self.log_message("%s %s %s %s %s", self.command or "-", loggable_path(self.path or "-"),
                             self.request_version, code, size)

    def setup(self):
        super().setup()  # no self.timeout: the connection's timeouts are set below
        self.rfile.close()  # the stdlib's reader; closing it lets the socket close with the connection
        limits = self.server.app.config.server
        self.rfile = timed_reader(self.connection, limits["client_timeout"], io.DEFAULT_BUFFER_SIZE)
        self.command, self.path, self.request_version = None, "", "-"  # until a request line says
        # The first head is due within head_timeout of the connection: one
        # that sends nothing holds a thread as surely as one that trickles.
        self.head_timeout = limits["head_timeout"]
        if self.overflow:
            self.head_timeout = min(self.head_timeout, self.server.reserve_head_timeout)
        self._arm_deadline()

    # BaseHTTPRequestHandler reports its own parse errors (bad request line,
    # 414, 431, 501) through send_error; answer those in JSON too.
    def send_error(self, code, message=None, explain=None):
        self._lift_deadline()  # the deadline was the reads'; the answer gets the usual timeout
        self.close_connection = True
        text = message or _REASONS.get(code, "error")
        path = (getattr(self, "path", "") or "/").partition("?")[0]
        self._write(error_response(dialect_of(path), code, text))

    def handle_expect_100(self):
        if self.server.app.wants_body_stream(self.command, self.path.partition("?")[0]):
            # An upload, whose caps (uploads.*) are the handler's to apply:
            # "100 Continue" goes out when it first reads the body, so an
            # upload refused (too large, no login) is never sent at all.
            self._continue = True
            return True
        limit = self.server.app.config.server["max_body_bytes"]
        length = self.headers.get("content-length")
        if length is not None and "chunked" not in self.headers.get("transfer-encoding", "").lower():
            try:
                size = parse_content_length(length)
            except ValueError:
                self.send_error(400, f"invalid Content-Length: {length!r}")
                return False
            if size > limit:
                self.send_error(413, f"request body is {size} bytes; the limit is {limit} (server.max_body_bytes)")
                return False
        return super().handle_expect_100()

    def _send_continue(self):
        with contextlib.suppress(OSError):  # gone: the body's read then comes up short
            self.connection.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")

    def log_message(self, format, *args):
        log.debug("%s " + format, self.address_string(), *args)

    def _serve(self):
        app = self.server.app
        limits = app.config.server
        path, _, query = self.path.partition("?")
        headers = self.headers
        stream = None
        if self.overflow:
            self.close_connection = True  # frees the reserve's place for the next health check
            if path != "/health" or self.command not in ("GET", "HEAD"):
                self.server.note_refusal()
                self._write(error_response(dialect_of(path), 503, self.server.busy_message(), "overloaded",
                                           [("Retry-After", "1")]))
                return
        try:
            if self.header_bytes > limits["max_header_bytes"]:
                raise ClientError(431, f"request headers are larger than {limits['max_header_bytes']} bytes")
            if app.wants_body_stream(self.command, path):
                body, stream = b"", self._body_stream(headers)
            else:
                body = self._read_body(headers, limits["max_body_bytes"])
        except ClientError as exc:
            self.close_connection = True  # the unread body would be parsed as the next request
            self._write(error_response(dialect_of(path), exc.status, exc.message, exc.code))
            return
        except (socket.timeout, TimeoutError):
            self.close_connection = True
            self._write(error_response(dialect_of(path), 408, "timed out reading the request body"))
            return
        request = Request(self.command, path, query, headers, body, self.client_address[0], stream)
        try:
            response = app.handle(request)
        except (socket.timeout, TimeoutError):
            self.close_connection = True
            response = error_response(dialect_of(path), 408, "timed out reading the request body")
        except Exception:
            log.exception("internal error handling %s %s", self.command, loggable_path(path))
            response = error_response(dialect_of(path), 500, "internal error in ragproxy (details are in its log)")
        if stream is not None and stream.remaining:
            self.close_connection = True  # refused before the body was read: the rest is not a request
        if isinstance(response, StreamResponse):
            self._write_stream(response)
        else:
            self._write(response)

    do_GET = do_POST = do_HEAD = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _serve

    def _read_body(self, headers, limit):
        if "chunked" in headers.get("transfer-encoding", "").lower():
            return self._read_chunked(limit)
        length = headers.get("content-length")
        if length is None:
            return b""
        try:
            length = parse_content_length(length)
        except ValueError:
            raise ClientError(400, f"invalid Content-Length: {length!r}") from None
        if length > limit:
            raise ClientError(413, f"request body is {length} bytes; the limit is {limit} "
                                   "(server.max_body_bytes)", "request_too_large")
        body = self.rfile.read(length)
        if len(body) < length:
            raise ClientError(400, "request body ended early")
        return body

    def _body_stream(self, headers):
        if "chunked" in headers.get("transfer-encoding", "").lower():
            raise ClientError(411, "uploads need a Content-Length (chunked uploads are not supported)",
                              "length_required")
        length = headers.get("content-length", "0")
        try:
            size = parse_content_length(length)
        except ValueError:
            raise ClientError(400, f"invalid Content-Length: {length!r}") from None
        return _BodyReader(self.rfile, size, self._send_continue if self._continue else None)

    def _read_chunked(self, limit):
        parts, size = [], 0
        while True:
            line = self.rfile.readline(1026)
            try:
                chunk_size = parse_chunk_size(line)
            except ValueError:
                raise ClientError(400, "malformed chunked request body") from None
            if chunk_size == 0:
                while self.rfile.readline(8194).strip():  # trailers, ignored
                    pass
                return b"".join(parts)
            size += chunk_size
            if size > limit:
                raise ClientError(413, f"request body is larger than {limit} bytes (server.max_body_bytes)",
                                  "request_too_large")
            data = self.rfile.read(chunk_size)
            if len(data) < chunk_size or self.rfile.read(2) != b"\r\n":
                raise ClientError(400, "malformed chunked request body")
            parts.append(data)

    def _head(self, status, headers, framing):
        text = "\r\n".join([f"HTTP/1.1 {status} {_REASONS.get(status, 'Status')}"]
                            + [f"{name}: {value}" for name, value in headers] + [framing])
        # One lower() of the whole head finds a Server or Date the upstream
        # sent; header values never hold a line break, so "\r\nname:" is a line start.
        lowered = text.lower()
        if "\r\nserver:" not in lowered:
            text += "\r\nServer: " + self.server_version
        if "\r\ndate:" not in lowered:
            text += "\r\nDate: " + self.server.http_date()
        if self.close_connection:
            text += "\r\nConnection: close"
        return (text + "\r\n\r\n").encode("latin-1", "replace")

    def _write(self, response):
        body = b"" if self.command == "HEAD" else response.body
        head = self._head(response.status, response.headers, f"Content-Length: {len(response.body)}")
        try:
            self.connection.sendall(head + body)
        except OSError:
            self.close_connection = True
        self.log_request(response.status, len(response.body))
        if response.after is not None:
            try:
                response.after()
            except Exception:
                log.exception("after answering %s %s", self.command, loggable_path(self.path))

    def _write_stream(self, response):
        chunked = self.request_version != "HTTP/1.0"
        if not chunked:
            self.close_connection = True  # HTTP/1.0: the end of the body is the end of the connection
        hangups = self.server.hangups
        send = self.connection.sendall  # not wfile: its write() is a Python layer over this, per event
        try:
            send(self._head(response.status, response.headers,
                            "Transfer-Encoding: chunked" if chunked else "Cache-Control: no-cache"))
            hangups.watch(self.connection, response.on_hangup or response.close)
            for data in response.chunks:
                if data:
                    send(b"%x\r\n%s\r\n" % (len(data), data) if chunked else data)
            # Unwatched before the last bytes go: once they are out the client
            # sends its next request, which woke the watcher's thread for
            # nothing (a select, a peek and an unregister under the GIL per stream).
            hangups.unwatch(self.connection)
            if chunked:
                send(b"0\r\n\r\n")
        except OSError as exc:  # the client went away: stop the upstream now
            log.debug("client %s disconnected mid-stream: %s", self.address_string(), exc)
            self.close_connection = True
        finally:
            hangups.unwatch(self.connection)  # a no-op unless the stream broke off
            response.close()
            with contextlib.suppress(Exception):
                response.chunks.close()
        self.log_request(response.status, "-")


class _BodyReader:
    """The unread request body: ``read(n)`` stops at Content-Length.

    ``before_read``, when set, runs before the first read (the "100 Continue"
    a client sending ``Expect: 100-continue`` waits for).
    """

    def __init__(self, rfile, length, before_read=None):
        self.rfile, self.remaining, self._before_read = rfile, length, before_read

    def read(self, n=-1):
        if self._before_read is not None:
            self._before_read, before_read = None, self._before_read
            if self.remaining > 0:
                before_read()
        if self.remaining <= 0:
            return b""
        n = self.remaining if n is None or n < 0 else min(n, self.remaining)
        data = self.rfile.read(n)
        self.remaining -= len(data)
        if not data:
            self.remaining = 0
        return data


class _HangupWatcher:
    """Calls a stream's ``on_hangup`` when its client closes the connection.

    Without this a client that leaves while the model is thinking is noticed
    only at the next write, and the upstream keeps generating until then.  One
    thread serves every stream: a thread per stream cost ~50 us of CPU and, on
    a busy machine, up to milliseconds before the first event while
    Thread.start() waited for the new thread to be scheduled.
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._thread = None
        self._closed = False
        self._watched = set()  # the sockets registered, beside the wake-up one

    def watch(self, sock, on_hangup):
        """Call ``on_hangup()`` if ``sock``'s peer closes; True if it is watched now."""
        with self._lock:
            if self._closed:
                return False
            try:
                self._selector.register(sock, selectors.EVENT_READ, on_hangup)
            except (KeyError, ValueError, OSError):
                return False  # already watched, or already closed
            self._watched.add(sock)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="ragproxy-hangups", daemon=True)
                self._thread.start()
            return True

    def unwatch(self, sock):
        with self._lock:
            # The set, not the selector's KeyError, says whether it is still
            # watched: that error formats the socket's repr, per stream.
            if sock in self._watched:
                self._watched.discard(sock)
                with contextlib.suppress(KeyError, ValueError, OSError):
                    self._selector.unregister(sock)

    def watching(self):
        """How many sockets are watched now."""
        with self._lock:
            return len(self._watched)

    def close(self):
        with self._lock:
            self._closed = True
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")

    def _run(self):
        while True:
            try:
                events = self._selector.select(1.0)
            except (OSError, ValueError):  # a socket closed under us: drop the dead ones
                self._drop_closed()
                continue
            for key, _ in events:
                if key.data is None:
                    with self._lock:
                        if self._closed:
                            self._selector.close()
                            self._wake_r.close()
                            self._wake_w.close()
                            return
                    with contextlib.suppress(OSError):
                        self._wake_r.recv(64)
                    continue
                try:
                    gone = key.fileobj.recv(1, socket.MSG_PEEK) == b""
                except OSError:
                    gone = True
                # EOF: the client left.  Data: its next request; nothing left to watch for.
                with self._lock:
                    self._watched.discard(key.fileobj)
                    with contextlib.suppress(KeyError, ValueError, OSError):
                        self._selector.unregister(key.fileobj)
                if gone:
                    key.data()

    def _drop_closed(self):
        with self._lock:
            for key in list(self._selector.get_map().values()):
                if key.data is not None and key.fileobj.fileno() < 0:
                    self._watched.discard(key.fileobj)
                    self._selector.unregister(key.fileobj)


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128
    allow_reuse_address = True
    # A health check sends its head at once; a client trickling one into the
    # reserve must not keep it from the next check for long.
    reserve_head_timeout = 2.0

    def __init__(self, address, app, clock=time.monotonic, sock=None, placement=None):
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        self.app = app
        self.clock = clock  # for server.head_timeout
        self.placement = placement  # enter_thread()/leave_thread() around each connection's thread
        self.hangups = _HangupWatcher()
        self._date = (None, "")
        self._lock = threading.Lock()
        self.connections = 0      # being served now, the health reserve's included
        self._overflow = set()    # sockets taken into the health reserve, until their thread starts
        self._refused = 0         # since the last warning about it
        self._warned = None
        if sock is None:
            super().__init__(address, _Handler)
        else:
            super().__init__(address, _Handler, bind_and_activate=False)
            self.socket.close()
            self.socket = sock
            self.server_address = sock.getsockname()

    def busy_message(self):
        return (f"ragproxy is serving its maximum of {self.app.config.server['max_connections']} connections "
                "(server.max_connections); try again shortly")

    def process_request(self, request, client_address):
        """Serve the connection in a thread of its own, unless too many are served already."""
        cap = self.app.config.server["max_connections"]
        with self._lock:
            count = self.connections
            taken = count < cap + HEALTH_RESERVE
            if taken:
                self.connections += 1
        if not taken:
            self._refuse_now(request)
            return
        if count >= cap:
            self._overflow.add(request)
        try:
            super().process_request(request, client_address)
        except BaseException:  # no thread (the system's limit): the connection is dropped
            self._overflow.discard(request)
            with self._lock:
                self.connections -= 1
            raise

    def process_request_thread(self, request, client_address):
        placement = self.placement
        if placement is not None:
            placement.enter_thread()
        try:
            super().process_request_thread(request, client_address)
        finally:
            if placement is not None:
                placement.leave_thread()
            with self._lock:
                self.connections -= 1

    def finish_request(self, request, client_address):
        overflow = request in self._overflow
        if overflow:
            self._overflow.discard(request)
        self.RequestHandlerClass(request, client_address, self, overflow)

    def _refuse_now(self, request):
        """503 without reading the request: from the accepting thread, so it must never block."""
        self.note_refusal()
        response = error_response("openai", 503, self.busy_message(), "overloaded", [("Retry-After", "1")])
        head = "".join([f"HTTP/1.1 503 {_REASONS[503]}\r\n"]
                       + [f"{name}: {value}\r\n" for name, value in response.headers]
                       + [f"Content-Length: {len(response.body)}\r\nConnection: close\r\n"
                          f"Server: {_Handler.server_version}\r\nDate: {self.http_date()}\r\n\r\n"])
        with contextlib.suppress(OSError):
            request.setblocking(False)
            # Closing on unread bytes would reset the connection, and the
            # reset can overtake the answer; what has arrived is read first.
            with contextlib.suppress(OSError):
                request.recv(65536)
            request.send(head.encode("latin-1") + response.body)
        self.shutdown_request(request)

    def note_refusal(self, interval=60.0):
        """Count a connection refused for the cap; warn of them at most once per ``interval``."""
        now = self.clock()
        with self._lock:
            self._refused += 1
            if self._warned is not None and now - self._warned < interval:
                return
            refused, self._refused, self._warned = self._refused, 0, now
        log.warning("refused %d request(s) with 503: %d connections are open, the limit is "
                    "server.max_connections (%d)", refused, self.connections,
                    self.app.config.server["max_connections"])

    def http_date(self, clock=time.time):
        """The Date header's text, formatted once per second rather than per response."""
        second = int(clock())
        cached_second, text = self._date
        if second != cached_second:
            text = email.utils.formatdate(second, usegmt=True)
            self._date = (second, text)
        return text

    def server_close(self):
        super().server_close()
        self.hangups.close()

    def handle_error(self, request, client_address):
        log.debug("connection from %s ended with an error", client_address, exc_info=True)


def make_server(app, host=DEFAULT_HOST, port=0, clock=time.monotonic, sock=None, placement=None):
    """A bound (not yet serving) threaded HTTP server for ``app``; ``clock`` times request heads.

    With ``sock`` (from listening_socket), it serves that socket instead of binding one: the way
    several worker processes serve one port.  ``placement`` (a placement.CpuPlacement) places
    each connection's thread on a CPU.
    """
    return _Server((host, port), app, clock, sock, placement)


def listening_socket(host=DEFAULT_HOST, port=0):
    """A bound, listening socket for several processes' make_server(sock=...) to share.

    Non-blocking: every process's accept loop wakes for a new connection and
    all but one find it taken; a blocking accept would then wait for the next
    connection, and a stop (server.shutdown) with it.  Accepted sockets are
    blocking all the same (socket.accept makes them so).
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(_Server.request_queue_size)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock
