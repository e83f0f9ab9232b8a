"""The retrieval rewriter: select knowledge bases, search once per human turn, inject.

Runs between parsing a client's request and forwarding it (App.rewriters).
Agent loops send many requests per human turn; every one of them gets the
identical bytes at the identical place (a per-turn cache), so the
upstream's prompt-prefix cache holds.  When retrieval fails the route's
on_failure decides: degrade, fail closed, or reuse stale context.

May import: api, config, deps, embeddings, fusion, inject, npy.
"""
from __future__ import annotations

import collections
import dataclasses
import logging
import threading
import time

from . import deps
from .api import ClientError
from .config import valid_kb_name
from .embeddings import EmbeddingError, RerankClient, RerankError
from .fusion import reciprocal_ranks
from .inject import DEFAULT_CHUNK_TEMPLATE, estimate_tokens_text, extract_query, inject, render_context, turn_key
from .npy import StoreError

log = logging.getLogger("ragproxy")


_INJECTABLE = frozenset(("chat", "responses", "messages", "ollama_chat", "ollama_generate"))
_KB_HEADER = "x-ragproxy-kb"


class RetrievalFailed(Exception):
    """Retrieval failed and the model's policy is fail_closed (or stale context was too old)."""


@dataclasses.dataclass
class Retrieved:
    """What one human turn injected: the exact text and the chunk ids it cites."""

    text: str
    sources: tuple
    outcome: str            # retrieved, no_match, cached, stale
    at: float = 0.0
    hits: tuple = ()


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


