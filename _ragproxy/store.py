"""The built-in vector store: numbered, immutable generations on disk.

Each knowledge base lives in DATA_DIR/vectordb/<kb>/ as generations
(g000001/, g000002/, ...) plus a CURRENT file naming the one in use.  A
writer fills a private temp directory and commits by renaming it to the next
generation name and then atomically replacing CURRENT, so a crash at any
moment leaves the old or the new generation visible, never a mix.  Files
stay readable by plain tools: chunks.jsonl is JSON lines, vectors.npy is a
standard .npy v1.0 file that numpy.load opens.  ForwardIndex holds the term
counts per chunk a knowledge base stores in each generation (fwd_*.npy),
from which the next generation's BM25 is rebuilt without re-reading text.

May import: bm25, dense, deps, files, npy.
"""
from __future__ import annotations

import array
import collections
import contextlib
import errno
import itertools
import json
import logging
import mmap
import os
import re
import shutil
import threading
import time
import weakref

from . import deps
from .dense import binary_width, compact_rows, dense_top_k, dense_top_k_binary, dense_top_k_compact, normalise_rows
from .files import atomic_write, fsync_path, temp_name_of
from .npy import NpyAppender, NpyArray, StoreError, npy_read_array, npy_write_array
from .bm25 import BM25Index

log = logging.getLogger("ragproxy")


_GEN_RE = re.compile(r"g(\d{6,})\Z")
_TEMP_RE = re.compile(r"\.(tmp|trash)-(\d+)-[0-9a-f]+\Z")
_FILE_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*\Z")
_STORE_FORMAT = 1
_CHUNKS = "chunks.jsonl"
_OFFSETS = "chunks.idx.npy"
_VECTORS = "vectors.npy"
_COMPACT_FILES = {"f16": ("vectors.f16.npy", None), "i8": ("vectors.i8.npy", "vectors.i8scale.npy"),
                  "b1": ("vectors.b1.npy", None)}
_COMPACT_DTYPES = {"f16": "<f2", "i8": "|i1", "b1": "|u1"}
_MANIFEST = "manifest.json"
_META = "meta.json"
_RESERVED = {_CHUNKS, _OFFSETS, _VECTORS, _MANIFEST, _META}.union(
    name for pair in _COMPACT_FILES.values() for name in pair if name)
# Temp dirs of a process we cannot probe (Windows) are stale after this long.
_STALE_TEMP_SECONDS = 86400


def _pid_alive(pid):
    if os.name == "nt":
        return None  # os.kill(pid, 0) would send CTRL_C_EVENT; unknown
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _flock_module():
    """fcntl where commits can be locked across processes, else None (Windows)."""
    try:
        import fcntl
    except ImportError:
        return None
    return fcntl


def _check_file_name(name):
    if not isinstance(name, str) or not _FILE_NAME_RE.match(name):
        raise ValueError("bad file name %r: use letters, digits, '.', '_' and '-'" % (name,))
    if name in _RESERVED:
        raise ValueError("%r is written by the store itself" % name)


class _Registry:
    """Process-wide bookkeeping shared by every KBStore on the same directory."""

    def __init__(self):
        self.lock = threading.Lock()
        self.live = collections.Counter()  # (root, generation name) -> open Generations
        self.writing = set()               # temp dirs of writers in this process
        self.root_locks = {}               # root -> threading.Lock for commits
        # Generations are released by weakref finalizers, which the garbage
        # collector may run inside any allocation, including one made while
        # this thread holds self.lock: taking the lock there deadlocked (seen
        # in CI).  So release() only queues (deque.append is atomic) and the
        # queue is settled by whoever next holds the lock.
        self._released = collections.deque()

    def root_lock(self, root):
        with self.lock:
            return self.root_locks.setdefault(root, threading.Lock())

    def retain(self, key):
        with self.lock:
            self._settle()
            self.live[key] += 1

    def release(self, key):
        self._released.append(key)

    def _settle(self):
        while self._released:
            key = self._released.popleft()
            self.live[key] -= 1
            if self.live[key] <= 0:
                del self.live[key]

    def open_names(self, root):
        with self.lock:
            self._settle()
            return {name for r, name in list(self.live) if r == root}


_REGISTRY = _Registry()


def _close_map(mapped):
    if mapped is not None:
        mapped.close()


