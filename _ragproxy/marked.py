"""Marked retrieval context (<sbproxy-retrieval> blocks) in message text: the parser and renderer.

An application that retrieves on its own marks what it retrieved, and the
compression levers (``compress``) rank, trim and compact it.  The grammar,
exactly (``NL`` is LF or CRLF, one of them throughout a block)::

    block  = "<sbproxy-retrieval>" NL query chunk* "</sbproxy-retrieval>" (NL | end of text)
    query  = "<sbproxy-query>" NL body "</sbproxy-query>" NL
    chunk  = "<sbproxy-chunk" ' id="' ID '"' [' score="' SCORE '"'] ' format="' FORMAT '"' ">" NL
             body "</sbproxy-chunk>" NL
    body   = line*          (lines that are not tag lines, each ending in NL)
    ID     = 1 to 64 of [A-Za-z0-9._-], unique within the block
    SCORE  = a JSON number, finite, in [0, 1]
    FORMAT = "text" | "json" | "sbproxy_table_v1"

* Every tag is a whole line of its own, lower-case, starting in column 1.
  A "tag line" is any line whose first non-blank characters are ``<sbproxy-``
  or ``</sbproxy-`` in any case: outside the grammar above (an orphan, a
  reordered or unknown tag, an indented or upper-case one, a block inside a
  body) it makes the text malformed.  Marker-like text inside a line is
  plain text.
* Nothing else sits between the elements of a block (no blank lines), and
  the query has at least one non-blank character.  ``id`` and ``format`` are
  required, ``score`` optional, in that attribute order.
* Limits: 32 blocks per request, 1,024 chunks per block, 4,096 in all
  (``LIMITS``); beyond them the text is "too large", not malformed.

parse(text) gives the text's segments: strings (the text between blocks,
kept byte for byte) and Block values, alternating; render(segments) joins
them again, and render(parse(text)) == text for every text parse accepts.
A body is kept exactly, including its last NL, so a block re-renders to its
own bytes; ``Chunk.text`` is the body without that NL.  Errors are
MalformedMarkedContext or MarkedContextTooLarge (both MarkedContextError),
with 1-based line and column (in characters) and what is wrong; they never
quote the text itself.

parse_request(messages, api) applies this to a request's eligible texts:
only string content of user and tool messages (``eligible_texts`` says
which, per API); marker-like text in system, developer or assistant
messages is ignored.

May import: nothing.
"""
from __future__ import annotations

import dataclasses
import math
import re

FORMATS = ("text", "json", "sbproxy_table_v1")
MAX_BLOCKS = 32             # per request
MAX_CHUNKS_PER_BLOCK = 1024
MAX_CHUNKS = 4096           # per request, all blocks together

OPEN, CLOSE = "<sbproxy-retrieval>", "</sbproxy-retrieval>"
QUERY_OPEN, QUERY_CLOSE = "<sbproxy-query>", "</sbproxy-query>"
CHUNK_CLOSE = "</sbproxy-chunk>"
_CHUNK_TAG = re.compile(r'<sbproxy-chunk((?: [a-z]+="[^"]*")*)>\Z')
_ATTRIBUTE = re.compile(r' ([a-z]+)="([^"]*)"')
_ID = re.compile(r"[A-Za-z0-9._-]{1,64}\Z")
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?\Z")
_ATTRIBUTE_ORDER = ("id", "score", "format")
_TAG_NAME = re.compile(r"</?[^ >\r]*")
# Cheap test for "could this text hold a tag line at all", run before splitting into lines.
_TAG_LINE = re.compile(r"^[ \t]*</?sbproxy-", re.I | re.M)


class MarkedContextError(ValueError):
    """Marked context that cannot be used: ``line`` and ``column`` (1-based) and ``what``."""

    def __init__(self, what, line, column):
        super().__init__("line %d, column %d: %s" % (line, column, what))
        self.what, self.line, self.column = what, line, column


class MalformedMarkedContext(MarkedContextError):
    """Text that does not follow the block grammar."""


class MarkedContextTooLarge(MarkedContextError):
    """More blocks or chunks than the limits allow."""


@dataclasses.dataclass(frozen=True)
class Chunk:
    id: str
    score_text: str | None   # the attribute as written, so the tag re-renders to its own bytes
    format: str
    body: str                # every line between the tags, each with its NL ("" when there are none)

    @property
    def score(self):
        return None if self.score_text is None else float(self.score_text)

    @property
    def text(self):
        """The body without its final line ending."""
        return _strip_newline(self.body)

    def tag(self):
        score = "" if self.score_text is None else ' score="%s"' % self.score_text
        return '<sbproxy-chunk id="%s"%s format="%s">' % (self.id, score, self.format)


