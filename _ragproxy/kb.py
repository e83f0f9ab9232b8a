"""A knowledge base: its sources, incremental indexing and search.

A KnowledgeBase turns its sources into generations of the vector store and
answers searches from the committed generation: BM25 always, dense vectors
when an embedding provider is configured, both fused (by default on scores
scaled to each retriever's own distribution; reciprocal rank on request).
Indexing is incremental (a manifest of size, mtime and content hash per
source) and runs beside queries, which keep using the last committed
generation until the next commit is complete.  The configured set, their
embedding clients and the indexer thread are knowledgebases'; where worker
processes share one indexer, it gives a KB a ``status_source``, and stats()
shows the indexing worker's live status rather than this process's idle one.

What only some knowledge bases need is imported where it is used: the
document extractors by indexing, the embeddings module by dense and hybrid
ones, so a lexical search loads neither.

With guardrails.redact at: index, chunk text is redacted before it is
stored (and embedded, and its terms indexed), so secrets never reach the store.

A knowledge base on Chroma (``vectorstore: chroma_http``) keeps its chunks,
vectors and file records on the server, the shared truth, and a local mirror
here: the same generations without vectors, so lexical search and the BM25
half of hybrid run exactly as on the built-in store; dense top-k asks Chroma
(chromastore.ChromaKB).

May import: bm25, chromastore, chunking, defaults, docfolder, documents, embeddings, files, fusion, redact, sources,
store, text, vectorstore.
"""
from __future__ import annotations

import collections
import contextlib
import dataclasses
import itertools
import json
import logging
import os
import threading
import time

from .bm25 import BM25Index
from .defaults import BM25_B, BM25_K1, DEFAULT_CHUNK_OVERLAP, DEFAULT_CHUNK_SIZE, DEFAULT_MAX_BYTES
from .docfolder import UPLOAD_MANIFEST, read_manifest
from .files import atomic_write
from .fusion import FUSION_DEPTH, rrf, zscore_fusion
from .sources import scan_roots, source_roots
from .store import ForwardIndex, KBStore
from .text import ANALYZER_VERSION, Analyzer
from .vectorstore import BuiltinStore, StoreSpec

log = logging.getLogger("ragproxy")


_BM25_META = "bm25.json"
_SETTINGS_FILE = "settings.json"
# Beside the generations, not in one: the latest run's sources, warnings and
# skipped files change without a new generation, and another process (the
# CLI, a restarted proxy) must see them.
_STATE_FILE = "index_state.json"
_BAD_STATES = ("missing", "unreadable")
_COMPACT_KINDS = {"int8": "i8", "float16": "f16", "binary": "b1"}  # config name -> vector store name


@dataclasses.dataclass(frozen=True)
class KBSpec:
    """A ``knowledge_bases`` entry, validated."""

    name: str
    sources: tuple = ()
    include: tuple = ()
    exclude: tuple = ()
    gitignore: bool = True
    retrieval: str = "lexical"
    embedding: str = ""
    strategy: str = "auto"
    chunk_size: int = DEFAULT_CHUNK_SIZE
    chunk_overlap: int = DEFAULT_CHUNK_OVERLAP
    k1: float = BM25_K1
    b: float = BM25_B
    max_file_bytes: int = DEFAULT_MAX_BYTES
    lexical_weight: float = 1.0
    dense_weight: float = 1.0
    fusion: str = "zscore"
    compact: str = ""
    redact: tuple = ()   # categories redacted before chunks are stored (guardrails.redact at: index)
    store: StoreSpec = StoreSpec()


@dataclasses.dataclass
class Hit:
    """One retrieved chunk; ``scores`` says how each retriever rated it."""

    kb: str
    row: int
    chunk: dict
    score: float
    scores: dict = dataclasses.field(default_factory=dict)
    ranks: dict = dataclasses.field(default_factory=dict)  # 1-based rank per retriever, and "fused"

    @property
    def id(self):
        return self.chunk["id"]