class _ChunkList:
    """The chunks of a generation, read from chunks.jsonl on demand.

    chunks.idx.npy holds the byte offset of every line (plus the end), so
    chunk i is one slice of the memory-mapped file however large it is.  A
    map rather than pread: each pread is a system call that lets the GIL go,
    and a new question reads one chunk per hit, so under concurrency every
    hit was a thread hand-off; the slice copies bytes holding the GIL.
    """

    def __init__(self, path, offsets, count):
        self._offsets, self._count = offsets, count
        end = int(offsets[count]) if count else 0
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size < end:
                raise StoreError("%s: %d bytes, shorter than its index (%d)" % (path, size, end))
            # mmap refuses an empty file; a generation without chunks reads nothing.
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else None
        # The map owns its own handle and may outlive its Generation.
        self._closer = weakref.finalize(self, _close_map, self._map)

    def close(self):
        self._closer()

    def __len__(self):
        return self._count

    def __getitem__(self, i):
        if isinstance(i, slice):
            start, stop, step = i.indices(self._count)
            if step == 1:
                return self._read_range(start, stop) if start < stop else []
            return self.get_many(range(start, stop, step))
        return self.get_many([i + self._count if i < 0 else i])[0]

    def _read_range(self, start, stop):
        lines = self.raw_range(start, stop).split(b"\n")
        return [json.loads(line) for line in lines[:stop - start]]

    def raw_range(self, start, stop):
        """Chunks start..stop-1 as their stored JSON lines (for copying)."""
        if start >= stop:
            return b""
        return self._map[int(self._offsets[start]):int(self._offsets[stop])]

    def __iter__(self):
        step = 4096
        for start in range(0, self._count, step):
            yield from self._read_range(start, min(self._count, start + step))

    def get_many(self, rows):
        """The chunks at ``rows``, in that order: a search's hits, read once per request."""
        count, mapped = self._count, self._map
        offsets = self._offsets.flat if self._offsets.flat is not None else self._offsets
        chunks = []
        for i in rows:
            if not 0 <= i < count:
                raise IndexError("chunk %d out of range for %d chunks" % (i, count))
            # Decoded here: json.loads would first sniff the encoding of bytes.
            chunks.append(json.loads(mapped[offsets[i]:offsets[i + 1]].decode("utf-8")))
        return chunks


