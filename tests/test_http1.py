"""HTTP/1.1 framing (_ragproxy.http1): heads, header lines, chunk sizes, Content-Length and chunked bodies.

In-process over buffered readers of bytes (one that hands out a byte per
read stands in for a slow peer); test_server and test_upstream drive the
same code over real sockets.
"""
import io

import pytest

from _ragproxy import http1


class Trickle(io.RawIOBase):
    """A raw stream that gives one byte per read, as a peer sending byte by byte."""

    def __init__(self, data):
        self.data, self.pos = data, 0

    def readable(self):
        return True

    def readinto(self, buffer):
        if self.pos >= len(self.data) or not len(buffer):
            return 0
        buffer[0] = self.data[self.pos]
        self.pos += 1
        return 1


def reader(data, trickle=False):
    return io.BufferedReader(Trickle(data) if trickle else io.BytesIO(data))


HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nX-A: 1\r\n\r\nbody"


@pytest.mark.parametrize("trickle", [False, True], ids=["buffered", "trickled"])
def test_read_head_lines_alike_however_the_head_arrives(trickle):
    rfile = reader(HEAD, trickle)
    assert http1.read_head_lines(rfile, 10) == ["HTTP/1.1 200 OK", "Content-Type: text/plain", "X-A: 1"]
    assert rfile.read() == b"body"     # the blank line consumed, nothing past it


def test_buffered_head_lines_takes_only_a_whole_crlf_head():
    assert http1.buffered_head_lines(reader(HEAD)) == ["HTTP/1.1 200 OK", "Content-Type: text/plain", "X-A: 1"]
    cut = reader(b"HTTP/1.1 200 OK\r\nX-A: 1\r\n")
    assert http1.buffered_head_lines(cut) is None and cut.read() == b"HTTP/1.1 200 OK\r\nX-A: 1\r\n"
    bare_lf = reader(b"HTTP/1.1 200 OK\nX-A: 1\r\n\r\n")
    assert http1.buffered_head_lines(bare_lf) is None               # left to the line-by-line loop...
    assert http1.read_head_lines(bare_lf, 10) == ["HTTP/1.1 200 OK", "X-A: 1"]  # ...which takes it


def test_read_head_lines_limits_and_a_cut_off_head():
    with pytest.raises(http1.HeadTooLarge, match="Too many headers"):
        http1.read_head_lines(reader(b"".join(b"X-%d: 1\r\n" % i for i in range(5)) + b"\r\n"), 4)
    with pytest.raises(http1.HeadTooLarge, match="Line too long"):
        http1.read_head_lines(reader(b"X: " + b"a" * 100 + b"\n\n"), 10, max_line=50)
    assert http1.read_head_lines(reader(b"GET / HTTP/1.0\r\n"), 10) == ["GET / HTTP/1.0"]   # EOF ends it
    with pytest.raises(ValueError, match="cut short"):
        http1.read_head_lines(reader(b"HTTP/1.1 200 OK\r\n"), 10, eof_ends=False)


def test_parse_header_lines():
    headers = http1.parse_header_lines(["Content-Type: text/plain", "Via: a", "VIA:b ", "X-Long: one",
                                        "  two"])
    assert headers == {"content-type": "text/plain", "via": "a, b", "x-long": "one two"}
    for bad in (["no colon here"], [" X-Folded: first"], ["X-A : 1"], [": empty name"]):
        with pytest.raises(ValueError, match="Malformed header line"):
            http1.parse_header_lines(bad)


def test_parse_chunk_size_takes_hex_digits_only():
    assert http1.parse_chunk_size(b"1a\r\n") == 26
    assert http1.parse_chunk_size(b"00000003;name=value\r\n") == 3
    assert http1.parse_chunk_size(b"0\r\n") == 0
    for bad in (b"-5\r\n", b"+5\r\n", b"0x5\r\n", b"1_0\r\n", b"\r\n", b"1" * 17 + b"\r\n", b"zz\r\n"):
        with pytest.raises(ValueError, match="malformed chunk size"):
            http1.parse_chunk_size(bad)


CHUNKED = (b"7;name=value\r\ndata: 0\r\n" + b"9\r\ndata: 1\n\n\r\n" + b"00000003\r\nabc\r\n"
           + b"0\r\nX-Trailer: t\r\n\r\n")


def read_all(body):
    out = []
    while not body.complete:
        out.append(body.read1())
    return b"".join(out)


