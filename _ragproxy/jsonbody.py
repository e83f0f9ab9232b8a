"""Reading a request's JSON body, and editing it without re-encoding what did not change.

json_object_of parses a body or says, as a 400, what is wrong with it;
json_object_with_members does the same and finds the body's Members in the
same pass, for a request retrieval will read (leading_model, the model a
body names first, read without parsing, tells which one to use).
with_model and with_edits put a renamed model or injected context into the
body as the client sent it: every byte not edited goes upstream unchanged,
which is both cheaper than encoding the payload again and faithful to the
client's numbers and escapes.  Members finds where a body's members lie
once, for both the splice and raw_entries (the client's own text of a
conversation's first entries, which the turn key hashes).  ParseMemo keeps
the parsed values of recent bodies' large members and entries, so a body
that repeats them (every round of an agent loop repeats the conversation so
far, its tools and its system prompt) has them shared instead of parsed.

May import: api, http1.
"""
from __future__ import annotations

import json
import marshal
import operator
import re
import threading
from collections import OrderedDict

from .api import ClientError, json_bytes, json_text
from .http1 import BodyParts

# json.loads wraps this scanner in three Python-level calls and two regex
# matches; a request body that is one bare object needs none of them.
_scan_json = json.JSONDecoder().scan_once


def json_object_of(body):
    """The JSON object in a request body; ClientError 400 saying what is wrong otherwise."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ClientError(400, f"request body is not valid UTF-8 (byte {exc.start})") from None
    try:
        payload, end = _scan_json(text, 0)
    except (StopIteration, ValueError, RecursionError):
        end = -1
    if end != len(text):  # surrounding whitespace, or not JSON: the full parser judges and explains
        try:
            payload = json.loads(text)
        except ValueError as exc:
            raise ClientError(400, f"request body is not valid JSON: {exc}") from None
        except RecursionError:
            raise ClientError(400, "request body is not valid JSON: nested too deeply") from None
    if not isinstance(payload, dict):
        raise ClientError(400, "request body must be a JSON object")
    return payload


# A body that names its model first: Claude Code, Codex and the Anthropic SDK
# send them so.  Run only on a body _json_object_of accepted.
_LEADING_MODEL = re.compile(rb'[ \t\r\n]*\{[ \t\r\n]*"model"[ \t\r\n]*:[ \t\r\n]*("(?:[^"\\]|\\.)*")')


def leading_model(body):
    """The "model" a body names first, when it begins with that key (Claude Code, Codex and the
    SDKs send it so), else None; read without parsing the body.

    A guess to choose how to parse by (json_object_with_members for a model
    with knowledge bases): a body that repeats the key has the last one count,
    so the parsed payload, not this, says which model was asked for.
    """
    found = _LEADING_MODEL.match(body)
    if found is None:
        return None
    try:
        model = json.loads(found.group(1))
    except ValueError:   # an escape json refuses: the parser will say so
        return None
    return model if isinstance(model, str) else None


def with_model(body, model, new_model):
    """``body`` with its top-level "model" value ``model`` replaced by ``new_model``; None
    when the body does not begin with that key and value.

    Every other byte goes upstream as the client sent it.  Serializing the
    whole payload again, the alternative, costs about 0.4 ms for a 100 KB
    conversation and rewrites numbers and escapes the client chose.  Only the
    first key is looked at: if its value is not the one parsed (a client that
    repeats the key has the last one count), the answer is None.
    """
    found = _LEADING_MODEL.match(body)
    if found is None or json.loads(found.group(1)) != model:
        return None
    return b"".join((body[:found.start(1)], json_bytes(new_model), body[found.end(1):]))


_JSON_SPACE = re.compile(r"[ \t\r\n]*")
_BLANK = frozenset(" \t\r\n")
# A lone surrogate: a client can send one only as an escape ("\ud800"), which
# json parses into a str that UTF-8 cannot encode.
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def _json_members(text, pos, expand=(), values=None, memo=None, slot=None):
    """Where the members of the JSON object or array at ``text[pos]`` lie, and where it closes.

    An object gives ``({key: (start, end)}, close)`` with the span of each
    value, an array ``([(start, end), ...], close)``.  An object member named
    in ``expand`` whose value is an array has its entries' spans too:
    ``(start, end, entries)``.  None for an object that repeats a key: the
    parsed value is the last one, and which bytes to edit is then a guess.
    ``text`` must be JSON the parser accepted; this only finds boundaries,
    letting json's C scanner step over each value.

    ``values``, a dict for an object (a list for an array), receives the
    parsed values as well, and the text is then checked as it goes: a colon,
    comma or bracket out of place is a ValueError (json_object_with_members).
    With ``values``, a ParseMemo ``memo`` gives the values it holds and
    keeps the ones parsed; ``slot`` names an array's entries in it (the key
    the array is the value of, in a tuple).
    """
    space = _JSON_SPACE.match
    blank = _BLANK   # compact JSON has no space to skip: test a character before matching
    is_object = text[pos] == "{"
    closer = "}" if is_object else "]"
    members = {} if is_object else []
    pos += 1
    if text[pos] in blank:
        pos = space(text, pos).end()
    if text[pos] in "}]":
        if values is not None and text[pos] != closer:
            raise ValueError("mismatched bracket")
        return members, pos
    run = memo.run(text, pos, slot) if memo is not None and not is_object else None
    known, known_size = (len(run[1]), run[3]) if run is not None else (0, 0)
    while True:
        if is_object:
            if values is not None and text[pos] != '"':
                raise ValueError("a key must be a string")
            key, pos = _scan_json(text, pos)
            if text[pos] in blank:
                pos = space(text, pos).end()
            if values is not None and text[pos] != ":":
                raise ValueError("no colon after a key")
            pos += 1  # past the colon
            if text[pos] in blank:
                pos = space(text, pos).end()
            if key in members:
                return None
            if key in expand and text[pos] == "[":
                entries_values = [] if values is not None else None
                entries, end = _json_members(text, pos, (), entries_values, memo, (key,))
                end += 1
                members[key] = (pos, end, entries)
                value = entries_values
            else:
                value, end = _scan_json(text, pos) if memo is None else memo.scan(text, pos, key)
                members[key] = (pos, end)
            if values is not None:
                values[key] = value
        elif run is not None:   # the entries a run holds, at once
            run_values, spans, end, _ = run
            members.extend(spans)
            values.extend(run_values)
            run = None
        else:
            value, end = _scan_json(text, pos) if memo is None else memo.scan(text, pos, slot)
            members.append((pos, end))
            if values is not None:
                values.append(value)
        pos = end
        if text[pos] in blank:
            pos = space(text, pos).end()
        if text[pos] != ",":
            if values is not None and text[pos] != closer:
                raise ValueError("no comma or closing bracket after a value")
            if memo is not None and not is_object:
                memo.keep_run(text, members, values, slot, known, known_size)
            return members, pos
        pos += 1
        if text[pos] in blank:
            pos = space(text, pos).end()


class Members:
    """Where the top-level members of a request body lie, found once per request.

    ``spans`` is what _json_members gives for the body's object (None when it
    repeats a key), with the entries of the arrays named in ``expand``.  The
    turn key (raw_entries) and the splice (with_edits) both need them, and
    finding them is one more pass of json's scanner over the whole body, so a
    request that needs both pays it once.  ``body`` must be one
    json_object_of accepted.
    """

    def __init__(self, body, expand=(), text=None, found=()):
        self.body = body
        self.text = body.decode("utf-8") if text is None else text
        self.expand = frozenset(expand)
        if found == ():   # not found yet (json_object_with_members passes what it found)
            found = _json_members(self.text, _JSON_SPACE.match(self.text).end(), self.expand)
        self.spans, self.close = found if found is not None else (None, None)
        # An ASCII body's text indices are its byte offsets: slices of it need no encoding.
        self.ascii = len(self.text) == len(body)


# ParseMemo's defaults: how much text and values it holds in all, and the
# shortest value worth keeping (chosen when a hit was a marshal copy, which a
# short value's parse beat; the runs of entries cover short entries anyway).
PARSE_MEMO_BYTES = 32 << 20
PARSE_MEMO_MIN_CHARS = 512
# The smallest body worth reading through a memo whatever it is for: below it
# the plain parse is cheaper than the walk that finds the members (measured
# with shared values: 13.6 against 15.2 us at 16 KB, 26.0 against 15.9 at 32 KB).
PARSE_MEMO_MIN_BODY = 16 << 10
# How much of a value's text names its records: the rest is compared, not hashed.
_MEMO_HEAD = 128
# Records kept under one name: Claude Code opens every human turn with the same
# reminder, so entries of one conversation, and conversations, share a head.
_MEMO_ALTERNATIVES = 4
# The newest entries a run leaves out: clients mark them for prompt caching,
# and the next round moves the mark on.
_RUN_LEAVES_OUT = 2
# What a value a record can hold begins with: each closes with its own bracket or quote.
_MEMO_OPENERS = frozenset('{["')


class ParseMemo:
    """Parsed values of recent request bodies, for the next body that repeats their text.

    Each round of an agent loop sends the whole conversation again, with the
    same tools and system prompt, and one or two entries more: parsing it all
    again is most of what reading such a body costs.  A record is the value
    of one top-level member, one entry of an expanded array, or a run: an
    expanded array's entries from the first to all but the newest
    _RUN_LEAVES_OUT, which the next round of that conversation begins with.
    Records are filed under the first _MEMO_HEAD characters of their text and
    used only where the body's text at that point starts with the whole of a
    record's text.  An object, array or string closes with its own bracket
    or quote, so that text is the value there, exactly: nothing that differs
    can be mistaken for it.

    A record's value is shared, not copied: every body that repeats it gets
    the same objects (a copy per use cost a third of the proxy's CPU on a
    Claude Code body).  So a parsed payload's lists and dicts are read-only
    below its top level, which is the request's own: whatever edits one
    (inject) puts a copy in its place (copy on write).  The top-level object
    and an expanded array's list are new for every body.  With ``check``
    (the test suite's RAGPROXY_CHECK_SHARED), each record keeps its value's
    marshal form too, and a use or verify() that finds the value changed
    raises SharedValueEdited: an edit in place is a bug, and a silent one
    in production, where a later request would read the edited value.
    Records go, oldest first, once their text and values pass ``max_bytes``
    (a value's memory estimated from its text, _value_bytes).  ``reused``
    counts the values used instead of parsed (a statistic: unlocked, so
    approximate under concurrency).
    """

    def __init__(self, max_bytes=PARSE_MEMO_BYTES, min_chars=PARSE_MEMO_MIN_CHARS, check=False):
        self.max_bytes, self.min_chars, self.check = max_bytes, min_chars, check
        self.size = 0       # bytes held: text and values
        self.reused = 0
        # (slot, head) or (slot, "run", head) -> records (text, value, size, for a run a list of
        # one (start, entry spans), where it lay last, else None; marshal form or None), newest first
        self._records = OrderedDict()
        self._lock = threading.Lock()

    def held_bytes(self):
        """The bytes its records hold, counted afresh from their texts: what ``size``, a running
        total of what each record was counted as when kept, should say."""
        with self._lock:
            texts = [record[0] for records in self._records.values() for record in records]
        return sum(len(text) + _value_bytes(text) for text in texts)

    def scan(self, text, pos, slot):
        """``(value, end)`` for the JSON value at ``text[pos]``, as json's scanner gives it.

        ``slot`` names where the value is: a top-level key, or ``(key,)`` for
        the entries of the array under it.
        """
        if text[pos] not in _MEMO_OPENERS:   # a number or literal: nothing to look up or keep
            return _scan_json(text, pos)
        head = text[pos:pos + _MEMO_HEAD]
        for record in self._records.get((slot, head), ()):
            if text.startswith(record[0], pos):
                self.reused += 1
                return self._value(record, slot), pos + len(record[0])
        value, end = _scan_json(text, pos)
        if end - pos >= self.min_chars:
            self._keep((slot, head), text[pos:end], value)
        return value, end

    def run(self, text, pos, slot):
        """``(values, spans, end, size)`` of the longest run that the array entries from ``text[pos]``
        begin with, or None; ``spans`` are the entries' (start, end), ``size`` what the run's record
        counts as holding (keep_run's ``known_size``)."""
        best = None
        for record in self._records.get((slot, "run", text[pos:pos + _MEMO_HEAD]), ()):
            if (best is None or len(record[0]) > len(best[0])) and text.startswith(record[0], pos):
                best = record
        if best is None:
            return None
        placed = best[3]
        at, spans = placed[0]   # one read: another thread may place the run meanwhile
        self.reused += len(spans)
        if pos != at:   # the run lies elsewhere in this body: its spans move, and stay where it is now
            shift = pos - at
            spans = tuple([(start + shift, end + shift) for start, end in spans])
            placed[0] = (pos, spans)
        return self._value(best, slot), spans, pos + len(best[0]), best[2]

    def keep_run(self, text, spans, values, slot, known=0, known_size=0):
        """Keep the run of an array's entries (``spans`` and parsed ``values``, in order) but its
        newest, unless it is no longer than the ``known`` entries a run gave (of ``known_size``)."""
        count = len(spans) - _RUN_LEAVES_OUT
        if count <= max(known, 1):
            return
        start, end = spans[0][0], spans[count - 1][1]
        if end - start >= self.min_chars:
            # Every round of an agent loop keeps a run one round longer than the one it began
            # with: only the entries after that one are counted (a count over the whole text
            # was three quarters of what parsing a 200 KB round cost).
            after = spans[known - 1][1] if known else start
            size = known_size + (end - after) + _value_bytes(text, after, end)
            # The spans as they lie in this body: the next round of a conversation most often
            # puts its entries where this one did, and then takes them as they are.
            self._keep((slot, "run", text[start:start + _MEMO_HEAD]), text[start:end], values[:count],
                       [(start, tuple(spans[:count]))], size)

    def _keep(self, key, text, value, spans=None, size=None):
        blob = None
        if self.check:
            try:   # before any rewriter can edit the value: it is the parse of ``text``
                blob = marshal.dumps(value, _CHECK_MARSHAL)
            except ValueError:   # nested deeper than marshal goes: nothing to check it against
                return
        size = len(text) + _value_bytes(text) if size is None else size
        if size > self.max_bytes // 4:   # one huge value would push out everything else
            return
        with self._lock:
            kept = self._records.pop(key, ())
            self.size -= sum(record[2] for record in kept)
            # A record this one's text starts with is one it makes redundant: a run the array outgrew.
            kept = ((text, value, size, spans, blob),) + tuple(r for r in kept if not text.startswith(r[0]))
            kept = kept[:_MEMO_ALTERNATIVES]
            self._records[key] = kept
            self.size += sum(record[2] for record in kept)
            while self.size > self.max_bytes:
                self.size -= sum(record[2] for record in self._records.popitem(last=False)[1])

    def _value(self, record, slot):
        if self.check:
            self._verify(record, slot)
        return record[1]

    @staticmethod
    def _verify(record, slot):
        if marshal.dumps(record[1], _CHECK_MARSHAL) != record[4]:
            raise SharedValueEdited(f"a shared parsed value under {slot!r} was edited in place "
                                    f"(its text begins {record[0][:60]!r})")

    def verify(self):
        """Raise SharedValueEdited if any record's value is no longer the parse of its text
        (only with ``check``; without it there is nothing to compare with)."""
        if not self.check:
            return
        with self._lock:
            records = [(key[0], record) for key, kept in self._records.items() for record in kept]
        for slot, record in records:
            self._verify(record, slot)


class SharedValueEdited(RuntimeError):
    """A value ParseMemo hands out to every body that repeats it was edited in place (see ParseMemo)."""


# marshal's format 2, which writes every object whole: later formats mark an object that
# several holders share as a reference, so the same value written again with one more
# holder (a request that shares it) would differ.
_CHECK_MARSHAL = 2


def _value_bytes(text, start=0, end=None):
    """What the parsed value of JSON ``text[start:end]`` holds in memory, estimated from the text alone.

    Strings and numbers take about what their text does, and a list slot 8
    bytes a value; each container costs a header more ({} and [] each 56-64
    bytes empty).  Measured (sys.getsizeof, walked): on the bench's Claude
    Code body's messages and tools this says 2.1-2.2 times the values' real
    size; on the shapes that cost the most per character, at least three
    quarters of it (a compact array of small numbers 0.75, of one-key
    objects 0.95, of empty objects 2.3): a client cannot make the memo hold
    much more than its cap.
    """
    end = len(text) if end is None else end
    return 3 * (end - start) + 160 * (text.count("{", start, end) + text.count("[", start, end))


def json_object_with_members(body, expand=(), memo=None):
    """``(payload, members)``: json_object_of's payload and the body's Members, from one pass.

    Reading the top-level members one by one, and the entries of the arrays
    in ``expand``, gives the parsed object and where each part lies at once:
    a request the turn key and the splice will read (retrieval) pays for
    one scanner pass over its body instead of two.  ``members`` is None, and
    the payload json_object_of's (or its ClientError), for a body that is
    not one plain object with each key once: surrounding whitespace is fine,
    anything the walk cannot vouch for goes to the full parser.  A
    ParseMemo ``memo`` gives the values it holds instead of parsing them.
    """
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is not None:
        start = _JSON_SPACE.match(text).end()
        values = {}
        try:
            found = _json_members(text, start, frozenset(expand), values, memo) \
                if text[start:start + 1] == "{" else None
        except (StopIteration, ValueError, IndexError, RecursionError):
            found = None
        if found is not None and text[found[1]] == "}" and _JSON_SPACE.match(text, found[1] + 1).end() == len(text):
            return values, Members(body, expand, text, found)
    return json_object_of(body), None


def raw_entries(members, key, upto=None, leave_out=None, utf8=False, within=None):
    """The body's own text of entries 0 to ``upto`` of the top-level array ``key``, from
    the first's start to the last's end (``upto`` None: the whole value of ``key``).

    Every object member named ``leave_out``, at any depth, is cut out with its
    comma, so the text is what the client's encoder would have written without
    it; ``within``, the indices of the entries that hold one, limits the search
    to them (finding nothing in the rest of a 100 KB conversation costs a scan
    of it).  None when the text cannot be told: a body that repeats a key, ``key``
    missing, not an array whose entries were found, or ``upto`` past its end.
    ``utf8``: the text encoded as UTF-8 (surrogates passed), which for an
    ASCII body is cut from the body's bytes without decoding or encoding.
    """
    text = _raw_entries(members, key, upto, leave_out, utf8 and members.ascii, within)
    if utf8 and isinstance(text, str):
        return text.encode("utf-8", "surrogatepass")
    return text


def entries_span(members, key, upto):
    """``(body, start, end)``: where entries 0 to ``upto`` of the top-level array ``key``
    lie in an ASCII body, from the first's start to the last's end, so that
    ``body[start:end]`` is raw_entries' UTF-8 text of them as sent; None for a
    body that is not ASCII, or whenever raw_entries would answer None.

    A caller that only compares that text with one it holds (the turn key's
    seen texts) does so in place, with ``body.startswith(text, start)``: a
    50 KB conversation is then read once, not copied first.
    """
    if not members.ascii or members.spans is None or key not in members.spans:
        return None
    span = members.spans[key]
    if len(span) < 3 or not 0 <= upto < len(span[2]):
        return None
    entries = span[2]
    return members.body, entries[0][0], entries[upto][1]


def entry_spans(members, key):
    """``(body, spans)``: where each entry of the top-level array ``key`` lies in an ASCII
    body, ``body[start:end]`` for each ``(start, end)`` in ``spans`` its text as sent; None
    for a body that is not ASCII, or whose entries of ``key`` were not found."""
    if not members.ascii or members.spans is None or key not in members.spans:
        return None
    span = members.spans[key]
    return (members.body, span[2]) if len(span) == 3 else None


def raw_value(members, path):
    """The body's own text of the value at ``path`` (see inject): a top-level
    member, ``(key,)``, or one entry of an expanded array, ``(key, index)``.

    Bytes cut from an ASCII body, else a str; None when it cannot be told (as
    raw_entries).  Two bodies whose texts there are equal hold equal values.
    """
    if members.spans is None or path[0] not in members.spans:
        return None
    span = members.spans[path[0]]
    start, end = span[:2]
    if len(path) > 1:
        if len(span) < 3 or not 0 <= path[1] < len(span[2]):
            return None
        start, end = span[2][path[1]]
    return (members.body if members.ascii else members.text)[start:end]


def _raw_entries(members, key, upto, leave_out, from_body, within):
    if members.spans is None or key not in members.spans:
        return None
    span = members.spans[key]
    start, end = span[:2]
    if upto is not None:
        if len(span) < 3 or not 0 <= upto < len(span[2]):
            return None
        start, end = span[2][0][0], span[2][upto][1]
    text = members.text
    source = members.body if from_body else text
    if leave_out is None:
        return source[start:end]
    if within is None or len(span) < 3:
        cuts = [(start, end)]
    else:
        entries = span[2]
        cuts = [entries[n] for n in sorted(set(within)) if 0 <= n < len(entries) and entries[n][1] <= end]
    pieces, pos = [], start
    for cut_start, cut_end in cuts:
        if text.find('"%s"' % leave_out, cut_start, cut_end) >= 0:
            pieces += (source[pos:cut_start], _without_members(text, cut_start, cut_end, leave_out, source))
            pos = cut_end
    if not pieces:
        return source[start:end]
    pieces.append(source[pos:end])
    return source[:0].join(pieces)


def _without_members(text, start, end, name, source=None):
    """``text[start:end]`` without the members named ``name``.

    An unescaped ``"name"`` followed by a colon is that key: a quote inside a
    JSON string is always escaped, and valid JSON puts no quote right after a
    string's closing one, so such a quote opens a string, and one followed by
    a colon is a key.  ``source``, the same text as bytes (an ASCII body), gives the pieces.
    """
    source = text if source is None else source
    space = _JSON_SPACE.match
    quoted = '"%s"' % name
    pieces, pos, at = [], start, start - 1
    while True:   # str.find, not a regex: it skips the text between the markers at memchr speed
        at = text.find(quoted, at + 1, end)
        if at < 0:
            break
        colon = space(text, at + len(quoted)).end()
        if at < pos or text[colon] != ":":   # inside a member already cut out, or not a key
            continue
        back = at
        while text[back - 1] == "\\":
            back -= 1
        if (at - back) % 2:   # an escaped quote: inside a string
            continue
        _, value_end = _scan_json(text, space(text, colon + 1).end())
        after = space(text, value_end).end()
        if text[after] == ",":   # a later member follows: cut up to it
            cut_from, cut_to = at, space(text, after + 1).end()
        else:   # the last member: from the comma before it; the only one: all inside the braces
            before = at
            while text[before - 1] in " \t\r\n":
                before -= 1
            if text[before - 1] == ",":
                cut_from, cut_to = before - 1, value_end
            else:
                cut_from, cut_to = before, after
        pieces.append(source[pos:cut_from])
        pos = cut_to
    pieces.append(source[pos:end])
    return source[:0].join(pieces)


# A stand-in for a long string whose JSON text is known already (json_text_with).  Its
# escape has no proper prefix that is also a suffix, so two occurrences never overlap.
PLACEHOLDER = "\x00"
_PLACEHOLDER_JSON = "\\u0000"


def json_text_with(value, escaped):
    """json_text(value), where PLACEHOLDER, once in the strings of ``value``, stands
    for a string whose JSON text without its quotes is ``escaped``; None when the
    placeholder's escape is not there exactly once (a NUL of the client's own).

    Encoding a string costs about 3 ns a character (json's C encoder, Python 3.11):
    the context an agent loop's every round injects again is encoded once.
    """
    text = json_text(value)
    if text.count(_PLACEHOLDER_JSON) != 1:
        return None
    return text.replace(_PLACEHOLDER_JSON, escaped, 1)


def with_edits(body, payload, paths, members=None, encoded=None, parts=False):
    """``body`` with the values at ``paths`` (see inject) encoded again from ``payload``;
    None when a path cannot be placed, and the whole payload must be encoded.

    Everything else goes upstream byte for byte, as in _with_model.  Finding
    the spans takes one more pass of json's C scanner, a fifth of what
    encoding a Claude Code body again costs (bench/request_body.py), and an
    injection changes one message or the system prompt of a body that is
    mostly earlier turns and tool definitions.  A body nested so deeply that
    json, which parsed it, cannot encode it again is a ClientError (400).
    ``members``, a Members of ``body`` found already (by the turn key), spares
    that pass when it has the entries the paths name.  ``encoded`` maps a path
    to (value, its JSON text) where the text is known: used while ``payload``
    holds that very value there.  ``parts``: an ASCII body's splice is an
    http1.BodyParts (views of ``body`` between the new texts), not joined
    into one bytes object; only the upstream client reads it.
    """
    try:
        return _with_edits(body, payload, paths, members, encoded, parts)
    except RecursionError:  # nesting that json parsed with a few levels to spare, and cannot encode
        raise ClientError(400, "request body is nested too deeply") from None


_start_of = operator.itemgetter(0)


def _with_edits(body, payload, paths, members=None, encoded=None, parts=False):
    expand = {path[0] for path in paths if len(path) > 1}
    if members is None or members.body is not body or not expand <= members.expand:
        members = Members(body, expand)
    if members.spans is None:
        return None
    text, spans, close = members.text, members.spans, members.close
    last = None   # where new members go: after the last one, looked for when there is one
    edits = []  # (start, end, new text), for splicing in order
    for path in dict.fromkeys(paths):
        key = path[0]
        if key not in payload:
            return None
        value = payload[key]
        if key not in spans:  # a member the body did not have goes last
            if len(path) > 1:
                return None
            if last is None:
                last = max((span[1] for span in spans.values()), default=close)
            edits.append((last, last, ("," if spans else "") + json_text(key) + ":" + json_text(value)))
            continue
        span = spans[key]
        start, end = span[:2]
        if len(path) > 1:  # one entry of a list that kept its length
            if len(span) < 3 or not isinstance(value, list):
                return None
            entries = span[2]
            if len(entries) != len(value) or not 0 <= path[1] < len(entries):
                return None
            start, end = entries[path[1]]
            value = value[path[1]]
        known = encoded.get(path) if encoded else None
        edits.append((start, end, known[1] if known is not None and known[0] is value else json_text(value)))
    if len(edits) > 1:   # one, the usual injection, is in order already
        edits.sort(key=_start_of)
        if any(start < end for (_, end, _), (start, _, _) in zip(edits, edits[1:])):
            return None   # a whole value and an entry of it both named: nothing to gain
    if members.ascii:   # the body's own bytes between the edits, as they came
        try:
            news = [new.encode("utf-8") for _, _, new in edits]
        except UnicodeEncodeError:
            news = None
        if news is not None:
            # Views, not slices: a slice would copy the body once more before the join does.
            view, pieces, pos = memoryview(body), [], 0
            for (start, end, _), new in zip(edits, news):
                pieces += (view[pos:start], new)
                pos = end
            pieces.append(view[pos:])
            return BodyParts(pieces) if parts else b"".join(pieces)
    pieces, pos = [], 0
    for start, end, new in edits:
        pieces += (text[pos:start], new)
        pos = end
    pieces.append(text[pos:])
    spliced = "".join(pieces)
    try:
        return spliced.encode("utf-8")
    except UnicodeEncodeError:
        # Only an encoded value can hold one (the body's own text was UTF-8), and
        # there only inside a string: written as the escape again, it stays JSON.
        return _LONE_SURROGATE.sub(lambda m: "\\u%04x" % ord(m.group()), spliced).encode("utf-8")
