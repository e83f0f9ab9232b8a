"""Context compression levers over a request's message list: rag_select, compact_serialization, position_reorder.

The retrieval levers of issue 18, as pure functions over the conversation
list of one request (``messages``; for Responses the ``input``) and the
request format's name (``marked.APIS``).  Each takes a token estimator (a
callable text -> int) and returns ``(messages, Outcome)``: the same object
when the lever did not apply, else a new list that shares every message it
did not change.  Not wired into the proxy yet.

* rag_select keeps the best chunks of each marked block (by the scores the
  application supplied or by lexical similarity to the block's query), in
  their original order; the query always stays.
* compact_serialization rewrites format="json" chunks as canonical JSON
  (no whitespace, members sorted by name, every number exactly as written,
  every string the same value), or as an sbproxy_table_v1 table when the chunk is an array of
  objects with the same scalar members and the table costs fewer tokens.
* position_reorder puts the best chunks at the edges of each block, where
  models attend most: rank 1 first, rank 2 last, rank 3 second, rank 4
  second to last, ...; no chunk's bytes change.

Commit rule: rag_select and compact_serialization replace the list only
when the estimate strictly drops; position_reorder when it does not rise.
A malformed or too large marked context makes a lever skip the whole list
(marked.parse_request judges the whole request first, so there is never a
partial rewrite).  Token counts in an Outcome cover the texts that hold
marked blocks (the rest of the list is unchanged by every lever here).
Everything is deterministic: the same input gives the same bytes.

May import: marked, text.
"""
from __future__ import annotations

import collections
import dataclasses
import json
import math

from . import marked
from .text import Analyzer

RANKINGS = ("auto", "supplied", "lexical")
REASONS = (
    "applied", "no_marked_context", "malformed_marked_context", "marked_context_too_large",
    "missing_relevance_score", "no_selected_chunks", "no_structured_chunks", "unsafe_structured_shape",
    "already_ordered", "not_needed", "no_savings",
    # window_fit and summary_buffer (window.py, summary.py)
    "not_eligible", "unknown_model_window", "missing_session", "structured_request",
    "summarizer_failed", "state_unavailable", "summary_busy", "lever_error",
)
_SKIP_OF_STATUS = {"none": "no_marked_context", "malformed": "malformed_marked_context",
                   "too_large": "marked_context_too_large"}
