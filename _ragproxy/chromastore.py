"""A knowledge base's chunks and vectors in a Chroma collection (the vector store interface on Chroma).

Layout on the server, per knowledge base ``kb`` and collection_prefix ``p``:

- ``{p}{kb}``: one record per chunk: id = chunk id, the embedding, document =
  the chunk text, metadata = source, title, symbol, line_start, line_end,
  hash, headings (JSON), context, ragproxy_file, ragproxy_file_hash.  Its
  collection metadata marks it as ragproxy's: ragproxy_schema, ragproxy_kb,
  ragproxy_role and ragproxy_dim (the vectors' dimension; 0 for a lexical
  knowledge base, whose records carry a placeholder vector because Chroma
  requires one).
- ``{p}{kb}.files``: one record per indexed file (``file:<source>``, the
  manifest entry as JSON), the commit record (version, settings, dirty) and
  the indexer lease (holder, expiry).  Their vectors are placeholders.

Write order keeps every file fully present or absent: a file's chunks go
first, then its record, then its stale chunks are deleted; a delete takes the
record first.  Before its first write a run sets ``dirty`` in the commit
record; a run that finds it set (a writer was killed) deletes the chunks no
record names and the records whose chunks are not all there.

ChromaKB is what a knowledge base on Chroma does beyond the store: its role
(indexer or replica), the local mirror (a generation without vectors: chunks,
manifest, BM25) kept equal to Chroma's records, dense search mapped to the
mirror's rows, and the status shown by the panel and /metrics.

May import: chroma, config, vectorstore.
"""
from __future__ import annotations

import collections
import hashlib
import json
import logging
import os
import socket
import time

from .chroma import ChromaClient, ChromaError
from .config import loggable_url
from .vectorstore import VectorStore, VectorStoreError, file_record, id_rows

log = logging.getLogger("ragproxy")

SCHEMA = 1
MIRROR_FILE = "chroma.json"   # in a mirror generation: the collection and commit version it copies
_PLACEHOLDER = (1.0,)
_FILE = "file:"
_COMMIT = "ragproxy:commit"
_LEASE = "ragproxy:lease"
_CONFIG = "vectorstore.chroma_http"
# Chunks per upsert: a request of the server's max_batch_size (5,461) records with texts took over 10 s
# on a loaded machine; a file's records are written after all its chunks, however many requests that takes.
_WRITE_BATCH = 1000


def _chunk_metadata(chunk, source, file_hash):
    return {"source": chunk["source"], "title": chunk.get("title", ""), "symbol": chunk.get("symbol", ""),
            "line_start": int(chunk.get("line_start", 0)), "line_end": int(chunk.get("line_end", 0)),
            "hash": chunk.get("hash", ""), "headings": json.dumps(list(chunk.get("headings") or []),
                                                                  ensure_ascii=False),
            "context": chunk.get("context", ""), "ragproxy_file": source, "ragproxy_file_hash": file_hash}


def _chunk_of(cid, text, meta):
    """The chunk dict (documents.Chunk.to_json's shape) of a stored record."""
    try:
        headings = json.loads(meta.get("headings") or "[]")
    except ValueError:
        headings = []
    return {"id": cid, "text": text or "", "source": meta.get("source", ""), "title": meta.get("title", ""),
            "headings": headings, "symbol": meta.get("symbol", ""), "line_start": meta.get("line_start", 0),
            "line_end": meta.get("line_end", 0), "hash": meta.get("hash", ""), "context": meta.get("context", "")}


