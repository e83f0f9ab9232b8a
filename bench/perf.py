#!/usr/bin/env python3
"""Speed of ragproxy's retrieval next to the usual Python libraries, in one run.

    python bench/perf.py                                  # lexical, dense (10k, 100k): ~4 min
    python bench/perf.py --only lexical                   # BM25 on the stdlib's .py files (~75k chunks)
    python bench/perf.py --only dense --dense-sizes 10000,100000,1000000    # 1M needs ~6 GB RAM
    python bench/perf.py --only lexical --max-files 20 --queries 10          # a quick smoke run
    python bench/perf.py --json                           # the tables, then one JSON line
    python bench/perf.py --ragproxy /tmp/patched/ragproxy.py                 # measure a changed copy

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
(Start-up time has its own bench: bench/startup.py.)

Optional libraries (bench/requirements.txt): bm25s, PyStemmer, rank_bm25,
faiss-cpu.  A missing one is reported ("bm25s not installed") and its side
skipped.  Linux gives memory figures (/proc); elsewhere they are left out.
"""

from __future__ import annotations

import argparse
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
PARTS = ("lexical", "dense")
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
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


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


def _parse_args(argv):
    p = argparse.ArgumentParser(description="ragproxy retrieval speed next to bm25s, rank_bm25, numpy and faiss.")
    p.add_argument("--only", default=",".join(PARTS), help="parts to run: lexical,dense (default both)")
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
    if args.worker:
        with open(args.input, encoding="utf-8") as f:
            data = json.load(f)
        if args.worker == "dense-pure":
            result = _dense_pure_worker(data, args.ragproxy)
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
    print(f"\ntotal {time.perf_counter() - started:.0f} s")
    if args.json:
        print(json.dumps(report, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