@pytest.mark.parametrize("trickle", [False, True], ids=["at-once", "byte-by-byte"])
def test_chunked_body_decodes_alike_however_it_arrives(trickle):
    body = http1.ChunkedBody(reader(CHUNKED, trickle))
    assert read_all(body) == b"data: 0data: 1\n\nabc"
    assert body.complete and body.reusable and body.read1() == b""


class Pieces(Trickle):
    """A raw stream that gives at most ``size`` bytes per read."""

    def __init__(self, data, size):
        super().__init__(data)
        self.size = size

    def readinto(self, buffer):
        piece = self.data[self.pos:self.pos + min(self.size, len(buffer))]
        buffer[:len(piece)] = piece
        self.pos += len(piece)
        return len(piece)


def test_many_chunks_a_read_decode_alike_wherever_the_reads_end():
    # A fast upstream's events arrive dozens to a read, and a read can end
    # anywhere in one: inside a size line, a payload or its CRLF.
    events = [b"event: delta\ndata: {\"i\": %d, \"text\": \"%s\"}\n\n" % (i, b"x" * (i * 7 % 40)) for i in range(60)]
    sizes = [b"%x" % len(e) for e in events]
    sizes[5] = sizes[5].upper()
    sizes[9] = b"000" + sizes[9]               # leading zeros: still a plain size line
    sizes[20] += b";ext=1"                     # an extension: the long way
    sizes[33] = b"%X" % len(events[33])
    data = b"".join(size + b"\r\n" + event + b"\r\n" for size, event in zip(sizes, events)) + b"0\r\n\r\n"
    for size in (1, 2, 3, 7, 64, 1000, len(data)):
        body = http1.ChunkedBody(io.BufferedReader(Pieces(data, size), 256))
        assert read_all(body) == b"".join(events), size
        assert body.complete and body.reusable
    broken = data.replace(b"\r\n" + events[40] + b"\r\n", b"\r\n" + events[40] + b"XX", 1)
    body = http1.ChunkedBody(reader(broken))
    assert body.read1() == b"".join(events[:41])   # handed on up to the break, the error next
    with pytest.raises(ConnectionError, match="malformed chunked"):
        body.read1()


def test_chunked_body_with_bytes_after_its_end_is_not_reusable():
    body = http1.ChunkedBody(reader(b"2\r\nhi\r\n0\r\n\r\nGARBAGE"))
    assert read_all(body) == b"hi" and body.complete and not body.reusable


@pytest.mark.parametrize("data", [b"-5\r\nhello\r\n0\r\n\r\n", b"5\r\nhelloXX0\r\n\r\n", b"5\r\nhel",
                                  b"f" * 9000], ids=["negative", "no-crlf", "cut-short", "endless-line"])
def test_malformed_chunked_bodies_raise_connection_error(data):
    with pytest.raises(ConnectionError):
        read_all(http1.ChunkedBody(reader(data)))


def test_fixed_body():
    assert http1.FixedBody(reader(b"hello, rest"), 5).read_rest() == b"hello"
    assert http1.FixedBody(reader(b"hello"), 5).read_rest(limit=4) is None      # over the limit: not read
    assert http1.FixedBody(reader(b"hello"), None).read_rest() is None          # unknown length
    with pytest.raises(ConnectionError, match="2 bytes early"):
        http1.FixedBody(reader(b"abc"), 5).read_rest()
    body = http1.FixedBody(reader(b"abcdef"), 4)
    assert not body.reusable and read_all(body) == b"abcd" and body.reusable
    until_close = http1.FixedBody(reader(b"to the end"), None)
    assert until_close.read1() == b"to the end" and until_close.read1() == b"" and not until_close.reusable
    assert http1.FixedBody(reader(b""), 0).reusable
    with pytest.raises(ConnectionError, match="3 bytes early"):
        read_all(http1.FixedBody(reader(b"ab"), 5))


def test_header_value_ignores_letter_case():
    pairs = [("Content-Type", "a"), ("content-type", "b")]
    assert http1.header_value(pairs, "CONTENT-TYPE") == "a"
    assert http1.header_value(pairs, "x-missing", "none") == "none"


def test_parse_content_length_takes_ascii_digits_only():
    assert http1.parse_content_length("0") == 0
    assert http1.parse_content_length("1234") == 1234
    # str.isdigit() passes every one of these; int() refuses the first three and reads the others.
    for bad in ("\xb9", "\xb2", "1\xb3", "\u0663", "\uff15", "", "-1", "+1", " 1", "1 ", "1_0", "0x10", "5, 5",
                "1" * 19, "9" * 5000):
        with pytest.raises(ValueError, match="invalid Content-Length"):
            http1.parse_content_length(bad)


