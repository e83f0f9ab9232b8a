"""Where the question is and where retrieved context goes, in each request format.

Pure functions over parsed JSON bodies: extract_query (and question_text),
turn_key and continues_turn, render_context (render_chunks, fill_template,
estimate_tokens_text; line_range, how a chunk's lines are cited, which the
CLI and MCP use too), inject.  Retrieval itself happens in ``retrieval``.
Every field of a body comes from a client and may have any JSON type: a
reader that meets a list where a string belongs skips it, never fails.

A "human turn" is a user message with text a person typed: tool results
(OpenAI role "tool", Anthropic tool_result blocks, Responses *_output items)
and harness text (Claude Code <system-reminder>, Codex <environment_context>,
AGENTS.md and similar tagged fragments) do not count, and neither does a
message holding only images (Codex attaches view_image output that way, in
the middle of an agent loop).

Prompt caching: coding agents send one request per tool round, each the
previous one plus new assistant/tool messages at the end.  Every position we
write to is a function of the conversation up to the last human turn only,
and nothing before it is touched (before_last_user, new_message), so the same
text gives byte-identical prefixes round after round.  Inside the human turn
the context goes after leading harness blocks and tool results (Anthropic
requires tool_result blocks first) and right before the person's words.  The
system modes change the system prompt, so a new text invalidates every
cached prefix; within one turn it is still stable.  An Anthropic system
block list keeps its order: Claude Code's first block is a per-request
billing header that must stay first, so system_prepend inserts after it.

Queries are capped in UTF-8 bytes at a character boundary, preferring a
whitespace boundary so identifiers and paths stay whole.  One turn keeps its
start and its end ("why does this fail?" may follow a pasted traceback whose
last line matters most); all_user keeps the most recent text.

May import: nothing (the standard library only).
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import re

# "[3] numpy/linalg/_linalg.py:362-389 (solve)": what DEFAULT_INJECT_TEMPLATE
# (config) tells the model to cite by, so the two change together.
DEFAULT_CHUNK_TEMPLATE = "[{index}] {citation}\n{content}"
INJECT_MODES = ("before_last_user", "system_prepend", "system_append", "new_message")
QUERY_SOURCES = ("last_user", "last_message", "all_user")
# The sources whose words lie within turn_key's prefix (up to the last human turn): every
# round of a turn asks the same query.  last_message reads the newest entry, in a later
# round a tool result.
PREFIX_QUERY_SOURCES = frozenset(("last_user", "all_user"))


@dataclasses.dataclass(frozen=True)
class _InjectFormat:
    turns: str            # payload key of the conversation (a list) or of a bare prompt
    text_type: str        # part type of the text part we add to a content list
    system: str           # "message" (a role=system entry) or the payload key of system text
    typed_items: bool = False  # Responses: entries are typed items, messages among them


_INJECT_FORMATS = {
    "chat": _InjectFormat("messages", "text", "message"),
    "ollama_chat": _InjectFormat("messages", "text", "message"),
    "messages": _InjectFormat("messages", "text", "system"),
    "responses": _InjectFormat("input", "input_text", "instructions", typed_items=True),
    "ollama_generate": _InjectFormat("prompt", "text", "system"),
}

_TEXT_PART_TYPES = frozenset(("text", "input_text", "output_text"))
_TOOL_PART_TYPES = frozenset(("tool_result",))
_HARNESS_TAGS = (
    "system-reminder", "local-command-caveat", "local-command-stdout", "local-command-stderr",
    "environment_context", "user_instructions", "INSTRUCTIONS", "user_shell_command",
    "turn_aborted", "subagent_notification", "skill", "hook_prompt",
)
_HARNESS = (r"(?:# AGENTS\.md instructions[^\n]*\s*)?"
            r"<(?P<tag>%s)(?:\s[^>]*)?>.*?</(?P=tag)>" % "|".join(map(re.escape, _HARNESS_TAGS)))
_HARNESS_RE = re.compile(_HARNESS, re.S)
_LEADING_HARNESS_RE = re.compile(r"(?:\s*%s)*\s*" % _HARNESS, re.S)
_CAP_JOINER = "\n...\n"
_CUT_BACKOFF = 200        # bytes we give up to end a capped query at whitespace
_CHUNK_SEPARATOR = "\n\n"
_TRUNCATED_MARK = "\n[... truncated]"


def _strip_harness(text):
    if "<" not in text:
        return text
    return _HARNESS_RE.sub("", text)


def _conversation(endpoint, payload):
    """(format, conversation): a list of entries, or a str for a bare prompt."""
    fmt = _INJECT_FORMATS.get(endpoint)
    if fmt is None or not isinstance(payload, dict):
        return None
    seq = payload.get(fmt.turns)
    if isinstance(seq, list) or (isinstance(seq, str) and fmt.turns != "messages"):
        return fmt, seq
    return None


def _entry_role(fmt, item):
    if not isinstance(item, dict):
        return None
    if fmt.typed_items and item.get("type", "message") != "message":
        return None
    role = item.get("role")
    return role if isinstance(role, str) else None


def _content_parts(content):
    if isinstance(content, str):
        return [content]
    return content if isinstance(content, list) else []


def _part_type(part):
    """A dict part's ``type`` if it is a string, else None.  Every field comes from the
    client: a list or object where a string belongs must not reach a set lookup."""
    kind = part.get("type") if isinstance(part, dict) else None
    return kind if isinstance(kind, str) else None


def _part_text(part):
    if isinstance(part, str):
        return part
    if isinstance(part, dict):   # _part_type written out: asked of every part after a human turn
        kind, text = part.get("type"), part.get("text")
        if isinstance(kind, str) and kind in _TEXT_PART_TYPES and isinstance(text, str):
            return text
    return None


def _part_kind(part):
    """Classify a content part: human, harness, tool or other (images, files, unknown)."""
    text = _part_text(part)
    if text is not None:
        return "human" if _opens_with_words(text) or _strip_harness(text).strip() else "harness"
    if _part_type(part) in _TOOL_PART_TYPES:
        return "tool"
    return "other"


def _is_human(fmt, item):
    if _entry_role(fmt, item) != "user":
        return False
    texts = [text for text in map(_part_text, _content_parts(item.get("content"))) if text is not None]
    # The human words of Claude Code's turn follow its <system-reminder> parts: looked at first,
    # they spare the harness pattern a scan of each reminder on every request of an agent loop.
    return any(map(_opens_with_words, texts)) or any(_strip_harness(text).strip() for text in texts)


def _opens_with_words(text):
    """Whether ``text`` keeps words after _strip_harness, told from its first non-blank character.

    That character survives the cut when it is neither ``<`` nor ``#``: every
    harness block starts with one of them, and none can start on a blank
    before it.  False means only that the pattern must decide.
    """
    text = text.lstrip()
    return bool(text) and text[0] not in "<#"


def _last_human(fmt, seq):
    for i in range(len(seq) - 1, -1, -1):
        if _is_human(fmt, seq[i]):
            return i
    return None


# What Conversation's ``tails`` keep of a walk: the text from the human turn it found to the
# end of the newest entry but _TAIL_LEAVES_OUT (clients move their prompt-caching mark on
# from those, so the next round sends them otherwise), filed under the last _TAIL_KEY
# bytes of the conversation's first entry (its first words: the harness's reminder comes
# before them), at most _TAIL_ALTERNATIVES under one, each at most MAX_TAIL_BYTES.
_TAIL_LEAVES_OUT = 2
_TAIL_KEY = 128
_TAIL_ALTERNATIVES = 2
MAX_TAIL_BYTES = 1 << 20


def _recalled_last_human(endpoint, fmt, seq, located, tails):
    """_last_human, walking only the entries after those a walk of an earlier body classified.

    Each round of an agent loop repeats the round before and adds the model's turns
    at the end, so the walk back to the human turn grows by a tool call and its result
    every round.  ``located(key)`` gives ``(body, spans)``, this body's text of each
    entry of ``payload[key]`` (jsonbody.entry_spans), or None; ``tails`` (get and put)
    keeps, from each walk, the text from the human entry it found to the end of an
    entry after it.  Where this body's entry at the same index starts with all of that
    text, its entries up to that one are those (each entry's text closes with its own
    bracket or quote): the first human, the rest not, whatever comes before them.
    """
    found = located(fmt.turns) if seq else None
    if found is None or len(found[1]) != len(seq):
        return _last_human(fmt, seq)
    body, spans = found
    first_start, first_end = spans[0]
    key = (endpoint, body[max(first_start, first_end - _TAIL_KEY):first_end])
    records = tails.get(key) or ()
    matched = next((record for record in records
                    if record[1] < len(seq) and body.startswith(record[2], spans[record[0]][0])), None)
    human, floor = matched[:2] if matched else (None, -1)
    for j in range(len(seq) - 1, floor, -1):
        if _is_human(fmt, seq[j]):
            human = j
            break
    upto = len(seq) - 1 - _TAIL_LEAVES_OUT
    # Kept when it reaches past what the matched record knew (a new human turn after it does too).
    if human is not None and human <= upto and upto > floor:
        start, end = spans[human][0], spans[upto][1]
        if end - start <= MAX_TAIL_BYTES:
            others = tuple(record for record in records if record is not matched)
            tails.put(key, ((human, upto, body[start:end]),) + others[:_TAIL_ALTERNATIVES - 1])
    return human


_NOT_LOOKED_FOR = object()


class Conversation:
    """A request's conversation as this module reads it: the format, the entries (or a bare
    prompt's str), and the index of the last human turn, found on first use and kept.

    extract_query, question_text, turn_key, continues_turn and inject each take one as
    ``conversation``: a caller that asks several of them about one request finds that turn
    once (each walk classifies the content parts of every entry after it).  It describes the
    payload as it stood: make another after anything edits it (inject does).

    ``tails`` (a cache with get and put, kept across requests) and ``located`` (this
    body's text of each entry: _recalled_last_human), when given, let the walk stop
    where an earlier body's walk classified the same entries: a later round of an agent
    loop then classifies only what it added.
    """

    __slots__ = ("fmt", "seq", "_last", "_endpoint", "_tails", "_located")

    def __init__(self, endpoint, payload, tails=None, located=None):
        view = _conversation(endpoint, payload)
        self.fmt, self.seq = view if view is not None else (None, None)
        self._last = _NOT_LOOKED_FOR
        self._endpoint, self._tails, self._located = endpoint, tails, located

    @property
    def last_human(self):
        """Index of the last human turn in the entries; None when there is none (or no entries)."""
        if self._last is _NOT_LOOKED_FOR:
            if not isinstance(self.seq, list):
                self._last = None
            elif self._tails is not None and self._located is not None:
                self._last = _recalled_last_human(self._endpoint, self.fmt, self.seq, self._located, self._tails)
            else:
                self._last = _last_human(self.fmt, self.seq)
        return self._last


def _human_text(content):
    texts = (_part_text(p) for p in _content_parts(content))
    return "\n\n".join(t for t in (_strip_harness(t).strip() for t in texts if t is not None) if t)


def _all_text(value):
    """Every text in an entry, tool results and outputs included, in order.

    A loop, not recursion: how deep a client nests its JSON is not for it to
    decide how deep Python's stack goes.
    """
    texts, todo = [], [value]
    while todo:
        value = todo.pop()
        if isinstance(value, dict):
            text = _part_text(value)
            value = text if text is not None else [value[k] for k in ("content", "output") if k in value]
        if isinstance(value, str):
            text = _strip_harness(value).strip()
            if text:
                texts.append(text)
        elif isinstance(value, list):
            todo.extend(reversed(value))
    return "\n\n".join(texts)


# -- query ---------------------------------------------------------------------

def extract_query(endpoint, payload, source="last_user", max_bytes=4000, conversation=None):
    """The text to search the knowledge bases with ("" if there is none).

    ``source``: last_user (the last human turn), last_message (the last entry's
    text whatever its role, tool output included) or all_user (every human
    turn, oldest first).  ``max_bytes`` caps the UTF-8 size (None: no cap).
    ``conversation``: the payload's Conversation, when the caller has one.
    """
    if source not in QUERY_SOURCES:
        raise ValueError("query source must be one of %s, got %r" % (", ".join(QUERY_SOURCES), source))
    conversation = conversation or Conversation(endpoint, payload)
    fmt, seq = conversation.fmt, conversation.seq
    if fmt is None:
        return ""
    if isinstance(seq, str):
        return _cap_ends(_strip_harness(seq).strip(), max_bytes)
    if source == "all_user":
        turns = (_human_text(item.get("content")) for item in seq if _is_human(fmt, item))
        return _cap_tail("\n\n".join(turns), max_bytes)
    if source == "last_message":
        text = _all_text(seq[-1]) if seq else ""
    else:
        i = conversation.last_human
        text = "" if i is None else _human_text(seq[i].get("content"))
    return _cap_ends(text, max_bytes)


def question_text(endpoint, payload, conversation=None):
    """The person's words in the last human turn, whole: what ``{query}`` stands for
    where the rendered template takes their place (inject's ``replaces_question``)."""
    return extract_query(endpoint, payload, "last_user", None, conversation)


def _utf8_head(b, n):
    if n >= len(b):
        return b
    cut = n
    while cut > 0 and (b[cut] & 0xC0) == 0x80:  # not inside a UTF-8 character
        cut -= 1
    if not b[cut:cut + 1].isspace():
        space = max(b.rfind(c, max(0, cut - _CUT_BACKOFF), cut) for c in (b" ", b"\n", b"\t"))
        if space > 0:
            cut = space
    return b[:cut].rstrip()


def _utf8_tail(b, n):
    if n >= len(b):
        return b
    start = len(b) - n
    while start < len(b) and (b[start] & 0xC0) == 0x80:
        start += 1
    if start and not b[start - 1:start].isspace():
        spaces = [i for i in (b.find(c, start, start + _CUT_BACKOFF) for c in (b" ", b"\n", b"\t")) if i >= 0]
        if spaces and min(spaces) + 1 < len(b):
            start = min(spaces) + 1
    return b[start:].lstrip()


def _cap_tail(text, max_bytes):
    if max_bytes is None:
        return text
    b = text.encode("utf-8", "surrogatepass")
    return _utf8_tail(b, max(0, max_bytes)).decode("utf-8", "surrogatepass")


def _cap_ends(text, max_bytes):
    """``text`` within ``max_bytes``: its first three quarters and its last quarter."""
    if max_bytes is None:
        return text
    b = text.encode("utf-8", "surrogatepass")
    if len(b) <= max_bytes:
        return text
    room = max_bytes - len(_CAP_JOINER)
    if room < 16:
        return _utf8_head(b, max(0, max_bytes)).decode("utf-8", "surrogatepass")
    head = _utf8_head(b, room * 3 // 4)
    tail = _utf8_tail(b, room - len(head))
    return (head.decode("utf-8", "surrogatepass") + _CAP_JOINER + tail.decode("utf-8", "surrogatepass"))


# -- turn key ------------------------------------------------------------------

def turn_key(endpoint, payload, raw=None, seen=None, conversation=None, sent_at=None):
    """sha256 hex of the conversation up to and including the last human turn.

    Every request of one agent loop only appends after that turn, so they share
    the key; a new human message changes it.  ``cache_control`` markers are
    left out because clients move them to the newest message each round.  The
    system prompt is left out too: Claude Code's first system block changes on
    every request.  Compute it before ``inject`` changes the payload.

    ``raw(key, upto, marked)``, when given, answers with the client's own text of
    entries 0 to ``upto`` of ``payload[key]`` (``upto`` None: the whole value),
    ``cache_control`` members cut out of the entries ``marked`` names (None: of
    all of it), as str or as its UTF-8 bytes, or None when it cannot tell
    (jsonbody.raw_entries).  The key is then the hash of that text: a client
    sends the same turn as the same bytes round after round, and hashing them
    costs a tenth of encoding the entries again with sorted keys.  Any byte
    of the prefix that changes changes the key.  The marked entries are those
    with the marker where clients put it (_cache_marked): one nested deeper
    stays in the text, and the key then changes when it moves, which costs a
    retrieval but never takes two turns for one.

    ``seen``, a cache with get and put (the retriever's), remembers the raw
    texts of recent turns with their keys, as sent and with the markers cut
    (two entries when they differ): every round of an agent loop sends the
    same prefix, and comparing it with the one seen costs a tenth of hashing
    it again.  ``conversation``: the payload's Conversation, when the caller has one.
    ``sent_at(key, upto)``, with ``seen``, says where the text ``raw(key, upto, ())``
    would cut lies: ``(source, start, end)`` with ``source[start:end]`` that
    UTF-8 text, or None (jsonbody.entries_span).  A prefix seen before is then
    found by comparing it where it lies, with no copy of it cut first.
    """
    conversation = conversation or Conversation(endpoint, payload)
    fmt, seq = conversation.fmt, conversation.seq
    if fmt is None:
        return None
    if isinstance(seq, str):
        if not _strip_harness(seq).strip():
            return None
        prefix, upto, marked, sent = [seq], None, None, None
    else:
        i = conversation.last_human
        if i is None:
            return None
        prefix, upto = seq[:i + 1], i
        # The prefix as sent, markers and all, first: a later round of Claude Code's
        # loop sends it as the first round's with the markers cut (they moved on),
        # and a client that leaves them in place sends the first round's bytes.
        # Either way finding the markers and cutting them costs nothing then.
        where = sent_at(fmt.turns, upto) if sent_at is not None and seen is not None else None
        key = _seen_key(seen, endpoint, *where) if where is not None else None
        if key is not None:
            return key
        sent = _as_utf8(raw(fmt.turns, upto, ())) if raw is not None and seen is not None else None
        key = _seen_key(seen, endpoint, sent)
        if key is not None:
            return key
        marked = _cache_marked(prefix) if raw is not None else None
    if raw is None:
        text = None
    elif sent is not None and not marked:
        text = sent   # nothing to cut: the text as sent is the text
    else:
        text = _as_utf8(raw(fmt.turns, upto, marked))
    if text is not None:
        key = _seen_key(seen, endpoint, text) if text is not sent else None   # sent was looked up above
        if key is None:
            digest = hashlib.sha256(endpoint.encode("utf-8") + b"\nraw\n")   # "raw": apart from the encoded keys
            digest.update(text)
            key = digest.hexdigest()
            _remember(seen, endpoint, text, key)
        if sent is not None and sent is not text:
            _remember(seen, endpoint, sent, key)
        return key
    digest = hashlib.sha256(endpoint.encode("utf-8"))
    for entry in prefix:  # one entry at a time: only the few with cache_control get copied
        blob = _turn_json(entry)
        if '"cache_control"' in blob:
            blob = _turn_json(_without_cache_control(entry))
        digest.update(b"\n" + blob.encode("utf-8", "surrogatepass"))  # dumps escapes newlines
    return digest.hexdigest()


def _as_utf8(text):
    return text if isinstance(text, bytes) or text is None else text.encode("utf-8", "surrogatepass")


def _seen_lookup(endpoint, source, start=0, end=None):
    """Where ``seen`` files the text ``source[start:end]`` (bytes; all of ``source`` by default)."""
    end = len(source) if end is None else end
    # Found by its length and its end, the newest turn's own words; the whole compared.
    if end - start > MAX_SEEN_BYTES:
        return None
    return endpoint, end - start, source[max(start, end - _SEEN_TAIL):end]


def _seen_key(seen, endpoint, source, start=0, end=None):
    """The key ``seen`` holds for the text ``source[start:end]`` (bytes; all of ``source`` by
    default), compared where it lies; None if it holds none."""
    lookup = _seen_lookup(endpoint, source, start, end) if seen is not None and source is not None else None
    known = seen.get(lookup) if lookup is not None else None
    return known[1] if known is not None and source.startswith(known[0], start) else None


def _remember(seen, endpoint, text, key):
    lookup = _seen_lookup(endpoint, text) if seen is not None else None
    if lookup is not None:
        seen.put(lookup, (text, key))


def _cache_marked(entries):
    """Indices of the entries with a ``cache_control`` member on them, on one of their
    content parts or on a part of one of those (a tool result's): where clients put it."""
    marked = []
    for n, entry in enumerate(entries):   # loops, not a walk or generators: this runs on every request
        if not isinstance(entry, dict):
            continue
        if "cache_control" in entry:
            marked.append(n)
            continue
        content = entry.get("content")
        if isinstance(content, list):
            for part in content:
                if isinstance(part, dict) and ("cache_control" in part or _holds_marker(part.get("content"))):
                    marked.append(n)
                    break
    return marked


def _holds_marker(parts):
    if isinstance(parts, list):
        for part in parts:
            if isinstance(part, dict) and "cache_control" in part:
                return True
    return False


# A turn's raw text is remembered up to this size: the retriever keeps a few dozen.
MAX_SEEN_BYTES = 1 << 20
_SEEN_TAIL = 256

_MODEL_ROLES = frozenset(("assistant", "tool", "function"))


def continues_turn(endpoint, payload, conversation=None):
    """Whether the request goes on past its last human turn with the model's own turns:
    an assistant message, a tool result message or (Responses) a non-message item such
    as function_call_output.

    Only such a request is a later round of an agent loop, one whose human turn
    was already answered (and given context) at least once.  A request that ends
    in the human turn, or in harness text after it, starts the turn: a new chat
    that asks an old question, or a retry.
    ``conversation``: the payload's Conversation, when the caller has one.
    """
    conversation = conversation or Conversation(endpoint, payload)
    fmt, seq = conversation.fmt, conversation.seq
    i = conversation.last_human   # None for a bare prompt too
    if i is None:
        return False
    for item in seq[i + 1:]:
        kind = item.get("type", "message") if fmt.typed_items and isinstance(item, dict) else "message"
        if isinstance(kind, str) and kind != "message":
            return True
        if _entry_role(fmt, item) in _MODEL_ROLES:
            return True
    return False


def _turn_json(value):
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def _without_cache_control(value):
    """A copy of ``value`` without "cache_control" keys at any depth (a loop: see _all_text)."""
    def copy(v):
        if isinstance(v, dict):
            return {k: x for k, x in v.items() if k != "cache_control"}
        return list(v) if isinstance(v, list) else v

    top = copy(value)
    todo = [top]
    while todo:
        node = todo.pop()
        for k, v in (node.items() if isinstance(node, dict) else enumerate(node)):
            if isinstance(v, (dict, list)):
                node[k] = v = copy(v)
                todo.append(v)
    return top


# -- rendering -----------------------------------------------------------------

def _token_class_table():
    """UTF-8 byte -> character class: a ASCII letter, u other letter, d digit,
    s symbol, S non-ASCII symbol, c CJK, newline, space.  Continuation bytes
    are deleted, so one class byte stands for one character."""
    table = bytearray(b" " * 256)
    for i in range(128):
        ch = chr(i)
        table[i] = ord("a" if ch.isalpha() else "d" if ch.isdigit() else "\n" if ch == "\n"
                       else " " if ch.isspace() else "s")
    # Lead bytes: U+0080-1FFF (Latin, Greek, Cyrillic, Arabic, Indic...) letters;
    # U+2000-2FFF (punctuation, arrows, box drawing) and 4-byte (emoji) symbols;
    # U+3000-FFFF CJK, kana, Hangul, fullwidth forms.
    for i in range(0xC0, 0x100):
        table[i] = ord("u" if i < 0xE2 else "S" if i == 0xE2 or i >= 0xF0 else "c")
    return bytes(table)


def _token_view(classes):
    return bytes(ord("x") if chr(i) in classes else ord(" ") for i in range(256))


_TOK_CLASSES = _token_class_table()
_TOK_CONTINUATION = bytes(range(0x80, 0xC0))
_TOK_LETTERS, _TOK_DIGITS, _TOK_SYMBOLS = _token_view("au"), _token_view("d"), _token_view("sS")


def estimate_tokens_text(text):
    """Estimated BPE tokens in ``text``, without a tokenizer.

    Follows how GPT-style tokenizers split text: a run of letters costs 3/4
    of a token (the space before it merges in) plus one per 6 further letters
    and 1/4 per non-ASCII letter; digits go in threes; a run of symbols costs
    one; each CJK character, non-ASCII symbol and newline costs one.  Measured
    against tiktoken cl100k_base and o200k_base on 2000-char samples of Python,
    C, JavaScript, JSON, Markdown and license text: mean absolute error 5.2%,
    95th percentile 14%, worst -21%..+32% (4 chars/token: 13%, 34%).  German,
    French, Spanish: 9-25% low on average; Russian, Chinese, Japanese, Korean:
    -20%..+24% on average, the two tokenizers differing ~30% there themselves.
    About 130 MB/s on prose: bytes.translate, count and replace do the scanning.
    """
    if not text:
        return 0
    classes = text.encode("utf-8", "surrogatepass").translate(_TOK_CLASSES, _TOK_CONTINUATION)
    # Letter runs are counted by where they start, not split out: a prose context has a
    # word every seven bytes, and a bytes object and a Python step for each cost a third
    # of the estimate.  With each run's first letter blanked, a run of n letters holds
    # (n - 1) // 6 whole sixes, which count() finds without overlapping.
    letters = b" " + classes.translate(_TOK_LETTERS)
    words = letters.count(b" x")
    more_letters = letters.replace(b" x", b"  ").count(b"xxxxxx")
    digits = sum((len(d) + 2) // 3 for d in classes.translate(_TOK_DIGITS).split())
    symbols = len(classes.translate(_TOK_SYMBOLS).split())
    ones = classes.count(b"\n") + classes.count(b"c") + classes.count(b"S")
    quarters = 3 * words + classes.count(b"u") + 4 * (more_letters + digits + symbols + ones)
    return max(1, (quarters + 3) // 4)


_TEMPLATE_FIELD_RE = re.compile(r"\{\{|\}\}|\{(\w+)\}")


def _fill_template(template, values):
    """Replace ``{name}`` for names in ``values`` and ``{{``/``}}``; nothing else.

    One pass over the template, so braces inside the values (code, user text)
    are never read as placeholders.
    """
    form, names = _format_string(template, frozenset(values))
    return form.format(*[values[name] for name in names])


@functools.lru_cache(maxsize=128)   # a config names a few templates, each filled per chunk per retrieval
def _format_string(template, names):
    """``(form, order)``: ``template`` as a str.format string with an ``{}`` for each
    placeholder named in ``names``, and those names in order.

    Every other brace, and a placeholder not in ``names``, is escaped to
    stand for itself.  Filled in one C call rather than a regex callback per
    placeholder; ``{}`` rather than ``{name}``, which str.format would read
    as an index when ``name`` is digits.
    """
    form, order, at = [], [], 0
    for m in _TEMPLATE_FIELD_RE.finditer(template):
        form.append(_escape_braces(template[at:m.start()]))
        name = m.group(1)
        if name is None:
            form.append(m.group(0))
        elif name in names:
            form.append("{}")
            order.append(name)
        else:
            form.append(_escape_braces(m.group(0)))
        at = m.end()
    form.append(_escape_braces(template[at:]))
    return "".join(form), tuple(order)


def _escape_braces(text):
    return text.replace("{", "{{").replace("}", "}}")


def _chunk_values(chunk, index, content=None):
    score = chunk.get("score")
    if content is None:
        content = chunk.get("content", chunk.get("text"))
    source, lines = _text_or_empty(chunk.get("source")), line_range(chunk)
    symbol = _text_or_empty(chunk.get("symbol"))
    headings = chunk.get("headings")
    section = " > ".join(str(h) for h in headings if h) if isinstance(headings, list) else ""
    about = symbol or section
    return {
        "index": str(index), "id": _text_or_empty(chunk.get("id")), "source": source,
        "title": _text_or_empty(chunk.get("title")), "content": _text_or_empty(content).rstrip("\r\n"),
        "score": "%.3f" % score if isinstance(score, float) else _text_or_empty(score),
        "lines": lines, "symbol": symbol, "section": section,
        "citation": source + (":" + lines if lines else "") + (" (%s)" % about if about else ""),
    }


def line_range(chunk):
    """"362-389", "12" for a one-line chunk, "" when the chunk has no line numbers."""
    start, end = chunk.get("line_start"), chunk.get("line_end")
    if not isinstance(start, int) or isinstance(start, bool) or start < 1:
        return ""
    if not isinstance(end, int) or isinstance(end, bool) or end <= start:
        return str(start)
    return "%d-%d" % (start, end)


def _text_or_empty(value):
    return "" if value is None else str(value)


def render_context(chunks, template, chunk_template, max_tokens, query="", count_tokens=estimate_tokens_text):
    """(text, used): ``chunks`` (best first) rendered into ``template``.

    Placeholders: ``{context}`` and ``{query}`` in ``template``; ``{index}``
    (1-based), ``{id}``, ``{source}``, ``{title}``, ``{score}``, ``{content}``,
    ``{lines}`` ("362-389", "12" for one line), ``{symbol}`` (code),
    ``{section}`` (the heading path, "Install > Linux", or "page 3"), and
    ``{citation}`` (``{source}:{lines} ({symbol or section})``, the parts
    that are known) in ``chunk_template``, each "" when unknown;
    ``{{``/``}}`` are literal braces.  Whole chunks are
    taken until the next would push the whole text past ``max_tokens``; a
    first chunk too large on its own is cut at a line boundary and marked, and
    appears in ``used`` as a copy with ``truncated: True``.  ("", []) when
    nothing fits.  The same as fill_template over render_chunks, with the
    template's own cost taken from the budget.
    """
    if not chunks or max_tokens <= 0:
        return "", []
    budget = max_tokens - count_tokens(fill_template(template, "", query))
    context, used = render_chunks(chunks, chunk_template, budget, count_tokens)
    return (fill_template(template, context, query), used) if used else ("", [])


def render_chunks(chunks, chunk_template, budget, count_tokens=estimate_tokens_text):
    """(context, used): ``chunks`` rendered with ``chunk_template`` and joined, within
    ``budget`` tokens (see render_context); ("", []) when nothing fits.

    ``count_tokens`` counts no more tokens than a text has UTF-8 bytes, as
    every tokenizer and estimate_tokens_text do: when the bytes of the whole
    fit the budget nothing is counted, as every chunk would be taken anyway.
    """
    pieces = [_fill_template(chunk_template, _chunk_values(chunk, index)) for index, chunk in enumerate(chunks, 1)]
    if pieces and sum(map(_utf8_length, pieces)) + len(_CHUNK_SEPARATOR) * (len(pieces) - 1) <= budget:
        return _CHUNK_SEPARATOR.join(pieces), list(chunks)
    taken, used = [], []
    separator = None   # its tokens, counted once
    for piece, chunk in zip(pieces, chunks):
        if taken and separator is None:
            separator = count_tokens(_CHUNK_SEPARATOR)
        cost = count_tokens(piece) + (separator if taken else 0)
        if cost > budget:
            if not taken:
                cut = _truncate_chunk(chunk, chunk_template, budget, count_tokens)
                if cut:
                    taken.append(cut[0])
                    used.append(cut[1])
            break
        taken.append(piece)
        used.append(chunk)
        budget -= cost
    return _CHUNK_SEPARATOR.join(taken), used


def _utf8_length(text):
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def fill_template(template, context, query):
    """An inject_template with its ``{context}`` and ``{query}`` filled in."""
    return _fill_template(template, {"context": context, "query": query})


@functools.lru_cache(maxsize=64)   # asked on every retrieval, of the few templates a config names
def uses_query(template):
    """Whether ``template`` has a ``{query}`` placeholder (``{{query}}`` is literal text)."""
    return any(m.group(1) == "query" for m in _TEMPLATE_FIELD_RE.finditer(template))


def _truncate_chunk(chunk, chunk_template, budget, count_tokens):
    content = _chunk_values(chunk, 1)["content"]

    def fits(kept):
        return count_tokens(_fill_template(chunk_template, _chunk_values(chunk, 1, kept + _TRUNCATED_MARK))) <= budget

    lines = content.split("\n")
    n = _largest_fitting(len(lines) - 1, lambda k: fits("\n".join(lines[:k])))
    if n:
        kept = "\n".join(lines[:n]).rstrip()
    else:  # one huge first line (minified code, a table): cut it at a space
        first = lines[0]
        n = _largest_fitting(len(first), lambda k: fits(first[:k]))
        space = first.rfind(" ", 0, n + 1)
        kept = first[:space if space > n // 2 else n].rstrip()
    if not kept:
        return None
    piece = _fill_template(chunk_template, _chunk_values(chunk, 1, kept + _TRUNCATED_MARK))
    return piece, dict(chunk, content=kept, truncated=True)


def _largest_fitting(hi, ok):
    """The largest k in 0..hi with ok(k), for ok true up to some k then false."""
    lo = 0
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if ok(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


# -- injection -----------------------------------------------------------------

def inject(endpoint, payload, text, mode="before_last_user", replaces_question=False, conversation=None):
    """Put ``text`` into ``payload``; the paths it changed, () if none.

    ``payload``'s top level is changed in place; anything below it that
    changes is replaced by a changed copy, never edited (copy on write): a
    body's values may be shared with earlier bodies that repeat them
    (jsonbody.ParseMemo), and the entries the context does not touch stay the
    objects they were.

    A path is a top-level key, ``("system",)``, whose value changed or is new,
    or a key and a list index, ``("messages", 7)``, for an entry changed where
    it stood (the list kept its length).  The proxy re-encodes only what the
    paths name and passes every other byte of the body on as sent.

    ``replaces_question``: ``text`` already holds the person's words of the
    last human turn (an inject_template with ``{query}``, filled with
    question_text).  In the user-turn modes it then takes their place, so the
    question is sent once: before_last_user puts it where the words were,
    new_message moves the words out of the human message into the new one
    (and the new one takes the human message's place when nothing else is left
    in it).  Harness text, tool results and images stay where they were.  The
    system modes ignore it: there the question stays in its turn.

    Nothing is injected into a request with no human turn, for any mode, nor
    into an Ollama ``raw`` prompt (already templated; Ollama ignores ``system``
    then), nor into a system prompt of a type no API accepts (the upstream
    answers that request).  Where a request has no message list (Ollama
    generate, a Responses string input) new_message prefixes the prompt like
    before_last_user.  ``conversation``: the payload's Conversation, when the caller has one
    (it is stale afterwards).
    """
    if mode not in INJECT_MODES:
        raise ValueError("inject mode must be one of %s, got %r" % (", ".join(INJECT_MODES), mode))
    conversation = conversation or Conversation(endpoint, payload)
    fmt, seq = conversation.fmt, conversation.seq
    if fmt is None or not text or (endpoint == "ollama_generate" and payload.get("raw")):
        return ()
    replace = replaces_question and mode in _USER_TURN_MODES
    if isinstance(seq, str):
        if not _strip_harness(seq).strip():
            return ()
        if mode in _USER_TURN_MODES:
            payload[fmt.turns] = _prefix_string(seq, text, replace)
            return ((fmt.turns,),)
        return _add_system(fmt, payload, text, mode == "system_prepend")
    i = conversation.last_human
    if i is None:
        return ()
    if mode == "before_last_user":
        path = (fmt.turns, i)
        put_entry(payload, path, _prefix_content(fmt, seq[i], text, replace))
        return (path,)
    if mode == "new_message":
        seq = payload[fmt.turns] = list(seq)
        message = seq[i]
        if replace:
            rest = _without_question(message["content"])
            if not rest:  # the question was all there was: the context message takes its place
                seq[i] = _prefix_content(fmt, message, text, True)
                return ((fmt.turns, i),)
            seq[i] = {**message, "content": rest}
        seq.insert(i, _context_message(fmt, text))
        return ((fmt.turns,),)
    return _add_system(fmt, payload, text, mode == "system_prepend")


_USER_TURN_MODES = ("before_last_user", "new_message")


def injected_entry(endpoint, payload, mode, conversation=None):
    """The path, ``(key, index)``, of the one entry inject changes for ``mode`` when
    that change depends on nothing but the entry, the text and ``replaces_question``:
    before_last_user's last human turn.  None where inject adds an entry, changes a
    system prompt or a bare prompt, or changes nothing.

    A caller that knows what inject made of an equal entry with the same text
    puts that (put_entry) instead of running inject again.
    """
    conversation = conversation or Conversation(endpoint, payload)
    if mode != "before_last_user" or not isinstance(conversation.seq, list):
        return None
    i = conversation.last_human
    return None if i is None else (conversation.fmt.turns, i)


def put_entry(payload, path, entry):
    """Put ``entry`` at ``path``, ``(key, index)``, in a copy of the list (copy on write, as inject)."""
    key, i = path
    entries = payload[key] = list(payload[key])
    entries[i] = entry


def _harness_spans(s):
    return [m.group(0) for m in _HARNESS_RE.finditer(s)] if "<" in s else []


def _prefix_string(s, text, replace=False):
    """``text`` before the person's words in ``s``, after any leading harness text;
    with ``replace``, instead of the words (harness text later in ``s`` is kept after it)."""
    pos = _LEADING_HARNESS_RE.match(s).end()
    lead = s[:pos] + ("\n" if pos and not s[:pos].endswith("\n") else "")
    if not replace:
        return lead + text + "\n\n" + s[pos:]
    later = _harness_spans(s[pos:])
    return lead + text + ("\n\n" + "\n".join(later) if later else "")


def _prefix_content(fmt, message, text, replace=False):
    """A copy of ``message`` with ``text`` before the person's words (``replace``: in their place)."""
    content = message["content"]
    if isinstance(content, str):
        return {**message, "content": _prefix_string(content, text, replace)}
    at = next(i for i, p in enumerate(content) if _part_kind(p) not in ("harness", "tool"))
    part = {"type": fmt.text_type, "text": text}
    if replace:
        words = [p for p in content[at:] if _part_kind(p) == "human"]
        if isinstance(words[-1], dict):  # its other keys (cache_control) go on with the text
            part = {**words[-1], "type": fmt.text_type, "text": text}
        rest = _without_question(content[at:])
    else:
        rest = content[at:]
    return {**message, "content": content[:at] + [part] + rest}


def _without_question(content):
    """``content`` (a str or a part list) without the person's words: harness text
    inside them stays, as do tool results, images and other parts."""
    if isinstance(content, str):
        return "\n".join(_harness_spans(content))
    out = []
    for part in content:
        if _part_kind(part) != "human":
            out.append(part)
            continue
        kept = "\n".join(_harness_spans(_part_text(part)))
        if kept:
            out.append(kept if isinstance(part, str) else {**part, "text": kept})
    return out


def _context_message(fmt, text):
    if fmt.typed_items:
        return {"type": "message", "role": "user", "content": [{"type": fmt.text_type, "text": text}]}
    return {"role": "user", "content": text}


def _add_system(fmt, payload, text, prepend):
    """Add ``text`` to the system prompt; the paths changed (see inject)."""
    if fmt.system == "message":
        messages = payload[fmt.turns]
        for i, message in enumerate(messages):
            if isinstance(message, dict) and message.get("role") in ("system", "developer"):
                content = _with_text(message.get("content"), text, prepend, fmt.text_type)
                if content is None:
                    return ()
                messages = payload[fmt.turns] = list(messages)
                messages[i] = {**message, "content": content}
                return ((fmt.turns, i),)
        payload[fmt.turns] = [{"role": "system", "content": text}] + messages
        return ((fmt.turns,),)
    current = payload.get(fmt.system)
    if isinstance(current, list) and current:
        block = [{"type": fmt.text_type, "text": text}]
        # Prepended after the first block: for Claude Code a billing header that stays first.
        current = current[:1] + block + current[1:] if prepend else current + block
    else:
        current = _with_text(current, text, prepend, fmt.text_type)
        if current is None:
            return ()
    payload[fmt.system] = current
    return ((fmt.system,),)


def _with_text(content, text, prepend, part_type):
    """``content`` (a new list, or a str) with ``text`` added; None when it is not a prompt."""
    if isinstance(content, list) and content:
        part = [{"type": part_type, "text": text}]
        return part + content if prepend else content + part
    if isinstance(content, str) and content:
        return text + "\n\n" + content if prepend else content + "\n\n" + text
    if content in (None, "", []):
        return text
    return None  # a number, an object: not a prompt to add to