@dataclasses.dataclass(frozen=True)
class Block:
    query_body: str              # as Chunk.body
    chunks: tuple                # of Chunk
    newline: str = "\n"          # "\n" or "\r\n"
    final_newline: bool = True   # False when the closing tag ends the text

    @property
    def query(self):
        return _strip_newline(self.query_body)

    def with_chunks(self, chunks):
        return dataclasses.replace(self, chunks=tuple(chunks))


def _strip_newline(body):
    if body.endswith("\r\n"):
        return body[:-2]
    return body[:-1] if body.endswith("\n") else body


def render_block(block):
    nl = block.newline
    out = [OPEN, nl, QUERY_OPEN, nl, block.query_body, QUERY_CLOSE, nl]
    for chunk in block.chunks:
        out += [chunk.tag(), nl, chunk.body, CHUNK_CLOSE, nl]
    out.append(CLOSE + nl if block.final_newline else CLOSE)
    return "".join(out)


def render(segments):
    """The text of ``segments`` (strings and Blocks), as parse gave them or edited."""
    return "".join(s if isinstance(s, str) else render_block(s) for s in segments)


def has_blocks(segments):
    return any(isinstance(s, Block) for s in segments)


def parse(text, max_blocks=MAX_BLOCKS, max_chunks=MAX_CHUNKS):
    """Segments of ``text``: ``[str, Block, str, ..., str]`` (``[text]`` with no blocks).

    ``max_blocks`` and ``max_chunks`` are what the request has left of its
    limits (parse_request passes them on from one text to the next).
    Raises MalformedMarkedContext or MarkedContextTooLarge.
    """
    if not _TAG_LINE.search(text):
        return [text]
    return _Parser(text, max_blocks, max_chunks).run()