class Retriever:
    """The request rewriter that puts knowledge-base context into requests."""

    def __init__(self, app, knowledge_bases):
        self.app = app
        self.kbs = knowledge_bases
        self.count_tokens = _tiktoken_counter() or estimate_tokens_text
        self.turns = _LRU(app.config.rag["turn_cache_size"])
        self.stale = _LRU(app.config.rag["turn_cache_size"])
        self._disabled_rerankers = set()

    def reconfigure(self, config):
        """After a reload: the caches take the new rag.turn_cache_size, and rerankers
        disabled by a permanent error get another chance."""
        for cache in (self.turns, self.stale):
            cache.resize(config.rag["turn_cache_size"])
        self._disabled_rerankers.clear()

    def select_kbs(self, exchange):
        header = exchange.request.headers.get(_KB_HEADER, "").strip()
        if header:
            if header.lower() == "off":
                return []
            names = [n.strip() for n in header.split(",") if n.strip()]
        elif exchange.kb_override is not None:
            names = exchange.kb_override
        else:
            names = list(exchange.route.kb)
        unknown = [n for n in names if self.kbs.get(n) is None]
        if unknown:
            raise ClientError(400, f"unknown knowledge base(s): {', '.join(unknown)}", "unknown_knowledge_base")
        return names

    def __call__(self, exchange):
        endpoint = exchange.endpoint.name
        if endpoint not in _INJECTABLE:
            return
        names = self.select_kbs(exchange)
        if not names:
            return
        rag = self.app.config.rag
        payload = exchange.payload
        clock = time.perf_counter
        started = clock()
        query = extract_query(endpoint, payload, rag["query_source"], rag["max_query_bytes"])
        modes = sorted({self.kbs.get(n).spec.retrieval for n in names})
        stages = {}
        exchange.retrieval = {"kbs": names, "outcome": "skipped", "mode": "+".join(modes), "query": query,
                              "stages": stages}
        if not query.strip():
            return
        turn = turn_key(endpoint, payload)
        stages["query_build"] = clock() - started
        key = (turn, tuple(names), exchange.route.name, exchange.route.inject_mode) if turn else None
        found = self.turns.get(key) if key else None
        if found is not None:
            exchange.retrieval["outcome"] = "cached"
        else:
            found = self._retrieve(exchange, names, query)
            if key and found.outcome in ("retrieved", "no_match"):
                self.turns.put(key, found)
        edits = inject(endpoint, payload, found.text, exchange.route.inject_mode) if found.text else ()
        if edits:
            exchange.edits += edits
            exchange.response_headers.append(("X-Ragproxy-Sources", ",".join(found.sources)))
        stages["total"] = clock() - started
        exchange.retrieval.update(sources=found.sources, hits=found.hits, ms=stages["total"] * 1000.0,
                                  context_tokens=self.count_tokens(found.text) if found.text else 0)

    def _retrieve(self, exchange, names, query):
        rag = self.app.config.rag
        policy = exchange.route.on_failure or rag["on_failure"]
        stale_key = (tuple(names), query)
        try:
            hits = self.search(names, query, exchange.route, stages=exchange.retrieval["stages"])
        except (EmbeddingError, RerankError, StoreError, OSError, ValueError) as exc:
            log.warning("retrieval failed for %s (%s): %s", exchange.model, ",".join(names), exc)
            exchange.retrieval["outcome"] = "failed"
            exchange.retrieval["error"] = str(exc)
            if policy == "use_stale":
                old = self.stale.get(stale_key)
                if old is not None and self.app.clock() - old.at <= rag["stale_max_age"]:
                    exchange.retrieval["outcome"] = "stale"
                    return dataclasses.replace(old, outcome="stale")
            if policy in ("fail_closed", "use_stale"):
                raise RetrievalFailed(f"knowledge-base retrieval failed: {exc}") from None
            exchange.retrieval["outcome"] = "degraded"
            return Retrieved("", (), "degraded")
        chunks = [dict(hit.chunk, content=hit.chunk.get("text", ""), score=round(hit.score, 4), kb=hit.kb)
                  for hit in hits]
        text, used = render_context(chunks, rag["inject_template"], rag["chunk_template"] or DEFAULT_CHUNK_TEMPLATE,
                                    rag["max_context_tokens"], query, count_tokens=self.count_tokens)
        outcome = "retrieved" if used else "no_match"
        exchange.retrieval["outcome"] = outcome
        found = Retrieved(text if used else "", tuple(c["id"] for c in used), outcome, self.app.clock(),
                          tuple(hits))
        if used:
            self.stale.put(stale_key, found)
        return found

    def search(self, names, query, route=None, top_k=None, stages=None):
        """Search ``names`` and merge the lists per the route's ``kb_merge``.

        ``stages``, if given, collects seconds spent per stage (lexical, embed,
        dense, rerank) for the metrics.
        """
        rag = self.app.config.rag
        top_k = top_k or rag["top_k"]
        rerank = bool(route and route.rerank) and self._reranker() is not None
        pool = max(top_k, rag["rerank_top_k"]) if rerank else top_k
        merge = route.kb_merge if route else "priority"
        lists = []
        for name in names:
            kb = self.kbs.get(name)
            hits = kb.search(query, pool, min_lexical=rag["lexical_min_score"],
                             min_dense=rag["score_threshold"] or None, timings=stages)
            if merge == "priority":
                lists.append(hits)
                if sum(len(h) for h in lists) >= pool:
                    break
            else:
                lists.append(hits)
        if merge == "priority":
            merged = [h for hits in lists for h in hits]
        elif merge == "concat":
            merged = sorted((h for hits in lists for h in hits), key=lambda h: -h.score)
        else:
            first = {}
            for hits in lists:
                for hit in hits:
                    first.setdefault((hit.kb, hit.row), hit)
            fused = reciprocal_ranks([([(hit.kb, hit.row) for hit in hits], 1.0) for hits in lists])
            # Ties keep the order of the knowledge bases as listed, then rank.
            merged = [dataclasses.replace(first[key], score=score)
                      for key, score in sorted(fused.items(), key=lambda item: -item[1])]
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
            if name not in self._disabled_rerankers:
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
                self._disabled_rerankers.add(client.provider.name)
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