class Generation:
    """One committed, immutable snapshot of a knowledge base.

    Opening maps the index and vector files and opens chunks.jsonl, so it
    costs the same at a thousand chunks as at a million, and a reader keeps
    working after a later commit replaces it (on POSIX even after its
    directory is collected).
    """

    def __init__(self, root, name):
        m = _GEN_RE.match(name)
        if not m:
            raise StoreError("%r is not a generation name" % name)
        self.root, self.name, self.number = root, name, int(m.group(1))
        self.dir = os.path.join(root, name)
        self.meta = meta = self._read_meta()
        count = meta["chunks"]
        arrays = []
        # Read one entry per chunk fetched: a plain memory map serves that
        # without numpy, which a lexical search then never has to import.
        self.offsets = NpyArray(self.path(_OFFSETS))
        arrays.append(self.offsets)
        if len(self.offsets) != count + 1:
            raise StoreError("%s: index has %d entries for %d chunks" % (self.dir, len(self.offsets), count))
        self.vectors = self._open_rows(_VECTORS, count, arrays) if meta.get("dim") is not None else None
        self.compact_kind = meta.get("compact")
        self.compact = self.compact_scales = None
        if self.compact_kind:
            data_name, scale_name = _COMPACT_FILES[self.compact_kind]
            self.compact = self._open_rows(data_name, count, arrays)
            if scale_name:
                self.compact_scales = self._open_rows(scale_name, count, arrays)
        self.chunks = _ChunkList(self.path(_CHUNKS), self.offsets, count)
        self._arrays = arrays
        self._manifest = None
        self._rows_by_id = None
        key = (root, name)
        _REGISTRY.retain(key)
        # Garbage collection only unregisters: arrays and chunks handed out
        # keep their own files open until they are dropped too.
        self._finalizer = weakref.finalize(self, _REGISTRY.release, key)

    def _read_meta(self):
        try:
            with open(self.path(_META), "rb") as f:
                meta = json.loads(f.read().decode("utf-8"))
        except FileNotFoundError:
            raise StoreError("%s: no %s (not a complete generation)" % (self.dir, _META)) from None
        except ValueError as e:
            raise StoreError("%s: bad %s: %s" % (self.dir, _META, e)) from None
        if not isinstance(meta, dict) or meta.get("format") != _STORE_FORMAT:
            found = meta.get("format") if isinstance(meta, dict) else meta
            raise StoreError("%s: unknown store format %r" % (self.dir, found))
        if not isinstance(meta.get("chunks"), int) or meta.get("compact") not in (None,) + tuple(_COMPACT_FILES):
            raise StoreError("%s: bad %s" % (self.dir, _META))
        # Sizes recorded at commit catch a generation damaged after the fact.
        for fname, size in meta.get("files", {}).items():
            try:
                actual = os.stat(self.path(fname)).st_size
            except FileNotFoundError:
                raise StoreError("%s: missing %s" % (self.dir, fname)) from None
            if actual != size:
                raise StoreError("%s: %s is %d bytes, committed as %d" % (self.dir, fname, actual, size))
        return meta

    def _open_rows(self, fname, count, arrays):
        arr = npy_read_array(self.path(fname))
        arrays.append(arr)
        if len(arr) != count:
            raise StoreError("%s: %s has %d rows for %d chunks" % (self.dir, fname, len(arr), count))
        return arr

    @property
    def created(self):
        """When this generation was committed (unix time), as recorded in it; None if it says not."""
        created = self.meta.get("created")
        return float(created) if isinstance(created, (int, float)) and not isinstance(created, bool) else None

    @property
    def dim(self):
        """Vector dimension, or None for a lexical-only knowledge base."""
        return self.meta.get("dim")

    def __len__(self):
        return len(self.chunks)

    def path(self, name):
        """Path of a file in this generation (extra files the writer added)."""
        return os.path.join(self.dir, name)

    def has(self, name):
        return name in self.meta.get("files", {})

    def files(self):
        return sorted(self.meta.get("files", {}))

    def read_file(self, name):
        with open(self.path(name), "rb") as f:
            return f.read()

    @property
    def manifest(self):
        """source path -> {size, mtime, hash, chunk_ids}: loaded on first use."""
        if self._manifest is None:
            self._manifest = json.loads(self.read_file(_MANIFEST).decode("utf-8"))
        return self._manifest

    def rows_for_ids(self, ids):
        """Row numbers of the given chunk ids (unknown ids are skipped).

        The id index is built on first use by reading every chunk once.
        """
        if self._rows_by_id is None:
            self._rows_by_id = {c.get("id"): i for i, c in enumerate(self.chunks)}
        table = self._rows_by_id
        return [table[i] for i in ids if i in table]

    def dense_search(self, query_vec, k, candidates=None, oversample=None, use_compact=None):
        """Cosine top-k over this generation's vectors: [(row, score)], best first.

        use_compact None (auto) scans the compact copy first when numpy is
        active and the copy is int8 or binary: those scan faster than
        float32 (binary several times faster), float16 does not (numpy has
        no fast float16 path; that copy only saves memory).  True/False
        force it.  The best k*oversample rows of the compact scan are
        re-scored exactly (default 4 for int8 and float16, binary_pool()
        for binary codes).
        """
        if self.vectors is None:
            return []
        if use_compact is None:
            use_compact = self.compact_kind in ("i8", "b1") and deps.np is not None
        if not use_compact or self.compact is None:
            return dense_top_k(self.vectors, query_vec, k, candidates)
        if self.compact_kind == "b1":
            pool = None if oversample is None else int(k * oversample)
            return dense_top_k_binary(self.compact, self.vectors, query_vec, k, pool, candidates)
        return dense_top_k_compact(self.compact, self.vectors, query_vec, k, 4 if oversample is None else oversample,
                                   self.compact_scales, candidates)

    def close(self):
        """Release file handles now; arrays and chunks taken from it stop working."""
        self._finalizer()
        self.chunks.close()
        for arr in self._arrays:
            if isinstance(arr, NpyArray):
                arr.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return "<Generation %s: %d chunks, dim %s>" % (self.dir, len(self.chunks), self.dim)