@dataclasses.dataclass
class IndexReport:
    kb: str
    added: int = 0
    changed: int = 0
    deleted: int = 0
    unchanged: int = 0
    chunks: int = 0
    generation: str = ""
    # (name, reason), the name as chunks cite the file: an upload's original name
    skipped: list = dataclasses.field(default_factory=list)
    deferred: list = dataclasses.field(default_factory=list)  # (name, reason): retried next run
    seconds: float = 0.0
    committed: bool = False
    redactions: dict = dataclasses.field(default_factory=dict)  # category -> n, redacted at index time
    sources: list = dataclasses.field(default_factory=list)  # each root's state as the run found it (source_status)

    def summary(self):
        redacted = sum(self.redactions.values())
        return (f"{self.kb}: {self.added} added, {self.changed} changed, {self.deleted} deleted, "
                f"{self.unchanged} unchanged, {len(self.skipped)} skipped, {len(self.deferred)} deferred; "
                f"{self.chunks} chunks in {self.generation or 'no generation'} ({self.seconds:.2f} s)"
                + (f"; {redacted} redactions" if redacted else ""))


# -- the knowledge base -------------------------------------------------------

class KnowledgeBase:
    """One knowledge base: its sources, its store and its search."""

    def __init__(self, spec, data_dir, embedder=None, clock=time.time, dense_scoring=None):
        self.spec = spec
        self.data_dir = os.path.abspath(data_dir)
        self.root = os.path.join(self.data_dir, "vectordb", spec.name)
        self.documents_dir = os.path.join(self.data_dir, "documents", spec.name)
        self.embedder = embedder
        self.clock = clock
        self.analyzer = Analyzer()
        self.store = KBStore(self.root, compact=_COMPACT_KINDS.get(spec.compact), clock=clock)
        self.chroma = None  # on Chroma: the store there, the role, the mirror's sync (self.store is the mirror)
        if spec.store.type == "chroma_http":
            from .chromastore import ChromaKB
            self.chroma = ChromaKB(spec.name, spec.store, self.current, self._write_mirror, clock=clock,
                                   mirror=self.root)
        self.vectors = self.chroma.store if self.chroma is not None else BuiltinStore(self.store)
        self._index_lock = threading.Lock()
        self._state_lock = threading.Lock()
        # Taken around a dense scan of the built-in store: the KBs of one process share it
        # (KnowledgeBases passes its own, a lock or a few slots), as they share numpy's BLAS threads.
        self.dense_scoring = dense_scoring if dense_scoring is not None else threading.Lock()
        self._loaded = None  # (generation, bm25 index)
        self._redactor = None  # made on the first chunks to redact (spec.redact)
        self.status = {"state": "idle", "done": 0, "total": 0, "chunks": 0, "last_indexed": None,
                       "last_error": None, "last_report": None}
        self._logged_states = {}  # source -> the state last logged, so a poll logs only a change
        self._state_cache = None  # (stat key of _STATE_FILE, its contents)
        # Where another process indexes this KB (knowledgebases' share_indexer), this process's own
        # status stays idle: stats() shows what ``status_source(self)`` says instead, a dict shaped
        # like ``status`` (plus "state_reason" and, on Chroma, "store") that it must give without raising.
        self.status_source = None

    # -- sources ------------------------------------------------------------

    def source_roots(self):
        """``(label, path)`` for the KB's documents folder, then each configured source."""
        return [(root["label"], root["path"]) for root in self._roots()]

    @property
    def documents_label(self):
        """The label the documents folder's files are cited under: the KB's name unless a source has it."""
        return self._roots()[0]["label"]

    def _roots(self):
        return source_roots(self.spec.name, self.data_dir, self.documents_dir, self.spec.sources)

    def scan(self):
        """Every indexable file: ``{source_id: (path, size, mtime_ns)}``."""
        return self._scan()[0]

    def source_status(self):
        """The state of the documents folder and of each configured source, as stats() lists them.

        ``{source, path, label, kind, state, files, message}``: ``state`` is
        "ok", "missing" (no such path, or a pattern whose folder does not
        exist), "unreadable" (cannot be listed or read) or "empty" (there, but
        no file matches ``include``/``exclude``); ``files`` counts the files
        the indexer would read.  A walk of the sources with stats, no file is read.
        """
        return self._scan()[1]

    def readable_source_count(self, sources=None):
        """How many roots (the documents folder included) hold files to index; 0: no readable source at all."""
        return sum(1 for s in (self.source_status() if sources is None else sources) if s["state"] == "ok")

    def _scan(self):
        spec = self.spec
        return scan_roots(self._roots(), spec.include, spec.exclude, spec.gitignore, skip={UPLOAD_MANIFEST})

    # -- indexing -----------------------------------------------------------

    def index(self, full=False, progress=None):
        """Bring the store up to date with the sources; returns an IndexReport.

        Only added and changed files are read, chunked and embedded; unchanged
        ones are carried over row for row.  A file whose embedding failed for a
        passing reason keeps its previous version and is retried next run.
        """
        with self._index_lock:
            started = self.clock()
            report = IndexReport(self.spec.name)
            self.status.update(state="indexing", done=0, total=0, chunks=0)
            try:
                skip_cache = self._index(report, full, progress)
                self.status.update(last_error=None)
                self._save_state(skipped=report.skipped, deferred=report.deferred, skip_cache=skip_cache)
            except Exception as exc:
                self.status.update(last_error=str(exc))
                raise
            finally:
                report.seconds = self.clock() - started
                self.status.update(state="idle", last_report=report.summary())
                if report.added + report.changed > 1000:
                    self.analyzer.clear_cache()  # a big run memoised up to ~1M words (~240 MB)
            generation = self.store.current()
            self.status["last_indexed"] = generation.created if generation is not None else None
            return report

    def _index(self, report, full, progress):
        spec = self.spec
        if self.chroma is not None:
            self.chroma.prepare_index()  # the mirror now holds Chroma's records: the disk is diffed against them
        old, old_bm25 = self.current()
        stored = None if old is None else self._stored_settings(old) if self.chroma is None else self.chroma.settings
        if old is not None and not full and stored != self._settings():
            if stored is not None or self.chroma is None:  # (a new collection has no settings yet)
                log.info("kb %s: chunking, BM25 or embedding settings changed; re-indexing every file", spec.name)
            full = True
        old_manifest = old.manifest if old is not None and not full else {}
        files, sources = self._scan()
        report.sources = sources
        self._note_sources(sources)
        # A file skipped for a reason only a change to it can lift is not read
        # again while its size and mtime stay (a full run retries them all).
        previous = self._load_state()
        skip_cache = {} if full else previous.get("skip_cache", {})
        # An unreadable file is tried again on every run; it is logged again only if its reason changed.
        said = {(s.get("file"), s.get("reason")) for s in previous.get("skipped", []) if isinstance(s, dict)}
        new_skip_cache = {}  # what this run skips for good: returned, and saved by index()
        # Read every pass: an upload moves its files in before it records their
        # names, so a pass in between saw them under their stored names, and
        # the name alone must be able to make a file count as changed.
        uploaded = read_manifest(self.documents_dir)
        self.status["total"] = len(files)
        manifest, kept = {}, []
        batch = _EmbedBatch(self, old_bm25.vocab if old_manifest and old_bm25 is not None else None,
                            manifest, report)
        try:
            for n, (source, (path, size, mtime)) in enumerate(sorted(files.items()), 1):
                self.status["done"] = n
                if progress:
                    progress(n, len(files), source)
                before = old_manifest.get(source)
                shown = self._shown_name(source, uploaded)
                same_name = before is not None and before.get("shown", source) == shown
                if same_name and before.get("size") == size and before.get("mtime") == mtime and "hash" in before:
                    manifest[source] = before
                    kept.append(source)
                    continue
                remembered = skip_cache.get(source)
                if isinstance(remembered, dict) and remembered.get("size") == size and \
                        remembered.get("mtime") == mtime and remembered.get("shown") == shown and \
                        remembered.get("max_file_bytes") == spec.max_file_bytes and \
                        isinstance(remembered.get("reason"), str):
                    report.skipped.append((shown, remembered["reason"]))
                    new_skip_cache[source] = remembered
                    continue
                fresh = self._read_and_chunk(source, path, size, report, shown)
                if isinstance(fresh, _Skip):
                    level = logging.WARNING if fresh.loud else logging.INFO
                    log.log(logging.DEBUG if (shown, fresh.reason) in said else level, "kb %s: skipped %s: %s",
                            spec.name, shown, fresh.reason)
                    if fresh.lasting:
                        new_skip_cache[source] = {"size": size, "mtime": mtime, "shown": shown,
                                                  "reason": fresh.reason, "max_file_bytes": spec.max_file_bytes}
                    continue
                digest, chunks = fresh
                self.status["chunks"] += len(chunks)
                if same_name and before.get("hash") == digest:
                    manifest[source] = dict(before, size=size, mtime=mtime)
                    kept.append(source)
                    continue
                entry = {"size": size, "mtime": mtime, "hash": digest, "chunk_ids": [c.id for c in chunks]}
                if shown != source:
                    entry["shown"] = shown
                if before:
                    report.changed += 1
                else:
                    report.added += 1
                batch.add(source, entry, chunks, before)
            batch.flush()
            for source, entry in batch.deferred_kept:
                manifest[source] = entry
                kept.append(source)
            report.deleted = len(set(old_manifest) - set(files))
            report.unchanged = len(kept) - len(batch.deferred_kept)
            extra = {}
            if self.chroma is not None:  # Chroma first: it is the truth, and the mirror records its version
                extra = self.chroma.finish_index(manifest, self._settings())
            if not extra and not batch.changed and not report.deleted and old is not None and not full \
                    and manifest == old_manifest:
                # The background indexer lands here on every poll: no writer,
                # no forward index, no vocabulary copy were made for nothing.
                report.chunks, report.generation = len(old), old.name
                return new_skip_cache
            writer, forward = batch.open()
            self._finish_generation(writer, forward, old, old_bm25, manifest, kept, self._settings(), extra)
        except BaseException:
            if batch.writer is not None:
                batch.writer.abort()  # a no-op once commit() has begun: it cleans up itself
            raise
        generation = self.store.current()
        report.committed = True
        report.chunks, report.generation = len(generation), generation.name
        return new_skip_cache

    def _finish_generation(self, writer, forward, old, old_bm25, manifest, kept, settings, extra):
        """Carry ``kept`` sources' rows over from ``old``, write BM25, the manifest and ``extra`` files; commit."""
        if kept:
            rows = self._rows_of(old, manifest, kept, writer.chunk_count)
            writer.copy_rows(old, rows)
            forward.add_rows(ForwardIndex.load(old, old_bm25), rows)
        # Every file in the writer's directory is committed with the generation.
        forward.bm25(self.spec.k1, self.spec.b).save(writer.dir)
        forward.save(writer.dir)
        writer.set_manifest(manifest)
        writer.write_file(_SETTINGS_FILE, json.dumps(settings, sort_keys=True).encode("utf-8"))
        for name, data in (extra or {}).items():
            writer.write_file(name, data)
        writer.commit()

    def _write_mirror(self, records, fetched, settings, extra):
        """A mirror generation holding ``records``: ``fetched`` sources' chunks (dicts) new, the rest carried over."""
        from .documents import Chunk

        old, old_bm25 = self.current()
        writer = self.store.begin()
        try:
            kept = [s for s in sorted(records) if s not in fetched]
            forward = ForwardIndex(old_bm25.vocab if kept and old_bm25 is not None else None)
            manifest = {s: old.manifest[s] for s in kept}
            for source in sorted(fetched):
                manifest[source] = dict(records[source], row=writer.chunk_count)
                writer.add_chunks(fetched[source])
                for chunk in fetched[source]:
                    forward.add(self.chunk_terms(Chunk.from_json(chunk)))
            self._finish_generation(writer, forward, old, old_bm25, manifest, kept, settings, extra)
        except BaseException:
            writer.abort()
            raise

    def _settings(self):
        """What a generation's chunks, terms and vectors depend on besides the files.

        The analyzer's and the chunker's versions are in it too: a store built
        before either changed its output is re-indexed once, or old terms (``c``
        for "C++") and old chunk boundaries would outlive the code that made them.
        """
        from .chunking import CHUNKING_VERSION  # here: a search never loads the chunker

        s = self.spec
        settings = {"analyzer": ANALYZER_VERSION, "chunking": CHUNKING_VERSION,
                    "strategy": s.strategy, "chunk_size": s.chunk_size, "chunk_overlap": s.chunk_overlap,
                    "k1": s.k1, "b": s.b, "retrieval": s.retrieval, "embedding": s.embedding, "compact": s.compact,
                    "embedding_model": getattr(getattr(self.embedder, "provider", None), "model", "")}
        if s.redact:   # only when on: a store from before index-time redaction existed is not re-indexed
            settings["redact"] = sorted(s.redact)
        if s.store.type != "simple":  # a mirror has no vectors: back on the built-in store, everything is re-indexed
            settings["store"] = s.store.type
        return settings

    @staticmethod
    def _stored_settings(generation):
        if not generation.has(_SETTINGS_FILE):
            return None
        try:
            return json.loads(generation.read_file(_SETTINGS_FILE))
        except ValueError:
            return None

    @staticmethod
    def _rows_of(old, manifest, kept, first_row):
        """Rows of the kept sources' chunks in ``old``; their entries get their new row numbers.

        Each source's chunks are contiguous, and its manifest entry says where
        they start, so no chunk has to be read to find them.
        """
        if not all("row" in manifest[s] for s in kept):  # a store written before rows were recorded
            ids = [cid for s in kept for cid in manifest[s]["chunk_ids"]]
            rows, at = old.rows_for_ids(ids), first_row
            for source in kept:
                manifest[source] = dict(manifest[source], row=at)
                at += len(manifest[source]["chunk_ids"])
            return rows
        rows, at = [], first_row
        for source in kept:
            entry = manifest[source]
            start, count = entry["row"], len(entry["chunk_ids"])
            rows.extend(range(start, start + count))
            manifest[source] = dict(entry, row=at)
            at += count
        return rows

    def _shown_name(self, source, uploaded):
        """What chunks call their file: an upload's original name, not its stored uuid name."""
        label, _, stored = source.partition("/")
        entry = uploaded.get(stored) if uploaded and label == self.documents_label else None
        name = entry.get("name") if isinstance(entry, dict) else None
        return f"{label}/{name}" if isinstance(name, str) and name else source

    def _read_and_chunk(self, source, path, size, report, shown=None):
        """``(sha256, chunks)`` for one file, or a _Skip (recorded in the report) if it is skipped.

        ``shown`` is the name chunks cite (and index) the file by, if not
        ``source``; the report and the returned _Skip name the file by it.
        """
        # Here, not at the top: reading files is indexing's job, and a search
        # (the CLI's above all) should not load every format's extractor.
        import hashlib

        from .chunking import chunk_document
        from .documents import SkipFile, extract

        spec = self.spec
        shown = shown or source
        too_large = size > spec.max_file_bytes
        try:
            if too_large:
                raise SkipFile(f"larger than max_file_bytes ({size} > {spec.max_file_bytes})")
            with open(path, "rb") as f:
                data = f.read(spec.max_file_bytes + 1)
            chunks = []
            for doc in extract(shown, data, max_bytes=spec.max_file_bytes):
                chunks += chunk_document(doc, spec.strategy, spec.chunk_size, spec.chunk_overlap)
            if spec.redact:
                self._redact(chunks, report)
        except SkipFile as exc:
            skip = _Skip(str(exc), lasting=True, loud=too_large)
        except OSError as exc:  # permissions may change without the file doing so: tried again next run
            skip = _Skip(f"unreadable: {exc.strerror or exc}", lasting=False, loud=True)
        except Exception as exc:  # a parser bug on one odd file must not stop the KB
            log.warning("kb %s: cannot index %s: %s", spec.name, shown, exc, exc_info=True)
            skip = _Skip(f"failed to parse: {exc}", lasting=True, loud=False)  # the traceback is logged above
        else:
            return hashlib.sha256(data).hexdigest(), chunks
        report.skipped.append((shown, skip.reason))
        return skip

    def _redact(self, chunks, report):
        """Redact ``chunks``' text (and context line) in place, counting what went in ``report``.

        Chunk ids and hashes stay those of the original text: a file is still
        recognised as unchanged, and the redaction is not a change to it.
        """
        from .redact import Redactor  # here: only a KB that redacts loads it

        redactor = self._redactor
        if redactor is None:
            redactor = self._redactor = Redactor(categories=self.spec.redact)
        counts = collections.Counter(report.redactions)
        for chunk in chunks:
            chunk.text, found = redactor.redact(chunk.text)
            counts.update(found)
            if chunk.context:
                chunk.context, found = redactor.redact(chunk.context)
                counts.update(found)
        report.redactions = dict(counts)

    def chunk_terms(self, chunk):
        """Index terms of a chunk.  Title, heading path, symbol and file name count
        twice: a match there says more about what the chunk is than one in its body."""
        name = chunk.source.rsplit("/", 1)[-1].split("#", 1)[0]  # "corpus.jsonl#id": the file, once
        head = " ".join([chunk.title] + list(chunk.headings) + [chunk.symbol, name])
        return self.analyzer.tokens(head) * 2 + self.analyzer.tokens(chunk.text)

    # -- searching ----------------------------------------------------------

    def current(self, max_age=0.0):
        """``(generation, bm25)`` of the committed state, loaded once per generation.

        ``max_age`` is KBStore.current's: how old a look at another process's
        commits may be (the retrieval path passes retrieval.CURRENT_MAX_AGE).
        """
        loaded = self._loaded
        generation = self.store.current(max_age)
        if generation is None:
            return None, None
        if loaded is not None and loaded[0].name == generation.name:
            return loaded
        with self._state_lock:
            bm25 = BM25Index.load(generation.dir) if generation.has(_BM25_META) else None
            self._loaded = (generation, bm25)
            return self._loaded

    def source_chunks(self, source):
        """``(source_id, chunks)``: the committed chunk dicts of one indexed document, in order; or None.

        ``source`` is a file's id (``label/path``, as the manifest keys it) or
        the name its chunks cite: an upload's original name, or one record of
        a JSONL corpus (``label/corpus.jsonl#id``, whose file's chunks are
        then narrowed to that record's).
        """
        generation, _ = self.current()
        if generation is None:
            return None
        manifest = generation.manifest
        found = self._manifest_entry(manifest, source)
        record = None
        if found is None and "#" in source:
            found, record = self._manifest_entry(manifest, source.rpartition("#")[0]), source
        if found is None:
            return None
        source_id, entry = found
        ids = entry.get("chunk_ids", [])
        rows = range(entry["row"], entry["row"] + len(ids)) if "row" in entry else generation.rows_for_ids(ids)
        chunks = generation.chunks.get_many(rows)
        if record is not None:
            chunks = [c for c in chunks if c.get("source") == record]
            if not chunks:
                return None
        return source_id, chunks

    @staticmethod
    def _manifest_entry(manifest, source):
        entry = manifest.get(source)
        if entry is not None:
            return source, entry
        for source_id, entry in manifest.items():  # an upload, by the name it was uploaded as
            if entry.get("shown") == source:
                return source_id, entry
        return None

    def search(self, query, top_k=5, mode=None, min_lexical=None, min_dense=None, timings=None, max_age=0.0):
        """The best chunks for ``query``: a list of Hit, best first.

        Each retriever keeps its own scale and its own threshold: BM25 scores
        (unbounded, comparable within one query) must reach ``min_lexical``,
        cosine similarities (-1 to 1) must reach ``min_dense``; a cosine
        threshold is never applied to BM25 scores.  Hybrid takes the top
        FUSION_DEPTH of each and fuses the two filtered lists as ``spec.fusion``
        says: on scores, each list on its own scale (fusion.zscore_fusion, the
        default), or by reciprocal rank (fusion.rrf).  ``timings``, a dict,
        accumulates seconds per stage: lexical, embed, dense.  ``max_age`` is
        current's.
        """
        timings = {} if timings is None else timings
        clock = time.perf_counter
        mode = mode or self.spec.retrieval
        generation, bm25 = self.current(max_age)
        if generation is None or len(generation) == 0:
            return []
        pool = top_k if mode != "hybrid" else max(FUSION_DEPTH, top_k)
        lexical = dense = []
        if mode in ("lexical", "hybrid") and bm25 is not None:
            started = clock()
            lexical = bm25.search(self.analyzer.query_tokens(query), pool)
            timings["lexical"] = timings.get("lexical", 0.0) + clock() - started
            if min_lexical is not None:
                lexical = [(row, score) for row, score in lexical if score >= min_lexical and score > 0]
        if mode in ("dense", "hybrid"):
            if self.embedder is None or (generation.vectors is None and self.chroma is None):
                from .embeddings import EmbeddingFatal
                raise EmbeddingFatal(f"knowledge base {self.spec.name!r} has no vectors for {mode} search")
            started = clock()
            vector = self.embedder.embed_query(query)
            embedded = clock()
            if self.chroma is None:
                with self.dense_scoring:
                    dense = generation.dense_search(vector, pool)
            else:   # a request to Chroma: nothing here to serialise, and no lock held across it
                dense = self.chroma.dense_rows(generation, vector, pool)
            timings["embed"] = timings.get("embed", 0.0) + embedded - started
            timings["dense"] = timings.get("dense", 0.0) + clock() - embedded
            if min_dense is not None:
                dense = [(row, score) for row, score in dense if score >= min_dense]
        if mode == "lexical":
            ranked = [(row, score, {"lexical": score}) for row, score in lexical]
        elif mode == "dense":
            ranked = [(row, score, {"dense": score}) for row, score in dense]
        else:
            fuse = rrf if self.spec.fusion == "rrf" else zscore_fusion
            ranked = fuse([("lexical", lexical, self.spec.lexical_weight),
                           ("dense", dense, self.spec.dense_weight)])
        ranked = ranked[:top_k]
        chunks = generation.chunks.get_many([row for row, _, _ in ranked])
        # Ranks let an operator see why a passage won (the admin retrieval test).
        places = {name: {row: n for n, (row, _) in enumerate(found, 1)}
                  for name, found in (("lexical", lexical), ("dense", dense)) if found}
        hits = []
        for fused, ((row, score, scores), chunk) in enumerate(zip(ranked, chunks), 1):
            ranks = {name: rows[row] for name, rows in places.items() if row in rows}
            ranks["fused"] = fused
            hits.append(Hit(self.spec.name, row, chunk, score, scores, ranks))
        return hits

    def live_status(self):
        """The indexing state as whoever indexes this KB sees it: this process, or its status_source."""
        return self.status if self.status_source is None else self.status_source(self)

    def stats(self):
        status = self.live_status()
        generation, _ = self.current()
        size = 0
        if generation is not None:
            for name in generation.files():
                with contextlib.suppress(OSError):
                    size += os.path.getsize(generation.path(name))
        state = self._load_state()
        sources = state.get("sources")
        if sources is None:  # never indexed: what a run would find
            sources = self.source_status()
        # The commit time is the generation's own, and the rest is read from
        # disk, so a restart or another process (the CLI) sees the same.
        return {"name": self.spec.name, "retrieval": self.spec.retrieval,
                "files": len(generation.manifest) if generation is not None else 0,
                "bytes": size, "generation": generation.name if generation is not None else None, **status,
                # status["chunks"] counts this run's new chunks; "chunks" stays the committed total
                "chunks": len(generation) if generation is not None else 0, "run_chunks": status["chunks"],
                "last_indexed": generation.created if generation is not None else None,
                "sources": sources, "warnings": state.get("warnings") or self._warnings(sources),
                "skipped": state.get("skipped", []), "deferred": state.get("deferred", []),
                "store": status.get("store") or self.store_status()}

    # -- the vector store ---------------------------------------------------

    def store_status(self):
        """The store as last seen, without a network call: type, collection, reachable, error, role, vectors."""
        if self.chroma is not None:
            return self.chroma.status()
        return {"type": "simple", "collection": None, "reachable": None, "error": None, "role": None,
                "vectors": self.vectors.vector_count(), "checked_at": None}

    def test_store(self):
        """A live test of the store: ``{"ok", "message", "latency_ms", "version", "collection", "vectors"}``."""
        return self.chroma.test() if self.chroma is not None else self.vectors.check()

    def sync(self):
        """A replica: bring the mirror up to Chroma's commit; True if it changed.  Raises VectorStoreError."""
        if self.chroma is None:
            return False
        with self._index_lock:
            return self.chroma.sync()

    # -- what the latest run found, kept beside the store --------------------

    def _warnings(self, sources):
        out = [s["message"] for s in sources if s["kind"] == "source" and s["state"] != "ok" and s["message"]]
        if self.spec.sources and not self.readable_source_count(sources):
            out.append(f"knowledge base {self.spec.name!r} has no readable source: nothing to index "
                       f"(and no documents in {self.documents_dir}{os.sep})")
        return out

    def _note_sources(self, sources):
        """Log each source's state when it changes (not on every poll) and keep it for stats()."""
        for entry in sources:
            key = (entry["kind"], entry["source"])
            state, before = entry["state"], self._logged_states.get(key)
            self._logged_states[key] = state
            if state == before or entry["kind"] == "documents":
                continue
            if state in _BAD_STATES or state == "empty":
                log.warning("kb %s: %s", self.spec.name, entry["message"])
            elif before is not None:
                log.info("kb %s: source %r is readable again (%d files)", self.spec.name, entry["source"],
                         entry["files"])
        warnings = self._warnings(sources)
        nothing = bool(self.spec.sources) and not self.readable_source_count(sources)
        if nothing and self._logged_states.get("nothing") is not True:
            log.warning("kb %s: %s", self.spec.name, warnings[-1])
        self._logged_states["nothing"] = nothing
        self._save_state(sources=sources, warnings=warnings)

    def _state_path(self):
        return os.path.join(self.root, _STATE_FILE)

    def _load_state(self):
        """The persisted state (``{}`` if none), re-read only when the file changed."""
        path = self._state_path()
        try:
            st = os.stat(path)
        except OSError:
            return {}
        key = (st.st_mtime_ns, st.st_size, st.st_ino)
        cached = self._state_cache
        if cached is not None and cached[0] == key:
            return cached[1]
        try:
            with open(path, "rb") as f:
                state = json.loads(f.read().decode("utf-8"))
        except (OSError, ValueError) as exc:
            log.warning("kb %s: ignoring unreadable %s: %s", self.spec.name, path, exc)
            state = {}
        if not isinstance(state, dict):
            state = {}
        for name, kind in (("sources", list), ("warnings", list), ("skipped", list), ("deferred", list),
                           ("skip_cache", dict)):
            if not isinstance(state.get(name, kind()), kind):  # a hand-edited file: that part is dropped
                del state[name]
        self._state_cache = (key, state)
        return state

    def _save_state(self, **changes):
        """Update the persisted state; the file is rewritten (atomically) only when it changes."""
        state = dict(self._load_state())
        for name in ("skipped", "deferred"):
            if name in changes:
                changes[name] = [{"file": f, "reason": r} for f, r in changes[name]]
        state.update(changes, format=1)
        if state == self._load_state():
            return
        data = json.dumps(state, ensure_ascii=False, indent=1, sort_keys=True).encode("utf-8")
        try:
            os.makedirs(self.root, exist_ok=True)
            atomic_write(self._state_path(), data)
        except OSError as exc:
            log.warning("kb %s: cannot record the indexing state in %s: %s", self.spec.name, self._state_path(), exc)
            return
        self._state_cache = None


