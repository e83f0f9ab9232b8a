#!/usr/bin/env python3
"""Several knowledge bases behind one model: how each ``kb_merge`` mode ranks and what it injects.

    python bench/multi_kb.py                                  # SciFact test + CoSQA dev from ../shared/eval
    python bench/multi_kb.py ../shared/eval/scifact:test ../shared/eval/cosqa-dev:dev --top-k 5
    python bench/multi_kb.py --merge priority,rrf --data-dir /tmp/mkb   # keep (and reuse) the data dir

Each COLLECTION[:SPLIT] argument (BEIR layout, as for eval_retrieval.py) is
imported into a knowledge base of its own, named after its folder; one model
per ``kb_merge`` mode is mapped to all of them, in the order given, and a
second set of models to them in the reverse order (``priority`` depends on
it).  Every judged query of every collection is then asked of each model
through ragproxy's own code path: ``App.retriever.search(kbs, query, route)``,
the call the proxy makes for a request (lexical retrieval, no reranker).

Per collection, judged against its own qrels only:

* **nDCG@10**: of the best 10 chunks (``--depth``), each document at its best
  chunk's rank; a chunk from another knowledge base takes its place in the
  ranking and has no gain.  The same query asked of its own knowledge base
  alone is the reference row (``single``).
* **wrong KB**: the share of the ``--top-k`` chunks the proxy would inject
  (``rag.top_k``, default 5) that came from another collection's knowledge
  base, over all injected chunks; ``queries hit`` is the share of queries
  with at least one such chunk.

``mean`` averages the collections' figures (each collection counts once,
whatever its number of queries).  Output: a readable table, then one JSON
line per row.  Metrics are eval_retrieval.py's (trec_eval definitions).

Standard library only (plus what ragproxy itself uses); Python 3.9+.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

from eval_retrieval import (
    RAGPROXY,
    _count_lines,
    slice_corpus,
    best_rank_per_document,
    doc_id_of,
    ndcg_at_k,
    read_beir,
)
from perf import load_ragproxy

HERE = os.path.dirname(os.path.abspath(__file__))
SHARED_EVAL = os.path.join(os.path.dirname(os.path.dirname(HERE)), "shared", "eval")
DEFAULT_COLLECTIONS = (os.path.join(SHARED_EVAL, "scifact") + ":test",
                       os.path.join(SHARED_EVAL, "cosqa-dev") + ":dev")
MERGES = ("priority", "concat", "rrf")


class Collection:
    """One BEIR collection as a knowledge base: its name, queries and qrels."""

    def __init__(self, spec):
        path, sep, split = spec.rpartition(":")
        if not sep or os.sep in split or not split:
            path, split = spec, "test"
        self.path = os.path.abspath(path)
        self.split = split
        self.kb = os.path.basename(os.path.normpath(self.path))
        self.corpus, queries, qrels = read_beir(self.path, split)
        self.judged = [q for q in queries if any(g > 0 for g in qrels.get(q, {}).values())]
        self.queries = queries
        self.qrels = qrels
        self.docs = 0


def write_config(path, collections, merges, top_k):
    """One KB per collection and two models per merge mode (KBs in order, and reversed)."""
    q = json.dumps
    names = [c.kb for c in collections]
    lines = [
        "server: {host: 127.0.0.1, port: 0}",
        "api_key_auth: false",
        "providers:",
        "  llm:",
        # Never contacted: the bench calls the retriever, not the proxy.
        '    none: {type: openai, base_url: "http://127.0.0.1:9/v1"}',
        f"rag: {{top_k: {top_k}}}",
        "knowledge_bases:",
    ]
    for name in names:
        lines += [f"  {q(name)}:", "    retrieval: lexical", "    max_file_bytes: 1073741824"]
    lines.append("models:")
    for merge in merges:
        for suffix, order in (("", names), ("-reversed", names[::-1])):
            lines.append(f"  - {{name: {q(merge + suffix)}, upstream: none, kb: {q(order)}, kb_merge: {merge}}}")
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")


def _ranked_docs(hits, own_kb, prefix):
    """Document ids best first (each at its best chunk); another KB's chunk is an id no qrel has."""
    ids = []
    for hit in hits:
        if hit.kb == own_kb:
            doc = doc_id_of(hit.chunk["source"], prefix)
            if doc is None:
                raise SystemExit(f"multi_kb: a hit of {own_kb} did not come from {prefix}#<id>")
            ids.append(doc)
        else:
            ids.append((hit.kb, hit.id))
    return best_rank_per_document(ids)