class GenerationWriter:
    """Builds the next generation in a private temp directory.

    Use as ``with store.begin() as w:``; a clean exit commits, an exception
    deletes everything written.  Chunks and vectors may be added in batches
    (they stream to disk); their counts must match at commit.
    """

    def __init__(self, store, compact=None):
        if compact is not None and compact not in _COMPACT_FILES:
            raise ValueError("compact must be None, 'f16', 'i8' or 'b1', not %r" % (compact,))
        self._store = store
        self.compact_kind = compact
        self.dir = os.path.join(store.root, ".tmp-%d-%s" % (os.getpid(), os.urandom(4).hex()))
        # Registered before it exists, so a clean-up in another thread of this
        # process never takes it for an abandoned one.
        with _REGISTRY.lock:
            _REGISTRY.writing.add(self.dir)
        try:
            os.mkdir(self.dir)
        except BaseException:
            with _REGISTRY.lock:
                _REGISTRY.writing.discard(self.dir)
            raise
        self._chunks = open(os.path.join(self.dir, _CHUNKS), "wb")
        self._offsets = array.array("q", [0])
        self._vectors = self._compact = self._scales = None
        self._manifest = {}
        self.generation = None
        self._done = False

    @property
    def chunk_count(self):
        return len(self._offsets) - 1

    @property
    def vector_count(self):
        return self._vectors.rows if self._vectors is not None else 0

    def add_chunks(self, chunks):
        """Append chunk dicts; returns the new chunk count."""
        self._check_open()
        write, offsets = self._chunks.write, self._offsets
        end = offsets[-1]
        for chunk in chunks:
            if not isinstance(chunk, dict):
                raise TypeError("a chunk must be a dict, not %s" % type(chunk).__name__)
            line = json.dumps(chunk, ensure_ascii=False, separators=(",", ":")).encode("utf-8") + b"\n"
            write(line)
            end += len(line)
            offsets.append(end)
        return self.chunk_count

    def add_vectors(self, rows, normalize=True):
        """Append embedding rows (numpy 2-D array or sequences), L2-normalised."""
        np = deps.np
        self._check_open()
        if normalize:
            rows = normalise_rows(rows)
        elif np is not None:
            rows = np.asarray(rows, dtype=np.float32)
            if rows.ndim != 2:
                raise ValueError("vectors must be 2-D, got shape %r" % (rows.shape,))
        else:
            rows = [list(r) for r in rows]
        if not len(rows):
            return self.vector_count
        dim = rows.shape[1] if np is not None else len(rows[0])
        self._open_vectors(dim)
        self._vectors.append(rows)
        if self._compact is not None:
            small, scales = compact_rows(rows, self.compact_kind)
            self._compact.append(small)
            if scales is not None:
                self._scales.append(scales)
        return self.vector_count

    def set_vectors(self, matrix, normalize=True):
        """All vectors at once (same as one add_vectors on an empty writer)."""
        if self._vectors is not None and self._vectors.rows:
            raise StoreError("vectors were already added to this writer")
        return self.add_vectors(matrix, normalize)

    def _open_vectors(self, dim):
        if self._vectors is not None:
            if dim != self._vectors.row_dim:
                raise ValueError("vectors have %d dimensions, earlier ones had %d" % (dim, self._vectors.row_dim))
            return
        self._vectors = NpyAppender(os.path.join(self.dir, _VECTORS), "<f4", dim)
        if self.compact_kind:
            data_name, scale_name = _COMPACT_FILES[self.compact_kind]
            width = binary_width(dim) if self.compact_kind == "b1" else dim
            self._compact = NpyAppender(os.path.join(self.dir, data_name), _COMPACT_DTYPES[self.compact_kind], width)
            if scale_name:
                self._scales = NpyAppender(os.path.join(self.dir, scale_name), "<f4")

    def copy_rows(self, generation, rows):
        """Append chunks (as stored) and their vectors from an older generation.

        For incremental re-indexing: unchanged sources are carried over without
        re-encoding or re-embedding.
        """
        np = deps.np
        self._check_open()
        rows = list(rows)
        if not rows:
            return self.chunk_count
        has_vectors = generation.vectors is not None
        if has_vectors and self.vector_count != self.chunk_count:
            raise StoreError("copy_rows needs as many vectors as chunks so far (%d vs %d)"
                             % (self.vector_count, self.chunk_count))
        end = self._offsets[-1]
        src_offsets = generation.offsets
        run_start = 0
        for pos in range(1, len(rows) + 1):
            # One read per run of consecutive rows: unchanged sources are
            # contiguous, so a big carry-over is a few large reads.
            if pos < len(rows) and rows[pos] == rows[pos - 1] + 1:
                continue
            first, last = rows[run_start], rows[pos - 1]
            if not 0 <= first <= last < len(generation.chunks):
                raise IndexError("rows %d..%d out of range for %d chunks" % (first, last, len(generation.chunks)))
            self._chunks.write(generation.chunks.raw_range(first, last + 1))
            base = int(src_offsets[first])
            for i in range(first + 1, last + 2):
                self._offsets.append(end + int(src_offsets[i]) - base)
            end = self._offsets[-1]
            run_start = pos
        if not has_vectors:
            return self.chunk_count
        self._open_vectors(generation.dim)
        src = generation.vectors
        if np is not None:
            self.add_vectors(src[np.asarray(rows, dtype=np.int64)], normalize=False)
        else:
            self._vectors.append_raw(b"".join(src.row_bytes(i) for i in rows), len(rows))
            if self._compact is not None:
                small, scales = compact_rows([list(src.row(i)) for i in rows], self.compact_kind)
                self._compact.append(small)
                if scales is not None:
                    self._scales.append(scales)
        return self.chunk_count

    def set_manifest(self, manifest):
        """source path -> {size, mtime, hash, chunk_ids}; any JSON object."""
        if not isinstance(manifest, dict):
            raise TypeError("manifest must be a dict")
        self._manifest = manifest

    def path(self, name):
        """Path for a caller-written extra file; it is committed with the rest."""
        _check_file_name(name)
        return os.path.join(self.dir, name)

    def write_file(self, name, data):
        """Write an extra file (bytes) into the generation."""
        self._check_open()
        with open(self.path(name), "wb") as f:
            f.write(data)

    def copy_file(self, generation, name):
        """Carry an extra file over from an older generation (hard link when possible)."""
        dest = self.path(name)
        try:
            os.link(generation.path(name), dest)
        except OSError:
            shutil.copyfile(generation.path(name), dest)

    def _check_open(self):
        if self._done:
            raise StoreError("this writer has already been committed or aborted")

    def commit(self):
        """Make this generation current; returns it as a Generation."""
        self._check_open()
        self._done = True
        try:
            self._finish_files()
            self.generation = self._store._commit(self.dir)
        except BaseException:
            self._remove()
            raise
        with _REGISTRY.lock:
            _REGISTRY.writing.discard(self.dir)
        return self.generation

    def _finish_files(self):
        count = self.chunk_count
        self._chunks.close()
        # Every file is fsynced once, below, including ones callers wrote.
        npy_write_array(os.path.join(self.dir, _OFFSETS), self._offsets, "<i8", fsync=False)
        dim = None
        if self._vectors is not None:
            dim = self._vectors.row_dim
            for appender in (self._vectors, self._compact, self._scales):
                if appender is None:
                    continue
                appender.close()
                if appender.rows != count:
                    raise StoreError("%d vectors for %d chunks in %s"
                                     % (appender.rows, count, os.path.basename(appender.path)))
        with open(os.path.join(self.dir, _MANIFEST), "wb") as f:
            f.write(json.dumps(self._manifest, ensure_ascii=False, separators=(",", ":")).encode("utf-8"))
        files = {}
        for fname in sorted(os.listdir(self.dir)):
            p = os.path.join(self.dir, fname)
            if not os.path.isfile(p):
                raise StoreError("%s: only plain files may go in a generation" % fname)
            fsync_path(p)
            files[fname] = os.path.getsize(p)
        meta = {"format": _STORE_FORMAT, "chunks": count, "dim": dim,
                "compact": self.compact_kind if dim is not None else None,
                "created": self._store.clock(), "files": files}
        meta_path = os.path.join(self.dir, _META)
        with open(meta_path, "wb") as f:
            f.write(json.dumps(meta, indent=1, sort_keys=True).encode("utf-8"))
            f.flush()
            os.fsync(f.fileno())
        fsync_path(self.dir, directory=True)

    def abort(self):
        """Throw away everything written; the current generation is untouched."""
        if self._done:
            return
        self._done = True
        self._remove()

    def _remove(self):
        for appender in (self._vectors, self._compact, self._scales):
            if appender is not None:
                appender.discard()
        self._chunks.close()
        shutil.rmtree(self.dir, ignore_errors=True)
        with _REGISTRY.lock:
            _REGISTRY.writing.discard(self.dir)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if self._done:  # committed or aborted explicitly inside the block
            return False
        if exc_type is None:
            self.commit()
        else:
            self.abort()
        return False


