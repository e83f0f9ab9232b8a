"""The knowledge-base tools MCP serves: search, list_knowledge_bases and read_source.

An agent in the middle of a task knows better than ragproxy's guess what it
needs to read, so the knowledge bases the proxy injects from are also offered
as tools.  KnowledgeTools owns what the protocol does not: each tool's
description and JSON Schemas (``tool_list(version)``), the checks of its
arguments, what it answers, and the request-log row and metrics of each call
(``call(name, arguments, key, ...)``, which returns ``(structured, text)`` or
raises ToolError, the failure a model can act on).  mcp.McpServer speaks the
protocol around it.

The app (proxy.App, or the one ``ragproxy.py mcp --stdio`` makes) is used
duck-typed: ``knowledge_bases``, ``retriever``, ``readable_kbs(key)``,
``config``, ``metrics``, ``request_log`` and ``clock``.  A tool answers only
from the knowledge bases ``readable_kbs`` names for the caller's key; one
that names another is a tool error, as a knowledge base still being indexed
or failing is.  What a tool returns goes through the global guardrails
(``retriever.screening()``), as injected context goes through a model's.

May import: api, embeddings, files, inject, metrics, npy.
"""
from __future__ import annotations

import dataclasses
import logging
import time

from .api import ClientError
from .embeddings import Deadline, EmbeddingError, RerankError
from .files import iso_utc
from .inject import line_range
from .metrics import MCP_TOOLS
from .npy import StoreError

log = logging.getLogger("ragproxy")

#: The revisions whose tools have a title and an outputSchema, and whose results structuredContent.
STRUCTURED_VERSIONS = frozenset(("2025-06-18", "2025-11-25", "2026-07-28"))

MAX_TOP_K = 50
SEARCH_TEXT_BUDGET = 24_000       # characters of passage text in one search answer
READ_LINE_LIMIT = 400             # lines, and characters, of one read_source answer
READ_CHAR_LIMIT = 32_000

INSTRUCTIONS = (
    "ragproxy serves the project's knowledge bases (indexed documentation and code). Call search with the "
    "words a passage would contain (identifiers, error messages, terms) before answering from memory; "
    "read_source reads more of a document around a hit; list_knowledge_bases says what each holds.")

_SEARCH_FAILED = ("the search failed (details are in ragproxy's log); try again, or search another knowledge base")


