#!/usr/bin/env python3
"""Speed of ragproxy's retrieval next to the usual Python libraries, in one run.

    python bench/perf.py                                  # lexical, dense (10k, 100k): ~4 min
    python bench/perf.py --only lexical                   # BM25 on the stdlib's .py files (~75k chunks)
    python bench/perf.py --only dense --dense-sizes 10000,100000,1000000    # 1M needs ~6 GB RAM
    python bench/perf.py --only lexical --max-files 20 --queries 10          # a quick smoke run
    python bench/perf.py --json                           # the tables, then one JSON line
    python bench/perf.py --ragproxy /tmp/patched/ragproxy.py                 # measure a changed copy
    python bench/perf.py --only chroma                    # built-in store vs Chroma, 100k (needs `chroma`)
    python bench/perf.py --only chroma --chroma-1m --scifact ../shared/eval/scifact --start-embed-server

Each comparison runs every side in this one invocation, on the same data, and
prints absolute figures and ratios to ragproxy (ratio > 1: the other side is
slower / bigger).

lexical  Corpus: every .py file of this interpreter's standard library
         (site-packages excluded), chunked by ragproxy's own extract() and
         chunk_document() (256-token code chunks), indexed as each chunk's
         index_text().  Queries: identifiers and docstring phrases drawn from
         the corpus (fixed seed).  Sides, each in a fresh subprocess so its
         memory is its own: ragproxy (numpy), ragproxy pure (RAGPROXY_PURE=1),
         bm25s with its own tokenizer (English stopwords, PyStemmer's Snowball
         stemmer when installed), bm25s fed ragproxy's tokens (index cost
         alone, and a check that both rank alike), rank_bm25's BM25Okapi on
         ragproxy's tokens.  Figures: tokenize and index seconds, peak RSS
         growth while building, RSS kept by the index afterwards, single-
         threaded query p50/p99 (tokenizing the query included), top-10
         overlap with ragproxy.
dense    Unit vectors (384 dims, clustered like sentence embeddings, fixed
         seed) at each N: single-query top-10 latency of the raw numpy floor
         (``matrix @ q`` alone, then with a top-10 selection), ragproxy's
         dense_top_k, Generation.dense_search through a real on-disk store
         (memory-mapped float32; int8 and float16 compact copies), faiss
         IndexFlatIP when installed, and the stdlib-only path at the smallest
         N; recall@10 of each against exact search.  The sides take turns
         query by query (--back-to-back: each side's queries in a row, warm
         caches and thread pools).  BLAS threads: compare a run under
         OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1.
chroma   (asked for by name: --only chroma)  The same vectors in the
         built-in store and on a Chroma server, side by side: synthetic unit
         vectors as in dense (100k; --chroma-1m adds 1M) written as the
         indexer writes a generation and upserted through ragproxy's own HTTP
         client (_ragproxy/chroma.py) in batches of the server's
         max_batch_size; vectors/s; dense top-10 p50/p99 and recall@10 (the
         sides taking turns); the RSS of a fresh process that opens each side
         and answers queries, and the Chroma server's RSS and peak.  A
         `chroma run` is started per size on a free loopback port
         (--chroma-bin, $RAGPROXY_CHROMA_BIN, beside this Python, PATH), or
         --chroma-url names a running one (its memory is then not read).
         --scifact DIR adds SciFact test in two KBs with the same settings,
         one built-in and one chroma_http, imported with `ragproxy import`
         and searched with KnowledgeBase.search: nDCG@10 per mode (lexical;
         dense and hybrid with --embed-url or --start-embed-server), whether
         both agree to three decimals, search(10) p50/p99, ingest seconds.
(Start-up time has its own bench: bench/startup.py.)

Optional libraries (bench/requirements.txt): bm25s, PyStemmer, rank_bm25,
faiss-cpu.  A missing one is reported ("bm25s not installed") and its side
skipped.  Linux gives memory figures (/proc); elsewhere they are left out.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib
import importlib.util
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
RAGPROXY = os.path.join(ROOT, "ragproxy.py")
PARTS = ("lexical", "dense", "chroma")
DEFAULT_PARTS = ("lexical", "dense")   # chroma needs a Chroma server: asked for by name
DIM = 384
TOP = 10


# --------------------------------------------------------------------------
# Small helpers


def load_ragproxy(path=RAGPROXY):
    """Import ``ragproxy`` from the tree holding ``path`` (its ragproxy.py and the _ragproxy package beside it)."""
    root = os.path.dirname(os.path.abspath(path))
    sys.path.insert(0, root)
    module = importlib.import_module(os.path.splitext(os.path.basename(path))[0])
    if os.path.dirname(os.path.abspath(module.__file__)) != root:
        raise RuntimeError(f"imported {module.__file__}, not the ragproxy.py in {root}")
    return module


def _have(module):
    """True if ``module`` imports (a broken or blocked install counts as missing)."""
    try:
        importlib.import_module(module)
        return True
    except ImportError:
        return False


def _proc_kb(field):
    """A VmRSS / VmHWM figure of this process in KiB, or None off Linux."""
    return _pid_kb("self", field)


def _reset_peak():
    """Restart VmHWM from the current RSS (Linux >= 4.0); False if not possible."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _mib(kib):
    return None if kib is None else round(kib / 1024.0, 1)


def _pct(values, p):
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100.0 * (len(ordered) - 1))))]


def _latencies(fn, queries, warmup=5, idle=0.0):
    """Per-call seconds of fn(q) over queries, after a few untimed calls.

    ``idle`` seconds of sleep before each call model queries that arrive
    apart, as a proxy's do: thread pools (BLAS, OpenMP) park their threads
    in between and pay to wake them.
    """
    for q in queries[:warmup]:
        fn(q)
    out, results = [], []
    clock = time.perf_counter
    for q in queries:
        if idle:
            time.sleep(idle)
        t0 = clock()
        r = fn(q)
        out.append(clock() - t0)
        results.append(r)
    return out, results


def _ms(seconds):
    return None if seconds is None else round(seconds * 1000.0, 3)


def _ratio(value, base):
    if value is None or base in (None, 0):
        return None
    return round(value / base, 2)


def _fmt(v, digits=2):
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


def print_table(head, rows, out=sys.stdout):
    rows = [[_fmt(c) for c in r] for r in rows]
    widths = [max(len(str(r[i])) for r in [head] + rows) for i in range(len(head))]
    for r in [head] + rows:
        print("  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w) for i, (c, w) in enumerate(zip(r, widths))),
              file=out)


def _run_worker(role, args, input_path, env_extra=None, timeout=3600):
    """Run this script as a worker subprocess; returns its JSON result."""
    env = dict(os.environ)
    env.pop("RAGPROXY_PURE", None)
    env.update(env_extra or {})
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", role, "--input", input_path,
           "--ragproxy", args.ragproxy]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, timeout=timeout)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = "\n".join(proc.stderr.strip().splitlines()[-5:])
        return {"error": f"worker {role} failed (exit {proc.returncode}): {tail}"}
    return json.loads(lines[-1])


# --------------------------------------------------------------------------
# Corpus: the stdlib's .py files, chunked by ragproxy


def stdlib_files(max_files=0):
    root = sysconfig.get_paths()["stdlib"]
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in ("site-packages", "dist-packages", "__pycache__"))
        files += [os.path.join(dirpath, f) for f in sorted(filenames) if f.endswith(".py")]
    if max_files:
        files = files[:max_files]
    return root, files


def chunk_corpus(rp, root, files):
    """Chunks of the files as the KB would make them; returns (chunks, seconds, bytes)."""
    chunks, size = [], 0
    started = time.perf_counter()
    for path in files:
        rel = os.path.relpath(path, root).replace(os.sep, "/")
        with open(path, "rb") as f:
            data = f.read()
        size += len(data)
        try:
            for doc in rp.extract(rel, data):
                chunks.extend(rp.chunk_document(doc, "auto", 256, 32))
        except rp.SkipFile:
            continue
    return chunks, time.perf_counter() - started, size