class ForwardIndex:
    """Term counts per chunk, stored with each generation.

    The next commit rebuilds BM25 from these (unchanged chunks' counts are
    copied, only new chunks are tokenized), so an update costs a pass over
    compact integer arrays rather than re-analyzing every chunk.  Term ids are
    the BM25 index's own, so the vocabulary lives once, in bm25.json.
    """

    FILES = ("terms", "tfs", "counts", "lengths")

    def __init__(self, vocab=None):
        self.vocab = dict(vocab) if vocab else {}
        self.terms, self.tfs = array.array("i"), array.array("i")
        self.counts, self.lengths = array.array("i"), array.array("i")

    def add(self, tokens):
        counts = collections.Counter(tokens)
        vocab = self.vocab
        for token, tf in counts.items():
            tid = vocab.get(token)
            if tid is None:
                tid = vocab[token] = len(vocab)
            self.terms.append(tid)
            self.tfs.append(tf)
        self.counts.append(len(counts))
        self.lengths.append(len(tokens))

    def add_rows(self, old, rows):
        """Append the entries of ``rows`` of an older forward index (``old``: dict of arrays)."""
        np = deps.np
        if np is None:
            counts, starts = old["counts"], old["starts"]
            for row in rows:
                a, n = starts[row], counts[row]
                self.terms.extend(old["terms"][a:a + n])
                self.tfs.extend(old["tfs"][a:a + n])
                self.counts.append(n)
                self.lengths.append(old["lengths"][row])
            return
        rows = np.asarray(rows, dtype=np.int64)
        counts = np.asarray(old["counts"])[rows].astype(np.int64)
        firsts = np.asarray(old["starts"])[rows]
        # Positions of every entry of every row: each row's start, then +0, +1, ...
        before = np.cumsum(counts) - counts
        at = np.repeat(firsts - before, counts) + np.arange(int(counts.sum()), dtype=np.int64)
        self.terms.frombytes(np.asarray(old["terms"])[at].astype(np.int32).tobytes())
        self.tfs.frombytes(np.asarray(old["tfs"])[at].astype(np.int32).tobytes())
        self.counts.frombytes(counts.astype(np.int32).tobytes())
        self.lengths.frombytes(np.asarray(old["lengths"])[rows].astype(np.int32).tobytes())

    def bm25(self, k1, b):
        self._drop_unused_terms()
        return BM25Index.from_counts(self.vocab, self.terms, self.tfs, self.counts, self.lengths, k1, b)

    def _drop_unused_terms(self):
        """Forget terms no chunk uses any more (their files changed or went away)."""
        np = deps.np
        used = bytearray(len(self.vocab))
        for tid in self.terms if np is None else np.unique(np.frombuffer(self.terms, dtype=np.int32)):
            used[tid] = 1
        if all(used):
            return
        remap = array.array("i", [-1]) * len(used)
        new_id = 0
        for tid, flag in enumerate(used):
            if flag:
                remap[tid] = new_id
                new_id += 1
        self.vocab = {term: remap[tid] for term, tid in self.vocab.items() if used[tid]}
        if np is not None:
            table = np.frombuffer(remap, dtype=np.int32)
            self.terms = array.array("i", table[np.frombuffer(self.terms, dtype=np.int32)].tobytes())
        else:
            self.terms = array.array("i", (remap[t] for t in self.terms))

    def save(self, directory):
        for name in self.FILES:
            npy_write_array(os.path.join(directory, f"fwd_{name}.npy"), getattr(self, name), "<i4")

    @classmethod
    def load(cls, generation, bm25):
        """The arrays of ``generation``'s forward index, or None if it has none."""
        np = deps.np
        if bm25 is None or not generation.has("fwd_terms.npy"):
            return None
        out = {}
        for name in cls.FILES:
            arr = npy_read_array(generation.path(f"fwd_{name}.npy"))
            out[name] = arr if np is not None else array.array("i", arr.flat if arr.flat is not None else arr)
        if np is not None:
            out["starts"] = np.concatenate(([0], np.cumsum(out["counts"], dtype=np.int64)))
        else:
            out["starts"] = array.array("q", [0])
            out["starts"].extend(itertools.accumulate(out["counts"]))
        return out