def score_model(retriever, route, names, collections, top_k, depth):
    """``{collection: {ndcg@10, wrong_kb, queries_hit, queries}}`` for one model."""
    out = {}
    for c in collections:
        prefix = f"{c.kb}/{os.path.basename(c.corpus)}"
        ndcg, injected, wrong, touched = [], 0, 0, 0
        for qid in c.judged:
            text = c.queries[qid]
            ranked = retriever.search(names, text, route, top_k=depth)
            ndcg.append(ndcg_at_k(_ranked_docs(ranked, c.kb, prefix), c.qrels[qid], 10))
            chunks = retriever.search(names, text, route, top_k=top_k)
            others = sum(h.kb != c.kb for h in chunks)
            injected += len(chunks)
            wrong += others
            touched += others > 0
        n = len(c.judged)
        out[c.kb] = {"ndcg@10": sum(ndcg) / n if n else 0.0, "wrong_kb": wrong / injected if injected else 0.0,
                     "queries_hit": touched / n if n else 0.0, "queries": n, "injected": injected}
    return out


def run(args):
    if args.pure:
        os.environ["RAGPROXY_PURE"] = "1"
    ragproxy = load_ragproxy(args.ragproxy)
    collections = [Collection(spec) for spec in args.collections]
    kb_names = [c.kb for c in collections]
    if len(set(kb_names)) != len(kb_names):
        raise SystemExit(f"multi_kb: two collections share a folder name ({', '.join(kb_names)})")
    if args.limit_queries:
        for c in collections:
            c.judged = c.judged[:args.limit_queries]
    own_dir = args.data_dir is None
    data_dir = tempfile.mkdtemp(prefix="ragproxy-multikb-") if own_dir else os.path.abspath(args.data_dir)
    app = None
    try:
        os.makedirs(os.path.join(data_dir, "config"), exist_ok=True)
        config_path = os.path.join(data_dir, "config", "config.yaml")
        write_config(config_path, collections, args.merges, args.top_k)
        try:
            config = ragproxy.Config.load(config_path)
        except ragproxy.ConfigError as exc:   # e.g. a --merge mode this ragproxy does not have
            raise SystemExit(f"multi_kb: {exc}") from None
        app = ragproxy.App(config, data_dir=data_dir)
        started = time.perf_counter()
        for c in collections:
            corpus = c.corpus
            if args.limit_docs:
                keep = {d for qid in c.judged for d in c.qrels[qid]}
                # The KB cites the file by its name: the slice is a corpus.jsonl too.
                os.makedirs(os.path.join(data_dir, "slices", c.kb), exist_ok=True)
                corpus = slice_corpus(corpus, keep, args.limit_docs,
                                       os.path.join(data_dir, "slices", c.kb, "corpus.jsonl"))
            c.corpus = corpus
            c.docs = _count_lines(corpus)
            # What ``ragproxy.py import`` does: the corpus into the KB's documents folder, then index.
            kb = app.knowledge_bases.get(c.kb)
            os.makedirs(kb.documents_dir, exist_ok=True)
            shutil.copyfile(corpus, os.path.join(kb.documents_dir, "corpus.jsonl"))
            report = kb.index()
            if not len(kb.current()[0] or ()):
                raise SystemExit(f"multi_kb: indexing {c.kb} gave no chunks ({report})")
        ingest_s = time.perf_counter() - started
        retriever = app.retriever
        rows = []
        for c in collections:
            only = score_model(retriever, app.resolve_route(args.merges[0]), [c.kb], [c], args.top_k, args.depth)
            rows.append({"merge": "single", "order": c.kb, "collections": only})
        for merge in args.merges:
            for suffix, order in (("", kb_names), ("-reversed", kb_names[::-1])):
                route = app.resolve_route(merge + suffix)
                assert route.kb_merge == merge and list(route.kb) == order, route
                rows.append({"merge": merge, "order": ",".join(order),
                             "collections": score_model(retriever, route, order, collections, args.top_k,
                                                        args.depth)})
        chunks = {c.kb: len(app.knowledge_bases.get(c.kb).current()[0]) for c in collections}
        common = {"top_k": args.top_k, "depth": args.depth, "ingest_s": round(ingest_s, 2),
                  "docs": {c.kb: c.docs for c in collections}, "chunks": chunks,
                  "splits": {c.kb: c.split for c in collections}, "ragproxy": ragproxy.version_text()}
        results = []
        single = {}
        for row in rows:
            if row["merge"] == "single":
                single.update(row["collections"])
        for row in rows:
            if row["merge"] == "single":
                continue
            per = row["collections"]
            results.append(dict(common, merge=row["merge"], order=row["order"],
                                collections={k: {m: round(v, 4) if isinstance(v, float) else v
                                                 for m, v in per[k].items()} for k in kb_names},
                                mean={m: round(sum(per[k][m] for k in kb_names) / len(kb_names), 4)
                                      for m in ("ndcg@10", "wrong_kb", "queries_hit")}))
        results.insert(0, dict(common, merge="single", order="each KB alone",
                               collections={k: {m: round(v, 4) if isinstance(v, float) else v
                                                for m, v in single[k].items()} for k in kb_names},
                               mean={m: round(sum(single[k][m] for k in kb_names) / len(kb_names), 4)
                                     for m in ("ndcg@10", "wrong_kb", "queries_hit")}))
        return results
    finally:
        if app is not None:
            app.close()
        if own_dir:
            shutil.rmtree(data_dir, ignore_errors=True)