TABLE_FORMAT = "sbproxy_table_v1"


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What a lever did.  Token counts cover the texts holding marked blocks (0 and 0 when there are none)."""
    lever: str
    applied: bool
    reason: str                  # one of REASONS ("applied" when applied)
    tokens_before: int = 0
    tokens_after: int = 0
    detail: str = ""             # for a malformed or too large context: where and what (no request text)


def _skip(lever, reason, before=0, detail=""):
    return Outcome(lever, False, reason, before, before, detail)


def _context(lever, messages, api, estimate, min_tokens=0):
    """``(RequestContext, tokens, None)`` when the request has marked context worth the lever,
    else ``(None, tokens or 0, skip Outcome)``: none usable, or fewer tokens than ``min_tokens``."""
    found = marked.parse_request(messages, api)
    if found.status != "ok":
        return None, 0, _skip(lever, _SKIP_OF_STATUS[found.status], detail="" if found.error is None
                              else found.describe())
    before = _tokens(found, estimate)
    if before < min_tokens:
        return None, before, _skip(lever, "not_needed", before)
    return found, before, None


def _tokens(found, estimate):
    return sum(estimate(marked.render(segments)) for _, segments in found.texts)


def _commit(lever, messages, found, edit, estimate, before, strict=True):
    """Apply ``edit`` (Block -> Block) to every block; the new list when the estimate allows, else the old."""
    new_texts = []
    for path, segments in found.texts:
        new_texts.append((path, marked.render([s if isinstance(s, str) else edit(s) for s in segments])))
    after = sum(estimate(t) for _, t in new_texts)
    if after > before or (strict and after == before):
        return messages, Outcome(lever, False, "no_savings", before, before)
    out = messages
    for path, text in new_texts:
        out = marked.replaced(out, path, text)
    return out, Outcome(lever, True, "applied", before, after)


def _blocks(found):
    return [s for _, segments in found.texts for s in segments if isinstance(s, marked.Block)]


# -- ranking ---------------------------------------------------------------

def lexical_scores(query, texts, analyzer=None):
    """Cosine between TF-IDF vectors of ``query`` and each of ``texts`` (no model): floats in [0, 1].

    Terms are the BM25 analyzer's (stemmed, stopwords out); idf is
    ln((1 + N) / (1 + df)) + 1 over the N texts (the chunks of one block),
    term weights are tf * idf, and both vectors are L2-normalised.  A text
    or query with no terms scores 0.
    """
    analyzer = analyzer or Analyzer()
    counts = [collections.Counter(analyzer.tokens(t)) for t in texts]
    df = collections.Counter(term for c in counts for term in c)
    n = len(texts)

    def vector(counter):
        weights = {t: tf * (math.log((1 + n) / (1 + df[t])) + 1) for t, tf in counter.items()}
        norm = math.sqrt(math.fsum(w * w for w in weights.values()))
        return {t: w / norm for t, w in weights.items()} if norm else {}

    q = vector(collections.Counter(analyzer.tokens(query)))
    out = []
    for c in counts:
        v = vector(c)
        out.append(min(1.0, math.fsum(w * v[t] for t, w in sorted(q.items()) if t in v)))
    return out


def rank(query, texts, scores, ranking, analyzer=None):
    """Indexes of ``texts`` best first, and each one's score in [0, 1]; None when ``supplied`` lacks a score.

    ``scores`` holds each text's supplied score or None.  ``auto`` uses them
    when every text has one, else lexical_scores against ``query``.  The
    ranking of the retrieval levers, for marked blocks and for ragproxy's own
    chunks (levers.Profile.own_context) alike.
    """
    supplied = all(s is not None for s in scores)
    if ranking == "supplied" or (ranking == "auto" and supplied):
        if not supplied:
            return None
        values = list(scores)
    else:
        values = lexical_scores(query, texts, analyzer)
    # Ties go to the earlier text: the application's own order breaks them.
    return sorted(range(len(values)), key=lambda k: (-values[k], k)), values


def select(ranked, scores, texts, drop_empty=False, min_relevance_percent=None, max_chunks=None):
    """rag_select's keep rule: the indexes of ``ranked`` (best first) that stay, in their original order.

    A text goes when it is blank (``drop_empty``), when its score is below
    ``min_relevance_percent`` / 100, or when it ranks past ``max_chunks``.
    Empty when none stays (the caller then keeps them all: dropping every
    retrieved chunk is not a trim).
    """
    keep = [k for k in ranked
            if not (drop_empty and not texts[k].strip())
            and not (min_relevance_percent is not None and scores[k] * 100 < min_relevance_percent)]
    if max_chunks is not None:
        keep = keep[:max_chunks]
    return sorted(keep)


def _ranked(block, ranking, analyzer):
    """rank() over a marked block's chunks."""
    return rank(block.query, [c.text for c in block.chunks], [c.score for c in block.chunks], ranking, analyzer)


def _check_ranking(ranking):
    if ranking not in RANKINGS:
        raise ValueError("ranking is one of %s, not %r" % (", ".join(RANKINGS), ranking))


def _check_count(name, value, low, high=None, optional=False):
    """A lever argument in range (the config layer reports them to users; this guards the function)."""
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < low or \
            (high is not None and value > high):
        raise ValueError("%s must be a number from %s%s, not %r" % (name, low, "" if high is None else
                                                                   " to %s" % high, value))


# -- rag_select ------------------------------------------------------------