class _Parser:
    """One pass over the lines of a text; every error names the line it is on."""

    def __init__(self, text, max_blocks, max_chunks):
        self.text = text
        self.lines = text.split("\n")   # str.splitlines would split on \v, \x1c, U+2028 ... too
        self.max_blocks, self.max_chunks = max_blocks, max_chunks
        self.i = 0                      # index of the next line

    def fail(self, what, line, column=1, error=MalformedMarkedContext):
        raise error(what, line + 1, column)

    def run(self):
        segments, text_start, offset = [], 0, 0
        blocks = 0
        while self.i < len(self.lines):
            line = self.lines[self.i]
            if _is_tag_line(line):
                if _content(line) != OPEN:
                    self.check_tag(line, self.i, "a tag outside any <sbproxy-retrieval> block")
                if blocks == self.max_blocks:
                    self.fail("more than %d marked blocks in the request" % MAX_BLOCKS, self.i,
                              error=MarkedContextTooLarge)
                blocks += 1
                first, start = self.i, offset
                block = self.block()
                segments += [self.text[text_start:start], block]
                # The block's own lines, each with its LF (the last may have none: min).
                offset = min(len(self.text), start + sum(len(piece) + 1 for piece in self.lines[first:self.i]))
                text_start = offset
                continue
            offset += len(line) + 1
            self.i += 1
        segments.append(self.text[text_start:])
        return segments

    def check_tag(self, line, i, out_of_place):
        """Fail with the most useful reason for a tag line that is not the one expected here."""
        indent = len(line) - len(line.lstrip(" \t"))
        if indent:
            self.fail("a tag must start in column 1", i, indent + 1)
        tag = _content(line)
        name = _TAG_NAME.match(tag).group()
        if name != name.lower():
            self.fail("tags are lower-case", i)
        if tag.endswith("\r"):
            self.fail("a carriage return that is not part of a line ending", i, len(tag))
        if name == "<sbproxy-chunk":
            self.chunk_attributes(tag, i)
        elif tag not in (OPEN, CLOSE, QUERY_OPEN, QUERY_CLOSE, CHUNK_CLOSE):
            known = name + ">" in (OPEN, CLOSE, QUERY_OPEN, QUERY_CLOSE, CHUNK_CLOSE) or name == "<sbproxy-chunk"
            self.fail("characters after the tag" if known else "unknown tag", i, len(name) + 2 if known else 1)
        self.fail(out_of_place, i)

    def newline_of(self, i):
        """The line ending of line ``i``, which must exist."""
        if i + 1 >= len(self.lines):
            self.fail("the block is not closed", i, len(self.lines[i]) + 1)
        return "\r\n" if self.lines[i].endswith("\r") else "\n"

    def ending_matches(self, i, nl):
        line = self.lines[i]
        if i + 1 >= len(self.lines):
            self.fail("the block is not closed", i, len(line) + 1)
        if (nl == "\r\n") != line.endswith("\r"):
            # The column of the CR that should not be there, or of where the missing one belongs.
            self.fail("line endings change within the block (%s then %s)"
                      % (_name(nl), _name("\n" if nl == "\r\n" else "\r\n")), i, len(line) + (nl == "\r\n"))

    def block(self):
        opened = self.i
        nl = self.newline_of(opened)
        self.i += 1
        if self.i >= len(self.lines) or _content(self.lines[self.i]) != QUERY_OPEN:
            if self.i < len(self.lines) and _is_tag_line(self.lines[self.i]):
                self.ending_matches(self.i, nl)
                self.check_tag(self.lines[self.i], self.i, "a block starts with its <sbproxy-query>")
            self.fail("a block starts with its <sbproxy-query>", min(self.i, len(self.lines) - 1))
        self.ending_matches(self.i, nl)
        query_line = self.i
        query = self.body(nl, QUERY_CLOSE)
        if not query.strip():
            self.fail("the query is empty", query_line + 1)
        chunks, ids = [], set()
        while True:
            i = self.i
            if i >= len(self.lines):
                self.fail("the block is not closed", len(self.lines) - 1, len(self.lines[-1]) + 1)
            line = self.lines[i]
            tag = _content(line)
            if line == CLOSE and i == len(self.lines) - 1:   # the block ends the text
                self.i = i + 1
                return Block(query, tuple(chunks), nl, False)
            if tag == CLOSE:
                self.ending_matches(i, nl)
                self.i = i + 1
                return Block(query, tuple(chunks), nl, True)
            if i == len(self.lines) - 1 and not line:
                self.fail("the block is not closed", i)
            if not _is_tag_line(line):
                self.fail("text between the elements of a block", i)
            self.ending_matches(i, nl)
            if not (tag.startswith("<") and _TAG_NAME.match(tag).group() == "<sbproxy-chunk"):
                self.check_tag(line, i, "expected <sbproxy-chunk ...> or </sbproxy-retrieval>")
            chunk_id, score, fmt = self.chunk_attributes(tag, i)
            if chunk_id in ids:
                self.fail("duplicate chunk id", i, len('<sbproxy-chunk id="') + 1)
            if len(chunks) == MAX_CHUNKS_PER_BLOCK:
                self.fail("more than %d chunks in one block" % MAX_CHUNKS_PER_BLOCK, i,
                          error=MarkedContextTooLarge)
            if self.max_chunks == 0:
                self.fail("more than %d chunks in the request" % MAX_CHUNKS, i, error=MarkedContextTooLarge)
            self.max_chunks -= 1
            ids.add(chunk_id)
            chunks.append(Chunk(chunk_id, score, fmt, self.body(nl, CHUNK_CLOSE)))

    def chunk_attributes(self, tag, i):
        if not _CHUNK_TAG.match(tag):
            self.fail("a chunk tag is <sbproxy-chunk id=\"...\" score=\"...\" format=\"...\">", i)
        found, column = {}, len("<sbproxy-chunk") + 1
        for m in _ATTRIBUTE.finditer(tag, len("<sbproxy-chunk")):
            name, value = m.group(1), m.group(2)
            column = m.start() + 2
            if name not in _ATTRIBUTE_ORDER:
                self.fail("unknown chunk attribute", i, column)
            if name in found:
                self.fail("repeated chunk attribute", i, column)
            if any(_ATTRIBUTE_ORDER.index(name) < _ATTRIBUTE_ORDER.index(seen) for seen in found):
                self.fail("chunk attributes go in the order id, score, format", i, column)
            found[name] = value
            value_column = column + len(name) + 2
            if name == "id" and not _ID.match(value):
                self.fail("a chunk id is 1 to 64 of A-Z a-z 0-9 . _ -", i, value_column)
            if name == "score" and not _is_score(value):
                self.fail("a score is a finite number in [0, 1]", i, value_column)
            if name == "format" and value not in FORMATS:
                self.fail("format is text, json or sbproxy_table_v1", i, value_column)
        for name in ("id", "format"):
            if name not in found:
                self.fail("a chunk tag needs %s=\"...\"" % name, i, len(tag))
        return found["id"], found.get("score"), found["format"]

    def body(self, nl, closing):
        """The lines after the opening tag (line self.i) up to ``closing``, which is consumed."""
        self.i += 1
        start = self.i
        while True:
            if self.i >= len(self.lines):
                self.fail("%s is missing" % closing, len(self.lines) - 1, len(self.lines[-1]) + 1)
            line = self.lines[self.i]
            if _is_tag_line(line):
                self.ending_matches(self.i, nl)
                if _content(line) != closing:
                    self.check_tag(line, self.i, "expected %s (blocks do not nest)" % closing)
                body = self.lines[start:self.i]
                self.i += 1
                return "".join(piece + "\n" for piece in body)
            self.ending_matches(self.i, nl)
            self.i += 1


