"""The vector store interface a knowledge base is written against, and the built-in store behind it.

A store holds one knowledge base's chunks (id, text, metadata), their
vectors and one record per indexed file (the manifest entry: size, mtime,
content hash, chunk ids).  Two implementations:

- BuiltinStore: the generation store of store.py (DATA_DIR/vectordb/<kb>/).
  Writes are staged and land together as the next generation at commit(),
  so a reader sees the old or the new state, never a mix.
- chromastore.ChromaStore: a collection on a Chroma server.  Each file's
  write is durable when replace_file() returns (chunks first, then the
  file's record); commit() publishes a new version for replicas.

Either way a file is fully present or absent after a crash.  A knowledge
base on the built-in store writes its generations itself (its BM25 term
statistics go in the same generation, which BuiltinStore.commit() does not
write); it reads counts, stats and the live check through BuiltinStore.

May import: npy, store.
"""
from __future__ import annotations

import abc
import dataclasses
import json
import time

from .npy import StoreError
from .store import KBStore

STORE_TYPES = ("simple", "chroma_http")
INDEXER_ROLES = ("auto", "always", "never")
SETTINGS_FILE = "settings.json"


class VectorStoreError(StoreError):
    """A store operation failed; ``unreachable``: the server did not answer (down or too slow).

    A StoreError, so a route's on_failure policy (degrade, fail_closed,
    use_stale) applies to a search that meets it.  The message names what to
    fix and never holds the server's address.
    """

    def __init__(self, message, unreachable=False):
        super().__init__(message)
        self.unreachable = bool(unreachable)


@dataclasses.dataclass(frozen=True)
class StoreSpec:
    """Where a knowledge base keeps its chunks and vectors (``vectorstore`` in the config)."""

    type: str = "simple"   # "simple" (built-in) | "chroma_http"
    base_url: str = ""
    tenant: str = "default_tenant"
    database: str = "default_database"
    collection_prefix: str = "ragproxy_"
    indexer: str = "auto"  # auto (a lease in Chroma) | always | never
    timeout: float = 10.0
    sync_interval: float = 1.0
    lease_ttl: float = 30.0  # indexer: auto: a lease not renewed for this long passes to another process
    token: str = dataclasses.field(default="", repr=False)  # a secret: kept out of reprs and logs

    @classmethod
    def from_config(cls, choice, stores):
        """The spec of a KB whose ``vectorstore`` is ``choice`` ("": the global ``vectorstore.type``).

        ``stores`` is the config's ``vectorstore`` block; a KB on chroma_http takes its ``chroma_http`` keys.
        """
        kind = choice or stores.get("type") or "simple"
        if kind != "chroma_http":
            return cls()
        block = stores.get("chroma_http") or {}
        names = ("base_url", "tenant", "database", "collection_prefix", "indexer", "timeout", "sync_interval",
                 "lease_ttl", "token")
        return cls(type=kind, **{n: block[n] for n in names if n in block})

    def __post_init__(self):
        if self.type not in STORE_TYPES:
            raise ValueError(f"vector store type must be one of {', '.join(STORE_TYPES)}, not {self.type!r}")
        if self.indexer not in INDEXER_ROLES:
            raise ValueError(f"indexer must be one of {', '.join(INDEXER_ROLES)}, not {self.indexer!r}")


def file_record(entry):
    """A manifest entry as a store records it: without ``row``, which is a local generation's business."""
    return {k: v for k, v in entry.items() if k != "row"}


def id_rows(generation):
    """``{chunk id: row}`` of a generation, from its manifest (no chunk is read when rows are recorded)."""
    table = {}
    for entry in generation.manifest.values():
        ids = entry.get("chunk_ids", [])
        if "row" not in entry:  # a store written before rows were recorded
            return {c.get("id"): i for i, c in enumerate(generation.chunks)}
        table.update(zip(ids, range(entry["row"], entry["row"] + len(ids))))
    return table


class VectorStore(abc.ABC):
    """What a knowledge base needs of a store.

    ``records``: source id -> file record (the manifest entry: size, mtime,
    hash, chunk_ids, and ``shown`` for an upload).  Chunks are the dicts of
    documents.Chunk.to_json(); vectors are rows of floats, or None for a
    lexical-only knowledge base.
    """

    kind = ""

    @abc.abstractmethod
    def files(self):
        """``{source: record}`` as this store's writes left them (staged ones included)."""

    @abc.abstractmethod
    def replace_file(self, source, record, chunks, vectors=None):
        """Make ``chunks`` (with ``vectors``, one row each) the file's whole content, and ``record`` its record."""

    @abc.abstractmethod
    def delete_file(self, source):
        """Remove a file's record and its chunks (no error if it is not there)."""

    @abc.abstractmethod
    def commit(self, settings=None):
        """Publish the writes so far with the settings they were made with; returns the new version."""

    @abc.abstractmethod
    def dense_search(self, vector, k):
        """``[(chunk id, cosine similarity)]``, best first, at most ``k``."""

    @abc.abstractmethod
    def get_chunks(self, ids):
        """The chunk dicts of ``ids``, in that order; unknown ids are left out."""

    @abc.abstractmethod
    def count(self):
        """How many chunks the store holds."""

    @abc.abstractmethod
    def stats(self):
        """``{"type", "chunks", "files", "dim", ...}`` for the panel."""

    @abc.abstractmethod
    def check(self):
        """A live test: ``{"ok", "message", "latency_ms", "version", "collection", "vectors"}``; never raises."""

    def close(self):
        """Release connections or file handles."""


