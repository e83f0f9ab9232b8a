"""The retrieval rewriter: select knowledge bases, search once per human turn, inject.

Runs between parsing a client's request and forwarding it (App.rewriters).
Agent loops send many requests per human turn; every later round of one
(a request that goes on past the human turn with the model's own turns) gets
the identical bytes at the identical place (a per-turn cache), so the
upstream's prompt-prefix cache holds.  A request that ends in its human turn
retrieves afresh: a new chat asking an old question sees the knowledge base
as it is now.  Retrieval has a time limit (rag.timeout_ms, a model's
timeout_ms); when it fails or runs out the route's on_failure decides:
degrade, fail closed, or reuse stale context.

Between the search and the rendering, the model's guardrails screen what was
retrieved: secrets and personal data redacted, then the poisoning guard and
the operator's deny patterns (a finding drops the chunk, refuses the request,
or is only recorded); with ``scan: input`` the request's tool results are
screened too.  A model's max_input_tokens then cuts context, whole chunks
from the end, until the enriched request fits.

May import: api, config, deps, embeddings, fusion, guard, inject, jsonbody, npy, redact, screening.
"""
from __future__ import annotations

import collections
import dataclasses
import json
import logging
import math
import threading
import time

from . import deps
from .api import ClientError, json_response, json_text
from .config import ModelRoute, key_allows_kb, key_scope, valid_kb_name
from .embeddings import Deadline, EmbeddingError, RerankClient, RerankError, time_limit
from .fusion import reciprocal_ranks
from .guard import Guard
from .inject import (
    DEFAULT_CHUNK_TEMPLATE,
    PREFIX_QUERY_SOURCES,
    Conversation,
    continues_turn,
    estimate_tokens_text,
    extract_query,
    fill_template,
    inject,
    injected_entry,
    put_entry,
    question_text,
    render_chunks,
    turn_key,
    uses_query,
)
from .jsonbody import PLACEHOLDER, Members, entries_span, entry_spans, json_text_with, raw_entries, raw_value
from .npy import StoreError
from .redact import Redactor
from .screening import Screening

log = logging.getLogger("ragproxy")


_INJECTABLE = frozenset(("chat", "responses", "messages", "ollama_chat", "ollama_generate"))
_KB_HEADER = "x-ragproxy-kb"
# Where the context goes into the human turn itself: a {query} in the template
# is then the person's words, in their place (inject's replaces_question).
_USER_TURN_MODES = ("before_last_user", "new_message")
_TOO_DEEP = "request body is nested too deeply"


class RetrievalFailed(Exception):
    """Retrieval failed and the model's policy is fail_closed (or stale context was too old).

    The text says why, for the log.  The client is told no more than MESSAGE,
    the same every time: a provider's address and a socket error are the
    operator's to read, and a stable body is what a client can act on.  502,
    as for an unreachable upstream: a server the answer depends on failed
    (503 would say ragproxy itself is overloaded or down for maintenance).
    """

    STATUS = 502
    CODE = "rag_retrieval_failed"
    MESSAGE = "retrieval context was unavailable"

    def response(self, dialect):
        """The error in ``dialect``'s shape, with type and code CODE where it has them."""
        if dialect == "anthropic":
            body = {"type": "error", "error": {"type": self.CODE, "message": self.MESSAGE}}
        elif dialect == "ollama":
            body = {"error": self.MESSAGE}
        else:  # OpenAI chat and Responses
            body = {"error": {"message": self.MESSAGE, "type": self.CODE, "param": None, "code": self.CODE}}
        return json_response(self.STATUS, body)


def _rails_of(config):
    """Every model's guardrails, comparable between two configs."""
    return json.dumps([config.guardrails, [(r.name, r.guardrails) for r in config.models]], sort_keys=True)


class _OutOfTime(Exception):
    """The retrieval's time limit ran out between two stages."""


@dataclasses.dataclass
class Retrieved:
    """What one human turn injected: the exact text and the chunk ids it cites.

    ``context`` is the rendered chunks alone, from which stale reuse renders
    the template again around another question; ``replaces_question`` says
    that ``text`` holds the person's words and goes in their place.
    """

    text: str
    sources: tuple
    outcome: str            # retrieved, no_match, cached, stale
    at: float = 0.0
    hits: tuple = ()
    context: str = ""
    replaces_question: bool = False
    chunks: tuple = ()      # the rendered chunk dicts, screened: a budget cut renders fewer of them
    counted: tuple = ()     # (text, its tokens) once counted: every later round of the turn reuses it
    escaped: tuple = ()     # (text, its JSON text without the quotes) once encoded: likewise

    def tokens(self, count_tokens):
        """``count_tokens(self.text)``, counted once per text (a copy with another text counts again)."""
        return self._per_text("counted", lambda text: count_tokens(text) if text else 0)

    def json_escaped(self):
        """``json_text(self.text)`` without its quotes, encoded once per text."""
        return self._per_text("escaped", lambda text: json_text(text)[1:-1])

    def _per_text(self, field, compute):
        """``compute(self.text)``, kept in ``field`` as (text, value) for as long as the text is this one."""
        kept = getattr(self, field)
        if kept and kept[0] is self.text:
            return kept[1]
        value = compute(self.text)
        setattr(self, field, (self.text, value))
        return value


