"""The configured knowledge bases: their embedding clients, the background indexer, the shared dense-scan slot.

KnowledgeBases holds the configured ones (declared under knowledge_bases, or
only named by a model's kb: then over DATA_DIR/documents/<name>/ with default
settings), their embedding clients and the indexer thread; each one is a
kb.KnowledgeBase.  They take turns on one dense-scan slot (dense_scan_slots), as
they share numpy's BLAS threads, and a serving process imports numpy as its
indexer starts, off the request path.  The embedding client (and the HTTP
client under it) is made only for a KB on an embedding provider, so a lexical
search loads neither.

Worker processes serving one data directory (serve --workers) share one
indexer (share_indexer): the owner runs the indexer thread, and a relay thread
that takes the index requests the other workers leave in the shared run
directory and publishes its KBs' live status there.  The others run no
indexer and take no Chroma lease: they search the generations the owner
commits (readers follow the store's CURRENT file, a Chroma KB's local mirror
included, which the owner keeps in step), leave their index requests for the
owner, and show its published status, or "unknown" when it is missing or stale.

May import: deps, embeddings, files, kb, upstream, vectorstore.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import threading
import time

from . import deps
from .files import atomic_write
from .kb import KBSpec, KnowledgeBase
from .vectorstore import StoreSpec, VectorStoreError

log = logging.getLogger("ragproxy")


_BLAS_THREADS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")

# In the run directory workers share (share_indexer): the requests the other workers leave
# for the owner, one file per KB (or all) and kind, and the owner's published status.
REQUESTS_DIR = "index-requests"
STATUS_FILE = "indexer-status.json"
# How often the owner's relay takes requests and looks for a status change to publish: the
# longest a request waits to be seen, and the most often the status file is rewritten.
RELAY_PERIOD = 1.0
# An unchanged status is published again this often, so the others can tell a quiet owner
# from a dead one; older than STALE_AFTER (three missed beats), it is no longer believed.
HEARTBEAT = 5.0
STALE_AFTER = 15.0


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
        self._serving = False      # start() was called
        self._run_dir = None       # set by share_indexer: the run directory the workers share
        self._owner = True         # this worker indexes (always so when the indexer is not shared)
        self._relay = None         # the owner's relay thread
        self._published = (None, None)  # (when, the KBs' status) the owner last wrote
        self._read_cache = None    # (stat key, what it held) of the status file, on a non-owner
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
            self._set_status_sources()
        if self._serving:  # a KB added by a reload gets its folder at once too
            self._make_documents_dirs()
        self._wake.set()

    def share_indexer(self, run_dir, owner):
        """Share one indexer among worker processes on one data directory; call once, before start().

        Every worker passes the same ``run_dir``; the one with ``owner`` true
        indexes (and holds any Chroma lease) as a lone process does, and also
        takes the others' index requests from ``run_dir`` and publishes its
        KBs' status there.  The others start no indexer, pass request_index()
        on to it, and their KBs' stats() show its published status.
        """
        if self._serving:
            raise RuntimeError("share_indexer() must come before start()")
        self._run_dir = os.path.abspath(run_dir)
        self._owner = bool(owner)
        os.makedirs(os.path.join(self._run_dir, REQUESTS_DIR), exist_ok=True)
        with self._lock:
            self._set_status_sources()

    def _set_status_sources(self):
        source = None if self._owner else self._owner_status
        for kb in self.kbs.values():
            kb.status_source = source

    def get(self, name):
        return self.kbs.get(name)

    def request_index(self, name=None, full=False):
        """Have the background indexer run soon: for one KB or all, incremental or full.

        On a worker that does not index, the request is left for the one that does.
        """
        if not self._owner:
            self._leave_request(name, full)
            return
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
        finds where to drop files (the default config names ``docs``).  A
        worker that shares another's indexer (share_indexer) starts no thread.
        """
        self._make_documents_dirs()
        self._serving = True
        if not self._owner:
            if self.kbs:
                # The indexer thread imports numpy for a lone process (see _run); here no thread
                # is started for it (one still inside numpy's import at exit would abort the
                # process, cli.INDEXER_STOP_WAIT), so it is imported now, before any request.
                deps.np
            return
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="indexer", daemon=True)
            self._thread.start()
        if self._run_dir is not None and self._relay is None:
            # Its own thread, not the indexer's: that one is busy for the whole of a long run
            # (and on no per-file progress while a batch is embedded, or a Chroma mirror read),
            # yet a request left meanwhile must show as queued, and the others must see the
            # run's progress and a heartbeat.
            self._relay = threading.Thread(target=self._relay_loop, name="indexer-relay", daemon=True)
            self._relay.start()

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
        if wait is not None:
            deadline = time.monotonic() + wait
            for thread in (self._thread, self._relay):
                if thread is not None:
                    thread.join(max(0.0, deadline - time.monotonic()))
        self._release_leases()

    def indexer_running(self):
        """Whether the indexer thread (or the owner's relay) is alive; stop() asks them to end.

        Always False on a worker that shares another's indexer: it starts no thread.
        """
        return any(thread is not None and thread.is_alive() for thread in (self._thread, self._relay))

    def _release_leases(self):
        for kb in list(self.kbs.values()):
            if kb.chroma is not None:
                with contextlib.suppress(VectorStoreError):
                    kb.chroma.release()

    # -- one indexer shared by worker processes (share_indexer) ---------------

    def _request_path(self, name, full):
        # Hashed, not the name itself: a KB's name may hold any character and be of any length,
        # and a file name may not.  The name is in the file; one file per KB and kind, so a
        # request left again before the owner took it is the same file, and a full request is
        # never overwritten by an incremental one.
        key = "all" if not name else "kb-" + hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:32]
        return os.path.join(self._run_dir, REQUESTS_DIR, f"{key}.{'full' if full else 'incremental'}")

    def _leave_request(self, name, full):
        data = json.dumps({"kb": name or None, "full": bool(full)}).encode("ascii")
        path = self._request_path(name, full)
        try:
            # fsync=False: a request lost in a power cut is answered by the owner's start-up run anyway.
            atomic_write(path, data, mode=0o600, fsync=False)
        except OSError as exc:
            log.error("cannot leave an index request for %s in %s: %s (the indexing worker still checks the "
                      "sources every rag.index_interval)", f"kb {name}" if name else "every kb", path,
                      exc.strerror or exc)

    def take_requests(self):
        """The owner: turn the index requests the other workers left into request_index calls; how many."""
        folder = os.path.join(self._owner_run_dir(), REQUESTS_DIR)
        try:
            names = sorted(os.listdir(folder))
        except OSError as exc:
            log.warning("cannot read the index requests in %s: %s", folder, exc.strerror or exc)
            return 0
        taken = 0
        for fname in names:
            if fname.startswith("."):  # atomic_write's temporary files, and ones being taken
                continue
            path, held = os.path.join(folder, fname), os.path.join(folder, ".taking-" + fname)
            try:
                # Renamed before it is read: a worker leaving the same request meanwhile makes a
                # new file, taken on the next pass, rather than being deleted unread.
                os.replace(path, held)
                with open(held, "rb") as f:
                    raw = f.read(4096)
                os.unlink(held)
            except FileNotFoundError:
                continue
            except OSError as exc:
                log.warning("cannot take the index request %s: %s", path, exc.strerror or exc)
                continue
            try:
                request = json.loads(raw.decode("utf-8"))
                name, full = request["kb"], request["full"]
                if not (name is None or isinstance(name, str)) or not isinstance(full, bool):
                    raise TypeError("kb must be a name or null, full true or false")
            except (ValueError, KeyError, TypeError) as exc:
                log.warning("ignoring an unreadable index request %s: %s", path, exc)
                continue
            self.request_index(name, full=full)
            taken += 1
        return taken

    def _snapshot(self):
        out = {}
        for name, kb in list(self.kbs.items()):
            status = dict(kb.status)
            if kb.chroma is not None:  # its role and sync are this process's to see; the built-in store's are on disk
                status["store"] = kb.store_status()
            out[name] = status
        return out

    def relay(self):
        """One pass of the owner's relay: take the requests left, publish the KBs' status; True if written.

        The status is written only when it changed, or HEARTBEAT seconds after it last was.
        """
        self.take_requests()
        now = self.clock()
        kbs = self._snapshot()
        when, last = self._published
        if when is not None and kbs == last and now - when < HEARTBEAT:
            return False
        data = json.dumps({"format": 1, "at": now, "pid": os.getpid(), "kbs": kbs}, default=str,
                          sort_keys=True).encode("utf-8")
        path = os.path.join(self._owner_run_dir(), STATUS_FILE)
        try:
            atomic_write(path, data, mode=0o600, fsync=False)  # a status outlives no crash worth an fsync
        except OSError as exc:
            if when is None or now - when >= HEARTBEAT:  # once a beat, not once a second
                log.warning("cannot publish the indexer's status in %s: %s", path, exc.strerror or exc)
            return False
        self._published = (now, kbs)
        return True

    def _owner_run_dir(self):
        # Another worker publishing its own (idle) status would hide the owner's.
        if self._run_dir is None or not self._owner:
            raise RuntimeError("only the indexing worker relays, after share_indexer(run_dir, owner=True)")
        return self._run_dir

    def _relay_loop(self):
        while not self._stop.is_set():
            try:
                self.relay()
            except Exception as exc:  # never the end of the relay: the others would see the owner as dead
                log.error("the indexer's relay failed: %s", exc, exc_info=True)
            self._stop.wait(RELAY_PERIOD)

    def _read_published(self):
        """The owner's status file as a dict, or a string saying why there is none; re-read only when it changed."""
        path = os.path.join(self._run_dir, STATUS_FILE)
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return "the indexing worker has published no status yet (it may not have started)"
        except OSError as exc:
            return f"cannot read the indexing worker's status: {exc.strerror or exc}"
        key = (st.st_mtime_ns, st.st_size, st.st_ino)
        cached = self._read_cache
        if cached is not None and cached[0] == key:
            return cached[1]
        try:
            with open(path, "rb") as f:
                published = json.loads(f.read().decode("utf-8"))
            if not isinstance(published.get("kbs"), dict) or not isinstance(published.get("at"), (int, float)):
                raise ValueError("no kbs or at")
        except (OSError, ValueError, AttributeError) as exc:
            published = f"the indexing worker's status file is unreadable: {exc}"
        self._read_cache = (key, published)
        return published

    def _owner_status(self, kb):
        """A non-owner KB's status_source: the owner's published status, or state "unknown" and why."""
        try:
            published = self._read_published()
            if isinstance(published, str):
                return _unknown(kb, published)
            age = self.clock() - published["at"]
            if age > STALE_AFTER:
                return _unknown(kb, f"the indexing worker last published its status {age:.0f} s ago: it may "
                                    f"have stopped or hung")
            theirs = published["kbs"].get(kb.spec.name)
            if not isinstance(theirs, dict):
                return _unknown(kb, "the indexing worker does not serve this knowledge base (its config may "
                                    "not be reloaded yet)")
            status = {**kb.status, **theirs}
            name = kb.spec.name
            if status.get("state") == "idle" and any(
                    os.path.exists(self._request_path(n, f)) for n in (name, None) for f in (False, True)):
                status["state"] = "queued"  # left here, not taken yet: as a lone process shows it at once
            if kb.chroma is not None and isinstance(theirs.get("store"), dict):
                status["store"] = _merge_store(theirs["store"], kb.store_status())
            return status
        except Exception as exc:  # stats() must answer whatever the file holds
            return _unknown(kb, f"cannot read the indexing worker's status: {exc}")


def _unknown(kb, reason):
    return {**kb.status, "state": "unknown", "done": 0, "total": 0, "chunks": 0, "last_error": None,
            "last_report": None, "state_reason": reason}


def _merge_store(theirs, mine):
    """A Chroma KB's store status on a non-owner: the owner's role, mirror and error count, and the
    server's state as whichever of the two saw it last (this process asks it too, for dense searches).

    The error count stays the owner's alone: /metrics is answered by any worker, and a counter
    that differed from one worker to the next would look like a reset at every other scrape.
    """
    out = dict(theirs)
    if mine.get("checked_at") is not None and mine["checked_at"] > (theirs.get("checked_at") or 0):
        out.update(reachable=mine["reachable"], error=mine["error"], checked_at=mine["checked_at"])
    return out


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