def test_parse_header_lines_refuses_control_characters_and_non_token_names():
    # RFC 9110 5.5: a value must not hold CR, LF or NUL; 5.1: a name is a token.
    for bad in (["X-A: one\rtwo"], ["X-A: one\x00two"], ["X-A: one\ntwo"], ["X-A: ok", "  folded\rline"]):
        with pytest.raises(ValueError, match="CR, LF or NUL"):
            http1.parse_header_lines(bad)
    for bad in (["X A: 1"], ["X\x00A: 1"], ["X\xe9: 1"], ["(x): 1"], ["X/Y: 1"], ["X@Y: 1"]):
        with pytest.raises(ValueError, match="Malformed header name"):
            http1.parse_header_lines(bad)
    names = "!#$%&'*+-.^_`|~09azAZ"
    assert http1.parse_header_lines([f"{names}: \x01 tab\there \xe9\x7f"]) == {names.lower(): "\x01 tab\there \xe9\x7f"}


def test_chunked_body_hands_on_what_it_decoded_before_a_framing_error():
    good = b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in (b"data: 1\n\n", b"data: 2\n\n"))
    body = http1.ChunkedBody(reader(good + b"zz\r\nmore\r\n"))   # all in one read
    assert body.read1() == b"data: 1\n\ndata: 2\n\n"
    with pytest.raises(ConnectionError, match="malformed chunk size"):
        body.read1()
    with pytest.raises(ConnectionError):
        body.read1()   # and it stays broken
    body = http1.ChunkedBody(reader(good + b"9\r\ndata: 3\n\nXX"))   # a chunk without its CRLF
    assert body.read1() == b"data: 1\n\ndata: 2\n\ndata: 3\n\n"
    with pytest.raises(ConnectionError, match="malformed chunked"):
        body.read1()


def test_read_deadline_bounds_the_total_wait_of_a_trickle(timeouts):
    import socket
    import threading

    ticks = iter(range(1000))
    clock = lambda: next(ticks)   # noqa: E731  one "second" per look at the clock
    left, right = socket.socketpair()
    try:
        rfile = http1.timed_reader(left, 30, 64)
        http1.set_read_deadline(rfile, 5, clock)
        stop = threading.Event()

        def trickle():
            while not stop.is_set():
                right.sendall(b"x")   # never a line end
                stop.wait(0.005)
        sender = threading.Thread(target=trickle, daemon=True)
        sender.start()
        with pytest.raises(socket.timeout):
            rfile.readline(65537)   # every byte comes within the 30 s timeout; the whole does not
        stop.set()
        sender.join()
        http1.set_read_deadline(rfile, None)   # lifted: the clock is not looked at again
        right.sendall(b"\n")
        assert rfile.readline(65537).endswith(b"\n")
    finally:
        left.close()
        right.close()


_FUZZ_ALPHABET = b"\r\n\x00\t :;,-\x7f\x80\xb9\xb2\xff0123456789abcdefABCDEF"


@pytest.mark.parametrize("seed", range(3))
def test_parsers_under_random_input_only_ever_refuse_cleanly(seed):
    """Seeded, bounded fuzzing of each parser: a value or its documented error, nothing else."""
    import random
    rng = random.Random(seed)

    def noise(n):
        return bytes(rng.choice(_FUZZ_ALPHABET) if rng.random() < 0.7 else rng.randrange(256) for _ in range(n))

    for _ in range(400):
        lines = [noise(rng.randrange(0, 30)).decode("latin-1") for _ in range(rng.randrange(1, 6))]
        try:
            headers = http1.parse_header_lines(lines)
        except ValueError:
            pass
        else:
            for name, value in headers.items():
                assert http1._TOKEN_CHARS.fullmatch(name) and name
                assert not set(value) & {"\r", "\n", "\0"}
        try:
            assert http1.parse_chunk_size(noise(rng.randrange(0, 20))) >= 0
        except ValueError:
            pass
        text = noise(rng.randrange(0, 6)).decode("latin-1")
        try:
            assert http1.parse_content_length(text) == int(text) and text.isascii()
        except ValueError:
            pass
        data = noise(rng.randrange(0, 200))
        for trickle in (False, True):
            try:
                http1.read_head_lines(reader(data, trickle), 10, max_line=50)
            except ValueError:   # HeadTooLarge included
                pass
            body = http1.ChunkedBody(reader(data, trickle))
            try:
                for _ in range(len(data) + 2):
                    if body.complete:
                        break
                    body.read1()
            except ConnectionError:
                pass