# Keys whose strings are base64 (images, files), not text a model reads as tokens.
_BINARY_KEYS = frozenset(("data", "images", "file_data", "image_url"))


def request_tokens(payload, count_tokens):
    """The tokens of a request's text: every string in it but the model's name and base64 data.

    Walked with a list, not recursion (a client's nesting is not Python's stack).
    """
    total, todo = 0, [v for k, v in payload.items() if k != "model"] if isinstance(payload, dict) else []
    while todo:
        value = todo.pop()
        if isinstance(value, str):
            if value and not value.startswith("data:"):
                total += count_tokens(value)
        elif isinstance(value, dict):
            todo.extend(v for k, v in value.items() if k not in _BINARY_KEYS)
        elif isinstance(value, list):
            todo.extend(value)
    return total


def split_model_kbs(model):
    """``"llama3+docs+code"`` -> ``("llama3", ["docs", "code"])``; no ``+`` -> ``(model, None)``."""
    if "+" not in model:
        return model, None
    name, *kbs = model.split("+")
    kbs = [k for k in kbs if k]
    if not name or not kbs or not all(valid_kb_name(k) for k in kbs):
        return model, None
    return name, kbs


class _LRU:
    def __init__(self, size):
        self.size = size
        self._data = collections.OrderedDict()
        self._lock = threading.Lock()

    def resize(self, size):
        """Hold at most ``size`` entries from now on, dropping the least recently used."""
        with self._lock:
            self.size = size
            while len(self._data) > max(size, 0):
                self._data.popitem(last=False)

    def get(self, key):
        with self._lock:
            value = self._data.get(key)
            if value is not None:
                self._data.move_to_end(key)
            return value

    def put(self, key, value):
        if self.size <= 0:
            return
        with self._lock:
            self._data[key] = value
            self._data.move_to_end(key)
            while len(self._data) > self.size:
                self._data.popitem(last=False)

    def __len__(self):
        return len(self._data)


# tiktoken fetches an encoding from a public host the first time it is asked
# for it, and ragproxy must never contact anything but configured upstreams.
# So it is used only when the file is already in tiktoken's own cache, where
# tiktoken looks first: TIKTOKEN_CACHE_DIR (or DATA_GYM_CACHE_DIR), else
# TMPDIR/data-gym-cache, named by the SHA-1 of the URL and holding the
# published SHA-256 (a file that fails the check is one tiktoken would fetch again).
_CL100K_URL = "https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken"
_CL100K_SHA256 = "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7"


def _tiktoken_cache_file(environ, url=_CL100K_URL):
    """Where tiktoken keeps ``url``'s file, or None when its cache is switched off."""
    import hashlib
    import os
    import tempfile
    cache_dir = environ.get("TIKTOKEN_CACHE_DIR", environ.get("DATA_GYM_CACHE_DIR"))
    if cache_dir is None:
        cache_dir = os.path.join(tempfile.gettempdir(), "data-gym-cache")
    if not cache_dir:
        return None
    return os.path.join(cache_dir, hashlib.sha1(url.encode()).hexdigest())


def _tiktoken_counter(tiktoken=None, environ=None, expected_sha256=_CL100K_SHA256):
    """Exact token counts from tiktoken's cl100k_base when it is installed and its
    encoding is cached locally; else None (and the estimate is used)."""
    import hashlib
    import os
    tiktoken = tiktoken or deps.tiktoken
    if tiktoken is None:
        return None
    path = _tiktoken_cache_file(os.environ if environ is None else environ)
    try:
        with open(path, "rb") as f:
            cached = hashlib.sha256(f.read()).hexdigest() == expected_sha256
    except (OSError, TypeError):
        cached = False
    if not cached:
        log.info("tiktoken is installed but its cl100k_base file is not in its local cache (%s); "
                 "estimating tokens (see 'Token counts' in the README)", path or "TIKTOKEN_CACHE_DIR is empty")
        return None
    try:
        encoding = tiktoken.get_encoding("cl100k_base")
    except Exception as exc:
        log.info("tiktoken could not load cl100k_base (%s); estimating tokens", exc)
        return None
    return lambda text: len(encoding.encode(text, disallowed_special=()))