class BuiltinStore(VectorStore):
    """The interface on the built-in generation store (store.KBStore)."""

    kind = "simple"

    def __init__(self, store, clock=time.perf_counter):
        self.store = store if isinstance(store, KBStore) else KBStore(store)
        self.clock = clock  # times check()
        self._staged = {}   # source -> (record, chunks, vectors) or None (deleted), until commit()

    def _current(self):
        return self.store.current()

    def files(self):
        generation = self._current()
        out = {s: file_record(e) for s, e in (generation.manifest.items() if generation is not None else ())}
        for source, staged in self._staged.items():
            if staged is None:
                out.pop(source, None)
            else:
                out[source] = dict(staged[0])
        return out

    def replace_file(self, source, record, chunks, vectors=None):
        chunks = [dict(c) for c in chunks]
        if [c.get("id") for c in chunks] != list(record.get("chunk_ids", [])):
            raise VectorStoreError(f"{source}: the record's chunk_ids do not match its chunks")
        if vectors is not None and len(vectors) != len(chunks):
            raise VectorStoreError(f"{source}: {len(vectors)} vectors for {len(chunks)} chunks")
        self._staged[source] = (file_record(record), chunks, None if vectors is None else [list(v) for v in vectors])

    def delete_file(self, source):
        self._staged[source] = None

    def commit(self, settings=None):
        """Write the next generation: unchanged files' rows carried over (vectors too), staged files appended."""
        old = self._current()
        manifest, kept_rows = {}, []
        staged, self._staged = self._staged, {}
        with self.store.begin() as writer:
            if old is not None:
                for source, entry in old.manifest.items():
                    if source in staged:
                        continue
                    ids = entry.get("chunk_ids", [])
                    rows = list(range(entry["row"], entry["row"] + len(ids))) if "row" in entry \
                        else old.rows_for_ids(ids)
                    manifest[source] = dict(file_record(entry), row=writer.chunk_count + len(kept_rows))
                    kept_rows.extend(rows)
                writer.copy_rows(old, kept_rows)
            for source in sorted(s for s, v in staged.items() if v is not None):
                record, chunks, vectors = staged[source]
                manifest[source] = dict(record, row=writer.chunk_count)
                writer.add_chunks(chunks)
                if vectors:
                    writer.add_vectors(vectors)
            writer.set_manifest(manifest)
            if settings is not None:
                writer.write_file(SETTINGS_FILE, json.dumps(settings, sort_keys=True).encode("utf-8"))
        return writer.generation.number

    def dense_search(self, vector, k):
        generation = self._current()
        if generation is None or generation.vectors is None:
            return []
        found = generation.dense_search(vector, k)
        chunks = generation.chunks.get_many([row for row, _ in found])
        return [(chunk["id"], score) for (_, score), chunk in zip(found, chunks)]

    def get_chunks(self, ids):
        generation = self._current()
        if generation is None:
            return []
        table = id_rows(generation)
        return generation.chunks.get_many([table[i] for i in ids if i in table])

    def count(self):
        generation = self._current()
        return len(generation) if generation is not None else 0

    def vector_count(self):
        generation = self._current()
        return len(generation) if generation is not None and generation.vectors is not None else 0

    def stats(self):
        generation = self._current()
        return {"type": self.kind, "chunks": self.count(), "vectors": self.vector_count(),
                "files": len(generation.manifest) if generation is not None else 0,
                "dim": generation.dim if generation is not None else None,
                "generation": generation.name if generation is not None else None}

    def check(self):
        started = self.clock()
        try:
            generation = self._current()
            vectors = self.vector_count()
        except (StoreError, OSError) as exc:
            return {"ok": False, "message": f"the built-in store cannot be read: {exc}", "latency_ms": None,
                    "version": None, "collection": None, "vectors": None}
        latency = (self.clock() - started) * 1000.0
        message = (f"built-in store: {len(generation)} chunks in generation {generation.name}"
                   if generation is not None else "built-in store: nothing indexed yet")
        return {"ok": True, "message": message, "latency_ms": latency, "version": None, "collection": None,
                "vectors": vectors}

    def close(self):
        self._staged = {}