def shown(value, limit=80):
    """``value`` quoted for an error message, cut short: clients' strings can be anything."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


class ToolError(Exception):
    """A tool call that failed in a way the model can act on; ``outcome`` is error or denied."""

    def __init__(self, message, outcome="error"):
        super().__init__(message)
        self.outcome = outcome


@dataclasses.dataclass
class _Call:
    """What one tool call did, for the request log."""

    tool: str
    kbs: list = dataclasses.field(default_factory=list)
    mode: str = None
    query: str = None
    chunk_ids: list = dataclasses.field(default_factory=list)
    search_ms: float = None
    guardrails: dict = dataclasses.field(default_factory=dict)   # the screening's request-log fields


_STRING, _INTEGER, _NUMBER, _BOOLEAN = {"type": "string"}, {"type": "integer"}, {"type": "number"}, \
    {"type": "boolean"}

_SEARCH_INPUT = {
    "type": "object",
    "properties": {
        "query": {"type": "string", "minLength": 1, "description":
                  "What to look for, in the words the passage would use: identifiers, error messages, "
                  "terms of the domain. Plain words, not a question to a person."},
        "kb": {"type": "string", "minLength": 1, "description":
               "Search only this knowledge base (a name from list_knowledge_bases). Default: every one "
               "this client may read, merged in their configured order."},
        "top_k": {"type": "integer", "minimum": 1, "maximum": MAX_TOP_K, "description":
                  "How many passages to return (1-50). Default: the server's rag.top_k."},
        "mode": {"type": "string", "enum": ["lexical", "dense", "hybrid"], "description":
                 "lexical: BM25 on words (best for identifiers); dense: embedding similarity (meaning); "
                 "hybrid: both fused. Default: each knowledge base's own. dense and hybrid need a "
                 "knowledge base with embeddings."},
    },
    "required": ["query"],
    "additionalProperties": False,
}
_SEARCH_OUTPUT = {
    "type": "object",
    "properties": {
        "query": _STRING,
        "kbs": {"type": "array", "items": _STRING, "description": "The knowledge bases searched."},
        "results": {"type": "array", "items": {
            "type": "object",
            "properties": {
                "rank": _INTEGER, "kb": _STRING, "source": _STRING, "id": _STRING, "score": _NUMBER,
                "lines": {"type": "string", "description": "start-end, 1-based, when known"},
                "line_start": _INTEGER, "line_end": _INTEGER, "symbol": _STRING, "title": _STRING,
                "section": _STRING, "text": _STRING, "truncated": _BOOLEAN,
            },
            "required": ["rank", "kb", "source", "id", "score", "text"],
        }},
        "truncated": {"type": "boolean", "description": "Results or text were left out to stay within the "
                                                        "answer's size budget."},
        "notes": {"type": "array", "items": _STRING},
    },
    "required": ["query", "kbs", "results", "truncated", "notes"],
}
_LIST_INPUT = {"type": "object", "properties": {}, "additionalProperties": False}
_LIST_OUTPUT = {
    "type": "object",
    "properties": {"knowledge_bases": {"type": "array", "items": {
        "type": "object",
        "properties": {
            "name": _STRING,
            "retrieval": {"type": "string", "description": "lexical, dense or hybrid"},
            "state": {"type": "string", "enum": ["ready", "indexing", "failed", "not_indexed"]},
            "files": _INTEGER, "chunks": _INTEGER,
            "last_indexed": {"type": ["string", "null"], "description": "ISO 8601, UTC"},
            "sources": {"type": "array", "items": {
                "type": "object", "properties": {"name": _STRING, "files": _INTEGER},
                "required": ["name", "files"]}},
            "note": _STRING,
        },
        "required": ["name", "retrieval", "state", "files", "chunks", "last_indexed", "sources"],
    }}},
    "required": ["knowledge_bases"],
}
_READ_INPUT = {
    "type": "object",
    "properties": {
        "kb": {"type": "string", "minLength": 1, "description": "The knowledge base, as search results name it."},
        "source": {"type": "string", "minLength": 1, "description":
                   "The document, exactly as search results give its source (e.g. 'docs/guide/install.md')."},
        "start_line": {"type": "integer", "minimum": 1, "description": "First line wanted (1-based). Default 1."},
        "end_line": {"type": "integer", "minimum": 1, "description": "Last line wanted. Default: as far as one "
                                                                      "answer goes."},
    },
    "required": ["kb", "source"],
    "additionalProperties": False,
}
_READ_OUTPUT = {
    "type": "object",
    "properties": {
        "kb": _STRING, "source": _STRING, "text": _STRING,
        "line_start": _INTEGER, "line_end": _INTEGER,
        "last_line": {"type": "integer", "description": "The document's last indexed line (0: no line numbers)."},
        "truncated": _BOOLEAN,
        "next_start_line": {"type": ["integer", "null"], "description": "Pass as start_line to read on; null at "
                                                                        "the end."},
    },
    "required": ["kb", "source", "text", "line_start", "line_end", "last_line", "truncated", "next_start_line"],
}

_TOOLS = {
    "search": ("Search the knowledge bases", (
        "Search the project's knowledge bases (its indexed documentation and code) for passages about "
        "something. Use it before answering questions about this project from memory, and when you need "
        "an API, a config key, an error message or a design decision. Returns ranked passages, each with its "
        "knowledge base, source path, line range, symbol (for code), score and text; the whole answer is "
        f"bounded to about {SEARCH_TEXT_BUDGET:,} characters of text. To read more around a hit, call "
        "read_source with its kb and source and a line range."), _SEARCH_INPUT, _SEARCH_OUTPUT),
    "list_knowledge_bases": ("List the knowledge bases", (
        "List the knowledge bases this client may search: name, retrieval mode, files, chunks, state "
        "(ready, indexing, failed, not_indexed), when last indexed, and the source folders each covers. "
        "Call it to choose a kb for search or read_source, or when a search finds nothing."),
        _LIST_INPUT, _LIST_OUTPUT),
    "read_source": ("Read an indexed document", (
        "Read the indexed text of one document of a knowledge base, optionally only a line range, to read "
        "around a search hit. Give kb and source exactly as search results give them. One answer holds at "
        f"most {READ_LINE_LIMIT} lines and {READ_CHAR_LIMIT:,} characters; it says which start_line to ask "
        "for next. Text is as indexed: runs of blank lines may be collapsed."), _READ_INPUT, _READ_OUTPUT),
}
assert tuple(_TOOLS) == MCP_TOOLS, "the metrics' closed label set must name exactly these tools"

_JSON_TYPES = {"string": str, "integer": int, "number": (int, float), "boolean": bool, "object": dict,
               "array": list}


def _argument_problems(schema, args):
    """What is wrong with ``args`` for an input schema of the kind above (flat, typed properties)."""
    problems = []
    properties = schema["properties"]
    for name in schema.get("required", ()):
        if name not in args:
            problems.append(f"'{name}' is required")
    for name, value in args.items():
        spec = properties.get(name)
        if spec is None:
            known = ", ".join(properties) or "none"
            problems.append(f"unknown argument {shown(name, 40)} (arguments: {known})")
            continue
        kind = spec["type"]
        if not isinstance(value, _JSON_TYPES[kind]) or (kind in ("integer", "number") and isinstance(value, bool)):
            problems.append(f"'{name}' must be {'an' if kind[0] in 'aeiou' else 'a'} {kind}, "
                            f"not {_json_type(value)}")
            continue
        if "enum" in spec and value not in spec["enum"]:
            problems.append(f"'{name}' must be one of {', '.join(spec['enum'])}, not {shown(value, 40)}")
        if "minLength" in spec and len(value.strip()) < spec["minLength"]:
            problems.append(f"'{name}' must not be empty")
        if "minimum" in spec and value < spec["minimum"] or "maximum" in spec and value > spec["maximum"]:
            low, high = spec.get("minimum"), spec.get("maximum")
            problems.append(f"'{name}' must be {f'from {low} to {high}' if high is not None else f'at least {low}'}"
                            f", not {value}")
    return problems


def _json_type(value):
    for name, kind in (("null", type(None)), ("a boolean", bool), ("an integer", int), ("a number", float),
                       ("a string", str), ("an array", list), ("an object", dict)):
        if isinstance(value, kind):
            return name
    return type(value).__name__


def _cut(text, limit):
    """``text`` cut to at most ``limit`` characters, at a line break when one is near."""
    if len(text) <= limit:
        return text
    at = text.rfind("\n", 0, limit)
    return text[:at if at > limit // 2 else limit]


def _overlap(before, text, probe=16):
    """How many leading characters of ``text`` repeat the end of ``before`` (chunks overlap)."""
    head = text[:probe]
    if not head:
        return 0
    at = before.find(head)
    while at >= 0:
        if text.startswith(before[at:]):
            return len(before) - at
        at = before.find(head, at + 1)
    return 0



# -- the tools ---------------------------------------------------------------

class KnowledgeTools:
    """The tools over an app's knowledge bases; see the module docstring.

    ``indexer`` says whether something in this process indexes the knowledge
    bases: a KB without a committed index is then "indexing", else
    "not_indexed".
    """

    names = tuple(_TOOLS)
    instructions = INSTRUCTIONS

    def __init__(self, app, indexer=True):
        self.app = app
        self.indexer = indexer

    @staticmethod
    def tool_list(version):
        """The tools/list entries for MCP revision ``version``."""
        structured = version in STRUCTURED_VERSIONS
        tools = []
        for name, (title, description, input_schema, output_schema) in _TOOLS.items():
            tool = {"name": name, "description": description, "inputSchema": input_schema}
            if version != "2024-11-05":  # annotations came with 2025-03-26
                tool["annotations"] = {"title": title, "readOnlyHint": True, "openWorldHint": False}
            if structured:
                tool.update(title=title, outputSchema=output_schema)
            tools.append(tool)
        return tools

    def call(self, name, args, key, transport="http", streamed=False):
        """``(structured, text)``: what tool ``name`` (one of ``names``) answers ``args`` (a dict).

        ``key`` is the caller's api_keys entry (None without one).  A failure
        is a ToolError; the call is counted and logged whichever way it ends.
        """
        call = _Call(name)
        started = time.perf_counter()
        outcome, error = "ok", None
        try:
            problems = _argument_problems(_TOOLS[name][2], args)
            if problems:
                raise ToolError(f"invalid arguments for {name}: " + "; ".join(problems) + ".")
            structured, text = getattr(self, "_tool_" + name)(args, key, call)
        except ToolError as exc:
            outcome, error = exc.outcome, str(exc)
        except Exception as exc:  # a bug here must not end the session: the model gets a tool error
            log.exception("MCP tool %s failed", name)
            outcome, error = "error", f"{name} failed: internal error in ragproxy (details are in its log): " \
                                      f"{type(exc).__name__}"
        seconds = time.perf_counter() - started
        self._observe(call, outcome, seconds, error, key, transport, streamed)
        if error is not None:
            raise ToolError(error, outcome)
        return structured, text

    def _observe(self, call, outcome, seconds, error, key, transport, streamed):
        app = self.app
        app.metrics.observe_tool_call(call.tool, outcome, seconds)
        if app.request_log is None:
            return
        client = key.get("name", "") if isinstance(key, dict) else "stdio" if transport == "stdio" else ""
        app.request_log.record({
            "time": app.clock() - seconds, "client": client,
            "model": call.tool, "upstream": None, "endpoint": "mcp_tool", "kbs": call.kbs,
            "retrieval_mode": call.mode, "outcome": outcome, "chunk_ids": call.chunk_ids,
            "retrieval_ms": call.search_ms, "total_ms": seconds * 1000.0, "status": 200, "streamed": streamed,
            "error": error, "query": call.query, **call.guardrails})

    # -- knowledge bases -----------------------------------------------------

    def _readable(self, key):
        if self.app.knowledge_bases is None:
            return []
        return [n for n in self.app.readable_kbs(key) if self.app.knowledge_bases.get(n) is not None]

    def _readable_kb(self, name, readable):
        """The KnowledgeBase ``name`` if the caller may read it; a tool error (the same either way) if not."""
        if name in readable:
            return self.app.knowledge_bases.get(name)
        exists = self.app.knowledge_bases is not None and self.app.knowledge_bases.get(name) is not None
        raise ToolError(f"no knowledge base {shown(name, 60)} is available to this client (available: "
                        f"{', '.join(readable) or 'none'}); list_knowledge_bases describes them",
                        "denied" if exists else "error")

    def _state(self, kb):
        """``(state, generation)``: ready, indexing, failed or not_indexed, and the committed generation."""
        try:
            generation, _ = kb.current()
        except Exception as exc:  # a damaged index on disk: failing, as far as a client can tell
            log.warning("kb %s: cannot open its index: %s", kb.spec.name, exc)
            return "failed", None
        if generation is not None:
            return "ready", generation
        status = kb.live_status()
        if status.get("last_error"):
            return "failed", None
        if self.indexer or status.get("state") in ("indexing", "queued"):
            return "indexing", None
        return "not_indexed", None

    @staticmethod
    def _unavailable(name, state):
        if state == "indexing":
            return f"knowledge base {name!r} is still being indexed; try again shortly"
        if state == "failed":
            return (f"knowledge base {name!r} is failing: its indexing failed (details are in ragproxy's log); "
                    "whoever runs ragproxy must fix it")
        return (f"knowledge base {name!r} has not been indexed yet: run 'python ragproxy.py index {name}', or "
                "'python ragproxy.py serve', which indexes")

    def _tool_list_knowledge_bases(self, args, key, call):
        out, lines = [], []
        for name in self._readable(key):
            kb = self.app.knowledge_bases.get(name)
            state, generation = self._state(kb)
            manifest = generation.manifest if generation is not None else {}
            sources = []
            for label, _ in kb.source_roots():
                prefix = label + "/"
                sources.append({"name": label, "files": sum(1 for s in manifest if s == label or
                                                            s.startswith(prefix))})
            when = generation.created if generation is not None else None   # its commit time, as stats() gives
            item = {"name": name, "retrieval": kb.spec.retrieval, "state": state, "files": len(manifest),
                    "chunks": len(generation) if generation is not None else 0, "last_indexed": iso_utc(when),
                    "sources": sources}
            if state != "ready":
                item["note"] = self._unavailable(name, state)
            elif kb.live_status().get("last_error"):
                item["note"] = ("its last indexing run failed (details are in ragproxy's log); searches use the "
                                "last complete index")
            out.append(item)
            held = ", ".join(f"{s['name']} ({s['files']} files)" for s in sources)
            lines.append(f"- {name}: {item['retrieval']}, {state}, {item['files']} files, {item['chunks']} chunks, "
                         f"last indexed {item['last_indexed'] or 'never'}; sources: {held}"
                         + (f". {item['note']}" if "note" in item else ""))
            call.kbs.append(name)
        text = (f"{len(out)} knowledge base{'s' if len(out) != 1 else ''} this client may read:\n" + "\n".join(lines)
                if out else "No knowledge base is available to this client.")
        return {"knowledge_bases": out}, text

    def _ready_kbs(self, names, explicit, mode):
        """The KnowledgeBases of ``names`` that can answer now, and notes on the others.

        A knowledge base named by the caller that cannot answer is a tool error.
        """
        ready, notes = [], []
        for name in names:
            kb = self.app.knowledge_bases.get(name)
            state, _ = self._state(kb)
            problem = None
            if state != "ready":
                problem = self._unavailable(name, state)
            elif mode in ("dense", "hybrid") and kb.embedder is None:
                problem = (f"knowledge base {name!r} is lexical only (it has no embedding provider): search it "
                           "with mode 'lexical', or leave mode out")
            if problem is None:
                ready.append(kb)
            elif explicit:
                raise ToolError(problem)
            else:
                notes.append(problem)
        if not ready:
            raise ToolError(" ".join(notes) or "no knowledge base is available to this client")
        return ready, notes

    def _tool_search(self, args, key, call):
        rag = self.app.config.rag
        query = args["query"].strip()
        if len(query.encode("utf-8", "surrogatepass")) > rag["max_query_bytes"]:
            raise ToolError(f"the query is longer than {rag['max_query_bytes']} bytes (rag.max_query_bytes): "
                            "search with fewer, more telling words")
        top_k = min(args.get("top_k") or rag["top_k"], MAX_TOP_K)
        mode = args.get("mode")
        readable = self._readable(key)
        names = [self._readable_kb(args["kb"], readable).spec.name] if "kb" in args else readable
        call.query = query
        ready, notes = self._ready_kbs(names, "kb" in args, mode)
        call.kbs = [kb.spec.name for kb in ready]
        call.mode = "+".join(sorted({mode or kb.spec.retrieval for kb in ready}))
        deadline = Deadline(rag["timeout_ms"] / 1000.0)
        started = time.perf_counter()
        try:
            hits = self._ranked(ready, query, top_k, mode, deadline)
        except Exception as exc:
            expected = isinstance(exc, (EmbeddingError, RerankError, StoreError, OSError, ValueError))
            late = deadline.remaining() <= 0
            log.warning("MCP search in %s failed: %s", ",".join(call.kbs), exc, exc_info=not (expected or late))
            raise ToolError(f"the search ran out of time (rag.timeout_ms is {rag['timeout_ms']} ms); try again "
                            "shortly" if late else _SEARCH_FAILED) from None
        call.search_ms = (time.perf_counter() - started) * 1000.0
        hits = self._screened(hits, call)
        results, used, truncated = [], 0, False
        for rank, hit in enumerate(hits, 1):
            item = _result_item(rank, hit)
            room = SEARCH_TEXT_BUDGET - used
            if len(item["text"]) > room:
                truncated = True
                if results:
                    break
                item["text"], item["truncated"] = _cut(item["text"], room), True
            used += len(item["text"])
            results.append(item)
        if truncated:
            left = len(hits) - len(results)
            notes.append(f"the answer is limited to {SEARCH_TEXT_BUDGET:,} characters of text: "
                         + (f"{left} more result{'s' if left != 1 else ''} left out; " if left else "")
                         + "read a passage in full with read_source, or ask for fewer results (top_k)")
        call.chunk_ids = [r["id"] for r in results]
        where = ", ".join(call.kbs)
        if results:
            blocks = [f"{len(results)} passage{'s' if len(results) != 1 else ''} from {where} for {query!r}:"]
            blocks += [_result_block(r) for r in results]
        else:
            blocks = [f"No passage in {where} matches {query!r}. Try other words (identifiers, error messages, "
                      "terms the documents would use), or list_knowledge_bases to see what is indexed."]
        blocks += [f"Note: {n}" for n in notes]
        structured = {"query": query, "kbs": call.kbs, "results": results, "truncated": truncated, "notes": notes}
        return structured, "\n\n".join(blocks)

    def _ranked(self, kbs, query, top_k, mode, deadline):
        """The proxy's own search: the same ranking, thresholds and merge (no route: no rerank)."""
        return self.app.retriever.search([kb.spec.name for kb in kbs], query, None, top_k, deadline=deadline,
                                         mode=mode)

    def _screened(self, hits, call):
        """``hits`` through the global guardrails (see _screen), in their order."""
        kept = {chunk["id"]: chunk for chunk in self._screen([hit.chunk for hit in hits], call)}
        return [dataclasses.replace(hit, chunk=kept[hit.id]) for hit in hits if hit.id in kept]

    def _screen(self, chunks, call):
        """The chunk dicts the global guardrails let through, redacted, as injected context is.

        A tool's answer reaches the model as surely as injected context does:
        secrets are redacted, a poisoned passage is dropped (with ``deny`` the
        call is refused), and the request log records what was found.
        """
        screen = self.app.retriever.screening()
        try:
            kept = screen.screen_chunks([dict(c, content=c.get("text", "")) for c in chunks])
        except ClientError as exc:   # action: deny
            raise ToolError(exc.message, "denied") from None
        finally:
            call.guardrails = screen.log_fields()
        return [dict(c, text=c.pop("content")) for c in kept]

    def _tool_read_source(self, args, key, call):
        kb = self._readable_kb(args["kb"], self._readable(key))
        name = kb.spec.name
        call.kbs = [name]
        call.query = args["source"]
        self._ready_kbs([name], True, None)
        start, end = args.get("start_line", 1), args.get("end_line")
        if end is not None and end < start:
            raise ToolError(f"end_line ({end}) is before start_line ({start})")
        found = kb.source_chunks(args["source"])
        if found is None:
            raise ToolError(f"no indexed document {shown(args['source'], 120)} in knowledge base {name!r}: give "
                            "the source exactly as search results give it (search finds documents; "
                            "list_knowledge_bases names the source folders)")
        _, chunks = found
        source = chunks[0].get("source", args["source"]) if chunks else args["source"]
        last_line = max((c.get("line_end") or 0 for c in chunks), default=0)
        if last_line:
            picked = [c for c in chunks if (c.get("line_end") or 0) >= start
                      and (end is None or (c.get("line_start") or 0) <= end)]
            if not picked:
                raise ToolError(f"{source} has lines 1-{last_line} as indexed; start_line {start} is past its end")
        else:
            picked = chunks
        screened = self._screen(picked, call)
        withheld, picked = len(picked) - len(screened), screened
        if not picked:
            raise ToolError(f"ragproxy's guardrails withheld every passage of {source} asked for "
                            "(it looks like a prompt injection)", "denied")
        text, first, last, truncated, rest = _assemble(picked)
        call.chunk_ids = [c.get("id") for c in picked[:len(picked) - rest]]
        next_start = last + 1 if rest and last else None
        structured = {"kb": name, "source": source, "text": text, "line_start": first, "line_end": last,
                      "last_line": last_line, "truncated": truncated or bool(rest), "next_start_line": next_start}
        where = f"lines {first}-{last} of {last_line}" if last_line else "no line numbers"
        parts = [f"{source} ({where}, knowledge base {name}):", text]
        if truncated:
            parts.append(f"[a passage was longer than {READ_CHAR_LIMIT:,} characters and was cut]")
        if withheld:
            parts.append(f"[{withheld} passage{'s' if withheld != 1 else ''} of these lines withheld by ragproxy's "
                         f"guardrails: {'they look' if withheld != 1 else 'it looks'} like a prompt injection]")
        if next_start is not None:
            parts.append(f"[more: call read_source with start_line={next_start}]")
        return structured, "\n\n".join(parts)