# Several knowledge bases behind one model: a KB whose best hit is less
# relevant than this share of the best hit of any of them is left out, so a
# KB that matched a question weakly takes no slot from one that matched it
# well.  Measured on SciFact and CoSQA as two KBs (bench/multi_kb.py; figures
# in bench/RESULTS.md): 0.5 to 0.9 all keep concat within 0.001 nDCG@10 of
# its best, and priority and rrf gain as it rises; at 1 only the single best
# KB would ever answer, which is worse there than 0.8 and wrong for a question
# that two KBs answer nearly equally well.
KB_FLOOR = 0.8

# How old (seconds) a retrieval's look at another process's commits may be:
# a knowledge base's CURRENT file is then stat'ed at most 20 times a second
# instead of by every request (KBStore.current).  This process's own commits
# are seen at once.
CURRENT_MAX_AGE = 0.05


def _lexical_share(kb, query):
    """``score -> share``: a BM25 score as a share of what the query's terms could add up to in ``kb``.

    Raw BM25 scores grow with the query's length and with its terms' rarity in
    each corpus, so two KBs' scores say nothing about each other.  Each term
    adds less than its idf, ln(1 + (N - df + 0.5) / (df + 0.5)) (a term the KB
    lacks counts at df 0), so a score over their sum is in [0, 1): how much of
    the question, weighted by how telling each word is there, the chunk matched.
    """
    _, bm25 = kb.current(CURRENT_MAX_AGE)
    if bm25 is None or not len(bm25):
        return lambda score: 0.0
    n = len(bm25)
    total = math.fsum(math.log1p((n - df + 0.5) / (df + 0.5))
                      for df in map(bm25.doc_freq, kb.analyzer.query_tokens(query)))
    return (lambda score: min(1.0, max(0.0, score / total))) if total > 0 else (lambda score: 0.0)


def _relevance(kb, query, hits, mode):
    """Each hit's relevance in [0, 1], comparable between knowledge bases.

    Lexical: the BM25 score's share of the query (_lexical_share).  Dense: the
    cosine similarity (one scale for every KB), negatives as 0.  Hybrid: the two
    averaged with the KB's fusion weights, a retriever that missed the chunk
    giving 0, as in its own fusion.
    """
    mode = mode or kb.spec.retrieval
    if mode == "dense":
        return [max(0.0, hit.scores.get("dense", 0.0)) for hit in hits]
    share = _lexical_share(kb, query)
    if mode == "lexical":
        return [share(hit.scores.get("lexical", 0.0)) for hit in hits]
    lexical, dense = kb.spec.lexical_weight, kb.spec.dense_weight
    total = (lexical + dense) or 1.0
    return [(lexical * share(hit.scores.get("lexical", 0.0)) + dense * max(0.0, hit.scores.get("dense", 0.0)))
            / total for hit in hits]


def _merge(lists, merge):
    """One list from ``[(hits, relevances), ...]`` (one pair per KB, in the route's order).

    With several KBs, a KB whose best relevance is below KB_FLOOR times the
    best of all is left out first; then ``priority`` keeps the KBs' order (a
    later KB fills the slots an earlier one left), ``concat`` sorts by
    relevance (_relevance: one scale for every KB) and ``rrf`` fuses the ranks.
    Ties go to the KB listed first, then to its own order.
    """
    if len(lists) > 1:
        best = max((max(rels) for _, rels in lists if rels), default=0.0)
        lists = [(hits, rels) if rels and max(rels) >= KB_FLOOR * best else ([], []) for hits, rels in lists]
    if merge == "priority":
        return [h for hits, _ in lists for h in hits]
    if merge == "concat":
        ranked = sorted(((r, n, i, h) for n, (hits, rels) in enumerate(lists)
                         for i, (h, r) in enumerate(zip(hits, rels))), key=lambda t: (-t[0], t[1], t[2]))
        return [h for _, _, _, h in ranked]
    first = {}
    for hits, _ in lists:
        for hit in hits:
            first.setdefault((hit.kb, hit.row), hit)
    fused = reciprocal_ranks([([(hit.kb, hit.row) for hit in hits], 1.0) for hits, _ in lists])
    # Ties keep the order of the knowledge bases as listed, then rank (sorted is stable).
    return [dataclasses.replace(first[key], score=score)
            for key, score in sorted(fused.items(), key=lambda item: -item[1])]