def _content(line):
    """A line without the CR of a CRLF ending (split on LF left it there)."""
    return line[:-1] if line.endswith("\r") else line


def _is_tag_line(line):
    head = line.lstrip(" \t")[:10].lower()
    return head.startswith("<sbproxy-") or head.startswith("</sbproxy-")


def _is_score(value):
    if not _NUMBER.match(value):
        return False
    number = float(value)
    return math.isfinite(number) and 0.0 <= number <= 1.0


def _name(nl):
    return "CRLF" if nl == "\r\n" else "LF"


# Which texts of a request may hold marked context.  ``api`` is the request
# format's name as ``inject`` spells it: chat, ollama_chat, messages, responses.
APIS = ("chat", "ollama_chat", "messages", "responses")
_ROLES = {"chat": ("user", "tool"), "ollama_chat": ("user", "tool"), "messages": ("user",),
          "responses": ("user",)}
_RESPONSES_TOOL_OUTPUTS = ("function_call_output", "custom_tool_call_output")


def eligible_texts(messages, api):
    """``[(path, text)]``: the strings of ``messages`` that may hold marked context, in order.

    ``messages`` is the conversation list (``messages``; for Responses the
    ``input``, which may be a bare string: path ``()``).  A path indexes into
    it: ``(3, "content")``; an Anthropic tool_result in a user message is
    ``(3, "content", 0, "content")``; a Responses function_call_output is
    ``(5, "output")``.  Only string values count: text parts in content
    lists, images and the like are not marked context.
    """
    if api not in APIS:
        raise ValueError("unknown API %r" % (api,))
    if isinstance(messages, str):
        return [((), messages)] if api == "responses" else []
    if not isinstance(messages, list):
        return []
    roles, out = _ROLES[api], []
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            continue
        if api == "responses" and message.get("type") in _RESPONSES_TOOL_OUTPUTS:
            if isinstance(message.get("output"), str):
                out.append(((i, "output"), message["output"]))
            continue
        if message.get("role") not in roles or (api == "responses" and message.get("type", "message") != "message"):
            continue
        content = message.get("content")
        if isinstance(content, str):
            out.append(((i, "content"), content))
        elif api == "messages" and isinstance(content, list):
            # An Anthropic tool result is the tool message of that API.
            for j, part in enumerate(content):
                if isinstance(part, dict) and part.get("type") == "tool_result" \
                        and isinstance(part.get("content"), str):
                    out.append(((i, "content", j, "content"), part["content"]))
    return out


@dataclasses.dataclass(frozen=True)
class RequestContext:
    """What parse_request found: ``status`` is none, ok, malformed or too_large."""
    status: str
    texts: tuple = ()            # ((path, segments), ...) for the texts holding blocks, when ok
    error: MarkedContextError | None = None
    where: tuple | None = None   # the path of the text the error is in

    def describe(self):
        """The error as one line with no request text in it (paths and positions only)."""
        if self.error is None:
            return self.status
        return "%s at %s, %s" % (self.status, "/".join(map(str, self.where)) or "input", self.error)


def parse_request(messages, api):
    """The marked context of a request's conversation, as a RequestContext; never raises MarkedContextError."""
    blocks_left, chunks_left, texts = MAX_BLOCKS, MAX_CHUNKS, []
    for path, text in eligible_texts(messages, api):
        try:
            segments = parse(text, blocks_left, chunks_left)
        except MarkedContextTooLarge as exc:
            return RequestContext("too_large", error=exc, where=path)
        except MalformedMarkedContext as exc:
            return RequestContext("malformed", error=exc, where=path)
        if has_blocks(segments):
            blocks = [s for s in segments if isinstance(s, Block)]
            blocks_left -= len(blocks)
            chunks_left -= sum(len(b.chunks) for b in blocks)
            texts.append((path, segments))
    return RequestContext("ok" if texts else "none", tuple(texts))


def replaced(messages, path, text):
    """``messages`` with the string at ``path`` replaced, copying only the containers on the way."""
    if not path:
        return text
    head, rest = path[0], path[1:]
    if isinstance(messages, list):
        out = list(messages)
    else:
        out = dict(messages)
    out[head] = replaced(messages[head], rest, text)
    return out