def _assemble(chunks):
    """``(text, first_line, last_line, cut, rest)``: the chunks' text in order within the
    per-call limits, each overlap with the chunk before given once; ``rest`` chunks did not fit."""
    pieces, size, first, last, before = [], 0, 0, 0, None
    cut = False
    for n, chunk in enumerate(chunks):
        start, end = chunk.get("line_start") or 0, chunk.get("line_end") or 0
        text = chunk.get("text", "")
        if before is None:
            add = text
        elif start and start <= last:
            skip = _overlap(before, text)
            add = text[skip:] if skip else "\n" + text
        else:
            add = ("\n\n" if start > last + 1 else "\n") + text
        if pieces and (size + len(add) > READ_CHAR_LIMIT or (first and end - first + 1 > READ_LINE_LIMIT)):
            return "".join(pieces), first, last, cut, len(chunks) - n
        if size + len(add) > READ_CHAR_LIMIT:
            add, cut = _cut(add, READ_CHAR_LIMIT), True
        pieces.append(add)
        size += len(add)
        first = first or start
        last = max(last, end)
        before = text
    return "".join(pieces), first, last, cut, 0


def _result_item(rank, hit):
    chunk = hit.chunk
    item = {"rank": rank, "kb": hit.kb, "source": str(chunk.get("source", "")), "id": str(hit.id),
            "score": round(float(hit.score), 4)}
    start, end = chunk.get("line_start") or 0, chunk.get("line_end") or 0
    if start and end:  # the range as injected chunks are labelled with it: "362-389", or "12"
        item.update(lines=line_range(chunk), line_start=start, line_end=end)
    for key in ("symbol", "title"):
        if chunk.get(key):
            item[key] = str(chunk[key])
    if chunk.get("headings"):
        item["section"] = " > ".join(str(h) for h in chunk["headings"])
    item["text"] = str(chunk.get("text", ""))
    return item


def _result_block(item):
    where = item["source"] + (f" lines {item['lines']}" if "lines" in item else "")
    about = [f"kb {item['kb']}"] + [f"{key} {item[key]}" for key in ("symbol", "section") if key in item]
    about.append(f"score {item['score']:g}")
    text = item["text"] + ("\n[cut: read_source has the rest]" if item.get("truncated") else "")
    return f"[{item['rank']}] {where} ({', '.join(about)})\n{text}"