def inject_retrieved(exchange, found, conversation=None, encode_once_min=None, sent_texts=None):
    """inject ``found`` into the exchange's payload; the paths changed.

    The splice (jsonbody.with_edits) is given each changed value's JSON text
    where it is known without encoding the value whole (Exchange.encoded):

    - ``sent_texts``, a dict the turn keeps (its _Turn's), maps the path of an
      entry to a _Sent: the entry's text as sent, the text injected, and the
      entry inject made of it with its JSON text.  Each round of an agent loop
      sends the turn's human message again, byte for byte, and gets the same
      context: from its third round on (the second moves the client's cache
      marker off it) inject does not run and the entry is encoded no more.
      Equal texts hold equal values, and inject's change to the entry it names
      (inject.injected_entry) depends on nothing else but the text.
    - Otherwise, when the text has ``encode_once_min`` characters or more,
      inject is run with a placeholder for the text on a shallow copy of the
      payload, which inject does not edit below its top level, and the copy's
      values are encoded, a few hundred bytes where the context is thousands,
      with the context's own JSON text (Retrieved.json_escaped) put in.
    """
    endpoint, payload, mode = exchange.endpoint.name, exchange.payload, exchange.route.inject_mode
    members = exchange.members if sent_texts is not None else None
    if members is None or members.body is not exchange.request.body or exchange.edits or exchange.changed:
        sent_texts = None   # the body's text is not what the payload holds
    encoded = exchange.encoded if exchange.encoded is not None else {}
    if sent_texts:
        path = injected_entry(endpoint, payload, mode, conversation)
        kept = sent_texts.get(path) if path is not None else None
        if kept is not None and kept.made_of(raw_value(members, path), found):
            put_entry(payload, path, kept.entry)
            encoded[path] = (kept.entry, kept.json)
            exchange.encoded = encoded
            return (path,)
    long = len(found.text) >= (ENCODE_ONCE_MIN if encode_once_min is None else encode_once_min)
    if sent_texts is None and not long:
        return inject(endpoint, payload, found.text, mode, found.replaces_question, conversation)
    before = dict(payload)
    edits = inject(endpoint, payload, found.text, mode, found.replaces_question, conversation)
    shadow = None
    for path in edits:
        value = _value_at(payload, path)
        sent = raw_value(members, path) if sent_texts is not None and len(path) > 1 else None
        kept = sent_texts.get(path) if sent is not None else None
        if kept is not None and kept.made_of(sent, found):   # a system message's entry
            encoded[path] = (value, kept.json)
            continue
        text = None
        if long:
            if shadow is None:
                shadow = before   # the conversation read before inject still describes it
                placed = inject(endpoint, shadow, PLACEHOLDER, mode, found.replaces_question, conversation)
                long = placed == edits   # else inject placed text by its content: not this premise
            if long:
                text = json_text_with(_value_at(shadow, path), found.json_escaped())
        if text is None and sent is not None:
            text = json_text(value)
        if text is not None:
            encoded[path] = (value, text)
            if sent is not None:
                sent_texts[path] = _Sent(sent, found.text, value, text)
    exchange.encoded = encoded
    return edits


class _Sent(collections.namedtuple("_Sent", "sent text entry json")):
    """What a round of a turn made of one entry (inject_retrieved's ``sent_texts``): the
    entry's text as the client sent it, the text injected, the entry inject made of them
    and its JSON text."""

    __slots__ = ()

    def made_of(self, sent, found):
        """Whether this round's entry, sent as ``sent``, gets ``found`` as the kept one did."""
        return self.text is found.text and self.sent == sent


def _value_at(payload, path):
    value = payload[path[0]]
    return value[path[1]] if len(path) > 1 else value


def _compression_key(exchange):
    """The active compression profile's key (levers.Profile.key), None without one."""
    compression = getattr(exchange, "compression", None)
    return None if compression is None else compression.key


# Characters of context from which a turn's context is encoded once for all its rounds:
# below it, injecting a placeholder as well costs more than encoding the context does
# (bench/request_body.py, "inject + splice" and "... encoded once", in RESULTS.md).
ENCODE_ONCE_MIN = 2048

# Turn texts the retriever remembers (Retriever.turn_texts): two per agent loop
# when its markers sit in the prefix (as sent, and cut), so 32 loops.
_TURN_TEXTS = 64
# Conversations whose walk back to the human turn the retriever remembers (Retriever.turn_tails).
_TURN_TAILS = 32


class _Turn(collections.namedtuple("_Turn", "found query question sent_texts")):
    """What the first request of a human turn retrieved (Retriever.turns), with the query
    it searched and the words that filled {query}: a later round takes all three.  And
    the JSON texts of the entries its rounds injected into (inject_retrieved's ``sent_texts``)."""

    __slots__ = ()