def rag_select(messages, api, estimate, min_tokens=0, ranking="auto", max_chunks=None,
               min_relevance_percent=None, drop_empty=False, analyzer=None):
    """Keep, in each marked block, the chunks that rank well enough; drop the rest.

    A chunk goes when it is empty or blank (``drop_empty``), when its score
    (supplied or lexical, both in [0, 1]) is below ``min_relevance_percent``
    / 100, or when it ranks below ``max_chunks`` within its block.  Kept
    chunks stay in their order.  A block that would keep none of its chunks
    is left whole (dropping every retrieved chunk is not a trim); when that
    leaves nothing to do the reason is no_selected_chunks.  With ``supplied``
    ranking every chunk must carry a score (missing_relevance_score);
    ``auto`` uses the scores in a block where all chunks have one, lexical
    similarity elsewhere.
    """
    _check_ranking(ranking)
    _check_count("min_tokens", min_tokens, 0)
    _check_count("max_chunks", max_chunks, 1, optional=True)
    _check_count("min_relevance_percent", min_relevance_percent, 0, 100, optional=True)
    lever = "rag_select"
    found, before, skipped = _context(lever, messages, api, estimate, min_tokens)
    if skipped:
        return messages, skipped
    analyzer = analyzer or Analyzer()
    kept_of, emptied = {}, False
    for block in _blocks(found):
        if not block.chunks:
            continue
        ranked = _ranked(block, ranking, analyzer)
        if ranked is None:
            return messages, _skip(lever, "missing_relevance_score", before)
        order, scores = ranked
        keep = select(order, scores, [c.text for c in block.chunks], drop_empty, min_relevance_percent, max_chunks)
        if not keep:
            emptied = True
        elif len(keep) < len(block.chunks):
            kept_of[id(block)] = keep
    if not kept_of:
        return messages, _skip(lever, "no_selected_chunks" if emptied else "no_savings", before)

    def edit(block):
        keep = kept_of.get(id(block))
        return block if keep is None else block.with_chunks(block.chunks[k] for k in keep)
    return _commit(lever, messages, found, edit, estimate, before)


# -- position_reorder ------------------------------------------------------

def edge_order(ranked):
    """``ranked`` (best first) laid out best at the edges: 1st, 3rd, 5th, ..., 6th, 4th, 2nd."""
    return list(ranked[0::2]) + list(ranked[1::2])[::-1]


def position_reorder(messages, api, estimate, ranking="auto", analyzer=None):
    """Reorder each block's chunks so the best ones sit first and last (edge_order); bytes kept."""
    _check_ranking(ranking)
    lever = "position_reorder"
    found, before, skipped = _context(lever, messages, api, estimate)
    if skipped:
        return messages, skipped
    analyzer = analyzer or Analyzer()
    order_of = {}
    for block in _blocks(found):
        if len(block.chunks) < 2:
            continue
        ranked = _ranked(block, ranking, analyzer)
        if ranked is None:
            return messages, _skip(lever, "missing_relevance_score", before)
        order = edge_order(ranked[0])
        if order != sorted(order):
            order_of[id(block)] = order
    if not order_of:
        return messages, _skip(lever, "already_ordered", before)

    def edit(block):
        order = order_of.get(id(block))
        return block if order is None else block.with_chunks(block.chunks[k] for k in order)
    return _commit(lever, messages, found, edit, estimate, before, strict=False)


# -- compact_serialization -------------------------------------------------

class UnsafeJSON(ValueError):
    """JSON this lever must not rewrite: invalid, duplicate member names, non-finite or too deep."""


class _Number(str):
    """A JSON number kept as its lexeme, so rewriting never rounds it."""


def _pairs(pairs):
    names = [name for name, _ in pairs]
    if len(set(names)) != len(names):
        raise UnsafeJSON("duplicate member name")
    return dict(pairs)


def _constant(name):
    raise UnsafeJSON("%s is not JSON" % name)


def load_json(text):
    """Parse ``text`` keeping numbers as written; UnsafeJSON for anything compact_serialization must leave."""
    try:
        return json.loads(text, object_pairs_hook=_pairs, parse_float=_Number, parse_int=_Number,
                          parse_constant=_constant)
    except RecursionError:
        raise UnsafeJSON("nested too deeply") from None
    except UnsafeJSON:
        raise
    except ValueError as exc:
        raise UnsafeJSON("not JSON: %s" % exc) from None


def _string(s):
    text = json.dumps(s, ensure_ascii=False)
    # A lone surrogate would not survive UTF-8 on the way upstream: keep it escaped.
    if any("\ud800" <= ch <= "\udfff" for ch in s):
        text = json.dumps(s)
    return text


def canonical_json(value):
    """Whitespace-free JSON of ``value``: members sorted by name, numbers as load_json kept them."""
    if isinstance(value, str):
        return value if isinstance(value, _Number) else _string(value)
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise UnsafeJSON("non-finite number")
        return repr(value)
    if isinstance(value, dict):
        return "{" + ",".join(_string(k) + ":" + canonical_json(value[k]) for k in sorted(value)) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(canonical_json(v) for v in value) + "]"
    raise TypeError("not a JSON value: %s" % type(value).__name__)