_IDENT_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{5,}")
_PROSE_RE = re.compile(r"^[A-Za-z][A-Za-z ,'-]+$")


def make_queries(chunks, n, seed=1234):
    """About half identifiers (a chunk's symbol, or a long name in its code), half
    runs of 3-6 words from docstring or comment lines."""
    rng = random.Random(seed)
    idents, phrases = [], []
    order = list(range(len(chunks)))
    rng.shuffle(order)
    for i in order:
        if len(idents) >= n and len(phrases) >= n:
            break
        c = chunks[i]
        if len(idents) < n:
            name = c.symbol.rsplit(".", 1)[-1] if c.symbol else ""
            if len(name) < 4:
                found = _IDENT_RE.findall(c.text)
                name = rng.choice(found) if found else ""
            if name:
                idents.append(name)
        if len(phrases) < n:
            lines = [ln.strip().lstrip("#").strip().strip('"') for ln in c.text.split("\n")]
            lines = [ln for ln in lines if _PROSE_RE.match(ln) and len(ln.split()) >= 5]
            if lines:
                words = rng.choice(lines).split()
                width = rng.randint(3, min(6, len(words)))
                start = rng.randint(0, len(words) - width)
                phrases.append(" ".join(words[start:start + width]))
    queries = []
    for a, b in zip(idents, phrases):
        queries += [a, b]
    return queries[:n] if len(queries) >= n else (queries + idents[len(queries) // 2:] + phrases)[:n]


# --------------------------------------------------------------------------
# Lexical workers (one per subprocess)


def _lexical_build(role, rp, texts, pre_tokens):
    """Build one side's index; returns (tokenize seconds, index seconds, search function).

    Tokens made here are dropped before returning, so what stays referenced
    is what the side keeps to answer queries (for ragproxy: the index and the
    analyzer with its word cache, as a knowledge base holds them).
    """
    clock = time.perf_counter
    if role in ("ragproxy", "ragproxy-pure"):
        analyzer = rp.Analyzer()
        t0 = clock()
        tokens = analyzer.tokens_many(texts)
        t1 = clock()
        index = rp.BM25Index.build(tokens)
        t2 = clock()
        del tokens

        def search(q):
            return [d for d, _ in index.search(analyzer.query_tokens(q), TOP)]
        return t1 - t0, t2 - t1, search
    if role == "bm25s":
        import bm25s
        try:
            import Stemmer
            stemmer = Stemmer.Stemmer("english")
        except ImportError:
            stemmer = None
        t0 = clock()
        corpus_tokens = bm25s.tokenize(texts, stopwords="en", stemmer=stemmer, show_progress=False)
        t1 = clock()
        index = bm25s.BM25(k1=1.2, b=0.75, method="lucene")
        index.index(corpus_tokens, show_progress=False)
        t2 = clock()
        del corpus_tokens
        k = min(TOP, len(texts))

        def search(q):
            qt = bm25s.tokenize([q], stopwords="en", stemmer=stemmer, show_progress=False)
            docs, scores = index.retrieve(qt, k=k, show_progress=False, n_threads=1)
            return [int(d) for d, s in zip(docs[0], scores[0]) if s > 0]
        return t1 - t0, t2 - t1, search
    # The remaining sides index ragproxy's tokens (made before, not timed).
    analyzer = rp.Analyzer()
    if role == "bm25s-ragproxy-tokens":
        import bm25s
        t0 = clock()
        index = bm25s.BM25(k1=1.2, b=0.75, method="lucene")
        index.index(pre_tokens, show_progress=False)
        t2 = clock()
        vocab = index.vocab_dict
        k = min(TOP, len(texts))

        def search(q):
            qt = [t for t in analyzer.query_tokens(q) if t in vocab]
            if not qt:
                return []
            docs, scores = index.retrieve([qt], k=k, show_progress=False, n_threads=1)
            return [int(d) for d, s in zip(docs[0], scores[0]) if s > 0]
        return 0.0, t2 - t0, search
    if role == "rank_bm25":
        import numpy as np
        from rank_bm25 import BM25Okapi
        t0 = clock()
        index = BM25Okapi(pre_tokens)
        t2 = clock()

        def search(q):
            scores = index.get_scores(analyzer.query_tokens(q))
            top = np.argsort(-scores, kind="stable")[:TOP]
            return [int(d) for d in top if scores[d] > 0]
        return 0.0, t2 - t0, search
    raise SystemExit(f"unknown worker role {role}")


def _lexical_worker(role, data, ragproxy_path, memory=True):
    texts, queries = data["texts"], data["queries"]
    if role in ("bm25s", "bm25s-ragproxy-tokens") and not _have("bm25s"):
        return {"role": role, "skipped": "bm25s not installed"}
    if role == "rank_bm25" and not _have("rank_bm25"):
        return {"role": role, "skipped": "rank_bm25 not installed"}
    rp = load_ragproxy(ragproxy_path)
    out = {"role": role, "ragproxy": rp.version_text()}
    if role == "bm25s":
        out["stemmer"] = "PyStemmer english" if _have("Stemmer") else "none (PyStemmer not installed)"
    if role == "rank_bm25":
        queries = queries[:data.get("rank_bm25_queries", 20)]
    pre_tokens = None
    if role in ("bm25s-ragproxy-tokens", "rank_bm25"):
        pre_tokens = rp.Analyzer().tokens_many(texts)
    gc.collect()
    peak_ok = _reset_peak()
    base = _proc_kb("VmRSS")
    tokenize_s, index_s, search = _lexical_build(role, rp, texts, pre_tokens)
    peak = _proc_kb("VmHWM")
    lat, results = _latencies(search, queries)
    out.update({
        "docs": len(texts), "tokenize_s": round(tokenize_s, 3), "index_s": round(index_s, 3),
        "build_s": round(tokenize_s + index_s, 3),
        "peak_rss_mib": _mib(peak - base) if (peak_ok and peak is not None and base is not None) else None,
        "queries": len(queries), "p50_ms": _ms(_pct(lat, 50)), "p99_ms": _ms(_pct(lat, 99)),
        "mean_ms": _ms(statistics.mean(lat)) if lat else None, "top": results,
    })
    if memory:
        # Again under tracemalloc (numpy reports its buffers to it too): what
        # the index keeps, and the peak of building it.  Slower, so untimed.
        import tracemalloc
        del search
        gc.collect()
        tracemalloc.start()
        _, _, search = _lexical_build(role, rp, texts, pre_tokens)
        gc.collect()
        current, traced_peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        out["index_mib"] = round(current / 2 ** 20, 1)
        out["build_peak_mib"] = round(traced_peak / 2 ** 20, 1)
    return out


LEXICAL_SIDES = (
    ("ragproxy", "ragproxy (numpy)", None),
    ("ragproxy-pure", "ragproxy pure (RAGPROXY_PURE=1)", {"RAGPROXY_PURE": "1"}),
    ("bm25s", "bm25s (own tokenizer)", None),
    ("bm25s-ragproxy-tokens", "bm25s on ragproxy tokens", None),
    ("rank_bm25", "rank_bm25 BM25Okapi on ragproxy tokens", None),
)


def run_lexical(args, rp, report):
    root, files = stdlib_files(args.max_files)
    chunks, chunk_s, size = chunk_corpus(rp, root, files)
    texts = [c.index_text() for c in chunks]
    queries = make_queries(chunks, args.queries)
    print(f"\n== lexical: {len(files)} stdlib .py files ({size / 1e6:.1f} MB) from {root}\n"
          f"   -> {len(texts)} chunks by ragproxy's chunker in {chunk_s:.1f} s; {len(queries)} queries "
          f"(e.g. {queries[:2]!r}); BM25 k1=1.2 b=0.75 everywhere")
    tmp = tempfile.mkdtemp(prefix="ragproxy-perf-")
    try:
        path = os.path.join(tmp, "lexical.json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump({"texts": texts, "queries": queries, "rank_bm25_queries": args.rank_bm25_queries,
                       "no_memory": args.no_memory}, f)
        del texts
        results = {}
        for role, label, env in LEXICAL_SIDES:
            if role not in args.lexical_sides:
                continue
            print(f"   running {label} ...", file=sys.stderr, flush=True)
            res = _run_worker(role, args, path, env)
            results[role] = res
            if res.get("skipped"):
                print(f"   {label}: {res['skipped']}; side skipped")
            elif res.get("error"):
                print(f"   {label}: {res['error']}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    base = results.get("ragproxy", {})
    base_top = base.get("top") or []
    head = ("side", "tokenize s", "index s", "build s", "x", "index MiB", "x", "build peak MiB", "peak RSS MiB",
            "p50 ms", "p99 ms", "x", "top10 overlap")
    rows, summary = [], {"files": len(files), "bytes": size, "chunks": len(chunks), "chunk_s": round(chunk_s, 2),
                         "queries": len(queries), "sides": {}}
    for role, label, _ in LEXICAL_SIDES:
        res = results.get(role)
        if not res or res.get("skipped") or res.get("error"):
            continue
        overlap = None
        if base_top and res.get("top"):
            pairs = [(set(a), set(b)) for a, b in zip(base_top, res["top"]) if a]
            if pairs:
                overlap = round(sum(len(a & b) / len(a) for a, b in pairs) / len(pairs), 3)
        if role == "bm25s" and res.get("stemmer"):
            label += f" [stemmer: {res['stemmer']}]"
        if role == "rank_bm25":
            label += f" [{res['queries']} queries]"
        rows.append((label, res["tokenize_s"], res["index_s"], res["build_s"], _ratio(res["build_s"], base.get("build_s")),
                     res.get("index_mib"), _ratio(res.get("index_mib"), base.get("index_mib")),
                     res.get("build_peak_mib"), res["peak_rss_mib"],
                     res["p50_ms"], res["p99_ms"], _ratio(res["p50_ms"], base.get("p50_ms")), overlap))
        summary["sides"][role] = {k: v for k, v in res.items() if k != "top"}
        summary["sides"][role]["top10_overlap"] = overlap
    print_table(head, rows)
    print("   build = tokenize + index (sides on ragproxy tokens: index only); x = ratio to ragproxy (numpy);\n"
          "   index MiB = memory the side keeps to answer queries, build peak MiB = most memory while tokenizing and\n"
          "   indexing (both tracemalloc, numpy buffers included; the sides on ragproxy tokens exclude those tokens);\n"
          "   peak RSS = the process's resident-set growth while building; queries single-threaded, tokenizing "
          "included")
    report["lexical"] = summary


# --------------------------------------------------------------------------
# Dense


def make_vectors(np, n, dim=DIM, seed=7, clusters=256):
    """Unit rows around `clusters` random centres (like embeddings: not uniform)."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((clusters, dim), dtype=np.float32)
    out = np.empty((n, dim), dtype=np.float32)
    for start in range(0, n, 100000):
        stop = min(n, start + 100000)
        block = centres[rng.integers(0, clusters, stop - start)]
        block += 0.9 * rng.standard_normal((stop - start, dim), dtype=np.float32)
        block /= np.linalg.norm(block, axis=1, keepdims=True)
        out[start:stop] = block
    return out


def make_dense_queries(np, mat, count, seed=11):
    rng = np.random.default_rng(seed)
    picks = mat[rng.integers(0, len(mat), count)]
    q = picks + rng.standard_normal(picks.shape, dtype=np.float32) * np.float32(0.5 / mat.shape[1] ** 0.5)
    # float32 like the matrix: a float64 query would upcast the whole matrix per product.
    return (q / np.linalg.norm(q, axis=1, keepdims=True)).astype(np.float32)


def _load_real_vectors(np, args):
    """Your own embeddings (.npy, one row per chunk) and queries (.npy, or
    random rows of the matrix, nudged, when no query file is given)."""
    mat = np.ascontiguousarray(np.load(args.dense_vectors), dtype=np.float32)
    mat /= np.maximum(np.linalg.norm(mat, axis=1, keepdims=True), 1e-12)
    if args.dense_query_vectors:
        queries = np.ascontiguousarray(np.load(args.dense_query_vectors), dtype=np.float32)
        queries = queries[:args.dense_queries]
        queries /= np.maximum(np.linalg.norm(queries, axis=1, keepdims=True), 1e-12)
    else:
        queries = make_dense_queries(np, mat, args.dense_queries)
    if mat.ndim != 2 or queries.ndim != 2 or queries.shape[1] != mat.shape[1]:
        raise SystemExit(f"--dense-vectors {mat.shape} and queries {queries.shape} do not fit together")
    return mat, queries


def _build_store(rp, path, mat, compact):
    store = rp.KBStore(path, compact=compact)
    with store.begin() as writer:
        writer.add_chunks({"id": str(i), "text": "", "source": "bench"} for i in range(len(mat)))
        writer.set_vectors(mat, normalize=False)
    return store


def _dense_pure_worker(data, ragproxy_path):
    rp = load_ragproxy(ragproxy_path)
    if rp.FEATURES.get("pure") is not True or rp.FEATURES.get("numpy") is not None:
        return {"error": "RAGPROXY_PURE=1 did not take effect"}
    gen = rp.KBStore(data["store"]).current()
    queries = data["queries"]
    lat, results = _latencies(lambda q: [r for r, _ in gen.dense_search(q, TOP)], queries, warmup=2)
    return {"p50_ms": _ms(_pct(lat, 50)), "p99_ms": _ms(_pct(lat, 99)), "queries": len(queries), "top": results}


def run_dense(args, rp, report):
    try:
        import numpy as np
    except ImportError:
        print("\n== dense: numpy not installed; skipped")
        return
    faiss = None
    try:
        import faiss
    except ImportError:
        print("\n== dense: faiss not installed (pip install faiss-cpu); that side skipped")
    blas = _blas_info()
    source = f"the embeddings in {args.dense_vectors}" if args.dense_vectors else f"{DIM}-dim synthetic unit vectors"
    print(f"\n== dense: {source}, top-{TOP}, single query at a time, {args.dense_queries} queries"
          f"{f', {args.idle_ms:g} ms idle before each' if args.idle_ms else ''}"
          f"{', each side back to back' if args.back_to_back else ', the sides taking turns query by query'}; "
          f"numpy {np.__version__} ({blas})")
    summary = {}
    tmp = tempfile.mkdtemp(prefix="ragproxy-perf-dense-")
    try:
        for size in args.dense_sizes:
            t0 = time.perf_counter()
            n = size
            if args.dense_vectors:
                mat, queries = _load_real_vectors(np, args)
                n = len(mat)
            else:
                mat = make_vectors(np, n)
                queries = make_dense_queries(np, mat, args.dense_queries)
            exact = [np.argsort(-(mat @ q), kind="stable")[:TOP] for q in queries]
            gen_s = time.perf_counter() - t0
            stores = {}
            for compact in (None, "i8", "f16", "b1"):
                t1 = time.perf_counter()
                stores[compact] = _build_store(rp, os.path.join(tmp, f"n{n}-{compact or 'f32'}"), mat, compact)
                if compact is None:
                    store_s = time.perf_counter() - t1
            g32, g8, g16, g1 = (stores[c].current() for c in (None, "i8", "f16", "b1"))
            plan = [  # (label, call, report recall)
                ("numpy floor: matrix @ q", lambda q: mat @ q, False),
                ("numpy floor + top-10 (argpartition)", lambda q: _np_top(np, mat @ q), False),
                ("ragproxy dense_top_k (in memory)", lambda q: [r for r, _ in rp.dense_top_k(mat, q, TOP)], True),
                ("ragproxy Generation.dense_search (memmap f32)", lambda q: [r for r, _ in g32.dense_search(q, TOP)],
                 True),
                ("ragproxy dense_search, int8 copy (auto)", lambda q: [r for r, _ in g8.dense_search(q, TOP)], True),
                ("ragproxy dense_search, int8 copy, oversample 1",
                 lambda q: [r for r, _ in g8.dense_search(q, TOP, oversample=1)], True),
                ("ragproxy dense_search, float16 copy",
                 lambda q: [r for r, _ in g16.dense_search(q, TOP, use_compact=True)], True),
                (f"ragproxy dense_search, binary codes (auto: re-scores {rp.binary_pool(n, TOP)})",
                 lambda q: [r for r, _ in g1.dense_search(q, TOP)], True),
            ]
            index = None
            if faiss is not None:
                index = faiss.IndexFlatIP(mat.shape[1])
                index.add(mat)
                plan.append((f"faiss IndexFlatIP ({faiss.omp_get_max_threads()} threads)",
                             lambda q: index.search(q[None, :], TOP)[1][0], True))
            count = args.dense_queries if n < 1000000 else max(10, args.dense_queries // 4)
            timings = _interleaved(plan, list(queries[:count]), args.idle_ms / 1000.0,
                                   interleave=not args.back_to_back)
            sides = []
            for (label, _, recall), (lat, res) in zip(plan, timings):
                rec = None
                if recall:
                    rec = round(sum(len(set(map(int, r)) & set(map(int, e))) for r, e in zip(res, exact))
                                / float(TOP * len(res)), 4)
                sides.append({"side": label, "p50_ms": _ms(_pct(lat, 50)), "p99_ms": _ms(_pct(lat, 99)),
                              "recall@10": rec})
            index = plan = None  # free the faiss copy before the next size
            if size == min(args.dense_sizes) and not args.no_pure:
                path = os.path.join(tmp, "pure-queries.json")
                pq = queries[:args.pure_queries]
                with open(path, "w", encoding="utf-8") as f:
                    json.dump({"store": stores[None].root, "queries": pq.tolist()}, f)
                res = _run_worker("dense-pure", args, path, {"RAGPROXY_PURE": "1"})
                if res.get("error"):
                    print(f"   pure side: {res['error']}")
                else:
                    rec = round(sum(len(set(r) & set(map(int, e))) for r, e in zip(res["top"], exact))
                                / float(TOP * len(res["top"])), 4)
                    sides.append({"side": f"ragproxy pure (RAGPROXY_PURE=1) dense_search [{res['queries']} queries]",
                                  "p50_ms": res["p50_ms"], "p99_ms": res["p99_ms"], "recall@10": rec})
            for g in (g32, g8, g16, g1):
                g.close()
            base = next(s for s in sides if s["side"].startswith("ragproxy dense_top_k"))["p50_ms"]
            print(f"   N = {n:,} ({mat.nbytes / 2**20:.0f} MiB float32; data {gen_s:.1f} s, store write "
                  f"{store_s:.1f} s)")
            print_table(("side", "p50 ms", "p99 ms", "x p50", "recall@10"),
                        [(s["side"], s["p50_ms"], s["p99_ms"], _ratio(s["p50_ms"], base), s["recall@10"])
                         for s in sides])
            summary[str(n)] = sides
            mat = None
            for c, store in stores.items():
                shutil.rmtree(store.root, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("   x p50 = ratio to ragproxy dense_top_k (in memory); recall@10 against exact float32 search;\n"
          "   the pure side runs after the others, in its own process")
    report["dense"] = {"blas": blas, "queries": args.dense_queries, "idle_ms": args.idle_ms,
                       "interleaved": not args.back_to_back, "sizes": summary}


def _np_top(np, scores):
    part = np.argpartition(scores, len(scores) - TOP)[-TOP:]
    return part[np.argsort(-scores[part])]


def _interleaved(plan, queries, idle, warmup=3, interleave=True):
    """Time every side on every query, the sides taking turns query by query
    (starting one further each time), so a burst of load from outside hits
    all of them alike.  Returns [(seconds per query, results)] in plan order.

    ``interleave`` False runs each side's queries back to back instead: its
    data stays in the CPU caches and its thread pool stays awake, which is
    the best case rather than a proxy's case.
    """
    clock = time.perf_counter
    out = [([], []) for _ in plan]
    for q in queries[:warmup]:
        for _, call, _ in plan:
            call(q)
    if interleave:
        steps = [(i, (i + j) % len(plan)) for i in range(len(queries)) for j in range(len(plan))]
    else:
        steps = [(i, j) for j in range(len(plan)) for i in range(len(queries))]
    for i, j in steps:
        q = queries[i]
        call = plan[j][1]
        if idle:
            time.sleep(idle)
        t0 = clock()
        r = call(q)
        dt = clock() - t0
        out[j][0].append(dt)
        out[j][1].append(r)
    return out


def _blas_info():
    try:
        from threadpoolctl import threadpool_info
        info = [f"{i.get('internal_api')} {i.get('architecture') or ''} {i.get('num_threads')} threads".strip()
                for i in threadpool_info() if i.get("user_api") == "blas"]
        return "; ".join(info) or "blas: unknown"
    except ImportError:
        return "threadpoolctl not installed: BLAS kernel unknown"


# --------------------------------------------------------------------------
# Chroma: the same vectors in the built-in store and on a Chroma server


def find_chroma_bin(explicit=""):
    """`chroma` from --chroma-bin, $RAGPROXY_CHROMA_BIN, beside this interpreter, or PATH (None if none)."""
    for candidate in (explicit, os.environ.get("RAGPROXY_CHROMA_BIN", ""),
                      os.path.join(os.path.dirname(sys.executable), "chroma"), shutil.which("chroma") or ""):
        if candidate and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def _free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pid_kb(pid, field):
    """VmRSS / VmHWM of process ``pid`` in KiB (None off Linux or when it is gone)."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


class ChromaServer:
    """A `chroma run` this bench started on a free loopback port, or a server it was given (--chroma-url).

    Memory is read from /proc only for a server started here (its pid is known).
    """

    def __init__(self, url, proc=None, path=None):
        self.url, self.proc, self.path = url, proc, path

    @classmethod
    def start(cls, binary, timeout=120.0):
        import urllib.request
        path = tempfile.mkdtemp(prefix="ragproxy-perf-chroma-")
        port = _free_port()
        url = f"http://127.0.0.1:{port}"
        with open(os.path.join(path, "server.log"), "wb") as log:
            proc = subprocess.Popen([binary, "run", "--path", os.path.join(path, "data"), "--host", "127.0.0.1",
                                     "--port", str(port)], stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, env=dict(os.environ, ANONYMIZED_TELEMETRY="False"))
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                with open(os.path.join(path, "server.log"), encoding="utf-8", errors="replace") as f:
                    tail = f.read()[-2000:]
                shutil.rmtree(path, ignore_errors=True)
                raise SystemExit(f"perf: `{binary} run` exited with {proc.returncode}:\n{tail}")
            try:
                with urllib.request.urlopen(url + "/api/v2/heartbeat", timeout=2) as resp:
                    resp.read()
                return cls(url, proc, path)
            except OSError:
                if time.monotonic() > deadline:
                    proc.kill()
                    proc.wait()
                    shutil.rmtree(path, ignore_errors=True)
                    raise SystemExit(f"perf: the Chroma server did not answer within {timeout:.0f} s")
                time.sleep(0.2)

    def memory(self):
        """{"rss_mib", "peak_mib"} of the server process (None each when unknown)."""
        if self.proc is None:
            return {"rss_mib": None, "peak_mib": None}
        return {"rss_mib": _mib(_pid_kb(self.proc.pid, "VmRSS")), "peak_mib": _mib(_pid_kb(self.proc.pid, "VmHWM"))}

    def stop(self):
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None
        if self.path:
            shutil.rmtree(self.path, ignore_errors=True)
            self.path = None


def _chroma_module(rp):
    """ragproxy's Chroma HTTP client (_ragproxy/chroma.py beside the ragproxy.py being measured)."""
    del rp  # load_ragproxy put its tree first on sys.path
    return importlib.import_module("_ragproxy.chroma")


def _serve_worker(data, ragproxy_path):
    """A fresh process that opens one side's store and answers the queries: the memory a proxy needs for it."""
    rp = load_ragproxy(ragproxy_path)
    gc.collect()
    base = _proc_kb("VmRSS")
    queries = data["queries"]
    if data["side"] == "builtin":
        gen = rp.KBStore(data["store"]).current()

        def search(q):
            return [r for r, _ in gen.dense_search(q, TOP)]
    else:
        client = _chroma_module(rp).ChromaClient(data["url"], timeout=600)

        def search(q):
            return client.query(data["collection"], q, TOP)
    for q in queries:
        search(q)
    rss = _proc_kb("VmRSS")
    return {"rss_mib": _mib(rss), "growth_mib": _mib(rss - base) if rss is not None and base is not None else None}


def _chroma_dense_size(args, rp, np, server, n, tmp):
    """Index ``n`` synthetic vectors into both stores, time dense top-10 on each, read their memory."""
    chroma = _chroma_module(rp)
    client = chroma.ChromaClient(server.url, timeout=600)
    try:
        t0 = time.perf_counter()
        mat = make_vectors(np, n)
        count = args.chroma_queries if n < 1000000 else max(10, args.chroma_queries // 2)
        queries = make_dense_queries(np, mat, count)
        exact = [np.argsort(-(mat @ q), kind="stable")[:TOP] for q in queries]
        gen_s = time.perf_counter() - t0
        ids = [str(i) for i in range(n)]

        # Built-in: a generation written as the indexer writes one (chunk records, then float32 vectors).
        gc.collect()
        t0 = time.perf_counter()
        store = _build_store(rp, os.path.join(tmp, f"builtin-{n}"), mat, None)
        builtin_s = time.perf_counter() - t0

        # Chroma: the same records upserted in batches of the server's max_batch_size.
        name = f"ragproxy_perf_{n}_{os.getpid()}"
        if client.get_collection(name):
            client.delete_collection(name)
        col = client.create_collection(name, metadata={"ragproxy_bench": "perf.py"}, get_or_create=False,
                                       space="cosine")
        cid = col["id"]
        server_before = server.memory()
        batch = client.max_batch_size()
        t0 = time.perf_counter()
        for start in range(0, n, batch):
            stop = min(n, start + batch)
            client.upsert(cid, ids[start:stop], mat[start:stop], documents=[""] * (stop - start),
                          metadatas=[{"source": "bench"}] * (stop - start))
        upsert_s = time.perf_counter() - t0
        # The first query waits for whatever the server still applies after acknowledging the writes.
        client.query(cid, queries[0].tolist(), TOP)
        ready_s = time.perf_counter() - t0
        stored = client.count(cid)
        server_indexed = server.memory()

        gen = store.current()
        plan = [
            ("built-in: Generation.dense_search (float32 memmap, exact)",
             lambda q: [r for r, _ in gen.dense_search(q, TOP)], True),
            ("chroma: ChromaClient.query (HNSW, cosine)",
             lambda q: [int(i) for i, _ in client.query(cid, q.tolist(), TOP)], True),
        ]
        timings = _interleaved(plan, list(queries), args.idle_ms / 1000.0, interleave=not args.back_to_back)
        server_queried = server.memory()
        sides = []
        for (label, _, _), (lat, res) in zip(plan, timings):
            rec = round(sum(len(set(map(int, r)) & set(map(int, e))) for r, e in zip(res, exact))
                        / float(TOP * len(res)), 4)
            sides.append({"side": label, "p50_ms": _ms(_pct(lat, 50)), "p99_ms": _ms(_pct(lat, 99)), "recall@10": rec})
        gen.close()
        mat = exact = None
        gc.collect()

        # Memory of a process serving each side, each in a fresh process of its own.
        path = os.path.join(tmp, f"serve-{n}.json")
        serve = {}
        for side in ("builtin", "chroma"):
            with open(path, "w", encoding="utf-8") as f:
                json.dump({"side": side, "store": store.root, "url": server.url, "collection": cid,
                           "queries": queries[:min(len(queries), 50)].tolist()}, f)
            serve[side] = _run_worker("chroma-serve", args, path)
        vectors_mib = round(n * DIM * 4 / 2 ** 20, 1)
        store_mib = round(sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(store.root) for f in fs)
                          / 2 ** 20, 1)
        client.delete_collection(name)
        shutil.rmtree(store.root, ignore_errors=True)
        return {
            "n": n, "dim": DIM, "queries": len(queries), "data_s": round(gen_s, 1), "float32_mib": vectors_mib,
            "builtin": {"index_s": round(builtin_s, 2), "vectors_per_s": round(n / builtin_s),
                        "disk_mib": store_mib, "serve": serve["builtin"]},
            "chroma": {"upsert_s": round(upsert_s, 2), "ready_s": round(ready_s, 2),
                       "vectors_per_s": round(n / ready_s), "batch": batch, "count": stored,
                       "server_before": server_before, "server_indexed": server_indexed,
                       "server_queried": server_queried, "serve": serve["chroma"]},
            "sides": sides,
        }
    finally:
        client.close()


def run_chroma(args, rp, report):
    try:
        import numpy as np
    except ImportError:
        np = None
        if args.chroma_sizes:
            print("\n== chroma: numpy not installed; the synthetic-vector sizes skipped")
    binary = None
    if not args.chroma_url:
        binary = find_chroma_bin(args.chroma_bin)
        if binary is None:
            raise SystemExit("perf: --only chroma needs a Chroma server: --chroma-url URL, or a `chroma` command "
                             "(--chroma-bin, $RAGPROXY_CHROMA_BIN, beside this Python, or on PATH; "
                             "pip install chromadb)")
    summary = {"sizes": {}, "server": args.chroma_url or f"started here: {binary} run"}
    tmp = tempfile.mkdtemp(prefix="ragproxy-perf-chroma-sides-")
    try:
        for n in args.chroma_sizes if np is not None else ():
            # A fresh server per size (when this bench runs it), so its memory is that size's alone.
            server = ChromaServer(args.chroma_url) if args.chroma_url else ChromaServer.start(binary)
            try:
                client = _chroma_module(rp).ChromaClient(server.url)
                info = client.check()
                client.close()
                summary["chroma_version"] = info.get("version")
                if n == args.chroma_sizes[0]:
                    print(f"\n== chroma: the same {DIM}-dim synthetic unit vectors (clustered, fixed seed) in the "
                          f"built-in store and on Chroma {info.get('version')} ({summary['server']}); "
                          f"top-{TOP}, single queries, the sides taking turns"
                          f"{' (back to back)' if args.back_to_back else ''}")
                print(f"   N = {n:,} ...", file=sys.stderr, flush=True)
                res = _chroma_dense_size(args, rp, np, server, n, tmp)
            finally:
                if not args.chroma_url:
                    server.stop()
            summary["sizes"][str(n)] = res
            _print_chroma_size(res)
        if args.chroma_kb_chunks:
            server = ChromaServer(args.chroma_url) if args.chroma_url else ChromaServer.start(binary)
            try:
                summary["kb"] = run_chroma_kb(args, rp, server)
            finally:
                if not args.chroma_url:
                    server.stop()
        if args.scifact:
            summary["scifact"] = run_chroma_scifact(args, rp, binary)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    report["chroma"] = summary


def _print_chroma_size(res):
    b, c = res["builtin"], res["chroma"]
    print(f"   N = {res['n']:,} ({res['float32_mib']:.0f} MiB of float32 vectors; {res['queries']} queries)")
    print_table(("side", "p50 ms", "p99 ms", "recall@10"),
                [(s["side"], s["p50_ms"], s["p99_ms"], s["recall@10"]) for s in res["sides"]])
    print_table(("store", "index s", "vectors/s", "serving process RSS MiB", "(growth)", "server RSS MiB",
                 "server peak MiB"),
                [("built-in", b["index_s"], b["vectors_per_s"], b["serve"].get("rss_mib"),
                  b["serve"].get("growth_mib"), "-", "-"),
                 (f"chroma (upsert {c['upsert_s']:.1f} s + first query)", c["ready_s"], c["vectors_per_s"],
                  c["serve"].get("rss_mib"), c["serve"].get("growth_mib"), c["server_queried"]["rss_mib"],
                  c["server_queried"]["peak_mib"])])
    print(f"   built-in on disk: {b['disk_mib']} MiB; chroma server RSS before the upsert "
          f"{c['server_before']['rss_mib']} MiB, after {c['server_indexed']['rss_mib']} MiB; upsert batches of "
          f"{c['batch']}; count {c['count']}")


@contextlib.contextmanager
def _embedder(args):
    """The embeddings URL for SciFact: --embed-url, or bench/embed_server.py run for the duration, or None."""
    if args.embed_url or not args.start_embed_server:
        yield args.embed_url
        return
    import embed_server
    with embed_server.started(who="perf") as url:
        yield url


SCIFACT_KB = "bench"


def _scifact_side(args, rp, ev, store, data_dir, embed_url, chroma_url, prefix, corpus_path, queries, qrels):
    """Import SciFact into a KB on ``store`` and score it as eval_retrieval.py does; one dict per mode."""
    import argparse as _argparse
    os.makedirs(os.path.join(data_dir, "config"), exist_ok=True)
    for sub in ("vectordb", "documents"):
        shutil.rmtree(os.path.join(data_dir, sub, SCIFACT_KB), ignore_errors=True)
    config_path = os.path.join(data_dir, "config", "config.yaml")
    # eval_retrieval.py's defaults, so the built-in side reproduces its figures.
    settings = _argparse.Namespace(embed_model=args.embed_model, embed_batch_size=64, strategy="auto",
                                   chunk_size=256, chunk_overlap=32, k1=1.2, b=0.75, lexical_weight=1.0,
                                   dense_weight=1.0, compact="", fusion="")
    ev.write_config(config_path, settings, embed_url)
    if store == "chroma_http":
        with open(config_path, "a", encoding="utf-8") as f:
            f.write(f"vectorstore:\n  type: chroma_http\n  chroma_http:\n    base_url: {json.dumps(chroma_url)}\n"
                    f"    collection_prefix: {json.dumps(prefix)}\n    timeout: 600\n")
    argv = ["import", SCIFACT_KB, corpus_path, "--data-dir", data_dir, "--config", config_path,
            "--log-level", "WARNING"]
    started = time.perf_counter()
    with contextlib.redirect_stdout(sys.stderr):
        status = rp.main(argv)
    ingest_s = time.perf_counter() - started
    if status != 0:
        raise SystemExit(f"perf: ragproxy import into the {store} KB failed (exit {status})")
    kbs = rp.KnowledgeBases(rp.Config.load(config_path), data_dir, rp.make_http_pool())
    try:
        kb = kbs.get(SCIFACT_KB)
        n_chunks = len(kb.current()[0])
        n_docs = sum(1 for line in open(corpus_path, "rb") if line.strip())
        src = f"{SCIFACT_KB}/{os.path.basename(corpus_path)}"
        first_depth = min(n_chunks, 100 * max(1, -(-n_chunks // max(1, n_docs))))
        out = {"ingest_s": round(ingest_s, 2), "chunks": n_chunks, "modes": {}}
        if hasattr(kb, "store_status"):
            out["store_status"] = {k: v for k, v in kb.store_status().items() if k in ("type", "role", "vectors")}
        modes = ["lexical"] + (["dense", "hybrid"] if embed_url else [])
        for mode in modes:
            run = {}
            for qid in qrels:
                depth = first_depth
                while True:
                    hits = kb.search(queries[qid], depth, mode=mode)
                    docs = ev.best_rank_per_document([ev.doc_id_of(h.chunk["source"], src) for h in hits])
                    if len(docs) >= 100 or len(hits) < depth or depth >= n_chunks:
                        break
                    depth = min(n_chunks, depth * 2)
                run[qid] = docs[:100]
            # What the proxy asks per request: the best 10 chunks (the query's vector is memoized by now).
            lat = []
            for qid in qrels:
                t0 = time.perf_counter()
                kb.search(queries[qid], TOP, mode=mode)
                lat.append(time.perf_counter() - t0)
            means, _ = ev.evaluate(run, qrels)
            out["modes"][mode] = {"ndcg@10": round(means["ndcg@10"], 4), "recall@100": round(means["recall@100"], 4),
                                  "search10_p50_ms": _ms(_pct(lat, 50)), "search10_p99_ms": _ms(_pct(lat, 99))}
        out["rss_mib"] = _mib(_proc_kb("VmRSS"))
        return out
    finally:
        kbs.stop()


def run_chroma_scifact(args, rp, binary):
    """SciFact test (BEIR layout) in a built-in KB and a chroma_http KB: nDCG@10 per mode, search(10) latency."""
    import eval_retrieval as ev
    corpus_path, queries, qrels = ev.read_beir(args.scifact, "test")
    judged = [qid for qid in queries if any(g > 0 for g in qrels.get(qid, {}).values())]
    if args.scifact_queries:
        judged = judged[:args.scifact_queries]
    qrels = {qid: qrels[qid] for qid in judged}
    own_dir = not args.scifact_data_dir
    base = tempfile.mkdtemp(prefix="ragproxy-perf-scifact-") if own_dir else os.path.abspath(args.scifact_data_dir)
    server = ChromaServer(args.chroma_url) if args.chroma_url else ChromaServer.start(binary)
    prefix = f"perf{os.getpid()}_"
    try:
        with _embedder(args) as embed_url:
            print(f"\n== chroma, SciFact test: {len(qrels)} judged queries, the same KB settings in the built-in "
                  f"store and on Chroma (collection prefix {prefix}); embeddings: "
                  f"{embed_url and args.embed_model or 'none (lexical only)'}")
            sides = {}
            for store in ("simple", "chroma_http"):
                data_dir = os.path.join(base, store)
                cache = os.path.join(data_dir, "cache", "embedding")
                first = os.path.join(base, "simple", "cache", "embedding")
                if store != "simple" and os.path.isdir(first) and not os.path.exists(cache):
                    # The same chunks, the same model: the second side reuses the first's embeddings.
                    shutil.copytree(first, cache)
                print(f"   {store} ...", file=sys.stderr, flush=True)
                sides[store] = _scifact_side(args, rp, ev, store, data_dir, embed_url, server.url, prefix,
                                             corpus_path, queries, qrels)
            sides["chroma_server"] = server.memory()
    finally:
        if not args.chroma_url:
            server.stop()
        if own_dir:
            shutil.rmtree(base, ignore_errors=True)
    rows = []
    simple, chroma = sides["simple"], sides["chroma_http"]
    for mode in simple["modes"]:
        a, c = simple["modes"][mode], chroma["modes"].get(mode, {})
        same = c.get("ndcg@10") is not None and round(a["ndcg@10"], 3) == round(c["ndcg@10"], 3)
        rows.append((mode, f"{a['ndcg@10']:.4f}", "-" if c.get("ndcg@10") is None else f"{c['ndcg@10']:.4f}",
                     "yes" if same else "NO", a["search10_p50_ms"],
                     a["search10_p99_ms"], c.get("search10_p50_ms"), c.get("search10_p99_ms")))
        sides.setdefault("match_3_decimals", {})[mode] = same
    print_table(("mode", "nDCG@10 built-in", "nDCG@10 chroma", "same to 3 dp", "built-in p50 ms", "p99",
                 "chroma p50 ms", "p99"), rows)
    print(f"   ingest (import + index, embeddings cached after the first run): built-in {simple['ingest_s']} s, "
          f"chroma {chroma['ingest_s']} s; {simple['chunks']} / {chroma['chunks']} chunks; Chroma server RSS "
          f"{sides['chroma_server']['rss_mib']} MiB")
    return sides


# -- the same synthetic KB through KnowledgeBase on both stores (hybrid latency) --


def _synth_embed_worker(ragproxy_path):
    """An OpenAI-compatible /v1/embeddings server on a free loopback port: each text's vector is drawn from
    a seed of its hash, clustered like make_vectors' rows (the vectors carry no meaning: this times the
    stores, not a model).  Prints its URL, then serves until terminated."""
    import base64
    import hashlib
    import http.server
    import numpy as np
    rng = np.random.default_rng(7)
    centres = rng.standard_normal((256, DIM), dtype=np.float32)

    def vector(text):
        seed = int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "little")
        r = np.random.default_rng(seed)
        v = centres[seed % 256] + np.float32(0.9) * r.standard_normal(DIM, dtype=np.float32)
        return (v / np.linalg.norm(v)).astype("<f4")

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
            texts = body.get("input")
            texts = [texts] if isinstance(texts, str) else list(texts)
            b64 = body.get("encoding_format") == "base64"
            data = [{"object": "embedding", "index": i,
                     "embedding": base64.b64encode(vector(t).tobytes()).decode("ascii") if b64
                     else vector(t).tolist()} for i, t in enumerate(texts)]
            out = json.dumps({"object": "list", "data": data, "model": body.get("model", "synthetic"),
                              "usage": {"prompt_tokens": 0, "total_tokens": 0}}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    print(f"listening on http://127.0.0.1:{server.server_address[1]}/v1", flush=True)
    server.serve_forever()


@contextlib.contextmanager
def _synth_embedder(args):
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", "synth-embed", "--ragproxy", args.ragproxy]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        if not line.startswith("listening on "):
            raise SystemExit("perf: the synthetic embeddings server did not start")
        yield line.split()[-1]
    finally:
        proc.terminate()
        proc.wait(10)


def make_synthetic_corpus(path, n, words=60, vocab=30000, seed=5):
    """``n`` one-chunk documents of ``words`` Zipf-distributed made-up words (BEIR corpus.jsonl layout);
    returns 3-5 word queries drawn from random documents."""
    rng = random.Random(seed)
    syllables = [a + b for a in "bdfgklmnprstvz" for b in "aeiou"]
    lexicon = sorted({"".join(rng.choice(syllables) for _ in range(rng.randint(2, 4))) for _ in range(vocab)})
    rng.shuffle(lexicon)
    cum, total = [], 0.0
    for rank in range(len(lexicon)):
        total += 1.0 / (rank + 1)
        cum.append(total)
    texts = []
    with open(path, "w", encoding="utf-8") as f:
        for i in range(n):
            text = " ".join(rng.choices(lexicon, cum_weights=cum, k=words))
            f.write(json.dumps({"_id": f"s{i}", "title": "", "text": text}) + "\n")
            if i % max(1, n // 500) == 0:
                texts.append(text)
    queries = []
    for text in texts:
        w = text.split()
        k = rng.randint(3, 5)
        start = rng.randint(0, len(w) - k)
        queries.append(" ".join(w[start:start + k]))
    return queries


def _kb_config(path, embed_url, store, chroma_url, prefix):
    lines = ["server: {host: 127.0.0.1, port: 0}", "api_key_auth: false", "providers:", "  llm: {}",
             "  embedding:",
             f"    synth: {{type: openai, base_url: {json.dumps(embed_url)}, model: synthetic, batch_size: 256, "
             f"max_concurrency: 2, read_timeout: 600}}",
             "models: []", "knowledge_bases:", f"  {SCIFACT_KB}:", "    retrieval: hybrid", "    embedding: synth",
             "    max_file_bytes: 4294967296"]
    if store == "chroma_http":
        lines += ["vectorstore:", "  type: chroma_http", "  chroma_http:", f"    base_url: {json.dumps(chroma_url)}",
                  f"    collection_prefix: {json.dumps(prefix)}", "    timeout: 600"]
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")


def _open_kb(rp, data_dir):
    config = rp.Config.load(os.path.join(data_dir, "config", "config.yaml"))
    kbs = rp.KnowledgeBases(config, data_dir, rp.make_http_pool())
    return kbs, kbs.get(SCIFACT_KB)


def _kb_serve_worker(data, ragproxy_path):
    """A fresh process that opens one side's KB and answers the queries in every mode: what a proxy holds."""
    rp = load_ragproxy(ragproxy_path)
    gc.collect()
    base = _proc_kb("VmRSS")
    kbs, kb = _open_kb(rp, data["data_dir"])
    try:
        for mode in ("lexical", "dense", "hybrid"):
            for q in data["queries"]:
                kb.search(q, TOP, mode=mode)
        rss = _proc_kb("VmRSS")
    finally:
        kbs.stop()
    return {"rss_mib": _mib(rss), "growth_mib": _mib(rss - base) if rss is not None and base is not None else None}


def run_chroma_kb(args, rp, server):
    """The same synthetic KB (``--chroma-kb-chunks`` one-chunk documents) built in the built-in store and on
    Chroma by ``ragproxy import``; lexical, dense and hybrid search(10) through KnowledgeBase.search."""
    n = args.chroma_kb_chunks
    base = tempfile.mkdtemp(prefix="ragproxy-perf-kb-")
    prefix = f"perfkb{os.getpid()}_"
    try:
        corpus = os.path.join(base, "corpus.jsonl")
        t0 = time.perf_counter()
        queries = make_synthetic_corpus(corpus, n)[:args.chroma_queries]
        print(f"\n== chroma, one KB of {n:,} synthetic one-chunk documents (60 Zipf-drawn made-up words each; "
              f"vectors {DIM}-dim from a hash of the text, so dense hits are not meant to agree with lexical) "
              f"in the built-in store and on Chroma, `ragproxy import` then KnowledgeBase.search(q, {TOP}); "
              f"{len(queries)} queries (corpus {time.perf_counter() - t0:.1f} s)")
        out = {"chunks": n, "queries": len(queries), "sides": {}}
        opened = {}
        with _synth_embedder(args) as embed_url:
            for store in ("simple", "chroma_http"):
                data_dir = os.path.join(base, store)
                os.makedirs(os.path.join(data_dir, "config"))
                config_path = os.path.join(data_dir, "config", "config.yaml")
                _kb_config(config_path, embed_url, store, server.url, prefix)
                print(f"   importing into {store} ...", file=sys.stderr, flush=True)
                started = time.perf_counter()
                with contextlib.redirect_stdout(sys.stderr):
                    status = rp.main(["import", SCIFACT_KB, corpus, "--data-dir", data_dir, "--config", config_path,
                                      "--log-level", "WARNING"])
                ingest_s = time.perf_counter() - started
                if status != 0:
                    raise SystemExit(f"perf: ragproxy import into the {store} KB failed (exit {status})")
                opened[store] = _open_kb(rp, data_dir)
                out["sides"][store] = {"import_s": round(ingest_s, 1), "chunks_per_s": round(n / ingest_s),
                                       "server_after_import": server.memory() if store == "chroma_http" else None}
            plan = []
            for mode in ("lexical", "dense", "hybrid"):
                for store in ("simple", "chroma_http"):
                    kb = opened[store][1]
                    plan.append((f"{store} {mode}", (lambda kb, mode: lambda q: kb.search(q, TOP, mode=mode))(kb, mode),
                                 False))
            for _, call, _ in plan:   # embed every query once: the timed searches reuse the memoized vector
                for q in queries:
                    call(q)
            timings = _interleaved(plan, queries, args.idle_ms / 1000.0, interleave=not args.back_to_back)
            for (label, _, _), (lat, _) in zip(plan, timings):
                store, mode = label.split()
                out["sides"][store][mode] = {"p50_ms": _ms(_pct(lat, 50)), "p99_ms": _ms(_pct(lat, 99))}
            for store, (kbs, kb) in opened.items():
                kbs.stop()
            path = os.path.join(base, "serve.json")
            for store in ("simple", "chroma_http"):
                with open(path, "w", encoding="utf-8") as f:
                    json.dump({"data_dir": os.path.join(base, store), "queries": queries[:50]}, f)
                out["sides"][store]["serve"] = _run_worker("chroma-kb-serve", args, path)
            out["server_after_queries"] = server.memory()
        _print_chroma_kb(out)
        return out
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _print_chroma_kb(out):
    rows = []
    for store, label in (("simple", "built-in"), ("chroma_http", "chroma_http")):
        s = out["sides"][store]
        rows.append((label, s["import_s"], s["chunks_per_s"], s["lexical"]["p50_ms"], s["lexical"]["p99_ms"],
                     s["dense"]["p50_ms"], s["dense"]["p99_ms"], s["hybrid"]["p50_ms"], s["hybrid"]["p99_ms"],
                     s["serve"].get("rss_mib"), s["serve"].get("growth_mib")))
    print_table(("store", "import s", "chunks/s", "lexical p50", "p99", "dense p50", "p99", "hybrid p50", "p99",
                 "proxy RSS MiB", "(growth)"), rows)
    print(f"   ms; import = chunking + embedding (the synthetic server) + indexing; proxy RSS = a fresh process that "
          f"opened the KB and answered {min(50, out['queries'])} queries in each mode; Chroma server RSS "
          f"{out['server_after_queries']['rss_mib']} MiB (peak {out['server_after_queries']['peak_mib']})")


# --------------------------------------------------------------------------


def _parse_args(argv):
    p = argparse.ArgumentParser(description="ragproxy retrieval speed next to bm25s, rank_bm25, numpy and faiss.")
    p.add_argument("--only", default=",".join(DEFAULT_PARTS),
                   help="parts to run: lexical,dense,chroma (default lexical,dense)")
    p.add_argument("--max-files", type=int, default=0, help="lexical: first N stdlib files (default all)")
    p.add_argument("--queries", type=int, default=200, help="lexical queries (default 200)")
    p.add_argument("--rank-bm25-queries", type=int, default=20,
                   help="queries for rank_bm25, which scores every document per query (default 20)")
    p.add_argument("--lexical-sides", default=",".join(r for r, _, _ in LEXICAL_SIDES),
                   help="lexical sides to run (default all)")
    p.add_argument("--no-memory", action="store_true",
                   help="lexical: skip the second, tracemalloc-traced build of each side")
    p.add_argument("--dense-sizes", default="10000,100000", help="vector counts (default 10000,100000)")
    p.add_argument("--dense-1m", action="store_true", help="add N = 1,000,000 (~6 GB RAM, several minutes)")
    p.add_argument("--dense-queries", type=int, default=200, help="dense queries per size (default 200)")
    p.add_argument("--dense-vectors", metavar="NPY", help="dense: measure on these embeddings (an N x dim .npy) "
                   "instead of synthetic ones")
    p.add_argument("--dense-query-vectors", metavar="NPY", help="with --dense-vectors: the query embeddings "
                   "(default: rows of the matrix, nudged)")
    p.add_argument("--idle-ms", type=float, default=0.0,
                   help="dense: sleep this long before each timed query, as between a proxy's requests "
                   "(default 0: back to back)")
    p.add_argument("--back-to-back", action="store_true",
                   help="dense: run each side's queries in a row (warm caches and thread pools) instead of "
                   "taking turns")
    p.add_argument("--pure-queries", type=int, default=20, help="queries for the stdlib-only dense side (default 20)")
    p.add_argument("--no-pure", action="store_true", help="skip the stdlib-only dense side")
    p.add_argument("--chroma-url", help="chroma: use this running server (its memory is then not measured) "
                   "instead of starting `chroma run` per size")
    p.add_argument("--chroma-bin", default="", help="chroma: the `chroma` command (default $RAGPROXY_CHROMA_BIN, "
                   "the one beside this Python, then PATH)")
    p.add_argument("--chroma-sizes", default="100000", help="chroma: vector counts (default 100000)")
    p.add_argument("--chroma-1m", action="store_true", help="chroma: add N = 1,000,000")
    p.add_argument("--chroma-queries", type=int, default=200, help="chroma: dense queries per size (default 200)")
    p.add_argument("--chroma-kb-chunks", type=int, default=0, metavar="N",
                   help="chroma: also one KB of N synthetic one-chunk documents built on both stores by `ragproxy "
                   "import`: import chunks/s, lexical/dense/hybrid search(10) p50/p99, proxy RSS (e.g. 100000)")
    p.add_argument("--scifact", metavar="DIR", default="",
                   help="chroma: also SciFact test (a BEIR folder, e.g. ../shared/eval/scifact) in a built-in and a "
                   "chroma_http KB: nDCG@10 and search(10) latency per mode")
    p.add_argument("--scifact-queries", type=int, default=0, help="chroma: only the first N judged SciFact queries")
    p.add_argument("--scifact-data-dir", default="", help="chroma: keep the SciFact KBs (and their embedding "
                   "cache) here: DIR/simple and DIR/chroma_http (default: temporary)")
    p.add_argument("--embed-url", help="chroma: SciFact embeddings server (OpenAI-compatible, ending in /v1); "
                   "without it or --start-embed-server SciFact is lexical only")
    p.add_argument("--start-embed-server", action="store_true",
                   help="chroma: run bench/embed_server.py (all-MiniLM-L6-v2) for SciFact's dense and hybrid modes")
    p.add_argument("--embed-model", default="all-MiniLM-L6-v2", help="chroma: model name sent to the server")
    p.add_argument("--ragproxy", default=RAGPROXY, metavar="PATH", help="ragproxy.py to measure")
    p.add_argument("--json", action="store_true", help="after the tables, one JSON line with every figure")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--input", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.parts = [x.strip() for x in args.only.split(",") if x.strip()]
    bad = [x for x in args.parts if x not in PARTS]
    if bad:
        p.error(f"--only takes {', '.join(PARTS)} (got {', '.join(bad)})")
    args.lexical_sides = [x.strip() for x in args.lexical_sides.split(",") if x.strip()]
    try:
        args.dense_sizes = sorted({int(x) for x in args.dense_sizes.split(",") if x.strip()})
    except ValueError:
        p.error("--dense-sizes takes comma-separated integers")
    try:
        args.chroma_sizes = sorted({int(x) for x in args.chroma_sizes.split(",") if x.strip()})
    except ValueError:
        p.error("--chroma-sizes takes comma-separated integers")
    if args.chroma_1m and 1000000 not in args.chroma_sizes:
        args.chroma_sizes.append(1000000)
    if any(n < TOP for n in args.chroma_sizes):
        p.error(f"--chroma-sizes must be at least {TOP}")
    if args.dense_1m and 1000000 not in args.dense_sizes:
        args.dense_sizes.append(1000000)
    if any(n < TOP for n in args.dense_sizes):
        p.error(f"--dense-sizes must be at least {TOP}")
    if args.dense_vectors:
        args.dense_sizes = [0]  # one pass, at the file's own size
    elif args.dense_query_vectors:
        p.error("--dense-query-vectors needs --dense-vectors")
    return args


def main(argv=None):
    args = _parse_args(sys.argv[1:] if argv is None else argv)
    if args.worker == "synth-embed":
        _synth_embed_worker(args.ragproxy)
        return 0
    if args.worker:
        with open(args.input, encoding="utf-8") as f:
            data = json.load(f)
        if args.worker == "dense-pure":
            result = _dense_pure_worker(data, args.ragproxy)
        elif args.worker == "chroma-serve":
            result = _serve_worker(data, args.ragproxy)
        elif args.worker == "chroma-kb-serve":
            result = _kb_serve_worker(data, args.ragproxy)
        else:
            result = _lexical_worker(args.worker, data, args.ragproxy, memory=not data.get("no_memory"))
        print(json.dumps(result))
        return 0
    os.environ.pop("RAGPROXY_PURE", None)
    rp = load_ragproxy(args.ragproxy)
    import platform
    print(f"{rp.version_text()}; {platform.machine()}, {os.cpu_count()} CPUs, {platform.platform()}")
    for env_name in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "OMP_NUM_THREADS"):
        if os.environ.get(env_name):
            print(f"note: {env_name}={os.environ[env_name]}")
    report = {"ragproxy": rp.version_text(), "cpus": os.cpu_count()}
    started = time.perf_counter()
    if "lexical" in args.parts:
        run_lexical(args, rp, report)
    if "dense" in args.parts:
        run_dense(args, rp, report)
    if "chroma" in args.parts:
        run_chroma(args, rp, report)
    print(f"\ntotal {time.perf_counter() - started:.0f} s")
    if args.json:
        print(json.dumps(report, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