class KBStore:
    """The generations of one knowledge base under `root` (DATA_DIR/vectordb/<kb>).

    ``store.current()`` returns the committed Generation (or None for a new
    KB); ``with store.begin() as w:`` writes and commits the next one.  The
    current and the previous generation are kept, plus any this process
    still holds open; older ones and abandoned temp dirs are removed on open
    and after each commit.
    """

    def __init__(self, root, compact=None, create=True, clock=time.time, monotonic=time.monotonic):
        self.root = os.path.abspath(root)
        self.compact = compact
        self.clock = clock  # stamps each generation's commit time (meta "created")
        self.monotonic = monotonic  # ages the last look at CURRENT (current's max_age)
        if create:
            os.makedirs(self.root, exist_ok=True)
        elif not os.path.isdir(self.root):
            raise StoreError("%s: no such knowledge base directory" % self.root)
        self._lock = threading.Lock()
        self._cached = None  # (CURRENT text, Generation)
        self._current_read = None  # (CURRENT's stat stamp, its text, monotonic time of the stat)
        self._warned = set()
        with contextlib.suppress(OSError):
            with self._commit_lock(blocking=False) as locked:
                if locked:
                    self._gc(keep=self._default_keep())

    # -- reading --

    def _read_current(self, max_age=0.0):
        """CURRENT's text, read again only when a stat says the file was replaced.

        Every commit (this process's or another's) renames a new file over it,
        which gives it a new inode: a stat costs a fifth of opening and reading
        it.  Within ``max_age`` seconds of the last stat not even that: on the
        retrieval path, where every request asks, the stat is a system call and
        a release of the GIL per request (bench/RESULTS.md, sessions 16-18).
        This process's own commits are seen at once regardless (_commit reads
        CURRENT back).  The stamp is taken before the read, so a commit between
        the two is read again on the next call.
        """
        seen = self._current_read
        checked = self.monotonic()
        if max_age > 0 and seen is not None and 0 <= checked - seen[2] < max_age:  # (a swapped clock: look)
            return seen[1]
        path = os.path.join(self.root, "CURRENT")
        try:
            st = os.stat(path)
            stamp = (st.st_ino, st.st_dev, st.st_mtime_ns, st.st_size)
            if seen is not None and seen[0] == stamp:
                self._current_read = (stamp, seen[1], checked)
                return seen[1]
            with open(path, "rb") as f:
                text = f.read(64).decode("ascii", "replace").strip()
        except FileNotFoundError:
            self._current_read = None
            return None
        self._current_read = (stamp, text, checked)
        return text

    def committed(self):
        """Names of committed generation directories, oldest first."""
        try:
            names = os.listdir(self.root)
        except FileNotFoundError:
            return []
        gens = [n for n in names if _GEN_RE.match(n)]
        return sorted(gens, key=lambda n: int(n[1:]))

    def current(self, max_age=0.0):
        """The committed Generation, or None if nothing was ever committed.

        Cheap to call per request: it re-reads CURRENT and reuses the open
        Generation while that is unchanged.  With ``max_age`` (seconds) it may
        answer from a look at CURRENT that recent, so another process's commit
        can take that long to be seen; writers and the admin API pass none.
        """
        text = self._read_current(max_age)
        with self._lock:
            if self._cached is not None and self._cached[0] == text:
                return self._cached[1]
            text, gen = self._load(text)
            self._cached = (text, gen) if gen is not None else None
            return gen

    def _warn_once(self, message, *args):
        key = message % args
        if key not in self._warned:
            self._warned.add(key)
            log.warning(message, *args)

    def _load(self, text, retries=3):
        """(CURRENT text it stands for, Generation or None)."""
        if text is not None:
            if _GEN_RE.match(text):
                try:
                    return text, Generation(self.root, text)
                except (StoreError, OSError) as e:
                    # A commit elsewhere may have moved CURRENT on and collected
                    # this generation while we were opening it.
                    newer = self._read_current()
                    if retries and newer != text:
                        return self._load(newer, retries - 1)
                    self._warn_once("%s: CURRENT names unusable generation %s (%s); using the newest complete one",
                                    self.root, text, e)
            else:
                self._warn_once("%s: CURRENT holds %r, not a generation name; using the newest complete one",
                                self.root, text[:20])
        names = self.committed()
        if text is None and names:
            # Also seen, harmlessly, between the first commit's rename and CURRENT.
            log.info("%s: CURRENT is missing; using the newest complete generation", self.root)
        for name in reversed(names):
            if name == text:
                continue
            try:
                return text, Generation(self.root, name)
            except (StoreError, OSError) as e:
                self._warn_once("%s: skipping generation %s: %s", self.root, name, e)
        return text, None

    # -- writing --

    def begin(self, compact=None):
        """A writer for the next generation; commit by leaving the with-block."""
        return GenerationWriter(self, compact if compact is not None else self.compact)

    @contextlib.contextmanager
    def _commit_lock(self, blocking=True):
        """Serialise commits and GC: a thread lock plus flock(LOCK) across processes."""
        tlock = _REGISTRY.root_lock(self.root)
        if not tlock.acquire(blocking):
            yield False
            return
        try:
            fcntl = _flock_module()
            if fcntl is None:  # Windows: rename collisions are still detected
                yield True
                return
            fd = os.open(os.path.join(self.root, "LOCK"), os.O_RDWR | os.O_CREAT, 0o644)
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
                except BlockingIOError:
                    yield False
                    return
                yield True
            finally:
                os.close(fd)  # closing drops the flock
        finally:
            tlock.release()

    def _commit(self, temp_dir):
        with self._commit_lock():
            previous = self._read_current()
            names = self.committed()
            numbers = [int(n[1:]) for n in names]
            if previous and _GEN_RE.match(previous):
                numbers.append(int(previous[1:]))
            number = max(numbers, default=0) + 1
            while True:
                name = "g%06d" % number
                target = os.path.join(self.root, name)
                try:
                    os.rename(temp_dir, target)
                    break
                except OSError as e:
                    # Another writer without a working lock took this number.
                    if e.errno not in (errno.EEXIST, errno.ENOTEMPTY) and not os.path.exists(target):
                        raise
                    number += 1
            fsync_path(self.root, directory=True)
            atomic_write(os.path.join(self.root, "CURRENT"), name.encode("ascii") + b"\n")
            self._read_current()  # so that a reader allowed a stale look sees this commit at once
            gen = Generation(self.root, name)
            with self._lock:
                self._cached = (name, gen)
            keep = {name}
            if previous and _GEN_RE.match(previous):
                keep.add(previous)
            try:
                self._gc(keep)
            except OSError as e:
                log.warning("%s: clean-up after commit failed: %s", self.root, e)
        return gen

    # -- clean-up --

    def _default_keep(self):
        """Current (or the fallback in use) and the newest generation before it."""
        gen = self.current()
        names = self.committed()
        if gen is None:
            return set(names[-1:])
        older = [n for n in names if int(n[1:]) < gen.number]
        return {gen.name} | set(older[-1:])

    def gc(self):
        """Remove old generations and abandoned temp dirs now (also done on open and commit)."""
        with self._commit_lock():
            self._gc(self._default_keep())

    def _gc(self, keep):
        """Delete what is not kept.  Caller holds the commit lock."""
        keep = set(keep) | _REGISTRY.open_names(self.root)
        # A generation newer than every kept one may be another process's
        # commit between its rename and CURRENT; only the file lock rules that out.
        newest_kept = max((int(n[1:]) for n in keep if _GEN_RE.match(n)), default=0)
        cross_process = _flock_module() is not None
        with _REGISTRY.lock:
            writing = set(_REGISTRY.writing)
        now = time.time()
        for name in os.listdir(self.root):
            path = os.path.join(self.root, name)
            if _GEN_RE.match(name):
                if name in keep or (not cross_process and int(name[1:]) > newest_kept):
                    continue
                # Rename first so a half-deleted generation can never look complete.
                trash = os.path.join(self.root, ".trash-%d-%s" % (os.getpid(), os.urandom(4).hex()))
                try:
                    os.rename(path, trash)
                except OSError as e:
                    log.warning("%s: cannot remove old generation %s: %s", self.root, name, e)
                    continue
                shutil.rmtree(trash, ignore_errors=True)
                continue
            m = _TEMP_RE.match(name)
            if m is None:
                continue
            pid = int(m.group(2))
            if m.group(1) == "tmp":
                if path in writing:
                    continue
                alive = False if pid == os.getpid() else _pid_alive(pid)
                if alive is None:
                    with contextlib.suppress(OSError):
                        alive = now - os.stat(path).st_mtime < _STALE_TEMP_SECONDS
                if alive:
                    continue
            shutil.rmtree(path, ignore_errors=True)
        # CURRENT is written under the commit lock, so a temporary copy of it is a crash's leftover.
        for name in os.listdir(self.root):
            if name == "CURRENT.tmp" or (name.startswith(temp_name_of("CURRENT")) and name.endswith(".tmp")):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(self.root, name))

    def destroy(self):
        """Delete the whole knowledge base directory."""
        with self._lock:
            self._cached = None
        shutil.rmtree(self.root, ignore_errors=True)

    def __repr__(self):
        return "<KBStore %s>" % self.root
