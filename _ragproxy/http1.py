"""HTTP/1.1 framing shared by the server and the upstream client.

Reading a head (request or status line and header lines) from a buffered
socket file, in one pass when it is all buffered; bodies framed by
Content-Length (FixedBody) or chunked transfer coding (ChunkedBody); socket
timeouts kept by the kernel where it can (KERNEL_TIMEOUTS), and a deadline
for a series of reads (set_read_deadline); a body sent as several buffers
(BodyParts).  Numbers from the wire are ASCII digits only.  Nothing here
knows about APIs or providers.

May import: nothing (the standard library only).
"""
from __future__ import annotations

import io
import re
import socket
import struct
import sys
import time

READ_SIZE = 65536

# Where the kernel keeps a socket's timeouts (SO_RCVTIMEO/SO_SNDTIMEO on a
# blocking socket), each recv or send is one system call.  Python's own
# timeouts put a poll() before each, and every I/O on the proxy's path comes
# right after a wait, when a system call costs most.  Elsewhere (timeval
# layouts differ) Python keeps the timeouts.
KERNEL_TIMEOUTS = sys.platform.startswith("linux")


def header_value(pairs, name, default=None):
    """The first value of header ``name`` in ``(name, value)`` pairs, any letter case."""
    name = name.lower()
    for key, value in pairs:
        if key.lower() == name:
            return value
    return default


def timed_reader(sock, seconds, size):
    """A buffered reader of ``sock``, whose reads and writes now time out after ``seconds``.

    A read that times out raises socket.timeout either way.  A write that
    times out raises socket.timeout under Python's timeouts and
    BlockingIOError under the kernel's, where sendall() gets EAGAIN (see
    _KERNEL_TIMEOUTS).  set_read_deadline() bounds the reads' total wait.
    """
    if not KERNEL_TIMEOUTS:
        sock.settimeout(seconds)
    else:
        sock.settimeout(None)
        set_io_timeout(sock, seconds)
    return io.BufferedReader(_SocketReader(sock, seconds), size)


def set_io_timeout(sock, seconds):
    """Change the timeout of a socket set up by _timed_reader."""
    if not KERNEL_TIMEOUTS:
        sock.settimeout(seconds)
        return
    micros = max(round(seconds * 1e6), 1) if seconds else 0  # a zero timeval waits for ever, as None does
    timeval = struct.pack("@ll", *divmod(micros, 1_000_000))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, timeval)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, timeval)


def set_read_deadline(rfile, deadline, clock=time.monotonic):
    """Let no read of ``rfile`` (from timed_reader) wait past ``deadline``, a time on ``clock``.

    However slowly the bytes trickle in, the reads together end by then with
    socket.timeout; ``None`` lifts the deadline and puts the reader's own
    timeout back.  (Per-read timeouts alone let a peer sending a byte now and
    then hold a connection for ever.)
    """
    rfile.raw.set_deadline(deadline, clock)


class _SocketReader(io.RawIOBase):
    """Raw reads of a socket with timeouts: the kernel's EAGAIN is the timeout too."""

    def __init__(self, sock, seconds):
        self._sock, self._recv_into, self._seconds = sock, sock.recv_into, seconds
        self._deadline = self._clock = None

    def readable(self):
        return True

    def set_deadline(self, deadline, clock):
        if deadline is None and self._deadline is not None:
            # The timeout timed_reader set; the server's sockets keep it (only the
            # upstream client changes its timeouts, and it sets no deadlines).
            set_io_timeout(self._sock, self._seconds)
        self._deadline, self._clock = deadline, clock

    def readinto(self, buffer):
        if self._deadline is not None:
            left = self._deadline - self._clock()
            if left <= 0:
                raise socket.timeout("deadline passed")
            set_io_timeout(self._sock, min(left, self._seconds) if self._seconds else left)
        try:
            return self._recv_into(buffer)
        except BlockingIOError:
            raise socket.timeout("timed out") from None