class Retriever:
    """The request rewriter that puts knowledge-base context into requests."""

    def __init__(self, app, knowledge_bases):
        self.app = app
        self.kbs = knowledge_bases
        self.count_tokens = _tiktoken_counter() or estimate_tokens_text
        self.turns = _LRU(app.config.rag["turn_cache_size"])
        self.stale = _LRU(app.config.rag["turn_cache_size"])
        # Hits per (KBs, query, settings, KB generations): a question asked
        # again (a new chat, a retry, a subagent) costs no search, and an
        # embedding model's vector for it no call either.
        self.searches = _LRU(app.config.rag["turn_cache_size"])
        # And what those hits became for a model (screened, chosen, rendered around the
        # question), so that asking again costs neither a search nor a render.
        self.renders = _LRU(app.config.rag["turn_cache_size"])
        # The raw text of the turns of the latest agent loops, each up to
        # inject.MAX_SEEN_BYTES, with its turn key: a later round's key is a comparison.
        self.turn_texts = _LRU(_TURN_TEXTS)
        self.turn_tails = _LRU(_TURN_TAILS)
        # A context this long is encoded once for all the rounds of its turn (inject_retrieved).
        self.encode_once_min = ENCODE_ONCE_MIN
        self.disabled_rerankers = {}  # provider name -> why, after a permanent error (the panel shows it)
        self._guards, self._redactors = {}, {}   # compiled once per set of deny patterns / categories
        self._rails = _rails_of(app.config)

    def reconfigure(self, config):
        """After a reload: the caches take the new rag.turn_cache_size, and rerankers
        disabled by a permanent error get another chance.  New guardrails empty
        both caches: what they hold was screened by the old ones."""
        for cache in (self.turns, self.stale):
            cache.resize(config.rag["turn_cache_size"])
        for cache in (self.searches, self.renders):   # a KB's spec, or a template, may have changed
            cache.resize(0)
            cache.resize(config.rag["turn_cache_size"])
        rails = _rails_of(config)
        if rails != self._rails:
            self._rails = rails
            for cache in (self.turns, self.stale):
                cache.resize(0)
                cache.resize(config.rag["turn_cache_size"])
        self.disabled_rerankers.clear()

    def _guard(self, patterns):
        guard = self._guards.get(patterns)
        if guard is None:
            guard = self._guards[patterns] = Guard(deny_patterns=patterns)
        return guard

    def _redactor(self, categories):
        redactor = self._redactors.get(categories)
        if redactor is None:
            redactor = self._redactors[categories] = Redactor(categories=categories)
        return redactor

    def screening(self, route=None):
        """A fresh Screening for one request to ``route`` (a ModelRoute; None: the global guardrails,
        as the MCP tools, which answer no model, use)."""
        rails = route.guardrails if route is not None else None
        return Screening(rails or self.app.config.guardrails, self._guard, self._redactor)

    def select_kbs(self, exchange):
        """``(names, left_out)``: the KBs to search for ``exchange`` and those of its model's
        mapping that the key's scope leaves out.

        A KB the client names itself (X-Ragproxy-KB, ``model+kb``) outside the
        scope is a 403 (an unknown one a 400, first); the mapping's KBs are
        cut down to the scope without a word to the client.
        """
        key = exchange.key
        header = exchange.request.headers.get(_KB_HEADER, "").strip()
        if header:
            if header.lower() == "off":
                return [], []
            names = [n.strip() for n in header.split(",") if n.strip()]
        elif exchange.kb_override is not None:
            names = exchange.kb_override
        else:
            names = list(exchange.route.kb)
            if key_scope(key) == "*":   # the usual: no scope to cut the mapping down to
                kept, left_out = names, []
            else:
                kept = [n for n in names if key_allows_kb(key, n)]
                left_out = [n for n in names if n not in kept]
            self._check_known(kept)
            return kept, left_out
        self._check_known(names)
        outside = [n for n in names if not key_allows_kb(key, n)]
        if outside:
            raise ClientError(403, f"knowledge base(s) outside this API key's scope: {', '.join(outside)} "
                                   f"(key '{key['name']}' may read: {', '.join(key['kbs']) or 'none'})",
                              "kb_not_in_scope")
        return names, []

    def _check_known(self, names):
        unknown = [n for n in names if self.kbs.get(n) is None]
        if unknown:
            raise ClientError(400, f"unknown knowledge base(s): {', '.join(unknown)}", "unknown_knowledge_base")

    def __call__(self, exchange):
        if exchange.endpoint.name not in _INJECTABLE:
            return
        screen = self.screening(exchange.route)
        try:
            screen.screen_input(exchange.endpoint.name, exchange.payload)
            self._rewrite(exchange, screen)
        finally:   # a refusal too is logged with what it found
            exchange.retrieval = exchange.retrieval or {}
            exchange.retrieval["guardrails"] = screen.log_fields()

    def _rewrite(self, exchange, screen):
        endpoint = exchange.endpoint.name
        names, left_out = self.select_kbs(exchange)
        if not names:
            if left_out:   # the request log says why a mapping with KBs injected nothing
                exchange.retrieval = {"kbs": [], "outcome": "out_of_scope", "mode": None, "query": None,
                                      "stages": {}}
            return
        rag = self.app.config.rag
        payload = exchange.payload
        route = exchange.route
        clock = time.perf_counter
        started = clock()
        in_place = route.inject_mode in _USER_TURN_MODES and uses_query(rag["inject_template"])
        raw, sent_at, located = self._raw_prefix(exchange)
        # Its last human turn found once, for all five, from where this conversation's last walk stopped.
        conversation = Conversation(endpoint, payload, self.turn_tails, located)
        try:
            turn = turn_key(endpoint, payload, raw, self.turn_texts, conversation, sent_at)
            later_round = bool(turn) and continues_turn(endpoint, payload, conversation)
            # Keyed by the key's scope too: a key never gets context retrieved for another.
            # And by the compression profile: its levers chose and ordered the chunks rendered.
            key = (turn, tuple(names), route.name, route.inject_mode, key_scope(exchange.key),
                   _compression_key(exchange)) if turn else None
            # Only a later round of the turn reuses what its first request got; the
            # first request of a turn (a new chat, a retry) retrieves and refreshes it.
            known = self.turns.get(key) if key and later_round else None
            if known is not None and rag["query_source"] in PREFIX_QUERY_SOURCES:
                query, question = known.query, known.question   # the turn's words: the key covers them
            else:
                query = extract_query(endpoint, payload, rag["query_source"], rag["max_query_bytes"], conversation)
                question = question_text(endpoint, payload, conversation) if in_place else query
        except RecursionError:  # nesting that json parsed with a few levels to spare
            raise ClientError(400, _TOO_DEEP) from None
        modes = sorted({self.kbs.get(n).spec.retrieval for n in names})
        stages = {}
        exchange.retrieval = {"kbs": names, "outcome": "skipped", "mode": "+".join(modes), "query": query,
                              "stages": stages}
        if not query.strip():
            return
        stages["query_build"] = clock() - started
        limit = route.max_input_tokens
        own_tokens = request_tokens(payload, self.count_tokens) if limit else 0
        if limit and own_tokens >= limit:   # no context can fit, and the client's words are not ours to cut
            screen.budget = {"limit": limit, "request_tokens": own_tokens, "cut": 0, "over": True}
            exchange.retrieval["outcome"] = "over_budget"
            return
        if known is not None:
            found = known.found
            exchange.retrieval["outcome"] = "cached"
        else:
            found = self._retrieve(exchange, names, query, question, in_place, screen)
            if key and found.outcome in ("retrieved", "no_match"):
                known = _Turn(found, query, question, {})
                self.turns.put(key, known)
        if limit and found.text:
            found = self._fit(found, limit, own_tokens, question, screen)
            if not found.text:
                exchange.retrieval["outcome"] = "over_budget"
        try:
            edits = inject_retrieved(exchange, found, conversation, self.encode_once_min,
                                     known and known.sent_texts) if found.text else ()
        except RecursionError:
            raise ClientError(400, _TOO_DEEP) from None
        if edits:
            exchange.edits += edits
            exchange.response_headers.append(("X-Ragproxy-Sources", ",".join(found.sources)))
        stages["total"] = clock() - started
        tokens = found.tokens(self.count_tokens)
        if found.replaces_question and tokens:  # the person's words were there already
            tokens = max(0, tokens - self.count_tokens(question))
        exchange.retrieval.update(sources=found.sources, hits=found.hits, ms=stages["total"] * 1000.0,
                                  context_tokens=tokens)

    @staticmethod
    def _raw_prefix(exchange):
        """turn_key's ``raw`` and ``sent_at`` and Conversation's ``located``: the client's own
        text of the conversation's first entries, where it lies in the body as sent, and where
        each entry lies (None, None, None without a body).

        The Members they find are left on ``exchange.members`` for the splice
        (jsonbody.with_edits), which needs the same spans; Members the proxy
        found as it parsed the body (jsonbody.json_object_with_members) are used as they are.
        """
        if not isinstance(exchange.request.body, bytes) or not exchange.request.body:
            return None, None, None

        def members_for(key):
            members, body = exchange.members, exchange.request.body
            if members is None or members.body is not body or key not in members.expand:
                members = exchange.members = Members(body, (key,))
            return members

        def raw(key, upto, marked):
            return raw_entries(members_for(key), key, upto, leave_out="cache_control", utf8=True, within=marked)

        return (raw, lambda key, upto: entries_span(members_for(key), key, upto),
                lambda key: entry_spans(members_for(key), key))

    def _fit(self, found, limit, own_tokens, question, screen):
        """``found`` with whole chunks cut from its end until the request, ``own_tokens``
        without it, fits ``limit``; ``found`` itself when it fits already.

        The recount uses the estimator the context's budget uses, and counts
        what the injection adds (in the person's words' place, the text less them).
        """
        rag = self.app.config.rag
        asked = self.count_tokens(question) if found.replaces_question else 0

        def added(text):
            return max(0, self.count_tokens(text) - asked) if text else 0

        chunks, text, context = list(found.chunks), found.text, found.context
        while chunks and own_tokens + added(text) > limit:
            chunks.pop()
            context = render_chunks(chunks, rag["chunk_template"] or DEFAULT_CHUNK_TEMPLATE, 1 << 62,
                                    self.count_tokens)[0] if chunks else ""
            text = fill_template(rag["inject_template"], context, question) if chunks else ""
        if own_tokens + added(text) > limit:   # no chunk left, or a found without its chunks
            chunks, text, context = [], "", ""
        cut = len(found.chunks) - len(chunks) if found.chunks else (0 if text else 1)
        screen.budget = {"limit": limit, "request_tokens": own_tokens, "cut": cut, "over": not text,
                         "tokens": own_tokens + added(text)}
        if not cut:
            return found
        return dataclasses.replace(found, text=text, context=context, chunks=tuple(chunks),
                                   sources=tuple(c["id"] for c in chunks))

    def _retrieve(self, exchange, names, query, question, in_place, screen):
        """Search, screen and render; ``question`` fills the template's {query}, in the
        person's words' place when ``in_place`` (which the budget then leaves out)."""
        rag = self.app.config.rag
        route = exchange.route
        policy = route.on_failure or rag["on_failure"]
        template = rag["inject_template"]
        stale_key = (tuple(names), query, key_scope(exchange.key), _compression_key(exchange))
        search_key = self._search_key(names, query, route, None, None)
        # The route's name stands for its guardrails, the compression key for its choice of chunks.
        render_key = (search_key, route.name, question, in_place, _compression_key(exchange)) \
            if search_key is not None else None
        rendered = self.renders.get(render_key) if render_key is not None else None
        if rendered is not None:
            found, screened = rendered
            screen.replay(screened)
            exchange.retrieval["outcome"] = found.outcome
            if found.sources:
                found = dataclasses.replace(found, at=self.app.clock())
                self.stale.put(stale_key, found)
            return found
        limit = Deadline((route.timeout_ms or rag["timeout_ms"]) / 1000.0)
        try:
            hits = self._searched(search_key, names, query, route, None, exchange.retrieval["stages"], limit, None)
        except (EmbeddingError, RerankError, StoreError, OSError, ValueError, _OutOfTime) as exc:
            log.warning("retrieval failed for %s (%s): %s", exchange.model, ",".join(names), exc)
            exchange.retrieval["outcome"] = "failed"
            exchange.retrieval["error"] = str(exc)
            if policy == "use_stale":
                old = self.stale.get(stale_key)
                if old is not None and self.app.clock() - old.at <= rag["stale_max_age"]:
                    exchange.retrieval["outcome"] = "stale"
                    return dataclasses.replace(old, outcome="stale", replaces_question=in_place,
                                               text=fill_template(template, old.context, question))
            if policy in ("fail_closed", "use_stale"):
                raise RetrievalFailed(f"knowledge-base retrieval failed: {exc}") from None
            exchange.retrieval["outcome"] = "degraded"
            return Retrieved("", (), "degraded")
        mark = screen.mark()
        chunks = screen.screen_chunks([dict(hit.chunk, content=hit.chunk.get("text", ""),
                                            score=round(hit.score, 4), kb=hit.kb) for hit in hits])
        if screen.dropped:   # what the request log and the header cite is what was injected
            kept = {c["id"] for c in chunks}
            hits = [hit for hit in hits if hit.id in kept]
        compression = getattr(exchange, "compression", None)
        if compression is not None and chunks:
            # The profile's rag_select and position_reorder pick and order ragproxy's own chunks
            # before they are rendered: no marked block to find in the request afterwards.
            order = compression.own_context(query, [{"text": c["content"], "score": hit.score}
                                                    for c, hit in zip(chunks, hits)])
            order = [i for i in order if isinstance(i, int) and 0 <= i < len(chunks)]
            chunks, hits = [chunks[i] for i in order], [hits[i] for i in order]
        context, used = "", []
        if chunks and rag["max_context_tokens"] > 0:
            # As render_context, except that the person's own words, when they
            # go in the template, are not context and cost none of its budget.
            frame = fill_template(template, "", "" if in_place else query)
            budget = rag["max_context_tokens"] - self.count_tokens(frame)
            context, used = render_chunks(chunks, rag["chunk_template"] or DEFAULT_CHUNK_TEMPLATE, budget,
                                          self.count_tokens)
        outcome = "retrieved" if used else "no_match"
        exchange.retrieval["outcome"] = outcome
        found = Retrieved(fill_template(template, context, question) if used else "", tuple(c["id"] for c in used),
                          outcome, self.app.clock(), tuple(hits), context, in_place, tuple(used))
        if used:
            self.stale.put(stale_key, found)
        if render_key is not None:
            self.renders.put(render_key, (found, screen.since(mark)))
        return found

    def search(self, names, query, route=None, top_k=None, stages=None, deadline=None, mode=None):
        """Search ``names`` and merge the lists per the route's ``kb_merge`` (concat without a route).

        Every KB is searched, priority's too: the floor (KB_FLOOR) needs the
        best hit of all of them before any one's hits can be kept.

        ``stages``, if given, collects seconds spent per stage (lexical, embed,
        dense, rerank) for the metrics.  ``deadline`` (an embeddings.Deadline)
        bounds the whole: embedding and rerank calls get no more than what is
        left of it, and no knowledge base is searched once it has passed
        (_OutOfTime).  A rerank that runs out of time keeps the fused order,
        as a rerank that fails does.  ``mode`` (lexical, dense, hybrid) searches
        every knowledge base that way instead of in its own retrieval mode.
        """
        return self._searched(self._search_key(names, query, route, top_k, mode),
                              names, query, route, top_k, stages, deadline, mode)

    def _searched(self, key, names, query, route, top_k, stages, deadline, mode):
        """search's hits, from the search cache when ``key`` (_search_key's) is there."""
        if key is not None:
            found = self.searches.get(key)
            if found is not None:
                return list(found)
        with time_limit(deadline):
            hits = self._search(names, query, route, top_k, stages, deadline, mode)
        if key is not None:
            self.searches.put(key, tuple(hits))
        return hits

    def _search_key(self, names, query, route, top_k, mode):
        """What a search's hits depend on, for the search cache; None when they depend on more.

        The committed generation of every KB is in it, so a commit is searched
        afresh: at once when made here, within CURRENT_MAX_AGE by another process.  A
        reranker is a server's judgement, and a KB on Chroma answers from a
        collection that changes without a local commit: neither is cached.
        """
        if self.searches.size <= 0 or (route is not None and route.rerank and self._reranker() is not None):
            return None
        rag = self.app.config.rag
        generations = []
        for name in names:
            kb = self.kbs.get(name)
            if kb is None or getattr(kb, "chroma", None) is not None:
                return None
            generation, _ = kb.current(CURRENT_MAX_AGE)
            # With its commit time: a KB deleted and built again starts at the same name.
            generations.append((generation.name, generation.created) if generation is not None else None)
        return (tuple(names), query, top_k or rag["top_k"], mode, route.kb_merge if route else None,
                rag["lexical_min_score"], rag["score_threshold"], tuple(generations))

    def _search(self, names, query, route, top_k, stages, deadline, mode):
        rag = self.app.config.rag
        top_k = top_k or rag["top_k"]
        rerank = bool(route and route.rerank) and self._reranker() is not None
        pool = max(top_k, rag["rerank_top_k"]) if rerank else top_k
        merge = route.kb_merge if route else ModelRoute.kb_merge   # no route (an MCP search): the default
        lists = []
        for name in names:
            if deadline is not None and deadline.remaining() <= 0:
                raise _OutOfTime(f"the retrieval time limit ({deadline.seconds * 1000:g} ms) ran out "
                                 f"before knowledge base {name!r} was searched")
            kb = self.kbs.get(name)
            hits = kb.search(query, pool, mode=mode, min_lexical=rag["lexical_min_score"],
                             min_dense=rag["score_threshold"] or None, timings=stages, max_age=CURRENT_MAX_AGE)
            lists.append((hits, _relevance(kb, query, hits, mode) if len(names) > 1 else [1.0] * len(hits)))
        merged = _merge(lists, merge)
        seen, unique = set(), []
        for hit in merged:  # the same passage from two KBs (or an overlap) is injected once
            digest = hit.chunk.get("hash") or hit.id
            if digest not in seen:
                seen.add(digest)
                unique.append(hit)
        if rerank:
            started = time.perf_counter()
            unique = self.rerank(query, unique[:pool])
            if stages is not None:
                stages["rerank"] = time.perf_counter() - started
        return unique[:top_k]

    def _reranker(self):
        providers = self.app.config.providers["rerank"]
        for name, provider in providers.items():
            if name not in self.disabled_rerankers:
                return RerankClient(provider, self.app.http)
        return None

    def rerank(self, query, hits):
        """``hits`` in the reranker's order with its scores; unchanged if reranking fails."""
        client = self._reranker()
        if client is None:
            return hits
        try:
            order = client.rerank(query, [h.chunk.get("text", "") for h in hits], len(hits))
        except RerankError as exc:
            if exc.permanent:
                self.disabled_rerankers[client.provider.name] = str(exc)
                log.error("reranker %s disabled until the config is reloaded: %s", client.provider.name, exc)
            else:
                log.warning("rerank failed, keeping the fused order: %s", exc)
            return hits
        out = []
        for index, score in order:
            if 0 <= index < len(hits):
                hit = hits[index]
                out.append(dataclasses.replace(hit, score=score, scores=dict(hit.scores, rerank=score)))
        return out or hits