def _is_scalar(value):
    return value is None or isinstance(value, (str, bool, int, float))


def table_columns(value, min_rows=2):
    """The sorted member names when ``value`` can be a table (``min_rows`` or more objects with the
    same non-empty set of names, every value a scalar), else None."""
    if not isinstance(value, list) or len(value) < max(1, min_rows) or not all(isinstance(r, dict) for r in value):
        return None
    names = sorted(value[0])
    if not names or any(sorted(r) != names or not all(_is_scalar(v) for v in r.values()) for r in value):
        return None
    return names


def encode_table(rows, columns=None):
    """sbproxy_table_v1 text of ``rows`` (lines joined by LF, no final LF): the sorted column names
    as a JSON array, then one line per row of canonical JSON scalars separated by tabs."""
    columns = columns if columns is not None else table_columns(rows, 1)
    if columns is None:
        raise ValueError("not a table: rows must be objects with the same scalar members")
    lines = [canonical_json(columns)]
    lines += ["\t".join(canonical_json(row[c]) for c in columns) for row in rows]
    return "\n".join(lines)


def decode_table(text):
    """The rows (a list of dicts) of sbproxy_table_v1 ``text``; ValueError when it is not one.

    Canonical JSON scalars never hold a raw tab or line break, so splitting
    on them is exact; a CRLF body decodes the same as LF.
    """
    lines = text.replace("\r\n", "\n").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if not lines:
        raise ValueError("an sbproxy_table_v1 table starts with its column names")
    columns = json.loads(lines[0])
    if not isinstance(columns, list) or not columns or not all(isinstance(c, str) for c in columns) \
            or columns != sorted(set(columns)):
        raise ValueError("the first line is a sorted JSON array of distinct column names")
    rows = []
    for number, line in enumerate(lines[1:], 2):
        cells = line.split("\t")
        if len(cells) != len(columns):
            raise ValueError("line %d has %d cells, not %d" % (number, len(cells), len(columns)))
        values = [json.loads(cell) for cell in cells]
        if not all(_is_scalar(v) for v in values):
            raise ValueError("line %d holds a value that is not a scalar" % number)
        rows.append(dict(zip(columns, values)))
    return rows


def _with_newline(text, nl):
    return text.replace("\n", nl) + nl


def compact_serialization(messages, api, estimate, min_tokens=0, tabular=True, tabular_min_rows=2):
    """Rewrite each format="json" chunk as canonical JSON, or as a table when that is cheaper still.

    A chunk that is not valid JSON, repeats a member name at any depth, or
    holds a non-finite number stays byte for byte (unsafe_structured_shape
    when no chunk could be rewritten).  The table is used when ``tabular``
    is on, the array has at least ``tabular_min_rows`` rows, and its
    estimate is strictly lower than the canonical JSON's.
    """
    _check_count("min_tokens", min_tokens, 0)
    _check_count("tabular_min_rows", tabular_min_rows, 1)
    lever = "compact_serialization"
    found, before, skipped = _context(lever, messages, api, estimate, min_tokens)
    if skipped:
        return messages, skipped
    rewritten, json_chunks, unsafe = {}, 0, 0
    for block in _blocks(found):
        for chunk in block.chunks:
            if chunk.format != "json":
                continue
            json_chunks += 1
            try:
                value = load_json(chunk.body)
                compact = canonical_json(value)
            except (UnsafeJSON, RecursionError):
                unsafe += 1
                continue
            fmt, body = "json", compact
            columns = table_columns(value, tabular_min_rows) if tabular else None
            if columns is not None:
                table = encode_table(value, columns)
                if estimate(table) < estimate(compact):
                    fmt, body = TABLE_FORMAT, table
            new = dataclasses.replace(chunk, format=fmt, body=_with_newline(body, block.newline))
            if new != chunk:
                rewritten[id(chunk)] = new
    if not rewritten:
        reason = "no_structured_chunks" if not json_chunks else \
            "unsafe_structured_shape" if unsafe == json_chunks else "no_savings"
        return messages, _skip(lever, reason, before)

    def edit(block):
        return block.with_chunks(rewritten.get(id(c), c) for c in block.chunks)
    return _commit(lever, messages, found, edit, estimate, before)