class HeadTooLarge(ValueError):
    """A message head over a reader's limits; the text says which."""


def read_head_lines(rfile, max_lines, max_line=65536, eof_ends=True):
    """The lines of the next message head, without line ends, up to its blank line.

    Used by the upstream client (upstream) and the HTTP server (server).
    _HeadTooLarge for a line over ``max_line`` bytes or more than
    ``max_lines`` lines.  The end of input ends the head when ``eof_ends``
    (as http.server has it), else it is a ValueError (a cut-off response).
    """
    lines = buffered_head_lines(rfile)
    if lines is None:
        lines = []
        while True:
            line = rfile.readline(max_line + 1)
            if len(line) > max_line:
                raise HeadTooLarge("Line too long")
            if line in (b"\r\n", b"\n"):
                break
            if not line:
                if eof_ends:
                    break
                raise ValueError("message head cut short")
            if len(lines) >= max_lines:
                raise HeadTooLarge("Too many headers")
            # One line end off, no more: a CR before it is part of the line, for the parser to judge.
            lines.append(line[:-2 if line.endswith(b"\r\n") else -1 if line.endswith(b"\n") else None]
                         .decode("latin-1"))
    if len(lines) > max_lines:
        raise HeadTooLarge("Too many headers")
    return lines


def buffered_head_lines(rfile):
    """The lines of a message head already in rfile's buffer, or None.

    Takes everything up to the blank line in one read from the buffer and one
    split, where a readline, decode and rstrip per line cost about a fifth
    of the proxy's time per request (both its HTTP server and its upstream
    client parse a head per request).  None, with nothing consumed, means
    _read_head_lines reads it line by line: the head continues past the
    buffer, or it has a bare LF or CR, which that loop judges.
    """
    buf = rfile.peek(1)
    if buf[:2] == b"\r\n":
        rfile.read(2)
        return []
    end = buf.find(b"\r\n\r\n")
    if end < 0:
        return None
    block = buf[:end]
    pairs = block.count(b"\r\n")
    if block.count(b"\n") != pairs or block.count(b"\r") != pairs:
        return None
    rfile.read(end + 4)
    return block.decode("latin-1").split("\r\n")


class BodyParts:
    """A request body held as the buffers it is made of, in order: ``len()`` is its
    size in bytes and ``bytes()`` joins it.

    A body spliced from the client's bytes and a few new ones (jsonbody.with_edits)
    goes upstream this way: the socket client hands the parts to one gathering
    send, so a 120 KB agent-loop body with context injected is not copied whole
    in Python, and the kernel reads the client's bytes where they already lie.
    A copy that size costs a request more than its memcpy: it evicts what the
    rest of the request reads from the CPU's caches (bench/RESULTS.md, session 28).
    """

    __slots__ = ("parts", "size")

    def __init__(self, parts):
        self.parts = tuple(parts)
        self.size = sum(map(len, self.parts))

    def __len__(self):
        return self.size

    def __bytes__(self):
        return b"".join(self.parts)

    def __repr__(self):
        return f"<BodyParts: {self.size} bytes in {len(self.parts)} parts>"


class FixedBody:
    """A body of known length (``None``: until the server closes)."""

    def __init__(self, rfile, length):
        self.rfile, self.left, self.complete = rfile, length, length == 0

    @property
    def reusable(self):
        return self.complete

    def read_rest(self, limit=None):
        """All of a known-length body in one read; None when the length is unknown or over ``limit``."""
        left = self.left
        if left is None or (limit is not None and left > limit):
            return None
        data = self.rfile.read(left) if left else b""
        if len(data) < left:
            raise ConnectionError(f"response body ended {left - len(data)} bytes early")
        self.left, self.complete = 0, True
        return data

    def read1(self):
        if self.left == 0:
            self.complete = True
            return b""
        data = self.rfile.read1(READ_SIZE if self.left is None else min(self.left, READ_SIZE))
        if self.left is None:
            return data
        if not data:
            raise ConnectionError(f"response body ended {self.left} bytes early")
        self.left -= len(data)
        return data