@dataclasses.dataclass(frozen=True)
class _Skip:
    """Why a file was not indexed; ``lasting``: until the file changes; ``loud``: a warning."""

    reason: str
    lasting: bool
    loud: bool


class _EmbedBatch:
    """Fresh files on their way into a generation writer.

    Files are embedded in batches of about 256 chunks (fewer, larger requests),
    and a file's chunks are written only once all of its vectors exist, so a
    file is either fully indexed or not at all.  On a passing embedding
    failure (5xx, timeout) the batch's files are deferred: their previous
    version, if any, is kept.  Rate limits and permanent errors propagate and
    abort the whole run.
    """

    SIZE = 256

    def __init__(self, kb, vocab, manifest, report):
        self.kb, self.manifest, self.report = kb, manifest, report
        self._vocab = vocab       # the previous generation's term ids, kept stable
        self.writer = self.forward = None  # made by open() when there is something to write
        self.pending, self.count = [], 0
        self.changed = False  # anything new was written, so a new generation is due
        self.deferred_kept = []  # (source, old manifest entry)
        self.dense = kb.spec.retrieval != "lexical"
        if self.dense and kb.embedder is None:
            from .embeddings import EmbeddingFatal
            raise EmbeddingFatal(f"knowledge base {kb.spec.name!r} needs an embedding provider "
                                 f"for retrieval: {kb.spec.retrieval}")

    def add(self, source, entry, chunks, before):
        self.pending.append((source, entry, chunks, before))
        self.count += len(chunks)
        # One file at a time into a local writer; on Chroma every flush costs requests, so it batches too.
        if (not self.dense and self.kb.chroma is None) or self.count >= self.SIZE:
            self.flush()

    def open(self):
        """The generation writer and forward index, created on first use."""
        if self.writer is None:
            self.writer = self.kb.store.begin()
            self.forward = ForwardIndex(self._vocab)
        return self.writer, self.forward

    def flush(self):
        pending, self.pending, self.count = self.pending, [], 0
        if not pending:
            return
        vectors = None
        if self.dense:
            from .embeddings import EmbeddingTransient
            texts = [c.index_text() for _, _, chunks, _ in pending for c in chunks]
            try:
                vectors = self.kb.embedder.embed(texts) if texts else []
            except EmbeddingTransient as exc:
                log.warning("kb %s: embedding failed, %d file%s deferred to the next run: %s", self.kb.spec.name,
                            len(pending), "s" if len(pending) != 1 else "", exc)
                for source, entry, _, before in pending:
                    self.report.deferred.append((entry.get("shown", source), str(exc)))
                    if before:
                        self.deferred_kept.append((source, before))
                return
        writer, forward = self.open()
        start, remote = 0, self.kb.chroma
        if remote is not None:  # the files are on Chroma, whole, before the mirror gets them
            bounds = itertools.accumulate([0] + [len(chunks) for _, _, chunks, _ in pending])
            remote.write_files([(source, entry, [c.to_json() for c in chunks], None if vectors is None else
                                 vectors[a:a + len(chunks)]) for (source, entry, chunks, _), a in zip(pending, bounds)])
        for source, entry, chunks, _ in pending:
            self.manifest[source] = dict(entry, row=writer.chunk_count)
            rows = vectors[start:start + len(chunks)] if vectors is not None else None
            start += len(chunks)
            if not chunks:
                continue
            writer.add_chunks([c.to_json() for c in chunks])
            if rows is not None and remote is None:
                writer.add_vectors(rows)
            for chunk in chunks:
                forward.add(self.kb.chunk_terms(chunk))
        self.changed = True
