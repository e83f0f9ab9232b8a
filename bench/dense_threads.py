#!/usr/bin/env python3
"""Dense scans from many threads at once: one at a time (ragproxy) against side by side.

    python bench/dense_threads.py                          # 80k x 384, 1/8/16 threads, ~1 min
    python bench/dense_threads.py --rows 20000 --threads 1,4 --scans 10 --json

A proxy serves each request on its own thread; with dense or hybrid retrieval
several may scan a knowledge base's vectors at the same moment.  numpy's
matrix-vector product runs on BLAS's own thread pool, which the whole process
shares, so ragproxy takes one lock around every scan of the built-in store
(``KnowledgeBases`` hands one to all its KBs).  This measures what that lock
buys: the same queries through ``Generation.dense_search`` on a real on-disk
store (unit vectors clustered like sentence embeddings, perf.py's), from N
threads, with the lock ("one at a time") and without it ("side by side"), the
two taking turns per thread count.  Figures: scans a second, latency p50/p99
of one scan (waiting for the lock included) and process CPU per scan.  BLAS
threads: compare a run under OPENBLAS_NUM_THREADS=1.

Needs numpy (the stdlib path holds the GIL throughout: nothing to compare).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from perf import DIM, RAGPROXY, _build_store, _pct, load_ragproxy, make_dense_queries, make_vectors  # noqa: E402


def run_side(gen, queries, threads, scans, lock):
    """``scans`` scans per thread from ``threads`` threads; the figures of one side."""
    latencies, errors = [], []
    start = threading.Barrier(threads + 1)

    def worker(n):
        start.wait()
        for i in range(scans):
            q = queries[(n * scans + i) % len(queries)]
            began = time.perf_counter()
            try:
                with lock if lock is not None else contextlib.nullcontext():
                    gen.dense_search(q, 10)
            except Exception as exc:   # reported, not swallowed: a side that fails has no figures
                errors.append(repr(exc))
                return
            latencies.append(time.perf_counter() - began)

    workers = [threading.Thread(target=worker, args=(n,)) for n in range(threads)]
    for w in workers:
        w.start()
    cpu, wall = time.process_time(), time.perf_counter()
    start.wait()
    for w in workers:
        w.join()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    if errors:
        raise RuntimeError(errors[0])
    latencies.sort()
    return {"scans_per_s": round(len(latencies) / wall, 1), "p50_ms": round(_pct(latencies, 50) * 1e3, 3),
            "p99_ms": round(_pct(latencies, 99) * 1e3, 3), "cpu_us_per_scan": round(cpu / len(latencies) * 1e6)}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=80000, help="vectors in the store (default 80000)")
    p.add_argument("--threads", default="1,8,16", help="thread counts (default 1,8,16)")
    p.add_argument("--scans", type=int, default=40, help="scans per thread per side (default 40)")
    p.add_argument("--ragproxy", default=RAGPROXY, help="the ragproxy.py to measure")
    p.add_argument("--json", action="store_true", help="also print the results as one JSON line")
    args = p.parse_args(argv)
    rp = load_ragproxy(args.ragproxy)
    from _ragproxy import deps
    np = deps.np
    if np is None:
        raise SystemExit("dense_threads needs numpy (RAGPROXY_PURE=1 or not installed)")
    counts = [int(t) for t in args.threads.split(",") if t]
    mat = make_vectors(np, args.rows)
    queries = make_dense_queries(np, mat, 64)
    results = []
    print(f"dense scans of {args.rows:,} x {DIM} float32 from many threads; {os.cpu_count()} CPUs; "
          f"OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS', 'unset')}")
    print(f"{'threads':>7}  {'side':<16} {'scans/s':>8} {'p50 ms':>8} {'p99 ms':>9} {'CPU/scan':>10}")
    with tempfile.TemporaryDirectory(prefix="ragproxy-dense-threads-") as tmp:
        gen = _build_store(rp, os.path.join(tmp, "kb"), mat, None).current()
        try:
            run_side(gen, queries, 1, 5, None)   # the pages mapped and BLAS started before anything counts
            for threads in counts:
                for side, lock in (("one at a time", threading.Lock()), ("side by side", None)):
                    row = dict(threads=threads, side=side, **run_side(gen, queries, threads, args.scans, lock))
                    results.append(row)
                    print(f"{threads:>7}  {side:<16} {row['scans_per_s']:>8,.0f} {row['p50_ms']:>8.2f} "
                          f"{row['p99_ms']:>9.2f} {row['cpu_us_per_scan']:>8,} us")
                    sys.stdout.flush()
        finally:
            gen.close()
    if args.json:
        print(json.dumps({"bench": "dense_threads", "rows": args.rows, "dim": DIM, "results": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