def parse_content_length(text):
    """A Content-Length value as an int; ValueError unless it is 1 to 18 ASCII digits.

    str.isdigit() alone passes "\xb9" and "\u0663" (superscript one, Arabic-Indic
    three), which int() then refuses or reads; a peer picks the bytes.
    """
    if not (0 < len(text) <= 18 and text.isascii() and text.isdigit()):
        raise ValueError(f"invalid Content-Length: {text[:40]!r}")
    return int(text)


def parse_chunk_size(line):
    """The size on a chunked-encoding size line (extensions ignored); ValueError if malformed.

    Only hex digits: int(x, 16) alone would take "-5", "+5", "0x5" and "1_0".
    """
    token = line.split(b";", 1)[0].strip(b" \t\r\n")
    if not token or len(token) > 16 or token.strip(b"0123456789abcdefABCDEF"):
        raise ValueError(f"malformed chunk size line {line[:40]!r}")
    return int(token, 16)


_SIZE_LINE, _DATA, _DATA_END, _TRAILER = range(4)

# A bare size line, the usual one: what parse_chunk_size() takes, less the
# extensions and blanks it also allows (those go the long way).
_PLAIN_SIZE_LINE = re.compile(rb"([0-9A-Fa-f]{1,16})\r\n")


def _whole_chunks(buf, pos, out):
    """Append the payloads of the complete non-final chunks in ``buf`` from ``pos``
    on to ``out``; the offset just past them.

    A fast upstream's events arrive dozens to a read; taking each through the
    state machine cost a size-line parse, three state changes and a dozen
    Python-level calls.  Anything else (the last chunk, one cut off by the
    read, a size line with extensions, broken framing) is left where it
    starts, for ChunkedBody's loop to judge as before.
    """
    end = len(buf)
    match = _PLAIN_SIZE_LINE.match
    while True:
        m = match(buf, pos)
        if m is None:
            return pos
        start = m.end()
        stop = start + int(m.group(1), 16)
        if stop == start or stop + 2 > end or buf[stop:stop + 2] != b"\r\n":
            return pos
        out.append(buf[start:stop])
        pos = stop + 2


