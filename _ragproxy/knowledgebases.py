"""The configured knowledge bases: their embedding clients, the background indexer, the shared dense-scan slot.

KnowledgeBases holds the configured ones (declared under knowledge_bases, or
only named by a model's kb: then over DATA_DIR/documents/<name>/ with default
settings), their embedding clients and the indexer thread; each one is a
kb.KnowledgeBase.  They take turns on one dense-scan slot (dense_scan_slots), as
they share numpy's BLAS threads, and a serving process imports numpy as its
indexer starts, off the request path.  The embedding client (and the HTTP
client under it) is made only for a KB on an embedding provider, so a lexical
search loads neither.

May import: deps, embeddings, kb, upstream, vectorstore.
"""
from __future__ import annotations

import contextlib
import logging
import os
import threading
import time

from . import deps
from .kb import KBSpec, KnowledgeBase
from .vectorstore import StoreSpec, VectorStoreError

log = logging.getLogger("ragproxy")


_BLAS_THREADS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def dense_scan_slots(environ, cpus):
    """How many dense scans may run at once: the CPUs over the threads BLAS gives each one,
    as the first of _BLAS_THREADS set in ``environ`` says; unset, BLAS takes every CPU: 1."""
    for name in _BLAS_THREADS:
        value = environ.get(name, "").strip()
        if value.isdigit() and int(value) > 0:
            return max(1, (cpus or 1) // int(value))
    return 1


class KnowledgeBases:
    """The configured knowledge bases, their embedders and the background indexer."""

    def __init__(self, config, data_dir, http_pool=None, clock=time.time, on_report=None, environ=None):
        self.data_dir = data_dir
        self.http = http_pool   # made when an embedding provider first needs one
        self.clock = clock
        self.on_report = on_report  # called with each IndexReport (metrics)
        self.kbs = {}
        self._signatures = {}
        self._full_requested = set()
        self._lock = threading.Lock()
        # Dense scans at once, process-wide: numpy's matrix-vector product runs on BLAS's own
        # threads, and scans side by side oversubscribe them (bench/dense_threads.py, 80k x 384,
        # 2 CPUs, 8 threads: 58 scans/s and 34 ms of CPU each side by side, 257/s and 7.7 ms one
        # at a time).  Where BLAS is held to fewer threads than there are CPUs, as many scans
        # as fit (OPENBLAS_NUM_THREADS=1: 319/s side by side, 158/s one at a time).
        slots = dense_scan_slots(os.environ if environ is None else environ, os.cpu_count())
        self._dense_scoring = threading.Lock() if slots == 1 else threading.BoundedSemaphore(slots)
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread = None
        self.configure(config)

    def configure(self, config):
        """Apply a (re)loaded config: KBs whose settings changed are rebuilt, others kept.

        KBs on the same embedding provider share one client, so one 429 pauses
        all of them and the disk cache has one writer.
        """
        self.config = config
        redact = config.guardrails["redact"]
        # Redacting at index time is the store's business, so it is global: every KB, every model.
        at_index = tuple(sorted(redact["categories"])) if redact["enabled"] and redact["at"] == "index" else ()
        stores = config.raw.get("vectorstore") or {}
        specs = {name: _kb_spec(name, raw, at_index, stores) for name, raw in config.knowledge_bases.items()}
        with self._lock:
            embedders, kbs = {}, {}
            for name, spec in specs.items():
                provider = config.providers["embedding"].get(spec.embedding) if spec.embedding else None
                signature = (spec, provider)
                if name in self.kbs and self._signatures.get(name) == signature:
                    kbs[name] = self.kbs[name]
                    if provider is not None:
                        embedders.setdefault(provider, kbs[name].embedder)
                    continue
                if provider is not None and provider not in embedders:
                    from .embeddings import EmbeddingClient
                    if self.http is None:
                        from .upstream import make_http_pool
                        self.http = make_http_pool()
                    embedders[provider] = EmbeddingClient(
                        provider, self.http, os.path.join(self.data_dir, "cache", "embedding"),
                        batch_size=provider.batch_size, max_concurrency=provider.max_concurrency)
                kbs[name] = KnowledgeBase(spec, self.data_dir, embedder=embedders.get(provider), clock=self.clock,
                                          dense_scoring=self._dense_scoring)
                self._signatures[name] = signature
                if name in config.undeclared_kbs:
                    _log_undeclared(name, config.undeclared_kbs[name], kbs[name].documents_dir)
            self.kbs = kbs
        if self._thread is not None:  # serving: a KB added by a reload gets its folder at once too
            self._make_documents_dirs()
        self._wake.set()

    def get(self, name):
        return self.kbs.get(name)

    def request_index(self, name=None, full=False):
        """Have the background indexer run soon: for one KB or all, incremental or full."""
        with self._lock:
            for kb_name in ([name] if name else list(self.kbs)):
                if full:
                    self._full_requested.add(kb_name)
                kb = self.kbs.get(kb_name)
                if kb is not None and kb.status["state"] == "idle":
                    kb.status["state"] = "queued"
        self._wake.set()

    def index_all(self, full=False):
        from .embeddings import EmbeddingRateLimited

        reports = []
        with self._lock:
            full_for, self._full_requested = self._full_requested, set()
        for kb in list(self.kbs.values()):
            try:
                if kb.chroma is not None and not kb.chroma.may_index():
                    continue  # a replica: the indexer writes Chroma, this process syncs its mirror
                reports.append(kb.index(full=full or kb.spec.name in full_for))
            except EmbeddingRateLimited as exc:
                log.warning("kb %s: embedding provider rate-limited; indexing paused: %s", kb.spec.name, exc)
            except Exception as exc:
                log.error("kb %s: indexing failed: %s", kb.spec.name, exc)
        for report in reports:
            if self.on_report is not None:
                self.on_report(report)
            if report.committed:   # each skipped file was logged, by the name it is cited as, when skipped
                log.info("indexed %s", report.summary())
        return reports

    def start(self):
        """Index at start-up and whenever sources change (polled every rag.index_interval s).

        Each KB's documents folder is made first, so whoever starts the proxy
        finds where to drop files (the default config names ``docs``).
        """
        self._make_documents_dirs()
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="indexer", daemon=True)
            self._thread.start()

    def _make_documents_dirs(self):
        for kb in list(self.kbs.values()):
            try:
                os.makedirs(kb.documents_dir, exist_ok=True)
            except OSError as exc:
                log.warning("kb %s: cannot create its documents folder %s: %s", kb.spec.name, kb.documents_dir,
                            exc.strerror or exc)

    def _run(self):
        if self.kbs:
            # A server searches many times over: numpy imported now, off the request path, spares
            # its first searches a loaded index's pure-Python path (BM25Index.NUMPY_MIN_POSTINGS):
            # on an 80k-chunk index the first eight requests took 8-17 ms each and the ninth, which
            # imported numpy, 73 ms; a search on numpy takes ~0.3 ms.
            deps.np
        last = None
        while not self._stop.is_set():
            interval = self.config.rag["index_interval"] or 3600
            if last is None or self._wake.is_set() or self.clock() - last >= interval:
                self._wake.clear()
                self.index_all()
                last = self.clock()
            # KBs on Chroma are polled more often: a replica syncs its mirror, an indexer renews its lease.
            polls = [kb.spec.store.sync_interval for kb in self.kbs.values() if kb.chroma is not None]
            for kb in list(self.kbs.values()):
                if kb.chroma is not None and kb.chroma.poll(kb.sync):
                    self._wake.set()  # it just became the indexer: index now, not in index_interval
            self._wake.wait(min([interval - (self.clock() - last)] + polls))
        self._release_leases()  # a poll racing stop() may have renewed one


    def stop(self, wait=None):
        """Stop the indexer after its current run; ``wait`` seconds at most for it to end (None: not at all).

        Chroma leases are handed on here, not only when the thread ends: a process exiting at once
        would otherwise leave its KBs without an indexer until the lease expires.
        """
        self._stop.set()
        self._wake.set()
        if wait is not None and self._thread is not None:
            self._thread.join(wait)
        self._release_leases()

    def indexer_running(self):
        """Whether the indexer thread is alive (stop() asks it to end after its current run)."""
        return self._thread is not None and self._thread.is_alive()

    def _release_leases(self):
        for kb in list(self.kbs.values()):
            if kb.chroma is not None:
                with contextlib.suppress(VectorStoreError):
                    kb.chroma.release()


def _log_undeclared(name, where, documents_dir):
    path, line, close = where
    log.log(logging.WARNING if close else logging.INFO,
            "knowledge base %r (named by %s%s) is not declared under knowledge_bases: serving %s with default "
            "settings; declare it to change them%s", name, path, f", line {line}" if line else "",
            documents_dir + os.sep, f" (or did you mean {close!r}?)" if close else "")


def _kb_spec(name, raw, redact=(), stores=None):
    chunking, bm25, weights = raw["chunking"], raw["bm25"], raw["weights"]
    return KBSpec(name=name, sources=tuple(raw["sources"]), include=tuple(raw["include"]),
                  exclude=tuple(raw["exclude"]), gitignore=raw["gitignore"], retrieval=raw["retrieval"],
                  embedding=raw["embedding"], strategy=chunking["strategy"], chunk_size=chunking["chunk_size"],
                  chunk_overlap=chunking["chunk_overlap"], k1=bm25["k1"], b=bm25["b"],
                  max_file_bytes=raw["max_file_bytes"], lexical_weight=weights["lexical"],
                  dense_weight=weights["dense"], fusion=raw["fusion"], compact=raw["compact"], redact=redact,
                  store=StoreSpec.from_config(raw.get("vectorstore", ""), stores or {}))