class ChromaStore(VectorStore):
    """One knowledge base's two collections on a Chroma server.

    ``writes`` counts what this object sent (chunk upserts and deletes,
    record upserts and deletes), so a caller can see what a run touched.
    """

    kind = "chroma_http"

    def __init__(self, spec, kb, client=None, clock=time.time, holder=None, read_page=5000):
        self.spec, self.kb = spec, kb
        self.client = client if client is not None else ChromaClient(
            spec.base_url, tenant=spec.tenant, database=spec.database, timeout=spec.timeout, token=spec.token)
        self.collection = f"{spec.collection_prefix}{kb}"
        self.files_collection = f"{self.collection}.files"
        self.clock = clock   # wall time: lease expiries are compared across processes
        self.holder = holder or f"{socket.gethostname()}:{os.getpid()}:{os.urandom(4).hex()}"
        # Renewed at polls once a third of it has passed: it must outlast a few polls.
        self.lease_ttl = max(float(spec.lease_ttl), 3 * spec.sync_interval)
        self.writes = collections.Counter()
        self.read_page = read_page  # records per get when reading a whole collection
        self._ids = None        # (chunk collection id, files collection id) once open
        self._dim = None        # ragproxy_dim: -1 until the first write sets it, 0 lexical
        self._meta = {}
        self._records = None    # {source: record} as loaded and since written
        self._commit = None     # the commit record last read or written
        self._dirty = False     # this run set the dirty flag (or found it set) and has not committed
        self._leased_at = None  # when this process last wrote the lease, if it holds it
        self.lease_holder = None  # who held it when last read
        self.answered = None    # whether the server answered the last check()
        self._checked = False   # the server, tenant and database were checked since the last failure
        self.lost = False       # a collection this object had open was not found: it is looked up anew

    # -- plumbing --

    def _call(self, what, fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except ChromaError as exc:
            self._checked = False   # diagnose afresh next time (a tenant removed, a server replaced)
            if exc.reason == "not_found" and self._ids is not None:
                self._ids = self._records = None  # a collection deleted behind our back is looked up again
                self.lost = True
            # The address goes to the log only (debug here, once per change of state in ChromaKB).
            log.debug("kb %s: Chroma at %s, %s: %s", self.kb, loggable_url(self.client.base_url), what, exc)
            raise VectorStoreError(f"knowledge base {self.kb!r}, Chroma collection {self.collection!r}: "
                                   f"{what}: {exc}", unreachable=exc.unreachable) from None

    def _error(self, message):
        return VectorStoreError(f"knowledge base {self.kb!r}: {message}")

    def open(self, create=False):
        """Find (or make) the two collections and check they are ragproxy's; False if absent and not made."""
        if self._ids is not None:
            return True
        if not self._checked:
            self._call("connecting", self.client.check)
            self._checked = True
        names, roles = (self.collection, self.files_collection), ("chunks", "files")
        found = [self._call("looking up a collection", self.client.get_collection, name) for name in names]
        for doc, role in zip(found, roles):
            if doc is not None:  # checked before anything is created: another tool's collection stays as it was
                self._check_marker(doc, role)
        if None in found:
            if not create:
                return False
            found = [doc or self._create(name, role) for doc, name, role in zip(found, names, roles)]
            for doc, role in zip(found, roles):  # a creator racing us may have made it first, its own way
                self._check_marker(doc, role)
        chunks, files = found
        self._meta = dict(chunks["metadata"])
        self._dim = int(self._meta.get("ragproxy_dim", -1))
        if chunks.get("dimension") and self._dim > 0 and chunks["dimension"] != self._dim:
            raise self._error(f"the Chroma collection {self.collection!r} holds {chunks['dimension']}-dimensional "
                              f"vectors but its ragproxy_dim says {self._dim}: delete the collection and re-index")
        self._ids = (chunks["id"], files["id"])
        return True

    def _create(self, name, role):
        metadata = {"ragproxy_schema": SCHEMA, "ragproxy_kb": self.kb, "ragproxy_role": role}
        if role == "chunks":
            metadata["ragproxy_dim"] = -1
        return self._call("creating a collection", self.client.create_collection, name, metadata=metadata)

    def _check_marker(self, doc, role):
        meta = doc.get("metadata") or {}
        fix = (f"set {_CONFIG}.collection_prefix to a prefix no other tool uses, or delete that collection "
               f"if it is not needed")
        if "ragproxy_schema" not in meta:
            raise self._error(f"the Chroma collection {doc['name']!r} was not written by ragproxy (its metadata "
                              f"has no ragproxy_schema): {fix}")
        if meta.get("ragproxy_schema") != SCHEMA:
            raise self._error(f"the Chroma collection {doc['name']!r} has ragproxy_schema "
                              f"{meta.get('ragproxy_schema')!r}, this ragproxy writes {SCHEMA}: upgrade ragproxy, "
                              f"or {fix}")
        if meta.get("ragproxy_kb") != self.kb or meta.get("ragproxy_role") != role:
            raise self._error(f"the Chroma collection {doc['name']!r} belongs to knowledge base "
                              f"{meta.get('ragproxy_kb')!r} ({meta.get('ragproxy_role')}), not {self.kb!r}: {fix}")

    def _require_open(self):
        """The collection ids, the collections made if missing: for writes."""
        self.open(create=True)
        return self._ids

    def _readable(self):
        """The collection ids, or None when nothing was ever written (reads then answer empty; nothing is made)."""
        return self._ids if self._ids is not None or self.open(create=False) else None

    # -- records --

    def read_commit(self):
        """The commit record ``{"version", "settings", "dirty"}``, or None if nothing was committed yet."""
        if self._readable() is None:
            return None
        _, files = self._ids
        got = self._call("reading the commit record", self.client.get, files, ids=[_COMMIT], include=("documents",))
        self._commit = None
        if got["ids"]:
            try:
                self._commit = json.loads(got["documents"][0])
            except (TypeError, ValueError):
                raise self._error(f"the commit record in {self.files_collection!r} is not JSON: delete the "
                                  f"collections and re-index") from None
        return self._commit

    def load(self):
        """Read every file record (the shared manifest) from the server."""
        if self._readable() is None:
            self._records = {}
            return {}
        _, files = self._ids
        got = self._get_all(files, ("documents",), "reading the file records")
        records = {}
        for rid, doc in zip(got["ids"], got["documents"] or ()):
            if rid.startswith(_FILE):
                try:
                    records[rid[len(_FILE):]] = json.loads(doc)
                except (TypeError, ValueError):
                    log.warning("kb %s: ignoring an unreadable file record %r", self.kb, rid[:200])
        self._records = records
        return records

    def _get_all(self, collection_id, include, what):
        """Every record of a collection, in pages: one answer for a million chunks would outlast any timeout.

        Pages may shift under a run writing at the same time: a replica's read is bracketed by the commit
        version, and a file it missed while a run was writing comes with that run's commit.
        """
        out = {"ids": [], "documents": []}
        offset = 0
        while True:
            got = self._call(what, self.client.get, collection_id, include=include, limit=self.read_page,
                             offset=offset)
            out["ids"] += got["ids"]
            out["documents"] += got["documents"] or [None] * len(got["ids"])
            if len(got["ids"]) < self.read_page:
                return out
            offset += self.read_page

    def set_records(self, records):
        """Take ``records`` as the server's (a caller that knows it is the only writer and is in step)."""
        self._records = {s: file_record(r) for s, r in records.items()}

    def files(self):
        if self._records is None:
            self.load()
        return dict(self._records)

    @property
    def collection_id(self):
        return self._ids[0] if self._ids is not None else None

    @property
    def dirty(self):
        return self._dirty

    @property
    def version(self):
        return int((self._commit or {}).get("version", 0))

    def _put_commit(self, version, settings, dirty):
        _, files = self._require_open()
        record = {"version": version, "settings": settings, "dirty": dirty, "at": self.clock()}
        self._call("writing the commit record", self.client.upsert, files, [_COMMIT], [_PLACEHOLDER],
                   documents=[json.dumps(record, sort_keys=True)],
                   metadatas=[{"ragproxy_record": "commit", "version": version, "dirty": dirty}])
        self._commit = record

    def _before_write(self):
        self._require_open()
        if self._leased_at is not None and self.clock() - self._leased_at > self.lease_ttl / 3:
            if not self.acquire_lease():
                raise self._error("another process took the indexer lease; this run stops (its files so far "
                                  "are complete and the new indexer carries on)")
        if not self._dirty:
            self._put_commit(self.version, (self._commit or {}).get("settings"), True)
            self._dirty = True
        if self._records is None:
            self.load()

    def adopt_dirty(self):
        """A killed run left the dirty flag: sweep its leftovers; the next commit() clears it."""
        self.load()
        self.sweep()
        self._dirty = True

    def sweep(self):
        """Delete the chunks no record names, and the records whose chunks are not all there."""
        chunks, files = self._require_open()
        records = self.files()
        present = set(self._get_all(chunks, (), "listing the chunk ids")["ids"])
        named = set()
        broken = []
        for source, record in records.items():
            ids = record.get("chunk_ids", [])
            if not present.issuperset(ids):
                broken.append(source)
            else:
                named.update(ids)
        for source in broken:
            self._call("deleting a record", self.client.delete, files, ids=[_FILE + source])
            self.writes["records_deleted"] += 1
            del self._records[source]
        orphans = sorted(present - named)
        if orphans:
            self._call("deleting orphan chunks", self.client.delete, chunks, ids=orphans)
            self.writes["chunks_deleted"] += len(orphans)
        if orphans or broken:
            log.info("kb %s: swept %d orphan chunks and %d incomplete files left by an interrupted run",
                     self.kb, len(orphans), len(broken))
        return len(orphans), len(broken)

    def _set_dim(self, dim):
        if self._dim == dim:
            return
        if self._dim not in (None, -1):
            what = f"{self._dim}-dimensional vectors" if self._dim else "no vectors (a lexical knowledge base)"
            got = f"{dim}-dimensional vectors" if dim else "none (lexical retrieval)"
            raise self._error(f"the Chroma collection {self.collection!r} holds {what} and this knowledge base "
                              f"gives {got}: delete the collection (or set another {_CONFIG}.collection_prefix) "
                              f"and re-index, or go back to the embedding model it was built with")
        chunks, _ = self._require_open()
        meta = dict(self._meta, ragproxy_dim=dim)
        self._call("marking the collection's dimension", self.client.modify_collection, chunks, meta)
        self._meta, self._dim = meta, dim

    def put_record(self, source, record):
        """Replace a file's record only (its chunks are unchanged: a new mtime, a new upload name)."""
        self._before_write()
        self._put_records([(source, file_record(record))])

    def _put_records(self, items):
        _, files = self._ids
        self._call("writing file records", self.client.upsert, files, [_FILE + s for s, _ in items],
                   [_PLACEHOLDER] * len(items),
                   documents=[json.dumps(r, sort_keys=True, ensure_ascii=False) for _, r in items],
                   metadatas=[{"ragproxy_record": "file"}] * len(items))
        self.writes["records_upserted"] += len(items)
        for source, record in items:
            self._records[source] = record

    def replace_file(self, source, record, chunks, vectors=None):
        self.replace_files([(source, record, chunks, vectors)])

    def replace_files(self, files):
        """replace_file() for several ``(source, record, chunks, vectors)`` in three requests, not three each.

        Every file's chunks are written before any of their records, so each
        file is still whole or absent at any moment (a kill in between leaves
        chunks no record names, which the next run sweeps).
        """
        items, dims = [], set()
        for source, record, chunks, vectors in files:
            record = file_record(record)
            ids = [c["id"] for c in chunks]
            if ids != list(record.get("chunk_ids", [])):
                raise self._error(f"{source}: the record's chunk_ids do not match its chunks")
            if vectors is not None and len(vectors) != len(chunks):
                raise self._error(f"{source}: {len(vectors)} vectors for {len(chunks)} chunks")
            if vectors is None:
                dims.add(0)
            elif len(vectors):
                dims.add(len(vectors[0]))
            items.append((source, record, chunks, vectors))
        if not items:
            return
        if len(dims) > 1:
            raise self._error(f"vectors of different dimensions in one write: {sorted(dims)}")
        self._before_write()
        for dim in dims:
            self._set_dim(dim)  # before anything is written: a mismatch leaves every file as it was
        col, _ = self._ids
        ids, rows, texts, metas = [], [], [], []
        for source, record, chunks, vectors in items:
            ids += [c["id"] for c in chunks]
            rows += list(vectors) if vectors is not None else [_PLACEHOLDER] * len(chunks)
            texts += [c.get("text", "") for c in chunks]
            metas += [_chunk_metadata(c, source, record.get("hash", "")) for c in chunks]
        for lo in range(0, len(ids), _WRITE_BATCH):
            hi = lo + _WRITE_BATCH
            self._call("writing chunks", self.client.upsert, col, ids[lo:hi], rows[lo:hi], documents=texts[lo:hi],
                       metadatas=metas[lo:hi])
        self.writes["chunks_upserted"] += len(ids)
        olds = {source: self._records.get(source) for source, _, _, _ in items}
        self._put_records([(source, record) for source, record, _, _ in items])
        stale = sorted({cid for source, record, _, _ in items for cid in (olds[source] or {}).get("chunk_ids", [])
                        if cid not in set(record["chunk_ids"])})
        if stale:
            self._call("deleting replaced chunks", self.client.delete, col, ids=stale)
            self.writes["chunks_deleted"] += len(stale)

    def delete_file(self, source):
        self._before_write()
        col, files = self._ids
        old = self._records.get(source)
        if old is None:
            return
        self._call("deleting a file record", self.client.delete, files, ids=[_FILE + source])
        self.writes["records_deleted"] += 1
        del self._records[source]
        if old.get("chunk_ids"):
            self._call("deleting a file's chunks", self.client.delete, col, ids=list(old["chunk_ids"]))
            self.writes["chunks_deleted"] += len(old["chunk_ids"])

    def commit(self, settings=None):
        """Publish: the version goes up by one and the dirty flag is cleared."""
        version = self.version + 1
        self._put_commit(version, settings, False)
        self._dirty = False
        return version

    # -- lease --

    def acquire_lease(self):
        """Hold (or renew) the indexer lease; False if another live process holds it.

        Chroma has no compare-and-set, so two processes starting at the same
        instant may both think they hold it until the next renewal, one poll
        later, settles it; per-file writes are idempotent, so both converge.
        """
        _, files = self._require_open()
        now = self.clock()
        if self._leased_at is not None and now - self._leased_at < self.lease_ttl / 3:
            return True  # renewed recently: no one else can have taken it yet
        got = self._call("reading the indexer lease", self.client.get, files, ids=[_LEASE], include=("metadatas",))
        meta = got["metadatas"][0] if got["ids"] else {}
        holder, expires = meta.get("holder"), float(meta.get("expires", 0) or 0)
        self.lease_holder = holder
        if holder not in (None, self.holder) and expires > now:
            self._leased_at = None
            return False
        self._call("writing the indexer lease", self.client.upsert, files, [_LEASE], [_PLACEHOLDER],
                   documents=[""], metadatas=[{"ragproxy_record": "lease", "holder": self.holder,
                                               "expires": now + self.lease_ttl}])
        got = self._call("reading the indexer lease", self.client.get, files, ids=[_LEASE], include=("metadatas",))
        mine = bool(got["ids"]) and got["metadatas"][0].get("holder") == self.holder
        self._leased_at = now if mine else None
        return mine

    @property
    def holds_lease(self):
        return self._leased_at is not None

    def release_lease(self):
        """Give the lease up (a clean shutdown), so another process takes over without waiting for expiry."""
        if self._leased_at is None or self._ids is None:
            return
        _, files = self._ids
        self._call("releasing the indexer lease", self.client.upsert, files, [_LEASE], [_PLACEHOLDER],
                   documents=[""], metadatas=[{"ragproxy_record": "lease", "holder": "", "expires": 0.0}])
        self._leased_at = None

    # -- reading --

    def _learn_dim(self):
        """Re-read ragproxy_dim: another process's first write sets it after this one opened the collection."""
        doc = self._call("looking up a collection", self.client.get_collection, self.collection)
        if doc is None:
            self._ids = None
            return
        self._check_marker(doc, "chunks")
        self._meta = dict(doc["metadata"])
        self._dim = int(self._meta.get("ragproxy_dim", -1))

    def dense_search(self, vector, k):
        if self._readable() is None:
            return []
        if self._dim in (None, -1):
            self._learn_dim()
            if self._ids is None:
                return []
        col, _ = self._ids
        if self._dim == 0:
            raise self._error(f"the Chroma collection {self.collection!r} holds no vectors (it was indexed for "
                              f"lexical retrieval): re-index with an embedding model")
        if self._dim not in (None, -1) and len(vector) != self._dim:
            raise self._error(f"the Chroma collection {self.collection!r} holds {self._dim}-dimensional vectors and "
                              f"the query embedding has {len(vector)}: re-index with this embedding model")
        if self._dim in (None, -1):
            return []  # nothing written yet
        found = self._call("querying", self.client.query, col, vector, k)
        return [(cid, 1.0 - distance) for cid, distance in found]

    def get_chunks(self, ids):
        ids = list(ids)
        if not ids or self._readable() is None:
            return []
        col, _ = self._ids
        got = self._call("reading chunks", self.client.get, col, ids=ids, include=("documents", "metadatas"))
        by_id = {cid: _chunk_of(cid, text, meta)
                 for cid, text, meta in zip(got["ids"], got["documents"], got["metadatas"])}
        return [by_id[i] for i in ids if i in by_id]

    def count(self):
        if self._readable() is None:
            return 0
        col, _ = self._ids
        return self._call("counting", self.client.count, col)

    def stats(self):
        present = self._readable() is not None
        return {"type": self.kind, "collection": self.collection, "chunks": self.count() if present else 0,
                "files": len(self.files()) if present else 0, "dim": self._dim if present and self._dim != -1 else None,
                "version": self.version if present else None}

    def check(self):
        started = time.perf_counter()
        out = {"ok": False, "message": "", "latency_ms": None, "version": None, "collection": self.collection,
               "vectors": None}
        self.answered = False
        try:
            info = self.client.check()
        except ChromaError as exc:
            log.warning("kb %s: Chroma at %s: %s", self.kb, loggable_url(self.client.base_url), exc)
            out["message"] = str(exc)
            self.answered = not exc.unreachable
            return out
        self.answered = self._checked = True
        out.update(latency_ms=info.get("latency_ms", (time.perf_counter() - started) * 1000.0),
                   version=info.get("version"))
        try:
            if not self.open(create=False):
                out.update(ok=True, vectors=0, message=f"Chroma {out['version']} answers; the collection "
                           f"{self.collection!r} does not exist yet (the first index run creates it)")
                return out
            out["vectors"] = self.count()
        except VectorStoreError as exc:
            out["message"] = str(exc)
            return out
        out.update(ok=True, message=f"Chroma {out['version']} answers; collection {self.collection!r} holds "
                   f"{out['vectors']} chunks")
        return out

    def close(self):
        self.client.close()


class ChromaKB:
    """A knowledge base on Chroma: its role, its local mirror and its store status.

    ``current`` returns the mirror's (generation, bm25); ``write_mirror``
    writes the next mirror generation from records and fetched chunks (both
    the knowledge base's, which owns the generation format).
    """

    def __init__(self, name, spec, current, write_mirror, clock=time.time, store=None, mirror=""):
        self.name, self.spec = name, spec
        # One holder per process and mirror: a knowledge base rebuilt by a config reload keeps its lease.
        holder = f"{socket.gethostname()}:{os.getpid()}:{hashlib.sha256(mirror.encode()).hexdigest()[:8]}"
        self.store = store if store is not None else ChromaStore(spec, name, clock=clock, holder=holder)
        self.current, self.write_mirror = current, write_mirror
        self.clock = clock
        # "indexer" | "replica"; with indexer: auto, known after the first poll
        self.role = {"always": "indexer", "never": "replica"}.get(spec.indexer)
        self.settings = None  # the settings of the commit the mirror copies
        self.synced = None    # (collection id, commit version) the mirror holds
        self._rows = (None, {})  # (generation name, {chunk id: row})
        self._status = {"reachable": None, "error": None, "checked_at": None, "vectors": None,
                        "errors": 0}   # failed store operations since start (a counter for /metrics)

    # -- status --

    def _ok(self, vectors=None):
        if self._status["error"] is not None:
            log.info("kb %s: the Chroma store works again", self.name)
        self._status.update(reachable=True, error=None, checked_at=self.clock())
        if vectors is not None:
            self._status["vectors"] = vectors

    def _failed(self, exc):
        if str(exc) != self._status["error"]:
            log.warning("kb %s: Chroma at %s: %s", self.name, loggable_url(self.store.client.base_url), exc)
        self._status.update(reachable=not exc.unreachable, error=str(exc), checked_at=self.clock())
        self._status["errors"] += 1

    def status(self):
        return {"type": "chroma_http", "collection": self.store.collection, "role": self.role, **self._status}

    def test(self):
        out = self.store.check()
        if out["ok"]:
            self._ok(out["vectors"])
        else:
            self._status.update(reachable=self.store.answered, error=out["message"],
                                checked_at=self.clock())
        return out

    def _guard(self, fn, *args, again=False):
        """Run a store operation, noting the outcome in the status; ``again``: a read, tried once more
        if it found its collection gone (deleted and made anew: it is looked up by name again)."""
        self.store.lost = False
        try:
            out = fn(*args)
        except VectorStoreError as exc:
            if not (again and self.store.lost):
                self._failed(exc)
                raise
            try:
                out = fn(*args)
            except VectorStoreError as exc:
                self._failed(exc)
                raise
        self._ok()
        return out

    # -- role --

    def may_index(self):
        """Whether this process is the indexer now (auto: it holds, or just took, the lease)."""
        if self.spec.indexer != "auto":
            self.role = "indexer" if self.spec.indexer == "always" else "replica"
            return self.role == "indexer"
        mine = self._guard(lambda: self.store.open(create=True) and self.store.acquire_lease())
        role = "indexer" if mine else "replica"
        if role != self.role:
            log.info("kb %s: %s", self.name, f"indexer lease taken (holder {self.store.holder})" if mine else
                     f"another process holds the indexer lease ({self.store.lease_holder}): this one is a replica")
        self.role = role
        return mine

    def poll(self, sync):
        """The indexer thread's look every sync_interval; True when this process just became the indexer.

        A replica calls ``sync`` (its knowledge base's, which takes the index
        lock); an indexer renews its lease.  Store failures are in status().
        """
        try:
            was = self.role
            if self.may_index():
                return was != "indexer"
            if sync():
                log.info("kb %s: mirror brought up to Chroma commit %s", self.name, self.synced[1])
        except VectorStoreError:
            pass  # logged when the store's state changed
        return False

    def release(self):
        """Hand the lease on (a clean stop), so another process indexes without waiting for it to expire."""
        if self.store.holds_lease:
            self.store.release_lease()
            self.role = None if self.spec.indexer == "auto" else self.role
            log.info("kb %s: indexer lease released", self.name)

    # -- the mirror --

    def _mirror_marker(self, generation):
        if generation is None or not generation.has(MIRROR_FILE) or generation.vectors is not None:
            return None
        try:
            marker = json.loads(generation.read_file(MIRROR_FILE))
        except (OSError, ValueError):
            return None
        if not isinstance(marker, dict) or marker.get("collection") != self.store.collection:
            return None
        # A collection deleted and made again has the name but not the id: its mirror is not this one's.
        return marker if marker.get("id") == self.store.collection_id else None

    def _stamp(self, version):
        """The mirror generation's file naming the collection and commit it copies."""
        return {MIRROR_FILE: json.dumps({"collection": self.store.collection, "id": self.store.collection_id,
                                         "version": version}).encode("utf-8")}

    def sync(self):
        """Bring the mirror up to Chroma's commit; True if it changed.  Raises VectorStoreError."""
        return self._guard(self._sync, again=True)

    def _sync(self):
        store = self.store
        if not store.open(create=False):
            return False
        commit = store.read_commit()
        if commit is None:
            return False
        generation, _ = self.current()
        marker = self._mirror_marker(generation)
        version = int(commit.get("version", 0))
        key = (store.collection_id, version)
        if self.synced == key or (self.synced is None and marker is not None and marker.get("version") == version):
            self.synced = key
            self._status["vectors"] = len(generation) if generation is not None else 0  # the mirror is in step
            return False
        records = store.load()
        again = store.read_commit()
        if again is None or again.get("version") != version:
            return False  # a commit landed while the records were read: the next poll takes it whole
        changed = self._rebuild(records, commit.get("settings"), version, generation, marker)
        if changed is None:
            return False
        self.synced, self.settings = key, commit.get("settings")
        self._status["vectors"] = sum(len(r.get("chunk_ids", [])) for r in records.values())
        return changed

    def _rebuild(self, records, settings, version, generation, marker):
        """Write a mirror generation holding ``records`` if it does not already; None: try again later."""
        ours = generation.manifest if marker is not None else {}
        fetch = sorted(s for s, r in records.items() if file_record(ours.get(s) or {}) != r)
        if marker is not None and marker.get("version") == version and not fetch and set(ours) == set(records):
            return False
        ids = [cid for s in fetch for cid in records[s].get("chunk_ids", [])]
        by_id = {c["id"]: c for c in self.store.get_chunks(ids)} if ids else {}
        fetched = {}
        for source in fetch:
            chunks = [by_id.get(cid) for cid in records[source].get("chunk_ids", [])]
            if None in chunks:
                log.info("kb %s: %s changed on Chroma while it was read; the mirror is brought up on the next poll",
                         self.name, source)
                return None
            fetched[source] = chunks
        self.write_mirror(records, fetched, settings or {}, self._stamp(version))
        return True

    # -- indexing --

    def prepare_index(self):
        """Before a run: open (or create) the collections, sweep a killed run's leftovers, mirror Chroma's records.

        Afterwards the mirror's manifest is Chroma's records, so the run diffs
        the disk against the shared truth.
        """
        self._guard(self._prepare, again=True)

    def _prepare(self):
        store = self.store
        store.open(create=True)
        commit = store.read_commit() or {}
        self.settings = commit.get("settings")
        version = int(commit.get("version", 0))
        generation, _ = self.current()
        marker = self._mirror_marker(generation)
        if commit.get("dirty"):
            log.warning("kb %s: the last run on Chroma did not finish; sweeping what it left", self.name)
            store.adopt_dirty()
        elif marker is not None and version and marker.get("version") == version:
            store.set_records(generation.manifest)  # in step with Chroma: no need to read every record
            self.synced = (store.collection_id, version)
            self._status["vectors"] = len(generation)
            return
        records = store.files()
        if self._rebuild(records, self.settings, version, generation, marker) is None:
            raise store._error("the Chroma records changed while they were read (another indexer?): retried "
                               "on the next run")
        self.synced = (store.collection_id, version)

    def write_files(self, files):
        """Write ``(source, manifest entry, chunk dicts, vectors or None)`` files to Chroma, whole."""
        self._guard(self.store.replace_files, files)

    def finish_index(self, manifest, settings):
        """After a run's files: delete what went, fix changed records, commit if anything was written.

        Returns the mirror generation's file naming the commit it stands for, or {} when nothing was
        committed (the mirror is then already in step).
        """
        def finish():
            store = self.store
            records = store.files()
            for source in sorted(set(records) - set(manifest)):
                store.delete_file(source)
            for source, entry in sorted(manifest.items()):
                if records.get(source) != file_record(entry):
                    store.put_record(source, entry)
            committed = store.dirty
            if committed:
                store.commit(settings)
                self._status["vectors"] = store.count()
            self.settings, self.synced = settings, (store.collection_id, store.version)
            return self._stamp(store.version) if committed else {}
        return self._guard(finish)

    def dense_rows(self, generation, vector, k):
        """Dense top-k on Chroma as (row, score) in the mirror; ids the mirror does not hold are dropped."""
        found = self._guard(self.store.dense_search, vector, k, again=True)
        name, table = self._rows
        if name != generation.name:
            table = id_rows(generation)
            self._rows = (generation.name, table)
        return [(table[cid], score) for cid, score in found if cid in table]