class ChunkedBody:
    """A chunked body, decoded as it arrives.

    Each read1() does at most one read from the socket and hands on every
    payload byte it brought: events that arrive together leave together, in
    one write to the client, and none waits for a later one.  (Reading chunk
    by chunk cost three buffered calls and a client write per event.)
    """

    _MAX_LINE = 8192

    def __init__(self, rfile):
        self.rfile, self.complete, self.reusable = rfile, False, False
        self._buf = b""
        self._state = _SIZE_LINE
        self._left = 0  # payload bytes still to come in the current chunk
        self._broken = None  # the framing error found after bytes already handed on

    def read1(self):
        if self._broken is not None:
            raise self._broken
        while not self.complete:
            data = self.rfile.read1(READ_SIZE)
            if not data:
                raise ConnectionError("chunked response body ended early")
            if self._state == _SIZE_LINE and not self._buf:
                # The usual read, one whole chunk, takes a few C-level calls:
                # a model's events come milliseconds apart, each to a cold CPU
                # cache, where every extra line of Python costs.
                eol = data.find(b"\n")
                if eol > 0:
                    size = self._size(data[:eol + 1])
                    stop = eol + 1 + size
                    if size and data[stop:] == b"\r\n":
                        return data[eol + 1:stop]
            out = self._decode(self._buf + data if self._buf else data)
            if out:
                return out
        return b""

    def _decode(self, buf):
        out = []
        try:
            return self._decode_into(buf, out)
        except ConnectionError as exc:
            if not out:
                raise
            # The events decoded before the break are whole and good: they go
            # to the client now, the error with the next read.
            self._broken, self._buf = exc, b""
            return b"".join(out)

    def _decode_into(self, buf, out):
        pos, end = 0, len(buf)
        if self._state == _SIZE_LINE:
            pos = _whole_chunks(buf, pos, out)
        while pos < end:
            state = self._state
            if state == _DATA:
                take = min(self._left, end - pos)
                out.append(buf[pos:pos + take])
                pos += take
                self._left -= take
                if self._left:
                    break
                self._state = _DATA_END
            elif state == _DATA_END:
                if end - pos < 2:
                    break
                if buf[pos:pos + 2] != b"\r\n":
                    raise ConnectionError("malformed chunked response body")
                pos = _whole_chunks(buf, pos + 2, out)
                self._state = _SIZE_LINE
            else:
                eol = buf.find(b"\n", pos)
                if eol < 0:
                    if end - pos > self._MAX_LINE:
                        raise ConnectionError("chunked response body: line too long")
                    break
                line, pos = buf[pos:eol + 1], eol + 1
                if state == _TRAILER:
                    if line in (b"\r\n", b"\n"):  # the blank line after the trailers ends the body
                        self.complete = True
                        self.reusable = pos == end  # bytes past the end: the connection is out of step
                        self._buf = b""
                        return b"".join(out)
                    continue
                size = self._size(line)
                if size:
                    self._state, self._left = _DATA, size
                else:
                    self._state = _TRAILER
        self._buf = buf[pos:]
        return b"".join(out)

    @staticmethod
    def _size(line):
        try:
            return parse_chunk_size(line)
        except ValueError as exc:  # to the caller, a broken body like any other
            raise ConnectionError(str(exc)) from None


def parse_header_lines(lines):
    """Header lines as a dict of lower-case name -> value; ValueError naming a malformed line.

    A repeated header's values are joined by ", " (RFC 9110 5.3).  This dict
    stands in for the ``email.message.Message`` that BaseHTTPRequestHandler
    builds, which costs ~20-30 us per request for nothing we use.
    """
    merged, key = {}, None
    for text in lines:
        name, colon, value = text.partition(":")
        if not colon or not name or name != name.strip():
            if not (text[:1] in (" ", "\t") and key is not None):
                raise ValueError(f"Malformed header line ({text[:100]!r})")
            merged[key] += " " + text.strip()  # obsolete line folding: continues the previous value
            continue
        key = name.lower()
        if key in merged:
            merged[key] += ", " + value.strip()
        else:
            merged[key] = value.strip()
    # Two checks of the whole head rather than two per line: names are tokens
    # (RFC 9110 5.1: no spaces, no separators, ASCII), and no value holds a CR,
    # LF or NUL (5.5).  A line break passed on would end as the upstream
    # client's refusal, a 502, for a request that was the client's mistake.
    names = "".join(merged)
    plain = names.replace("-", "")
    if not (plain.isalnum() and plain.isascii()) and _TOKEN_CHARS.fullmatch(names) is None:
        bad = next(name for name in merged if _TOKEN_CHARS.fullmatch(name) is None)
        raise ValueError(f"Malformed header name ({bad[:100]!r})")
    head = "".join(lines)   # as sent: strip() would hide a CR at either end of a value
    if "\r" in head or "\n" in head or "\0" in head:
        bad = next(text for text in lines if set(text) & {"\r", "\n", "\0"})
        where = "a folded header line" if bad[:1] in (" ", "\t") else f"header {bad.partition(':')[0][:100]!r}"
        raise ValueError(f"{where} holds a CR, LF or NUL character")  # the value not echoed: it may be a key
    return merged


_TOKEN_CHARS = re.compile(r"[!#$%&'*+\-.^_`|~0-9a-z]*")  # lower-case: the names are lowered first


MAX_HEADER_LINES = 100