def summarize(results):
    """Per mode over its orders: ``{merge: {ndcg@10, worst ndcg@10, wrong_kb}}``, each a mean of the
    collections' mean.  A default cannot know which KB a question belongs to, nor so which order suits it."""
    out = {}
    for r in results:
        out.setdefault(r["merge"], []).append(r["mean"])
    return {merge: {"ndcg@10": round(sum(m["ndcg@10"] for m in rows) / len(rows), 4),
                    "worst_ndcg@10": min(m["ndcg@10"] for m in rows),
                    "wrong_kb": round(sum(m["wrong_kb"] for m in rows) / len(rows), 4), "orders": len(rows)}
            for merge, rows in out.items()}


def print_table(results, out=sys.stdout):
    if not results:
        return
    r0 = results[0]
    kbs = list(r0["collections"])
    print(", ".join(f"{k} {r0['splits'][k]}: {r0['collections'][k]['queries']} judged queries, "
                    f"{r0['docs'][k]} documents -> {r0['chunks'][k]} chunks" for k in kbs)
          + f" (ingest {r0['ingest_s']:.1f} s); {r0['ragproxy']}", file=out)
    print(f"nDCG@10 of the best {r0['depth']} chunks (each document at its best chunk, another KB's chunk "
          f"a miss); wrong KB: share of the {r0['top_k']} injected chunks from another collection's KB", file=out)
    head = ["kb_merge", "order"] + [f"{k} {m}" for k in kbs for m in ("nDCG@10", "wrong")] + \
        ["mean nDCG@10", "mean wrong"]
    table = [head]
    for r in results:
        cells = [r["merge"], r["order"]]
        for k in kbs:
            cells += [f"{r['collections'][k]['ndcg@10']:.4f}", f"{r['collections'][k]['wrong_kb']:.3f}"]
        cells += [f"{r['mean']['ndcg@10']:.4f}", f"{r['mean']['wrong_kb']:.3f}"]
        table.append(cells)
    widths = [max(len(row[i]) for row in table) for i in range(len(head))]
    for row in table:
        print("  ".join(c.rjust(w) if i > 1 else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths))), file=out)
    print("over the orders (mean nDCG@10 / worst order / mean wrong KB): " + "; ".join(
        f"{merge} {v['ndcg@10']:.4f} / {v['worst_ndcg@10']:.4f} / {v['wrong_kb']:.3f}"
        for merge, v in summarize(results).items()), file=out)


def _parse_args(argv):
    p = argparse.ArgumentParser(description="nDCG@10 and wrong-KB share of each kb_merge mode, several "
                                            "BEIR collections as knowledge bases behind one model.")
    p.add_argument("collections", nargs="*", metavar="COLLECTION_DIR[:SPLIT]",
                   help="two or more BEIR collections, each with its qrels split (default: "
                        "../shared/eval/scifact:test ../shared/eval/cosqa-dev:dev)")
    p.add_argument("--merge", default=",".join(MERGES),
                   help=f"kb_merge modes to measure, comma-separated (default {','.join(MERGES)})")
    p.add_argument("--top-k", type=int, default=5, help="chunks injected per request (rag.top_k, default 5)")
    p.add_argument("--depth", type=int, default=10, help="chunks ranked for nDCG@10 (default 10)")
    p.add_argument("--limit-queries", type=int, default=0, help="only the first N judged queries of each")
    p.add_argument("--limit-docs", type=int, default=0,
                   help="only N documents of each: those judged for the selected queries, then the first others")
    p.add_argument("--data-dir", help="data directory to use and keep (default: a temporary one, removed)")
    p.add_argument("--ragproxy", default=RAGPROXY, metavar="PATH",
                   help="ragproxy.py to measure (default: the checkout's)")
    p.add_argument("--pure", action="store_true", help="RAGPROXY_PURE=1: the stdlib-only code paths")
    args = p.parse_args(argv)
    args.collections = args.collections or list(DEFAULT_COLLECTIONS)
    if len(args.collections) < 2:
        p.error("give two or more collections")
    args.merges = [m.strip() for m in args.merge.split(",") if m.strip()]
    if not args.merges:
        p.error("--merge names no mode")
    if args.top_k < 1 or args.depth < 1:
        p.error("--top-k and --depth must be >= 1")
    return args


def main(argv=None):
    args = _parse_args(sys.argv[1:] if argv is None else argv)
    results = run(args)
    print_table(results)
    for r in results:
        print(json.dumps(r, sort_keys=True))
    print(json.dumps({"summary": summarize(results)}, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
